# SPDX-License-Identifier: Apache-2.0
"""Builds libflykernels (CMake, from the repository around this folder) and the flykernels._C
extension against the installed torch, and installs the library inside the package.

  python3 -m pip install --no-build-isolation ./python
  FLYKERNELS_PREBUILT_DIR=build python3 -m pip wheel --no-build-isolation --no-deps ./python -w dist

The version carries the torch and CUDA the extension was built against as a local label
(0.1.0+torch2.11.cu130; `cpu` for a torch without CUDA), the wheel depends on that torch
major.minor, and the package writes flykernels/_build.py (what it was built against), which
the import checks (flykernels/_loader.py). --no-build-isolation: the extension must be built
against the torch that will run it, the one already installed, not a fresh copy pip would fetch.

Environment:
  FLYKERNELS_PREBUILT_DIR  a CMake build folder that already holds libflykernels.so.0 (skip CMake);
                           a relative path is taken from the repository root
  FLYKERNELS_CMAKE_ARGS    extra CMake arguments, e.g. "-DFLY_FAMILIES=rmsnorm;topk"
  FLYKERNELS_BUILD_JOBS    parallel build jobs (default: MAX_JOBS, else the CPU count)
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as e:  # pip --no-build-isolation builds with the interpreter that runs pip
    raise SystemExit(f"flykernels: building needs torch importable by {sys.executable} ({e}). Install torch "
                     "there, or run the pip of the interpreter that has it: python3 -m pip install "
                     "--no-build-isolation ./python") from None

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent  # the FlyKernels repository (CMakeLists.txt, include/)
LIB = "libflykernels.so.0"  # the soname the extension links


def base_version():
    """The library's version, from the repository's CMakeLists.txt (project(flykernels VERSION x.y.z))."""
    m = re.search(r"project\(\s*flykernels\s+VERSION\s+([0-9][0-9.]*)", (ROOT / "CMakeLists.txt").read_text())
    if not m:
        raise RuntimeError(f"flykernels: no project(flykernels VERSION ...) in {ROOT / 'CMakeLists.txt'}")
    return m.group(1)


def torch_major_minor(version):
    """'2.11' of '2.11.0+cu130' (or of '2.12.0.dev20260101')."""
    m = re.match(r"(\d+)\.(\d+)", str(version))
    if not m:
        raise ValueError(f"not a torch version: {version!r}")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def version_label(torch_version, cuda_version):
    """The local version label of a build against torch `torch_version` with CUDA `cuda_version`
    (torch.version.cuda; None for a CPU torch): 'torch2.11.cu130', 'torch2.11.cpu'."""
    cuda = f"cu{''.join(str(cuda_version).split('.')[:2])}" if cuda_version else "cpu"
    return f"torch{torch_major_minor(torch_version)}.{cuda}"


def torch_requirement(torch_version):
    """The torch the wheel runs with: the major.minor it was built against ('torch>=2.11,<2.12')."""
    major, minor = torch_major_minor(torch_version).split(".")
    return f"torch>={major}.{minor},<{major}.{int(minor) + 1}"


def build_info_source(version, torch_version, cuda_version):
    """flykernels/_build.py: what this build was made against, read at import (_loader.py)."""
    return ("# Written by python/setup.py at build time: what this build of flykernels was made against.\n"
            f"version = {version!r}\ntorch_version = {str(torch_version)!r}\ncuda_version = {cuda_version!r}\n")


def build_jobs():
    return os.environ.get("FLYKERNELS_BUILD_JOBS") or os.environ.get("MAX_JOBS") or str(os.cpu_count() or 2)


def find_ninja():
    """True when ninja can run the extension's compiles in parallel: on PATH, or beside this
    interpreter / in the `ninja` pip package (then put on PATH, where torch looks for it)."""
    if shutil.which("ninja"):
        return True
    dirs = [os.path.dirname(sys.executable)]
    try:
        import ninja  # the PyPI package (pip install ninja)
        dirs.append(ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    for d in dirs:
        if os.access(os.path.join(d, "ninja"), os.X_OK):
            os.environ["PATH"] = d + os.pathsep + os.environ.get("PATH", "")
            return True
    return False


# Linked by name ahead of the driver's -lstdc++ (see the extension's link arguments below).
SHARED_CXX_RUNTIME = ["-l:libstdc++.so.6"] if sys.platform.startswith("linux") else []


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


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import the helpers above
    USE_NINJA = find_ninja()
    # torch's ninja build takes MAX_JOBS; without ninja the compiles run one after the other
    os.environ.setdefault("MAX_JOBS", build_jobs())
    VERSION = f"{base_version()}+{version_label(torch.__version__, torch.version.cuda)}"

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

    class BuildPyWithInfo(build_py):
        """The package plus flykernels/_build.py (not in the sources: editable installs have none,
        and skip the torch check)."""
        def run(self):
            super().run()
            if not self.editable_mode:
                out = Path(self.build_lib) / "flykernels" / "_build.py"
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(build_info_source(VERSION, torch.__version__, torch.version.cuda))

        def get_outputs(self, include_bytecode=True):
            outs = super().get_outputs(include_bytecode)
            return outs + [str(Path(self.build_lib) / "flykernels" / "_build.py")] if not self.editable_mode else outs

    ext = CppExtension(
        "flykernels._C",
        # one file per family around the override table (csrc/overrides.hpp), the shared parts, the
        # decisions (ours or stock per call) and the module definition, compiled as one unit
        # (csrc/extension.cpp says why)
        ["csrc/extension.cpp"],
        depends=[str(p.relative_to(HERE)) for p in sorted((HERE / "csrc").glob("*.[ch]pp"))],
        include_dirs=[str(ROOT / "include")],
        # -g0: no debug info (Python's CFLAGS carry -g): a third less compile time, a .so of a
        # few MB instead of 34
        extra_compile_args=["-O2", "-g0"],
        # The library travels beside the extension, found through $ORIGIN. The C++ runtime is the
        # process's shared libstdc++.so.6, named before the compiler driver's own -lstdc++: where
        # that would resolve to libstdc++.a (as on the GPU machine's image), the extension gets a
        # private copy of the iostream and locale code, Python's -Wl,-Bsymbolic-functions binds
        # the extension's calls to that copy while its data (the locale's facet ids) binds to the
        # shared runtime's, and every std::ostringstream (every TORCH_CHECK message, the
        # decisions' rule text) dereferences a missing facet: a segmentation fault.
        extra_link_args=[f"-l:{LIB}", "-Wl,-rpath,$ORIGIN", *SHARED_CXX_RUNTIME],
    )

    setup(
        version=VERSION,
        install_requires=[torch_requirement(torch.__version__)],
        ext_modules=[ext],
        cmdclass={"build_ext": BuildWithLibrary.with_options(use_ninja=USE_NINJA), "build_py": BuildPyWithInfo},
        # the library, the shipped decision rows, the PEP 561 marker, and the kernel repository's
        # metadata (flykernels/hub, loaded by Hugging Face's `kernels` as a local repository)
        package_data={"flykernels": [LIB, "decisions_*.sql", "py.typed"], "flykernels.hub": ["metadata.json"]},
    )
