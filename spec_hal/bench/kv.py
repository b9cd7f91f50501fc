"""Benchmark of ``move_kv``: the accepted-path KV move of tree drafting (P13).

Workload per (bs, S, K, N): a pool of ``layers`` x (K, V) caches of (num_slots, heads, head_dim)
bf16; every request moves S rows (ranks 1..S, each from the next verify slot down by one: the
longest overlapping chain a fully accepted tree path can produce, so every source but the last
is also a destination). Requests sit at random places in the pool. Bandwidth counts the bytes
read plus written by the moves and is reported as a share of this device's measured copy
bandwidth; the torch reference (``spec_hal.kv.move_kv``) and ``torch.compile`` of it run in the
same process on the same inputs.
"""
from __future__ import annotations

import torch

from . import harness
from .report import Column, Context, Table, ratio, us

SIZES = {
    "quick": dict(configs=((5, 4, 8),), batches=(1, 16), layers=2, heads=2, head_dim=64, slots=4096),
    "full": dict(configs=((3, 1, 4), (5, 4, 8), (5, 8, 32)), batches=(1, 64, 256), layers=32, heads=8, head_dim=128, slots=65536),
}
COLUMNS = [Column("bs", "bs", "int"), Column("config", "S, K, N"), Column("moves", "moves", "int"), Column("mb_moved", "MB moved", "mb"),
           Column("time_us", "spec_hal (us)", "us"), Column("share_of_copy", "share of copy BW", "share"),
           Column("reference_us", "torch ref (us)", "us"), Column("compile_us", "torch.compile (us)", "us"),
           Column("vs_reference", "vs ref", "ratio"), Column("vs_compile", "vs compile", "ratio")]


def build_moves(bs: int, steps: int, nodes: int, num_slots: int, device, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(bs*(S+1),) src/dst like accepted_kv_moves: rank 0 skipped (-1), ranks 1..S shifted down."""
    width = steps + 1
    blocks = num_slots // (nodes + 1)
    starts = torch.randperm(blocks, generator=generator)[:bs] * (nodes + 1)
    ranks = torch.arange(width)
    src = (starts[:, None] + torch.clamp(ranks + 1, max=nodes - 1)[None, :]).clone()
    dst = (starts[:, None] + ranks[None, :]).clone()
    moved = (ranks >= 1) & (ranks + 1 <= nodes - 1)
    src[:, ~moved] = -1
    dst[:, ~moved] = -1
    return src.reshape(-1).to(device), dst.reshape(-1).to(device)


def run(ctx: Context) -> list[Table]:
    from ..kv import move_kv as reference_move_kv

    device, backend, sizes = ctx.device, ctx.backend, SIZES[ctx.sizes]
    layers, heads, head_dim, slots = sizes["layers"], sizes["heads"], sizes["head_dim"], sizes["slots"]
    table = Table("kv", f"move_kv ({layers} layers x (K, V) x {heads} heads x {head_dim} bf16, {slots} slots) on backend {backend.name}",
                  COLUMNS, notes=[harness.DEVICE_TIME_NOTE, "The torch reference syncs the host (boolean masks): it and its "
                                  "torch.compile run eagerly, so 'vs ref' compares replay with eager."])
    caches = [torch.randn(slots, heads, head_dim, device=device).to(torch.bfloat16) for _ in range(2 * layers)]
    row_bytes = heads * head_dim * 2
    harness.allow_many_recompiles()
    compiled = harness.maybe_compile(reference_move_kv) if ctx.compile else None
    generator = torch.Generator().manual_seed(0)
    for steps, topk, nodes in sizes["configs"]:
        for bs in sizes["batches"]:
            ctx.progress(f"kv bs={bs} (S, K, N)=({steps}, {topk}, {nodes})")
            src, dst = build_moves(bs, steps, nodes, slots, device, generator)
            moves = int(((src >= 0) & (dst >= 0)).sum())
            nbytes = 2 * moves * row_bytes * len(caches)
            ours = harness.device_time_s(lambda: backend.move_kv(caches, src, dst), device, **ctx.timing)
            # Eager only: the reference syncs the host, and a failed capture attempt left the next
            # captures of this process invalidated (every later row then timed eagerly too).
            reference = harness.time_or_none(lambda: reference_move_kv(caches, src, dst), device, **ctx.timing)
            compiled_s = harness.time_or_none(None if compiled is None else (lambda: compiled(caches, src, dst)), device, **ctx.timing)
            table.add(bs=bs, config=f"{steps}, {topk}, {nodes}", moves=moves, mb_moved=nbytes / 1e6, time_us=us(ours),
                      share_of_copy=ctx.share_of_copy(nbytes, ours) if moves else 0.0, reference_us=us(reference),
                      compile_us=us(compiled_s), vs_reference=ratio(reference, ours), vs_compile=ratio(compiled_s, ours))
    return [table]
