"""spec_hal: portable speculative-decoding primitives with one semantics on CUDA, ROCm and CPU.

``import spec_hal`` does no device work: backends are probed on first use. Ops are module-level
functions (``spec_hal.draft_topk(...)``) that run on the backend for their tensors' device;
``spec_hal.get_backend(name)`` returns one backend to call explicitly; ``spec_hal.explain()`` says
what was found and which provider runs each op.
"""
from __future__ import annotations

from .errors import BackendUnavailable, GraphStateError, InvalidInput, SpecHalError, UnsupportedOnBackend

__version__ = "0.1.0"

_LAZY = {
    "probe": ("spec_hal.capabilities", "probe"),
    "Capabilities": ("spec_hal.capabilities", "Capabilities"),
    "graph_support": ("spec_hal.capabilities", "graph_support"),
    "get_backend": ("spec_hal.selection", "get_backend"),
    "available_backends": ("spec_hal.selection", "available_backends"),
    "explain": ("spec_hal.explain", "explain"),
    "Backend": ("spec_hal.backend", "Backend"),
}

__all__ = [
    "BackendUnavailable",
    "GraphStateError",
    "InvalidInput",
    "SpecHalError",
    "UnsupportedOnBackend",
    *_LAZY,
    "draft_topk",
    "bonus_tokens",
    "compact_accepted",
    "accepted_kv_moves",
    "move_kv",
    "assign_draft_slots",
]


def __getattr__(name: str):
    import importlib
    import importlib.util

    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    if name.startswith("_"):
        raise AttributeError(name)
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        # A submodule (``from . import checks`` inside a family module that all_ops() below is
        # importing): import it instead of recursing into the op registry.
        return importlib.import_module(f"{__name__}.{name}")
    from .ops import dispatcher
    from .registry import all_ops

    if name in all_ops():
        return dispatcher(name)
    raise AttributeError(f"module 'spec_hal' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
