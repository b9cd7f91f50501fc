"""Family ``ragged``: chain verification over ragged batches (a different number of drafts per
request, 0 allowed), in vLLM's flat layout.

Layout. ``num_draft_tokens`` (bs,) int32/int64 holds ``c_b`` (0 <= c_b <= ``max_drafts``, the
static S of the padded verdict). ``draft_tokens`` (T,) holds the drafts of every request back to
back, ``T = sum c_b``: request b's drafts are ``draft_tokens[d_b : d_b + c_b]`` with ``d_b = c_0 +
... + c_{b-1}``. The target was run on ``T + bs`` flat rows: request b owns rows ``r_b .. r_b +
c_b`` with ``r_b = d_b + b`` (its root, then one row per draft); row ``r_b + j`` predicts the token
after draft j. ``draft_probs`` (T, V) and ``coins`` (T,) are aligned with ``draft_tokens``;
``target_probs`` / target logits / ``bitmask_index`` with the ``T + bs`` target rows.

Result. A :class:`~spec_hal.types.Verdict` in the padded chain layout of ``N = max_drafts + 1``
nodes per request (node ``b * N + j`` is request b's j-th chain position), exactly what
``verify_chain_sampling`` returns for the same chain padded with -1 drafts: so ``bonus_tokens``,
``compact_accepted``, ``accepted_kv_moves`` and ``mamba_commit_steps`` take it unchanged. A
request with ``c_b = 0`` accepts nothing (num_correct 0, accept_lens 1), emits its bonus token,
and ``mamba_commit_steps`` commits step 0: the recurrent state of one plain decoding step.

Semantics per request are those of ``verify_chain`` (greedy: the longest prefix of drafts equal to
the target's token, masked argmax with ``token_bitmask``) and ``verify_chain_sampling`` (rejection
sampling with q, or one-hot q when ``draft_probs`` is None) over its ``c_b`` drafts: identical to
the padded ops on the padded chain, and bit-identical on every backend.

Draft-aligned layout (vLLM's), selected by passing ``bonus_tokens`` (bs,): the target was run
on the T draft positions only: row ``d_b + j`` is the target at request b's draft j (the token
its draft j is tested against), and the token after a fully accepted chain is the caller's
``bonus_tokens[b]`` (sampled by the engine from the row after the last draft), so no bonus rows
sit between the requests. ``target_predict`` / ``target_probs`` / ``bitmask_index`` then have T
rows; the verdict is the one the bonus-row layout gives with request b's bonus row predicting
``bonus_tokens[b]``: with its padding at -1, ``verdict.predict.view(bs, S + 1)`` is vLLM's
rejection-sampler output as it stands. The bonus tokens are emitted as given (not checked
against V: they are the engine's own samples).

Coins of ``verify_chain_sampling_ragged``: the caller's ``coins`` (T,) and ``final_coins`` (bs,),
or, with ``rng_state`` (2,) int64 ``[seed, counter]`` and both left None, a counter-based stream
drawn on the device (graph-safe; on the Triton backends a one-program launch before the op's kernel,
which also advances the counter): flat draft i's coin is
``hash(seed, counter, i, ACCEPT)`` and request b's final coin ``hash(seed, counter, b, FINAL)``
(``spec_hal.sampling.hash_coins``: the keying of the from-logits ops' seeded coins), and the op
then adds 1 to ``rng_state[1]`` in place, so every call (and every CUDA-graph replay) draws fresh
coins and the same state gives the same coins on every backend.

Bad input: counts of the wrong shape or dtype, flat tensors whose lengths disagree
(``target`` rows != T + bs, or T with ``bonus_tokens``) are rejected from shapes; counts that are negative, exceed
``max_drafts`` or do not sum to T are value errors, checked only in checked mode
(``SPEC_HAL_CHECKS=1``, a sync); without it they give a defined verdict (counts clamped to
[0, max_drafts], rows past the flat end read as padding: in the draft-aligned layout a request's
chain ends at the flat end, its bonus token following the drafts that fit) and never an
out-of-bounds access.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import checks
from .masks import check_bitmask
from .sampling import PURPOSE_ACCEPT, PURPOSE_FINAL, hash_coins
from .registry import register_op
from .types import Verdict
from .masks import token_allowed
from .verify import (MAX_TREE_STEPS, _check_probs, _check_target_predict, _check_verdict_out, _verdict, _vocab_of, fake_verdict, record_token_ids,
                     target_tokens, verify_chain_sampling)


# ----------------------------------------------------------------------------------------------
# layout


def chain_layout(num_draft_tokens: torch.Tensor, max_drafts: int, *, bonus_rows: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts (bs,) int64 clamped to [0, max_drafts], each request's first target row (bs,)
    int64: r_b = d_b + b with bonus rows, d_b in the draft-aligned layout). No sync."""
    counts = num_draft_tokens.to(torch.int64).clamp(0, max_drafts)
    rows = counts + 1 if bonus_rows else counts
    return counts, torch.cumsum(rows, dim=0) - rows


def padded_rows(num_draft_tokens: torch.Tensor, max_drafts: int, total_rows: int, *, bonus_rows: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(target rows (bs, S+1), draft indices (bs, S)) int64 of each padded chain position, -1
    past the request's count or past the flat end. With bonus rows lane j <= c_b reads row r_b + j
    and draft j sits at r_b + j + 1 - (b + 1); draft-aligned, lane j < c_b reads row d_b + j, which
    is also draft j's index (lane c_b is the caller's bonus token: no row)."""
    counts, starts = chain_layout(num_draft_tokens, max_drafts, bonus_rows=bonus_rows)
    lanes = torch.arange(max_drafts + 1, dtype=torch.int64, device=counts.device)
    rows = starts[:, None] + lanes[None, :]
    in_chain = lanes[None, :] <= counts[:, None] if bonus_rows else lanes[None, :] < counts[:, None]
    rows = torch.where(in_chain & (rows < total_rows), rows, torch.full_like(rows, -1))
    if not bonus_rows:
        return rows, rows[:, :max_drafts]
    bs = counts.shape[0]
    draft_index = rows[:, 1:] - torch.arange(1, bs + 1, device=counts.device)[:, None]  # r_b + j + 1 - (b + 1) = d_b + j
    draft_index = torch.where(rows[:, 1:] >= 0, draft_index, torch.full_like(draft_index, -1))
    return rows, draft_index


def _bonus_lanes(draft_index: torch.Tensor) -> torch.Tensor:
    """(bs, 1) int64: the lane after each request's drafts that fit in the flat layout (where the
    draft-aligned layout's bonus token goes)."""
    return (draft_index >= 0).sum(dim=1, keepdim=True)


def _gather_rows(flat: torch.Tensor, index: torch.Tensor, fill) -> torch.Tensor:
    """flat[index] with rows where index < 0 (or flat is empty) filled with ``fill``."""
    if flat.shape[0] == 0:
        return torch.full((*index.shape, *flat.shape[1:]), fill, dtype=flat.dtype, device=flat.device)
    values = flat[index.clamp(0, flat.shape[0] - 1)]
    valid = (index >= 0).view(*index.shape, *([1] * (flat.dim() - 1)))
    return torch.where(valid, values, torch.full_like(values, fill))


# ----------------------------------------------------------------------------------------------
# checks


def _check_counts(draft_tokens, num_draft_tokens, max_drafts) -> tuple[int, int, torch.device]:
    checks.tensor("draft_tokens", draft_tokens, ndim=1, dtypes=checks.INDEX_DTYPES)
    device = draft_tokens.device
    checks.tensor("num_draft_tokens", num_draft_tokens, ndim=1, dtypes=checks.INDEX_DTYPES, device=device)
    # The padded verdict holds bs x (max_drafts + 1) entries and the kernels a row of them in
    # registers: the bound of a tree's num_steps (2^40 would try to allocate terabytes).
    checks.integer("max_drafts", max_drafts, low=0, high=MAX_TREE_STEPS)
    total, bs = draft_tokens.shape[0], num_draft_tokens.shape[0]
    if checks.value_checks_enabled() and bs:
        if bool((num_draft_tokens < 0).any()):
            raise checks.InvalidInput("num_draft_tokens", "counts >= 0", "a negative count")
        if bool((num_draft_tokens > max_drafts).any()):
            raise checks.InvalidInput("num_draft_tokens", f"counts <= max_drafts = {max_drafts}", "a larger count")
        if int(num_draft_tokens.sum()) != total:
            raise checks.InvalidInput("num_draft_tokens", f"counts summing to len(draft_tokens) = {total}", int(num_draft_tokens.sum()))
    elif checks.value_checks_enabled() and total:
        raise checks.InvalidInput("num_draft_tokens", f"counts summing to len(draft_tokens) = {total}", 0)
    return total, bs, device


def _target_rows(total: int, bs: int, bonus_tokens, device) -> int:
    """T + bs target rows, or T (draft-aligned) with ``bonus_tokens`` (checked here: (bs,) ids)."""
    if bonus_tokens is None:
        return total + bs
    checks.tensor("bonus_tokens", bonus_tokens, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs,))
    return total


def check_verify_chain_ragged(draft_tokens, num_draft_tokens, target_predict, *, max_drafts, token_bitmask=None, bitmask_index=None,
                              bonus_tokens=None, out=None) -> None:
    total, bs, device = _check_counts(draft_tokens, num_draft_tokens, max_drafts)
    rows = _target_rows(total, bs, bonus_tokens, device)
    _check_target_predict("target_predict", target_predict, 1, rows, device)
    if token_bitmask is not None and not target_predict.dtype.is_floating_point:
        raise checks.InvalidInput("target_predict", "logits (rows, V) when token_bitmask is given", "token ids")
    check_bitmask(token_bitmask, bitmask_index, rows=rows, vocab=target_predict.shape[-1] if token_bitmask is not None else None,
                  device=device)
    _check_verdict_out(out, bs, max_drafts + 1, max_drafts + 1, device)
    if checks.value_checks_enabled():
        record_token_ids("verify_chain_ragged", "draft_tokens", draft_tokens, _vocab_of(target_predict))


def _check_coins(coins, final_coins, rng_state, total: int, bs: int, device) -> None:
    """The caller's coins, or (both None) ``rng_state``: exactly one source."""
    if rng_state is None:
        checks.tensor("coins", coins, dtypes=(torch.float32,), device=device, shape=(total,))
        checks.tensor("final_coins", final_coins, dtypes=(torch.float32,), device=device, shape=(bs,))
        return
    for name, value in (("coins", coins), ("final_coins", final_coins)):
        if value is not None:
            raise checks.InvalidInput(name, "None when rng_state is given (one source of coins)", "a tensor")
    checks.tensor("rng_state", rng_state, dtypes=(torch.int64,), device=device, shape=(2,))


def check_verify_chain_sampling_ragged(draft_tokens, num_draft_tokens, draft_probs, target_probs, coins, final_coins, *, max_drafts,
                                       token_bitmask=None, bitmask_index=None, bonus_tokens=None, rng_state=None, out=None) -> None:
    total, bs, device = _check_counts(draft_tokens, num_draft_tokens, max_drafts)
    rows = _target_rows(total, bs, bonus_tokens, device)
    # flat (rows, V) only: _check_probs also takes (1, rows, V), which the flat gathers cannot
    checks.tensor("target_probs", target_probs, ndim=2)
    vocab = _check_probs("target_probs", target_probs, 1, rows, device)
    if draft_probs is not None:
        checks.tensor("draft_probs", draft_probs, ndim=2)
    if draft_probs is not None and _check_probs("draft_probs", draft_probs, 1, total, device) != vocab:
        raise checks.InvalidInput("draft_probs", f"the vocabulary of target_probs (V = {vocab})", f"shape {tuple(draft_probs.shape)}")
    _check_coins(coins, final_coins, rng_state, total, bs, device)
    check_bitmask(token_bitmask, bitmask_index, rows=rows, vocab=vocab, device=device)
    _check_verdict_out(out, bs, max_drafts + 1, max_drafts + 1, device)
    if checks.value_checks_enabled():
        record_token_ids("verify_chain_sampling_ragged", "draft_tokens", draft_tokens, vocab)


# ----------------------------------------------------------------------------------------------
# ops


def fake_verify_chain_ragged(draft_tokens, num_draft_tokens, target_predict, *, max_drafts, token_bitmask=None, bitmask_index=None,
                             bonus_tokens=None, out=None) -> Verdict:
    return fake_verdict(draft_tokens, num_draft_tokens.shape[0], max_drafts + 1, max_drafts + 1)


def fake_verify_chain_sampling_ragged(draft_tokens, num_draft_tokens, draft_probs, target_probs, coins, final_coins, *, max_drafts,
                                      token_bitmask=None, bitmask_index=None, bonus_tokens=None, rng_state=None, out=None) -> Verdict:
    return fake_verdict(draft_tokens, num_draft_tokens.shape[0], max_drafts + 1, max_drafts + 1)


@register_op("verify_chain_ragged", family="ragged", check=check_verify_chain_ragged, fake=fake_verify_chain_ragged)
def verify_chain_ragged(draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor, target_predict: torch.Tensor, *, max_drafts: int,
                        token_bitmask: Optional[torch.Tensor] = None, bitmask_index: Optional[torch.Tensor] = None,
                        bonus_tokens: Optional[torch.Tensor] = None, out: Optional[Verdict] = None) -> Verdict:
    """Greedy chain verification of a ragged batch (layout: module docstring).

    Args:
        draft_tokens: (T,) int32/int64 flat drafts.
        num_draft_tokens: (bs,) int32/int64 drafts per request, 0..max_drafts, summing to T.
        target_predict: the target's token per flat row, (rows,) int32/int64 ids, or logits
            (rows, V) float (argmax fused: NaN as -inf, ties to the lower id); rows = T + bs, or T
            with ``bonus_tokens``.
        max_drafts: S of the padded verdict (static, e.g. the engine's num_speculative_tokens).
        token_bitmask, bitmask_index: optional vocabulary mask per target row (spec_hal/masks.py;
            needs logits).
        bonus_tokens: optional (bs,) int32/int64: the draft-aligned layout (T target rows, this
            token after a fully accepted chain).
        out: optional Verdict of contiguous int32 buffers (N = max_drafts + 1).

    Returns:
        Verdict over padded chains of N = max_drafts + 1 nodes (predict (bs*N,), accept_index
        (bs, N), num_correct, accept_lens).
    """
    total, bs = draft_tokens.shape[0], num_draft_tokens.shape[0]
    nodes, bonus_rows = max_drafts + 1, bonus_tokens is None
    target_rows = total + bs if bonus_rows else total
    rows, draft_index = padded_rows(num_draft_tokens, max_drafts, target_rows, bonus_rows=bonus_rows)
    predicted = target_tokens(target_predict, 1, target_rows, token_bitmask, bitmask_index)[0]
    target = _gather_rows(predicted, rows, -1)  # (bs, N)
    if not bonus_rows:  # the caller's bonus token in the lane after the drafts that fit
        target = target.scatter(1, _bonus_lanes(draft_index), bonus_tokens.to(torch.int64)[:, None])
    drafts = _gather_rows(draft_tokens.to(torch.int64), draft_index, -1)  # (bs, S)
    # The drafts the match reads, at their flat index (clamped into [0, T) as the gather is).
    read_at = torch.where(draft_index >= 0, draft_index.clamp(max=max(total - 1, 0)), draft_index)
    record_token_ids("verify_chain_ragged", "draft_tokens", drafts, _vocab_of(target_predict), index=read_at)
    allowed = token_allowed(token_bitmask, bitmask_index, rows[:, :max_drafts].clamp(min=0), drafts, rows=target_rows)
    matches = (drafts == target[:, :max_drafts]) & (drafts >= 0) & allowed
    num_correct = matches.to(torch.int64).cumprod(dim=1).sum(dim=1)
    lanes = torch.arange(nodes, device=target.device)[None, :].expand(bs, nodes)
    path = torch.where(lanes <= num_correct[:, None], lanes, torch.full_like(lanes, -1))
    return _verdict(path, num_correct, target, nodes, out)


@register_op("verify_chain_sampling_ragged", family="ragged", check=check_verify_chain_sampling_ragged,
             fake=fake_verify_chain_sampling_ragged, mutates=("rng_state",))
def verify_chain_sampling_ragged(draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor, draft_probs: Optional[torch.Tensor],
                                 target_probs: torch.Tensor, coins: Optional[torch.Tensor], final_coins: Optional[torch.Tensor], *,
                                 max_drafts: int, token_bitmask: Optional[torch.Tensor] = None, bitmask_index: Optional[torch.Tensor] = None,
                                 bonus_tokens: Optional[torch.Tensor] = None, rng_state: Optional[torch.Tensor] = None,
                                 out: Optional[Verdict] = None) -> Verdict:
    """Chain rejection sampling of a ragged batch (layout: module docstring; per request exactly
    ``verify_chain_sampling`` over its c_b drafts).

    Args:
        draft_tokens: (T,) int32/int64 flat drafts; num_draft_tokens: (bs,) counts summing to T.
        draft_probs: (T, V) float32 draft distribution of each draft, or None (one-hot q:
            n-gram / prompt-lookup drafts).
        target_probs: (rows, V) float32 target distribution per flat target row (rows = T + bs,
            or T with ``bonus_tokens``).
        coins: (T,) float32 in [0, 1), one per draft; final_coins: (bs,) float32; both None with
            ``rng_state``.
        max_drafts: S of the padded verdict.
        token_bitmask, bitmask_index: optional vocabulary mask per target row.
        bonus_tokens: optional (bs,) int32/int64: the draft-aligned layout (T target rows; this
            token, not a sample, after a fully accepted chain).
        rng_state: optional (2,) int64 [seed, counter]: draw the coins from the counter-based
            stream (module docstring) and add 1 to the counter, in place.
        out: optional Verdict of contiguous int32 buffers (N = max_drafts + 1).
    """
    if rng_state is not None:
        coins, final_coins = stream_coins(rng_state, draft_tokens.shape[0], num_draft_tokens.shape[0])
        rng_state[1:].add_(1)
    drafts, q, p, step_coins, index, draft_index = padded_chain_sampling_inputs(
        draft_tokens, num_draft_tokens, draft_probs, target_probs, coins, max_drafts=max_drafts, token_bitmask=token_bitmask,
        bitmask_index=bitmask_index, bonus_rows=bonus_tokens is None)
    verdict = verify_chain_sampling(drafts, q, p, step_coins, final_coins, token_bitmask=token_bitmask, bitmask_index=index, out=out)
    if bonus_tokens is not None:  # a fully accepted chain (its drafts that fit) ends with the caller's bonus token
        bonus_lane = _bonus_lanes(draft_index)
        predict = verdict.predict.view(drafts.shape[0], max_drafts + 1)
        all_accepted = verdict.num_correct.to(torch.int64)[:, None] == bonus_lane
        predict.scatter_(1, bonus_lane, torch.where(all_accepted, bonus_tokens.to(torch.int64)[:, None],
                                                    predict.gather(1, bonus_lane).to(torch.int64)).to(predict.dtype))
    return verdict


def stream_coins(rng_state: torch.Tensor, total: int, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(coins (T,), final coins (bs,)) float32 of the counter-based stream at ``rng_state`` = [seed,
    counter] (read on the device: no sync)."""
    seed, counter = rng_state[0:1], rng_state[1:2]
    positions = torch.arange(max(total, bs), dtype=torch.int64, device=rng_state.device)
    return hash_coins(seed, counter, positions[:total], PURPOSE_ACCEPT)[0], hash_coins(seed, counter, positions[:bs], PURPOSE_FINAL)[0]


def padded_chain_sampling_inputs(draft_tokens, num_draft_tokens, draft_probs, target_probs, coins, *, max_drafts: int,
                                 token_bitmask=None, bitmask_index=None, bonus_rows: bool = True) -> tuple:
    """The reference's gather of ``verify_chain_sampling_ragged`` into ``verify_chain_sampling``'s
    padded layout (S = max_drafts; the Triton kernel reads the flat rows in place): (drafts (bs, S) int64 -1
    padded, q (bs, S, V) or None, p (bs, S+1, V), coins (bs, S), mask index of the padded rows
    (bs*(S+1),) int64 or None, the flat index of each padded draft (bs, S) int64, -1 for padding).
    ``bonus_rows`` False: the draft-aligned layout (T target rows)."""
    total, bs = draft_tokens.shape[0], num_draft_tokens.shape[0]
    target_rows = total + bs if bonus_rows else total
    rows, draft_index = padded_rows(num_draft_tokens, max_drafts, target_rows, bonus_rows=bonus_rows)
    drafts = _gather_rows(draft_tokens.to(torch.int64), draft_index, -1)
    p = _gather_rows(target_probs, rows, 0.0)
    q = _gather_rows(draft_probs, draft_index, 0.0) if draft_probs is not None else None
    step_coins = _gather_rows(coins, draft_index, 0.0)
    index = None
    if token_bitmask is not None:  # padded row -> the flat row's mask row; padding unconstrained
        flat_index = bitmask_index.to(torch.int64) if bitmask_index is not None else torch.arange(target_rows, device=rows.device)
        index = _gather_rows(flat_index, rows, -1).reshape(-1)
    return drafts, q, p, step_coins, index, draft_index
