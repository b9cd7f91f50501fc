"""Probability processing shared by the compat modules: softmax with temperature, top-k and top-p
renormalisation, and categorical sampling of probability rows.

The renormalisations and softmax are compat-owned PyTorch on purpose: spec_hal's native
processing op, ``spec_hal.process_logits`` (spec_hal/sampling.py, kernels/sampling.py), cannot give
FlashInfer's or sgl-kernel's results exactly. ``top_k_renorm(p, k)`` would be
``process_logits(p.log(), temperature=1.0, top_k=k)``, but that op (a) quantises every weight to
``2^39 * 2^(-level/1024)``, so each output differs from ``p_i / sum(kept)`` by up to 0.07%
relative and entries more than 2^-40 below the row max become 0; (b) ranks top-k on those
quantised levels with ties to the lower id, so of two probabilities within 1/1024 of a halving of
each other the lower id wins even when it is smaller, and exactly k entries are kept where the
upstream pivot search keeps every entry tied with the k-th; (c) cuts top-p on the quantised
weights. ``softmax(x, T)`` would be ``process_logits(x, temperature=T)`` with the same
quantisation. FlashInfer and sgl-kernel compute these in float32 without quantising, as below;
docs/compat.md records the choice. Sampling (``sample_rows``) is native: it is
``spec_hal.verify_chain_sampling`` with zero draft tokens, whose final token is the exact
integer inverse-CDF sample of the target row.

Semantics (tie rules chosen so that the kept set never depends on sort order):

* ``top_k_renorm``: keep every entry ``>=`` the k-th largest value of its row (ties at the
  boundary are all kept), zero the rest, divide by the kept sum. ``k <= 0`` or ``k >= V`` keeps the
  row whole (SGLang passes ``1 << 30`` for "no top-k"). A Python int k finds the k-th value with
  ``torch.topk`` (no full sort of the row).
* ``top_p_renorm``: keep entry ``t`` iff the mass of the entries strictly larger than ``p_t`` is
  ``< top_p`` (the smallest top set whose mass reaches ``top_p``, ties at the boundary kept), zero
  the rest, divide by the kept sum. ``top_p >= 1`` keeps the row whole.
* A row whose kept sum is 0 (all zero) stays all zero.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from .. import checks
from ..errors import InvalidInput


def per_row(name: str, value: Union[torch.Tensor, int, float], rows: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A scalar or a (rows,) tensor as a (rows, 1) tensor of ``dtype`` on ``device``."""
    if isinstance(value, torch.Tensor):
        checks.tensor(name, value, ndim=1, device=device, shape=(rows,))
        return value.to(dtype)[:, None]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(name, "a number or a (batch_size,) tensor", type(value).__name__)
    return torch.full((rows, 1), value, dtype=dtype, device=device)


def check_probs(name: str, probs: object) -> torch.Tensor:
    return checks.tensor(name, probs, ndim=2, dtypes=checks.FLOAT_DTYPES)


def _renormalise(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    total = kept.sum(dim=1, keepdim=True)
    return torch.where(total > 0, kept / torch.where(total > 0, total, torch.ones_like(total)), kept)


def _sorted(probs: torch.Tensor, name: str, value, dtype: torch.dtype):
    """(float32 probs, the per-row parameter (bs, 1) of ``dtype``, each row sorted descending)."""
    probs = probs.to(torch.float32)
    param = per_row(name, value, probs.shape[0], probs.device, dtype)
    return probs, param, torch.sort(probs, dim=1, descending=True).values


def top_k_renorm(probs: torch.Tensor, top_k: Union[torch.Tensor, int], *, name: str = "top_k") -> torch.Tensor:
    """(bs, V) float32: the top-k entries of each row renormalised (module docstring)."""
    vocab = probs.shape[1]
    if isinstance(top_k, int) and not isinstance(top_k, bool) and 0 < top_k < vocab:
        probs = probs.to(torch.float32)  # the k-th value without sorting the row
        return _renormalise(probs, probs >= torch.topk(probs, top_k, dim=1).values[:, -1:])
    probs, k, ordered = _sorted(probs, name, top_k, torch.int64)
    whole = (k <= 0) | (k >= vocab)
    kth = ordered.gather(1, (k.clamp(1, max(vocab, 1)) - 1))
    return _renormalise(probs, whole | (probs >= kth))


def top_p_renorm(probs: torch.Tensor, top_p: Union[torch.Tensor, float], *, name: str = "top_p") -> torch.Tensor:
    """(bs, V) float32: the top-p nucleus of each row renormalised (module docstring)."""
    probs, p, ordered = _sorted(probs, name, top_p, torch.float32)
    mass_before = torch.cumsum(ordered, dim=1) - ordered
    # The kept set is a prefix of the sorted row; its last value is the pivot, and every entry equal
    # to the pivot is kept (the first of a tie group has the smallest mass before it).
    count = (mass_before < p).sum(dim=1, keepdim=True).clamp(min=1)
    pivot = ordered.gather(1, count - 1)
    return _renormalise(probs, (p >= 1) | (probs >= pivot))


def softmax_with_temperature(logits: torch.Tensor, temperature: Union[torch.Tensor, float, None]) -> torch.Tensor:
    """(bs, V) float32 ``softmax(logits / temperature)`` per row, computed in float32."""
    values = logits.to(torch.float32)
    if temperature is None:
        return torch.softmax(values, dim=-1)
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        return torch.softmax(values / float(temperature), dim=-1)  # no (bs, 1) tensor to build
    t = per_row("temperature", temperature, values.shape[0], values.device, torch.float32)
    return torch.softmax(values / t, dim=-1)


def sample_rows(probs: torch.Tensor, coins: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(bs,) int32: one exact inverse-CDF sample per row of ``probs`` (bs, V) with ``coins`` (bs,).

    Native: ``spec_hal.verify_chain_sampling`` with zero draft tokens samples target row 0, so the
    sample is the first index whose integer running sum (multiples of 2^-40) exceeds
    ``floor(u * total)``; an all-zero row gives id 0.
    """
    import spec_hal

    rows, vocab = probs.shape
    target = probs.to(torch.float32)[:, None, :]
    no_drafts = torch.empty((rows, 0), dtype=torch.int64, device=probs.device)
    verdict = spec_hal.verify_chain_sampling(no_drafts, target[:, :0, :], target, coins.new_empty((rows, 0)), coins)
    if out is None:
        return verdict.predict
    out.copy_(verdict.predict)
    return out


def draw_uniform(shape: tuple, device: torch.device, generator: Optional[torch.Generator]) -> torch.Tensor:
    """float32 uniforms in [0, 1) from ``generator`` (or torch's default generator)."""
    return torch.rand(shape, dtype=torch.float32, device=device, generator=generator)
