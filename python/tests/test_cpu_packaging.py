# SPDX-License-Identifier: Apache-2.0
"""The package as installed (CI: from the wheel, in a fresh venv): its version label, the check of
the torch it was built against, the `flykernels` logger and FLYKERNELS_LOG, `python -m flykernels`
wording, py.typed. No GPU needed."""
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flykernels
from _subproc import run_py
import flykernels.__main__ as cli
from flykernels import _loader

HAS_GPU = torch.cuda.is_available()
SETUP_PY = Path(__file__).resolve().parents[1] / "setup.py"
PKG = Path(flykernels.__file__).resolve().parent


@pytest.fixture(scope="module")
def setup_py():
    """python/setup.py's helpers (its setup() call runs only as __main__, as setuptools runs it)."""
    if not SETUP_PY.exists():
        pytest.skip(f"no {SETUP_PY}")
    spec = importlib.util.spec_from_file_location("flykernels_setup_py", SETUP_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- the version label and the torch requirement (setup.py) ---------------------------------------
def test_version_label(setup_py):
    assert setup_py.version_label("2.11.0+cu130", "13.0") == "torch2.11.cu130"
    assert setup_py.version_label("2.11.0", "12.8") == "torch2.11.cu128"
    assert setup_py.version_label("2.9.1+cu126", "12.6") == "torch2.9.cu126"
    assert setup_py.version_label("2.11.0+cpu", None) == "torch2.11.cpu"
    assert setup_py.version_label("2.12.0.dev20260101+cu130", "13.0") == "torch2.12.cu130"
    with pytest.raises(ValueError):
        setup_py.version_label("nightly", "13.0")


def test_torch_requirement_and_base_version(setup_py):
    assert setup_py.torch_requirement("2.11.0+cu130") == "torch>=2.11,<2.12"
    assert setup_py.torch_requirement("2.9.1") == "torch>=2.9,<2.10"
    assert re.fullmatch(r"\d+\.\d+\.\d+", setup_py.base_version())
    src = setup_py.build_info_source("0.1.0+torch2.11.cu130", "2.11.0+cu130", "13.0")
    ns = {}
    exec(src, ns)
    assert (ns["version"], ns["torch_version"], ns["cuda_version"]) == ("0.1.0+torch2.11.cu130", "2.11.0+cu130", "13.0")


def test_installed_version_names_this_torch(setup_py):
    info = _loader.build_info
    if not info:
        pytest.skip("no flykernels/_build.py: a source tree or an editable install")
    label = setup_py.version_label(info["torch_version"], info["cuda_version"])
    assert flykernels.__version__ == f"{setup_py.base_version()}+{label}"
    assert flykernels.__version__ == info["version"]
    assert label == setup_py.version_label(torch.__version__, torch.version.cuda)  # built against this torch
    from importlib import metadata
    try:
        assert metadata.version("flykernels") == flykernels.__version__
        major, minor = _loader.major_minor(torch.__version__)
        reqs = [r.replace(" ", "") for r in metadata.requires("flykernels") or [] if r.startswith("torch")]
        assert reqs and f">={major}.{minor}" in reqs[0] and f"<{major}.{minor + 1}" in reqs[0], reqs
    except metadata.PackageNotFoundError:
        pass  # imported from a folder, not installed


def test_package_is_typed_and_carries_its_library():
    assert (PKG / "py.typed").exists()
    assert (PKG / "libflykernels.so.0").exists()
    if _loader.ext is None or not os.path.exists("/proc/self/maps"):
        return
    # the library this process loaded is the package's own copy ($ORIGIN rpath), not a build folder's
    libs = {line.split()[-1] for line in open("/proc/self/maps") if "libflykernels.so" in line}
    assert libs and all(Path(p).resolve().parent == PKG for p in libs), libs


# Code that exists only inside libstdc++ itself (not inline, not a template users instantiate): a
# copy of it in the extension means a link that took libstdc++.a, and with Python's
# -Bsymbolic-functions every std::ostringstream then crashes (setup.py, SHARED_CXX_RUNTIME).
_CXX_RUNTIME_INTERNALS = re.compile(r"^_ZN(K)?St(6locale|7codecvt|20__codecvt_utf|8ios_base)|^_ZNSo9_M_insert")


def test_extension_uses_the_shared_cxx_runtime():
    if _loader.ext is None:
        pytest.skip(f"the extension did not load: {_loader.load_error}")
    nm, readelf = shutil.which("nm"), shutil.which("readelf")
    if not nm or not readelf:
        pytest.skip("binutils (nm, readelf) not installed")
    so = _loader.ext.__file__
    out = subprocess.run([nm, "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    private = [f[-1] for f in (line.split() for line in out.splitlines()) if f and _CXX_RUNTIME_INTERNALS.match(f[-1])]
    assert private == [], f"{so} carries its own copy of libstdc++ code: {private[:5]}"
    dyn = subprocess.run([readelf, "-d", so], capture_output=True, text=True, check=True).stdout
    assert "[libstdc++.so.6]" in dyn


# ---- the running torch against the one the build was made for (_loader.torch_mismatch) ----------
def test_major_minor():
    assert _loader.major_minor("2.11.0+cu130") == (2, 11)
    assert _loader.major_minor("2.11.0a0+git1234") == (2, 11)
    assert _loader.major_minor("2.9") == (2, 9)
    with pytest.raises(ValueError):
        _loader.major_minor("unknown")


def test_torch_mismatch():
    assert _loader.torch_mismatch("2.11.0+cu130", "2.11.0+cu130") == ""
    assert _loader.torch_mismatch("2.11.0+cu130", "2.11.1+cu128") == ""  # patch and CUDA may differ
    assert _loader.torch_mismatch(None, "2.11.0") == ""  # no build record (source tree)
    assert _loader.torch_mismatch("", "2.11.0") == ""
    msg = _loader.torch_mismatch("2.10.0+cu128", "2.11.0+cu130")
    assert "built against torch 2.10 (2.10.0+cu128)" in msg and "torch 2.11.0+cu130 is running" in msg
    assert "PyTorch's own kernels" in msg and "for torch 2.11" in msg
    assert _loader.torch_mismatch("2.11.0", "3.11.0")
    assert "cannot compare" in _loader.torch_mismatch("2.11.0", "weird")


def _copy_with_build_record(tmp_path, torch_version):
    """The installed package copied to tmp_path, its _build.py saying it was built for torch_version."""
    dst = tmp_path / "flykernels"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("__pycache__"))
    (dst / "_build.py").write_text(f"version = '0.1.0+test'\ntorch_version = {torch_version!r}\ncuda_version = None\n")
    return str(tmp_path)


PROBE = """
    import sys; sys.path.insert(0, %r)
    import torch, flykernels
    assert flykernels.__file__.startswith(%r), flykernels.__file__
    print("AVAILABLE", flykernels.available)
    print("REASON", flykernels.reason)
    print("C_LOADED", "flykernels._C" in sys.modules)
    print("ACTIVE", flykernels.torch.active())
    print("TOPK", torch.topk(torch.arange(10.), 3).values.tolist())
"""


def test_a_build_for_another_torch_refuses_and_falls_back(tmp_path):
    root = _copy_with_build_record(tmp_path, "1.0.0")
    r = run_py(PROBE % (root, root), unset=("FLYKERNELS_LOG",))
    assert r.returncode == 0, r.stderr
    assert "AVAILABLE False" in r.stdout
    assert "REASON flykernels was built against torch 1.0 (1.0.0)" in r.stdout
    assert "C_LOADED False" in r.stdout  # never loaded against the wrong torch
    assert "ACTIVE []" in r.stdout
    assert "TOPK [9.0, 8.0, 7.0]" in r.stdout
    assert "flykernels: flykernels was built against torch 1.0" in r.stderr  # a warning, on stderr by default


# ---- the flykernels logger and FLYKERNELS_LOG --------------------------------------------------
def test_log_level_names():
    assert _loader.log_level(None) is None and _loader.log_level("") is None
    assert _loader.log_level("debug") == logging.DEBUG
    assert _loader.log_level("INFO") == logging.INFO
    assert _loader.log_level("1") == logging.INFO and _loader.log_level("2") == logging.DEBUG  # as the library
    assert _loader.log_level("warning") == logging.WARNING
    assert _loader.log_level("error") == logging.ERROR
    assert _loader.log_level("off") > logging.CRITICAL
    assert _loader.log_level("chatty") is None


def test_configure_logging_sets_the_flykernels_logger(caplog):
    log = logging.getLogger("flykernels")
    assert _loader.log is log
    before = log.level
    try:
        _loader.configure_logging("debug")
        assert log.level == logging.DEBUG
        assert sum(isinstance(h, _loader._StderrHandler) for h in log.handlers) == 1  # idempotent
        _loader.configure_logging("off")
        assert not log.isEnabledFor(logging.CRITICAL)
        _loader.configure_logging("")
        assert log.level == logging.NOTSET
        with caplog.at_level(logging.WARNING, logger="flykernels"):
            _loader.configure_logging("chatty")
        assert "FLYKERNELS_LOG=chatty is not one of" in caplog.text
    finally:
        log.setLevel(before)


def test_set_log_sets_the_logger_level():
    log = logging.getLogger("flykernels")
    before = log.level
    try:
        flykernels.torch.set_log(True)
        assert log.level == logging.INFO
        flykernels.torch.set_log(False)
        assert log.level == logging.NOTSET
    finally:
        log.setLevel(before)
        flykernels.torch.set_log(False)


def test_flykernels_log_env_reaches_stderr_through_the_logger():
    # (without FLYKERNELS_LOG nothing is printed: test_python_m_flykernels_without_a_gpu)
    if flykernels.available or _loader.ext is None:
        pytest.skip("checks the lines of a machine where the extension loads and no GPU is visible")
    r = run_py("import flykernels; print('IMPORTED')", env={"FLYKERNELS_LOG": "debug"})
    assert r.returncode == 0, r.stderr
    assert "flykernels: extension loaded" in r.stderr
    assert "flykernels: our kernels stay off: " in r.stderr


def test_an_application_logging_config_gets_the_records_once():
    if flykernels.available or _loader.ext is None:
        pytest.skip("checks the no-GPU info line")
    r = run_py("""
        import logging
        logging.basicConfig(format="APP %(name)s %(levelname)s %(message)s")
        import flykernels
    """, env={"FLYKERNELS_LOG": "info"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("APP flykernels INFO our kernels stay off") == 1, r.stderr
    assert "flykernels: our kernels stay off" not in r.stderr  # not our handler as well


# ---- python -m flykernels says which families are on ------------------------------------------
def test_summary_wording():
    reason = "no CUDA device visible to torch (FLY_ERROR_NO_DEVICE: no CUDA driver)"
    no_gpu = cli.summary(False, reason, None, 0, 9)
    assert no_gpu == "overrides: all off (no CUDA device visible to torch): every call runs PyTorch's own kernels"
    assert cli.short_reason("flykernels was built against torch 2.10 (2.10.0) but torch 2.11.0 is running; its") == \
        "flykernels was built against torch 2.10"
    assert cli.short_reason("") == "our kernels cannot run here"
    assert "installed, but" in cli.summary(False, "no CUDA device visible to torch", None, 2, 9)
    on = cli.summary(True, "", None, 9, 9)
    assert on.startswith("overrides: 9 of 9 families on") and "FLYKERNELS_TORCH=0 keeps them off" in on
    assert "FLYKERNELS_TORCH=0 at import" in cli.summary(True, "", "0", 0, 9)


def test_family_state_wording():
    assert cli.family_state("topk", True, "", True, "", None) == "on"
    assert cli.family_state("topk", False, "", False, "no CUDA device (no driver)", None) == "off: no CUDA device"
    assert cli.family_state("gemm", False, "this torch has no Inductor", True, "", None) == \
        "off: this torch has no Inductor"
    assert cli.family_state("topk", False, "", True, "", "0") == "off: FLYKERNELS_TORCH=0"
    assert cli.family_state("x", False, "", True, "", None, default_on=False) == \
        "off: on only when named (flykernels.torch.enable(['x']))"
    assert cli.family_state("topk", True, "", False, "no CUDA device", None).startswith("on, but no CUDA device")


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_python_m_flykernels_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k not in ("FLYKERNELS_TORCH", "FLYKERNELS_LOG")}
    r = subprocess.run([sys.executable, "-m", "flykernels"], capture_output=True, text=True, cwd="/", env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "flykernels:" not in r.stderr  # FLYKERNELS_LOG unset: nothing to report
    assert "on at import" not in out
    assert "device: no CUDA device visible to torch" in out
    assert re.search(r"^overrides: all off \(.+\): every call runs PyTorch's own kernels$", out, re.M), out
    rows = [line for line in out.splitlines() if line.startswith("  ") and " rows " not in line]
    assert {"rms_norm", "topk", "gemm", "sdpa", "grouped_mm"} <= {row.split()[0] for row in rows}, out
    assert all(re.search(r"  off: \S", row) for row in rows), out  # every family off, each with its reason
    if _loader.build_info:
        assert f"flykernels {flykernels.__version__}" in out and "built against torch" in out


def test_python_side_warnings_go_through_the_logger(caplog):
    from flykernels import _decisions
    with caplog.at_level(logging.WARNING, logger="flykernels"):
        _decisions._warn_once("a test warning of test_cpu_packaging")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == \
        [("flykernels", "WARNING", "a test warning of test_cpu_packaging")]
