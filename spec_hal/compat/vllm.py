"""vLLM's rejection sampler (functional core) over spec_hal's native ops.

    from spec_hal.compat.vllm import rejection_sample   # for vllm.v1.sample.rejection_sampler.rejection_sample

The signature, the flat layout (drafts of all requests concatenated, per-request counts and
cumulative offsets), the optional draft probabilities (None for n-gram drafts), the bonus tokens
and the padded int32 output with ``PLACEHOLDER_TOKEN_ID`` (-1) follow
``vllm/v1/sample/rejection_sampler.py`` of vllm-project/vllm (read at commit 7f6fc1c; the
signature is unchanged since 0097a7b, where ``GREEDY_TEMPERATURE`` was -1 instead of 0). Greedy
requests (``temperature == GREEDY_TEMPERATURE``) go through ``spec_hal.verify_chain`` over the
target argmax (``spec_hal.draft_topk`` with k = 1), random ones through
``spec_hal.verify_chain_sampling``; both run on the backend for the tensors' device.

What differs (also in ``docs/compat.md``):

* Accept test ``u * q < p`` (vLLM: ``q > 0 and p / q >= u``): equal except on the boundary and
  where ``q = 0 < p`` (spec_hal accepts a draft its own distribution could not have produced).
* The recovered token is an exact inverse-CDF sample of ``max(p - q, 0)`` with one uniform per
  request; vLLM draws V exponentials per request and takes ``argmax(residual / exp)``. Both sample
  the same distribution; draws differ. The accept/reject coins are drawn exactly as vLLM draws
  them (float64 ``torch.rand`` over all draft tokens, then each seeded request's slice from its
  generator) and rounded to float32, so for the same generator state the accept decisions use the
  same numbers (up to that rounding).
* vLLM has no tree rejection sampler to mirror: its tree sampler (vllm-project/vllm PR 22752)
  was closed unmerged; SGLang-style tree verification is in ``spec_hal.compat.sgl_kernel``.
  vLLM's optional block verification (PR 46781) is not mirrored.
* The ragged layout is padded to ``max_spec_len`` for the native chain ops, which copies the
  draft and target rows of the random requests (``index_select``); spec_hal's ragged chain op
  (issue #14) removes that copy.
"""
from __future__ import annotations

from typing import Optional, Protocol

import torch

from .. import checks
from ..errors import InvalidInput

PLACEHOLDER_TOKEN_ID = -1
GREEDY_TEMPERATURE = 0  # vLLM >= 7f6fc1c; older releases marked greedy requests with -1
MAX_SPEC_LEN = 128


class SamplingMetadata(Protocol):
    """The fields of vLLM's SamplingMetadata that rejection sampling reads."""

    all_greedy: bool
    all_random: bool
    temperature: Optional[torch.Tensor]  # (bs,) float32; GREEDY_TEMPERATURE marks greedy requests
    generators: dict  # request index -> torch.Generator


def _check(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids):
    checks.tensor("target_probs", target_probs, ndim=2, dtypes=checks.FLOAT_DTYPES)
    num_tokens, vocab = target_probs.shape
    device = target_probs.device
    checks.tensor("draft_token_ids", draft_token_ids, dtypes=checks.INDEX_DTYPES, device=device, shape=(num_tokens,))
    if not isinstance(num_draft_tokens, (list, tuple)) or sum(num_draft_tokens) != num_tokens:
        raise InvalidInput("num_draft_tokens", f"a list of per-request counts summing to {num_tokens}", num_draft_tokens)
    bs = len(num_draft_tokens)
    checks.integer("max_spec_len", max_spec_len, low=max([0, *num_draft_tokens]))
    checks.tensor("cu_num_draft_tokens", cu_num_draft_tokens, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs,))
    if draft_probs is not None:
        checks.tensor("draft_probs", draft_probs, dtypes=checks.FLOAT_DTYPES, device=device, shape=(num_tokens, vocab))
    checks.tensor("bonus_token_ids", bonus_token_ids, dtypes=checks.INDEX_DTYPES, device=device)
    if bonus_token_ids.numel() != bs:
        raise InvalidInput("bonus_token_ids", f"shape ({bs}, 1)", f"shape {tuple(bonus_token_ids.shape)}")


def _padded_rows(cu_num_draft_tokens: torch.Tensor, max_spec_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(flat row of each padded slot (bs, S) int64, valid (bs, S) bool, counts (bs,) int64), on the device."""
    ends = cu_num_draft_tokens.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    counts = ends - starts
    position = torch.arange(max_spec_len, device=ends.device)
    valid = position[None, :] < counts[:, None]
    return starts[:, None] + position[None, :], valid, counts


def _uniforms(num_tokens: int, num_draft_tokens, generators: dict, device) -> torch.Tensor:
    """vLLM's generate_uniform_probs: one float64 uniform per draft token, seeded requests' slices
    from their generator (float64 as vLLM draws them, so a generator yields the same numbers),
    rounded to the float32 coins of the native op."""
    coins = torch.rand((num_tokens,), dtype=torch.float64, device=device)
    start = 0
    for request, count in enumerate(num_draft_tokens):
        if count == 0:
            continue
        generator = generators.get(request)
        if generator is not None:
            coins[start:start + count].uniform_(generator=generator)
        start += count
    return coins.to(torch.float32)


def _final_coins(num_draft_tokens, generators: dict, device) -> torch.Tensor:
    """One uniform per request for the recovered token; seeded requests (with drafts) from their generator."""
    coins = torch.rand((len(num_draft_tokens),), dtype=torch.float32, device=device)
    for request, generator in generators.items():
        if num_draft_tokens[request] > 0:
            coins[request:request + 1].uniform_(generator=generator)
    return coins


def _emit(accepted_ids: torch.Tensor, num_correct: torch.Tensor, recovered: torch.Tensor, counts: torch.Tensor,
          bonus: torch.Tensor, width: int) -> torch.Tensor:
    """(bs, width) int32: accepted drafts, then the recovered token (or the bonus when all ``counts``
    drafts were accepted), then PLACEHOLDER_TOKEN_ID."""
    position = torch.arange(width, device=accepted_ids.device)[None, :]
    nc = num_correct.to(torch.int64)[:, None]
    last = torch.where(nc < counts[:, None], recovered.to(torch.int64)[:, None], bonus[:, None])
    out = torch.where(position < nc, accepted_ids, torch.where(position == nc, last, torch.full_like(accepted_ids, PLACEHOLDER_TOKEN_ID)))
    return out.to(torch.int32)


def rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list,
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    sampling_metadata: SamplingMetadata,
) -> torch.Tensor:
    """Rejection sampling of flat chain drafts, vLLM layout.

    Args:
        draft_token_ids: (num_tokens,) int32/int64, the drafts of all requests concatenated.
        num_draft_tokens: list of bs per-request draft counts (host ints).
        max_spec_len: S, the width of the output minus one (>= every count).
        cu_num_draft_tokens: (bs,) int32/int64 inclusive cumulative counts.
        draft_probs: (num_tokens, V) float draft distributions, or None (n-gram: q is one-hot).
        target_probs: (num_tokens, V) float target distributions (for greedy requests vLLM passes
            logits here; only their argmax is used).
        bonus_token_ids: (bs, 1) int tokens emitted after a fully accepted chain.
        sampling_metadata: all_greedy, all_random, temperature (bs,), generators {request: Generator}.

    Returns:
        (bs, S+1) int32: per request the accepted drafts, then the recovered or bonus token, then
        PLACEHOLDER_TOKEN_ID (-1).
    """
    import spec_hal

    _check(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids)
    bs, width, device = len(num_draft_tokens), max_spec_len + 1, target_probs.device
    num_tokens, vocab = target_probs.shape
    output = torch.full((bs, width), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device)
    if bs == 0:
        return output
    if max_spec_len == 0:  # no drafts anywhere: every request emits its bonus token
        output[:, 0] = bonus_token_ids.reshape(bs).to(torch.int32)
        return output
    flat, valid, counts = _padded_rows(cu_num_draft_tokens, max_spec_len)
    rows = flat.clamp(0, max(num_tokens - 1, 0))
    drafts = draft_token_ids.to(torch.int64)
    padded_drafts = torch.where(valid, drafts[rows] if num_tokens else torch.zeros_like(rows), torch.full_like(rows, PLACEHOLDER_TOKEN_ID))
    bonus = bonus_token_ids.reshape(bs).to(torch.int64)
    is_greedy = None if sampling_metadata.all_greedy else sampling_metadata.temperature == GREEDY_TEMPERATURE
    if not sampling_metadata.all_random:
        output = _greedy(spec_hal, target_probs, padded_drafts, rows, valid, counts, bonus, width)
        if sampling_metadata.all_greedy:
            return output
    coins_flat = _uniforms(num_tokens, num_draft_tokens, sampling_metadata.generators, device)
    coins = torch.where(valid, coins_flat[rows] if num_tokens else torch.zeros(rows.shape, device=device), torch.zeros((), device=device))
    final_coins = _final_coins(num_draft_tokens, sampling_metadata.generators, device)
    target = target_probs.to(torch.float32)
    # Padded target rows: S draft rows (past a request's count: any row, never read, since its
    # padded draft id is -1 and is rejected) and one bonus-row stand-in (never emitted: the bonus
    # token replaces it).
    padded_target = target.index_select(0, torch.cat([rows, rows[:, -1:]], dim=1).reshape(-1)).view(bs, width, vocab) if num_tokens \
        else torch.zeros((bs, width, vocab), device=device)
    uniform_counts = all(count == max_spec_len for count in num_draft_tokens)  # host list: no device read
    padded_draft = _padded_draft_probs(draft_probs, padded_drafts, rows, bs, max_spec_len, vocab, device, uniform_counts)
    verdict = spec_hal.verify_chain_sampling(padded_drafts, padded_draft, padded_target, coins, final_coins)
    sampled = verdict.predict.view(bs, width).to(torch.int64)
    recovered = sampled.gather(1, verdict.num_correct.to(torch.int64)[:, None])[:, 0]
    random_out = _emit(torch.cat([padded_drafts, padded_drafts[:, :1]], dim=1), verdict.num_correct, recovered, counts, bonus, width)
    if is_greedy is None:
        return random_out
    return torch.where(is_greedy.to(device)[:, None], output, random_out)


def _greedy(spec_hal, target_probs, padded_drafts, rows, valid, counts, bonus, width) -> torch.Tensor:
    """Greedy requests: accept while the draft equals the target argmax (native verify_chain)."""
    bs = rows.shape[0]
    if target_probs.shape[0]:
        argmax = spec_hal.draft_topk(target_probs, 1)[1][:, 0]  # NaN as -inf, ties to the lower id
        padded_argmax = argmax[rows]
    else:
        padded_argmax = torch.zeros_like(rows)
    root = torch.zeros((bs, 1), dtype=torch.int64, device=rows.device)
    candidates = torch.cat([root, padded_drafts], dim=1)
    target_predict = torch.cat([padded_argmax, root], dim=1)  # the last column is never compared
    num_correct, recovered = spec_hal.verify_chain(candidates, target_predict)
    return _emit(torch.cat([padded_drafts, root], dim=1), num_correct, recovered, counts, bonus, width)


def _padded_draft_probs(draft_probs, padded_drafts, rows, bs, steps, vocab, device, uniform_counts: bool) -> torch.Tensor:
    """(bs, S, V) float32: the draft rows (a view when every request has S drafts), or one-hot rows
    at the drafted ids for n-gram drafts."""
    if draft_probs is not None and uniform_counts and draft_probs.dtype == torch.float32 and steps:
        return draft_probs.reshape(bs, steps, vocab)
    if draft_probs is not None and rows.numel() and draft_probs.shape[0]:
        return draft_probs.to(torch.float32).index_select(0, rows.reshape(-1)).view(bs, steps, vocab)
    one_hot = torch.zeros((bs, steps, vocab), dtype=torch.float32, device=device)
    if draft_probs is None:
        drafted = padded_drafts >= 0
        one_hot.scatter_(2, padded_drafts.clamp(min=0)[:, :, None], drafted.to(torch.float32)[:, :, None])
    return one_hot
