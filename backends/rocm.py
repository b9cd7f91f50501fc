"""The ``rocm`` backend: the same Triton kernels with AMD (wave64) launch configs, HIP graphs
through the torch.cuda API, fp8 e4m3fnuz on gfx942.

No AMD GPU was available while this was written: the kernels are compiled offline for gfx942 and
gfx950 and executed under the interpreter in CI, and the probing logic is tested with simulated
MI300X/MI355X properties. The ROCm lanes in ``ci/`` run the suite on real AMD runners.
"""
from __future__ import annotations

from typing import Optional

import torch

from spec_hal.backend import Backend
from spec_hal.capabilities import probe

from .gpu_common import triton_providers


class RocmFactory:
    name = "rocm"
    device_type = "cuda"  # torch addresses HIP devices as "cuda"

    def unavailable_reason(self, device: Optional[torch.device]) -> Optional[str]:
        if torch.version.hip is None:
            return f"this torch build ({torch.__version__}) is not a ROCm build (torch.version.hip is None)"
        if not torch.cuda.is_available():
            return "torch sees no HIP device (torch.cuda.is_available() is False)"
        if device is not None and device.type != "cuda":
            return f"the rocm backend runs on HIP devices (torch type 'cuda'), not {device.type}"
        caps = probe(device)
        if not caps.triton_usable:
            return caps.triton_reason
        return None

    def create(self, device: Optional[torch.device]) -> Backend:
        caps = probe(device)
        return Backend("rocm", caps, triton_providers(caps, vendor="amd"))


FACTORY = RocmFactory()
