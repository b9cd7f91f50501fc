"""Benchmark of vocabulary masks and ragged chains (docs/structured-output.md).

1. Masked vs unmasked verification at the same shapes: verify_greedy over logits,
   verify_sampling, verify_chain (logits), verify_chain_sampling (with draft probabilities and
   one-hot), verify_tree_sampling, draft_topk; every row constrained (a dense
   ``token_bitmask``, the worst case) and half the rows through ``bitmask_index`` (-1 for the
   rest); 70% of the ids allowed, and every candidate of a request in each of its rows (``_masks``).
   Goal (issue 14): masked costs at most 10% more than unmasked at bs >= 64. Also
   ``apply_token_bitmask_`` against a copy of the logits.
2. Ragged chains vs the same work padded: ``verify_chain_ragged`` over T + bs flat logit rows
   against ``verify_chain`` over bs * (S + 1) rows (what an engine without ragged support runs),
   and ``verify_chain_sampling_ragged`` (with draft probabilities, and without: n-gram drafts)
   against ``verify_chain_sampling`` on the padded batch (both run the same kernel; the ragged
   one reads the flat rows in place), with draft counts 0..S and a quarter of the requests with
   speculation off.
"""
from __future__ import annotations

import torch

from . import harness
from .examples import tree_verify_inputs
from .report import Column, Context, Table, ratio, us

SIZES = {
    "quick": dict(batches=(4,), trees=((8, 5),), vocabs=(1024,)),
    "full": dict(batches=(64, 256), trees=((8, 5), (4, 3)), vocabs=(151936, 32000)),
}
MASK_COLUMNS = [Column("op", "op"), Column("bs", "bs", "int"), Column("nodes", "N", "int"), Column("vocab", "V", "int"),
                Column("plain_us", "unmasked (us)", "us"), Column("masked_us", "every row masked (us)", "us"),
                Column("masked_ratio", "overhead", "ratio"), Column("half_us", "half the rows masked (us)", "us"),
                Column("half_ratio", "overhead", "ratio")]
RAGGED_COLUMNS = [Column("op", "ragged op (vs its padded op)"), Column("bs", "bs", "int"), Column("steps", "S", "int"),
                  Column("vocab", "V", "int"), Column("drafts", "drafts T", "int"), Column("padded_drafts", "padded bs*S", "int"),
                  Column("ragged_us", "ragged (us)", "us"), Column("padded_us", "padded (us)", "us"),
                  Column("ragged_ratio", "ragged / padded", "ratio")]


def _masks(rows, vocab, device, candidates=None):
    """A dense mask (rows, ceil(V/32)) with 70% of the tokens allowed, and an index that
    constrains every other row (-1 for the rest). ``candidates`` (bs, N) with rows = bs * N: each
    request's candidate tokens are allowed in every row of that request, as they are for drafts
    proposed under the grammar. Without that a masked draft is rejected, and the masked runs of the
    sampling walks verified other trees than the unmasked runs (about 40% fewer accepted drafts on
    the H200, thirty-seventh session), so the overhead column timed different work."""
    from ..masks import pack_bitmask

    # Drawn and packed on the device: at bs=256, N=8, V=151936 a host draw alone takes seconds.
    allowed = torch.rand(rows, vocab, generator=torch.Generator(device=device).manual_seed(rows), device=device) < 0.7
    if candidates is not None:
        per_row = candidates.repeat_interleave(candidates.shape[1], dim=0)  # row b * N + n: request b's candidates
        allowed.scatter_(1, per_row.clamp(0, vocab - 1), True)
    index = torch.arange(rows, dtype=torch.int32, device=device)
    index[1::2] = -1
    return pack_bitmask(allowed), index


def _masked_rows(ctx, table, sizes):
    device, backend = ctx.device, ctx.backend
    for vocab in sizes["vocabs"]:
        for bs in sizes["batches"]:
            for nodes, steps in sizes["trees"]:
                ctx.progress(f"masks bs={bs} N={nodes} V={vocab}")
                tree, candidates, logits = tree_verify_inputs(bs, nodes, steps, vocab, device, sampling=False)[:3]
                mask, index = _masks(bs * nodes, vocab, device, candidates)
                probs = torch.softmax(logits, dim=1).view(bs, nodes, vocab)
                generator = torch.Generator(device=device).manual_seed(1)
                coins = torch.rand(bs, nodes, device=device, generator=generator)
                final_coins = torch.rand(bs, device=device, generator=generator)
                # draft rows: the chain's (bs, N - 1, V) are the last N - 1 of the tree's (bs, N, V)
                draft_probs = torch.softmax(3 * torch.randn(bs, nodes, vocab, device=device, generator=generator), dim=2)
                drafts, chain_coins = candidates[:, 1:].contiguous(), coins[:, 1:].contiguous()
                cases = {
                    "verify_greedy(logits)": lambda **m: backend.verify_greedy(tree, candidates, logits, **m),
                    "verify_sampling": lambda **m: backend.verify_sampling(tree, candidates, probs, coins, final_coins, **m),
                    "verify_chain(logits)": lambda **m: backend.verify_chain(candidates, logits, **m),
                    "verify_chain_sampling": lambda **m: backend.verify_chain_sampling(drafts, draft_probs[:, 1:], probs, chain_coins,
                                                                                       final_coins, **m),
                    "verify_chain_sampling(draft_probs=None)": lambda **m: backend.verify_chain_sampling(drafts, None, probs, chain_coins,
                                                                                                         final_coins, **m),
                    "verify_tree_sampling": lambda **m: backend.verify_tree_sampling(tree, candidates, draft_probs, probs, coins,
                                                                                     final_coins, **m),
                    "draft_topk(k=4)": lambda **m: backend.draft_topk(logits, 4, **m),
                }
                for name, call in cases.items():
                    plain = harness.device_time_s(lambda: call(), device, **ctx.timing)
                    masked = harness.device_time_s(lambda: call(token_bitmask=mask), device, **ctx.timing)
                    half = harness.device_time_s(lambda: call(token_bitmask=mask, bitmask_index=index), device, **ctx.timing)
                    table.add(op=name, bs=bs, nodes=nodes, vocab=vocab, plain_us=us(plain), masked_us=us(masked),
                              masked_ratio=ratio(masked, plain), half_us=us(half), half_ratio=ratio(half, plain))
                scratch = logits.clone()
                copy = harness.device_time_s(lambda: scratch.copy_(logits), device, **ctx.timing)
                masked = harness.device_time_s(lambda: backend.apply_token_bitmask_(scratch, mask), device, **ctx.timing)
                half = harness.device_time_s(lambda: backend.apply_token_bitmask_(scratch, mask, bitmask_index=index), device, **ctx.timing)
                table.add(op="apply_token_bitmask_ (vs a logits copy)", bs=bs, nodes=nodes, vocab=vocab, plain_us=us(copy),
                          masked_us=us(masked), masked_ratio=ratio(masked, copy), half_us=us(half), half_ratio=ratio(half, copy))
                del logits, probs, scratch, draft_probs
                if device.type == "cuda":
                    torch.cuda.empty_cache()


def _probs(rows, vocab, device, generator):
    return torch.softmax(torch.randn(rows, vocab, device=device, generator=generator), dim=1)


def _ragged_cases(backend, bs, steps, vocab, device):
    """{op: (ragged call, padded call)} over one batch: draft counts 0..S, a quarter at 0; the
    padded calls get the bs * S drafts (bs * (S + 1) target rows) an engine would pad to."""
    generator = torch.Generator().manual_seed(bs + steps)
    counts = torch.randint(0, steps + 1, (bs,), generator=generator)
    counts[::4] = 0  # speculation switched off for a quarter of the requests
    total = int(counts.sum())
    on_device = torch.Generator(device=device).manual_seed(bs + steps)
    drafts = torch.randint(0, vocab, (total,), generator=generator).to(device)
    counts = counts.to(device)
    padded_drafts = torch.randint(0, vocab, (bs, steps), device=device, generator=on_device)
    candidates = torch.cat([torch.zeros(bs, 1, dtype=padded_drafts.dtype, device=device), padded_drafts], dim=1)
    flat = dict(logits=torch.randn(total + bs, vocab, device=device, generator=on_device), p=_probs(total + bs, vocab, device, on_device),
                q=_probs(total, vocab, device, on_device), coins=torch.rand(total, device=device, generator=on_device))
    padded = dict(logits=torch.randn(bs * (steps + 1), vocab, device=device, generator=on_device),
                  p=_probs(bs * (steps + 1), vocab, device, on_device).view(bs, steps + 1, vocab),
                  q=_probs(bs * steps, vocab, device, on_device).view(bs, steps, vocab),
                  coins=torch.rand(bs, steps, device=device, generator=on_device))
    final_coins = torch.rand(bs, device=device, generator=on_device)
    cases = {
        "verify_chain_ragged (logits)": (lambda: backend.verify_chain_ragged(drafts, counts, flat["logits"], max_drafts=steps),
                                         lambda: backend.verify_chain(candidates, padded["logits"])),
        "verify_chain_sampling_ragged": (
            lambda: backend.verify_chain_sampling_ragged(drafts, counts, flat["q"], flat["p"], flat["coins"], final_coins, max_drafts=steps),
            lambda: backend.verify_chain_sampling(padded_drafts, padded["q"], padded["p"], padded["coins"], final_coins)),
        "verify_chain_sampling_ragged (draft_probs=None)": (
            lambda: backend.verify_chain_sampling_ragged(drafts, counts, None, flat["p"], flat["coins"], final_coins, max_drafts=steps),
            lambda: backend.verify_chain_sampling(padded_drafts, None, padded["p"], padded["coins"], final_coins)),
    }
    return cases, total


def _ragged_rows(ctx, table, sizes):
    device, backend = ctx.device, ctx.backend
    for vocab in sizes["vocabs"]:
        for bs in sizes["batches"]:
            for steps in (3, 5):
                ctx.progress(f"ragged bs={bs} S={steps} V={vocab}")
                cases, total = _ragged_cases(backend, bs, steps, vocab, device)
                for name, (ragged_call, padded_call) in cases.items():
                    ragged = harness.device_time_s(ragged_call, device, **ctx.timing)
                    padded = harness.device_time_s(padded_call, device, **ctx.timing)
                    table.add(op=name, bs=bs, steps=steps, vocab=vocab, drafts=total, padded_drafts=bs * steps,
                              ragged_us=us(ragged), padded_us=us(padded), ragged_ratio=ratio(ragged, padded))
                del cases
                if device.type == "cuda":
                    torch.cuda.empty_cache()


def run(ctx: Context) -> list[Table]:
    sizes = SIZES[ctx.sizes]
    masks = Table("masks", f"masked vs unmasked verification and draft_topk on backend {ctx.backend.name}",
                  MASK_COLUMNS, notes=[harness.DEVICE_TIME_NOTE, "Goal: overhead <= 1.10x at bs >= 64."])
    ragged = Table("masks", f"ragged chains vs the same batch padded on backend {ctx.backend.name}", RAGGED_COLUMNS,
                   notes=[harness.DEVICE_TIME_NOTE])
    _masked_rows(ctx, masks, sizes)
    _ragged_rows(ctx, ragged, sizes)
    return [masks, ragged]
