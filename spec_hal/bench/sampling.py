"""Benchmark of family sampling: verify_sampling_from_logits (tree) against the unfused torch path
it replaces, and against reading the logits once at the copy bandwidth measured in the same run.

Unfused path (what an engine runs without this op): bf16 logits to float32, divide by the
per-request temperature, softmax, top-k renormalisation (torch.topk threshold), top-p
renormalisation (sort + cumsum), then today's ``verify_sampling`` on the backend with coins from
torch.rand. Fused path: one ``verify_sampling_from_logits`` call with seed/offset tensors and the
route hint ``max_top_k`` (an engine knows the largest top-k it set), the op as shipped (the Triton
provider processes every row split along the vocabulary and then walks up to 0.6 rows per SM when
the hint says every top-k is listed, 2 otherwise, and beyond that runs the fused walk over the
rows each request's path visits); "fused, no hint" is the same call without ``max_top_k``.
Parameters: temperature 0.8, top_k 50, top_p 0.95 for every request (both masks always run); the
"temperature only" column times the fused call with the masks off (top_k 0, top_p 1), which skips
the threshold passes.

Memory: the unfused path holds about 8 float32 copies of the logits; shapes whose estimate
exceeds 60% of the free device memory (after releasing the caching allocator's blocks) are
skipped, and every shape's tensors are released before the next.

"read once" is the bf16 logits' bytes divided by the measured copy bandwidth: the floor of one
pass over the logits. The goal of issue 13: fused >= 3x faster than unfused at every size, and
fused <= 1.3x "read once" at bs >= 64.
"""
from __future__ import annotations

import gc

import torch

from . import harness
from .report import Column, Context, Table, ratio, us

SIZES = {
    "quick": dict(batches=(1, 4), trees=((4, 3),), vocabs=(1024,)),
    "full": dict(batches=(1, 8, 64, 256), trees=((4, 3), (8, 4), (16, 5)), vocabs=(32000, 128256, 151936)),
}
MEMORY_LIMIT = 60e9
TEMPERATURE, TOP_K, TOP_P = 0.8, 50, 0.95
COLUMNS = [Column("bs", "bs", "int"), Column("nodes", "N", "int"), Column("vocab", "V", "int"),
           Column("fused_us", "fused (us)", "us"), Column("unhinted_us", "fused, no hint (us)", "us"),
           Column("unfused_us", "torch processing + verify_sampling (us)", "us"),
           Column("speedup", "speed-up", "ratio"), Column("plain_us", "fused, temperature only (us)", "us"), Column("read_once_us", "read logits once (us)", "us"),
           Column("vs_read_once", "fused / read once", "ratio")]


def _inputs(bs: int, nodes: int, steps: int, vocab: int, device):
    from ..conformance.trees import random_tree, tree_to

    tree, candidates = random_tree(bs, nodes, steps, seed=bs + nodes, vocab=vocab)
    generator = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(bs * nodes, vocab, device=device, generator=generator) * 3
    first_child = candidates.gather(1, tree.retrieve_next_token.clamp(min=0)).reshape(-1).to(device)
    rows = torch.arange(0, bs * nodes, 2, device=device)
    logits[rows, first_child[rows]] = 25.0  # half the nodes predict their first child: real acceptance
    return tree_to(tree, device), candidates.to(device), logits.to(torch.bfloat16)


def unfused_probs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The torch processing an engine runs before today's verify (TOP_K for every row)."""
    probs = torch.softmax(logits.float() / temperature[:, None], dim=1)
    kth = torch.topk(probs, TOP_K, dim=1).values[:, -1:]
    probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    probs = probs / probs.sum(dim=1, keepdim=True)
    sorted_probs, order = probs.sort(dim=1, descending=True)
    before = sorted_probs.cumsum(dim=1) - sorted_probs
    sorted_probs = torch.where(before < top_p[:, None], sorted_probs, torch.zeros_like(sorted_probs))
    probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    return probs / probs.sum(dim=1, keepdim=True)


def _release(device) -> None:
    """Free what earlier shapes and suites left cached (graphs, their pools, temporaries): the
    suite once ran out of memory on the H100 with 78 GiB reserved and 36 MiB allocated."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _memory_limit(device) -> float:
    if device.type != "cuda":
        return MEMORY_LIMIT
    free, _ = torch.cuda.mem_get_info(device)
    return min(MEMORY_LIMIT, 0.6 * free)


def run(ctx: Context) -> list[Table]:
    device, backend, sizes = ctx.device, ctx.backend, SIZES[ctx.sizes]
    table = Table("sampling", f"verify_sampling_from_logits vs torch processing + verify_sampling on backend {backend.name}", COLUMNS,
                  notes=[harness.DEVICE_TIME_NOTE,
                         f"bf16 logits; temperature {TEMPERATURE}, top_k {TOP_K}, top_p {TOP_P} for every request; fused: with max_top_k={TOP_K}."])
    for vocab in sizes["vocabs"]:
        for bs in sizes["batches"]:
            for nodes, steps in sizes["trees"]:
                _release(device)
                if 8 * bs * nodes * vocab * 4 > _memory_limit(device):  # logits + float32 temporaries of the torch sort
                    ctx.progress(f"sampling bs={bs} N={nodes} V={vocab}: skipped (memory)")
                    continue
                ctx.progress(f"sampling bs={bs} N={nodes} V={vocab}")
                tree, candidates, logits = _inputs(bs, nodes, steps, vocab, device)
                temperature = torch.full((bs,), TEMPERATURE, device=device)
                top_k = torch.full((bs,), TOP_K, dtype=torch.int64, device=device)
                top_p = torch.full((bs,), TOP_P, device=device)
                seed = torch.arange(bs, dtype=torch.int64, device=device)
                offset = torch.zeros(bs, dtype=torch.int64, device=device)
                generator = torch.Generator(device=device).manual_seed(1)
                coins = torch.rand(bs, nodes, device=device, generator=generator)
                final_coins = torch.rand(bs, device=device, generator=generator)
                row_temperature, row_top_p = temperature.repeat_interleave(nodes), top_p.repeat_interleave(nodes)

                def fused(max_top_k=TOP_K):
                    return backend.verify_sampling_from_logits(tree, candidates, logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                                               seed=seed, offset=offset, max_top_k=max_top_k)

                def unhinted():
                    return fused(max_top_k=None)

                def plain():
                    return backend.verify_sampling_from_logits(tree, candidates, logits, temperature=temperature, seed=seed, offset=offset)

                def unfused():
                    probs = unfused_probs(logits, row_temperature, row_top_p)
                    return backend.verify_sampling(tree, candidates, probs, coins, final_coins)

                fused_s = harness.device_time_s(fused, device, **ctx.timing)
                unhinted_s = harness.device_time_s(unhinted, device, **ctx.timing)
                plain_s = harness.device_time_s(plain, device, **ctx.timing)
                unfused_s = harness.device_time_s(unfused, device, **ctx.timing)
                nbytes = logits.numel() * logits.element_size()
                read_s = nbytes / ctx.copy_bandwidth if ctx.copy_bandwidth else None
                table.add(bs=bs, nodes=nodes, vocab=vocab, fused_us=us(fused_s), unhinted_us=us(unhinted_s), unfused_us=us(unfused_s),
                          speedup=ratio(unfused_s, fused_s), plain_us=us(plain_s), read_once_us=us(read_s),
                          vs_read_once=ratio(fused_s, read_s))
                del tree, candidates, logits, fused, unhinted, plain, unfused
    _release(device)
    return [table]
