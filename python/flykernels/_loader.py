# SPDX-License-Identifier: Apache-2.0
"""Loads the extension (and with it libflykernels) once; never raises. `ext` is the module or
None, `available` says whether our kernels can run here and `reason` why not.

Also the package's logger, logging.getLogger("flykernels"), set up from FLYKERNELS_LOG, and the
check that the running torch is the major.minor this build was made against (flykernels/_build.py,
written by setup.py; a source tree or an editable install has none and is not checked)."""
from __future__ import annotations

import logging
import os
import re
import sys
from types import ModuleType
from typing import Any, Dict, Optional, Tuple

import torch

log = logging.getLogger("flykernels")

ext: Optional[ModuleType] = None
available: bool = False
reason: str = ""
load_error: str = ""
build_info: Dict[str, Any] = {}  # {version, torch_version, cuda_version} of flykernels/_build.py, or {}

# FLYKERNELS_LOG values: a logging level name, off, or the library's 1 (info) / 2 (debug) / 0 (off)
LOG_LEVELS = {"debug": logging.DEBUG, "2": logging.DEBUG, "info": logging.INFO, "1": logging.INFO,
              "warning": logging.WARNING, "warn": logging.WARNING, "error": logging.ERROR,
              "off": logging.CRITICAL + 10, "0": logging.CRITICAL + 10, "none": logging.CRITICAL + 10}


class _StderrHandler(logging.StreamHandler):
    """'flykernels: message' on stderr, the package's own output (FLYKERNELS_LOG), unless the
    application configured logging itself (the root logger has a handler): then the records reach
    the application's handlers by propagation alone, never twice."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            self.stream = sys.stderr  # as it is now (pytest and others replace it)
            super().emit(record)


def log_level(value: Optional[str]) -> Optional[int]:
    """The logger level FLYKERNELS_LOG=value asks for: debug (2), info (1), warning, error or off
    (0), any case; None when unset or empty, or not one of these (the level stays unset)."""
    if not value:
        return None
    return LOG_LEVELS.get(value.strip().lower())


def configure_logging(value: Optional[str] = None) -> logging.Logger:
    """Sets up the flykernels logger from FLYKERNELS_LOG (or `value`): a stderr handler that
    writes 'flykernels: message' unless the application has configured logging (then its handlers
    get the records), and the logger's level: the one named, else unset (the root's, WARNING by
    default: only problems, e.g. a build for another torch). Idempotent."""
    if value is None:
        value = os.environ.get("FLYKERNELS_LOG")
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        log.addHandler(_StderrHandler())
    level = log_level(value)
    log.setLevel(level if level is not None else logging.NOTSET)
    if value and level is None:
        log.warning("FLYKERNELS_LOG=%s is not one of debug, info, warning, error, off; ignored", value)
    return log


def major_minor(version: str) -> Tuple[int, int]:
    """(2, 11) of torch '2.11.0+cu130', '2.11.0a0+git1234' or '2.11'."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", str(version))
    if not m:
        raise ValueError(f"not a version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def torch_mismatch(built: Optional[str], running: str) -> str:
    """'' when an extension built against torch `built` can run under torch `running` (the same
    major.minor: torch's C++ ABI changes between minor releases), else the message that says so
    and what to do. '' when `built` is None or empty (no build record: a source tree)."""
    if not built:
        return ""
    try:
        b, r = major_minor(built), major_minor(running)
    except ValueError as e:
        return f"cannot compare the torch flykernels was built against with the running one ({e})"
    if b == r:
        return ""
    return (f"flykernels was built against torch {b[0]}.{b[1]} ({built}) but torch {running} is running; "
            f"its kernels stay off and every call runs PyTorch's own kernels. Install a flykernels build "
            f"for torch {r[0]}.{r[1]} (python3 -m pip install --no-build-isolation ./python, or a wheel "
            f"made with this torch), or torch {b[0]}.{b[1]}")


def _read_build_info() -> Dict[str, Any]:
    try:
        from . import _build  # type: ignore[attr-defined]  (written by setup.py; absent in a source tree)
    except ImportError:
        return {}
    return {k: getattr(_build, k, None) for k in ("version", "torch_version", "cuda_version")}


def _probe() -> None:
    global ext, available, reason, load_error, build_info
    build_info = _read_build_info()
    mismatch = torch_mismatch(build_info.get("torch_version"), torch.__version__)
    if mismatch:
        load_error = mismatch
        reason = mismatch
        log.warning("%s", mismatch)
        return
    try:
        from . import _C
    except Exception as e:  # ImportError or OSError (the library or a symbol missing)
        load_error = f"{type(e).__name__}: {e}"
        reason = f"the extension flykernels._C did not load ({load_error})"
        log.warning("%s; every call runs PyTorch's own kernels", reason)
        return
    ext = _C
    log.debug("extension loaded: %s", getattr(_C, "__file__", "?"))
    level = log_level(os.environ.get("FLYKERNELS_LOG"))
    if level is not None and level <= logging.INFO:  # the C++ side prints each fallback reason and
        ext.set_log(True)                               # each key's decision once, on stderr
        ext.set_decision_log(True)
    if torch.version.cuda is None:
        reason = "this torch build has no CUDA"
    elif not torch.cuda.is_available():
        ok, msg = ext.device_status(-1)  # the library's own view: no driver / no device
        reason = f"no CUDA device visible to torch ({msg})" if not ok else "no CUDA device visible to torch"
    else:
        ok, msg = ext.device_status(torch.cuda.current_device())
        available, reason = ok, ("" if ok else msg)
    if available:
        log.info("our kernels can run here (cuda:%d)", torch.cuda.current_device())
    else:
        log.info("our kernels stay off: %s; every call runs PyTorch's own kernels", reason)


configure_logging()
_probe()
