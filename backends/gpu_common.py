"""What the Triton backends (cuda, rocm, triton-interpret) share: building the provider table.

Every op with a Triton kernel runs it with the target's launch configs; every other op runs the
pure-PyTorch reference on the backend's device, which has identical semantics by definition.
``explain()`` shows which is which.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from spec_hal.backend import Backend, Provider, reference_providers
from spec_hal.capabilities import Capabilities, probe


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


class GpuFactory:
    """Shared factory of the cuda and rocm backends: the same Triton kernels, told apart by the
    torch build (CUDA or HIP) and the launch-config vendor. Subclasses set the class attributes."""

    name: str
    vendor: str  # launch-config table: "nvidia" or "amd"
    device_label: str
    device_type = "cuda"  # torch addresses HIP devices as "cuda" too

    def _build_reason(self) -> Optional[str]:
        raise NotImplementedError

    def unavailable_reason(self, device: Optional[torch.device]) -> Optional[str]:
        reason = self._build_reason()
        if reason is not None:
            return reason
        if not torch.cuda.is_available():
            return f"torch sees no {self.device_label} device (torch.cuda.is_available() is False)"
        if device is not None and device.type != "cuda":
            return f"the {self.name} backend runs on {self.device_label} devices (torch type 'cuda'), not {device.type}"
        caps = probe(device)
        return None if caps.triton_usable else caps.triton_reason

    def create(self, device: Optional[torch.device]) -> Backend:
        caps = probe(device)
        return Backend(self.name, caps, triton_providers(caps, vendor=self.vendor))
