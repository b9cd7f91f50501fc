"""Benchmark of family verify: verify_greedy over target logits (fused argmax) and
verify_sampling, against the torch reference (and torch.compile of it with ``--compile-slow``).

Bytes counted: verify_greedy reads the bs*N*V logits once (everything else is < 0.1%);
verify_sampling reads one target row per request for the final token (plus N gathered
probabilities per level), so its bandwidth is that row traffic. The goal of issue 4 is verify
over logits >= 70% of the measured copy bandwidth at bs >= 64.
"""
from __future__ import annotations

import torch

from . import harness
from .examples import tree_verify_inputs
from .report import Column, Context, Table, ratio, us

SIZES = {
    "quick": dict(batches=(1, 4), trees=((4, 3), (8, 5)), vocabs=(1024,)),
    # (N, S): chain K = 1, K = 4, K = 8
    "full": dict(batches=(1, 64, 256), trees=((4, 3), (8, 5), (32, 5)), vocabs=(32000, 128256)),
}
MEMORY_LIMIT = 40e9
COLUMNS = [Column("op", "op"), Column("bs", "bs", "int"), Column("nodes", "N", "int"), Column("vocab", "V", "int"),
           Column("time_us", "time (us)", "us"), Column("gbs", "GB/s", "gbs"), Column("share_of_copy", "% copy BW", "share"),
           Column("reference_us", "torch ref (us)", "us"), Column("vs_reference", "speed-up", "ratio"),
           Column("compile_us", "torch.compile (us)", "us"), Column("vs_compile", "speed-up vs compile", "ratio")]
COMPILE_NOTE = ("torch.compile of the reference unrolls its S * N walk steps and compiles each shape anew (20-46 s per "
                "shape on the H100): measured only with --compile-slow.")


def _measure(ctx, table, name, ours, reference, compiled, *, bs, nodes, vocab, nbytes):
    seconds = harness.device_time_s(ours, ctx.device, **ctx.timing)
    reference_s = harness.device_time_s(reference, ctx.device, **ctx.timing)
    compiled_s = harness.device_time_s(compiled, ctx.device, **ctx.timing)
    table.add(op=name, bs=bs, nodes=nodes, vocab=vocab, time_us=us(seconds), gbs=nbytes / seconds / 1e9,
              share_of_copy=ctx.share_of_copy(nbytes, seconds), reference_us=us(reference_s), vs_reference=ratio(reference_s, seconds),
              compile_us=us(compiled_s), vs_compile=ratio(compiled_s, seconds))


def run(ctx: Context) -> list[Table]:
    from .. import verify as reference

    device, backend, sizes = ctx.device, ctx.backend, SIZES[ctx.sizes]
    compile_slow = ctx.compile and ctx.compile_slow
    table = Table("verify", f"verify_greedy (fused argmax over logits) and verify_sampling on backend {backend.name}", COLUMNS,
                  notes=[harness.DEVICE_TIME_NOTE, "The torch reference syncs the host (tree walk) and is timed eagerly.",
                         *([] if compile_slow else [COMPILE_NOTE])])
    harness.allow_many_recompiles()
    compiled_greedy = harness.maybe_compile(reference.verify_greedy) if compile_slow else None
    compiled_sampling = harness.maybe_compile(reference.verify_sampling) if compile_slow else None
    for vocab in sizes["vocabs"]:
        for bs in sizes["batches"]:
            for nodes, steps in sizes["trees"]:
                if 3 * bs * nodes * vocab * 4 > MEMORY_LIMIT:  # logits + probs + reference temporaries
                    continue
                ctx.progress(f"verify bs={bs} N={nodes} V={vocab}")
                tree, candidates, logits = tree_verify_inputs(bs, nodes, steps, vocab, device, sampling=False)[:3]
                _measure(ctx, table, "verify_greedy(logits)", lambda: backend.verify_greedy(tree, candidates, logits),
                         lambda: reference.verify_greedy(tree, candidates, logits),
                         None if compiled_greedy is None else (lambda: compiled_greedy(tree, candidates, logits)),
                         bs=bs, nodes=nodes, vocab=vocab, nbytes=logits.numel() * logits.element_size())
                probs = torch.softmax(logits, dim=1).view(bs, nodes, vocab)
                del logits
                generator = torch.Generator(device=device).manual_seed(1)
                coins = torch.rand(bs, nodes, device=device, generator=generator)
                final_coins = torch.rand(bs, device=device, generator=generator)
                args = (tree, candidates, probs, coins, final_coins)
                _measure(ctx, table, "verify_sampling", lambda: backend.verify_sampling(*args), lambda: reference.verify_sampling(*args),
                         None if compiled_sampling is None else (lambda: compiled_sampling(*args)),
                         bs=bs, nodes=nodes, vocab=vocab, nbytes=bs * (vocab + steps * nodes) * 4)
                del probs, args
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return [table]
