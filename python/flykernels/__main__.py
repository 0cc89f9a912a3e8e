# SPDX-License-Identifier: Apache-2.0
"""python -m flykernels: what is bundled, the device, which overrides are active and where their
decisions come from. `python -m flykernels tune --help`: measure ours against stock (_tune.py)."""
import os
import sys

import torch

import flykernels
from flykernels import _loader


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "tune":
        from flykernels import _tune
        return _tune.main(argv[1:])
    if argv:
        print(f"python -m flykernels: unknown command {argv[0]!r} (commands: tune; none: the status)", file=sys.stderr)
        return 2
    ext = _loader.ext
    print(f"flykernels {flykernels.__version__}  (package {os.path.dirname(flykernels.__file__)})")
    print(f"torch {torch.__version__}  CUDA {torch.version.cuda}")
    if ext is None:
        print(f"library: not loaded: {_loader.load_error}")
    else:
        info = ext.library_info()
        fams = ", ".join(f"{k} {v}" for k, v in sorted(info["families"].items()))
        print(f"library: libflykernels {info['version']}, {info['variant_count']} variants ({fams})")
    if torch.cuda.is_available():
        i = torch.cuda.current_device()
        print(f"device: cuda:{i} {torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})")
    else:
        print("device: none visible to torch")
    print(f"available: {flykernels.available}" + ("" if flykernels.available else f"  ({flykernels.reason})"))
    env = os.environ.get("FLYKERNELS_TORCH")
    print(f"FLYKERNELS_TORCH={env}" if env is not None else "FLYKERNELS_TORCH unset (on at import)")
    active = set(flykernels.torch.active())
    for name, kind in flykernels.torch.families().items():
        why = flykernels.torch.why_not(name)
        state = "active" if name in active else ("off" if not why else f"unsupported: {why}")
        print(f"  {name:10s} {kind:9s} {state}")
    from flykernels import _decisions
    if ext is not None:
        print(f"decisions: {ext.decision_row_count()} rows for {_decisions.device_tag()}"
              f"{', autotune on' if ext.autotune_enabled() else ''}")
        for path, n in _decisions.sources:
            print(f"  {n:5d} rows  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
