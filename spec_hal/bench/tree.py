"""Benchmark of family ``tree``: expand_tree (a later step), build_tree, and one full draft step without the model forward
(expand_tree of the last step + organize_draft + build_tree), against the torch reference
(torch.compile of it with ``--compile-slow``).

The ops are latency-bound (a few KB per request), so the table reports time and speed-ups, not
bandwidth.
"""
from __future__ import annotations

import torch

from . import harness
from .report import Column, Context, Table, ratio, us

SIZES = {
    "quick": dict(configs=((5, 4, 8),), batches=(1, 16)),
    "full": dict(configs=((3, 1, 4), (5, 4, 8), (5, 8, 32)), batches=(1, 64, 256)),
}
COLUMNS = [Column("op", "op"), Column("bs", "bs", "int"), Column("steps", "S", "int"), Column("topk", "K", "int"), Column("nodes", "N", "int"),
           Column("time_us", "spec_hal (us)", "us"), Column("reference_us", "reference (us)", "us"),
           Column("compile_us", "torch.compile (us)", "us"), Column("vs_reference", "vs reference", "ratio"),
           Column("vs_compile", "vs compile", "ratio")]
COMPILE_NOTE = "torch.compile of the reference failed with an InductorError for K > 1 on the H100: measured only with --compile-slow."


def _inputs(bs, steps, topk, nodes, device):
    """build_tree inputs, the records of steps 0..S-2 and the last step's (scores, probs, ids)."""
    from ..conformance.tree_inputs import random_draft_tree, random_step_probs

    tree = random_draft_tree(bs, topk=topk, num_steps=steps, num_draft_tokens=nodes, seed=bs + nodes)
    generator = torch.Generator().manual_seed(bs)
    move = lambda t: t.to(device)  # noqa: E731
    build_args = tuple(map(move, (tree.roots, tree.parents, tree.selected, tree.draft_tokens, tree.seq_lens)))
    records = [type(r)(move(r.scores), move(r.tokens), move(r.parents)) for r in tree.records[:-1]]
    scores = move(random_step_probs(bs, topk, generator, "random"))
    probs = move(random_step_probs(bs * topk, topk, generator, "random"))
    ids = move(torch.randint(0, 32000, (bs * topk, topk), generator=generator))
    return build_args, records, (scores, probs, ids)


def _draft_finish(expand, organize, build, *, records, step_inputs, build_args, steps, topk, nodes):
    """expand_tree of step S-1, organize_draft over the S records, build_tree."""
    scores, probs, ids = step_inputs
    expansion = expand(steps - 1, scores, probs, ids)
    parents, selected, draft_tokens = organize([*records, expansion.record], nodes)
    return build(build_args[0], parents, selected, draft_tokens, build_args[4], topk=topk)


def run(ctx: Context) -> list[Table]:
    from ..tree import build_tree as reference_build_tree
    from ..tree import expand_tree as reference_expand_tree
    from ..tree import organize_draft as reference_organize_draft

    device, backend, sizes = ctx.device, ctx.backend, SIZES[ctx.sizes]
    compile_slow = ctx.compile and ctx.compile_slow
    table = Table("tree", f"build_tree and one draft step (expand + organize + build) on backend {backend.name}", COLUMNS, notes=[
        harness.DEVICE_TIME_NOTE, f"build_tree: {backend.provider('build_tree').description}; "
        f"expand_tree: {backend.provider('expand_tree').description}", *([] if compile_slow else [COMPILE_NOTE])])

    def reference_finish(**kw):
        return _draft_finish(reference_expand_tree, reference_organize_draft, reference_build_tree, **kw)

    compiled_build = harness.maybe_compile(reference_build_tree) if compile_slow else None
    compiled_finish = harness.maybe_compile(reference_finish) if compile_slow else None
    for steps, topk, nodes in sizes["configs"]:
        for bs in sizes["batches"]:
            ctx.progress(f"tree bs={bs} (S, K, N)=({steps}, {topk}, {nodes})")
            build_args, records, step_inputs = _inputs(bs, steps, topk, nodes, device)
            finish = dict(records=records, step_inputs=step_inputs, build_args=build_args, steps=steps, topk=topk, nodes=nodes)
            scores, probs, ids = step_inputs
            cases = {
                "expand_tree": (lambda: backend.expand_tree(steps - 1, scores, probs, ids),
                                lambda: reference_expand_tree(steps - 1, scores, probs, ids), None),
                "build_tree": (lambda: backend.build_tree(*build_args, topk=topk), lambda: reference_build_tree(*build_args, topk=topk),
                               None if compiled_build is None else (lambda: compiled_build(*build_args, topk=topk))),
                "draft step": (lambda: _draft_finish(backend.expand_tree, backend.organize_draft, backend.build_tree, **finish),
                               lambda: reference_finish(**finish),
                               None if compiled_finish is None else (lambda: compiled_finish(**finish))),
            }
            for name, (ours, reference, compiled) in cases.items():
                ours_s = harness.device_time_s(ours, device, **ctx.timing)
                reference_s = harness.device_time_s(reference, device, **ctx.timing)
                compiled_s = harness.device_time_s(compiled, device, **ctx.timing)
                table.add(op=name, bs=bs, steps=steps, topk=topk, nodes=nodes, time_us=us(ours_s), reference_us=us(reference_s),
                          compile_us=us(compiled_s), vs_reference=ratio(reference_s, ours_s), vs_compile=ratio(compiled_s, ours_s))
    return [table]
