"""What the Triton backends (cuda, rocm, triton-interpret) share: building the provider table.

Every op with a Triton kernel runs it with the target's launch configs; every other op runs the
pure-PyTorch reference on the backend's device, which has identical semantics by definition.
``explain()`` shows which is which.
"""
from __future__ import annotations

import functools

from spec_hal.backend import Provider, reference_providers
from spec_hal.capabilities import Capabilities


def triton_providers(capabilities: Capabilities, *, vendor: str) -> dict[str, Provider]:
    """Provider table for a Triton backend on ``capabilities`` (vendor: nvidia, amd, interpreter)."""
    from spec_hal.kernels import kernel_providers
    from spec_hal.kernels.launch import KernelTarget

    target = KernelTarget.for_capabilities(capabilities, vendor=vendor)
    providers = reference_providers()
    for op, (fn, description) in kernel_providers().items():
        providers[op] = Provider(functools.partial(fn, target=target), f"triton {description} [{target.label}]")
    for op, provider in providers.items():
        if provider.description.startswith("reference"):
            providers[op] = Provider(provider.fn, "reference (pure PyTorch on the device; no kernel needed)")
    return providers
