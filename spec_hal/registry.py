"""The op registry: every op's name, family, input check, reference implementation and fake.

Each family module (``spec_hal/topk.py``, ...) declares its ops with :func:`register_op`. The
reference implementation is pure PyTorch: it is the ``cpu`` backend's provider and the oracle of
the conformance suite. The check validates shapes, dtypes and devices without a device sync and
raises :class:`~spec_hal.errors.InvalidInput`; every backend runs it before its provider, so a
backend cannot forget validation. The fake computes the output shapes and dtypes without data; it
is what makes the op a ``torch.ops.spec_hal.<op>`` custom op usable under ``torch.compile``
(see ``spec_hal/torch_library.py`` and docs/adding-an-op.md).

Adding a family: write ``spec_hal/<family>.py`` with its ops registered, list it in
``FAMILY_MODULES`` below, and (for Triton) ``kernels/<family>.py`` with a ``PROVIDERS`` dict.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

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
    """One op: ``check(*args, **kwargs)`` validates, ``reference(*args, **kwargs)`` computes.

    ``fake(*args, **kwargs)`` returns the result with the exact shapes and dtypes of the
    reference's, from arguments that may be fake tensors (no data is read). ``mutates`` names the
    arguments written in place (``out`` is implied). ``result_fields(values)`` gives the
    non-tensor fields of a structured result (``DraftTree.num_steps``...) from the bound argument
    values, for results rebuilt after a ``torch.ops`` call.
    """

    name: str
    family: str
    check: Callable[..., None]
    reference: Callable
    fake: Optional[Callable] = None
    mutates: tuple[str, ...] = ()
    result_fields: Optional[Callable[[dict], dict]] = None


_OPS: dict[str, OpSpec] = {}
_families_loaded = False


def register_op(
    name: str,
    *,
    family: str,
    check: Callable[..., None],
    fake: Optional[Callable] = None,
    mutates: tuple[str, ...] = (),
    result_fields: Optional[Callable[[dict], dict]] = None,
) -> Callable[[Callable], Callable]:
    """Decorator for a reference implementation: registers the op under ``name``."""

    def decorate(reference: Callable) -> Callable:
        if name in _OPS and _OPS[name].reference is not reference:
            raise RuntimeError(f"op {name!r} registered twice")
        _OPS[name] = OpSpec(name, family, check, reference, fake, tuple(mutates), result_fields)
        return reference

    return decorate


def _load_families() -> None:
    global _families_loaded
    if not _families_loaded:
        for module in FAMILY_MODULES:
            importlib.import_module(module)
        _families_loaded = True


def all_ops() -> dict[str, OpSpec]:
    """Every registered op by name (imports the family modules on first call); a copy."""
    _load_families()
    return dict(_OPS)


def op_names() -> frozenset:
    """The names of every registered op (imports the family modules on first call)."""
    _load_families()
    return frozenset(_OPS)


def op_spec(name: str) -> OpSpec:
    _load_families()
    spec = _OPS.get(name)
    if spec is None:
        raise AttributeError(f"spec_hal has no op {name!r}; ops: {', '.join(sorted(_OPS))}")
    return spec
