"""Benchmark of draft_topk: the Triton backend vs the torch reference and torch.compile of it.

    python benchmarks/topk.py [--quick] [--dtype float32|bfloat16] [--no-compile]

Prints a markdown table for BENCHMARKS.md: median time per call, achieved bandwidth (logits read
once) as a share of this device's measured copy bandwidth, and speed-ups, all from one run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent))  # run from a checkout without installing
from harness import (common_arguments, copy_bandwidth, fmt_ratio, fmt_us, graph_replay_time_s, header, maybe_compile,  # noqa: E402
                     median_time_s, time_or_none)

import spec_hal  # noqa: E402
from spec_hal.topk import draft_topk as reference_draft_topk  # noqa: E402


def count_launches(fn, device) -> str:
    """Kernel launches of one call, counted with the profiler (CUDA only)."""
    if device.type != "cuda":
        return "-"
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    return str(sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA))


def _best_time(fn, device):
    """Baselines get the same treatment as spec_hal: graph replay where it captures, else eager."""
    if fn is None:
        return None
    replay = graph_replay_time_s(fn, device, calls=5, trials=3)
    return replay if replay is not None else time_or_none(fn, device, repeat=5, trials=3)


def main() -> None:
    parser = common_arguments(__doc__)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    backend = spec_hal.get_backend(None if device.type == "cuda" else "triton-interpret")
    batches = (1, 64) if args.quick else (1, 16, 64, 256)
    vocabs = (32000,) if args.quick else (32000, 128256, 151936)
    topks = (1, 8) if args.quick else (1, 4, 8)
    print(header(f"draft_topk ({args.dtype} logits) on backend {backend.name}", device, "python benchmarks/topk.py " + " ".join(sys.argv[1:])))
    bandwidth = copy_bandwidth(device) if device.type == "cuda" else None
    print("Times are medians per call. 'replay' captures 20 calls in one CUDA graph (what an engine's captured decode\n"
          "step sees); 'eager' is back-to-back Python calls (includes launch overhead). Bandwidth and speed-ups use the\n"
          "replay time; the reference and torch.compile baselines are also replayed from a graph where they capture.\n")
    print("| bs | V | k | replay us | eager us | launches | GB/s | % of copy BW | reference us | torch.compile us | vs reference | vs compile |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    compiled_reference = None if args.no_compile else maybe_compile(reference_draft_topk, device)
    for rows in batches:
        for vocab in vocabs:
            logits = torch.randn(rows, vocab, device=device, dtype=dtype)
            for k in topks:
                probs = torch.empty(rows, k, device=device)
                ids = torch.empty(rows, k, device=device, dtype=torch.int64)
                call = lambda: backend.draft_topk(logits, k, out=(probs, ids))  # noqa: E731
                eager = median_time_s(call, device)
                replay = graph_replay_time_s(call, device)
                ours = replay if replay is not None else eager
                reference = _best_time(lambda: reference_draft_topk(logits, k), device)
                compiled = _best_time((lambda: compiled_reference(logits, k)) if compiled_reference else None, device)
                achieved = rows * vocab * logits.element_size() / ours
                share = f"{100 * achieved / bandwidth:.0f}%" if bandwidth else "-"
                launches = count_launches(call, device)
                print(f"| {rows} | {vocab} | {k} | {fmt_us(replay)} | {fmt_us(eager)} | {launches} | {achieved / 1e9:.0f} | {share} | "
                      f"{fmt_us(reference)} | {fmt_us(compiled)} | {fmt_ratio(reference, ours)} | {fmt_ratio(compiled, ours)} |", flush=True)


if __name__ == "__main__":
    main()
