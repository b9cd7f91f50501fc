"""Family ``compaction``: the bonus token and the accepted path moved to the front. P12, P14.

Semantics (identical on every backend; integers and copied floats bit-exact):

* A :class:`~spec_hal.types.Verdict` carries ``accept_index`` (bs, W) with W = S + 1, the accept
  width. Every stride here is derived from that shape: the bonus of request b is read from row b
  of ``accept_index``, never at ``b * N`` (upstream bug 4a used N = num_draft_tokens).
* ``bonus_tokens(verdict)[b] = predict[accept_index[b, accept_lens[b] - 1]]``.
* ``compact_accepted(x, verdict)``: for a node-indexed tensor x (bs*N, ...), row ``b*N + r`` of
  the result is row ``accept_index[b, r]`` of x for ``r < accept_lens[b]`` (the accepted path, root
  first, in order) and row ``b*N + r`` of x itself otherwise. Rows past the accepted path are left
  unchanged (upstream filled rows < S+1 with node-0 copies; unchanged is cheaper to define and
  identical on every backend). The result is a new tensor (or ``out=``), never x itself: the
  move reads rows that other rows overwrite.

Preconditions (verified only when ``SPEC_HAL_CHECKS=1``, since they need the values):
``1 <= accept_lens[b] <= min(W, N)``; ``accept_index[b, r]`` in ``[b*N, (b+1)*N)`` for
``r < accept_lens[b]``. Kernels never read or write out of bounds even when they are violated.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import checks
from .error_flag import record as record_invalid
from .errors import InvalidInput
from .registry import register_op
from .types import Verdict

# Element types a node-indexed tensor may have (bool is moved as uint8 by the kernels).
COMPACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64,
                  torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)


def value_checks_enabled() -> bool:
    """True when ``SPEC_HAL_CHECKS=1``: run the value checks that need a host sync."""
    return checks.value_checks_enabled()


def verdict_ok(verdict: object) -> bool:
    """The common case of :func:`check_verdict` (and of the mamba ops' weaker verdict check) in a
    few comparisons: a Verdict of int32/int64 tensors on one device, accept_index (bs, S+1) with
    S+1 >= 1 and not meta, accept_lens and num_correct (bs,), predict (bs*N,) with N >= 1.
    False sends the caller to the detailed checks, which name the argument."""
    if type(verdict) is not Verdict:
        return False
    accept_index, predict, accept_lens, num_correct = verdict.accept_index, verdict.predict, verdict.accept_lens, verdict.num_correct
    if not (isinstance(accept_index, torch.Tensor) and accept_index.dtype in _INDEX_DTYPES and not accept_index.is_meta):
        return False
    shape = accept_index.shape
    if len(shape) != 2 or shape[1] < 1:
        return False
    rows, device = shape[0], accept_index.device
    if not (isinstance(predict, torch.Tensor) and predict.dtype in _INDEX_DTYPES and predict.device == device):
        return False
    total = predict.shape
    if len(total) != 1 or (rows and (total[0] == 0 or total[0] % rows)):
        return False
    return _index_vector_ok(accept_lens, rows, device) and _index_vector_ok(num_correct, rows, device)


def _index_vector_ok(value, length: int, device) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in _INDEX_DTYPES and value.shape == (length,) and value.device == device


_INDEX_DTYPES = frozenset(checks.INDEX_DTYPES)


def check_verdict(name: str, verdict: object) -> Verdict:
    """Metadata of a Verdict: consistent shapes, index dtypes, one device."""
    if verdict_ok(verdict):
        if value_checks_enabled() and verdict.accept_index.shape[0]:
            _check_verdict_values(name, verdict)
        return verdict
    if not isinstance(verdict, Verdict):
        raise InvalidInput(name, "a spec_hal.types.Verdict", type(verdict).__name__)
    accept_index = checks.tensor(f"{name}.accept_index", verdict.accept_index, ndim=2, dtypes=checks.INDEX_DTYPES)
    rows, width = accept_index.shape
    if width < 1:
        raise InvalidInput(f"{name}.accept_index", "at least one column (S + 1 >= 1)", f"shape {tuple(accept_index.shape)}")
    device = accept_index.device
    predict = checks.tensor(f"{name}.predict", verdict.predict, ndim=1, dtypes=checks.INDEX_DTYPES, device=device)
    checks.tensor(f"{name}.accept_lens", verdict.accept_lens, dtypes=checks.INDEX_DTYPES, device=device, shape=(rows,))
    checks.tensor(f"{name}.num_correct", verdict.num_correct, dtypes=checks.INDEX_DTYPES, device=device, shape=(rows,))
    if rows and (predict.shape[0] == 0 or predict.shape[0] % rows):
        raise InvalidInput(f"{name}.predict", f"bs*N rows (a multiple of bs = {rows})", f"shape {tuple(predict.shape)}")
    if value_checks_enabled() and rows:
        _check_verdict_values(name, verdict)
    return verdict


def record_verdict_values(op: str, verdict: Verdict) -> None:
    """Default mode: record in the error flag the accept_lens outside [1, min(S+1, N)] (index b)
    and the used accept_index entries (r < min(accept_lens[b], S+1, N)) outside the request's
    block (flat index b*(S+1) + r): device ops, no sync. Checked mode raised on them already.

    Called by the reference providers only (not by the shared check, which must issue no torch
    op): a Triton kernel records the same codes itself (kernels/compaction.py, kernels/kv.py)."""
    rows, width = verdict.accept_index.shape
    if value_checks_enabled() or rows == 0:
        return
    nodes = verdict.predict.shape[0] // rows
    lens = verdict.accept_lens.long()
    limit = min(width, nodes)
    record_invalid(op, "verdict.accept_lens", (lens < 1) | (lens > limit), rule=f"values in [1, {limit}]")
    used = torch.arange(width, device=lens.device)[None, :] < lens.clamp(max=limit)[:, None]
    local = verdict.accept_index.long() - torch.arange(rows, device=lens.device)[:, None] * nodes
    record_invalid(op, "verdict.accept_index", used & ((local < 0) | (local >= nodes)), rule="ids of the request's own block")


def own_block_rows(accept_index: torch.Tensor, nodes: int) -> torch.Tensor:
    """(bs, W) bool: entries that are global node ids of their own request's block."""
    local = accept_index.long() - torch.arange(accept_index.shape[0], device=accept_index.device)[:, None] * nodes
    return (local >= 0) & (local < nodes)


def _check_verdict_values(name: str, verdict: Verdict) -> None:
    rows, width = verdict.accept_index.shape
    nodes = verdict.predict.shape[0] // rows
    lens = verdict.accept_lens.long().cpu()
    if ((lens < 1) | (lens > min(width, nodes))).any():
        raise InvalidInput(f"{name}.accept_lens", f"values in [1, min(S+1, N)] = [1, {min(width, nodes)}]", lens.tolist())
    index = verdict.accept_index.long().cpu()
    used = torch.arange(width)[None, :] < lens[:, None]
    local = index - torch.arange(rows)[:, None] * nodes
    if (used & ((local < 0) | (local >= nodes))).any():
        raise InvalidInput(f"{name}.accept_index", "global node ids b*N + j of the request's own block", "an id outside it")


def check_single_out(out, shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    """An optional ``out=`` tensor: contiguous, of the given shape, dtype and device."""
    if out is None:
        return
    checks.tensor("out", out, dtypes=(dtype,), device=device, shape=shape)
    if not out.is_contiguous():
        raise InvalidInput("out", "a contiguous tensor", f"strides {out.stride()}")


def check_bonus_tokens(verdict, *, out=None) -> None:
    verdict = check_verdict("verdict", verdict)
    check_single_out(out, (verdict.batch_size,), verdict.predict.dtype, verdict.device)


def fake_bonus_tokens(verdict, *, out=None) -> torch.Tensor:
    return verdict.predict.new_empty((verdict.accept_index.shape[0],))


@register_op("bonus_tokens", family="compaction", check=check_bonus_tokens, fake=fake_bonus_tokens)
def bonus_tokens(verdict: Verdict, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The last emitted token of each request: the root of its next tree (P12).

    Args:
        verdict: a Verdict; predict (bs*N,), accept_index (bs, S+1), accept_lens (bs,), int32/int64.
        out: optional contiguous (bs,) buffer of predict's dtype.

    Returns:
        (bs,) tensor of predict's dtype: ``predict[accept_index[b, accept_lens[b] - 1]]``. The
        accept width S+1 is ``accept_index.shape[1]``; it is never passed separately.
    """
    record_verdict_values("bonus_tokens", verdict)
    rows, width = verdict.accept_index.shape
    if rows == 0:
        result = verdict.predict.new_empty((0,))
    else:
        # Rule: -1 where accept_lens is outside [1, S+1] or the entry is not of the request's block.
        nodes = verdict.predict.shape[0] // rows
        lens = verdict.accept_lens.long()
        last_rank = (lens - 1).clamp(0, width - 1).view(rows, 1)
        last_node = verdict.accept_index.long().gather(1, last_rank).view(rows)
        valid = (lens >= 1) & (lens <= width) & own_block_rows(verdict.accept_index, nodes).gather(1, last_rank).view(rows)
        result = torch.where(valid, verdict.predict[last_node.clamp(0, verdict.predict.shape[0] - 1)], -1).to(verdict.predict.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


def batch_first(x: torch.Tensor, verdict: Verdict) -> bool:
    """Whether ``x`` is node-indexed as (bs, N, ...) rather than (bs*N, ...) (both are accepted,
    as verify_sampling accepts (bs, N, V) and (bs*N, V) probabilities; docs/conventions.md)."""
    rows, total = verdict.accept_index.shape[0], verdict.predict.shape[0]
    return x.dim() >= 2 and x.shape[0] != total and rows > 0 and tuple(x.shape[:2]) == (rows, total // rows)


def check_compact_accepted(x, verdict, *, out=None) -> None:
    verdict = check_verdict("verdict", verdict)
    x = checks.tensor("x", x, dtypes=COMPACT_DTYPES, device=verdict.device)
    total, rows = verdict.predict.shape[0], verdict.accept_index.shape[0]
    if x.dim() < 1 or (x.shape[0] != total and not batch_first(x, verdict)):
        nodes = total // rows if rows else "N"
        raise InvalidInput("x", f"a node-indexed tensor of shape ({total}, ...) or ({rows}, {nodes}, ...)",
                           f"shape {tuple(x.shape)}")
    if out is not None:
        check_single_out(out, tuple(x.shape), x.dtype, verdict.device)
        if out.numel() and out.data_ptr() == x.data_ptr():
            raise InvalidInput("out", "a buffer other than x (compaction reads rows it overwrites)", "x itself")


def fake_compact_accepted(x, verdict, *, out=None) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@register_op("compact_accepted", family="compaction", check=check_compact_accepted, fake=fake_compact_accepted)
def compact_accepted(x: torch.Tensor, verdict: Verdict, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Move each request's accepted path to the front of its block of rows (P14).

    Args:
        x: (bs*N, ...) or (bs, N, ...) node-indexed tensor of any float or integer dtype
            (predict (bs*N,) int32, target hidden states (bs*N, H) or (bs, N, H) bf16/fp32, ...);
            any strides. The result has x's shape.
        verdict: the Verdict whose accept_index (bs, S+1) global node ids select the rows.
        out: optional contiguous buffer shaped and typed like x (not x itself).

    Returns:
        A tensor like x where rows ``b*N + r`` for ``r < accept_lens[b]`` hold
        ``x[accept_index[b, r]]`` (root, accepted drafts, in order) and every other row is x's.
    """
    if batch_first(x, verdict):
        flat_out = None if out is None else out.view(-1, *x.shape[2:])
        return compact_accepted(x.flatten(0, 1), verdict, out=flat_out).view(x.shape)
    record_verdict_values("compact_accepted", verdict)
    rows, width = verdict.accept_index.shape
    result = x.clone(memory_format=torch.contiguous_format) if out is None else out.copy_(x)
    if rows == 0:
        return result
    nodes = x.shape[0] // rows
    columns = min(width, nodes)  # an accepted path never has more than N nodes
    ranks = torch.arange(columns, device=x.device)
    moved = ranks[None, :] < verdict.accept_lens.long()[:, None]
    destination = torch.arange(rows, device=x.device)[:, None] * nodes + ranks[None, :]
    # Rows past the accepted path copy themselves, so the copy needs no data-dependent shapes.
    # Rule: an entry outside the request's own block keeps the row (reads no other request).
    moved = moved & own_block_rows(verdict.accept_index[:, :columns], nodes)
    source = torch.where(moved, verdict.accept_index[:, :columns].long(), destination)
    result[destination.reshape(-1)] = x[source.reshape(-1)]
    return result
