# SPDX-License-Identifier: Apache-2.0
"""Builds libflykernels (CMake, from the repository around this folder) and the flykernels._C
extension against the installed torch, and installs the library inside the package.

  python3 -m pip install --no-build-isolation ./python

Environment:
  FLYKERNELS_PREBUILT_DIR  a CMake build folder that already holds libflykernels.so.0 (skip CMake);
                           a relative path is taken from the repository root
  FLYKERNELS_CMAKE_ARGS    extra CMake arguments, e.g. "-DFLY_FAMILIES=rmsnorm;topk"
  FLYKERNELS_BUILD_JOBS    parallel build jobs (default: MAX_JOBS, else the CPU count)
"""
import glob
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import sys

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as e:  # pip --no-build-isolation builds with the interpreter that runs pip
    raise SystemExit(f"flykernels: building needs torch importable by {sys.executable} ({e}). Install torch "
                     "there, or run the pip of the interpreter that has it: python3 -m pip install "
                     "--no-build-isolation ./python") from None

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent  # the FlyKernels repository (CMakeLists.txt, include/)
LIB = "libflykernels.so.0"  # the soname the extension links


def build_jobs():
    return os.environ.get("FLYKERNELS_BUILD_JOBS") or os.environ.get("MAX_JOBS") or str(os.cpu_count() or 2)


def sqlite_args(user_args):
    """The carried SQLite headers (.devdeps, as tools/device_run.sh) when the caller names none."""
    inc = ROOT / ".devdeps" / "usr" / "include"
    if any(a.startswith("-DSQLite3_") for a in user_args) or not (inc / "sqlite3.h").exists():
        return []
    libs = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libsqlite3.so*"))
    return [f"-DSQLite3_INCLUDE_DIR={inc}"] + ([f"-DSQLite3_LIBRARY={libs[0]}"] if libs else [])


def build_library(build_temp):
    """Path of a folder holding libflykernels.so.0: the prebuilt one, or a fresh CMake build."""
    prebuilt = os.environ.get("FLYKERNELS_PREBUILT_DIR")
    if prebuilt:
        # pip runs this from a copy or from python/: a relative path means the repository's folder
        path = Path(prebuilt) if Path(prebuilt).is_absolute() else ROOT / prebuilt
        if not (path / LIB).exists():
            raise RuntimeError(f"FLYKERNELS_PREBUILT_DIR={prebuilt} ({path}) holds no {LIB}")
        return path
    bdir = Path(build_temp).resolve() / "libflykernels"
    user_args = shlex.split(os.environ.get("FLYKERNELS_CMAKE_ARGS", ""))
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cfg = ["cmake", "-S", str(ROOT), "-B", str(bdir), *gen, "-DCMAKE_BUILD_TYPE=Release",
           "-DFLY_BUILD_TESTS=OFF", "-DFLY_BUILD_TOOLS=OFF", *sqlite_args(user_args), *user_args]
    print("flykernels:", " ".join(cfg), flush=True)
    subprocess.run(cfg, check=True)
    subprocess.run(["cmake", "--build", str(bdir), "--target", "flykernels", "-j", build_jobs()], check=True)
    return bdir


class BuildWithLibrary(BuildExtension):
    def run(self):
        libdir = build_library(self.build_temp)
        pkg_dir = Path(self.build_lib) / "flykernels"
        pkg_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(libdir / LIB), pkg_dir / LIB)  # the real file, named by its soname
        if self.inplace:  # editable installs load the library beside the sources
            shutil.copy2(pkg_dir / LIB, HERE / "flykernels" / LIB)
        for ext in self.extensions:
            ext.library_dirs.append(str(pkg_dir))
        super().run()


ext = CppExtension(
    "flykernels._C",
    # one file per family around the override table (csrc/overrides.hpp), the shared parts, the
    # decisions (ours or stock per call) and the module definition
    [f"csrc/{name}.cpp" for name in ("common", "rmsnorm", "topk", "attention", "grouped_mm", "scaled_mm", "gemm",
                                     "decisions", "module")],
    include_dirs=[str(ROOT / "include")],
    extra_compile_args=["-O2"],
    # The library travels beside the extension, found through $ORIGIN.
    extra_link_args=[f"-l:{LIB}", "-Wl,-rpath,$ORIGIN"],
)

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": BuildWithLibrary.with_options(use_ninja=bool(shutil.which("ninja")))},
    package_data={"flykernels": [LIB, "decisions_*.sql"]},  # the library and the shipped decision rows
)
