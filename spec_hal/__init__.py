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
    "run_draft": ("spec_hal.draft_loop", "run_draft"),
    "draft_step": ("spec_hal.draft_loop", "draft_step"),
}

__all__ = [
    "BackendUnavailable",
    "GraphStateError",
    "InvalidInput",
    "SpecHalError",
    "UnsupportedOnBackend",
    *_LAZY,
    "draft_topk",
    "expand_tree",
    "organize_draft",
    "build_tree",
]


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    if name.startswith("_"):
        raise AttributeError(name)
    from .ops import dispatcher
    from .registry import all_ops

    if name in all_ops():
        return dispatcher(name)
    raise AttributeError(f"module 'spec_hal' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
