"""Eager overrides that live in the extension: RMSNorm (aten::_fused_rms_norm) and TopK
(aten::topk, aten::topk.values), each on the CUDA dispatch key with the stock kernel as fallback."""
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
