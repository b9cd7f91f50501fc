"""Timing shared by every benchmark suite: device time (CUDA-graph replay or eager medians), host
time per eager call, copy bandwidth of the same device, kernel launch counts.

Timing: CUDA events around ``repeat`` calls after ``warmup`` calls, median of ``trials``. Off CUDA
it falls back to wall-clock time so that the suites run anywhere (the CPU smoke test in CI), but
published figures come from a GPU. A call slower than the time budget gets fewer repeats, so a
slow torch reference cannot stretch a run by minutes. Benchmarks never assert on time.
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Callable, Optional

import torch

# One measurement (warm-up excluded) aims at no more than this many seconds; a slower call is
# repeated fewer times (at least once per trial).
TIME_BUDGET_S = 1.0

DEVICE_TIME_NOTE = ("Times are CUDA-graph replay medians per call where the function captures (device time without "
                    "Python launch overhead, as inside an engine's captured step), else eager medians.")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _elapsed_s(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    """Seconds per call of ``repeat`` back-to-back calls (CUDA events on a GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repeat
    begin = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - begin) / repeat


def median_time_s(fn: Callable[[], object], device: torch.device, *, warmup: int = 5, repeat: int = 20, trials: int = 7,
                  budget_s: float = TIME_BUDGET_S) -> float:
    """Median over ``trials`` of the mean time of ``repeat`` back-to-back calls.

    The first warm-up call is timed: where ``repeat * trials`` such calls would exceed
    ``budget_s``, the remaining warm-up is skipped and repeats (then trials, down to 3) shrink."""
    begin = time.perf_counter()
    fn()
    synchronize(device)
    first = time.perf_counter() - begin
    if first * repeat * trials > budget_s:
        warmup, trials = 1, min(trials, 3)
        repeat = max(1, int(budget_s / (first * trials)))
    for _ in range(warmup - 1):
        fn()
    synchronize(device)
    return statistics.median(_elapsed_s(fn, device, repeat) for _ in range(trials))


def time_or_none(fn: Optional[Callable[[], object]], device: torch.device, **timing) -> Optional[float]:
    """``median_time_s``, or None where ``fn`` is None or fails (a baseline that cannot run here
    is reported as missing, never crashes a table)."""
    if fn is None:
        return None
    try:
        return median_time_s(fn, device, **timing)
    except Exception as exc:  # torch.compile can fail on some shapes; report, do not crash
        print(f"  (baseline failed: {type(exc).__name__}: {str(exc)[:120]})", file=sys.stderr)
        return None


def graph_replay_time_s(fn: Callable[[], object], device: torch.device, *, calls: int = 20, trials: int = 7) -> Optional[float]:
    """Median time per call when ``calls`` back-to-back calls are captured in one CUDA/HIP graph
    and replayed: the device time an engine sees inside its captured decode step, without the
    Python launch overhead. None where capture is unavailable or fails."""
    if device.type != "cuda":
        return None
    try:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        seconds = median_time_s(graph.replay, device, warmup=2, repeat=3, trials=trials)
        return seconds / calls
    except Exception as exc:  # report, never crash a benchmark table
        print(f"  (graph capture failed, timed eagerly: {type(exc).__name__}: {str(exc)[:120]})", file=sys.stderr)
        return None


def device_time_s(fn: Optional[Callable[[], object]], device: torch.device, **timing) -> Optional[float]:
    """Graph-replay time where ``fn`` captures (what a captured engine step pays), else the eager
    median. Used for spec_hal and for the baselines alike, so speed-ups compare like with like
    wherever the baseline captures; a baseline that syncs the host cannot, and is timed eagerly."""
    if fn is None:
        return None
    replay = graph_replay_time_s(fn, device)
    return replay if replay is not None else time_or_none(fn, device, **timing)


def host_time_s(fn: Callable[[], object], device: torch.device, *, calls: int = 200, trials: int = 5) -> float:
    """Wall time per call of ``calls`` back-to-back eager calls (median of ``trials``), device
    synchronised before and after each trial: on tiny inputs this is the host cost of a call
    (argument checks, dispatch, launch), which bounds an engine's eager step."""
    for _ in range(min(calls, 20)):
        fn()
    samples = []
    for _ in range(trials):
        synchronize(device)
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(device)
        samples.append((time.perf_counter() - begin) / calls)
    return statistics.median(samples)


_copy_bandwidth: dict[str, float] = {}


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (read + write counted), cached."""
    key = str(device)
    if key not in _copy_bandwidth:
        source = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        target = torch.empty_like(source)
        seconds = median_time_s(lambda: target.copy_(source), device, warmup=3, repeat=10, trials=5)
        _copy_bandwidth[key] = 2 * nbytes / seconds
    return _copy_bandwidth[key]


def maybe_compile(fn: Callable) -> Optional[Callable]:
    """``torch.compile`` of a reference function, or None where it cannot be set up here."""
    try:
        return torch.compile(fn)
    except Exception:
        return None


def allow_many_recompiles() -> None:
    """A reference compiled at every shape of a grid recompiles per shape; without a higher limit
    dynamo silently falls back to eager after 8 shapes and the baseline would lie."""
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)


def count_kernels(fn: Callable[[], object], device: torch.device) -> Optional[int]:
    """Kernels (and device copies) one call executes, counted with torch.profiler; None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(device)
    return sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)


LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
               "cudaMemcpyAsync", "cudaMemsetAsync", "hipLaunchKernel", "hipModuleLaunchKernel",
               "hipExtModuleLaunchKernel", "hipGraphLaunch", "hipMemcpyAsync", "hipMemsetAsync", "hipMemcpyWithStream")


def count_launches(fn: Callable[[], object], device: torch.device) -> tuple[Optional[int], Optional[int]]:
    """(host launch calls, GPU kernels) of one call, from torch.profiler; (None, None) off CUDA.

    Host launches are the runtime/driver calls that submit GPU work (LAUNCH_APIS): eager pays
    one per kernel, a graph replay one graph launch plus its copies; GPU kernels are the
    kernels/copies the device executes (a graph's nodes run there too)."""
    if device.type != "cuda":
        return None, None
    from torch.profiler import ProfilerActivity, profile

    fn()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(device)
    host = sum(1 for event in prof.events() if event.name in LAUNCH_APIS)
    gpu = sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)
    return host, gpu
