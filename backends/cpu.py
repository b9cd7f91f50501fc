"""The ``cpu`` backend: every op served by its pure-PyTorch reference; graphs run eagerly."""
from __future__ import annotations

from typing import Optional

import torch

from spec_hal.backend import Backend, reference_providers
from spec_hal.capabilities import probe


class CpuFactory:
    name = "cpu"
    device_type = "cpu"

    def unavailable_reason(self, device: Optional[torch.device]) -> Optional[str]:
        if device is not None and device.type != "cpu":
            return f"the cpu backend runs on cpu tensors, not {device.type}"
        return None

    def create(self, device: Optional[torch.device]) -> Backend:
        return Backend("cpu", probe("cpu"), reference_providers())


FACTORY = CpuFactory()
