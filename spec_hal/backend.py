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

from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

import torch

from .capabilities import Capabilities
from .errors import UnsupportedOnBackend
from .registry import all_ops, op_spec


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

    @property
    def device(self) -> torch.device:
        return torch.device(self.capabilities.device)

    def provider(self, op: str) -> Provider:
        op_spec(op)  # raises AttributeError for a name that is no op at all
        if op not in self.providers:
            missing = self.unsupported.get(op, "no provider registered for it")
            raise UnsupportedOnBackend(op, self.name, missing)
        return self.providers[op]

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_"):
            raise AttributeError(op)
        spec = op_spec(op)
        provider = self.provider(op)

        def call(*args, **kwargs):
            spec.check(*args, **kwargs)
            return provider.fn(*args, **kwargs)

        call.__name__ = op
        call.__doc__ = spec.reference.__doc__
        return call

    def describe_providers(self) -> dict[str, str]:
        """Op name to provider description, with unsupported ops marked."""
        table = {}
        for op in sorted(all_ops()):
            if op in self.providers:
                table[op] = self.providers[op].description
            else:
                table[op] = "UNSUPPORTED: " + self.unsupported.get(op, "no provider registered")
        return table


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
