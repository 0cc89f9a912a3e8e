# SPDX-License-Identifier: Apache-2.0
"""SDPA forward through FlyKernels' fused attention (fly_attention_fwd).

Two families, both CUDA-key overrides in the extension with the stock kernel as fallback:
- "sdpa": aten::_scaled_dot_product_flash_attention and _scaled_dot_product_efficient_attention
  (what SDPA runs when it picks the flash or the memory-efficient backend; the latter is its only
  backend for head dims above 256). Installed as the flash-attention implementation "FLY" of
  torch.nn.attention's registry (register_flash_attention_impl / activate_flash_attention_impl),
  so torch.nn.attention.current_flash_attention_impl() says "FLY" while it is on. Our log-sum-exp
  follows each op's contract, so the stock backward runs on our forward's output.
- "sdpa_cudnn": aten::_scaled_dot_product_cudnn_attention when no log-sum-exp is asked for
  (inference: no input requires grad). On the H200 SDPA picks cuDNN first, so this is what makes
  a plain F.scaled_dot_product_attention reach our kernel; with gradients, cuDNN keeps the call
  (its backward reads its own statistics). SDPA's backend priority is left as it is.
- "sdpa_bwd": aten::_scaled_dot_product_flash_attention_backward and
  _efficient_attention_backward through fly_attention_bwd (deterministic), from the forward's
  output and log-sum-exp whoever computed them (GPU tests in python/tests/test_gpu.py).
Not covered (stock kernel): dropout, attention masks, FP32, nested tensors, head dims or strides
the library does not take (flykernels.torch.explain_sdpa says why).
"""
from . import register
from .eager import EagerOverride, _ext

_IMPL = "FLY"


class _Handle:
    """What register_fn returns: the registry calls remove() when another impl is activated."""

    def remove(self):
        if _ext() is not None:
            _ext().disable_op("sdpa")


def _register_fn():
    _ext().enable_op("sdpa")
    return _Handle()


class SdpaOverride(EagerOverride):
    """The flash / memory-efficient overrides, through torch's flash-attention impl registry where
    it exists (torch >= 2.11), else installed directly."""

    def __init__(self):
        super().__init__("sdpa", ["aten::_scaled_dot_product_flash_attention",
                                  "aten::_scaled_dot_product_efficient_attention"], _ext)

    @staticmethod
    def _registry():
        try:
            from torch.nn.attention import _registry
        except ImportError:
            return None
        need = ("register_flash_attention_impl", "activate_flash_attention_impl", "restore_flash_attention_impl",
                "current_flash_attention_impl", "list_flash_attention_impls")
        return _registry if all(hasattr(_registry, n) for n in need) else None

    def install(self):
        reg = self._registry()
        if reg is None:
            return super().install()
        if _IMPL not in reg.list_flash_attention_impls():
            reg.register_flash_attention_impl(_IMPL, register_fn=_register_fn)
        reg.activate_flash_attention_impl(_IMPL)

    def remove(self):
        reg = self._registry()
        if reg is not None and reg.current_flash_attention_impl() == _IMPL:
            reg.restore_flash_attention_impl()  # calls _Handle.remove
        super().remove()


register(SdpaOverride())
register(EagerOverride("sdpa_cudnn", ["aten::_scaled_dot_product_cudnn_attention"], _ext))
register(EagerOverride("sdpa_bwd", ["aten::_scaled_dot_product_flash_attention_backward",
                                     "aten::_scaled_dot_product_efficient_attention_backward"], _ext))
