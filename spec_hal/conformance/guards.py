"""Poisoned outputs, canary regions and a no-host-sync guard for conformance cases.

Outputs are written into the interior of a larger buffer: the interior is poisoned (NaN for
floats, a negative sentinel for integers) so an element the op forgot to write shows up as a
mismatch, and the margins hold canaries that must be bit-identical afterwards, so an
out-of-bounds write fails the case on every backend, the CPU one included.

Inputs are embedded the same way with margins of "attractive" values (large logits, valid-looking
ids): an out-of-bounds read picks them up and changes the result.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

MARGIN = 67  # elements on each side; odd so that a misaligned access cannot skip it
INT_POISON = -7777
INT_CANARY = 123456789
FLOAT_CANARY = -2.5e4


@dataclass
class Guarded:
    """A tensor living inside a buffer with canary margins on both sides."""

    buffer: torch.Tensor
    tensor: torch.Tensor
    canary: torch.Tensor

    def assert_intact(self, name: str) -> None:
        numel = self.tensor.numel()
        front = self.buffer[:MARGIN]
        back = self.buffer[MARGIN + numel:]
        for side, region in (("before", front), ("after", back)):
            if not torch.equal(_bits(region), _bits(self.canary)):
                raise AssertionError(f"{name}: the canary region {side} the buffer was overwritten (out-of-bounds write)")


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """Compare floats bitwise (NaN == NaN) by viewing them as integers."""
    tensor = tensor.cpu()
    if tensor.dtype.is_floating_point:
        return tensor.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])
    return tensor


def guarded_output(shape, dtype: torch.dtype, device) -> Guarded:
    """A poisoned, contiguous output tensor of ``shape`` with canaries around it."""
    numel = 1
    for size in shape:
        numel *= size
    buffer = torch.empty(numel + 2 * MARGIN, dtype=dtype, device=device)
    canary_value = FLOAT_CANARY if dtype.is_floating_point else INT_CANARY
    poison = float("nan") if dtype.is_floating_point else INT_POISON
    buffer.fill_(poison)
    buffer[:MARGIN] = canary_value
    buffer[MARGIN + numel:] = canary_value
    canary = torch.full((MARGIN,), canary_value, dtype=dtype)
    return Guarded(buffer, buffer[MARGIN:MARGIN + numel].view(shape), canary)


def embedded_input(values: torch.Tensor, device, *, margin_value) -> torch.Tensor:
    """Copy of a 2-D ``values`` placed inside a larger tensor whose margins hold ``margin_value``.

    The copy has a row stride wider than its row, so kernels must honour strides too.
    """
    rows, cols = values.shape
    outer = torch.full((rows + 2, cols + MARGIN), margin_value, dtype=values.dtype, device=device)
    view = outer[1:rows + 1, :cols]
    view.copy_(values)
    return view


def call_without_sync(device: torch.device, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with every tensor argument (and a DraftTree's) moved to ``device``
    first, then called under :func:`no_host_sync`: the host-to-device copies of the inputs are
    syncs of the test, not of the op under test."""
    from spec_hal.types import DraftTree

    from .trees import tree_to

    def move(value):
        if isinstance(value, torch.Tensor):
            return value.to(device)
        if isinstance(value, DraftTree):
            return tree_to(value, device)
        return value

    args = tuple(move(value) for value in args)
    kwargs = {name: move(value) for name, value in kwargs.items()}
    with no_host_sync(device):
        return fn(*args, **kwargs)


@contextlib.contextmanager
def no_host_sync(device: torch.device):
    """On CUDA/HIP, make any host synchronisation inside the block an error."""
    if device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def assert_rejects(backend, argument: str, call) -> None:
    """``call(backend)`` must raise InvalidInput naming ``argument`` (the bad-input cases)."""
    from spec_hal.errors import InvalidInput

    try:
        call(backend)
    except InvalidInput as error:
        assert error.argument == argument, f"InvalidInput named {error.argument!r}, expected {argument!r}"
        return
    raise AssertionError(f"no InvalidInput for a bad {argument!r}")
