# SPDX-License-Identifier: Apache-2.0
"""Eager overrides that live in the extension: RMSNorm (aten::_fused_rms_norm), TopK (aten::topk,
aten::topk.values), grouped GEMM (aten::_grouped_mm) and MX scaled GEMM (aten::_scaled_mm_v2,
aten::_scaled_mm), each on the CUDA dispatch key with the stock kernel as fallback."""
from . import register


class EagerOverride:
    kind = "eager"

    def __init__(self, name, aten_ops, ext_getter, default_on=True):
        self.name = name
        self.aten_ops = aten_ops
        self._ext = ext_getter
        self.default_on = default_on  # False: only enable(["name"]) installs it

    def supported(self):
        return "" if self._ext() is not None else "the extension did not load"

    def install(self):
        self._ext().enable_op(self.name)

    def remove(self):
        if self._ext() is not None:
            self._ext().disable_op(self.name)

    def installed(self):
        return self._ext() is not None and self._ext().op_enabled(self.name)


def _ext():
    from .. import _loader
    return _loader.ext


register(EagerOverride("rms_norm", ["aten::_fused_rms_norm"], _ext))
register(EagerOverride("topk", ["aten::topk", "aten::topk.values"], _ext))
# F.grouped_mm's 2-D x 3-D form through fly_grouped_gemm.
register(EagerOverride("grouped_mm", ["aten::_grouped_mm"], _ext))


class ScaledMmOverride(EagerOverride):
    """F.scaled_mm with MX block scales (BlockWise1x32, E8M0) and _scaled_mm with E8M0 scales,
    through fly_scaled_gemm; their Meta kernels too, so torch.compile traces NO_SWIZZLE scales.
    FakeTensor caches shape results across modes: the cache is cleared at each switch, so a
    trace after it sees the Meta kernel now current. The split-K variants' workspace is queried
    and allocated per call in the extension (csrc: scaled_mm_run, the caching allocator,
    call-scoped), eager and under CUDA graphs alike: no persistent tensor, unlike _ops/gemm.py's."""

    def _clear_fake_cache(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        FakeTensorMode.cache.clear()

    def install(self):
        super().install()
        self._clear_fake_cache()

    def remove(self):
        super().remove()
        self._clear_fake_cache()


# Off until named (enable(["scaled_mm"])): its GPU tests (python/tests/test_gpu.py) have not run yet.
register(ScaledMmOverride("scaled_mm", ["aten::_scaled_mm_v2", "aten::_scaled_mm"], _ext))
