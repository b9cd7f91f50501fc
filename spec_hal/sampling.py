"""Family ``sampling``: verification from raw target logits with per-request sampling parameters.

An engine has logits and sampling parameters (temperature, top-k, top-p, min-p, a seed); the
``verify`` family takes processed probabilities and coins. This family closes the gap:

* ``process_logits(logits, temperature=, top_k=, top_p=, min_p=)``: logits (R, V) to the
  processed, renormalised probabilities (R, V) float32 of every row (an engine's normal sampler
  and the draft side reuse it);
* ``verify_sampling_from_logits(tree, candidates, target_logits, ...)`` (trees) and
  ``verify_chain_sampling_from_logits(draft_ids, draft_probs, target_logits, ...)`` (chains):
  exactly ``verify_sampling`` / ``verify_chain_sampling`` of ``process_logits`` of the logits,
  with coins from the request's seed and offset (or a torch.Generator, or the caller's coins), plus
  the logprob of every emitted token.

Greedy and sampled requests mix in one call: a request with temperature 0 gets a one-hot row at
the argmax, which makes the sampling walk accept exactly what ``verify_greedy`` accepts and emit
the argmax as the final token (whatever the coins), so one graph-capturable path serves both.

Processing (per row; every step exact and identical on every backend)
---------------------------------------------------------------------
1. ``x = float32(logits)`` with NaN as -inf and +inf as FLT_MAX (``draft_topk``'s order).
   ``m = max x``; ``argmax`` = the lowest id of the max.
2. Greedy rows (``temperature`` 0, or NaN/negative, which the checks reject where they can see
   them): weight ``2^39`` at ``argmax``, 0 elsewhere; top-k/top-p/min-p do not apply.
3. Sampled rows: a *level* per token, the scaled log2-distance to the max quantised to 1/1024:
   ``d = m - x`` (float32), ``e = d * c`` with ``c = float32(1024 * log2(e)) / float32(T)``
   (one float32 division, done once per request by torch on the device),
   ``level = 0 if d == 0 else floor(min(e, LEVEL_MAX))`` (NaN -> LEVEL_MAX), and the integer
   weight ``w = EXP2_TABLE[level % 1024] >> (level // 1024)`` with
   ``EXP2_TABLE[i] = round(2^39 * 2^(-i/1024))`` (computed in exact decimal arithmetic).
   So ``w ~ 2^39 * exp((x - m) / T)`` to within 0.07% (the quantisation of the logit to
   1/1024 of a halving), the max token weighs exactly 2^39, and weights below 1 (more than 40
   halvings below the max) are 0. A row whose max is -inf (all NaN/-inf) has no weight.
4. Three masks, each computed on these same weights (the temperature-scaled distribution) and
   intersected; none sees another's result:
   * top-k (k > 0 and k < V): keep the k heaviest tokens, equal weights (levels) to the lower
     id (``draft_topk``'s tie rule applied to the quantised weights: tokens within 1/1024 of a
     halving of each other rank by id; elsewhere exactly ``draft_topk``'s ids).
   * top-p (p < 1): with ``W`` the total weight, keep token v iff the weight of the tokens with a
     strictly *lower level* (strictly heavier) satisfies ``float64(above_v) < float64(p) *
     float64(W)``. Tokens tied at the cut level are kept together (the cut never depends on ids).
   * min-p (min_p > 0): keep iff ``w >= ceil(float64(min_p) * 2^39)`` (``p_v >= min_p * p_max``).
5. Renormalise: ``W' = sum of the kept weights`` (exact int64) and ``probs = float32(w) /
   float32(W')`` (one correctly rounded float32 division; 0 everywhere when W' = 0, which the
   verify fallback turns into id 0).

Where this matches and differs from the engines. vLLM (v1 sampler) divides by the temperature,
applies min-p on the softmax, then top-k, then top-p on the softmax of what top-k left (so its
top-p cut is relative to the top-k-renormalised mass). SGLang computes top-k, top-p and min-p
masks on the same temperature-scaled probabilities, as here. Differences from both: the
quantised exponential (so that integers agree on every backend), the tie rules (top-k ranks the
quantised weights, ties to the lower id; top-p keeps a tied cut level whole), and a strict ``<``
at the top-p cut (the smallest set whose mass reaches p, plus its ties).

Randomness (exactly one source per call; none needed when ``temperature`` is the number 0)
-------------------------------------------------------------------------------------------
* ``seed`` and ``offset`` (bs,) int64 tensors: counter-based, in the kernel, graph-safe. The coin
  of request b's node (or chain position) j is ``hash(seed[b], offset[b], j, ACCEPT)`` and its
  final coin ``hash(seed[b], offset[b], 0, FINAL)``; nothing else enters, so a request's result
  never depends on the batch it sits in or its row. ``hash`` folds the 32-bit words seed_lo,
  seed_hi, offset_lo, offset_hi, position, purpose into ``h = 0x9E3779B9`` one at a time as
  ``h = fmix32(h ^ word)`` (MurmurHash3's finaliser), then ``coin = (h >> 8) * 2^-24``. The library
  never advances ``offset``: the engine changes it per round (for example the request's number of
  generated tokens).
* ``generator``: a torch.Generator; coins are ``torch.rand((bs, N))`` then ``torch.rand((bs,))``
  drawn from it (eager use; batch-dependent by nature).
* ``coins`` and ``final_coins``: the caller's, as in ``verify_sampling``.

Route hint: ``max_top_k`` (the two verify ops), a Python int bounding the top-k of every sampled
request (temperature > 0), a top-k that is off (0, or >= V) counting as V. Results never depend
on it: a backend may use it to choose how to compute (the Triton provider chooses between
processing every row and the fused walk, whose top-k cut is cheap when every request's k is
small, without reading a top_k tensor on the host). A number ``top_k`` is checked against it; a
tensor in checked mode (its values are on the device), and the default mode trusts it, so a bound
that is too low costs time, never a wrong token. The reference ignores it.

Logprobs: ``logprobs="processed"`` gives ``log(probs[row, token])`` of the processed row,
``"raw"`` the log-softmax of the raw (sanitised, untempered) logits; ``(bs, S+1)`` float32 where
column k is the k-th emitted token (the accepted drafts, then the final token), NaN from
``accept_lens`` on. Floats: compared with tolerances, never bit-exact.
"""
from __future__ import annotations

import functools
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from typing import NamedTuple, Optional, Union

import torch

from . import checks, verify
from .device_buffers import allocate_persistent
from .registry import register_op
from .topk import sanitize_logits
from .types import DraftTree, Verdict

LEVEL_BITS = 10  # levels per halving of the probability: 2^10
WEIGHT_BITS = 39  # the max token weighs 2^39; V <= 2^23 keeps every sum below 2^62
LEVEL_MAX = (WEIGHT_BITS + 1) << LEVEL_BITS  # a level whose weight is 0
LOG2E_SCALED = float(torch.tensor(1.4426950408889634 * (1 << LEVEL_BITS), dtype=torch.float32))
ID_BITS = 23  # ids fit in 23 bits (verify.MAX_VOCAB)
# top_p <= 0 (invalid; the default mode applies a rule): the smallest nucleus, the tokens of the
# top level alone (their heavier mass is 0 < MIN_TOP_P * total; any other token's is >= 1).
MIN_TOP_P = 2.0**-100
PURPOSE_ACCEPT = 1
PURPOSE_FINAL = 2
LOGPROB_MODES = ("raw", "processed")

Number = Union[int, float]
# A per-request parameter: one Python number for every request, or a (rows,) tensor. The custom op
# (spec_hal/torch_library.py) passes it as two schema arguments, ``Scalar? <name>_number`` and
# ``Tensor? <name>_tensor``, exactly one of them set.
FloatParam = Union[float, torch.Tensor]
IntParam = Union[int, torch.Tensor]


class SampledVerdict(NamedTuple):
    """What the from-logits verify ops return: the Verdict; the emitted tokens' logprobs ((bs, S+1)
    float32, NaN past accept_lens) or None when not asked for; with ``top_logprobs=n`` the n
    most likely tokens at every emitted position ((bs, S+1, n) int64, -1 past accept_lens;
    descending, ties to the lower id) and their logprobs ((bs, S+1, n) float32, NaN past)."""

    verdict: Verdict
    logprobs: Optional[torch.Tensor]
    top_ids: Optional[torch.Tensor] = None
    top_logprobs: Optional[torch.Tensor] = None


@functools.lru_cache(maxsize=None)
def _exp2_table_cpu() -> torch.Tensor:
    with localcontext() as context:
        context.prec = 50
        values = [int((Decimal(2) ** (Decimal(WEIGHT_BITS) - Decimal(i) / (1 << LEVEL_BITS))).to_integral_value(rounding=ROUND_HALF_EVEN))
                  for i in range(1 << LEVEL_BITS)]
    return torch.tensor(values, dtype=torch.int64)


@functools.lru_cache(maxsize=None)
def _exp2_table_on(device: str) -> torch.Tensor:
    if torch.device(device).type == "cpu":
        return _exp2_table_cpu()
    # From pinned memory with non_blocking: a pageable host-to-device copy synchronises the host
    # (the conformance suite's no-sync guard caught it on the H100). The pinned source is kept
    # alive by _pinned_exp2_table's cache until the copy is done.
    target = torch.device(device)
    return allocate_persistent(target, lambda: _pinned_exp2_table().to(target, non_blocking=True))


@functools.lru_cache(maxsize=None)
def _pinned_exp2_table() -> torch.Tensor:
    return _exp2_table_cpu().pin_memory()


def exp2_table(device) -> torch.Tensor:
    """(1024,) int64: round(2^39 * 2^(-i/1024)), identical on every machine (decimal arithmetic).
    Cached per device (a cache, reset with ``_exp2_table_on.cache_clear()``): a call inside a graph
    capture must not copy from the host."""
    return _exp2_table_on(str(torch.device(device)))


# ----------------------------------------------------------------------------------------------
# checks


def _check_param(name: str, value, rows: int, device, *, low: float, high: float, low_open: bool, integer: bool = False):
    if isinstance(value, torch.Tensor):
        dtypes = checks.INDEX_DTYPES if integer else (torch.float32,)
        checks.tensor(name, value, dtypes=dtypes, device=device, shape=(rows,))
        # Values only in checked mode, on every device: the default mode applies row_params's
        # rules (and a cpu tensor would otherwise raise where a device tensor applies them).
        if checks.value_checks_enabled():
            bad = ~((value > low) if low_open else (value >= low)) | ~(value <= high)
            if bool(bad.any()):
                raise checks.InvalidInput(name, f"values in {'(' if low_open else '['}{low}, {high}]", value[bad][:4].tolist())
        return
    if isinstance(value, bool) or not isinstance(value, (int,) if integer else (int, float)):
        raise checks.InvalidInput(name, f"a Python {'int' if integer else 'number'} or a ({rows},) tensor", type(value).__name__)
    ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        raise checks.InvalidInput(name, f"a value in {'(' if low_open else '['}{low}, {high}]", value)


def _check_sampling_params(rows: int, device, temperature, top_k, top_p, min_p) -> None:
    _check_param("temperature", temperature, rows, device, low=0.0, high=float("inf"), low_open=False)
    _check_param("top_k", top_k, rows, device, low=0, high=2**62, low_open=False, integer=True)
    _check_param("top_p", top_p, rows, device, low=0.0, high=1.0, low_open=True)
    _check_param("min_p", min_p, rows, device, low=0.0, high=1.0, low_open=False)


def top_k_or_vocab(top_k, vocab: int):
    """A request's top-k with a top-k that is off (outside (0, V)) as V, the bound ``max_top_k``
    compares with: a number for a number, a tensor for a tensor."""
    if isinstance(top_k, torch.Tensor):
        return torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    return top_k if 0 < top_k < vocab else vocab


def _check_max_top_k(max_top_k, temperature, top_k, vocab: int) -> None:
    """None, or an int >= 1 at least every sampled request's top-k (a top-k that is off counting
    as V; module docstring, "Route hint"). A number ``top_k`` is checked always (unless the
    temperature is the number 0: no request samples), a tensor in checked mode only, where
    requests whose temperature tensor entry is not > 0 (greedy) are left out. Call after
    ``_check_sampling_params``."""
    if max_top_k is None:
        return
    checks.integer("max_top_k", max_top_k, low=1)
    greedy = not isinstance(temperature, torch.Tensor) and not temperature > 0
    if greedy or (isinstance(top_k, torch.Tensor) and not checks.value_checks_enabled()):
        return
    highest = top_k_or_vocab(top_k, vocab)
    if isinstance(top_k, torch.Tensor):
        if isinstance(temperature, torch.Tensor):
            highest = torch.where(temperature > 0, highest, 0)
        highest = int(highest.max()) if highest.numel() else 0
    if highest > max_top_k:
        raise checks.InvalidInput("max_top_k", f"an int >= every sampled request's top-k (off counts as V = {vocab})", max_top_k)


def _check_logits(name: str, value, rows: int, device) -> int:
    """(rows, V) or (bs, rows/bs, V) float logits; returns V."""
    checks.tensor(name, value, dtypes=checks.FLOAT_DTYPES, device=device)
    flat_rows = value.shape[0] * value.shape[1] if value.dim() == 3 else value.shape[0] if value.dim() == 2 else -1
    if flat_rows == rows and 1 <= value.shape[-1] <= verify.MAX_VOCAB:
        return value.shape[-1]
    raise checks.InvalidInput(name, f"logits with {rows} rows, (rows, V) or (bs, rows/bs, V), 1 <= V <= {verify.MAX_VOCAB}",
                              f"shape {tuple(value.shape)}")


def _check_randomness(bs: int, width: int, device, temperature, seed, offset, generator, coins, final_coins) -> None:
    sources = [name for name, value in (("seed", seed), ("offset", offset), ("generator", generator), ("coins", coins),
                                        ("final_coins", final_coins)) if value is not None]
    kinds = {"seed": "seed", "offset": "seed", "generator": "generator", "coins": "coins", "final_coins": "coins"}
    chosen = {kinds[name] for name in sources}
    if len(chosen) > 1:
        second = next(name for name in sources if kinds[name] != kinds[sources[0]])
        raise checks.InvalidInput(second, "exactly one source of randomness (seed+offset, generator, or coins+final_coins)",
                                  f"{', '.join(sources)}")
    if not chosen:
        if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature == 0:
            return
        raise checks.InvalidInput("seed", "a source of randomness for sampled requests (seed+offset, generator or coins)", "none")
    if "seed" in chosen:
        checks.tensor("seed", seed, dtypes=(torch.int64,), device=device, shape=(bs,))
        checks.tensor("offset", offset, dtypes=(torch.int64,), device=device, shape=(bs,))
    elif "generator" in chosen:
        if not isinstance(generator, torch.Generator):
            raise checks.InvalidInput("generator", "a torch.Generator", type(generator).__name__)
        if torch.device(generator.device).type != device.type:
            raise checks.InvalidInput("generator", f"a generator on {device.type}", f"one on {generator.device}")
    else:
        checks.tensor("coins", coins, dtypes=(torch.float32,), device=device, shape=(bs, width))
        checks.tensor("final_coins", final_coins, dtypes=(torch.float32,), device=device, shape=(bs,))


def _check_logprobs(logprobs, top_logprobs, vocab: int) -> None:
    if logprobs is not None and logprobs not in LOGPROB_MODES:
        raise checks.InvalidInput("logprobs", f"None or one of {LOGPROB_MODES}", logprobs)
    checks.integer("top_logprobs", top_logprobs, low=0, high=vocab)
    if top_logprobs and logprobs is None:
        raise checks.InvalidInput("logprobs", "'raw' or 'processed' when top_logprobs > 0", None)


def check_process_logits(logits, *, temperature, top_k=0, top_p=1.0, min_p=0.0, out=None) -> None:
    checks.tensor("logits", logits, ndim=2, dtypes=checks.FLOAT_DTYPES)
    rows, vocab = logits.shape
    if not 1 <= vocab <= verify.MAX_VOCAB:
        raise checks.InvalidInput("logits", f"1 <= V <= {verify.MAX_VOCAB} columns", f"shape {tuple(logits.shape)}")
    _check_sampling_params(rows, logits.device, temperature, top_k, top_p, min_p)
    if out is not None:
        checks.out_tensors("out", (out,), [((rows, vocab), torch.float32)], logits.device)


def check_verify_sampling_from_logits(tree, candidates, target_logits, *, temperature, top_k=0, top_p=1.0, min_p=0.0, seed=None,
                                      offset=None, generator=None, coins=None, final_coins=None, logprobs=None, top_logprobs=0,
                                      out=None, max_top_k=None) -> None:
    bs, nodes, device = verify._check_tree(tree)
    checks.tensor("candidates", candidates, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs, nodes))
    vocab = _check_logits("target_logits", target_logits, bs * nodes, device)
    _check_sampling_params(bs, device, temperature, top_k, top_p, min_p)
    _check_max_top_k(max_top_k, temperature, top_k, vocab)
    _check_randomness(bs, nodes, device, temperature, seed, offset, generator, coins, final_coins)
    _check_logprobs(logprobs, top_logprobs, vocab)
    verify._check_verdict_out(out, bs, nodes, tree.num_steps + 1, device)
    if checks.value_checks_enabled():
        verify.record_walk_values("verify_sampling_from_logits", tree, candidates, vocab)


def check_verify_chain_sampling_from_logits(draft_ids, draft_probs, target_logits, *, temperature, top_k=0, top_p=1.0, min_p=0.0,
                                            seed=None, offset=None, generator=None, coins=None, final_coins=None, logprobs=None,
                                            top_logprobs=0, out=None, max_top_k=None) -> None:
    checks.tensor("draft_ids", draft_ids, ndim=2, dtypes=checks.INDEX_DTYPES)
    bs, steps = draft_ids.shape
    device = draft_ids.device
    vocab = _check_logits("target_logits", target_logits, bs * (steps + 1), device)
    if draft_probs is not None and verify._check_probs("draft_probs", draft_probs, bs, steps, device) != vocab:
        raise checks.InvalidInput("draft_probs", f"the vocabulary of target_logits (V = {vocab})", f"shape {tuple(draft_probs.shape)}")
    _check_sampling_params(bs, device, temperature, top_k, top_p, min_p)
    _check_max_top_k(max_top_k, temperature, top_k, vocab)
    _check_randomness(bs, steps, device, temperature, seed, offset, generator, coins, final_coins)
    _check_logprobs(logprobs, top_logprobs, vocab)
    verify._check_verdict_out(out, bs, steps + 1, steps + 1, device)
    if checks.value_checks_enabled():
        verify.record_token_ids("verify_chain_sampling_from_logits", "draft_ids", draft_ids, vocab)


# ----------------------------------------------------------------------------------------------
# per-row parameters (shared by the reference and the kernels' host functions: torch ops on the
# device, no host sync, identical by construction)


class RowParams(NamedTuple):
    """Per-request processing parameters, normalised. All (P,) tensors on the logits' device.

    greedy: bool; scale: float32 ``c`` of step 3 (1.0 on greedy rows); top_k: int64 (0 = off,
    also for k >= V); top_p: float64 (1.0 = off); min_weight: int64 ``ceil(min_p * 2^39)``."""

    greedy: torch.Tensor
    scale: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_weight: torch.Tensor


def _as_tensor(value, count: int, dtype, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(dtype)
    return torch.full((count,), value, dtype=dtype, device=device)


def row_params(count: int, vocab: int, device, temperature, top_k, top_p, min_p) -> RowParams:
    """Normalise per-request (or scalar) parameters into (count,) tensors (see RowParams)."""
    temperature = _as_tensor(temperature, count, torch.float32, device)
    greedy = ~(temperature > 0)
    scale = torch.where(greedy, torch.ones_like(temperature), torch.full_like(temperature, LOG2E_SCALED) / temperature)
    top_k = _as_tensor(top_k, count, torch.int64, device)
    top_k = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.zeros_like(top_k))
    top_p = _as_tensor(top_p, count, torch.float32, device).to(torch.float64)
    top_p = torch.where(top_p < 1, top_p, torch.ones_like(top_p))  # NaN: off
    top_p = torch.where(top_p > 0, top_p, torch.full_like(top_p, MIN_TOP_P))  # <= 0: the top level alone
    min_p = _as_tensor(min_p, count, torch.float32, device).to(torch.float64)
    min_p = torch.where(min_p > 0, torch.where(min_p < 1, min_p, torch.ones_like(min_p)), torch.zeros_like(min_p))
    min_weight = torch.ceil(min_p * float(2**WEIGHT_BITS)).to(torch.int64)
    return RowParams(greedy, scale, top_k, top_p, min_weight)


def expand_rows(params: RowParams, rows_per_request: int) -> RowParams:
    return RowParams(*(value.repeat_interleave(rows_per_request) for value in params))


# ----------------------------------------------------------------------------------------------
# reference semantics (vectorised over rows)


def rank_keys(level: torch.Tensor) -> torch.Tensor:
    """(R, V) int64 keys, unique per row, ascending = heavier first: level, then id."""
    ids = torch.arange(level.shape[1], dtype=torch.int64, device=level.device)
    return level * 2**ID_BITS + ids


def levels_and_weights(x: torch.Tensor, row_max: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3: (level, weight) int64 (R, V) of sanitised float32 logits."""
    distance = row_max[:, None] - x
    scaled = distance * scale[:, None]
    level_max = torch.full_like(scaled, float(LEVEL_MAX))
    level = torch.where(scaled < LEVEL_MAX, scaled, level_max)  # NaN -> LEVEL_MAX
    level = torch.where(distance == 0, torch.zeros_like(level), level).to(torch.int64)
    table = exp2_table(x.device)
    weight = table[level & ((1 << LEVEL_BITS) - 1)] >> (level >> LEVEL_BITS)
    return level, weight


def processed_weights(logits: torch.Tensor, params: RowParams) -> torch.Tensor:
    """Steps 1-4: the kept integer weights (R, V) int64."""
    x = sanitize_logits(logits)
    rows, vocab = x.shape
    row_max = x.max(dim=1).values if vocab else torch.zeros(rows, device=x.device)
    level, weight = levels_and_weights(x, row_max, params.scale)
    keep = torch.ones_like(weight, dtype=torch.bool)
    # top-k: the k-th smallest (level, id) key is the cut.
    keys = rank_keys(level)
    cut = keys.sort(dim=1).values.gather(1, (params.top_k - 1).clamp(min=0)[:, None])
    keep &= (params.top_k[:, None] == 0) | (keys <= cut)
    # top-p: the weight of the strictly heavier tokens (lower level), found by searchsorted.
    sorted_levels, order = level.sort(dim=1, stable=True)
    inclusive = weight.gather(1, order).cumsum(dim=1)
    heavier_count = torch.searchsorted(sorted_levels, level, side="left")
    above = torch.where(heavier_count > 0, inclusive.gather(1, (heavier_count - 1).clamp(min=0)), torch.zeros_like(weight))
    total = weight.sum(dim=1)
    bound = params.top_p * total.to(torch.float64)
    keep &= (params.top_p[:, None] >= 1) | (above.to(torch.float64) < bound[:, None])
    keep &= weight >= params.min_weight[:, None]
    kept = torch.where(keep, weight, torch.zeros_like(weight))
    # Greedy rows: one-hot at the argmax (draft_topk's order), whatever the row holds.
    argmax = x.argmax(dim=1)
    one_hot = torch.zeros_like(weight)
    one_hot.scatter_(1, argmax[:, None], 2**WEIGHT_BITS)
    return torch.where(params.greedy[:, None], one_hot, kept)


def weights_to_probs(kept: torch.Tensor) -> torch.Tensor:
    """Step 5: float32(w) / float32(W') per row, 0 where W' = 0."""
    total = kept.sum(dim=1, keepdim=True)
    probs = kept.to(torch.float32) / total.to(torch.float32).clamp(min=1.0)
    return torch.where(total > 0, probs, torch.zeros_like(probs))


def raw_logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """(R,) float32 log-sum-exp of the sanitised logits; -inf for rows without a finite value."""
    x = sanitize_logits(logits)
    return torch.logsumexp(x, dim=1)


def fake_process_logits(logits, *, temperature, top_k=0, top_p=1.0, min_p=0.0, out=None) -> torch.Tensor:
    return logits.new_empty(logits.shape, dtype=torch.float32)


@register_op("process_logits", family="sampling", check=check_process_logits, fake=fake_process_logits)
def process_logits(logits: torch.Tensor, *, temperature: FloatParam, top_k: IntParam = 0, top_p: FloatParam = 1.0,
                   min_p: FloatParam = 0.0, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Logits to processed, renormalised probabilities (the module docstring defines every step).

    Args:
        logits: (R, V) float32/bfloat16/float16/float64; any strides.
        temperature: number or (R,) float32 tensor, >= 0 (0 = greedy: one-hot at the argmax).
        top_k: int or (R,) int32/int64 tensor, >= 0 (0 = off).
        top_p: number or (R,) float32 tensor in (0, 1] (1 = off).
        min_p: number or (R,) float32 tensor in [0, 1] (0 = off).
        out: optional contiguous (R, V) float32 buffer.

    Returns:
        (R, V) float32 probabilities; each row sums to 1 up to float32 rounding, or is all 0 when
        the row has no finite logit and is sampled.
    """
    rows, vocab = logits.shape
    params = row_params(rows, vocab, logits.device, temperature, top_k, top_p, min_p)
    probs = weights_to_probs(processed_weights(logits, params))
    if out is None:
        return probs
    out.copy_(probs)
    return out


# ----------------------------------------------------------------------------------------------
# randomness


def _mul32(a: torch.Tensor, b: int) -> torch.Tensor:
    """(a * b) mod 2^32 for a in [0, 2^32) int64 and a 32-bit constant b, without int64 overflow."""
    low = (a & 0xFFFF) * b
    high = ((a >> 16) * b) & 0xFFFF
    return (low + (high << 16)) & 0xFFFFFFFF


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding uint32 values."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def hash_coins(seed: torch.Tensor, offset: torch.Tensor, positions: torch.Tensor, purpose: int) -> torch.Tensor:
    """Counter-based coins in [0, 1 - 2^-24]: (bs, P) float32 for (bs,) int64 seed/offset and
    (P,) int64 request-local positions (see the module docstring for the keying)."""
    seed, offset = seed.to(torch.int64)[:, None], offset.to(torch.int64)[:, None]
    positions = positions.to(torch.int64)[None, :]
    words = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, offset & 0xFFFFFFFF, (offset >> 32) & 0xFFFFFFFF, positions & 0xFFFFFFFF)
    h = torch.full((seed.shape[0], positions.shape[1]), 0x9E3779B9, dtype=torch.int64, device=seed.device)
    for word in words:
        h = fmix32(h ^ word)
    h = fmix32(h ^ purpose)
    return (h >> 8).to(torch.float32) * 2.0**-24


def draw_coins(bs: int, width: int, device, *, seed, offset, generator, coins, final_coins) -> tuple[torch.Tensor, torch.Tensor]:
    """(coins (bs, width), final_coins (bs,)) float32 from the call's source of randomness
    (zeros when none was needed: an all-greedy call)."""
    if coins is not None:
        return coins, final_coins
    if seed is not None:
        positions = torch.arange(width, dtype=torch.int64, device=device)
        accept = hash_coins(seed, offset, positions, PURPOSE_ACCEPT)
        final = hash_coins(seed, offset, torch.zeros(1, dtype=torch.int64, device=device), PURPOSE_FINAL)[:, 0]
        return accept, final
    if generator is not None:
        accept = torch.rand((bs, width), generator=generator, device=device)
        return accept, torch.rand((bs,), generator=generator, device=device)
    return torch.zeros(bs, width, device=device), torch.zeros(bs, device=device)


# ----------------------------------------------------------------------------------------------
# logprobs of the emitted tokens


def _token_logprobs(mode: str, rows: torch.Tensor, tokens: torch.Tensor, probs: Optional[torch.Tensor], logits: torch.Tensor,
                    lse: Optional[torch.Tensor]) -> torch.Tensor:
    """float32 logprobs, processed or raw, of ``tokens`` (n, m) in rows ``rows`` (n,). Only the
    gathered values are taken the log of: an elementwise log of the whole rows (n, V) cost 135 us
    a call at bs 64 N 4 V 151936 on the H200 (a log and a gather over 155 MB, where the verify's
    kernels took 1.7 ms), for the same values."""
    if mode == "processed":
        return torch.log(probs[rows[:, None], tokens])
    x = sanitize_logits(logits[rows[:, None], tokens])
    row_lse = lse[rows, None]
    return torch.where(row_lse > float("-inf"), x - row_lse, torch.full_like(x, float("-inf")))


def sampled_verdict(verdict: Verdict, mode: Optional[str], top_n: int, probs: Optional[torch.Tensor], logits: torch.Tensor,
                    lse: Optional[torch.Tensor]) -> SampledVerdict:
    """The SampledVerdict of a from-logits verify: logprobs of the token emitted at path node k
    (its predict) in column k, from the processed ``probs`` (R, V) or the raw ``logits`` (R, V)
    with their log-sum-exp ``lse`` (R,); and the ``top_n`` alternatives of those rows (ranked by
    the same logprobs; ties to the lower id). Rows off the path: NaN / -1."""
    if mode is None:
        return SampledVerdict(verdict, None)
    accept = verdict.accept_index.to(torch.int64)
    on_path = accept >= 0
    rows = accept.clamp(min=0).reshape(-1)
    tokens = verdict.predict.to(torch.int64)[rows].clamp(min=0)
    values = _token_logprobs(mode, rows, tokens[:, None], probs, logits, lse)[:, 0].reshape(accept.shape)
    values = torch.where(on_path, values, torch.full_like(values, float("nan")))
    if not top_n:
        return SampledVerdict(verdict, values)
    # Ranked by the exact values (the processed probabilities or the sanitised logits, never their
    # rounded logs, so ids agree on every backend); a stable descending sort puts the lower id
    # first among equals.
    ranking = probs[rows] if mode == "processed" else sanitize_logits(logits[rows])
    top_ids = torch.sort(ranking, dim=1, descending=True, stable=True).indices[:, :top_n]
    top_values = _token_logprobs(mode, rows, top_ids, probs, logits, lse)
    shape = (*accept.shape, top_n)
    top_ids = torch.where(on_path[..., None], top_ids[:, :top_n].reshape(shape), torch.full(shape, -1, dtype=torch.int64, device=accept.device))
    top_values = torch.where(on_path[..., None], top_values[:, :top_n].reshape(shape), torch.full(shape, float("nan"), device=accept.device))
    return SampledVerdict(verdict, values, top_ids, top_values)


# ----------------------------------------------------------------------------------------------
# verification from logits


def fake_sampled_verdict(verdict: Verdict, logprobs: Optional[str], top_logprobs: int) -> SampledVerdict:
    """SampledVerdict of empty tensors around a fake ``verdict`` (shapes of :func:`sampled_verdict`)."""
    if logprobs is None:
        return SampledVerdict(verdict, None)
    like = verdict.accept_index
    shape = tuple(like.shape)
    values = like.new_empty(shape, dtype=torch.float32)
    if not top_logprobs:
        return SampledVerdict(verdict, values)
    return SampledVerdict(verdict, values, like.new_empty((*shape, top_logprobs), dtype=torch.int64),
                          like.new_empty((*shape, top_logprobs), dtype=torch.float32))


def sampled_result_fields(values: dict) -> dict:
    """The optional tensors a from-logits verify leaves None, from its bound arguments (the
    custom op returns them empty)."""
    absent = {}
    if values["logprobs"] is None:
        absent["logprobs"] = None
    if values["logprobs"] is None or not values["top_logprobs"]:
        absent["top_ids"] = absent["top_logprobs"] = None
    return absent


def fake_verify_sampling_from_logits(tree, candidates, target_logits, *, temperature, top_k=0, top_p=1.0, min_p=0.0, seed=None,
                                     offset=None, generator=None, coins=None, final_coins=None, logprobs=None, top_logprobs=0,
                                     out=None, max_top_k=None) -> SampledVerdict:
    bs, nodes = candidates.shape
    return fake_sampled_verdict(verify.fake_verdict(candidates, bs, nodes, tree.num_steps + 1), logprobs, top_logprobs)


@register_op("verify_sampling_from_logits", family="sampling", check=check_verify_sampling_from_logits,
             fake=fake_verify_sampling_from_logits, result_fields=sampled_result_fields)
def verify_sampling_from_logits(
    tree: DraftTree,
    candidates: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    temperature: FloatParam,
    top_k: IntParam = 0,
    top_p: FloatParam = 1.0,
    min_p: FloatParam = 0.0,
    seed: Optional[torch.Tensor] = None,
    offset: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
    coins: Optional[torch.Tensor] = None,
    final_coins: Optional[torch.Tensor] = None,
    logprobs: Optional[str] = None,
    top_logprobs: int = 0,
    out: Optional[Verdict] = None,
    max_top_k: Optional[int] = None,
) -> SampledVerdict:
    """Tree verification from raw target logits with per-request sampling parameters.

    Exactly ``verify_sampling(tree, candidates, process_logits(target_logits, params per row),
    coins, final_coins)`` (thresholds 1), with the coins drawn as the module docstring says.
    Requests with temperature 0 get exactly ``verify_greedy`` on the logits.

    Args:
        tree: a DraftTree (bs requests, N nodes, S steps).
        candidates: (bs, N) int32/int64 node tokens.
        target_logits: (bs*N, V) or (bs, N, V) float32/bfloat16/float16/float64; any strides.
        temperature, top_k, top_p, min_p: per request, a number or a (bs,) tensor (see
            ``process_logits``).
        seed, offset: (bs,) int64, the counter-based RNG's key (graph-safe); or ``generator``;
            or ``coins`` (bs, N) and ``final_coins`` (bs,) float32. Exactly one source; none
            when ``temperature`` is the number 0.
        logprobs: None, "raw" or "processed".
        top_logprobs: n >= 0: also the n most likely tokens (by the same logprobs) at every
            emitted position, with their logprobs.
        out: optional Verdict of contiguous int32 buffers.
        max_top_k: optional int >= every sampled request's top-k (off counts as V): a route hint
            that never changes the result (module docstring, "Route hint"); ignored here.

    Returns:
        SampledVerdict(verdict, logprobs (bs, S+1) float32 or None, top_ids, top_logprobs).
    """
    bs, nodes = candidates.shape
    vocab = target_logits.shape[-1]
    logits = target_logits.reshape(bs * nodes, vocab)
    params = expand_rows(row_params(bs, vocab, logits.device, temperature, top_k, top_p, min_p), nodes)
    probs = weights_to_probs(processed_weights(logits, params))
    accept_coins, final = draw_coins(bs, nodes, logits.device, seed=seed, offset=offset, generator=generator, coins=coins,
                                     final_coins=final_coins)
    verdict = verify.verify_sampling(tree, candidates, probs, accept_coins, final, out=out)
    lse = raw_logsumexp(logits) if logprobs == "raw" else None
    return sampled_verdict(verdict, logprobs, top_logprobs, probs, logits, lse)


def one_hot_draft_probs(draft_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """(bs, S, V) float32: 1 at each in-vocabulary draft id (a greedy drafter's q)."""
    ids = draft_ids.to(torch.int64)
    probs = torch.zeros(*ids.shape, vocab, dtype=torch.float32, device=ids.device)
    in_vocab = ((ids >= 0) & (ids < vocab)).to(torch.float32)
    probs.scatter_(2, ids.clamp(0, vocab - 1)[:, :, None], in_vocab[:, :, None])
    return probs


def fake_verify_chain_sampling_from_logits(draft_ids, draft_probs, target_logits, *, temperature, top_k=0, top_p=1.0, min_p=0.0,
                                           seed=None, offset=None, generator=None, coins=None, final_coins=None, logprobs=None,
                                           top_logprobs=0, out=None, max_top_k=None) -> SampledVerdict:
    bs, steps = draft_ids.shape
    return fake_sampled_verdict(verify.fake_verdict(draft_ids, bs, steps + 1, steps + 1), logprobs, top_logprobs)


@register_op("verify_chain_sampling_from_logits", family="sampling", check=check_verify_chain_sampling_from_logits,
             fake=fake_verify_chain_sampling_from_logits, result_fields=sampled_result_fields)
def verify_chain_sampling_from_logits(
    draft_ids: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    target_logits: torch.Tensor,
    *,
    temperature: FloatParam,
    top_k: IntParam = 0,
    top_p: FloatParam = 1.0,
    min_p: FloatParam = 0.0,
    seed: Optional[torch.Tensor] = None,
    offset: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
    coins: Optional[torch.Tensor] = None,
    final_coins: Optional[torch.Tensor] = None,
    logprobs: Optional[str] = None,
    top_logprobs: int = 0,
    out: Optional[Verdict] = None,
    max_top_k: Optional[int] = None,
) -> SampledVerdict:
    """Chain rejection sampling from raw target logits with per-request sampling parameters.

    Exactly ``verify_chain_sampling(draft_ids, q, process_logits(target_logits, params per row),
    coins, final_coins)`` where ``q = draft_probs``, or a one-hot row at each draft id when
    ``draft_probs`` is None (a greedy drafter: then step s accepts iff ``u_s < p(x_s)`` and the
    final token samples p without the rejected token). Coins: chain position s (0-based) uses
    the coin of position s, the final token the final coin.

    Args:
        draft_ids: (bs, S) int32/int64.
        draft_probs: None or (bs, S, V) / (bs*S, V) float32, the distributions the drafts were
            drawn from (for example ``process_logits`` of the draft logits).
        target_logits: (bs*(S+1), V) or (bs, S+1, V) float logits at the root and each draft.
        temperature, top_k, top_p, min_p, seed, offset, generator, coins (bs, S), final_coins,
            logprobs, top_logprobs, out, max_top_k: as in ``verify_sampling_from_logits``.

    Returns:
        SampledVerdict over a chain of N = S+1 nodes.
    """
    bs, steps = draft_ids.shape
    nodes = steps + 1
    vocab = target_logits.shape[-1]
    logits = target_logits.reshape(bs * nodes, vocab)
    params = expand_rows(row_params(bs, vocab, logits.device, temperature, top_k, top_p, min_p), nodes)
    probs = weights_to_probs(processed_weights(logits, params))
    accept_coins, final = draw_coins(bs, steps, logits.device, seed=seed, offset=offset, generator=generator, coins=coins,
                                     final_coins=final_coins)
    q = one_hot_draft_probs(draft_ids, vocab) if draft_probs is None else draft_probs
    verdict = verify.verify_chain_sampling(draft_ids, q, probs, accept_coins, final, out=out)
    lse = raw_logsumexp(logits) if logprobs == "raw" else None
    return sampled_verdict(verdict, logprobs, top_logprobs, probs, logits, lse)
