"""Benchmark of draft_topk: the backend vs the torch reference and torch.compile of it.

Per (bs, V, k): replay and eager time per call, kernel launches, achieved bandwidth (logits read
once) as a share of this device's measured copy bandwidth, and speed-ups, all from one run.
"""
from __future__ import annotations

import torch

from . import harness
from .report import Column, Context, Table, ratio, us

SIZES = {
    "quick": dict(batches=(1, 16), vocabs=(4096,), topks=(1, 8)),
    "full": dict(batches=(1, 64, 256), vocabs=(32000, 128256), topks=(1, 8)),
}
COLUMNS = [Column("bs", "bs", "int"), Column("vocab", "V", "int"), Column("k", "k", "int"),
           Column("replay_us", "replay us", "us"), Column("eager_us", "eager us", "us"), Column("kernels", "launches", "int"),
           Column("gbs", "GB/s", "gbs"), Column("share_of_copy", "% of copy BW", "share"),
           Column("reference_us", "reference us", "us"), Column("compile_us", "torch.compile us", "us"),
           Column("vs_reference", "vs reference", "ratio"), Column("vs_compile", "vs compile", "ratio")]


def _baseline_time(fn, device, timing):
    """Baselines get the same treatment as spec_hal: graph replay where it captures, else eager."""
    if fn is None:
        return None
    replay = harness.graph_replay_time_s(fn, device, calls=5, trials=3)
    return replay if replay is not None else harness.time_or_none(fn, device, **timing)


def run(ctx: Context) -> list[Table]:
    from ..topk import draft_topk as reference_draft_topk

    device, backend, sizes = ctx.device, ctx.backend, SIZES[ctx.sizes]
    table = Table("topk", f"draft_topk (float32 logits) on backend {backend.name}", COLUMNS, notes=[
        "'replay' captures 20 calls in one CUDA graph (what an engine's captured decode step sees); 'eager' is "
        "back-to-back Python calls (includes launch overhead). Bandwidth and speed-ups use the replay time where "
        "there is one; the reference and torch.compile baselines are replayed from a graph where they capture."])
    harness.allow_many_recompiles()
    compiled_reference = harness.maybe_compile(reference_draft_topk) if ctx.compile else None
    for rows in sizes["batches"]:
        for vocab in sizes["vocabs"]:
            logits = torch.randn(rows, vocab, device=device)
            for k in sizes["topks"]:
                ctx.progress(f"topk bs={rows} V={vocab} k={k}")
                probs = torch.empty(rows, k, device=device)
                ids = torch.empty(rows, k, device=device, dtype=torch.int64)
                call = lambda: backend.draft_topk(logits, k, out=(probs, ids))  # noqa: E731
                eager = harness.median_time_s(call, device, **ctx.timing)
                replay = harness.graph_replay_time_s(call, device)
                ours = replay if replay is not None else eager
                reference = _baseline_time(lambda: reference_draft_topk(logits, k), device, ctx.timing)
                compiled = _baseline_time((lambda: compiled_reference(logits, k)) if compiled_reference else None, device, ctx.timing)
                nbytes = rows * vocab * logits.element_size()
                table.add(bs=rows, vocab=vocab, k=k, replay_us=us(replay), eager_us=us(eager), kernels=harness.count_kernels(call, device),
                          gbs=nbytes / ours / 1e9, share_of_copy=ctx.share_of_copy(nbytes, ours), reference_us=us(reference),
                          compile_us=us(compiled), vs_reference=ratio(reference, ours), vs_compile=ratio(compiled, ours))
    return [table]
