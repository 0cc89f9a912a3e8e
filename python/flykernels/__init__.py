# SPDX-License-Identifier: Apache-2.0
"""FlyKernels for PyTorch: ahead-of-time compiled Hopper kernels behind F.rms_norm, torch.topk
and (under torch.compile max-autotune) torch.mm / addmm, with the stock kernels as fallback.
Importing the package turns them on where they can run, unless FLYKERNELS_TORCH=0; the
controller is flykernels.torch."""
import os as _os

from . import torch  # noqa: F401  (the controller, flykernels.torch)
from . import _decisions as _dec
from ._patch import is_patched, patch, patched, unpatch  # noqa: F401  (Hugging Face modules onto fused ops)

__version__ = "0.1.0"
available = torch.available
reason = torch.reason

if available:
    # Which calls run ours: the decision rows (shipped, tuned, autotune cache, FLYKERNELS_TUNING_DB).
    _dec.load()
    _dec.set_autotune(_os.environ.get("FLYKERNELS_AUTOTUNE", "0") == "1")
if available and _os.environ.get("FLYKERNELS_TORCH", "1") != "0":
    torch.enable()
