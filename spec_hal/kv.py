"""Family ``kv``: KV slot bookkeeping of tree drafting. P9, P13, P15.

Vocabulary: a *slot* is a row of a KV cache tensor (num_slots, ...); ``req_to_token`` (R, L)
maps (request pool row, position) to the slot holding that position's KV. Pages of ``page_size``
slots are contiguous, so positions ``k*P .. k*P + P-1`` of a request live in one page.

``accepted_kv_moves(verdict, slots)`` (P13). ``slots`` (bs, N) is the slot each verify node's
target KV was written to (in v2: ``req_to_token[req, seq_len + j]``, which is page-aware by
construction: it includes the prefix's partial page). The next round reads position
``seq_len + r`` from ``slots[b, r]``, so rank r of the accepted path moves
``slots[b, a_r] -> slots[b, r]`` with ``a_r`` the local node id of ``accept_index[b, r]``.
Results are flat (bs*(S+1),) ``src``/``dst`` in (request, rank) order; -1 in both where
``r >= accept_lens[b]`` or the move is an identity (``a_r == r``: the root, and every rank when
K = 1), so only bs*(S+1) entries are ever read or written (upstream bug 4b sized this bs*N).

``move_kv(caches, src, dst)``: for every cache and every i with ``src[i] >= 0 and dst[i] >= 0``,
``cache[dst[i]] = cache[src[i]]`` as gather-then-scatter: every source is read before any
destination is written. Preconditions (checked with ``SPEC_HAL_CHECKS=1``): valid destinations
are distinct, and a slot that is both a source and a destination is read by a move that comes
*before* the move writing it (i < j). Under that order the result equals the all-at-once
gather/scatter, and a kernel may stream the list in chunks. Both move lists this module produces
satisfy it: a_r >= r, so the reader of slot ``slots[b, k]`` (rank r' with a_r' = k) precedes its
writer (rank k); prefix-tail moves read only prefix slots and write only lane regions.

``assign_draft_slots(req_to_token, *, req_pool_indices, seq_lens, num_steps, topk, page_size)``
(P9): one formula for every page size. With ``last_page = seq_len % P``,
``prefix_base = seq_len - last_page`` and ``pages_per_lane = ceil((last_page + S) / P)``,
lane t's slot for draft step s is ``req_to_token[req, prefix_base + t*pages_per_lane*P +
last_page + s]`` at flat index ``b*K*S + t*S + s``. For P = 1 or K = 1 this is the contiguous
``req_to_token[req, seq_len + t*S + s]``. Lanes t >= 1 start a fresh page region whose first
``last_page`` slots must hold the prefix's partial page: ``prefix_src``/``prefix_dst``
(bs*(K-1)*(P-1),) are those KV copies (index ``b*(K-1)*(P-1) + (t-1)*(P-1) + i``, valid for
``i < last_page``, else -1), to apply with ``move_kv`` on the draft KV caches. A position past
the end of the ``req_to_token`` row gives -1 (checked mode raises instead).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from . import checks
from .compaction import check_verdict, record_verdict_values, value_checks_enabled
from .error_flag import record as record_invalid
from .errors import InvalidInput
from .registry import register_op
from .types import Verdict

KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8,
             torch.int16, torch.int32, torch.int64)
if hasattr(torch, "float8_e4m3fn"):
    KV_DTYPES += tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2") if hasattr(torch, name))


class DraftSlots(NamedTuple):
    """Result of ``assign_draft_slots``; every tensor has req_to_token's dtype.

    out_cache_loc: (bs*K*S,) draft KV slot of (request b, lane t, step s) at b*K*S + t*S + s.
    prefix_src:    (bs*(K-1)*(P-1),) prefix partial-page slots to copy, -1 padded.
    prefix_dst:    (bs*(K-1)*(P-1),) the lane-region slots they go to, -1 padded.
    """

    out_cache_loc: torch.Tensor
    prefix_src: torch.Tensor
    prefix_dst: torch.Tensor


# --------------------------------------------------------------------------------------------
# accepted_kv_moves


def check_accepted_kv_moves(verdict, slots, *, out=None) -> None:
    verdict = check_verdict("verdict", verdict)
    rows, width = verdict.accept_index.shape
    nodes = verdict.predict.shape[0] // rows if rows else None
    slots = checks.tensor("slots", slots, ndim=2, dtypes=checks.INDEX_DTYPES, device=verdict.device, shape=(rows, nodes))
    checks.out_tensors("out", out, [((rows * width,), slots.dtype)] * 2, verdict.device)


def fake_accepted_kv_moves(verdict, slots, *, out=None):
    moves = verdict.accept_index.shape[0] * verdict.accept_index.shape[1]
    return slots.new_empty((moves,)), slots.new_empty((moves,))


@register_op("accepted_kv_moves", family="kv", check=check_accepted_kv_moves, fake=fake_accepted_kv_moves)
def accepted_kv_moves(
    verdict: Verdict, slots: torch.Tensor, *, out: Optional[tuple[torch.Tensor, torch.Tensor]] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """KV slot moves that make each request's accepted path contiguous (P13).

    Args:
        verdict: a Verdict; accept_index (bs, S+1) global node ids, accept_lens (bs,).
        slots: (bs, N) int32/int64, the KV slot each verify node's KV was written to
            (``req_to_token[req, seq_len + j]``); any page size.
        out: optional (src, dst) contiguous (bs*(S+1),) buffers of slots' dtype.

    Returns:
        (src, dst), each (bs*(S+1),) of slots' dtype: move ``src[i] -> dst[i]`` for rank
        ``r = i % (S+1)`` of request ``b = i // (S+1)``; -1 in both for ranks past
        accept_lens and for identity moves. Apply with ``move_kv``.
    """
    record_verdict_values("accepted_kv_moves", verdict)
    rows, width = verdict.accept_index.shape
    if rows == 0:
        empty = slots.new_empty((0,))
        return (empty, empty.clone()) if out is None else (out[0], out[1])
    nodes = slots.shape[1]
    columns = min(width, nodes)
    ranks = torch.arange(width, device=slots.device)
    accepted = ranks[None, :] < verdict.accept_lens.long()[:, None]
    block_start = torch.arange(rows, device=slots.device)[:, None] * nodes
    local = verdict.accept_index.long() - block_start
    # Rule: an accept_index outside the request's own block [b*N, (b+1)*N) is skipped (-1).
    in_block = (local >= 0) & (local < nodes)
    accepted = accepted & in_block & (local != ranks[None, :]) & (ranks[None, :] < columns)
    local = local.clamp(0, nodes - 1)
    src = torch.where(accepted, slots.gather(1, local), -1)
    dst = torch.where(accepted, slots.gather(1, ranks.clamp(max=nodes - 1)[None, :].expand(rows, width)), -1)
    src, dst = src.reshape(-1).to(slots.dtype), dst.reshape(-1).to(slots.dtype)
    if out is None:
        return src, dst
    out[0].copy_(src)
    out[1].copy_(dst)
    return out[0], out[1]


# --------------------------------------------------------------------------------------------
# move_kv


def _move_kv_ok(caches, src, dst) -> bool:
    """``check_move_kv``'s common call in a few comparisons per cache: src and dst (M,) int32/int64
    on one device with data, and every cache a contiguous tensor of at least one dimension of a
    KV dtype there (contiguous: dense rows and no overlapping elements). False sends the caller
    to the detailed checks, which name the argument."""
    if not (isinstance(src, torch.Tensor) and src.dtype in _INDEX_DTYPES and len(src.shape) == 1 and not src.is_meta):
        return False
    device = src.device
    if not (isinstance(dst, torch.Tensor) and dst.dtype in _INDEX_DTYPES and dst.shape == src.shape and dst.device == device):
        return False
    for cache in caches:
        if not (isinstance(cache, torch.Tensor) and cache.dtype in _KV_DTYPES and cache.device == device and cache.dim() >= 1
                and cache.is_contiguous()):
            return False
    return True


def check_move_kv(caches, src, dst) -> None:
    if isinstance(caches, (list, tuple)) and caches and not value_checks_enabled() and _move_kv_ok(caches, src, dst):
        return
    if not isinstance(caches, (list, tuple)) or not caches:
        raise InvalidInput("caches", "a non-empty list or tuple of KV cache tensors (num_slots, ...)", type(caches).__name__)
    src = checks.tensor("src", src, ndim=1, dtypes=checks.INDEX_DTYPES)
    device = src.device
    checks.tensor("dst", dst, ndim=1, dtypes=checks.INDEX_DTYPES, device=device, shape=(src.shape[0],))
    for index, cache in enumerate(caches):
        name = f"caches[{index}]"
        checks.tensor(name, cache, dtypes=KV_DTYPES, device=device)
        checks.writable(name, cache)
        if cache.dim() < 1:
            raise InvalidInput(name, "a tensor (num_slots, ...)", "a 0-D tensor")
        if not _row_contiguous(cache):
            raise InvalidInput(name, "contiguous rows (every dim after the slot dim dense)", f"strides {cache.stride()}")
    if value_checks_enabled() and src.numel():
        _check_move_values(caches, src, dst)


_INDEX_DTYPES = frozenset(checks.INDEX_DTYPES)
_KV_DTYPES = frozenset(KV_DTYPES)


def record_move_values(caches, src, dst) -> None:
    """Default mode: record in the error flag the src/dst entries other than -1 outside [0,
    min num_slots of the caches) (flat index i; src before dst), which the skip rule drops.
    Device ops, no sync; checked mode raised on them already. Called by the reference provider
    (the Triton kernel records the same codes itself), never by the shared check."""
    if value_checks_enabled() or not src.numel():
        return
    num_slots = min(cache.shape[0] for cache in caches)
    for name, slots in (("src", src), ("dst", dst)):
        record_invalid("move_kv", name, (slots < -1) | (slots >= num_slots), rule=f"-1 or slots in [0, {num_slots})")


def _row_contiguous(cache: torch.Tensor) -> bool:
    expected = 1
    for size, stride in zip(reversed(cache.shape[1:]), reversed(cache.stride()[1:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _check_move_values(caches, src, dst) -> None:
    src, dst = src.long().cpu(), dst.long().cpu()
    num_slots = min(cache.shape[0] for cache in caches)
    for name, slots in (("src", src), ("dst", dst)):
        if ((slots < -1) | (slots >= num_slots)).any():
            raise InvalidInput(name, f"-1 (skip) or slots in [0, {num_slots})", slots.tolist())
    valid = (src >= 0) & (dst >= 0)
    moves = valid.nonzero().view(-1)
    if torch.unique(dst[moves]).numel() != moves.numel():
        raise InvalidInput("dst", "distinct destination slots", "a slot written twice")
    written_at = {int(dst[i]): int(i) for i in moves}
    for i in moves.tolist():
        writer = written_at.get(int(src[i]))
        if writer is not None and writer < i:
            raise InvalidInput("src", "a slot read before it is overwritten (reader index < writer index)",
                               f"move {i} reads slot {int(src[i])} written by earlier move {writer}")


@register_op("move_kv", family="kv", check=check_move_kv, mutates=("caches",))
def move_kv(caches: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy KV rows ``src[i] -> dst[i]`` in every cache, in place; -1 entries are skipped.

    Args:
        caches: list/tuple of (num_slots, ...) tensors (K and V of every layer); each with dense
            rows; dtypes and row shapes may differ between caches.
        src, dst: (M,) int32/int64 slots, -1 to skip. Gather then scatter: sources may be
            destinations too, provided a slot's reader precedes its writer (see module doc).

    Returns:
        None (the caches are updated in place).
    """
    record_move_values(caches, src, dst)
    src, dst = src.long(), dst.long()
    for cache in caches:
        # Rule: a move whose source or destination is outside [0, num_slots) of this cache is skipped.
        valid = (src >= 0) & (dst >= 0) & (src < cache.shape[0]) & (dst < cache.shape[0])
        cache[dst[valid]] = cache[src[valid]]  # advanced indexing gathers into a copy first


# --------------------------------------------------------------------------------------------
# assign_draft_slots


def check_assign_draft_slots(req_to_token, *, req_pool_indices, seq_lens, num_steps, topk, page_size, out=None) -> None:
    table = checks.tensor("req_to_token", req_to_token, ndim=2, dtypes=checks.INDEX_DTYPES)
    device = table.device
    pool = checks.tensor("req_pool_indices", req_pool_indices, ndim=1, dtypes=checks.INDEX_DTYPES, device=device)
    rows = pool.shape[0]
    checks.tensor("seq_lens", seq_lens, dtypes=checks.INDEX_DTYPES, device=device, shape=(rows,))
    steps = checks.integer("num_steps", num_steps, low=1)
    lanes = checks.integer("topk", topk, low=1)
    page = checks.integer("page_size", page_size, low=1)
    width = table.shape[1]
    # Limits from shapes: a request's K lanes of S steps must fit in a req_to_token row, and a
    # page (its prefix-tail copies are sized by P) cannot be wider than the row.
    if steps * lanes > width:
        raise InvalidInput("num_steps", f"num_steps * topk <= req_to_token's width {width}", f"{steps} * {lanes}")
    if lanes > 1 and page > width:
        raise InvalidInput("page_size", f"at most req_to_token's width {width} when topk > 1", page)
    holes = (lanes - 1) * (page - 1)
    specs = [((rows * lanes * steps,), table.dtype), ((rows * holes,), table.dtype), ((rows * holes,), table.dtype)]
    checks.out_tensors("out", out, specs, device)
    if value_checks_enabled() and rows:
        _check_draft_slot_values(table, pool, seq_lens, steps, lanes, page)


def _check_draft_slot_values(table, pool, seq_lens, steps, lanes, page) -> None:
    pool, seq_lens = pool.long().cpu(), seq_lens.long().cpu()
    if ((pool < 0) | (pool >= table.shape[0])).any():
        raise InvalidInput("req_pool_indices", f"rows of req_to_token in [0, {table.shape[0]})", pool.tolist())
    if (seq_lens < 0).any():
        raise InvalidInput("seq_lens", "non-negative lengths", seq_lens.tolist())
    needed = draft_row_width(seq_lens, num_steps=steps, topk=lanes, page_size=page)
    if (needed > table.shape[1]).any():
        raise InvalidInput("req_to_token", f"rows of at least {int(needed.max())} positions (K lane regions)", f"width {table.shape[1]}")


def draft_row_width(seq_lens: torch.Tensor, *, num_steps: int, topk: int, page_size: int) -> torch.Tensor:
    """Positions of req_to_token each request needs for its draft lanes (P9): (bs,) int64."""
    last_page = seq_lens.long() % page_size
    pages_per_lane = (last_page + num_steps + page_size - 1) // page_size
    return seq_lens.long() - last_page + (topk - 1) * pages_per_lane * page_size + last_page + num_steps


def fake_assign_draft_slots(req_to_token, *, req_pool_indices, seq_lens, num_steps, topk, page_size, out=None) -> DraftSlots:
    rows = req_pool_indices.shape[0]
    holes = rows * (topk - 1) * (page_size - 1)
    return DraftSlots(req_to_token.new_empty((rows * topk * num_steps,)), req_to_token.new_empty((holes,)), req_to_token.new_empty((holes,)))


@register_op("assign_draft_slots", family="kv", check=check_assign_draft_slots, fake=fake_assign_draft_slots)
def assign_draft_slots(
    req_to_token: torch.Tensor,
    *,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    num_steps: int,
    topk: int,
    page_size: int,
    out: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> DraftSlots:
    """Page-aware draft KV slots of every (request, lane, step) and the prefix-tail copies (P9).

    Args:
        req_to_token: (R, L) int32/int64 position -> slot table.
        req_pool_indices: (bs,) int32/int64 row of req_to_token of each request.
        seq_lens: (bs,) int32/int64 committed KV length of each request.
        num_steps: S >= 1 draft steps. topk: K >= 1 lanes. page_size: P >= 1.
        out: optional (out_cache_loc, prefix_src, prefix_dst) contiguous buffers (see DraftSlots).

    Returns:
        DraftSlots(out_cache_loc (bs*K*S,), prefix_src, prefix_dst (bs*(K-1)*(P-1),)), all of
        req_to_token's dtype, -1 where nothing (see the module doc for the formulas).
    """
    rows, width = req_pool_indices.shape[0], req_to_token.shape[1]
    device = req_to_token.device
    pool, lengths = req_pool_indices.long(), seq_lens.long()
    # Rule: a request whose pool row is outside [0, R) or whose seq_len is negative gets -1 in
    # every output (it reads nothing).
    bad_row = (pool < 0) | (pool >= req_to_token.shape[0])
    record_invalid("assign_draft_slots", "req_pool_indices", bad_row, rule=f"rows in [0, {req_to_token.shape[0]})")
    record_invalid("assign_draft_slots", "seq_lens", lengths < 0, rule="non-negative lengths")
    skipped = (bad_row | (lengths < 0))[:, None]
    seq = lengths.clamp(min=0)[:, None]
    last_page = seq % page_size
    prefix_base = seq - last_page
    pages_per_lane = (last_page + num_steps + page_size - 1) // page_size
    lane = torch.arange(topk, device=device).repeat_interleave(num_steps)[None, :]
    step = torch.arange(num_steps, device=device).repeat(topk)[None, :]
    positions = prefix_base + lane * pages_per_lane * page_size + last_page + step
    table_rows = torch.where(skipped, 0, pool[:, None])
    out_cache_loc = _lookup(req_to_token, table_rows, torch.where(skipped, -1, positions), width).reshape(-1)

    holes = (topk - 1) * (page_size - 1)
    hole_lane = torch.arange(1, topk, device=device).repeat_interleave(page_size - 1)[None, :]
    hole_offset = torch.arange(page_size - 1, device=device).repeat(topk - 1)[None, :]
    in_partial_page = hole_offset < last_page
    in_partial_page = in_partial_page & ~skipped
    source_pos = torch.where(in_partial_page, prefix_base + hole_offset, -1)
    dest_pos = torch.where(in_partial_page, prefix_base + hole_lane * pages_per_lane * page_size + hole_offset, -1)
    prefix_src = _lookup(req_to_token, table_rows, source_pos, width).reshape(rows * holes)
    prefix_dst = _lookup(req_to_token, table_rows, dest_pos, width).reshape(rows * holes)
    # A hole is copied only when both ends exist.
    both = (prefix_src >= 0) & (prefix_dst >= 0)
    prefix_src, prefix_dst = torch.where(both, prefix_src, -1), torch.where(both, prefix_dst, -1)
    result = DraftSlots(out_cache_loc, prefix_src, prefix_dst)
    if out is None:
        return result
    for buffer, value in zip(out, result):
        buffer.copy_(value)
    return DraftSlots(*out)


def _lookup(req_to_token: torch.Tensor, table_rows: torch.Tensor, positions: torch.Tensor, width: int) -> torch.Tensor:
    """req_to_token[row, position], -1 where the position is negative or past the row."""
    inside = (positions >= 0) & (positions < width)
    if not width or not req_to_token.shape[0]:
        return torch.full_like(positions, -1).to(req_to_token.dtype)
    values = req_to_token[table_rows.expand_as(positions), positions.clamp(0, width - 1)]
    return torch.where(inside, values, torch.full_like(values, -1)).to(req_to_token.dtype)
