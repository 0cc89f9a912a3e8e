# SPDX-License-Identifier: Apache-2.0
"""pytest plugin for running PyTorch's upstream tests stock and with FlyKernels (test/upstream/run.sh
loads it with -p flykernels_upstream).

- Imports flykernels before any test module: with FLYKERNELS_TORCH=0 its overrides stay off (the
  stock run), otherwise they are installed. With UPSTREAM_FORCE=ours (run.sh's default) every
  eligible call runs our kernel (flykernels.torch.forced("ours")) instead of following the shipped
  decision rows, so the comparison covers our kernels wherever they can run.
- Keeps the CUDA tests (classes instantiated for CUDA) whose function name matches the file's
  selection (UPSTREAM_SELECT: "file_stem=regex;..."), then a deterministic sample of each test
  function's parametrizations: 1 in UPSTREAM_SAMPLE, at an offset from the function's name, and at
  least one per function, so every test function is covered and both runs select the same items.
- Records, as JUnit properties of each test case: "function" (file::class-without-device::name of
  the def) and "fly_ours:<op>" (calls our overrides took, flykernels.torch.dispatch_counts()).
- Writes UPSTREAM_META (JSON): torch / flykernels versions, active families, forced mode, the
  sample and selection, collected / kept counts.
"""
import json
import os
import re
import zlib

import pytest

_state = {"fly": None, "forced": None, "meta": {}}


def _selection():
    sel = {}
    for part in os.environ.get("UPSTREAM_SELECT", "").split(";"):
        if "=" in part:
            stem, rx = part.split("=", 1)
            sel[stem.strip()] = re.compile(rx.strip())
    return sel


def pytest_configure(config):
    meta = _state["meta"]
    try:
        import torch

        meta["torch"] = torch.__version__
        meta["cuda_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception as e:  # noqa: BLE001 (report, do not fail collection)
        meta["torch_error"] = repr(e)
    try:
        import flykernels

        _state["fly"] = flykernels
        meta["flykernels"] = getattr(flykernels, "__version__", "?")
        meta["flykernels_available"] = bool(flykernels.torch.available)
        meta["flykernels_reason"] = flykernels.torch.reason
        meta["flykernels_active"] = flykernels.torch.active()
        force = os.environ.get("UPSTREAM_FORCE", "")
        if force in ("ours", "stock") and flykernels.torch.active():
            _state["forced"] = flykernels.torch.forced(force)
            _state["forced"].__enter__()
        meta["forced"] = force if _state["forced"] is not None else None
    except Exception as e:  # noqa: BLE001
        meta["flykernels_error"] = repr(e)
    meta["env_FLYKERNELS_TORCH"] = os.environ.get("FLYKERNELS_TORCH")


def _stem(item):
    return os.path.splitext(os.path.basename(str(item.fspath)))[0]


def _function_key(item):
    """file::class (device suffix dropped)::name of the def. PyTorch's instantiated tests wrap the
    def with functools.wraps, so the item's function keeps the def's __name__ under its
    parametrized attribute name (test_foo_float16_cuda)."""
    cls = item.cls.__name__ if getattr(item, "cls", None) is not None else ""
    cls = re.sub(r"CUDA$", "", cls)
    fn = getattr(getattr(item, "obj", None), "__name__", None) or item.name
    return f"{_stem(item)}::{cls}::{fn}"


def pytest_collection_modifyitems(session, config, items):
    sample = max(1, int(os.environ.get("UPSTREAM_SAMPLE", "1")))
    sel = _selection()
    groups = {}
    order = []
    for it in items:
        cls = getattr(it, "cls", None)
        if cls is None or not cls.__name__.endswith("CUDA"):
            continue
        key = _function_key(it)
        rx = sel.get(_stem(it))
        if rx is not None and not rx.search(key.rsplit("::", 1)[-1]):
            continue
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(it)
    keep = []
    for key in order:
        g = groups[key]
        off = zlib.crc32(key.encode()) % sample
        chosen = [it for i, it in enumerate(g) if i % sample == off] or [g[off % len(g)]]
        for it in chosen:
            it.user_properties.append(("function", key))
            it.user_properties.append(("parametrizations", str(len(g))))
        keep.extend(chosen)
    kept_ids = {id(it) for it in keep}
    deselected = [it for it in items if id(it) not in kept_ids]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = keep
    _state["meta"].update(collected=len(deselected) + len(keep), kept=len(keep), functions=len(order),
                          sample=sample, select={k: v.pattern for k, v in sel.items()})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    fly = _state["fly"]
    if fly is not None:
        try:
            fly.torch.reset_counts()
        except Exception:  # noqa: BLE001
            fly = None
    yield
    if fly is not None:
        try:
            for op, (ours, _stock) in sorted(fly.torch.dispatch_counts().items()):
                if ours:
                    item.user_properties.append((f"fly_ours:{op}", str(ours)))
        except Exception:  # noqa: BLE001
            pass


def pytest_sessionfinish(session, exitstatus):
    if _state["forced"] is not None:
        try:
            _state["forced"].__exit__(None, None, None)
        except Exception:  # noqa: BLE001
            pass
    path = os.environ.get("UPSTREAM_META")
    if path:
        _state["meta"]["exitstatus"] = int(exitstatus)
        with open(path, "w") as f:
            json.dump(_state["meta"], f, indent=1, sort_keys=True)
