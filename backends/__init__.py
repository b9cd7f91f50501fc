"""Built-in backends (installed as ``spec_hal.backends``).

Each module defines ``FACTORY``, a :class:`spec_hal.backend.BackendFactory`. Auto-selection tries
them in ``AUTO_ORDER`` after any plugin; ``triton-interpret`` is never chosen automatically
because it is a correctness tool, not a fast path.
"""
from __future__ import annotations

import importlib

BUILTIN_MODULES = {
    "cpu": "spec_hal.backends.cpu",
    "cuda": "spec_hal.backends.cuda",
    "rocm": "spec_hal.backends.rocm",
    "triton-interpret": "spec_hal.backends.triton_interpret",
}

AUTO_ORDER = ("rocm", "cuda", "cpu")


def builtin_factory(name: str):
    return importlib.import_module(BUILTIN_MODULES[name]).FACTORY
