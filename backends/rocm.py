"""The ``rocm`` backend: the same Triton kernels with AMD (wave64) launch configs, HIP graphs
through the torch.cuda API, fp8 e4m3fnuz on gfx942.

No AMD GPU was available while this was written: the kernels are compiled offline for gfx942 and
gfx950 and executed under the interpreter in CI, and the probing logic is tested with simulated
MI300X/MI355X properties. The ROCm lanes in ``ci/`` run the suite on real AMD runners.
"""
from __future__ import annotations

from typing import Optional

import torch

from .gpu_common import GpuFactory


class RocmFactory(GpuFactory):
    name = "rocm"
    vendor = "amd"
    device_label = "HIP"

    def _build_reason(self) -> Optional[str]:
        if torch.version.hip is None:
            return f"this torch build ({torch.__version__}) is not a ROCm build (torch.version.hip is None)"
        return None


FACTORY = RocmFactory()
