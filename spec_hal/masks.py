"""Family ``masks``: vocabulary bitmasks for structured output (grammar-constrained decoding).

Layout (xgrammar's): ``token_bitmask`` (M, W) int32 with ``W = ceil(V / 32)``; bit ``t % 32`` of
word ``t // 32`` of a mask row set means token ``t`` is **allowed**. A row never reads a bit of
another row, and ids outside [0, 32 W) are not allowed.

Which mask constrains which row (``bitmask_index``): an op's "rows" are the rows of its logits or
probabilities (tree nodes ``b * N + j``, chain positions ``b * (S+1) + s``, draft rows). With
``bitmask_index=None`` row ``r`` uses mask row ``r`` (M must equal the number of rows). With a
``(rows,)`` int32/int64 ``bitmask_index``, row ``r`` uses mask row ``bitmask_index[r]``, and
**-1 means unconstrained**: that row reads no mask word and behaves exactly as without a mask, so
rows without a grammar cost nothing (kernels skip the load). A value outside [-1, M) is invalid
input (checked mode only: a value check needs a sync); without checks it reads as unconstrained.

Semantics where a mask constrains a row (one rule on every backend):

* A masked (not allowed) token is never accepted and never emitted, whatever its logit or
  probability: masked tokens rank below every allowed token (NaN and -inf included) and count
  with probability 0.
* A row whose mask allows nothing accepts no child, and its emitted token is id 0 (the same as
  an all -inf / all-zero row without a mask). An engine should not pass such a row: a finished
  grammar allows EOS.
* Sampling verification zeroes the masked probabilities and does not renormalise: it is lossless
  for the grammar-constrained distribution when ``target_probs`` is the softmax of logits already
  masked with :func:`apply_token_bitmask_` (the xgrammar flow); the mask in verification makes the
  "never accepted, never emitted" guarantee exact even where float rounding, NaN or a caller
  that skipped the logits mask would leave mass on a masked token.

The standalone op :func:`apply_token_bitmask_` writes -inf into the masked logits in place.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import checks
from .compaction import value_checks_enabled
from .registry import register_op

BITS_PER_WORD = 32


def mask_width(vocab: int) -> int:
    """Words per mask row for a vocabulary of ``vocab`` tokens: ceil(V / 32)."""
    return (vocab + BITS_PER_WORD - 1) // BITS_PER_WORD


def check_bitmask(token_bitmask, bitmask_index, *, rows: int, vocab: Optional[int], device, index_name: str = "bitmask_index",
                  mask_name: str = "token_bitmask") -> None:
    """Shapes and dtypes of an optional (M, ceil(V/32)) int32 mask and its (rows,) row index.

    ``vocab=None`` skips the width check (a reduced-vocabulary draft whose mask is in the target
    vocabulary, reached through ``token_map``). A ``bitmask_index`` without a mask is an error.
    """
    if token_bitmask is None:
        if bitmask_index is not None:
            raise checks.InvalidInput(index_name, f"None when {mask_name} is None", "a tensor")
        return
    checks.tensor(mask_name, token_bitmask, ndim=2, dtypes=(torch.int32,), device=device)
    if vocab is not None and token_bitmask.shape[1] != mask_width(vocab):
        raise checks.InvalidInput(mask_name, f"(M, ceil(V/32)) = (M, {mask_width(vocab)}) int32 words for V = {vocab}",
                                  f"shape {tuple(token_bitmask.shape)}")
    if token_bitmask.shape[1] == 0:
        raise checks.InvalidInput(mask_name, "at least one word per row", f"shape {tuple(token_bitmask.shape)}")
    if bitmask_index is None:
        if token_bitmask.shape[0] != rows:
            raise checks.InvalidInput(mask_name, f"one mask row per row ({rows}) when {index_name} is None",
                                      f"shape {tuple(token_bitmask.shape)}")
        return
    checks.tensor(index_name, bitmask_index, dtypes=checks.INDEX_DTYPES, device=device, shape=(rows,))
    if value_checks_enabled():
        masks = token_bitmask.shape[0]
        if bool(((bitmask_index < -1) | (bitmask_index >= masks)).any()):
            raise checks.InvalidInput(index_name, f"values in [-1, {masks})", "a value outside")


def mask_rows(token_bitmask: torch.Tensor, bitmask_index: Optional[torch.Tensor], rows: int) -> torch.Tensor:
    """(rows,) int64: the mask row of every row, -1 for unconstrained (indices outside [0, M) too)."""
    if bitmask_index is None:
        return torch.arange(rows, dtype=torch.int64, device=token_bitmask.device)
    index = bitmask_index.to(torch.int64)
    return torch.where((index >= 0) & (index < token_bitmask.shape[0]), index, torch.full_like(index, -1))


def token_allowed(token_bitmask: Optional[torch.Tensor], bitmask_index: Optional[torch.Tensor], row_ids: torch.Tensor,
                  tokens: torch.Tensor, *, rows: int) -> torch.Tensor:
    """Whether ``tokens`` are allowed at rows ``row_ids`` (broadcastable int64 tensors): a bool
    tensor of their broadcast shape. True everywhere without a mask; ids outside [0, 32 W) are
    not allowed at a constrained row."""
    row_ids, tokens = torch.broadcast_tensors(row_ids.to(torch.int64), tokens.to(torch.int64))
    if token_bitmask is None or token_bitmask.shape[0] == 0:  # no mask rows: every index is outside [0, M)
        return torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device)
    width = token_bitmask.shape[1]
    mask_row = mask_rows(token_bitmask, bitmask_index, rows)[row_ids.clamp(0, max(rows - 1, 0))] if rows else row_ids
    in_range = (tokens >= 0) & (tokens < width * BITS_PER_WORD)
    words = token_bitmask.to(torch.int64)[mask_row.clamp(min=0), (tokens.clamp(0, width * BITS_PER_WORD - 1) // BITS_PER_WORD)]
    bit = (words >> (tokens.clamp(min=0) % BITS_PER_WORD)) & 1
    return torch.where(mask_row >= 0, in_range & (bit == 1), torch.ones_like(in_range))


def allowed_matrix(token_bitmask: Optional[torch.Tensor], bitmask_index: Optional[torch.Tensor], rows: int, vocab: int,
                   device=None) -> torch.Tensor:
    """(rows, V) bool: which tokens each row allows (all True where unconstrained)."""
    device = token_bitmask.device if token_bitmask is not None else device
    row_ids = torch.arange(rows, dtype=torch.int64, device=device)[:, None]
    tokens = torch.arange(vocab, dtype=torch.int64, device=device)[None, :]
    return token_allowed(token_bitmask, bitmask_index, row_ids, tokens, rows=rows)


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """(M, V) bool to the (M, ceil(V/32)) int32 xgrammar layout (a helper for engines and tests)."""
    masks, vocab = allowed.shape
    width = mask_width(vocab)
    padded = torch.zeros(masks, width * BITS_PER_WORD, dtype=torch.int64, device=allowed.device)
    padded[:, :vocab] = allowed.to(torch.int64)
    weights = torch.ones(BITS_PER_WORD, dtype=torch.int64, device=allowed.device) << torch.arange(BITS_PER_WORD, device=allowed.device)
    words = (padded.view(masks, width, BITS_PER_WORD) * weights).sum(dim=2)
    # Wrap to the signed int32 range (bit 31 is the sign bit).
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def check_apply_token_bitmask_(logits, token_bitmask, *, bitmask_index=None) -> None:
    checks.tensor("logits", logits, ndim=2, dtypes=checks.FLOAT_DTYPES)
    checks.writable("logits", logits)  # masked in place
    rows, vocab = logits.shape
    if vocab == 0:
        raise checks.InvalidInput("logits", "at least one column (V >= 1)", f"shape {tuple(logits.shape)}")
    if token_bitmask is None:
        raise checks.InvalidInput("token_bitmask", "an (M, ceil(V/32)) int32 tensor", "None")
    check_bitmask(token_bitmask, bitmask_index, rows=rows, vocab=vocab, device=logits.device)


@register_op("apply_token_bitmask_", family="masks", check=check_apply_token_bitmask_, mutates=("logits",))
def apply_token_bitmask_(logits: torch.Tensor, token_bitmask: torch.Tensor, *, bitmask_index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Set every masked logit to -inf, in place (rows without a mask are not touched).

    Args:
        logits: (rows, V) float32/bfloat16/float16/float64; any strides; modified in place.
        token_bitmask: (M, ceil(V/32)) int32, bit set = allowed (xgrammar layout).
        bitmask_index: optional (rows,) int32/int64 mask row per logits row, -1 unconstrained;
            None: row r uses mask row r (M == rows).

    Returns:
        ``logits`` (the same tensor).
    """
    rows, vocab = logits.shape
    if rows == 0:
        return logits
    allowed = allowed_matrix(token_bitmask, bitmask_index, rows, vocab)
    logits.masked_fill_(~allowed, float("-inf"))
    return logits
