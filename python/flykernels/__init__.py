# SPDX-License-Identifier: Apache-2.0
"""FlyKernels for PyTorch: ahead-of-time compiled Hopper kernels behind F.rms_norm, torch.topk
and (under torch.compile max-autotune) torch.mm / addmm, with the stock kernels as fallback.
Importing the package turns them on where they can run, unless FLYKERNELS_TORCH=0; the
controller is flykernels.torch. flykernels.quantize_(model, "mxfp4" | "mxfp8") stores a model's
linear weights MX-quantized (flykernels.nn.MXLinear), and its 3-D mixture-of-experts weights
(flykernels.nn.MXExperts). Messages go to the `flykernels` logger (FLYKERNELS_LOG=debug,
info, warning, error or off sets its level; see flykernels._loader)."""
import os as _os

from . import torch  # noqa: F401  (the controller, flykernels.torch)
from . import _decisions as _dec
from . import _loader
from ._patch import is_patched, patch, patched, unpatch  # noqa: F401  (Hugging Face modules onto fused ops)
from ._hub import kernel_config_mapping, kernel_mapping, kernelize, unkernelize  # noqa: F401  (through `kernels`)
from ._lce import linear_cross_entropy  # noqa: F401  (a language model's loss without its logits in memory)
from . import nn  # noqa: F401  (flykernels.nn.MXLinear; registers the flykernels::mx_linear ops)
from .nn import quantize_  # noqa: F401  (nn.Linear -> MXLinear in place: MXFP8 / MXFP4 weights)

# 0.1.0+torch2.11.cu130: the library's version and what this build was made against (setup.py)
__version__: str = _loader.build_info.get("version") or "0.1.0"
available: bool = torch.available
reason: str = torch.reason

if available:
    # Which calls run ours: the decision rows (shipped, tuned, autotune cache, FLYKERNELS_TUNING_DB).
    _dec.load()
    _dec.set_autotune(_os.environ.get("FLYKERNELS_AUTOTUNE", "0") == "1")
if available and _os.environ.get("FLYKERNELS_TORCH", "1") != "0":
    torch.enable()
    _loader.log.info("on at import: %s", ", ".join(torch.active()))
