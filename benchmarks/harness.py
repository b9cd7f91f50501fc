"""Shared benchmark harness: median GPU time, copy bandwidth of the same device, markdown rows.

Timing: CUDA events around ``repeat`` calls after ``warmup`` calls, median of ``trials``. On CPU
(no GPU) it falls back to wall-clock time so the scripts stay runnable, but figures for
BENCHMARKS.md come from a GPU. Benchmarks never assert on time.
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import time
from typing import Callable, Optional

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time_s(fn: Callable[[], object], device: torch.device, *, warmup: int = 5, repeat: int = 20, trials: int = 7) -> float:
    """Median over ``trials`` of the mean time of ``repeat`` back-to-back calls."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(trials):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeat):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / repeat)
        else:
            begin = time.perf_counter()
            for _ in range(repeat):
                fn()
            samples.append((time.perf_counter() - begin) / repeat)
    return statistics.median(samples)


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
        print(f"  (graph capture failed: {type(exc).__name__}: {str(exc)[:120]})")
        return None


def device_time_s(fn: Optional[Callable[[], object]], device: torch.device, **timing) -> Optional[float]:
    """Graph-replay time where ``fn`` captures (what a captured engine step pays), else the eager
    median. Used for spec_hal and for the baselines alike, so speed-ups compare like with like
    wherever the baseline captures; a baseline that syncs the host cannot, and is timed eagerly."""
    if fn is None:
        return None
    replay = graph_replay_time_s(fn, device)
    return replay if replay is not None else time_or_none(fn, device, **timing)


DEVICE_TIME_NOTE = ("Times are CUDA-graph replay medians per call where the function captures (device time without\n"
                    "Python launch overhead, as inside an engine's captured step), else eager medians.\n")


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


def maybe_compile(fn: Callable, device: torch.device) -> Optional[Callable]:
    """``torch.compile`` of a reference function, or None where it cannot run here."""
    try:
        compiled = torch.compile(fn)
        return compiled
    except Exception:
        return None


def time_or_none(fn: Optional[Callable[[], object]], device: torch.device, **kwargs) -> Optional[float]:
    if fn is None:
        return None
    try:
        return median_time_s(fn, device, **kwargs)
    except Exception as exc:  # torch.compile can fail on some shapes; report, do not crash
        print(f"  (baseline failed: {type(exc).__name__}: {str(exc)[:120]})")
        return None


def fmt_us(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f}"


def fmt_ratio(numerator: Optional[float], denominator: Optional[float]) -> str:
    if numerator is None or denominator is None or denominator == 0:
        return "-"
    return f"{numerator / denominator:.2f}x"


def header(title: str, device: torch.device, command: str) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    lines = [f"### {title}", "", f"- device: {name}", f"- date: {datetime.date.today().isoformat()}",
             f"- command: `{command}`", f"- torch {torch.__version__}"]
    try:
        import triton

        lines.append(f"- triton {triton.__version__}")
    except ImportError:
        pass
    if device.type == "cuda":
        lines.append(f"- measured copy bandwidth: {copy_bandwidth(device) / 1e9:.0f} GB/s (read + write)")
    return "\n".join(lines) + "\n"


def common_arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a few sizes only (smoke test)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    return parser
