"""Benchmark: one full draft step (``run_draft`` for S steps + ``organize_draft`` + ``build_tree``)
eager versus ``run_draft(..., graph=DraftGraphs(batches))`` replayed, same run (issue 6 item 4).

Model: ``spec_hal.testing.EagleDraftModel`` (embedding, RoPE, one draft layer, LM head) at
``--hidden``/``--vocab`` (default 1024 / 32000) in ``--dtype`` (default bfloat16 on cuda, float32
on cpu). (S, K, N) in {(3, 1, 4), (5, 4, 8)}, bs in {1, 16, 64}. The replayed step includes the
runner's copy-in, padding, replay, output clones, and the eager organize_draft and build_tree.
Launch columns as in benchmarks/graphs.py (host launch calls and GPU kernels per step, from
torch.profiler; "-" off CUDA). Goal (issue 6): replay <= 1/3 of eager at bs = 1.

Run: ``python benchmarks/draft_step.py [--quick] [--hidden 1024 --vocab 32000 --dtype bfloat16]``.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graphs import count_launches  # noqa: E402
from harness import common_arguments, fmt_ratio, fmt_us, header, time_or_none  # noqa: E402

import spec_hal  # noqa: E402
from spec_hal.selection import backend_for_device  # noqa: E402
from spec_hal.testing import EagleDraftModel  # noqa: E402
from spec_hal.types import DraftState  # noqa: E402

SHAPES = ((3, 1, 4), (5, 4, 8))
BATCHES = (1, 16, 64)


def make_state(bs: int, topk: int, *, vocab: int, hidden_size: int, dtype: torch.dtype, device) -> DraftState:
    generator = torch.Generator().manual_seed(bs)
    probs, ids = torch.softmax(torch.randn(bs, vocab, generator=generator) * 3, dim=-1).topk(topk, dim=-1)
    return DraftState(roots=torch.randint(0, vocab, (bs,), generator=generator).to(device),
                      positions=torch.randint(0, 4000, (bs,), generator=generator).to(device),
                      probs=probs.to(device), ids=ids.to(device),
                      hidden=torch.randn(bs, hidden_size, generator=generator).to(device, dtype))


def draft_step(model, state, *, steps, topk, nodes, backend, graph=None):
    result = spec_hal.run_draft(model, state, steps=steps, topk=topk, backend=backend, graph=graph)
    parents, selected, draft_tokens = backend.organize_draft(result.records, nodes)
    return backend.build_tree(state.roots, parents, selected, draft_tokens, state.positions, topk=topk)


def main() -> None:
    parser = common_arguments(__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "float64"), default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    backend = backend_for_device(device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    shapes, batches = (SHAPES[:1], BATCHES[:2]) if args.quick else (SHAPES, BATCHES)
    timing = {"warmup": 1, "repeat": 3, "trials": 3} if args.quick else {}
    vocab, hidden_size = (min(args.vocab, 4096), min(args.hidden, 256)) if args.quick else (args.vocab, args.hidden)
    command = "python benchmarks/draft_step.py" + (" --quick" if args.quick else "") + f" --hidden {hidden_size} --vocab {vocab} --dtype {str(dtype)[6:]}"
    print(header(f"draft step: run_draft + organize_draft + build_tree, eager vs graph replay (V={vocab}, H={hidden_size}, "
                 f"{str(dtype)[6:]}, backend {backend.name})", device, command))
    print("| (S, K, N) | bs | mode | eager us | replay us | replay/eager | host launches eager | host launches replay | GPU kernels eager | GPU kernels replay |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for steps, topk, nodes in shapes:
        model = EagleDraftModel(vocab_size=vocab, hidden_size=hidden_size, seed=steps, dtype=dtype).to(device)
        graphs = spec_hal.DraftGraphs(batches)
        for bs in batches:
            state = make_state(bs, topk, vocab=vocab, hidden_size=hidden_size, dtype=dtype, device=device)
            eager = lambda: draft_step(model, state, steps=steps, topk=topk, nodes=nodes, backend=backend)  # noqa: E731
            replay = lambda: draft_step(model, state, steps=steps, topk=topk, nodes=nodes, backend=backend, graph=graphs)  # noqa: E731
            replay()  # the first call captures every bucket (once per shape)
            eager_s = time_or_none(eager, device, **timing)
            replay_s = time_or_none(replay, device, **timing)
            host_eager, gpu_eager = count_launches(eager, device)
            host_replay, gpu_replay = count_launches(replay, device)
            mode = graphs.modes[0]
            print(f"| ({steps}, {topk}, {nodes}) | {bs} | {mode} | {fmt_us(eager_s)} | {fmt_us(replay_s)} | {fmt_ratio(replay_s, eager_s)} | "
                  f"{host_eager} | {host_replay} | {gpu_eager} | {gpu_replay} |")
        for runner in graphs.runners.values():
            if runner.fallback_reason:
                print(f"\nnote: {runner.fallback_reason}")
    print("\nreplay/eager <= 0.33x at bs = 1 is the goal of issue 6; the replayed step runs organize_draft and build_tree eagerly.")


if __name__ == "__main__":
    main()
