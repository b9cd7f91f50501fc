"""The ``cuda`` backend: Triton kernels with NVIDIA launch configs, CUDA graphs."""
from __future__ import annotations

from typing import Optional

import torch

from .gpu_common import GpuFactory


class CudaFactory(GpuFactory):
    name = "cuda"
    vendor = "nvidia"
    device_label = "CUDA"

    def _build_reason(self) -> Optional[str]:
        if torch.version.hip is not None:
            return "this torch build is ROCm (torch.version.hip is set); use the rocm backend"
        if torch.version.cuda is None:
            return f"this torch build ({torch.__version__}) has no CUDA support"
        return None


FACTORY = CudaFactory()
