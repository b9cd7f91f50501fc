"""Benchmark of ``commit_mamba_state`` (P19): Qwen3-Next-80B- and Nemotron-H-shaped states.

    python benchmarks/mamba.py            # GPU: the table for BENCHMARKS.md
    python benchmarks/mamba.py --quick    # smoke test (on CPU: small states, interpreted kernels)

Per model and batch size: the median time of one commit (last accepted node's SSM and conv
states of every layer into the pool, plus the prefix-cache snapshots that this round's verdict
asks for), the bytes it moved (read + written, as reported by the op), the achieved bandwidth as a
share of the measured device copy bandwidth (goal >= 80%) for eager calls and for CUDA-graph
replay (an eager call is three Triton launches plus argument checks on the host, which bs = 1
cannot hide), and the speed-ups over the reference
(advanced indexing with boolean masks, which syncs the host) and over ``torch.compile`` of it, all
measured in the same run. The pool holds ``2 * max(bs) + 8`` slots; the speculative scratch holds
``max(bs)`` rows of N = 4 states (MTP S = 3): the dominant memory, printed per model.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    ssm_shape: tuple[int, ...]
    conv_shape: tuple[int, ...]


# docs/semantics.md §3 (TP = 1)
MODELS = (
    Model("Qwen3-Next-80B-A3B", 36, (32, 128, 128), (8192, 3)),
    Model("Nemotron-H", 24, (128, 64, 128), (10240, 3)),
)
QUICK_MODELS = (Model("tiny (quick)", 2, (2, 16, 16), (64, 3)),)
NODES = 4  # N = S + 1 for MTP with S = 3
TRACK_INTERVAL = 16


def _inputs(model: Model, max_bs: int, device, torch):
    num_slots = 2 * max_bs + 8
    states = {
        "ssm_state": torch.zeros((model.layers, num_slots, *model.ssm_shape), dtype=torch.float32, device=device),
        "ssm_intermediate": torch.randn((model.layers, max_bs, NODES, *model.ssm_shape), dtype=torch.float32, device=device),
        "conv_state": torch.zeros((model.layers, num_slots, *model.conv_shape), dtype=torch.bfloat16, device=device),
        "conv_intermediate": torch.randn((model.layers, max_bs, NODES, *model.conv_shape), device=device).to(torch.bfloat16),
    }
    total = sum(t.numel() * t.element_size() for t in states.values())
    print(f"- {model.name}: {model.layers} layers, SSM {model.ssm_shape} fp32, conv {model.conv_shape} bf16; "
          f"pool {num_slots} slots, scratch {max_bs} rows x N={NODES}: {total / 1e9:.1f} GB allocated")
    return states, num_slots


def _commit_arguments(model_states, num_slots, bs, device, torch):
    from spec_hal.conformance.mamba_inputs import random_verdict
    from spec_hal.types import Verdict

    verdict = random_verdict(bs, num_steps=NODES - 1, topk=1, num_nodes=NODES, seed=bs)
    verdict = Verdict(*(t.to(device) for t in (verdict.predict, verdict.accept_index, verdict.num_correct, verdict.accept_lens)))
    generator = torch.Generator().manual_seed(bs)
    permutation = torch.randperm(num_slots, generator=generator)
    return dict(
        verdict=verdict,
        seq_lens=torch.randint(0, 4096, (bs,), generator=generator).to(device),
        slots=permutation[:bs].to(device),
        track_slots=permutation[bs:2 * bs].to(device),
        track_interval=TRACK_INTERVAL,
        **{name: (tensor[:, :bs] if "intermediate" in name else tensor) for name, tensor in model_states.items()},
    )


def _captured(fn, device, torch):
    """``fn`` captured in a CUDA graph (launch overhead removed, as in a graph-captured engine
    step); its replay, or None off CUDA."""
    if device.type != "cuda":
        return None
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn()  # warm-up outside capture: compiles and caches the kernels
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _bandwidth(moved: int, seconds, copy_bw) -> str:
    if seconds is None:
        return "-"
    achieved = moved / seconds
    share = "" if copy_bw is None else f" ({100 * achieved / copy_bw:.0f}%)"
    return f"{achieved / 1e9:.0f}{share}"


def main() -> None:
    parser = harness.common_arguments(__doc__.splitlines()[0])
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
    import torch

    import spec_hal
    from spec_hal.mamba import commit_mamba_state as reference_commit

    device = torch.device(args.device)
    backend = spec_hal.get_backend("triton-interpret" if device.type == "cpu" else None, device=device)
    models = QUICK_MODELS if args.quick or device.type == "cpu" else MODELS
    batch_sizes = (1, 4) if device.type == "cpu" else (1, 16, 64)
    timing = dict(warmup=1, repeat=1, trials=3) if device.type == "cpu" else {}
    command = "python benchmarks/mamba.py" + (" --quick" if args.quick else "")
    print(harness.header("commit_mamba_state", device, command))
    print(f"- backend: {backend.name} ({backend.provider('commit_mamba_state').description})")
    print(f"- N = {NODES} (MTP S = 3, K = 1), track interval {TRACK_INTERVAL}; bytes = read + written per the op's report")
    copy_bw = harness.copy_bandwidth(device) if device.type == "cuda" else None
    rows = []
    for model in models:
        states, num_slots = _inputs(model, max(batch_sizes), device, torch)
        for bs in batch_sizes:
            kwargs = _commit_arguments(states, num_slots, bs, device, torch)
            result = backend.commit_mamba_state(**kwargs)
            moved = int(result.bytes_moved)
            copies = int((result.last_step >= 0).sum()) + int((result.track_step >= 0).sum())
            kernel_s = harness.median_time_s(lambda: backend.commit_mamba_state(**kwargs), device, **timing)
            graph_s = harness.time_or_none(_captured(lambda: backend.commit_mamba_state(**kwargs), device, torch), device)
            reference_s = harness.time_or_none(lambda: reference_commit(**kwargs), device, **timing)
            compiled = None if args.no_compile or device.type == "cpu" else harness.maybe_compile(reference_commit, device)
            compiled_s = harness.time_or_none(None if compiled is None else (lambda: compiled(**kwargs)), device, **timing)
            rows.append(f"| {model.name} | {bs} | {copies} | {moved / 1e6:.1f} | {harness.fmt_us(kernel_s)} | "
                        f"{_bandwidth(moved, kernel_s, copy_bw)} | {harness.fmt_us(graph_s)} | {_bandwidth(moved, graph_s, copy_bw)} | "
                        f"{harness.fmt_us(reference_s)} | {harness.fmt_ratio(reference_s, kernel_s)} | "
                        f"{harness.fmt_us(compiled_s)} | {harness.fmt_ratio(compiled_s, kernel_s)} |")
        del states, kwargs, result
        if device.type == "cuda":
            torch._dynamo.reset()  # compiled baselines may hold this model's tensors
            torch.cuda.empty_cache()
    print()
    print("| model | bs | state copies | MB moved | eager (us) | GB/s (of copy bw) | graph replay (us) | GB/s (of copy bw) | "
          "reference (us) | speed-up (eager) | torch.compile (us) | speed-up (eager) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if copy_bw is not None:
        print(f"\nmeasured copy bandwidth: {copy_bw / 1e9:.0f} GB/s (read + write); peak allocated "
              f"{torch.cuda.max_memory_allocated(device) / 1e9:.1f} GB")


if __name__ == "__main__":
    main()
