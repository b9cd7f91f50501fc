"""The ``cuda`` backend: Triton kernels with NVIDIA launch configs, CUDA graphs."""
from __future__ import annotations

from typing import Optional

import torch

from spec_hal.backend import Backend
from spec_hal.capabilities import probe

from .gpu_common import triton_providers


class CudaFactory:
    name = "cuda"
    device_type = "cuda"

    def unavailable_reason(self, device: Optional[torch.device]) -> Optional[str]:
        if torch.version.hip is not None:
            return "this torch build is ROCm (torch.version.hip is set); use the rocm backend"
        if torch.version.cuda is None:
            return f"this torch build ({torch.__version__}) has no CUDA support"
        if not torch.cuda.is_available():
            return "torch sees no CUDA device (torch.cuda.is_available() is False)"
        if device is not None and device.type != "cuda":
            return f"the cuda backend runs on cuda tensors, not {device.type}"
        caps = probe(device)
        if not caps.triton_usable:
            return caps.triton_reason
        return None

    def create(self, device: Optional[torch.device]) -> Backend:
        caps = probe(device)
        return Backend("cuda", caps, triton_providers(caps, vendor="nvidia"))


FACTORY = CudaFactory()
