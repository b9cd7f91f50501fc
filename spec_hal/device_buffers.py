"""Long-lived per-device buffers (the error flag, the sampling exp2 table), allocated outside any
CUDA graph memory pool.

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

from typing import Callable

import torch


def allocate_persistent(device: torch.device, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()`` (which allocates on ``device``), run where no graph pool can own the result;
    the current stream waits for it, so the buffer is ready for the next kernel."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make()
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        tensor = make()
    current.wait_stream(side)
    return tensor
