"""vLLM's rejection sampler (functional core) over spec_hal's native ops.

    from spec_hal.compat.vllm import rejection_sample   # for vllm.v1.sample.rejection_sampler.rejection_sample

The signature, the flat layout (drafts of all requests concatenated, per-request counts and
cumulative offsets), the optional draft probabilities (None for n-gram drafts), the bonus tokens
and the padded int32 output with ``PLACEHOLDER_TOKEN_ID`` (-1) follow
``vllm/v1/sample/rejection_sampler.py`` of vllm-project/vllm (read at commit 7f6fc1c; the
signature is unchanged since 0097a7b, where ``GREEDY_TEMPERATURE`` was -1 instead of 0). Greedy
requests (``temperature == GREEDY_TEMPERATURE``) go through ``spec_hal.verify_chain_ragged`` over the
target argmax (``spec_hal.draft_topk`` with k = 1), random ones through
``spec_hal.verify_chain_sampling``; both run on the backend for the tensors' device.

What differs (also in ``docs/compat.md``):

* Accept test ``u * q < p`` (vLLM: ``q > 0 and p / q >= u``): equal except on the boundary and
  where ``q = 0 < p`` (spec_hal accepts a draft its own distribution could not have produced).
* The recovered token is an exact inverse-CDF sample of ``max(p - q, 0)`` with one uniform per
  request; vLLM draws V exponentials per request and takes ``argmax(residual / exp)``. Both sample
  the same distribution; draws differ.
* vLLM has no tree rejection sampler to mirror: its tree sampler (vllm-project/vllm PR 22752)
  was closed unmerged; SGLang-style tree verification is in ``spec_hal.compat.sgl_kernel``.
  vLLM's optional block verification (PR 46781) is not mirrored.
* Layout: greedy requests go through the native ragged op ``spec_hal.verify_chain_ragged``
  (its T + bs target rows are vLLM's argmax rows with each request's bonus token in its bonus
  row, so its padded verdict is vLLM's output as it stands). Random requests go through
  ``spec_hal.verify_chain_sampling``. When every request has ``max_spec_len`` drafts, vLLM's
  rows are read in place: request b's chain is a strided (S+1, V) view from its first row, whose
  lane S (read only when all S drafts pass, then replaced by the bonus token) is request b+1's
  first row; the last request runs as a second call on a copy of its rows. With mixed counts,
  one ``index_select`` of the target and draft rows into the padded layout (the gather that
  ``verify_chain_sampling_ragged`` does too; that op wants T + bs target rows, vLLM passes T).
  The padded layout is computed on the host from the host list ``num_draft_tokens`` (vectorised,
  one pinned non-blocking copy) and cached per count pattern (``LAYOUT_CACHE_SIZE`` patterns),
  so a repeated pattern costs no copy; ``cu_num_draft_tokens`` is checked for shape and dtype
  only. The first call with a pattern must not be inside a CUDA graph capture (the copy's pinned
  source would not outlive it).
* Coins: one float32 draw of ``bs * (max_spec_len + 1)`` uniforms covers the unseeded requests'
  step and final coins (vLLM draws float64 uniforms over the flat drafts); a seeded request's step
  coins are its generator's float64 draws over its drafts, exactly as vLLM's
  ``generate_uniform_probs`` draws them, rounded to float32 (so for the same generator state its
  accept decisions use vLLM's numbers up to that rounding), then one float32 final coin.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Protocol

import numpy as np
import torch

from .. import checks
from ..errors import InvalidInput
from ..types import Verdict
from ..verify import verdict_buffers

PLACEHOLDER_TOKEN_ID = -1
GREEDY_TEMPERATURE = 0  # vLLM >= 7f6fc1c; older releases marked greedy requests with -1
MAX_SPEC_LEN = 128
LAYOUT_CACHE_SIZE = 64  # count patterns whose device layout is kept


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
    if not isinstance(num_draft_tokens, (list, tuple)) or sum(num_draft_tokens) != num_tokens or min([0, *num_draft_tokens]) < 0:
        raise InvalidInput("num_draft_tokens", f"a list of per-request counts >= 0 summing to {num_tokens}", num_draft_tokens)
    bs = len(num_draft_tokens)
    checks.integer("max_spec_len", max_spec_len, low=max([0, *num_draft_tokens]))
    checks.tensor("cu_num_draft_tokens", cu_num_draft_tokens, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs,))
    if draft_probs is not None:
        checks.tensor("draft_probs", draft_probs, dtypes=checks.FLOAT_DTYPES, device=device, shape=(num_tokens, vocab))
    checks.tensor("bonus_token_ids", bonus_token_ids, dtypes=checks.INDEX_DTYPES, device=device)
    if bonus_token_ids.numel() != bs:
        raise InvalidInput("bonus_token_ids", f"shape ({bs}, 1)", f"shape {tuple(bonus_token_ids.shape)}")


class _Layout(NamedTuple):
    """The padded layout of vLLM's flat drafts, computed on the host from ``num_draft_tokens``
    and copied to the device once. S = max_spec_len, W = S + 1."""

    counts: torch.Tensor  # (bs,) int64 c_b
    draft_rows: torch.Tensor  # (bs, S) int64 flat draft of each padded slot, clamped into [0, T)
    valid: torch.Tensor  # (bs, S) bool: slot j < c_b
    target_rows: torch.Tensor  # (bs, W) int64 vLLM target row of each chain position (lane c_b and past: any valid row)
    count_lane: torch.Tensor  # (bs, W) int64: c_b in lane c_b, -1 elsewhere (where the bonus token may go)
    ragged_ids: torch.Tensor  # (T + bs,) int64: index into cat(argmax (T,), bonus (bs,)) of each ragged target row


def _layout(num_draft_tokens, max_spec_len: int, device) -> _Layout:
    """The layout of this count pattern on ``device``, built once per pattern (engines repeat a
    few patterns: every request at S drafts, or S with some requests at 0)."""
    return _cached_layout(tuple(num_draft_tokens), max_spec_len, str(torch.device(device)))


@functools.lru_cache(maxsize=LAYOUT_CACHE_SIZE)
def _cached_layout(num_draft_tokens: tuple, max_spec_len: int, device: str) -> _Layout:
    counts = np.asarray(num_draft_tokens, dtype=np.int64).reshape(-1)
    bs, total, width = counts.shape[0], int(counts.sum()), max_spec_len + 1
    starts = np.cumsum(counts) - counts
    lanes = np.arange(width, dtype=np.int64)[None, :]
    valid = lanes < counts[:, None]
    # Lane c_b and past read the request's first row (row T - 1 for a trailing request without
    # drafts): read by the native op, never emitted.
    target_rows = np.where(valid, starts[:, None] + lanes, np.minimum(starts, total - 1)[:, None])
    count_lane = np.where(lanes == counts[:, None], counts[:, None], -1)
    # Ragged target row r_b + j (r_b = starts_b + b): the argmax of flat row starts_b + j for
    # j < c_b, then the bonus row, which holds bonus token b (index T + b of the concatenation).
    request_of_row = np.repeat(np.arange(bs), counts + 1)
    lane_of_row = np.arange(total + bs) - (starts + np.arange(bs))[request_of_row]
    ragged_ids = np.where(lane_of_row < counts[request_of_row], starts[request_of_row] + lane_of_row, total + request_of_row)
    parts = (counts, target_rows[:, :max_spec_len], valid[:, :max_spec_len], target_rows, count_lane, ragged_ids)
    host = torch.from_numpy(np.concatenate([part.reshape(-1).astype(np.int64) for part in parts]))
    counts_t, draft_t, valid_t, rows_t, lane_t, ragged_t = torch.split(_to_device(host, device), [part.size for part in parts])
    steps = (bs, max_spec_len)
    return _Layout(counts_t, draft_t.view(steps), valid_t.view(steps) != 0, rows_t.view(bs, width), lane_t.view(bs, width), ragged_t)


def _to_device(host: torch.Tensor, device) -> torch.Tensor:
    """One host-to-device copy, from pinned memory without a host sync (once per count pattern:
    the result is cached, so a CUDA graph captured after the first call replays no copy)."""
    if torch.device(device).type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _coins(layout: _Layout, num_draft_tokens, generators: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(coins (bs, S) float32, final_coins (bs,) float32): one draw for every request, then each
    seeded request's coins from its generator as vLLM's generate_uniform_probs draws them (float64
    over its drafts; then its final coin)."""
    bs, steps = layout.draft_rows.shape
    uniforms = torch.rand((bs * (steps + 1),), dtype=torch.float32, device=device)
    coins, final_coins = uniforms[:bs * steps].view(bs, steps), uniforms[bs * steps:]
    for request, generator in generators.items():  # vLLM loops over its generators the same way
        count = num_draft_tokens[request]
        if count:
            coins[request, :count].copy_(torch.empty((count,), dtype=torch.float64, device=device).uniform_(generator=generator))
            final_coins[request:request + 1].uniform_(generator=generator)
    return coins, final_coins


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
        num_draft_tokens: list of bs per-request draft counts (host ints); the layout is read from it.
        max_spec_len: S, the width of the output minus one (>= every count).
        cu_num_draft_tokens: (bs,) int32/int64 inclusive cumulative counts (checked, not read).
        draft_probs: (num_tokens, V) float draft distributions, or None (n-gram: q is one-hot).
        target_probs: (num_tokens, V) float target distributions (for greedy requests vLLM passes
            logits here; only their argmax is used).
        bonus_token_ids: (bs, 1) int tokens emitted after a fully accepted chain.
        sampling_metadata: all_greedy, all_random, temperature (bs,), generators {request: Generator}.

    Returns:
        (bs, S+1) int32: per request the accepted drafts, then the recovered or bonus token, then
        PLACEHOLDER_TOKEN_ID (-1).
    """
    _check(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids)
    bs, width, device = len(num_draft_tokens), max_spec_len + 1, target_probs.device
    if bs == 0 or max_spec_len == 0 or target_probs.shape[0] == 0:  # no drafts anywhere: every request emits its bonus token
        output = torch.full((bs, width), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device)
        output[:, 0] = bonus_token_ids.reshape(bs).to(torch.int32)
        return output
    layout = _layout(num_draft_tokens, max_spec_len, device)
    bonus = bonus_token_ids.reshape(bs)  # the caller's int dtype: cast once where it is used
    greedy = None
    if not sampling_metadata.all_random:
        greedy = _greedy(draft_token_ids, target_probs, bonus, layout, max_spec_len)
        if sampling_metadata.all_greedy:
            return greedy
    sampled = _random(draft_token_ids, draft_probs, target_probs, bonus, layout, num_draft_tokens, sampling_metadata.generators)
    if greedy is None:
        return sampled
    is_greedy = sampling_metadata.temperature.to(device) == GREEDY_TEMPERATURE
    return torch.where(is_greedy[:, None], greedy, sampled)


def _greedy(draft_token_ids, target_probs, bonus, layout: _Layout, max_spec_len: int) -> torch.Tensor:
    """Greedy requests (native ``verify_chain_ragged``): the target rows are vLLM's argmax rows with
    each request's bonus token in its bonus row, so the padded verdict's predict is the output."""
    import spec_hal

    argmax = spec_hal.draft_topk(target_probs, 1)[1].view(-1)  # NaN as -inf, ties to the lower id
    target_ids = torch.cat([argmax, bonus]).index_select(0, layout.ragged_ids)
    verdict = spec_hal.verify_chain_ragged(draft_token_ids, layout.counts, target_ids, max_drafts=max_spec_len)
    return verdict.predict.view(-1, max_spec_len + 1)


def _random(draft_token_ids, draft_probs, target_probs, bonus, layout: _Layout, num_draft_tokens, generators: dict) -> torch.Tensor:
    """Random requests (native ``verify_chain_sampling``); the final token of a fully accepted chain
    is replaced by the bonus token."""
    bs, steps = layout.draft_rows.shape
    coins, final_coins = _coins(layout, num_draft_tokens, generators, target_probs.device)
    if all(count == steps for count in num_draft_tokens):  # host list: every request has S drafts
        verdict = _sample_uniform(draft_token_ids, draft_probs, target_probs, coins, final_coins, layout)
    else:
        verdict = _sample_padded(draft_token_ids, draft_probs, target_probs, coins, final_coins, layout)
    predict = verdict.predict.view(bs, steps + 1)
    bonus_lane = layout.count_lane == verdict.num_correct[:, None]  # lane c_b when all c_b drafts were accepted
    return torch.where(bonus_lane, bonus.to(torch.int32)[:, None], predict)


def _sample_uniform(draft_token_ids, draft_probs, target_probs, coins, final_coins, layout: _Layout):
    """Every request has S drafts: no copy of vLLM's rows. Request b's chain is a (S+1, V) view
    starting at its first row, so its lane S (read only when all S drafts pass, and then replaced
    by the bonus token) is request b+1's first row. The last request has no row after its own, so
    it runs as a second call on a copy of its S rows plus one (any) row."""
    import spec_hal

    (bs, steps), vocab = layout.draft_rows.shape, target_probs.shape[1]
    drafts = draft_token_ids.reshape(bs, steps)
    target = target_probs.to(torch.float32)
    draft = None if draft_probs is None else draft_probs.to(torch.float32).reshape(bs, steps, vocab)
    row, width = target.stride(0), steps + 1
    verdict = verdict_buffers(bs, width, width, target.device)
    head = bs - 1
    if head:
        chains = target.as_strided((head, width, vocab), (steps * row, row, target.stride(1)))
        spec_hal.verify_chain_sampling(drafts[:head], None if draft is None else draft[:head], chains, coins[:head], final_coins[:head],
                                       out=_verdict_slice(verdict, 0, head, width))
    last_chain = target.index_select(0, layout.target_rows[head])[None]  # its S rows, then its first row again
    spec_hal.verify_chain_sampling(drafts[head:], None if draft is None else draft[head:], last_chain,
                                   coins[head:], final_coins[head:], out=_verdict_slice(verdict, head, bs, width))
    return verdict


def _verdict_slice(verdict, start: int, end: int, width: int):
    """Requests [start, end) of a Verdict of contiguous buffers (contiguous views)."""
    return Verdict(verdict.predict[start * width:end * width], verdict.accept_index[start:end], verdict.num_correct[start:end],
                   verdict.accept_lens[start:end])


def _sample_padded(draft_token_ids, draft_probs, target_probs, coins, final_coins, layout: _Layout):
    """Mixed draft counts: one ``index_select`` of the target rows and of the draft rows into the
    padded layout (what ``verify_chain_sampling_ragged`` gathers too), then one native call."""
    import spec_hal

    bs, steps = layout.draft_rows.shape
    vocab = target_probs.shape[1]
    drafts = torch.where(layout.valid, draft_token_ids[layout.draft_rows], PLACEHOLDER_TOKEN_ID)
    target = target_probs.to(torch.float32).index_select(0, layout.target_rows.view(-1)).view(bs, steps + 1, vocab)
    draft = None
    if draft_probs is not None:
        draft = draft_probs.to(torch.float32).index_select(0, layout.draft_rows.view(-1)).view(bs, steps, vocab)
    return spec_hal.verify_chain_sampling(drafts, draft, target, coins, final_coins)
