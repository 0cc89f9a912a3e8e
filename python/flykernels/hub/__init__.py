# SPDX-License-Identifier: Apache-2.0
"""FlyKernels' kernel repository for Hugging Face's `kernels` package: this folder is a local
repository as `kernels.LocalLayerRepository(repo_path=<this folder>, layer_name=...)` loads one
(metadata.json beside an __init__.py whose `layers` holds the layer classes), so transformers'
`use_kernels=True` / `kernels.kernelize(model, ...)` can put FlyKernels' fused ops into the layers
it decorates, with nothing downloaded. flykernels.kernel_mapping() returns the mapping,
flykernels.kernelize(model) applies it (docs/pytorch.md, "Hugging Face kernels").

`kernels` imports this file under its own module name (metadata.json's id); the absolute import
below makes that module and `flykernels.hub` share one `layers` module, so a layer class is the
same object whichever way it was reached (flykernels.unkernelize recognizes it by identity)."""
from flykernels.hub import layers  # noqa: F401
