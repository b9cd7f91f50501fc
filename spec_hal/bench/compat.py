"""Benchmark of the drop-in entry points (``spec_hal.compat``) against the native op each wraps.

Per function and size: device time of the compat call and of the native call on the same inputs
(graph replay where both capture, else eager medians), the overhead in microseconds and percent,
and whether it is within the budget of issue 18 (at most 10% or 5 us over the native op,
whichever is larger). The compat call includes what the wrapper adds (argument checks under the
upstream names, buffer views, the copy into the caller's buffers, coins drawn from the generator
where the upstream function draws its own, the device copy of a new count pattern). Functions that
wrap no native op (top-k/top-p renormalisation and softmax, compat-owned PyTorch; the filtered
samplers, whose filters are) are timed beside the native op doing comparable work, without a
budget verdict. sgl_kernel's renormalisation and sampler names are the same functions as
flashinfer's (one row each).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from . import harness
from .examples import draft_tree_records, tree_verify_inputs
from .report import Column, Context, Table, us

SIZES = {
    "quick": dict(batches=(1, 4), trees=((4, 3), (8, 4)), vocabs=(1024,)),
    # (N, S): chain K = 1 and an EAGLE tree.
    "full": dict(batches=(1, 64, 256), trees=((4, 3), (8, 5)), vocabs=(32000, 128256)),
}
MEMORY_LIMIT = 40e9
BUDGET_US, BUDGET_SHARE = 5.0, 0.10
COLUMNS = [Column("function", "compat function"), Column("native", "native op"), Column("bs", "bs", "int"), Column("nodes", "N", "int"),
           Column("vocab", "V", "int"), Column("compat_us", "compat (us)", "us"), Column("native_us", "native (us)", "us"),
           Column("overhead_us", "overhead (us)", "us"), Column("overhead_share", "overhead", "share"), Column("within_budget", "within budget"),
           Column("timing", "timed (compat/native)")]


def _time(fn, device, timing):
    """(seconds, "replay" or "eager"): graph replay where ``fn`` captures, else the eager median.
    10 calls per graph, median of 5 trials: the suite times about 300 calls and stays near a minute."""
    replay = harness.graph_replay_time_s(fn, device, calls=10, trials=5)
    if replay is not None:
        return replay, "replay"
    return harness.time_or_none(fn, device, **timing), "eager"


def _add(table, function, native, compat, native_timing, *, wraps: bool = True, **size):
    """One row; ``wraps=False``: the native op does comparable work but is not what the function
    calls (the renormalisations, docs/compat.md), so no budget verdict; ``compat`` None: a row of
    the native op alone (for comparison with the row above)."""
    (compat_s, compat_mode), (native_s, native_mode) = compat or (None, "-"), native_timing or (None, None)
    overhead = None if compat_s is None or native_s is None else compat_s - native_s
    within = None if overhead is None else ("yes" if overhead * 1e6 <= max(BUDGET_US, BUDGET_SHARE * native_s * 1e6) else "NO")
    within = within if wraps else "n/a (not a wrapper)"
    within = "-" if compat is None else within
    table.add(function=function, native=native, compat_us=us(compat_s), native_us=us(native_s), overhead_us=us(overhead),
              overhead_share=None if overhead is None or not native_s else overhead / native_s, within_budget=within,
              timing=compat_mode if native_mode is None else f"{compat_mode}/{native_mode}", **size)


def _verify_rows(ctx, table, bs, nodes, steps, vocab):
    from ..compat import sgl_kernel
    from ..verify import verdict_into

    device, backend, timing = ctx.device, ctx.backend, ctx.timing
    tree, candidates, _, target_predict, target_probs, coins, final_coins = tree_verify_inputs(bs, nodes, steps, vocab, device)
    predicts = torch.empty(bs * nodes, dtype=torch.int32, device=device)
    accept_index = torch.empty(bs, steps + 1, dtype=torch.int32, device=device)
    accept_token_num = torch.empty(bs, dtype=torch.int32, device=device)
    verdict = verdict_into(predicts, accept_index, accept_token_num)
    links = (tree.retrieve_index, tree.retrieve_next_token, tree.retrieve_next_sibling)
    size = dict(bs=bs, nodes=nodes, vocab=vocab)
    _add(table, "sgl_kernel.verify_tree_greedy", "verify_greedy",
         _time(lambda: sgl_kernel.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, *links, target_predict), device, timing),
         _time(lambda: backend.verify_greedy(tree, candidates, target_predict, out=verdict), device, timing), **size)
    _add(table, "sgl_kernel.tree_speculative_sampling_target_only", "verify_sampling",
         _time(lambda: sgl_kernel.tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, *links, coins,
                                                                         final_coins, target_probs), device, timing),
         _time(lambda: backend.verify_sampling(tree, candidates, target_probs, coins, final_coins, out=verdict), device, timing), **size)


def _build_tree_rows(ctx, table, bs, topk, steps, nodes):
    from ..compat import sgl_kernel

    device, backend, timing = ctx.device, ctx.backend, ctx.timing
    parents, selected, draft_tokens = (t.to(device) for t in draft_tree_records(bs, topk, steps, nodes, seed=bs))
    seq_lens = torch.full((bs,), 100, dtype=torch.int64, device=device)
    outputs = dict(tree_mask=torch.empty(bs * nodes * nodes, dtype=torch.bool, device=device),
                   positions=torch.empty(bs * nodes, dtype=torch.int64, device=device),
                   retrive_index=torch.empty(bs, nodes, dtype=torch.int64, device=device),
                   retrive_next_token=torch.empty(bs, nodes, dtype=torch.int64, device=device),
                   retrive_next_sibling=torch.empty(bs, nodes, dtype=torch.int64, device=device))
    _add(table, "sgl_kernel.build_tree_kernel_efficient (QLEN_ONLY)", "build_tree",
         _time(lambda: sgl_kernel.build_tree_kernel_efficient(parents, selected, seq_lens, topk=topk, depth=steps, draft_token_num=nodes,
                                                              tree_mask_mode=1, **outputs), device, timing),
         _time(lambda: backend.build_tree(seq_lens, parents, selected, draft_tokens, seq_lens, topk=topk), device, timing),
         bs=bs, nodes=nodes, vocab=None)


def _chain_inputs(bs, steps, vocab, device):
    generator = torch.Generator(device=device).manual_seed(1)
    draft_probs = torch.softmax(torch.randn(bs, steps, vocab, device=device, generator=generator), dim=-1)
    target_probs = torch.softmax(torch.randn(bs, steps + 1, vocab, device=device, generator=generator), dim=-1)
    draft_ids = torch.randint(0, vocab, (bs, steps), device=device, generator=generator)
    coins = torch.rand(bs, steps, device=device, generator=generator)
    final_coins = torch.rand(bs, device=device, generator=generator)
    return draft_probs, target_probs, draft_ids, coins, final_coins


def _vllm_rows(ctx, table, bs, steps, vocab, chain, *, ragged: bool):
    """vllm.rejection_sample on flat requests (every request at S drafts, or S and S/2
    alternating), random and greedy, beside the native ragged op it calls on the same inputs in
    vLLM's layout (``bonus_tokens=``: T target rows and the bonus tokens) with the coins given."""
    from ..compat import vllm

    device, backend, timing = ctx.device, ctx.backend, ctx.timing
    draft_probs, target_probs, draft_ids, coins, final_coins = chain
    counts = [steps if b % 2 == 0 or not ragged else max(steps // 2, 1) for b in range(bs)]
    counts_t = torch.tensor(counts, device=device)
    has_draft = torch.arange(steps, device=device)[None, :] < counts_t[:, None]
    flat_ids, flat_draft, flat_coins, flat_target = draft_ids[has_draft], draft_probs[has_draft], coins[has_draft], target_probs[:, :steps][has_draft]
    cu = counts_t.cumsum(0).to(torch.int32)
    bonus = torch.zeros(bs, 1, dtype=torch.int32, device=device)  # vLLM's sampler emits int32 ids
    size = dict(bs=bs, nodes=steps + 1, vocab=vocab)
    shape = "ragged counts S, S/2" if ragged else f"{steps} drafts each"
    random = SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(bs, device=device), generators={})
    state = torch.tensor([1, 0], device=device)
    _add(table, f"vllm.rejection_sample (all random, {shape})", "verify_chain_sampling_ragged (vLLM layout, rng_state=)",
         _time(lambda: vllm.rejection_sample(flat_ids, counts, steps, cu, flat_draft, flat_target, bonus, random), device, timing),
         _time(lambda: backend.verify_chain_sampling_ragged(flat_ids, counts_t, flat_draft, flat_target, None, None, max_drafts=steps,
                                                            bonus_tokens=bonus.view(bs), rng_state=state), device, timing), **size)
    _add(table, f"  (the native op given coins, {shape})", "verify_chain_sampling_ragged (vLLM layout, coins given)",
         None, _time(lambda: backend.verify_chain_sampling_ragged(flat_ids, counts_t, flat_draft, flat_target, flat_coins, final_coins,
                                                                          max_drafts=steps, bonus_tokens=bonus.view(bs)), device, timing),
         **size)
    logits = flat_target.log()
    greedy = SimpleNamespace(all_greedy=True, all_random=False, temperature=torch.zeros(bs, device=device), generators={})
    _add(table, f"vllm.rejection_sample (all greedy, {shape})", "verify_chain_ragged (logits, vLLM layout)",
         _time(lambda: vllm.rejection_sample(flat_ids, counts, steps, cu, None, logits, bonus, greedy), device, timing),
         _time(lambda: backend.verify_chain_ragged(flat_ids, counts_t, logits, max_drafts=steps, bonus_tokens=bonus.view(bs)), device, timing),
         **size)


def _chain_rows(ctx, table, bs, steps, vocab):
    from ..compat import flashinfer

    device, backend, timing = ctx.device, ctx.backend, ctx.timing
    chain = _chain_inputs(bs, steps, vocab, device)
    draft_probs, target_probs, draft_ids, coins, final_coins = chain
    passed = torch.empty(bs, dtype=torch.int32, device=device)
    _add(table, "flashinfer.chain_speculative_sampling", "verify_chain_sampling (passed_counts=)",
         _time(lambda: flashinfer.chain_speculative_sampling(draft_probs, draft_ids, target_probs), device, timing),
         _time(lambda: backend.verify_chain_sampling(draft_ids, draft_probs, target_probs, coins, final_coins, passed_counts=passed), device,
               timing), bs=bs, nodes=steps + 1, vocab=vocab)
    _vllm_rows(ctx, table, bs, steps, vocab, chain, ragged=False)
    if steps > 1:
        _vllm_rows(ctx, table, bs, steps, vocab, chain, ragged=True)


def _processing_rows(ctx, table, bs, vocab):
    """Sampling from probability rows (native: verify_chain_sampling without drafts), and the
    renormalisations and softmax beside process_logits doing the same processing on the logs
    (not what they call: docs/compat.md says why)."""
    from ..compat import flashinfer

    device, backend, timing = ctx.device, ctx.backend, ctx.timing
    generator = torch.Generator(device=device).manual_seed(2)
    logits = torch.randn(bs, vocab, device=device, generator=generator)
    rows = torch.softmax(logits, dim=-1)
    log_rows = rows.log()
    final_coins = torch.rand(bs, device=device, generator=generator)
    no_drafts, no_coins = torch.empty(bs, 0, dtype=torch.int64, device=device), torch.empty(bs, 0, device=device)
    size = dict(bs=bs, nodes=1, vocab=vocab)
    native_sample = _time(lambda: backend.verify_chain_sampling(no_drafts, rows[:, None][:, :0], rows[:, None], no_coins, final_coins),
                          device, timing)
    _add(table, "flashinfer.sampling_from_probs", "verify_chain_sampling (no drafts)",
         _time(lambda: flashinfer.sampling_from_probs(rows), device, timing), native_sample, **size)
    # Compat-owned filters (or softmax), then the native sample: the overhead is that PyTorch (no budget).
    for name, call in (("flashinfer.top_k_sampling_from_probs (k=50)", lambda: flashinfer.top_k_sampling_from_probs(rows, 50)),
                       ("flashinfer.top_p_sampling_from_probs (p=0.9)", lambda: flashinfer.top_p_sampling_from_probs(rows, 0.9)),
                       ("flashinfer.top_k_top_p_sampling_from_probs (k=50, p=0.9)",
                        lambda: flashinfer.top_k_top_p_sampling_from_probs(rows, 50, 0.9)),
                       ("flashinfer.min_p_sampling_from_probs (0.1)", lambda: flashinfer.min_p_sampling_from_probs(rows, 0.1)),
                       ("flashinfer.sampling_from_logits", lambda: flashinfer.sampling_from_logits(logits))):
        _add(table, name, "verify_chain_sampling (no drafts) after compat PyTorch", _time(call, device, timing), native_sample,
             wraps=False, **size)
    for name, call, native_name, native in (
            ("flashinfer.top_k_renorm_probs (k=50)", lambda: flashinfer.top_k_renorm_probs(rows, 50),
             "process_logits(log p, top_k=50)", lambda: backend.process_logits(log_rows, temperature=1.0, top_k=50)),
            ("flashinfer.top_p_renorm_probs (p=0.9)", lambda: flashinfer.top_p_renorm_probs(rows, 0.9),
             "process_logits(log p, top_p=0.9)", lambda: backend.process_logits(log_rows, temperature=1.0, top_p=0.9)),
            ("flashinfer.softmax (temperature=0.7)", lambda: flashinfer.softmax(logits, temperature=0.7),
             "process_logits(temperature=0.7)", lambda: backend.process_logits(logits, temperature=0.7))):
        _add(table, name, native_name, _time(call, device, timing), _time(native, device, timing), wraps=False, **size)


def _mamba_rows(ctx, table, bs):
    """sgl_kernel.fused_mamba_state_scatter_with_mask beside scatter_mamba_state (SGLang-sized
    states: 4 layers, 8 x 64 x 128 float32 per slot)."""
    from ..compat import sgl_kernel

    device, backend, timing = ctx.device, ctx.backend, ctx.timing
    steps = 4
    dst = torch.zeros(4, bs + 1, 8, 64, 128, device=device)
    src = torch.randn(4, bs, steps, 8, 64, 128, device=device)
    slots = torch.randperm(bs, device=device) + 1
    step = torch.randint(0, steps, (bs,), device=device)
    _add(table, "sgl_kernel.fused_mamba_state_scatter_with_mask", "scatter_mamba_state",
         _time(lambda: sgl_kernel.fused_mamba_state_scatter_with_mask(dst, src, slots, step), device, timing),
         _time(lambda: backend.scatter_mamba_state(dst=dst, src=src, dst_slots=slots, src_steps=step), device, timing),
         bs=bs, nodes=steps, vocab=None)


def run(ctx: Context) -> list[Table]:
    sizes = SIZES[ctx.sizes]
    table = Table("compat", f"spec_hal.compat drop-ins vs the native op each wraps, backend {ctx.backend.name}", COLUMNS, notes=[
        harness.DEVICE_TIME_NOTE + " The last column says which each row got; a replay/eager pair is not a like-for-like overhead.",
        f"Budget (issue 18): overhead <= max({BUDGET_US:.0f} us, {100 * BUDGET_SHARE:.0f}% of the native op).",
        "flashinfer.* and vllm.* draw their coins with torch.rand (as the upstream functions draw their own); the native "
        "call is given coins, so that draw is part of the overhead. chain_speculative_sampling's accepted count (drafts "
        "passing on their own) is written by the native kernel (verify_chain_sampling's passed_counts).",
        "vllm.rejection_sample is timed beside the native ragged op it calls, on the same flat inputs in vLLM's layout "
        "(bonus_tokens=: T target rows and the bonus tokens); random requests draw their coins inside the op "
        "(rng_state=), and the row below each shows the op given coins instead (what the stream adds).",
        "Rows marked 'n/a (not a wrapper)': the renormalisations and softmax are compat-owned PyTorch (process_logits "
        "quantises, docs/compat.md), timed beside process_logits doing the same processing; the filtered samplers run "
        "compat-owned filters before the native sample.",
        "Upstream kernels (sgl-kernel, FlashInfer, vLLM) are not run by this suite; see scripts in the issue 18 notes."])
    for vocab in sizes["vocabs"]:
        for bs in sizes["batches"]:
            for nodes, steps in sizes["trees"]:
                if 4 * bs * nodes * vocab * 4 > MEMORY_LIMIT:
                    continue
                ctx.progress(f"compat bs={bs} N={nodes} V={vocab}")
                _verify_rows(ctx, table, bs, nodes, steps, vocab)
                _chain_rows(ctx, table, bs, steps, vocab)
            if bs * vocab * 4 * 8 <= MEMORY_LIMIT:
                _processing_rows(ctx, table, bs, vocab)
    for bs in sizes["batches"]:
        for nodes, steps in sizes["trees"]:
            topk = 1 if nodes == steps + 1 else 2
            if 1 + topk + (steps - 1) * topk * topk >= nodes:
                _build_tree_rows(ctx, table, bs, topk, steps, nodes)
        _mamba_rows(ctx, table, bs)
    return [table]
