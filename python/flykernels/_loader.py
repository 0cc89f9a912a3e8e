# SPDX-License-Identifier: Apache-2.0
"""Loads the extension (and with it libflykernels) once; never raises. `ext` is the module or
None, `available` says whether our kernels can run here and `reason` why not."""
import os

import torch

ext = None
available = False
reason = ""
load_error = ""


def _probe():
    global ext, available, reason, load_error
    try:
        from . import _C
    except Exception as e:  # ImportError or OSError (the library or a symbol missing)
        load_error = f"{type(e).__name__}: {e}"
        reason = f"the extension flykernels._C did not load ({load_error})"
        return
    ext = _C
    if os.environ.get("FLYKERNELS_LOG", "").lower() in ("info", "debug"):
        ext.set_log(True)
        ext.set_decision_log(True)
    if torch.version.cuda is None:
        reason = "this torch build has no CUDA"
    elif not torch.cuda.is_available():
        ok, msg = ext.device_status(-1)  # the library's own view: no driver / no device
        reason = f"no CUDA device visible to torch ({msg})" if not ok else "no CUDA device visible to torch"
    else:
        ok, msg = ext.device_status(torch.cuda.current_device())
        available, reason = ok, ("" if ok else msg)


_probe()
