"""The op registry: every op's name, family, input check and reference implementation.

Each family module (``spec_hal/topk.py``, ...) declares its ops with :func:`register_op`. The
reference implementation is pure PyTorch: it is the ``cpu`` backend's provider and the oracle of
the conformance suite. The check validates shapes, dtypes and devices without a device sync and
raises :class:`~spec_hal.errors.InvalidInput`; every backend runs it before its provider, so a
backend cannot forget validation.

Adding a family: write ``spec_hal/<family>.py`` with its ops registered, list it in
``FAMILY_MODULES`` below, and (for Triton) ``kernels/<family>.py`` with a ``PROVIDERS`` dict.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

# Family modules, imported on first use of the registry (never at `import spec_hal`).
FAMILY_MODULES = (
    "spec_hal.masks",
    "spec_hal.topk",
    "spec_hal.mamba",
    "spec_hal.verify",
    "spec_hal.compaction",
    "spec_hal.kv",
    "spec_hal.tree",
    "spec_hal.ragged",
    "spec_hal.sampling",
)


@dataclass(frozen=True)
class OpSpec:
    """One op: ``check(*args, **kwargs)`` validates, ``reference(*args, **kwargs)`` computes."""

    name: str
    family: str
    check: Callable[..., None]
    reference: Callable


_OPS: dict[str, OpSpec] = {}


def register_op(name: str, *, family: str, check: Callable[..., None]) -> Callable[[Callable], Callable]:
    """Decorator for a reference implementation: registers the op under ``name``."""

    def decorate(reference: Callable) -> Callable:
        if name in _OPS and _OPS[name].reference is not reference:
            raise RuntimeError(f"op {name!r} registered twice")
        _OPS[name] = OpSpec(name, family, check, reference)
        return reference

    return decorate


def all_ops() -> dict[str, OpSpec]:
    """Every registered op by name (imports the family modules on first call)."""
    for module in FAMILY_MODULES:
        importlib.import_module(module)
    return dict(_OPS)


def op_spec(name: str) -> OpSpec:
    ops = all_ops()
    if name not in ops:
        raise AttributeError(f"spec_hal has no op {name!r}; ops: {', '.join(sorted(ops))}")
    return ops[name]
