"""The one place GEMM candidates join Inductor's autotuning (torch.compile, max-autotune).

Inductor's GEMM lowerings (kernel/mm.py: "mm", "addmm", ...; kernel/mm_grouped.py:
"grouped_mm") all end in autotune_select_algorithm(name, choices, input_nodes, layout). We wrap
that name in each lowering module, and for a registered lowering name append the ChoiceCallers
its providers return; Inductor then benchmarks them beside ATen and Triton and the generated code
calls the winner. (config.external_matmul would do for mm alone, but it cannot decline a shape
and does not reach addmm or grouped_mm.)

    register_candidates(name, provider, module="torch._inductor.kernel.mm")
    provider(choices, input_nodes, layout) -> list of extra ChoiceCallers (may be empty)
"""
import importlib

_providers = {}  # lowering name -> {provider key: provider}
_wrapped = {}  # module name -> the original autotune_select_algorithm


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


def register_candidates(name, provider, key, module="torch._inductor.kernel.mm"):
    """Adds provider under `key` for lowering `name`, wrapping `module`'s selector once."""
    if module not in _wrapped:
        mod = importlib.import_module(module)
        _wrapped[module] = mod.autotune_select_algorithm
        mod.autotune_select_algorithm = _select_with_candidates(mod.autotune_select_algorithm)
    _providers.setdefault(name, {})[key] = provider


def unregister_candidates(name, key):
    _providers.get(name, {}).pop(key, None)
    if not any(_providers.values()):  # nothing left: put the originals back
        for module, original in _wrapped.items():
            importlib.import_module(module).autotune_select_algorithm = original
        _wrapped.clear()


def registered(name, key):
    return key in _providers.get(name, {})
