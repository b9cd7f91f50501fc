"""The ``triton-interpret`` backend: the GPU backends' Triton kernels run by Triton's interpreter
on CPU tensors. It is how CI, which has no GPU, executes the exact kernel code of cuda and rocm.

Triton decides between compiling and interpreting when a kernel is defined (``@triton.jit`` reads
``TRITON_INTERPRET``), so this backend sets the variable before the kernels are first imported. In
a process that already imported them compiled (for the cuda backend), it is unavailable and says
so; run it in its own process (``spec-hal conformance --backend triton-interpret`` does).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Optional

import torch

from spec_hal.backend import Backend
from spec_hal.capabilities import probe

from .gpu_common import triton_providers


def _kernels_imported_compiled() -> bool:
    from spec_hal import kernels

    return kernels.loaded_mode() == "compiled"


class TritonInterpretFactory:
    name = "triton-interpret"
    device_type = "cpu"

    def unavailable_reason(self, device: Optional[torch.device]) -> Optional[str]:
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (pip install 'spec-hal[triton]')"
        if device is not None and device.type != "cpu":
            return f"the interpreter runs on cpu tensors, not {device.type}"
        if _kernels_imported_compiled():
            return ("this process already loaded the kernels compiled for a GPU; the interpreter "
                    "needs TRITON_INTERPRET=1 before they load (use a separate process)")
        return None

    def create(self, device: Optional[torch.device]) -> Backend:
        os.environ["TRITON_INTERPRET"] = "1"
        caps = dataclasses.replace(
            probe("cpu"),
            backend="triton-interpret",
            interpreter=True,
            triton_usable=True,
            triton_reason="kernels run under TRITON_INTERPRET=1 on cpu tensors",
        )
        return Backend("triton-interpret", caps, triton_providers(caps, vendor="interpreter"))


FACTORY = TritonInterpretFactory()
