"""The Backend object and the contract a backend (built-in or plugin) implements.

A :class:`Backend` has a ``name``, the :class:`~spec_hal.capabilities.Capabilities` it was built
for, and one :class:`Provider` per op it serves. ``backend.<op>(...)`` validates the arguments with
the op's shared check and then calls the provider. An op without a provider raises
:class:`~spec_hal.errors.UnsupportedOnBackend` naming what is missing; nothing is silently
downgraded.

Plugins register a :class:`BackendFactory` under the entry-point group ``spec_hal.backends``
(see ``tests/dummy_plugin`` for a complete example).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

import torch

from .capabilities import Capabilities
from .errors import UnsupportedOnBackend
from .registry import OpSpec, all_ops, op_spec


@dataclass(frozen=True)
class Provider:
    """How a backend runs one op: the callable and a human description for ``explain()``."""

    fn: Callable
    description: str


@dataclass
class Backend:
    """A set of op providers for one device type.

    ``unsupported`` maps op names this backend knowingly lacks to the missing capability, so the
    error says why rather than just "not found".
    """

    name: str
    capabilities: Capabilities
    providers: dict[str, Provider]
    unsupported: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    _bound: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def device(self) -> torch.device:
        return torch.device(self.capabilities.device)

    def provider(self, op: str) -> Provider:
        op_spec(op)  # raises AttributeError for a name that is no op at all
        if op not in self.providers:
            missing = self.unsupported.get(op, "no provider registered for it")
            raise UnsupportedOnBackend(op, self.name, missing)
        return self.providers[op]

    def bound(self, op: str) -> Callable:
        """The callable behind ``backend.<op>``: the op's check, then its provider.

        Built once per backend and op (a backend's providers never change after ``create``), so
        a call costs the check and the provider and nothing else.
        """
        bound = self._bound.get(op)
        if bound is None:
            bound = self._bound[op] = bind_op(op_spec(op), self.provider(op).fn)
        return bound

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_"):
            raise AttributeError(op)
        return self.bound(op)

    def describe_providers(self) -> dict[str, str]:
        """Op name to provider description, with unsupported ops marked."""
        table = {}
        for op in sorted(all_ops()):
            if op in self.providers:
                table[op] = self.providers[op].description
            else:
                table[op] = "UNSUPPORTED: " + self.unsupported.get(op, "no provider registered")
        return table


def bind_op(spec: OpSpec, provider_fn: Callable) -> Callable:
    """``check`` then ``provider_fn``, as one function named like the op.

    A call that does not fit the op's signature raises ``TypeError`` naming ``spec_hal.<op>``
    (not the check function that happened to be called first). The signature is inspected only
    on that error path.
    """
    check = spec.check

    def call(*args, **kwargs):
        try:
            check(*args, **kwargs)
        except TypeError:
            reraise_as_signature_error(spec, args, kwargs)
        return provider_fn(*args, **kwargs)

    call.__name__ = call.__qualname__ = spec.name
    call.__doc__ = spec.reference.__doc__
    call.__wrapped__ = spec.reference
    call.parts = (check, provider_fn)  # for spec_hal.ops.dispatch, which inlines this function's body
    return call


def reraise_as_signature_error(spec: OpSpec, args: tuple, kwargs: dict) -> None:
    """Called inside ``except TypeError`` of a check: raise a TypeError naming ``spec_hal.<op>``
    when the call does not fit the op's signature, else re-raise the check's own TypeError."""
    error = signature_error(spec, args, kwargs)
    if error is None:
        raise  # the TypeError being handled by the caller
    raise error from None


def signature_error(spec: OpSpec, args: tuple, kwargs: dict) -> Optional[TypeError]:
    """A TypeError naming ``spec_hal.<op>`` when ``args``/``kwargs`` do not fit its signature."""
    try:
        inspect.signature(spec.reference).bind(*args, **kwargs)
    except TypeError as exc:
        return TypeError(f"spec_hal.{spec.name}(): {exc}")
    return None


def reference_providers() -> dict[str, Provider]:
    """Every op served by its pure-PyTorch reference (valid on any torch device)."""
    return {name: Provider(spec.reference, "reference (pure PyTorch)") for name, spec in all_ops().items()}


class BackendFactory(Protocol):
    """What the selection layer needs from a backend module or plugin.

    ``name``: the backend's name. ``device_type``: the torch device type its tensors live on.
    ``unavailable_reason(device)``: None when usable here, else a sentence saying why not
    (must not raise). ``create(device)``: build the Backend (may do device work).
    """

    name: str
    device_type: str

    def unavailable_reason(self, device: Optional[torch.device]) -> Optional[str]: ...

    def create(self, device: Optional[torch.device]) -> Backend: ...
