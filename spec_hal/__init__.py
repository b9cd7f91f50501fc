"""spec_hal: portable speculative-decoding primitives with one semantics on CUDA, ROCm and CPU.

``import spec_hal`` does no device work: backends are probed on first use. Ops are module-level
functions (``spec_hal.draft_topk(...)``) that run on the backend for their tensors' device;
``spec_hal.get_backend(name)`` returns one backend to call explicitly; ``spec_hal.explain()`` says
what was found and which provider runs each op.

The types the ops take and return (``DraftTree``, ``Verdict``, ``TreeRecord``, ``Expansion``,
``DraftState``, ``DraftResult``, ``DraftSlots``, ``MambaCommit``) and ``MAX_TOPK`` are exported
here. Semantics: docs/semantics.md; shapes and dtypes side by side: docs/conventions.md.
"""
from __future__ import annotations

from .errors import BackendUnavailable, GraphStateError, InvalidInput, SpecHalError, UnsupportedOnBackend


def _map_source_checkout_subpackages() -> None:
    """Make ``spec_hal.backends`` and ``spec_hal.kernels`` importable from a source checkout.

    Installed, they are the top-level folders ``backends/`` and ``kernels/`` mapped into the
    package by setuptools' ``package-dir``. Run from a checkout through ``PYTHONPATH`` or a legacy
    (``setup.py develop``) editable install, that mapping does not exist, so point the two names
    at the folders beside this package. Only file-system checks happen here; no device work.
    """
    import importlib.util
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("backends", "kernels"):
        folder = os.path.join(root, name)
        if f"{__name__}.{name}" in sys.modules or not os.path.isfile(os.path.join(folder, "__init__.py")):
            continue
        found = importlib.util.find_spec(f"{__name__}.{name}")
        if found is not None and os.path.dirname(os.path.dirname(found.origin or "")) == os.path.dirname(os.path.abspath(__file__)):
            continue  # installed inside the package (a wheel): that is this checkout's copy
        # Otherwise the folder beside this package wins: an editable install of ANOTHER checkout
        # must not shadow this checkout's kernels (PYTHONPATH=<checkout> runs the checkout).
        spec = importlib.util.spec_from_file_location(
            f"{__name__}.{name}", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        globals()[name] = module


_map_source_checkout_subpackages()

__version__ = "0.1.0"

_LAZY = {
    "probe": ("spec_hal.capabilities", "probe"),
    "Capabilities": ("spec_hal.capabilities", "Capabilities"),
    "graph_support": ("spec_hal.capabilities", "graph_support"),
    "get_backend": ("spec_hal.selection", "get_backend"),
    "available_backends": ("spec_hal.selection", "available_backends"),
    "explain": ("spec_hal.explain", "explain"),
    "Backend": ("spec_hal.backend", "Backend"),
    "GraphRunner": ("spec_hal.graphs", "GraphRunner"),
    "GraphCaptureWarning": ("spec_hal.graphs", "GraphCaptureWarning"),
    "run_draft": ("spec_hal.draft_loop", "run_draft"),
    "draft_step": ("spec_hal.draft_loop", "draft_step"),
    "DraftGraphs": ("spec_hal.draft_loop", "DraftGraphs"),
    "warmup": ("spec_hal.warmstart", "warmup"),
    "raise_pending_errors": ("spec_hal.error_flag", "raise_pending_errors"),
    "pending_errors": ("spec_hal.error_flag", "pending_errors"),
    "register_torch_ops": ("spec_hal.torch_library", "register"),
    # The types ops take and return, and their limits (docs/conventions.md).
    "DraftTree": ("spec_hal.types", "DraftTree"),
    "Verdict": ("spec_hal.types", "Verdict"),
    "TreeRecord": ("spec_hal.types", "TreeRecord"),
    "Expansion": ("spec_hal.types", "Expansion"),
    "DraftState": ("spec_hal.types", "DraftState"),
    "DraftResult": ("spec_hal.types", "DraftResult"),
    "DraftSlots": ("spec_hal.kv", "DraftSlots"),
    "MambaCommit": ("spec_hal.mamba", "MambaCommit"),
    "GraphSupport": ("spec_hal.capabilities", "GraphSupport"),
    "MAX_TOPK": ("spec_hal.topk", "MAX_TOPK"),
    "tree_paths": ("spec_hal.tree", "tree_paths"),
    "tree_parents": ("spec_hal.tree", "tree_parents"),
    "pack_bitmask": ("spec_hal.masks", "pack_bitmask"),
    "token_map_from_offsets": ("spec_hal.topk", "token_map_from_offsets"),
    "reverse_token_map": ("spec_hal.topk", "reverse_token_map"),
}

__all__ = [
    "BackendUnavailable",
    "GraphStateError",
    "InvalidInput",
    "SpecHalError",
    "UnsupportedOnBackend",
    *_LAZY,
    "apply_token_bitmask_",
    "draft_topk",
    "mamba_commit_steps",
    "scatter_mamba_state",
    "commit_mamba_state",
    "verify_greedy",
    "verify_sampling",
    "verify_chain",
    "verify_chain_sampling",
    "verify_tree_sampling",
    "verify_chain_ragged",
    "verify_chain_sampling_ragged",
    "bonus_tokens",
    "compact_accepted",
    "accepted_kv_moves",
    "move_kv",
    "assign_draft_slots",
    "expand_tree",
    "organize_draft",
    "build_tree",
]


def __getattr__(name: str):
    """Lazy exports and ops, each resolved once: the result is stored in the module's globals, so
    later ``spec_hal.<name>`` lookups never reach this function (no import machinery per call)."""
    import importlib

    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = globals()[name] = getattr(importlib.import_module(module), attribute)
        return value
    if name.startswith("_") or _is_submodule(name):
        # A submodule not imported yet: let the import system load it (``from spec_hal import
        # tree`` asks here first, and must not trigger the import of every family).
        raise AttributeError(name)
    from .ops import dispatcher
    from .registry import op_names

    if name in op_names():
        value = globals()[name] = dispatcher(name)
        return value
    raise AttributeError(f"module 'spec_hal' has no attribute {name!r}")


def _is_submodule(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(f"{__name__}.{name}") is not None


def __dir__():
    return sorted(set(globals()) | set(__all__))
