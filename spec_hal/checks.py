"""Argument checks shared by every op. They read only metadata (shape, dtype, device), never
values, so they cost no device sync and are safe inside graph capture. Each failure raises
:class:`~spec_hal.errors.InvalidInput` naming the argument.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional, Sequence

import torch

from .errors import InvalidInput

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


CHECKS_ENV = "SPEC_HAL_CHECKS"
# os.environ.get on an unset variable raises and catches a KeyError inside (about 3 us, paid by
# every op that reads the flag); the mapping behind os.environ answers the same without raising.
_ENVIRON_DATA = getattr(os.environ, "_data", None)
try:
    _CHECKS_KEY, _CHECKS_ON = os.environ.encodekey(CHECKS_ENV), os.environ.encodevalue("1")
except AttributeError:
    _ENVIRON_DATA = None


def value_checks_enabled() -> bool:
    """True when ``SPEC_HAL_CHECKS=1``: run the value checks that need a device sync."""
    if _ENVIRON_DATA is None:
        return os.environ.get(CHECKS_ENV) == "1"
    return _ENVIRON_DATA.get(_CHECKS_KEY) == _CHECKS_ON


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def tensor(
    name: str,
    value: object,
    *,
    ndim: Optional[int] = None,
    dtypes: Optional[Sequence[torch.dtype]] = None,
    device: Optional[torch.device] = None,
    shape: Optional[Sequence[Optional[int]]] = None,
) -> torch.Tensor:
    """Check that ``value`` is a tensor with the given rank, dtype, device and shape.

    ``shape`` entries of None match any size.
    """
    if not isinstance(value, torch.Tensor):
        raise InvalidInput(name, "a torch.Tensor", type(value).__name__)
    if value.device.type == "meta":  # no data: an op on it would silently return meta outputs
        raise InvalidInput(name, "a tensor with data", "a tensor on the meta device")
    if ndim is not None and value.dim() != ndim:
        raise InvalidInput(name, f"a {ndim}-D tensor", f"shape {tuple(value.shape)}")
    if dtypes is not None and value.dtype not in dtypes:
        raise InvalidInput(name, f"dtype {_dtype_names(dtypes)}", str(value.dtype).replace("torch.", ""))
    if device is not None and value.device != device:
        raise InvalidInput(name, f"a tensor on {device} (same device as the other inputs)", f"one on {value.device}")
    if shape is not None and value.shape != tuple(shape):  # equal shapes (the common case) end here
        if len(shape) != value.dim() or any(want is not None and want != got for want, got in zip(shape, value.shape)):
            wanted = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise InvalidInput(name, f"shape {wanted}", f"shape {tuple(value.shape)}")
    return value


def integer(name: str, value: object, *, low: int, high: Optional[int] = None) -> int:
    """Check that ``value`` is a Python int (not bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(name, "a Python int", type(value).__name__)
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidInput(name, f"an int in {bound}", value)
    return value


def out_tensors(name: str, out: object, specs: Sequence[tuple[tuple[int, ...], torch.dtype]], device: torch.device):
    """Check an ``out=`` tuple against the (shape, dtype) each output must have."""
    if out is None:
        return None
    if not isinstance(out, (tuple, list)) or len(out) != len(specs):
        raise InvalidInput(name, f"a tuple of {len(specs)} tensors", type(out).__name__)
    for index, (buffer, (shape, dtype)) in enumerate(zip(out, specs)):
        tensor(f"{name}[{index}]", buffer, dtypes=(dtype,), device=device, shape=shape)
        if not buffer.is_contiguous():
            raise InvalidInput(f"{name}[{index}]", "a contiguous tensor", f"strides {buffer.stride()}")
    return out


def may_overlap(value: torch.Tensor) -> bool:
    """True when two indices of ``value`` may address one element (an expanded, stride-0 view, or
    strides too small for the sizes). Sufficient test: sorted by stride, each dimension's stride
    must exceed the span of all smaller-stride dimensions together; a non-overlapping but exotic
    interleaved layout may fail it too, which is fine for the arguments it guards."""
    if value.numel() == 0:
        return False
    span = 0  # elements spanned by the dimensions taken so far, minus one
    for stride, size in sorted((stride, size) for size, stride in zip(value.shape, value.stride()) if size > 1):
        if stride <= span:
            return True
        span += (size - 1) * stride
    return False


def writable(name: str, value: torch.Tensor) -> torch.Tensor:
    """Check that an argument the op writes in place has no overlapping elements.

    An expanded (stride 0) or otherwise self-overlapping destination makes the result depend on
    the order of the writes (a race on a GPU); it cannot be copied either, since the caller must
    see the writes, so it is rejected.
    """
    if may_overlap(value):
        raise InvalidInput(name, "a tensor written in place without overlapping elements (no stride 0 / expanded view)",
                           f"shape {tuple(value.shape)} with strides {value.stride()}")
    return value
