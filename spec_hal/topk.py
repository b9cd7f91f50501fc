"""Family ``topk``: the draft step's postprocess, logits to (probabilities, ids). P1/P3.

Semantics (identical on every backend; integers bit-exact):

* Logits are converted to float32 first. NaN counts as -inf and +inf as the largest finite
  float32, so every row has a well-defined order and every id is in [0, V).
* Ids are the k largest values in descending order; equal values go to the lower id first
  (a stable order: value descending, then id ascending).
* ``probs[b, j] = exp(x[b, id_j] - M_b) / sum_v exp(x[b, v] - M_b)`` with ``M_b`` the row max,
  accumulated in float32. For k = 1 this is ``1 / sum exp(x - max)``, the exact top-1
  probability (never a hard-coded 1.0: upstream bug 3). A row whose max is -inf (all -inf/NaN)
  has probabilities 0 and ids 0..k-1.
* ``token_map`` (V,) maps draft-vocabulary ids to target ids (hot-token maps); it is applied
  after ranking. EAGLE-3 checkpoints store offsets instead (``d2t``: target id = draft id +
  ``d2t[draft id]``): ``token_map_from_offsets(d2t)`` converts them once at load time, and
  ``run_draft(..., token_map=d2t, token_map_offsets=True)`` takes them as they are.
  ``reverse_token_map`` gives the target-to-draft map (-1 where a target id has no draft id).
* ``token_bitmask`` (spec_hal/masks.py; rows of ``logits`` through ``bitmask_index``): masked
  tokens rank below every allowed token (NaN and -inf included) and have probability 0; the
  softmax normaliser and the row max run over allowed tokens only. A row with fewer than k
  allowed tokens fills the remaining slots with masked ids (ascending id) at probability 0; a row
  allowing nothing has probabilities 0 and ids 0..k-1 (as an all -inf row). With ``token_map``
  the mask is in the target vocabulary: draft id i is allowed iff ``token_map[i]`` is.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import checks
from .masks import check_bitmask, token_allowed
from .registry import register_op

MAX_TOPK = 16
FLOAT32_MAX = torch.finfo(torch.float32).max


def _common_call_ok(logits, k, token_map) -> bool:
    """The common call (no mask, no out=) in a few comparisons: float (bs, V) logits with data,
    an int k in [1, min(V, MAX_TOPK)], and no token_map or a (V,) int32/int64 one on the logits'
    device. Anything else goes to the detailed checks, which name the argument."""
    if type(k) is not int or not isinstance(logits, torch.Tensor) or logits.dtype not in _FLOAT_DTYPES or logits.is_meta:
        return False
    shape = logits.shape
    if len(shape) != 2 or not 1 <= k <= min(shape[1], MAX_TOPK):
        return False
    return token_map is None or (isinstance(token_map, torch.Tensor) and token_map.dtype in _INDEX_DTYPES
                                 and token_map.shape == shape[1:] and token_map.device == logits.device)


_FLOAT_DTYPES = frozenset(checks.FLOAT_DTYPES)
_INDEX_DTYPES = frozenset(checks.INDEX_DTYPES)


def check_draft_topk(logits, k, *, token_map=None, token_bitmask=None, bitmask_index=None, out=None) -> None:
    if token_bitmask is None and bitmask_index is None and out is None and _common_call_ok(logits, k, token_map):
        return
    checks.tensor("logits", logits, ndim=2, dtypes=checks.FLOAT_DTYPES)
    vocab = logits.shape[1]
    if vocab == 0:
        raise checks.InvalidInput("logits", "at least one column (V >= 1)", f"shape {tuple(logits.shape)}")
    checks.integer("k", k, low=1, high=min(vocab, MAX_TOPK))
    if token_map is not None:
        checks.tensor("token_map", token_map, ndim=1, dtypes=checks.INDEX_DTYPES, device=logits.device, shape=(vocab,))
    rows = logits.shape[0]
    check_bitmask(token_bitmask, bitmask_index, rows=rows, vocab=None if token_map is not None else vocab, device=logits.device)
    checks.out_tensors("out", out, [((rows, k), torch.float32), ((rows, k), torch.int64)], logits.device)


def sanitize_logits(logits: torch.Tensor) -> torch.Tensor:
    """float32 copy with NaN -> -inf and +inf -> FLT_MAX (the order every backend ranks by)."""
    values = logits.to(torch.float32)
    return torch.nan_to_num(values, nan=float("-inf"), posinf=FLOAT32_MAX, neginf=float("-inf"))


def fake_draft_topk(logits, k, *, token_map=None, token_bitmask=None, bitmask_index=None, out=None):
    """Output shapes and dtypes only (the torch custom op's fake kernel)."""
    rows = logits.shape[0]
    return logits.new_empty((rows, k), dtype=torch.float32), logits.new_empty((rows, k), dtype=torch.int64)


@register_op("draft_topk", family="topk", check=check_draft_topk, fake=fake_draft_topk)
def draft_topk(
    logits: torch.Tensor,
    k: int,
    *,
    token_map: Optional[torch.Tensor] = None,
    token_bitmask: Optional[torch.Tensor] = None,
    bitmask_index: Optional[torch.Tensor] = None,
    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k draft tokens with their exact softmax probabilities.

    Args:
        logits: (bs, V) float32/bfloat16/float16/float64 draft logits; any strides.
        k: number of candidates per row, 1 <= k <= min(V, MAX_TOPK = 16).
        token_map: optional (V,) int32/int64 map from draft ids to target ids.
        token_bitmask: optional (M, W) int32 vocabulary mask (W = ceil(V/32), or over the target
            vocabulary when token_map is given); masked tokens rank last with probability 0.
        bitmask_index: optional (bs,) int32/int64 mask row per logits row (-1: unconstrained).
        out: optional (probs (bs, k) float32, ids (bs, k) int64) contiguous buffers to write.

    Returns:
        probs (bs, k) float32 and ids (bs, k) int64, descending by probability, ties to the
        lower id, ids in [0, V) (or their token_map images).
    """
    values = sanitize_logits(logits)
    allowed = _allowed_draft_ids(token_bitmask, bitmask_index, token_map, values.shape[0], values.shape[1], values.device)
    values = torch.where(allowed, values, torch.full_like(values, float("-inf")))
    # A stable descending sort keeps equal values in ascending id order: ties go to the lower id.
    # The second stable sort puts every allowed id before every masked one, keeping that order.
    order = torch.sort(values, dim=1, descending=True, stable=True).indices
    if token_bitmask is not None:
        order = order.gather(1, torch.sort(allowed.gather(1, order).to(torch.int8), dim=1, descending=True, stable=True).indices)
    ids = order[:, :k]
    top_values = values.gather(1, ids)
    top_allowed = allowed.gather(1, ids)
    row_max = values.max(dim=1, keepdim=True).values
    finite_row = row_max > float("-inf")
    shifted = torch.where(finite_row, values - row_max, torch.full_like(values, float("-inf")))
    denominator = torch.exp(shifted).sum(dim=1, keepdim=True)
    probs = torch.where(finite_row & top_allowed, torch.exp(top_values - row_max) / denominator, torch.zeros_like(top_values))
    if token_map is not None:
        ids = token_map.to(torch.int64)[ids]
    if out is None:
        return probs, ids
    out[0].copy_(probs)
    out[1].copy_(ids)
    return out[0], out[1]


def _allowed_draft_ids(token_bitmask, bitmask_index, token_map, rows: int, vocab: int, device) -> torch.Tensor:
    """(rows, V) bool: draft ids allowed by the mask (through token_map); all True without one."""
    if token_bitmask is None:
        return torch.ones(rows, vocab, dtype=torch.bool, device=device)
    tokens = torch.arange(vocab, dtype=torch.int64, device=device)
    if token_map is not None:
        tokens = token_map.to(torch.int64)
    row_ids = torch.arange(rows, dtype=torch.int64, device=device)[:, None]
    return token_allowed(token_bitmask, bitmask_index, row_ids, tokens[None, :], rows=rows)


# ---------------------------------------------------------------------------------------------
# Token maps: EAGLE-3 offsets and the reverse map (load-time helpers, not ops: they read values)


def check_token_map(name: str, token_map, *, device=None) -> None:
    """Metadata of a draft-to-target map (absolute ids or offsets): (V_draft,) int32/int64."""
    checks.tensor(name, token_map, ndim=1, dtypes=checks.INDEX_DTYPES, device=device)


def absolute_token_ids(token_map: torch.Tensor, *, offsets: bool) -> torch.Tensor:
    """(V_draft,) int64 target id of each draft id, without reading values (capture-safe):
    ``token_map`` itself, or ``arange(V_draft) + token_map`` for EAGLE-3 offsets."""
    ids = token_map.to(torch.int64)
    if offsets:
        ids = ids + torch.arange(ids.shape[0], dtype=torch.int64, device=ids.device)
    return ids


def check_token_map_values(name: str, ids: torch.Tensor, *, target_vocab: Optional[int], what: str) -> None:
    """Every mapped id in [0, target_vocab) (or >= 0 without a vocabulary size); a host sync."""
    bad = ids < 0 if target_vocab is None else (ids < 0) | (ids >= target_vocab)
    if bool(bad.any()):
        index = int(bad.nonzero()[0, 0])
        bounds = ">= 0" if target_vocab is None else f"[0, target_vocab = {target_vocab})"
        raise checks.InvalidInput(name, f"{what} in {bounds}", f"draft id {index} maps to {int(ids[index])}")


def token_map_from_offsets(d2t: torch.Tensor, *, target_vocab: Optional[int] = None) -> torch.Tensor:
    """The absolute draft-to-target map of an EAGLE-3 ``d2t`` offset table.

    Args:
        d2t: (V_draft,) int32/int64 offsets: target id of draft id i = ``i + d2t[i]``.
        target_vocab: the target vocabulary size; every target id must lie in [0, target_vocab)
            (without it: >= 0).

    Returns:
        (V_draft,) int64 ``token_map`` for ``draft_topk``. Reads values (a host sync): call it
        once when loading the draft, not inside a captured graph. Bad entries raise
        ``InvalidInput("d2t")``.
    """
    check_token_map("d2t", d2t)
    _check_vocab(target_vocab)
    ids = absolute_token_ids(d2t, offsets=True)
    check_token_map_values("d2t", ids, target_vocab=target_vocab, what="i + d2t[i]")
    return ids


def reverse_token_map(token_map: torch.Tensor, *, target_vocab: int, offsets: bool = False) -> torch.Tensor:
    """The target-to-draft map of a draft-to-target map (EAGLE-3 ``t2d`` as indices).

    Args:
        token_map: (V_draft,) int32/int64 draft-to-target map: absolute target ids, or EAGLE-3
            offsets when ``offsets`` (target id = i + token_map[i]). Target ids must be distinct
            and in [0, target_vocab).
        target_vocab: the target vocabulary size.

    Returns:
        (target_vocab,) int64: the draft id of each target id, -1 where none maps to it. Reads
        values (a host sync): a load-time helper. Bad maps raise ``InvalidInput("token_map")``.
    """
    check_token_map("token_map", token_map)
    _check_vocab(target_vocab, required=True)
    ids = absolute_token_ids(token_map, offsets=offsets)
    check_token_map_values("token_map", ids, target_vocab=target_vocab, what="target ids")
    counts = torch.bincount(ids, minlength=target_vocab)
    if bool((counts > 1).any()):
        target = int((counts > 1).nonzero()[0, 0])
        raise checks.InvalidInput("token_map", "distinct target ids (one draft id per target id)",
                                  f"target id {target} is the image of {int(counts[target])} draft ids")
    reverse = torch.full((target_vocab,), -1, dtype=torch.int64, device=ids.device)
    reverse[ids] = torch.arange(ids.shape[0], dtype=torch.int64, device=ids.device)
    return reverse


def _check_vocab(target_vocab, *, required: bool = False) -> None:
    if target_vocab is None and not required:
        return
    checks.integer("target_vocab", target_vocab, low=1)
