"""FlashInfer's speculative-sampling and sampling entry points over spec_hal's native ops.

    from spec_hal.compat import flashinfer   # where an engine does: import flashinfer.sampling as flashinfer

Names, argument order, dtypes and outputs follow ``flashinfer/sampling.py`` of
flashinfer-ai/flashinfer (read at commit fb28d72). The work runs on the spec_hal backend for the
tensors' device. What differs (also in ``docs/compat.md``):

* Random numbers: FlashInfer draws Philox numbers inside its kernels from ``generator`` or
  ``seed``/``offset``; spec_hal draws float32 uniforms with ``torch.rand`` from the same
  ``generator`` (or, for an int ``seed``, from a generator seeded with ``seed`` and ``offset``) and
  passes them to the native op, so results are reproducible for a given generator state but not
  equal draw-for-draw to FlashInfer's. Tensor ``seed``/``offset`` (FlashInfer's graph-capture
  form) are refused: capture the ``uniform_samples=`` form instead.
* ``uniform_samples=``: the coins of older FlashInfer releases are accepted as a keyword
  (``chain_speculative_sampling``: (bs, S+1), S step coins then the final coin;
  ``sampling_from_probs``: (bs,), also accepted positionally in place of ``indices`` as the older
  signature had it).
* Sampling is exact integer inverse-CDF with a strict ``<`` (native ``verify_chain_sampling``);
  FlashInfer uses float block scans. Chain acceptance is ``u * q < p`` (FlashInfer ``u < p / q``).
* ``deterministic`` and ``enable_pdl`` are accepted and ignored (spec_hal is always
  deterministic; launch attributes are the backend's business).
* ``chain_speculative_sampling``'s accepted count (each draft's test on its own) is the native
  op's ``passed_counts`` output; the emitted count is its ``num_correct``.
* top-k/top-p renormalisation keeps every entry tied with the boundary value; it and softmax are
  compat-owned PyTorch, because ``spec_hal.process_logits`` quantises its weights and ranks top-k
  by quantised level (``spec_hal/compat/_probs.py``, ``docs/compat.md``).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from .. import checks
from ..errors import InvalidInput
from ..verify import sanitize_probs
from . import _probs

Number = Union[int, float]


def _generator_for(device: torch.device, generator: Optional[torch.Generator], seed, offset) -> Optional[torch.Generator]:
    """The generator coins are drawn from: ``generator``, or one seeded from an int ``seed`` and ``offset``."""
    if seed is None and offset is None:
        return generator
    if isinstance(seed, torch.Tensor) or isinstance(offset, torch.Tensor):
        raise InvalidInput("seed", "an int (tensor seeds are FlashInfer's Philox graph form; pass uniform_samples= instead)",
                           type(seed).__name__)
    if generator is not None:
        raise InvalidInput("seed", "None when generator is given", seed)
    seeded = torch.Generator(device=device)
    seeded.manual_seed((int(seed or 0) * 1_000_003 + int(offset or 0)) % (2**63))
    return seeded


def _checked(name: str, probs: object, check_nan: bool) -> torch.Tensor:
    """``probs`` checked as a (bs, V) float tensor; with ``check_nan``, NaN refused as upstream."""
    probs = _probs.check_probs(name, probs)
    if check_nan and bool(torch.isnan(probs).any()):  # a host sync, as upstream's check
        raise ValueError("Input probs contains NaN.")
    return probs


# ----------------------------------------------------------------------------------------------
# speculative sampling


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: Optional[torch.Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    seed: Optional[int] = None,
    offset: Optional[int] = None,
    *,
    uniform_samples: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chain speculative sampling (native: ``spec_hal.verify_chain_sampling``).

    Args:
        draft_probs: (bs, S, V) float32 draft distributions.
        draft_token_ids: (bs, S) int32/int64 drafted tokens.
        target_probs: (bs, S+1, V) float32 target distributions.
        maybe_output_accepted_token_num: optional (bs,) int32; the number of drafts that pass the
            test independently of earlier rejections is ADDED to it in place.
        maybe_output_emitted_draft_token_num: optional (bs,) int32; the number of emitted drafts
            (accepted before the first rejection) is ADDED to it in place.
        deterministic: ignored. generator, seed, offset: where the coins come from.
        uniform_samples: optional (bs, S+1) float32 coins (older FlashInfer): S step coins, then
            the final token's coin.

    Returns:
        output_token_ids (bs, S+1) int32: accepted drafts, then the final token, then -1;
        output_accepted_token_num (bs,) int32; output_emitted_draft_token_num (bs,) int32.
    """
    import spec_hal

    checks.tensor("draft_probs", draft_probs, ndim=3, dtypes=(torch.float32,))
    bs, steps, vocab = draft_probs.shape
    device = draft_probs.device
    checks.tensor("draft_token_ids", draft_token_ids, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs, steps))
    checks.tensor("target_probs", target_probs, dtypes=(torch.float32,), device=device, shape=(bs, steps + 1, vocab))
    for name, value in (("maybe_output_accepted_token_num", maybe_output_accepted_token_num),
                        ("maybe_output_emitted_draft_token_num", maybe_output_emitted_draft_token_num)):
        if value is not None:
            checks.tensor(name, value, dtypes=(torch.int32,), device=device, shape=(bs,))
    if uniform_samples is not None:
        checks.tensor("uniform_samples", uniform_samples, dtypes=(torch.float32,), device=device, shape=(bs, steps + 1))
        coins, final_coins = uniform_samples[:, :steps].contiguous(), uniform_samples[:, steps].contiguous()
    else:  # one draw: the step coins (bs, S) then the final coins (bs,), both contiguous views
        uniforms = _probs.draw_uniform((bs * (steps + 1),), device, _generator_for(device, generator, seed, offset))
        coins, final_coins = uniforms[:bs * steps].view(bs, steps), uniforms[bs * steps:]
    # FlashInfer's accepted count (each draft's test on its own) comes from the native kernel,
    # which decides every step anyway: written into a fresh buffer, added to the caller's.
    passed = torch.empty((bs,), dtype=torch.int32, device=device)
    verdict = spec_hal.verify_chain_sampling(draft_token_ids, draft_probs, target_probs, coins, final_coins, passed_counts=passed)
    accepted, emitted = passed, verdict.num_correct
    if maybe_output_accepted_token_num is not None:
        accepted = maybe_output_accepted_token_num.add_(passed)
    if maybe_output_emitted_draft_token_num is not None:
        emitted = maybe_output_emitted_draft_token_num.add_(emitted)
    return verdict.predict.view(bs, steps + 1), accepted, emitted


# ----------------------------------------------------------------------------------------------
# probability processing


def softmax(logits: torch.Tensor, temperature: Optional[Union[torch.Tensor, float]] = None, enable_pdl: Optional[bool] = None) -> torch.Tensor:
    """(bs, V) float32 ``softmax(logits / temperature)``; ``temperature`` a float or (bs,) tensor."""
    del enable_pdl
    return _probs.softmax_with_temperature(_probs.check_probs("logits", logits), temperature)


def top_k_renorm_probs(probs: torch.Tensor, top_k: Union[torch.Tensor, int]) -> torch.Tensor:
    """(bs, V), the dtype of ``probs``: the top-k entries of each row renormalised (ties kept)."""
    probs = _probs.check_probs("probs", probs)
    return _probs.top_k_renorm(probs, top_k).to(probs.dtype)


def top_p_renorm_probs(probs: torch.Tensor, top_p: Union[torch.Tensor, float], is_deterministic: bool = False) -> torch.Tensor:
    """(bs, V) float32: the top-p nucleus of each row renormalised (ties at the boundary kept).
    ``is_deterministic`` is ignored (always deterministic)."""
    del is_deterministic
    return _probs.top_p_renorm(_probs.check_probs("probs", probs), top_p)


top_k_renorm_prob = top_k_renorm_probs
top_p_renorm_prob = top_p_renorm_probs


def _min_p_filter(probs: torch.Tensor, min_p: Union[torch.Tensor, float]) -> torch.Tensor:
    """Keep entries ``>= min_p * max(row)``, renormalised."""
    threshold = _probs.per_row("min_p", min_p, probs.shape[0], probs.device, torch.float32) * probs.amax(dim=1, keepdim=True)
    kept = torch.where(probs >= threshold, probs, torch.zeros_like(probs))
    total = kept.sum(dim=1, keepdim=True)
    return torch.where(total > 0, kept / torch.where(total > 0, total, torch.ones_like(total)), kept)


# ----------------------------------------------------------------------------------------------
# sampling from probabilities (native: verify_chain_sampling with zero drafts, see _probs.sample_rows)


def _sample(probs: torch.Tensor, indices, generator, seed, offset, return_valid: bool = False, coins: Optional[torch.Tensor] = None):
    probs = probs.to(torch.float32)
    if indices is not None:
        checks.tensor("indices", indices, ndim=1, dtypes=checks.INDEX_DTYPES, device=probs.device)
        probs = probs.index_select(0, indices.to(torch.int64))
    rows = probs.shape[0]
    if coins is None:
        coins = _probs.draw_uniform((rows,), probs.device, _generator_for(probs.device, generator, seed, offset))
    else:
        checks.tensor("uniform_samples", coins, dtypes=(torch.float32,), device=probs.device, shape=(rows,))
    samples = _probs.sample_rows(probs, coins)
    if indices is not None:
        samples = samples.to(indices.dtype)
    if return_valid:
        return samples, sanitize_probs(probs).sum(dim=1) > 0
    return samples


def _legacy_coins(indices):
    """Older FlashInfer passed ``uniform_samples`` (float) where ``indices`` now stands."""
    if isinstance(indices, torch.Tensor) and indices.is_floating_point():
        return None, indices
    return indices, None


def sampling_from_probs(
    probs: torch.Tensor,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Optional[int] = None,
    offset: Optional[int] = None,
    return_valid: bool = False,
    *,
    uniform_samples: Optional[torch.Tensor] = None,
):
    """Categorical sample per row of ``probs`` (bs, V): (bs,) int32 (or the dtype of ``indices``,
    which maps output i to row ``indices[i]``); with ``return_valid`` also (bs,) bool (row has mass).
    An all-zero row gives id 0."""
    del deterministic
    probs = _checked("probs", probs, check_nan)
    indices, legacy = _legacy_coins(indices)
    return _sample(probs, indices, generator, seed, offset, return_valid, uniform_samples if uniform_samples is not None else legacy)


def sampling_from_logits(
    logits: torch.Tensor,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Optional[int] = None,
    offset: Optional[int] = None,
) -> torch.Tensor:
    """Categorical sample of ``softmax(logits)`` per row: (bs,) int32 (or the dtype of ``indices``)."""
    del deterministic
    logits = _checked("logits", logits, check_nan)
    return _sample(_probs.softmax_with_temperature(logits, None), indices, generator, seed, offset)


def top_k_sampling_from_probs(probs, top_k, indices=None, deterministic=True, generator=None, check_nan=False, seed=None, offset=None):
    """Sample ``top_k_renorm_probs(probs, top_k)`` per row: (bs,) int32."""
    probs = _checked("probs", probs, check_nan)
    return _sample(_probs.top_k_renorm(probs, top_k), indices, generator, seed, offset)


def top_p_sampling_from_probs(probs, top_p, indices=None, deterministic=True, generator=None, check_nan=False, seed=None, offset=None):
    """Sample ``top_p_renorm_probs(probs, top_p)`` per row: (bs,) int32."""
    probs = _checked("probs", probs, check_nan)
    return _sample(_probs.top_p_renorm(probs, top_p), indices, generator, seed, offset)


def min_p_sampling_from_probs(probs, min_p, indices=None, deterministic=True, generator=None, check_nan=False, seed=None, offset=None):
    """Sample the entries ``>= min_p * max(row)``, renormalised, per row: (bs,) int32."""
    probs = _checked("probs", probs, check_nan)
    return _sample(_min_p_filter(probs.to(torch.float32), min_p), indices, generator, seed, offset)


def top_k_top_p_sampling_from_probs(probs, top_k, top_p, indices=None, filter_apply_order: str = "top_k_first",
                                    deterministic=True, generator=None, check_nan=False, seed=None, offset=None):
    """Sample after top-k and top-p filtering: "top_k_first" applies top-p to the top-k
    renormalised row; "joint" keeps the entries in both sets of the original row."""
    probs = _checked("probs", probs, check_nan)
    if filter_apply_order == "top_k_first":
        filtered = _probs.top_p_renorm(_probs.top_k_renorm(probs, top_k), top_p)
    elif filter_apply_order == "joint":
        by_k = _probs.top_k_renorm(probs, top_k) > 0
        by_p = _probs.top_p_renorm(probs, top_p) > 0
        # No renormalisation needed: the sample divides by the kept mass itself.
        filtered = torch.where(by_k & by_p, probs.to(torch.float32), torch.zeros_like(probs, dtype=torch.float32))
    else:
        raise InvalidInput("filter_apply_order", "'top_k_first' or 'joint'", repr(filter_apply_order))
    return _sample(filtered, indices, generator, seed, offset)
