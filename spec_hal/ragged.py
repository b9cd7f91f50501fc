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

Bad input: counts of the wrong shape or dtype, flat tensors whose lengths disagree
(``target`` rows != T + bs) are rejected from shapes; counts that are negative, exceed
``max_drafts`` or do not sum to T are value errors, checked only in checked mode
(``SPEC_HAL_CHECKS=1``, a sync); without it they give a defined verdict (counts clamped to
[0, max_drafts], rows past the flat end read as padding) and never an out-of-bounds access.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import checks
from .masks import check_bitmask
from .registry import register_op
from .types import Verdict
from .masks import token_allowed
from .verify import (MAX_TREE_STEPS, _check_probs, _check_target_predict, _check_verdict_out, _verdict, _vocab_of, fake_verdict, record_token_ids,
                     target_tokens, verify_chain_sampling)


# ----------------------------------------------------------------------------------------------
# layout


def chain_layout(num_draft_tokens: torch.Tensor, max_drafts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts (bs,) int64 clamped to [0, max_drafts], target row starts r_b (bs,) int64). No sync."""
    counts = num_draft_tokens.to(torch.int64).clamp(0, max_drafts)
    starts = torch.cumsum(counts + 1, dim=0) - (counts + 1)
    return counts, starts


def padded_rows(num_draft_tokens: torch.Tensor, max_drafts: int, total_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(target rows (bs, S+1), draft indices (bs, S)) int64 of each padded chain position, -1
    past the request's count or past the flat end."""
    counts, starts = chain_layout(num_draft_tokens, max_drafts)
    lanes = torch.arange(max_drafts + 1, dtype=torch.int64, device=counts.device)
    rows = starts[:, None] + lanes[None, :]
    rows = torch.where((lanes[None, :] <= counts[:, None]) & (rows < total_rows), rows, torch.full_like(rows, -1))
    bs = counts.shape[0]
    draft_index = rows[:, 1:] - torch.arange(1, bs + 1, device=counts.device)[:, None]  # r_b + j + 1 - (b + 1) = d_b + j
    draft_index = torch.where(rows[:, 1:] >= 0, draft_index, torch.full_like(draft_index, -1))
    return rows, draft_index


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


def check_verify_chain_ragged(draft_tokens, num_draft_tokens, target_predict, *, max_drafts, token_bitmask=None, bitmask_index=None,
                              out=None) -> None:
    total, bs, device = _check_counts(draft_tokens, num_draft_tokens, max_drafts)
    rows = total + bs
    _check_target_predict("target_predict", target_predict, 1, rows, device)
    if token_bitmask is not None and not target_predict.dtype.is_floating_point:
        raise checks.InvalidInput("target_predict", "logits (T + bs, V) when token_bitmask is given", "token ids")
    check_bitmask(token_bitmask, bitmask_index, rows=rows, vocab=target_predict.shape[-1] if token_bitmask is not None else None,
                  device=device)
    _check_verdict_out(out, bs, max_drafts + 1, max_drafts + 1, device)
    if checks.value_checks_enabled():
        record_token_ids("verify_chain_ragged", "draft_tokens", draft_tokens, _vocab_of(target_predict))


def check_verify_chain_sampling_ragged(draft_tokens, num_draft_tokens, draft_probs, target_probs, coins, final_coins, *, max_drafts,
                                       token_bitmask=None, bitmask_index=None, out=None) -> None:
    total, bs, device = _check_counts(draft_tokens, num_draft_tokens, max_drafts)
    # flat (rows, V) only: _check_probs also takes (1, rows, V), which the flat gathers cannot
    checks.tensor("target_probs", target_probs, ndim=2)
    vocab = _check_probs("target_probs", target_probs, 1, total + bs, device)
    if draft_probs is not None:
        checks.tensor("draft_probs", draft_probs, ndim=2)
    if draft_probs is not None and _check_probs("draft_probs", draft_probs, 1, total, device) != vocab:
        raise checks.InvalidInput("draft_probs", f"the vocabulary of target_probs (V = {vocab})", f"shape {tuple(draft_probs.shape)}")
    checks.tensor("coins", coins, dtypes=(torch.float32,), device=device, shape=(total,))
    checks.tensor("final_coins", final_coins, dtypes=(torch.float32,), device=device, shape=(bs,))
    check_bitmask(token_bitmask, bitmask_index, rows=total + bs, vocab=vocab, device=device)
    _check_verdict_out(out, bs, max_drafts + 1, max_drafts + 1, device)
    if checks.value_checks_enabled():
        record_token_ids("verify_chain_sampling_ragged", "draft_tokens", draft_tokens, vocab)


# ----------------------------------------------------------------------------------------------
# ops


def fake_verify_chain_ragged(draft_tokens, num_draft_tokens, target_predict, *, max_drafts, token_bitmask=None, bitmask_index=None,
                             out=None) -> Verdict:
    return fake_verdict(draft_tokens, num_draft_tokens.shape[0], max_drafts + 1, max_drafts + 1)


def fake_verify_chain_sampling_ragged(draft_tokens, num_draft_tokens, draft_probs, target_probs, coins, final_coins, *, max_drafts,
                                      token_bitmask=None, bitmask_index=None, out=None) -> Verdict:
    return fake_verdict(draft_tokens, num_draft_tokens.shape[0], max_drafts + 1, max_drafts + 1)


@register_op("verify_chain_ragged", family="ragged", check=check_verify_chain_ragged, fake=fake_verify_chain_ragged)
def verify_chain_ragged(draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor, target_predict: torch.Tensor, *, max_drafts: int,
                        token_bitmask: Optional[torch.Tensor] = None, bitmask_index: Optional[torch.Tensor] = None,
                        out: Optional[Verdict] = None) -> Verdict:
    """Greedy chain verification of a ragged batch (layout: module docstring).

    Args:
        draft_tokens: (T,) int32/int64 flat drafts.
        num_draft_tokens: (bs,) int32/int64 drafts per request, 0..max_drafts, summing to T.
        target_predict: the target's token per flat row, (T + bs,) int32/int64 ids, or logits
            (T + bs, V) float (argmax fused: NaN as -inf, ties to the lower id).
        max_drafts: S of the padded verdict (static, e.g. the engine's num_speculative_tokens).
        token_bitmask, bitmask_index: optional vocabulary mask per target row (spec_hal/masks.py;
            needs logits).
        out: optional Verdict of contiguous int32 buffers (N = max_drafts + 1).

    Returns:
        Verdict over padded chains of N = max_drafts + 1 nodes (predict (bs*N,), accept_index
        (bs, N), num_correct, accept_lens).
    """
    total, bs = draft_tokens.shape[0], num_draft_tokens.shape[0]
    nodes = max_drafts + 1
    rows, draft_index = padded_rows(num_draft_tokens, max_drafts, total + bs)
    predicted = target_tokens(target_predict, 1, total + bs, token_bitmask, bitmask_index)[0]
    target = _gather_rows(predicted, rows, -1)  # (bs, N)
    drafts = _gather_rows(draft_tokens.to(torch.int64), draft_index, -1)  # (bs, S)
    # The drafts the match reads, at their flat index (clamped into [0, T) as the gather is).
    read_at = torch.where(draft_index >= 0, draft_index.clamp(max=max(total - 1, 0)), draft_index)
    record_token_ids("verify_chain_ragged", "draft_tokens", drafts, _vocab_of(target_predict), index=read_at)
    allowed = token_allowed(token_bitmask, bitmask_index, rows[:, :max_drafts].clamp(min=0), drafts, rows=total + bs)
    matches = (drafts == target[:, :max_drafts]) & (drafts >= 0) & allowed
    num_correct = matches.to(torch.int64).cumprod(dim=1).sum(dim=1)
    lanes = torch.arange(nodes, device=target.device)[None, :].expand(bs, nodes)
    path = torch.where(lanes <= num_correct[:, None], lanes, torch.full_like(lanes, -1))
    return _verdict(path, num_correct, target, nodes, out)


@register_op("verify_chain_sampling_ragged", family="ragged", check=check_verify_chain_sampling_ragged,
             fake=fake_verify_chain_sampling_ragged)
def verify_chain_sampling_ragged(draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor, draft_probs: Optional[torch.Tensor],
                                 target_probs: torch.Tensor, coins: torch.Tensor, final_coins: torch.Tensor, *, max_drafts: int,
                                 token_bitmask: Optional[torch.Tensor] = None, bitmask_index: Optional[torch.Tensor] = None,
                                 out: Optional[Verdict] = None) -> Verdict:
    """Chain rejection sampling of a ragged batch (layout: module docstring; per request exactly
    ``verify_chain_sampling`` over its c_b drafts).

    Args:
        draft_tokens: (T,) int32/int64 flat drafts; num_draft_tokens: (bs,) counts summing to T.
        draft_probs: (T, V) float32 draft distribution of each draft, or None (one-hot q:
            n-gram / prompt-lookup drafts).
        target_probs: (T + bs, V) float32 target distribution per flat target row.
        coins: (T,) float32 in [0, 1), one per draft; final_coins: (bs,) float32.
        max_drafts: S of the padded verdict.
        token_bitmask, bitmask_index: optional vocabulary mask per target row.
        out: optional Verdict of contiguous int32 buffers (N = max_drafts + 1).
    """
    drafts, q, p, step_coins, index = padded_chain_sampling_inputs(draft_tokens, num_draft_tokens, draft_probs, target_probs, coins,
                                                                   max_drafts=max_drafts, token_bitmask=token_bitmask, bitmask_index=bitmask_index)
    return verify_chain_sampling(drafts, q, p, step_coins, final_coins, token_bitmask=token_bitmask, bitmask_index=index, out=out)


def padded_chain_sampling_inputs(draft_tokens, num_draft_tokens, draft_probs, target_probs, coins, *, max_drafts: int,
                                 token_bitmask=None, bitmask_index=None) -> tuple:
    """The reference's gather of ``verify_chain_sampling_ragged`` into ``verify_chain_sampling``'s
    padded layout (S = max_drafts; the Triton kernel reads the flat rows in place): (drafts (bs, S) int64 -1
    padded, q (bs, S, V) or None, p (bs, S+1, V), coins (bs, S), mask index of the padded rows
    (bs*(S+1),) int64 or None)."""
    total, bs = draft_tokens.shape[0], num_draft_tokens.shape[0]
    rows, draft_index = padded_rows(num_draft_tokens, max_drafts, total + bs)
    drafts = _gather_rows(draft_tokens.to(torch.int64), draft_index, -1)
    p = _gather_rows(target_probs, rows, 0.0)
    q = _gather_rows(draft_probs, draft_index, 0.0) if draft_probs is not None else None
    step_coins = _gather_rows(coins, draft_index, 0.0)
    index = None
    if token_bitmask is not None:  # padded row -> the flat row's mask row; padding unconstrained
        flat_index = bitmask_index.to(torch.int64) if bitmask_index is not None else torch.arange(total + bs, device=rows.device)
        index = _gather_rows(flat_index, rows, -1).reshape(-1)
    return drafts, q, p, step_coins, index
