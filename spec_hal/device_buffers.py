"""Device buffers: fresh outputs carved from one allocation (:func:`carve`), and long-lived
per-device buffers (the error flag, the sampling exp2 table) allocated outside any CUDA graph
memory pool (:func:`allocate_persistent`).

**Carving.** An eager op that returns a Verdict needs four int32 tensors, and some need int32
scratch beside them. Each ``torch.empty`` costs about 3 µs of host time on the H100 machine's
host (as much as a quarter of a whole Triton launch); one allocation split by
``split_with_sizes`` (one call for every view) costs about what two do. Each part starts on a
16-byte boundary, so a kernel sees the same pointer alignment (and Triton the same
specialisation) as with separate allocations. The parts share one storage, which the
``torch.ops.spec_hal`` kernels must not return (their schemas promise unaliased outputs): they run
the provider inside :class:`separate_parts`, where each part is an allocation of its own.

**Persistent buffers.**

Why: ``torch.compile(mode="reduce-overhead")`` runs a compiled function's first calls (its
warm-up) with the current stream's allocations routed into the cudagraph-trees pool, then refuses
to record while a tensor it did not return lives there ("Detected N tensor(s) in the cudagraph
pool not tracked as outputs"). A buffer that spec_hal creates on first use inside such a call
would be one. The redirection covers the current stream only (cudagraph trees and
``torch.cuda.graph`` use ``_cuda_beginAllocateCurrentStreamToPool``), so a buffer made on a side
stream stays in the ordinary caching allocator, owned by nobody's graph.

Inside an actual stream capture a side-stream allocation may need ``cudaMalloc``, which the
global capture mode forbids; there the buffer comes from the capture's pool as before, so make
the first use eager (``GraphRunner``'s warm-up call and ``spec_hal.warmup`` do).
"""
from __future__ import annotations

import functools
import operator
import threading
from typing import Callable, Optional, Sequence

import torch

ALIGNMENT_BYTES = 16  # each carved part starts on this boundary (Triton specialises pointers on it)


_separate = threading.local()  # .active: carve allocates each part on its own (see separate_parts)


class separate_parts:
    """Within this context (this thread), :func:`carve` allocates every part on its own: the
    ``torch.ops.spec_hal`` kernels promise outputs that share no memory, and would otherwise copy
    carved ones apart (a launch per output inside a compiled graph). A plain class: entered on
    every custom-op call, where contextlib's generator costs more."""

    def __enter__(self):
        self.previous = getattr(_separate, "active", False)
        _separate.active = True

    def __exit__(self, *exc):
        _separate.active = self.previous


def carve(sizes: Sequence[int], dtype: torch.dtype, device) -> tuple[torch.Tensor, ...]:
    """Fresh 1-D tensors of ``dtype`` and ``sizes`` elements on ``device``, carved from one
    allocation, each starting 16-byte aligned (contents uninitialised, like ``torch.empty``).
    Inside :class:`separate_parts`: one allocation each."""
    if getattr(_separate, "active", False):
        return tuple(torch.empty(size, dtype=dtype, device=device) for size in sizes)
    total, pieces, pick = _carving(tuple(sizes), max(ALIGNMENT_BYTES // dtype.itemsize, 1))
    parts = torch.empty(total, dtype=dtype, device=device).split_with_sizes(pieces)
    return parts if pick is None else pick(parts)


@functools.lru_cache(maxsize=4096)  # a pure function of a few ints: once per shape, not per call
def _carving(sizes: tuple, align: int) -> tuple[int, tuple, Optional[Callable]]:
    """(total elements, the pieces to split into, the getter of the wanted ones, or None when
    every piece is wanted). Padding becomes a piece of its own (dropped) only after a part whose
    size is not a multiple of ``align`` and that is not last: each view costs host time."""
    pieces, kept = [], []
    for position, size in enumerate(sizes):
        kept.append(len(pieces))
        pieces.append(size)
        if size % align and position + 1 < len(sizes):
            pieces.append(-size % align)
    if len(pieces) == len(sizes):
        return sum(pieces), tuple(pieces), None
    return sum(pieces), tuple(pieces), operator.itemgetter(*kept)  # padding implies two or more parts: a tuple


def int32_parts(sizes: Sequence[int], device) -> tuple[torch.Tensor, ...]:
    """:func:`carve` of int32 tensors (verdicts and the kernels' int32 scratch)."""
    return carve(sizes, torch.int32, device)


def capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is being captured into a CUDA/HIP graph (ROCm
    devices are "cuda" too; torch.cuda is not asked for other devices: a CPU-only torch raises)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def allocate_persistent(device: torch.device, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()`` (which allocates on ``device``), run where no graph pool can own the result;
    the current stream waits for it, so the buffer is ready for the next kernel. Inside a capture
    ``make()`` runs there, and the buffer holds its values only once that graph has replayed: a
    cache whose buffer a call can also build for itself should not keep one made in a capture
    (``capturing``; kernels/sampling.py's chain links)."""
    if device.type != "cuda" or capturing(device):
        return make()
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        tensor = make()
    current.wait_stream(side)
    return tensor
