"""FlyKernels for PyTorch: ahead-of-time compiled Hopper kernels behind F.rms_norm, torch.topk
and (under torch.compile max-autotune) torch.mm / addmm, with the stock kernels as fallback.
Importing the package turns them on where they can run, unless FLYKERNELS_TORCH=0; the
controller is flykernels.torch."""
import os as _os

from . import torch  # noqa: F401  (the controller, flykernels.torch)

__version__ = "0.1.0"
available = torch.available
reason = torch.reason

if available and _os.environ.get("FLYKERNELS_TORCH", "1") != "0":
    torch.enable()
