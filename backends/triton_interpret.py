"""The ``triton-interpret`` backend: the GPU backends' Triton kernels run by Triton's interpreter
on CPU tensors. It is how CI, which has no GPU, executes the exact kernel code of cuda and rocm.

Triton decides between compiling and interpreting when a kernel is defined (``@triton.jit`` reads
``TRITON_INTERPRET``), so this backend sets the variable before the kernels are first imported. In
a process that already imported them compiled (for the cuda backend), it is unavailable and says
so; run it in its own process (``spec-hal conformance --backend triton-interpret`` does).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import sys
import threading
from typing import Optional

import torch

from spec_hal.backend import Backend, Provider
from spec_hal.capabilities import probe

from .gpu_common import triton_providers


def _kernels_imported_compiled() -> bool:
    from spec_hal import kernels

    return kernels.loaded_mode() == "compiled"


def _triton_imported_compiled() -> bool:
    """True when Triton was imported while TRITON_INTERPRET was off: triton.language's own @jit
    helpers (tl.sum, tl.max, ...) were then built for compilation and fail under the interpreter."""
    if "triton.language" not in sys.modules:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    helper = getattr(getattr(sys.modules["triton.language"], "standard", None), "sum", None)
    return helper is not None and not isinstance(helper, InterpretedFunction)


def _serialised(fn):
    """The interpreter is not thread-safe (it patches triton.language while a kernel runs), so
    every interpreted launch of the process takes one lock."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with _INTERPRETER_LOCK:
            return fn(*args, **kwargs)

    return call


_INTERPRETER_LOCK = threading.RLock()


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
        if _triton_imported_compiled():
            return ("triton was imported in this process without TRITON_INTERPRET=1, so triton.language "
                    "is built for compilation; set TRITON_INTERPRET=1 before anything imports triton "
                    "(or use a separate process)")
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
        providers = {op: Provider(_serialised(provider.fn), provider.description + " (launches serialised: the interpreter is not thread-safe)")
                     for op, provider in triton_providers(caps, vendor="interpreter").items()}
        return Backend("triton-interpret", caps, providers)


FACTORY = TritonInterpretFactory()
