# SPDX-License-Identifier: Apache-2.0
"""The one place GEMM candidates join Inductor's autotuning (torch.compile, max-autotune).

Inductor's GEMM lowerings (kernel/mm.py: "mm", "addmm", ...; kernel/mm_grouped.py:
"grouped_mm") all end in autotune_select_algorithm(name, choices, input_nodes, layout). We wrap
that name in each lowering module, and for a registered lowering name append the ChoiceCallers
its providers return; Inductor then benchmarks them beside ATen and Triton and the generated code
calls the winner. (config.external_matmul would do for mm alone, but it cannot decline a shape
and does not reach addmm or grouped_mm.) A module not imported yet is wrapped right after its
import, so enabling costs nothing until torch.compile loads Inductor (about 3 s of imports).

    register_candidates(name, provider, key, module="torch._inductor.kernel.mm")
    provider(choices, input_nodes, layout) -> list of extra ChoiceCallers (may be empty)
    after_import(module, fn)   fn(module) once the module is imported (now if it already is)
"""
import importlib.abc
import sys

_providers = {}  # lowering name -> {provider key: provider}
_module_of = {}  # lowering name -> the module whose selector serves it
_wanted = set()  # lowering modules to wrap (now, or when imported)
_wrapped = {}  # module name -> the original autotune_select_algorithm
wrap_errors = {}  # module name -> why it was not wrapped
_hooks = {}  # module name -> callables run once on the module after its import (after_import)


def _select_with_candidates(original):
    def autotune_select_algorithm(name, choices, input_nodes, layout, *args, **kwargs):
        extra = []
        for provider in list(_providers.get(name, {}).values()):
            try:
                extra.extend(provider(choices, input_nodes, layout))
            except Exception:  # a provider must never break compilation: its candidates drop out
                pass
        return original(name, list(choices) + extra, input_nodes, layout, *args, **kwargs)

    autotune_select_algorithm.__wrapped__ = original
    return autotune_select_algorithm


def _wrap(module):
    name = module.__name__
    if name in _wrapped or name not in _wanted:
        return
    original = getattr(module, "autotune_select_algorithm", None)
    if original is None:
        wrap_errors[name] = "no autotune_select_algorithm in this Inductor"
        return
    _wrapped[name] = original
    module.autotune_select_algorithm = _select_with_candidates(original)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds a wanted lowering module through the other finders and wraps it once it has run."""

    def find_spec(self, fullname, path, target=None):
        if (fullname not in _wanted or fullname in _wrapped) and fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                loader = spec.loader
                if loader is not None and hasattr(loader, "exec_module"):
                    run = loader.exec_module  # this spec's own loader instance: patch it alone

                    def exec_module(module, run=run):
                        run(module)
                        _wrap(module)
                        _run_hooks(module)

                    loader.exec_module = exec_module
                return spec
        return None


_finder = _AfterImport()


def _run_hook(fn, module):
    try:
        fn(module)
    except Exception:  # a hook must never break the import of an Inductor module, nor ours
        pass


def _run_hooks(module):
    for fn in _hooks.pop(module.__name__, []):
        _run_hook(fn, module)


def after_import(module, fn):
    """Runs fn(module) once `module` is imported: now if it is, else right after its import."""
    if module in sys.modules:
        _run_hook(fn, sys.modules[module])
        return
    _hooks.setdefault(module, []).append(fn)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def register_candidates(name, provider, key, module="torch._inductor.kernel.mm"):
    """Adds provider under `key` for lowering `name`; wraps `module`'s selector now if it is
    imported, else right after its import."""
    _providers.setdefault(name, {})[key] = provider
    _module_of[name] = module
    _wanted.add(module)
    if module in sys.modules:
        _wrap(sys.modules[module])
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def unregister_candidates(name, key):
    """Drops provider `key` of lowering `name`; a module none of whose lowerings has a provider left
    gets its original selector back (and is no longer wrapped on import)."""
    _providers.get(name, {}).pop(key, None)
    module = _module_of.get(name)
    if module is None or any(_providers.get(n) for n, m in _module_of.items() if m == module):
        return
    original = _wrapped.pop(module, None)
    if original is not None and module in sys.modules:
        sys.modules[module].autotune_select_algorithm = original
    _wanted.discard(module)
    if not _wanted and not _hooks and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def registered(name, key):
    return key in _providers.get(name, {})
