# SPDX-License-Identifier: Apache-2.0
"""python -m flykernels: what is bundled, the device, which families are on (and why the others
are off) and where their decisions come from. `python -m flykernels tune --help`: measure ours
against stock (_tune.py)."""
from __future__ import annotations

import os
import sys
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

import flykernels
from flykernels import _loader

STOCK = "every call runs PyTorch's own kernels"


def short_reason(reason: str) -> str:
    """The head of flykernels.reason, before its details: 'no CUDA device visible to torch'."""
    head = reason.split(";")[0]
    cut = head.find(" (")
    return (head[:cut] if cut > 0 else head).strip() or "our kernels cannot run here"


def summary(available: bool, reason: str, env: Optional[str], n_on: int, n_all: int) -> str:
    """The one line that says whether our kernels run in this process: `available` and `reason`
    (flykernels.available / .reason), `env` FLYKERNELS_TORCH (None: unset), `n_on` of `n_all`
    families installed."""
    if not available:
        why = short_reason(reason)
        if n_on:  # enable() called anyway: installed, but each call passes through to the stock kernel
            return f"overrides: {n_on} of {n_all} families installed, but {why}: {STOCK}"
        return f"overrides: all off ({why}): {STOCK}"
    if n_on == 0:
        off = "FLYKERNELS_TORCH=0 at import" if env == "0" else "flykernels.torch.disable()"
        return f"overrides: off ({off}): {STOCK} until flykernels.torch.enable()"
    at_import = "FLYKERNELS_TORCH=0 keeps them off" if env != "0" else "FLYKERNELS_TORCH=0, then enable()"
    return (f"overrides: {n_on} of {n_all} families on ({at_import}); each takes the eligible calls its "
            f"decision rows give to ours, the rest run PyTorch's own kernels")


def family_state(name: str, on: bool, why_not: str, available: bool, reason: str, env: Optional[str],
                 default_on: bool = True) -> str:
    """'on', or 'off: <why>', for family `name`: `on` installed, `why_not` what keeps this torch
    from taking it ('' when it can), the rest as for summary()."""
    if on:
        return "on" if available else f"on, but {short_reason(reason)}: stock kernels run"
    if why_not:
        return f"off: {why_not}"
    if not available:
        return f"off: {short_reason(reason)}"
    if not default_on:
        return f"off: on only when named (flykernels.torch.enable([{name!r}]))"
    if env == "0":
        return "off: FLYKERNELS_TORCH=0"
    return "off: flykernels.torch.disable()"


def family_lines(families: Dict[str, str], active: Iterable[str], available: bool, reason: str,
                 env: Optional[str]) -> List[Tuple[str, str, str]]:
    """(name, kind, state) of each family of the controller (flykernels.torch.families())."""
    from flykernels import _ops
    on = set(active)
    rows = []
    for name, kind in families.items():
        fam = _ops.REGISTRY.get(name)
        default_on = getattr(fam, "default_on", True)
        rows.append((name, kind, family_state(name, name in on, flykernels.torch.why_not(name), available, reason,
                                              env, default_on)))
    return rows


def status() -> List[str]:
    """The lines `python -m flykernels` prints."""
    ext = _loader.ext
    info = _loader.build_info
    lines = [f"flykernels {flykernels.__version__}  (package {os.path.dirname(flykernels.__file__)})"]
    built = (f"; built against torch {info.get('torch_version')} CUDA {info.get('cuda_version')}"
             if info.get("torch_version") else "")
    lines.append(f"torch {torch.__version__}  CUDA {torch.version.cuda}{built}")
    if ext is None:
        lines.append(f"library: not loaded: {_loader.load_error}")
    else:
        lib = ext.library_info()
        fams = ", ".join(f"{k} {v}" for k, v in sorted(lib["families"].items()))
        lines.append(f"library: libflykernels {lib['version']}, {lib['variant_count']} variants ({fams})")
    if torch.cuda.is_available():
        i = torch.cuda.current_device()
        cc = "".join(map(str, torch.cuda.get_device_capability(i)))
        lines.append(f"device: cuda:{i} {torch.cuda.get_device_name(i)} (sm_{cc})")
    else:
        lines.append("device: no CUDA device visible to torch")
    lines.append(f"available: {flykernels.available}" + ("" if flykernels.available else f"  ({flykernels.reason})"))
    env = os.environ.get("FLYKERNELS_TORCH")
    fams = flykernels.torch.families()
    active = flykernels.torch.active()
    lines.append(summary(flykernels.available, flykernels.reason, env, len(active), len(fams)))
    rows = family_lines(fams, active, flykernels.available, flykernels.reason, env)
    wn, wk = (max((len(r[i]) for r in rows), default=0) for i in (0, 1))
    for name, kind, state in rows:
        lines.append(f"  {name:{wn}s}  {kind:{wk}s}  {state}")
    if ext is not None:
        from flykernels import _decisions
        lines.append(f"decisions: {ext.decision_row_count()} rows for {_decisions.device_tag()}"
                     f"{', autotune on' if ext.autotune_enabled() else ''}")
        for path, n in _decisions.sources:
            lines.append(f"  {n:5d} rows  {path}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m flykernels [tune ...]`: the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "tune":
        from flykernels import _tune
        return _tune.main(argv[1:])
    if argv:
        print(f"python -m flykernels: unknown command {argv[0]!r} (commands: tune; none: the status)", file=sys.stderr)
        return 2
    print("\n".join(status()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
