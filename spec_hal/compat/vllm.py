"""vLLM's rejection sampler (functional core) over spec_hal's native ops.

    from spec_hal.compat.vllm import rejection_sample   # for vllm.v1.sample.rejection_sampler.rejection_sample

The signature, the flat layout (drafts of all requests concatenated, per-request counts and
cumulative offsets), the optional draft probabilities (None for n-gram drafts), the bonus tokens
and the padded int32 output with ``PLACEHOLDER_TOKEN_ID`` (-1) follow
``vllm/v1/sample/rejection_sampler.py`` of vllm-project/vllm (read at commit 7f6fc1c; the
signature is unchanged since 0097a7b, where ``GREEDY_TEMPERATURE`` was -1 instead of 0). Greedy
requests (``temperature == GREEDY_TEMPERATURE``) go through ``spec_hal.verify_chain_ragged`` (the
target's argmax fused), random ones through ``spec_hal.verify_chain_sampling_ragged``, both in
vLLM's layout (``bonus_tokens=``); both run on the backend for the tensors' device.

What differs (also in ``docs/compat.md``):

* Accept test ``u * q < p`` (vLLM: ``q > 0 and p / q >= u``): equal except on the boundary and
  where ``q = 0 < p`` (spec_hal accepts a draft its own distribution could not have produced).
* The recovered token is an exact inverse-CDF sample of ``max(p - q, 0)`` with one uniform per
  request; vLLM draws V exponentials per request and takes ``argmax(residual / exp)``. Both sample
  the same distribution; draws differ.
* vLLM has no tree rejection sampler to mirror: its tree sampler (vllm-project/vllm PR 22752)
  was closed unmerged; SGLang-style tree verification is in ``spec_hal.compat.sgl_kernel``.
  vLLM's optional block verification (PR 46781) is not mirrored.
* Layout: vLLM's own. Both native ops take it as it stands (``bonus_tokens=``, spec_hal's
  draft-aligned ragged layout): the T target rows, the flat drafts and the bonus tokens are read
  in place, and the padded verdict's ``predict`` viewed as (bs, S+1) is vLLM's output. Greedy
  requests go through ``spec_hal.verify_chain_ragged`` (argmax of the target rows fused), random
  ones through ``spec_hal.verify_chain_sampling_ragged``; a mixed batch runs both and picks per
  request. The per-request counts are copied to the device once per count pattern, from the
  host list ``num_draft_tokens`` (one pinned non-blocking copy, ``LAYOUT_CACHE_SIZE`` patterns
  kept), so a repeated pattern costs no copy; ``cu_num_draft_tokens`` is checked for shape and
  dtype only. The first call with a pattern must not be inside a CUDA graph capture (the copy's
  pinned source would not outlive it).
* Coins: without generators, the native op draws them from spec_hal's counter-based stream
  (``rng_state=``: hashed in a one-program launch before its kernel, graph-safe; seeded from torch's
  default generator at first use); with generators, one float32 draw of ``T + bs`` uniforms
  covers the unseeded requests' step and final coins (vLLM draws float64 uniforms over the flat
  drafts); a seeded request's step coins are its generator's float64 draws over its drafts, exactly as vLLM's
  ``generate_uniform_probs`` draws them, rounded to float32 (so for the same generator state its
  accept decisions use vLLM's numbers up to that rounding), then one float32 final coin.
"""
from __future__ import annotations

import functools
from typing import Optional, Protocol

import numpy as np
import torch

from .. import checks
from ..device_buffers import allocate_persistent
from ..errors import InvalidInput

PLACEHOLDER_TOKEN_ID = -1
GREEDY_TEMPERATURE = 0  # vLLM >= 7f6fc1c; older releases marked greedy requests with -1
MAX_SPEC_LEN = 128
LAYOUT_CACHE_SIZE = 64  # count patterns whose device copy of the counts is kept


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


def _counts(num_draft_tokens, device) -> torch.Tensor:
    """(bs,) int64 counts on ``device``, copied once per count pattern (engines repeat a few
    patterns: every request at S drafts, or S with some requests at 0)."""
    return _cached_counts(tuple(num_draft_tokens), _device_key(device))


@functools.lru_cache(maxsize=LAYOUT_CACHE_SIZE)
def _cached_counts(num_draft_tokens: tuple, device: str) -> torch.Tensor:
    host = torch.tensor(num_draft_tokens, dtype=torch.int64)
    if torch.device(device).type == "cpu":
        return host
    # pinned and non-blocking: no host sync (cached, so a CUDA graph captured after the first
    # call with this pattern replays no copy)
    return host.pin_memory().to(device, non_blocking=True)


_STREAMS: dict[str, torch.Tensor] = {}


def _device_key(device) -> str:
    """"cuda:N" for "cuda" too (the current device), so one device has one key."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


def _stream_state(device) -> torch.Tensor:
    """This device's [seed, counter] of spec_hal's counter-based coin stream (the native op draws
    the coins and advances the counter in its first launch: no extra launch per call). The seed
    comes from torch's default generator at first use, so ``torch.manual_seed`` before it makes a
    run reproducible."""
    key = _device_key(device)
    state = _STREAMS.get(key)
    if state is None:
        seed = int(torch.randint(0, 2**62, (1,)))
        state = _STREAMS.setdefault(key, allocate_persistent(torch.device(key), lambda: torch.tensor([seed, 0], device=key)))
    return state


def _coins(num_draft_tokens, generators: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(coins (T,) float32 aligned with the flat drafts, final_coins (bs,) float32): one draw for
    every request, then each seeded request's coins from its generator as vLLM's
    generate_uniform_probs draws them (float64 over its drafts; then its final coin)."""
    total, bs = sum(num_draft_tokens), len(num_draft_tokens)
    uniforms = torch.rand((total + bs,), dtype=torch.float32, device=device)
    coins, final_coins = uniforms[:total], uniforms[total:]
    if generators:
        starts = np.cumsum([0, *num_draft_tokens])
        for request, generator in generators.items():  # vLLM loops over its generators the same way
            count, start = num_draft_tokens[request], int(starts[request])
            if count:
                coins[start:start + count].copy_(torch.empty((count,), dtype=torch.float64, device=device).uniform_(generator=generator))
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
    import spec_hal

    bs, width, device = len(num_draft_tokens), max_spec_len + 1, target_probs.device
    counts = _counts(num_draft_tokens, device)
    bonus = bonus_token_ids.reshape(bs)
    greedy = None
    if not sampling_metadata.all_random:  # target_probs holds logits here; their argmax is fused
        greedy = spec_hal.verify_chain_ragged(draft_token_ids, counts, target_probs, max_drafts=max_spec_len, bonus_tokens=bonus)
        greedy = greedy.predict.view(bs, width)
        if sampling_metadata.all_greedy:
            return greedy
    randomness = {"rng_state": _stream_state(device)}  # unseeded requests: coins drawn inside the native op
    if sampling_metadata.generators:  # seeded requests draw from their generators, as vLLM does
        coins, final_coins = _coins(num_draft_tokens, sampling_metadata.generators, device)
        randomness = {}
    else:
        coins = final_coins = None
    draft_probs = None if draft_probs is None else draft_probs.to(torch.float32)
    sampled = spec_hal.verify_chain_sampling_ragged(draft_token_ids, counts, draft_probs, target_probs.to(torch.float32), coins,
                                                    final_coins, max_drafts=max_spec_len, bonus_tokens=bonus, **randomness)
    sampled = sampled.predict.view(bs, width)
    if greedy is None:
        return sampled
    is_greedy = sampling_metadata.temperature.to(device) == GREEDY_TEMPERATURE
    return torch.where(is_greedy[:, None], greedy, sampled)
