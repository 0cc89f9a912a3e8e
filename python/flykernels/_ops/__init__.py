# SPDX-License-Identifier: Apache-2.0
"""The families the controller (flykernels.torch) switches, one registry for all of them.

A family is an object with `name`, `kind` ("eager": CUDA-key overrides in the extension;
"inductor": GEMM candidates for torch.compile(mode="max-autotune"); "sdpa": an attention
provider), `supported() -> str` ('' when this torch can take it, else why not), `install()`,
`remove()` and `installed() -> bool`. install/remove must be idempotent and remove must leave
PyTorch exactly as it was.

Where later families plug in (each a module here, imported at the bottom of this file):
- SDPA: a family of kind "sdpa" whose install() calls
  torch.nn.attention.register_flash_attention_impl("FLY", register_fn=...) once and
  activate_flash_attention_impl("FLY"); remove() calls restore_flash_attention_impl().
- F.scaled_mm: an "eager" family backed by an extension override of aten::_scaled_mm_v2 (and
  _scaled_mm), a row of the override table (csrc/overrides.hpp) like rms_norm/topk.
- F.grouped_mm under torch.compile: an "inductor" family that calls
  inductor.register_candidates("grouped_mm", provider, module="torch._inductor.kernel.mm_grouped");
  the provider returns extra ChoiceCallers for the lowering's choice list.
"""
REGISTRY = {}


def register(family):
    """Adds a family (see the module docstring) under family.name; the last one wins."""
    REGISTRY[family.name] = family
    return family


from . import eager, gemm, attention, patch  # noqa: E402,F401,I001  (each registers its families)
