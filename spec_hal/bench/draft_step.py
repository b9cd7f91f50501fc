"""Benchmark: one full draft step (``run_draft`` for S steps + ``organize_draft`` + ``build_tree``)
eager versus ``run_draft(..., graph=DraftGraphs(batches))`` replayed, same run (issue 6 item 4).

Model: ``spec_hal.testing.EagleDraftModel`` (embedding, RoPE, one draft layer, LM head), bfloat16
on cuda, float32 elsewhere. The replayed step includes the runner's copy-in, padding, replay,
output clones, and the eager organize_draft and build_tree. Launch columns as in the graphs
suite (host launch calls and GPU kernels per step, from torch.profiler; "-" off CUDA).
Goal (issue 6): replay <= 1/3 of eager at bs = 1.
"""
from __future__ import annotations

import torch

from . import harness
from .report import Column, Context, Table, ratio, us

SIZES = {
    "quick": dict(shapes=((3, 1, 4),), batches=(1, 16), vocab=4096, hidden=256),
    "full": dict(shapes=((3, 1, 4), (5, 4, 8)), batches=(1, 16, 64), vocab=32000, hidden=1024),
}
COLUMNS = [Column("shape", "(S, K, N)"), Column("bs", "bs", "int"), Column("mode", "mode"), Column("eager_us", "eager us", "us"),
           Column("replay_us", "replay us", "us"), Column("replay_over_eager", "replay/eager", "ratio"),
           Column("host_launches_eager", "host launches eager", "int"), Column("host_launches_replay", "host launches replay", "int"),
           Column("kernels_eager", "GPU kernels eager", "int"), Column("kernels_replay", "GPU kernels replay", "int")]


def make_state(bs: int, topk: int, *, vocab: int, hidden_size: int, dtype: torch.dtype, device):
    from ..types import DraftState

    generator = torch.Generator().manual_seed(bs)
    probs, ids = torch.softmax(torch.randn(bs, vocab, generator=generator) * 3, dim=-1).topk(topk, dim=-1)
    return DraftState(roots=torch.randint(0, vocab, (bs,), generator=generator).to(device),
                      positions=torch.randint(0, 4000, (bs,), generator=generator).to(device),
                      probs=probs.to(device), ids=ids.to(device),
                      hidden=torch.randn(bs, hidden_size, generator=generator).to(device, dtype))


def draft_step(model, state, *, steps, topk, nodes, backend, graph=None):
    from ..draft_loop import run_draft

    result = run_draft(model, state, steps=steps, topk=topk, backend=backend, graph=graph)
    parents, selected, draft_tokens = backend.organize_draft(result.records, nodes)
    return backend.build_tree(state.roots, parents, selected, draft_tokens, state.positions, topk=topk)


def run(ctx: Context) -> list[Table]:
    from ..draft_loop import DraftGraphs
    from ..testing import EagleDraftModel

    device, backend, sizes = ctx.device, ctx.backend, SIZES[ctx.sizes]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    vocab, hidden_size = sizes["vocab"], sizes["hidden"]
    table = Table("draft_step", f"draft step: run_draft + organize_draft + build_tree, eager vs graph replay "
                  f"(V={vocab}, H={hidden_size}, {str(dtype)[6:]}, backend {backend.name})", COLUMNS,
                  notes=["replay/eager <= 0.33x at bs = 1 is the goal of issue 6; the replayed step runs organize_draft and "
                         "build_tree eagerly."])
    for steps, topk, nodes in sizes["shapes"]:
        model = EagleDraftModel(vocab_size=vocab, hidden_size=hidden_size, seed=steps, dtype=dtype).to(device)
        graphs = DraftGraphs(sizes["batches"])
        for bs in sizes["batches"]:
            ctx.progress(f"draft_step bs={bs} (S, K, N)=({steps}, {topk}, {nodes})")
            state = make_state(bs, topk, vocab=vocab, hidden_size=hidden_size, dtype=dtype, device=device)
            eager = lambda: draft_step(model, state, steps=steps, topk=topk, nodes=nodes, backend=backend)  # noqa: E731
            replay = lambda: draft_step(model, state, steps=steps, topk=topk, nodes=nodes, backend=backend, graph=graphs)  # noqa: E731
            replay()  # the first call captures every bucket (once per shape)
            eager_s = harness.time_or_none(eager, device, **ctx.timing)
            replay_s = harness.time_or_none(replay, device, **ctx.timing)
            host_eager, gpu_eager = harness.count_launches(eager, device)
            host_replay, gpu_replay = harness.count_launches(replay, device)
            table.add(shape=f"({steps}, {topk}, {nodes})", bs=bs, mode=graphs.modes[0], eager_us=us(eager_s), replay_us=us(replay_s),
                      replay_over_eager=ratio(replay_s, eager_s), host_launches_eager=host_eager, host_launches_replay=host_replay,
                      kernels_eager=gpu_eager, kernels_replay=gpu_replay)
        for runner in graphs.runners.values():
            if runner.fallback_reason:
                table.notes.append(f"note: {runner.fallback_reason}")
    return [table]
