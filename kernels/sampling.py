"""Triton kernels of family ``sampling``. Semantics (every rounding, tie and key): spec_hal/sampling.py.

* Processing every row (``process_logits``, and the verifies where every row is processed, then
  walked): kernels/sampling_rows.py, split along the vocabulary across programs.
* ``_row_statistics`` (a device function of the fused walk): the same statistics computed by one
  program over a whole row. Passes over the vocabulary: max/argmax (and the raw log-sum-exp when
  logprobs are asked for); when the row has top_p < 1 or 0 < top_k < V, the level search of
  the top-p and the top-k cut levels: two passes decide the top 4 bits of both, two a pass
  (``_digit_pass``: the weights and counts of three digits above each prefix; the first also
  sums the total weight), then one pass a search counts the ids at every level of its window
  of the other 12 bits into the request's scratch (``_count_window``: atomic adds) and the cut
  is read off the counts (``_window_cut``); only when top-k's cut splits the ids tied at its
  level, one pass finding the tile of the last kept tie (``_crossing_tie_tile``) and that tile
  read again, the id found in registers (``_tied_id``); the kept total (5 row passes with
  either mask alone, 6 with both, one more for a split tie). A row
  with 0 < top_k <= LIST_TOP_K (128) takes its cuts from a list of its heaviest ids instead
  (``_listed_cuts``, since the fortieth session): the max pass keeps each lane's max, one pass
  lists the ids at or above the k-th lane max's level (and sums the total weight, for top-p),
  and each listed id's rank and running weight give both cuts and the kept total (2 row passes
  in all, as temperature alone takes); a row whose list overflows
  (more than LIST_DEPTH ids a lane or LIST_CAP a row) searches as above. A launch where no row
  can have a cut (CUTS False: the host knows top_k and top_p are off) compiles neither. Every
  quantity the masks use is an exact integer (levels, weights, keys, int64 sums) or a single
  correctly rounded float operation, so the result is bit-identical to the reference.
* ``_hash_coins_kernel``: the counter-based coins (``hash(seed, offset, position, purpose)``),
  int64 arithmetic emulating uint32 exactly as the reference does (chains with draft_probs).
* ``_fused_walk_kernel`` (grid: request blocks): the from-logits tree walk. A request computes the
  statistics of a row (``_row_statistics``: the passes above, without the probability store)
  only when its walk stands on it, gathers the candidates' logits there for the accept test, and
  samples its final token from per-block sums of the last row's quantised residual kept in
  registers (a block: BLOCK_TILES tiles, summed per lane) plus one re-read of the crossing
  block, tile by tile up to the crossing tile, which is read in pieces. The per-request
  parameters are normalised in the kernel (``_request_params``, exactly ``semantics.row_params``)
  and the seeded coins hashed there, so a call is one launch. Rows off the path are never read.
  Its row passes load one logit a thread a load (``SCALAR_LOADS``, sampling_rows._raw_tile).

``BLOCK_R`` rows (requests) share a program: 1 on a GPU; many under the interpreter, so that the statistical
cases (thousands of rows) stay a few vectorised programs.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

import spec_hal.sampling as semantics
from spec_hal import error_flag
from spec_hal.device_buffers import allocate_persistent, capturing
from spec_hal.types import DraftTree, Verdict

from . import verify as verify_kernels
from . import sampling_rows
from .launch import KernelTarget, runtime_specialized, cdiv, next_power_of_2
from .sampling_rows import (FLT_MAX, ID_BITS, ID_LAST, ID_SCALE, KEEP_ALL_KEY, LEVEL_MAX, TOP_WEIGHT, WINDOW, _binding, _kept_weights, _levels,
                            _max_pass, _next_tile, _plain_weights, _probabilities, _raw_tile, _request_params, _weights)
from .verify import _link, _pick, _quantize, _record_walk_values, _sanitize_coins, _store_verdict

LEVEL_SEARCH_BITS = tl.constexpr(16)  # LEVEL_MAX < 2^16
# The level search (_row_statistics): two passes decide the top 4 bits of both cuts, 2 bits a pass
# from the sums of three digits (_digit_pass; the first pass's three digits of 2^14 levels hold
# every level, LEVEL_MAX < 3 * 2^14, so it sums the total weight too), then one pass counts the ids
# at every level of each cut's window of the other 12 bits (sampling_rows.WINDOW levels) in the
# request's scratch (_count_window), where the cuts are read off (_window_cut).
FIRST_DIGIT_SHIFT = tl.constexpr(14)
SECOND_DIGIT_SHIFT = tl.constexpr(12)
assert semantics.LEVEL_MAX < 3 << 14 and sampling_rows.WINDOW_LEVELS == 1 << 12
# _digit_pass's packed counts: three fields of DIGIT_FIELD_BITS in an int64, one count a tile a lane
# (a row has fewer than 2^21 tiles: V <= 2^23 and tiles of 16 ids at least).
_DIGIT_FIELD_BITS = 21
DIGIT_FIELD_BITS = tl.constexpr(_DIGIT_FIELD_BITS)
DIGIT_FIELD_MASK = tl.constexpr((1 << _DIGIT_FIELD_BITS) - 1)
ZERO_TILE = tl.constexpr(512)  # window levels a store zeroes (_count_window)
CUT_TILE = tl.constexpr(512)  # window levels a step of _window_cut reads
REGISTER_FILE = 65536  # 32-bit registers an SM (sm_80 to sm_100)
# The listed top-k (_listed_cuts): rows with 0 < top_k <= the launch's LIST_TOP_K (at most
# LIST_TOP_K_MAX) list their heaviest ids, at most LIST_DEPTH a lane and LIST_CAP a row, instead
# of searching the levels; a row whose list overflows searches.
LIST_TOP_K_MAX = 128  # 64 until the forty-first session: top-k 65-128 searched, 2.1-4.2x the time (H200)
_LIST_DEPTH = 8
LIST_DEPTH = tl.constexpr(_LIST_DEPTH)  # ids a lane lists
_LIST_CAP = 256  # twice the largest listed top-k: room for the ids tied with the k-th
LIST_CAP = tl.constexpr(_LIST_CAP)
LIST_STEPS = tl.constexpr(4)  # listed entries compared with all a loop step (_listed_cuts)
# A request's int16 scratch elements beside the lanes' slots (2 * LIST_DEPTH * BLOCK_V): the list's
# int64 keys and its results (LISTED_*, int64, after them).
_LIST_SCRATCH = 4 * _LIST_CAP + 12
LIST_SCRATCH = tl.constexpr(_LIST_SCRATCH)
LISTED_KEY_CUT = tl.constexpr(0)
LISTED_LEVEL_CUT = tl.constexpr(1)
LISTED_TOTAL = tl.constexpr(2)
# _walk_tests' modes
ALL_TESTS = tl.constexpr(0)
LEVEL_TESTS = tl.constexpr(1)
NO_TESTS = tl.constexpr(2)


# ----------------------------------------------------------------------------------------------
# device helpers


@triton.jit
def _mul32(a, b):
    """(a * b) mod 2^32 for int64 a in [0, 2^32) and a 32-bit constant b (no int64 overflow)."""
    low = (a & 0xFFFF) * b
    high = ((a >> 16) * b) & 0xFFFF
    return (low + (high << 16)) & 0xFFFFFFFF


@triton.jit
def _fmix32(h):
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


@triton.jit
def _hash_key(seed, offset):
    """The hash state after folding seed and offset (the part of ``_hash_coin`` shared by every
    coin of a request)."""
    h = tl.zeros_like(seed) + 0x9E3779B9
    h = _fmix32(h ^ (seed & 0xFFFFFFFF))
    h = _fmix32(h ^ ((seed >> 32) & 0xFFFFFFFF))
    h = _fmix32(h ^ (offset & 0xFFFFFFFF))
    return _fmix32(h ^ ((offset >> 32) & 0xFFFFFFFF))


@triton.jit
def _keyed_coin(key, position, purpose):
    """``_hash_coin`` from a request's ``_hash_key``."""
    h = _fmix32(key ^ (position & 0xFFFFFFFF))
    h = _fmix32(h ^ purpose)
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def _hash_coin(seed, offset, position, purpose):
    """The counter-based coin in [0, 1 - 2^-24] (float32) of int64 (seed, offset, position)."""
    return _keyed_coin(_hash_key(seed, offset), position, purpose)


# ----------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _digit_pass(logits_ptr, row_offsets, active_p, active_k, prefix_p, prefix_k, shift, row_len, num_blocks, vocab, stride_col,
                row_max, scale, table_ptr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """One pass of both cut searches over (R,) rows: the weight (top-p) and the count (top-k) of
    the ids in each of the three digits above each search's prefix, digit j holding the levels
    [prefix + j * 2^shift, prefix + (j + 1) * 2^shift). Returns (top-p's three int64 weights,
    top-k's three int64 counts), each (R,). Per lane, the weights take three int64 sums and the
    counts one int64 of three DIGIT_FIELD_BITS fields (a lane adds at most one a tile, and a row
    has fewer than 2^DIGIT_FIELD_BITS tiles). Rows with no top-p search left skip the weights
    (the table gather and the int64 sums)."""
    low_p = prefix_p.to(tl.int32)[:, None]  # levels < 2^16
    low_k = prefix_k.to(tl.int32)[:, None]
    searching = active_p | active_k
    counting = active_k[:, None]
    weight_0 = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int64)
    weight_1 = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int64)
    weight_2 = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int64)
    packed = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int64)
    ahead = _raw_tile(logits_ptr, row_offsets, searching, 0, row_len, 0, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
    if tl.max(active_p.to(tl.int32), axis=0) > 0:
        weighing = active_p[:, None]
        for k in range(num_blocks):
            cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, searching, 0, row_len, k, vocab, stride_col, BLOCK_V,
                                            SCALAR_LOADS=True)
            level = _levels(x, row_max, scale, tl.int32)
            digit = (level - low_p) >> shift  # negative below the prefix
            weight = tl.where(ok & weighing & (digit >= 0) & (digit < 3), _weights(level, table_ptr, None), 0)
            weight_0 += tl.where(digit == 0, weight, 0)
            weight_1 += tl.where(digit == 1, weight, 0)
            weight_2 += tl.where(digit == 2, weight, 0)
            packed += _digit_counts(level, low_k, shift, ok & counting)
    else:
        for k in range(num_blocks):
            cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, searching, 0, row_len, k, vocab, stride_col, BLOCK_V,
                                            SCALAR_LOADS=True)
            packed += _digit_counts(_levels(x, row_max, scale, tl.int32), low_k, shift, ok & counting)
    count_0 = tl.sum(packed & DIGIT_FIELD_MASK, axis=1)
    count_1 = tl.sum((packed >> DIGIT_FIELD_BITS) & DIGIT_FIELD_MASK, axis=1)
    count_2 = tl.sum(packed >> (2 * DIGIT_FIELD_BITS), axis=1)
    return tl.sum(weight_0, axis=1), tl.sum(weight_1, axis=1), tl.sum(weight_2, axis=1), count_0, count_1, count_2


@triton.jit
def _digit_counts(level, low, shift, ok):
    """A tile's part of ``_digit_pass``'s packed counts: one in field j for each id ``ok`` in
    digit j above ``low``."""
    digit = (level - low) >> shift
    inside = ok & (digit >= 0) & (digit < 3)
    return tl.where(inside, tl.full(level.shape, 1, dtype=tl.int64) << (tl.maximum(digit, 0) * DIGIT_FIELD_BITS).to(tl.int64), 0)


@triton.jit
def _next_digit(prefix, below, part_0, part_1, part_2, active, limit, shift):
    """One search's next two bits from ``_digit_pass``'s sums of its three digits: the largest
    candidate prefix + j * 2^shift (j = 1..3) that is <= LEVEL_MAX and whose sum below (``below``,
    the sum below the prefix, plus the digits under it) is < ``limit`` (float64: top-p's bound, or
    top-k's k). The sums grow with j, so the candidates that qualify are j = 1..J. Returns (prefix,
    the sum below it), unchanged where not ``active``."""
    step = tl.full(prefix.shape, 1, dtype=tl.int64) << shift
    below_1 = below + part_0
    below_2 = below_1 + part_1
    below_3 = below_2 + part_2
    take_1 = active & (prefix + step <= LEVEL_MAX) & (below_1.to(tl.float64) < limit)
    take_2 = take_1 & (prefix + 2 * step <= LEVEL_MAX) & (below_2.to(tl.float64) < limit)
    take_3 = take_2 & (prefix + 3 * step <= LEVEL_MAX) & (below_3.to(tl.float64) < limit)
    prefix = prefix + (take_1.to(tl.int64) + take_2.to(tl.int64) + take_3.to(tl.int64)) * step
    return prefix, tl.where(take_3, below_3, tl.where(take_2, below_2, tl.where(take_1, below_1, below)))


@triton.jit
def _count_window(logits_ptr, row_offsets, counts, rows, prefix, row_len, num_blocks, vocab, stride_col, row_max, scale,
                  BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """The last 12 bits' pass of one search: the count of ids at every level of its window of
    WINDOW levels from ``prefix``, for (R,) ``rows``, into ``counts`` (R,) (WINDOW int32 a row,
    zeroed here first), one relaxed atomic add an id in the window. The window's weights follow
    from its levels, so the counts are all its cut needs (``_window_cut``). One search a pass, an
    add an id, on the row passes' tiles: with both windows in one pass, or the every-row window
    pass's groups of 32 ids (one add a group whose ids share a level), the walk kept a 168-216 B
    local frame at the 128-register cap (sm_90, Triton 3.9, offline), with spills and fills in
    every row's code. Ids that share a level add at one address; only the window's ids add."""
    tl.debug_barrier()  # the scratch's readers of an earlier row are done
    for part in range(WINDOW // ZERO_TILE):
        offsets = part * ZERO_TILE + tl.arange(0, ZERO_TILE)
        tl.store(counts[:, None] + offsets[None, :], tl.zeros([BLOCK_R, ZERO_TILE], dtype=tl.int32), mask=rows[:, None])
    tl.debug_barrier()  # zeroed before any thread adds
    low = prefix.to(tl.int32)[:, None]
    ahead = _raw_tile(logits_ptr, row_offsets, rows, 0, row_len, 0, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
    for k in range(num_blocks):
        cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, rows, 0, row_len, k, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
        above = _levels(x, row_max, scale, tl.int32) - low
        inside = ok & (above >= 0) & (above < WINDOW)
        tl.atomic_add(counts[:, None] + tl.where(inside, above, 0), tl.full(above.shape, 1, dtype=tl.int32), mask=inside, sem="relaxed")
    tl.debug_barrier()  # every add is done before any thread reads the counts


@triton.jit
def _window_cut(counts, active, prefix, below, limit, table_ptr, WEIGHED: tl.constexpr, BLOCK_R: tl.constexpr):
    """One search's cut from its window's counts (``_count_window``; WEIGHED: top-p's, each level
    weighing its count times its weight, else top-k's counts): the largest level L in the window,
    <= LEVEL_MAX, whose sum below (``below``, the sum below the prefix, plus the window's levels
    under L) is < ``limit``. That predicate holds on a prefix of the window (the digits chose it
    so), so the cut is the prefix plus the number of levels where it holds, minus one (the prefix
    itself where none does: no candidate level passed). Returns (cut, the sum below it, the count
    at it), the prefix, ``below`` and 0 where not ``active``. The counts are read from L2
    (``.cg``): other threads' atomic adds wrote them."""
    holding = tl.zeros([BLOCK_R], dtype=tl.int64)
    running = below
    below_cut = below
    for part in range(WINDOW // CUT_TILE):
        offsets = part * CUT_TILE + tl.arange(0, CUT_TILE)
        count = tl.load(counts[:, None] + offsets[None, :], mask=active[:, None], other=0, cache_modifier=".cg").to(tl.int64)
        level = prefix[:, None] + offsets[None, :]
        if WEIGHED:
            count = count * _weights(level, table_ptr, (count > 0) & (level <= LEVEL_MAX))
        before = running[:, None] + tl.cumsum(count, axis=1) - count
        holds = (before.to(tl.float64) < limit[:, None]) & (level <= LEVEL_MAX)
        holding += tl.sum(holds.to(tl.int64), axis=1)
        below_cut = tl.maximum(below_cut, tl.max(tl.where(holds, before, 0), axis=1))  # the sums grow along the window
        running += tl.sum(count, axis=1)
    offset = tl.maximum(holding - 1, 0)
    at_cut = tl.load(counts + offset, mask=active, other=0, cache_modifier=".cg").to(tl.int64)
    return tl.where(active, prefix + offset, prefix), tl.where(active, below_cut, below), tl.where(active, at_cut, 0)


@triton.jit
def _kth_smallest_level(levels, rank):
    """The ``rank``-th smallest (1-based) of (R, L) int32 levels (< 2^16) of (R,) rows: the largest
    value V with count(levels < V) < rank, decided bit by bit (2^16 - 1 where fewer than ``rank``
    levels are below it)."""
    value = tl.zeros_like(rank)
    for step in range(LEVEL_SEARCH_BITS):
        candidate = value | ((tl.zeros_like(value) + 1) << (LEVEL_SEARCH_BITS - 1 - step))
        below = tl.sum((levels < candidate[:, None]).to(tl.int32), axis=1)
        value = tl.where(below < rank, candidate, value)
    return value


@triton.jit
def _listed_key(packed, lanes, BLOCK_V: tl.constexpr):
    """The key level * 2^23 + id of ``_listed_cuts``' slots (level << 16 | tile, int32: the level's
    top bit may be the sign's) at ``lanes``."""
    level = (packed >> 16) & 0xFFFF
    return level.to(tl.int64) * ID_SCALE + ((packed & 0xFFFF) * BLOCK_V + lanes[None, :]).to(tl.int64)


@triton.jit
def _list_keys(scratch, BLOCK_V: tl.constexpr):
    """The int64 keys of a row's list in its int16 ``scratch``: past the lanes' slots (LIST_DEPTH
    int32 a lane); the results (LISTED_*) follow the LIST_CAP keys."""
    return (scratch + 2 * LIST_DEPTH * BLOCK_V).to(tl.pointer_type(tl.int64))


@triton.jit
def _list_tile(slots_ptr, level, ok, list_level, taken, lanes, tile, BLOCK_V: tl.constexpr):
    """One tile of ``_listed_cuts``' listing pass: each lane's ids at a level <= ``list_level``
    stored in its next slot (LIST_DEPTH a lane; a level < 2^16 and a tile < 2^16 packed as
    level << 16 | tile, since V <= 2^23 and BLOCK_V >= 128: ``_listed_key``); the lanes' new
    counts ``taken`` (past LIST_DEPTH: the row overflows)."""
    listing = ok & (level <= list_level[:, None])
    tl.store(slots_ptr[:, None] + (taken * BLOCK_V + lanes[None, :]), (level << 16) | tile, mask=listing & (taken < LIST_DEPTH))
    return taken + listing.to(tl.int32)


@triton.jit
def _listed_cuts(logits_ptr, row_offsets, rows, vocab, stride_col, row_max, lane_max, scale, top_k, use_top_p, top_p, min_weight,
                 table_ptr, scratch, row_len, num_blocks, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """Whether each of (R,) ``rows`` (whose top-k is at most LIST_TOP_K) got its cuts from a list
    of its heaviest ids instead of the level search; a listed row's key cut, level cut and kept
    total are left in its scratch (``_listed_results``), an unlisted row's (its list overflowed)
    to the search. ``lane_max`` (R, BLOCK_V): each lane's max, from the max pass.

    The k-th heaviest of the lanes' maxima has a level L_t at or below which at least k ids lie
    (one a lane), so top-k's cut level is at most L_t. One pass lists every id at a level <= L_t
    (and, for top-p, sums the total weight W) in its lane's slots of the row's scratch
    (``scratch``; an id's tile and level packed in an int32, LIST_DEPTH a lane), then densely as
    int64 keys level * 2^23 + id (LIST_CAP at most). The list holds every id of every level
    <= L_t, so within it each id's rank among the keys and the weight of the levels heavier than
    its own are those of the whole row: top-k's cut is the key of rank k - 1, top-p's the deepest
    listed level whose heavier mass is below top_p * W (a cut below L_t keeps every listed level,
    as the true cut does, and top-k keeps nothing beyond them), and the kept total is summed over
    the list. Same integers as the search by construction."""
    lanes = tl.arange(0, BLOCK_V)
    list_level = _kth_smallest_level(_levels(lane_max, row_max, scale, tl.int32), top_k)
    collecting = rows & (list_level < LEVEL_MAX)  # else (a row of few finite logits) the search

    # Each lane stores its listed ids (packed level and tile, int32) in slots of its own in the
    # row's scratch, LIST_DEPTH at most; only its count stays in registers. With two slots a lane
    # in registers, a third id in a lane sent the row to the search (at 1024 lanes and k 50 about
    # 2.5% of rows, estimated), and one such request keeps its whole launch waiting: H200, bs 256
    # N 8 V 151936, top-k 50, 1590 us against 915 with these slots (BENCHMARKS.md, fortieth session).
    slots_ptr = scratch.to(tl.pointer_type(tl.int32))
    keys_ptr = _list_keys(scratch, BLOCK_V)
    taken = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int32)
    weight_lanes = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int64)  # W, for top-p
    tl.debug_barrier()  # the scratch's readers of an earlier row are done
    ahead = _raw_tile(logits_ptr, row_offsets, collecting, 0, row_len, 0, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
    if tl.max((collecting & use_top_p).to(tl.int32), axis=0) > 0:
        for k in range(num_blocks):
            cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, collecting, 0, row_len, k, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
            level = _levels(x, row_max, scale, tl.int32)
            taken = _list_tile(slots_ptr, level, ok, list_level, taken, lanes, k, BLOCK_V)
            weight_lanes += tl.where(ok, _weights(level, table_ptr, None), 0)
    else:
        for k in range(num_blocks):
            cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, collecting, 0, row_len, k, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
            taken = _list_tile(slots_ptr, _levels(x, row_max, scale, tl.int32), ok, list_level, taken, lanes, k, BLOCK_V)
    bound = top_p * tl.sum(weight_lanes, axis=1).to(tl.float64)
    listed_count = tl.sum(taken, axis=1)
    deepest = tl.max(taken, axis=1)
    listed = collecting & (deepest <= LIST_DEPTH) & (listed_count <= LIST_CAP)

    # The list, dense: lane l's ids at [start_l, start_l + taken_l), slot by slot.
    start = tl.cumsum(taken, axis=1) - taken
    tl.debug_barrier()  # the slots are stored before any thread reads them
    for depth in range(tl.max(tl.where(listed, deepest, 0), axis=0)):
        holds = listed[:, None] & (depth < taken)
        packed = tl.load(slots_ptr[:, None] + (depth * BLOCK_V + lanes[None, :]), mask=holds, other=0)
        tl.store(keys_ptr[:, None] + start + depth, _listed_key(packed, lanes, BLOCK_V), mask=holds)
    tl.debug_barrier()  # the list is stored before any thread reads it

    entries = tl.arange(0, LIST_CAP)
    present = listed[:, None] & (entries[None, :] < listed_count[:, None])
    keys = tl.load(keys_ptr[:, None] + entries[None, :], mask=present, other=KEEP_ALL_KEY)
    levels = (keys >> ID_BITS).to(tl.int32)
    weights = _weights(levels, table_ptr, present)
    # Each entry's rank among the listed keys and the weight of the entries before it in key
    # order (an entry's running weight E: it bounds its level's heavier mass from above and
    # equals it at the level's first entry), the entries read back LIST_STEPS at a time against
    # all: top-k keeps the entries of rank < k, top-p's cut (the heaviest level whose heavier mass
    # is below the bound) is the deepest level of an entry with E below the bound. H200: the op
    # took 0.90-1.02x its time with a tl.sort of the keys and a running sum of their weights
    # instead, and the interpreter runs tl.sort element by element in Python, seconds a call
    # (BENCHMARKS.md, forty-first session).
    rank = tl.zeros([BLOCK_R, LIST_CAP], dtype=tl.int32)
    heavier = tl.zeros([BLOCK_R, LIST_CAP], dtype=tl.int64)
    for chunk in range(tl.cdiv(tl.max(tl.where(listed, listed_count, 0), axis=0), LIST_STEPS)):
        for step in tl.static_range(LIST_STEPS):
            other = chunk * LIST_STEPS + step
            other_present = listed & (other < listed_count)
            other_key = tl.load(keys_ptr + other, mask=other_present, other=KEEP_ALL_KEY)
            before = other_key[:, None] < keys
            rank += before.to(tl.int32)
            heavier += tl.where(before, _weights((other_key >> ID_BITS).to(tl.int32), table_ptr, other_present)[:, None], 0)
    in_top_k = present & (rank < top_k[:, None])
    key_cut = tl.max(tl.where(in_top_k, keys, -1), axis=1)
    in_top_p = present & (heavier.to(tl.float64) < bound[:, None])
    level_cut = tl.max(tl.where(in_top_p, levels, -1), axis=1)
    level_cut = tl.where(use_top_p, level_cut, LEVEL_MAX)
    kept = in_top_k & (levels <= level_cut[:, None]) & (weights >= min_weight[:, None])
    # The results wait in the scratch while a row whose list overflowed searches: kept in
    # registers across the search's passes they added to the walk's local frame (sm_90, Triton
    # 3.6, offline: 72 -> 40 B in one spec).
    cuts_ptr = keys_ptr + LIST_CAP
    tl.store(cuts_ptr + LISTED_KEY_CUT, key_cut, mask=rows)
    tl.store(cuts_ptr + LISTED_LEVEL_CUT, level_cut.to(tl.int64), mask=rows)
    tl.store(cuts_ptr + LISTED_TOTAL, tl.sum(tl.where(kept, weights, 0), axis=1), mask=rows)
    return listed


@triton.jit
def _listed_results(scratch, listed, key_cut, level_cut, kept_total, BLOCK_V: tl.constexpr):
    """(key cut, level cut, kept total) of (R,) rows: ``_listed_cuts``' where it ``listed``
    (a listed row's scratch holds no top-p window), the given values elsewhere."""
    cuts_ptr = _list_keys(scratch, BLOCK_V) + LIST_CAP
    tl.debug_barrier()  # the results are stored before any thread reads them
    key_cut = tl.where(listed, tl.load(cuts_ptr + LISTED_KEY_CUT, mask=listed, other=0), key_cut)
    level_cut = tl.where(listed, tl.load(cuts_ptr + LISTED_LEVEL_CUT, mask=listed, other=0), level_cut)
    kept_total = tl.where(listed, tl.load(cuts_ptr + LISTED_TOTAL, mask=listed, other=0), kept_total)
    return key_cut, level_cut, kept_total


@triton.jit
def _floor_level(min_weight, table_ptr):
    """min-p's test as a level cut: the deepest level whose weight is at least ``min_weight`` (R,)
    (weights fall as levels grow, so a weight passes the floor exactly when its level is at most
    this one), LEVEL_MAX where ``min_weight`` <= 0. Bit by bit over the table, a gather a bit."""
    level = tl.zeros(min_weight.shape, dtype=tl.int32)
    for step in tl.static_range(LEVEL_SEARCH_BITS):
        candidate = level | ((tl.zeros_like(level) + 1) << (LEVEL_SEARCH_BITS - 1 - step))
        holds = (candidate <= LEVEL_MAX) & (_weights(candidate, table_ptr, None) >= min_weight)
        level = tl.where(holds, candidate, level)
    return tl.where(min_weight > 0, level, LEVEL_MAX)


@triton.jit
def _walk_tests(rows, greedy, key_cut, level_limit):
    """Which tests a pass of the walk weighs (R,) ``rows`` with (a scalar): NO_TESTS where none is
    greedy or cut (temperature alone: every id's plain weight), LEVEL_TESTS where none is greedy
    or has a key cut (top-p and min-p alone are a level limit, ``_row_statistics``: only the ids
    at or above it are weighed), ALL_TESTS otherwise (``_kept_weights``)."""
    keyed = rows & ((greedy != 0) | (key_cut != KEEP_ALL_KEY))
    limited = rows & (level_limit < LEVEL_MAX)
    return tl.where(tl.max(keyed.to(tl.int32), axis=0) > 0, ALL_TESTS,
                    tl.where(tl.max(limited.to(tl.int32), axis=0) > 0, LEVEL_TESTS, NO_TESTS))


@triton.jit
def _walk_weights(tests, x, ids, ok, row_max, argmax, scale, greedy, key_cut, level_limit, min_weight, table_ptr):
    """The kept weights of a tile of the walk's passes under ``_walk_tests``' ``tests``: the same
    values as ``_kept_weights`` in every mode. The level limit gathers the weights of the ids it
    keeps alone."""
    if tests == NO_TESTS:
        kept = _plain_weights(x, ok, row_max, scale, table_ptr)
    elif tests == LEVEL_TESTS:
        level = _levels(x, row_max, scale, tl.int32)
        kept = _weights(level, table_ptr, ok & (level <= level_limit[:, None]))
    else:
        kept = _kept_weights(x, ids, ok, row_max, argmax, scale, greedy, key_cut, level_limit, min_weight, table_ptr)
    return kept


@triton.jit
def _row_statistics(logits_ptr, row_offsets, row_ok, vocab, stride_col, greedy, scale, top_k, top_p, min_weight, table_ptr,
                    window_ptr, window_rows, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, WANT_LSE: tl.constexpr,
                    CUTS: tl.constexpr, LIST_TOP_K: tl.constexpr):
    """Steps 1-4 of (R,) rows: (max, argmax, raw log-sum-exp (0 without WANT_LSE), top-k key cut,
    level limit (int32: top-p's level cut or min-p's floor, the shallower), kept total W'; a
    greedy row's W' is its argmax's weight, with no pass). A row whose top-k is at most
    LIST_TOP_K takes the cuts and W' from ``_listed_cuts`` (one pass after the max, which keeps
    the lanes' maxima for it) unless its list overflows. Otherwise, passes over a row: one for
    max/argmax(/lse); with top-p or top-k on, the level search (two digit passes and one counting
    the windows, whose counts give the cuts) and, only when the top-k cut splits the ids tied at
    its level, one tie count and one tile read again (``_tied_id``); one for the kept total
    (``_walk_tests`` picks its tests). ``window_ptr`` + ``window_rows`` (R,): each row's scratch
    (int16 elements, ``fused_scratch_len``)."""
    num_blocks = tl.cdiv(vocab, BLOCK_V)
    # Every row pass reads a tile ahead through sampling_rows' chunk helpers, the whole row as
    # chunk 0 (H100, the fused walk forced: 0.84-0.86x of its time with top-k and top-p at
    # V 151936, 1.00x at V 32000; BENCHMARKS.md, twenty-second session).
    row_len = num_blocks * BLOCK_V
    # Pass 1: max, argmax (lowest id of the max) and, for raw logprobs, the online log-sum-exp.
    row_max, argmax, sum_exp, lane_max = _max_pass(logits_ptr, row_offsets, row_ok, 0, row_len, vocab, stride_col, BLOCK_R, BLOCK_V,
                                                   WANT_LSE, SCALAR_LOADS=True)
    lse = tl.where(row_max > float("-inf"), row_max + tl.log(sum_exp), float("-inf"))

    # The cuts: the largest level L whose (monotone) predicate holds, top-p's float64(mass of
    # levels < L) < top_p * W, top-k's count(levels < L) < k. The two searches share their digit
    # passes; rows with neither mask skip them.
    use_top_p = row_ok & (greedy == 0) & (top_p < 1)
    use_top_k = row_ok & (greedy == 0) & (top_k > 0)
    level_cut = tl.full([BLOCK_R], LEVEL_MAX, dtype=tl.int64)
    key_cut = tl.full([BLOCK_R], KEEP_ALL_KEY, dtype=tl.int64)
    listed = tl.zeros([BLOCK_R], dtype=tl.int1)
    # CUTS (a constexpr): launches where no row can have a cut (the host knows top_k and top_p are
    # off) compile neither the list nor the search, whose registers the other passes then keep.
    if CUTS:
        listing = use_top_k & (top_k <= LIST_TOP_K)  # LIST_TOP_K 0: none
        if tl.max(listing.to(tl.int32), axis=0) > 0:
            listed = _listed_cuts(logits_ptr, row_offsets, listing, vocab, stride_col, row_max, lane_max, scale, top_k, use_top_p, top_p,
                                  min_weight, table_ptr, window_ptr + window_rows, row_len, num_blocks, BLOCK_R, BLOCK_V)
            use_top_p = use_top_p & (listed == 0)
            use_top_k = use_top_k & (listed == 0)
        if tl.max((use_top_p | use_top_k).to(tl.int32), axis=0) > 0:
            # Two digit passes decide the top 4 bits of both cuts (the first sums top-p's total weight
            # too), one pass a search counts its window of the other 12 bits, and the cuts are read
            # off the counts: top-p alone takes 3 row passes here where the search of one bit a pass
            # took 6 (the total, 4 bits, the window's store) and 12 over its stored window, top-k
            # alone 3 where it took 9 (8 and a tie count every time). A search that _binding stops
            # keeps its prefix (the other cut lies wholly below its range).
            zero = tl.zeros([BLOCK_R], dtype=tl.int64)
            weight_0, weight_1, weight_2, count_0, count_1, count_2 = _digit_pass(
                logits_ptr, row_offsets, use_top_p, use_top_k, zero, zero, FIRST_DIGIT_SHIFT, row_len, num_blocks, vocab, stride_col,
                row_max, scale, table_ptr, BLOCK_R, BLOCK_V)
            bound = top_p * (weight_0 + weight_1 + weight_2).to(tl.float64)
            limit_k = top_k.to(tl.float64)  # count < k, exactly (counts < 2^53)
            prefix_p, below_p = _next_digit(zero, zero, weight_0, weight_1, weight_2, use_top_p, bound, FIRST_DIGIT_SHIFT)
            prefix_k, below_k = _next_digit(zero, zero, count_0, count_1, count_2, use_top_k, limit_k, FIRST_DIGIT_SHIFT)
            active_p, active_k = _binding(prefix_p, prefix_k, use_top_p, use_top_k)
            if tl.max((active_p | active_k).to(tl.int32), axis=0) > 0:
                weight_0, weight_1, weight_2, count_0, count_1, count_2 = _digit_pass(
                    logits_ptr, row_offsets, active_p, active_k, prefix_p, prefix_k, SECOND_DIGIT_SHIFT, row_len, num_blocks, vocab,
                    stride_col, row_max, scale, table_ptr, BLOCK_R, BLOCK_V)
                prefix_p, below_p = _next_digit(prefix_p, below_p, weight_0, weight_1, weight_2, active_p, bound, SECOND_DIGIT_SHIFT)
                prefix_k, below_k = _next_digit(prefix_k, below_k, count_0, count_1, count_2, active_k, limit_k, SECOND_DIGIT_SHIFT)
                active_p, active_k = _binding(prefix_p, prefix_k, active_p, active_k)
            cut_p, cut_k = prefix_p, prefix_k
            tied = zero  # ids at top-k's cut level
            if tl.max((active_p | active_k).to(tl.int32), axis=0) > 0:
                counts = (window_ptr + window_rows).to(tl.pointer_type(tl.int32))
                if tl.max(active_p.to(tl.int32), axis=0) > 0:
                    _count_window(logits_ptr, row_offsets, counts, active_p, prefix_p, row_len, num_blocks, vocab, stride_col, row_max,
                                  scale, BLOCK_R, BLOCK_V)
                    cut_p, _, _ = _window_cut(counts, active_p, prefix_p, below_p, bound, table_ptr, True, BLOCK_R)
                if tl.max(active_k.to(tl.int32), axis=0) > 0:
                    _count_window(logits_ptr, row_offsets, counts, active_k, prefix_k, row_len, num_blocks, vocab, stride_col, row_max,
                                  scale, BLOCK_R, BLOCK_V)
                    cut_k, below_k, tied = _window_cut(counts, active_k, prefix_k, below_k, limit_k, table_ptr, False, BLOCK_R)
            level_cut = tl.where(use_top_p, cut_p, level_cut)
            # top-k keeps the levels below cut_k and the (k - below_k) lowest ids at cut_k; a stopped
            # top-k search keeps every level up to its prefix (above cut_p: no tie to split). When the
            # cut splits the tied ids (the window counted them), one pass counts the ties tile by tile
            # to the tile holding the (k - below_k)-th (in id order), and that one tile is read again
            # and the id found by a bitwise search over its positions in registers. A search over the
            # row's ids took ceil(log2 V) passes (18 at V 151936), and with bf16 logits the k-th level
            # is usually tied.
            need = top_k - below_k
            split_tie = active_k & (tied > need)
            id_cut = tl.full([BLOCK_R], ID_LAST, dtype=tl.int64)
            if tl.max(split_tie.to(tl.int32), axis=0) > 0:
                crossing_tile, rank = _crossing_tie_tile(logits_ptr, row_offsets, split_tie, cut_k, need, row_len, num_blocks, vocab,
                                                         stride_col, row_max, scale, BLOCK_R, BLOCK_V)
                id_cut = tl.where(split_tie, _tied_id(logits_ptr, row_offsets, split_tie, crossing_tile, rank, cut_k, row_max, scale, vocab,
                                                     stride_col, BLOCK_R, BLOCK_V), id_cut)
            key_cut = tl.where(use_top_k, cut_k * ID_SCALE + id_cut, key_cut)

    # The kept total W' (a listed row's is the list's; a greedy row's its argmax's weight alone).
    # min-p's floor joins the level cut (the row's level limit, what the walk's tests take).
    kept_total = tl.zeros([BLOCK_R], dtype=tl.int64)
    if CUTS and tl.max(listed.to(tl.int32), axis=0) > 0:
        key_cut, level_cut, kept_total = _listed_results(window_ptr + window_rows, listed, key_cut, level_cut, kept_total, BLOCK_V)
    level_limit = level_cut.to(tl.int32)
    if tl.max((row_ok & (min_weight > 0)).to(tl.int32), axis=0) > 0:  # its search's 16 dependent gathers only for min-p
        level_limit = tl.minimum(level_limit, _floor_level(min_weight, table_ptr))
    summing = row_ok & (listed == 0) & (greedy == 0)
    if tl.max(summing.to(tl.int32), axis=0) > 0:
        kept_lanes = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int64)
        ahead = _raw_tile(logits_ptr, row_offsets, summing, 0, row_len, 0, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
        tests = _walk_tests(summing, greedy, key_cut, level_limit)
        for k in range(num_blocks):
            cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, summing, 0, row_len, k, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
            kept_lanes += _walk_weights(tests, x, cols[None, :], ok, row_max, argmax, scale, greedy, key_cut, level_limit, min_weight,
                                        table_ptr)
        kept_total = tl.where(listed, kept_total, tl.sum(kept_lanes, axis=1))
    kept_total = tl.where(greedy != 0, TOP_WEIGHT, kept_total)
    return row_max, argmax, lse, key_cut, level_limit, kept_total


@triton.jit
def _hash_coins_kernel(seed_ptr, offset_ptr, coins_ptr, final_ptr, bs, width, BLOCK_R: tl.constexpr, W_PAD: tl.constexpr):
    request = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    request_ok = request < bs
    seed = tl.load(seed_ptr + request, mask=request_ok, other=0).to(tl.int64)
    offset = tl.load(offset_ptr + request, mask=request_ok, other=0).to(tl.int64)
    positions = tl.arange(0, W_PAD).to(tl.int64)
    seeds = seed[:, None] + tl.zeros([BLOCK_R, W_PAD], dtype=tl.int64)
    offsets = offset[:, None] + tl.zeros([BLOCK_R, W_PAD], dtype=tl.int64)
    coins = _hash_coin(seeds, offsets, positions[None, :] + tl.zeros([BLOCK_R, W_PAD], dtype=tl.int64), 1)
    tl.store(coins_ptr + request.to(tl.int64)[:, None] * width + positions[None, :], coins,
             mask=request_ok[:, None] & (positions[None, :] < width))
    final = _hash_coin(seed, offset, tl.zeros([BLOCK_R], dtype=tl.int64), 2)
    tl.store(final_ptr + request, final, mask=request_ok)


@triton.jit
def _gather_logits(logits_ptr, row_offsets, ids, ok, stride_col):
    """Sanitised float32 logits of (R,) rows at token ``ids`` (R, L); -inf outside ``ok``."""
    x = tl.load(logits_ptr + row_offsets[:, None] + ids.to(tl.int64) * stride_col, mask=ok, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("-inf"), x)
    x = tl.minimum(x, FLT_MAX)
    return tl.where(ok, x, float("-inf"))


@triton.jit
def _crossing_tie_tile(logits_ptr, row_offsets, rows, cut_k, need, row_len, num_blocks, vocab, stride_col, row_max, scale,
                       BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """The tile of (R,) ``rows`` holding their ``need``-th id (in id order) at level ``cut_k``, and
    that id's rank among the tile's ids at the level: one pass counting them tile by tile."""
    tied = tl.zeros([BLOCK_R], dtype=tl.int64)
    crossing_tile = tl.zeros([BLOCK_R], dtype=tl.int32)
    rank = tl.zeros([BLOCK_R], dtype=tl.int64)
    ahead = _raw_tile(logits_ptr, row_offsets, rows, 0, row_len, 0, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
    for k in range(num_blocks):
        cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, rows, 0, row_len, k, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
        in_tile = tl.sum((ok & (_levels(x, row_max, scale) == cut_k[:, None])).to(tl.int32), axis=1).to(tl.int64)
        crosses = (tied < need) & (need <= tied + in_tile)
        crossing_tile = tl.where(crosses, k, crossing_tile)
        rank = tl.where(crosses, need - tied, rank)
        tied += in_tile
    return crossing_tile, rank


@triton.jit
def _tied_id(logits_ptr, row_offsets, rows_ok, tile, rank, cut_k, row_max, scale, vocab, stride_col, BLOCK_R: tl.constexpr,
             BLOCK_V: tl.constexpr):
    """The id of the ``rank``-th (1-based, in id order) token at level ``cut_k`` within tile
    ``tile`` of (R,) rows (int64): one gathered tile, then a bitwise search over its positions
    for the largest P with count(tied positions < P) < rank, each step a sum in registers."""
    lanes = tl.arange(0, BLOCK_V)
    cols = tile[:, None] * BLOCK_V + lanes[None, :]
    ok = rows_ok[:, None] & (cols < vocab)
    at_cut = ok & (_levels(_gather_logits(logits_ptr, row_offsets, cols, ok, stride_col), row_max, scale) == cut_k[:, None])
    position = tl.zeros([BLOCK_R], dtype=tl.int32)
    bit = BLOCK_V // 2
    while bit > 0:
        candidate = position | bit
        count = tl.sum((at_cut & (lanes[None, :] < candidate[:, None])).to(tl.int32), axis=1)
        position = tl.where(count < rank, candidate, position)
        bit = bit // 2
    return (tile * BLOCK_V + position).to(tl.int64)


@triton.jit
def _fused_walk_kernel(logits_ptr, stride_row, stride_col, vocab, table_ptr,
                       temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value, min_p_value,
                       tensor_params, next_token_ptr, next_sibling_ptr, cand_ptr, coins_ptr, final_coins_ptr, seed_ptr, offset_ptr,
                       predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, logprob_ptr, bs, nodes, num_steps,
                       flag_ptr, flag_code, chain_shift, window_ptr,
                       BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, N_PAD: tl.constexpr, W_PAD: tl.constexpr, NB_PAD: tl.constexpr,
                       PIECE: tl.constexpr, HASH_COINS: tl.constexpr, LOGPROBS: tl.constexpr, CUTS: tl.constexpr, LIST_TOP_K: tl.constexpr,
                       BLOCK_TILES: tl.constexpr):
    """The from-logits tree walk: each request processes only the rows it stands on (the path
    nodes), at the moment it stands there, then samples its final token from the last one.
    LOGPROBS: 0 none, 1 raw, 2 processed (the emitted tokens' logprobs, (bs, S+1)).
    CUTS: whether a row may have a top-k or top-p cut (else neither the list nor the search is
    compiled). LIST_TOP_K: the largest top-k listed rather than searched (``_listed_cuts``; 0: none).
    BLOCK_TILES: tiles of the final row's blocks (NB_PAD of them at most; ``fused_block_pad``).
    ``window_ptr``: (bs, fused_scratch_len) int16 scratch of the level search's window counts and
    the top-k list."""
    BLOCK_SPAN: tl.constexpr = BLOCK_TILES * BLOCK_V  # ids of the final row's blocks
    req = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    req_ok = req < bs
    greedy, scale, top_k, top_p, min_weight = _request_params(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value,
                                                              top_k_value, top_p_value, min_p_value, tensor_params, req, req_ok, vocab)
    lanes = tl.arange(0, N_PAD)
    ok = req_ok[:, None] & (lanes[None, :] < nodes)
    block_base = req.to(tl.int64) * nodes
    node_ids = block_base[:, None] + lanes[None, :]
    LIST_LEN: tl.constexpr = 2 * LIST_DEPTH * BLOCK_V + LIST_SCRATCH
    SCRATCH_LEN: tl.constexpr = LIST_LEN if LIST_LEN > 2 * WINDOW else 2 * WINDOW  # fused_scratch_len
    window_rows = req.to(tl.int64) * SCRATCH_LEN
    cand = tl.load(cand_ptr + node_ids, mask=ok, other=-1).to(tl.int64)
    cand_ok = ok & (cand >= 0) & (cand < vocab)
    # Error flag, as the walk of verify_sampling records; chain_shift 1 for a chain (its links are
    # ours; drafts = nodes 1.., index b*S + j - 1, recorded as the chain op's draft_ids).
    _record_walk_values(flag_ptr, flag_code, next_token_ptr, next_sibling_ptr, cand, node_ids - (req.to(tl.int64)[:, None] + 1) * chain_shift,
                        node_ids, ok, nodes, vocab, chain_shift)
    key = tl.zeros([BLOCK_R], dtype=tl.int64)
    if HASH_COINS:
        key = _hash_key(tl.load(seed_ptr + req, mask=req_ok, other=0).to(tl.int64), tl.load(offset_ptr + req, mask=req_ok, other=0).to(tl.int64))

    width_lanes = tl.arange(0, W_PAD)
    last = tl.zeros([BLOCK_R], dtype=tl.int32)
    num_correct = tl.zeros([BLOCK_R], dtype=tl.int32)
    rejected = tl.zeros([BLOCK_R, N_PAD], dtype=tl.int32)  # nodes rejected at the last node's row
    rejected_q = tl.zeros([BLOCK_R, N_PAD], dtype=tl.int64)
    on_path = tl.where(lanes[None, :] == 0, 1, tl.zeros([BLOCK_R, N_PAD], dtype=tl.int32))
    next_tokens = tl.full([BLOCK_R, N_PAD], -1, dtype=tl.int64)
    accept = tl.where(width_lanes[None, :] == 0, block_base[:, None], tl.full([BLOCK_R, W_PAD], -1, dtype=tl.int64))
    logprobs = tl.full([BLOCK_R, W_PAD], float("nan"), dtype=tl.float32)
    # The statistics of the row each request stands on (after the loop: its final row).
    row_max = tl.zeros([BLOCK_R], dtype=tl.float32)
    argmax = tl.zeros([BLOCK_R], dtype=tl.int32)
    lse = tl.zeros([BLOCK_R], dtype=tl.float32)
    key_cut = tl.zeros([BLOCK_R], dtype=tl.int64)
    level_limit = tl.zeros([BLOCK_R], dtype=tl.int32)  # top-p's level cut or min-p's floor
    kept_total = tl.zeros([BLOCK_R], dtype=tl.int64)
    standing = req_ok
    level = tl.zeros([BLOCK_R], dtype=tl.int32)
    while tl.max(standing.to(tl.int32), axis=0) > 0:
        node = block_base + last
        row_offsets = node * stride_row
        new_max, new_arg, new_lse, new_key, new_limit, new_total = _row_statistics(
            logits_ptr, row_offsets, standing, vocab, stride_col, greedy, scale, top_k, top_p, min_weight, table_ptr,
            window_ptr, window_rows, BLOCK_R, BLOCK_V, LOGPROBS == 1, CUTS, LIST_TOP_K)
        row_max = tl.where(standing, new_max, row_max)
        argmax = tl.where(standing, new_arg, argmax)
        if LOGPROBS == 1:
            lse = tl.where(standing, new_lse, lse)
        key_cut = tl.where(standing, new_key, key_cut)
        level_limit = tl.where(standing, new_limit, level_limit)
        kept_total = tl.where(standing, new_total, kept_total)
        descend = standing & (level < num_steps) & (level < nodes - 1)  # never more than N - 1 accepts
        rejected = tl.where(standing[:, None], 0, rejected)
        rejected_q = tl.where(standing[:, None], 0, rejected_q)
        if HASH_COINS:
            coin = _keyed_coin(key, last.to(tl.int64), 1)
        else:
            coin = tl.load(coins_ptr + node, mask=descend, other=0.0)
        coin = _sanitize_coins(coin)
        # The processed probability of every candidate token at this row: one gathered load.
        gather_ok = cand_ok & descend[:, None]
        x = _gather_logits(logits_ptr, row_offsets, cand, gather_ok, stride_col)
        kept = _kept_weights(x, cand, gather_ok, row_max, argmax, scale, greedy, key_cut, level_limit, min_weight, table_ptr)
        row_probs = _probabilities(kept, kept_total)
        cur = _link(tl.load(next_token_ptr + node, mask=descend, other=-1).to(tl.int64), nodes).to(tl.int32)
        acc = tl.zeros([BLOCK_R], dtype=tl.float32)
        chosen = tl.full([BLOCK_R], -1, dtype=tl.int32)
        scanned = tl.zeros([BLOCK_R], dtype=tl.int32)
        while tl.max(cur, axis=0) >= 0:  # follow the child list to the first acceptance (at most N nodes)
            scanning = cur >= 0
            sibling = tl.load(next_sibling_ptr + block_base + cur, mask=scanning, other=-1).to(tl.int64)
            token = _pick(cand, cur, lanes)
            duplicate = tl.sum(tl.where((rejected != 0) & (cand == token[:, None]), 1, 0), axis=1) > 0
            p = tl.where(duplicate, 0.0, _pick(row_probs, cur, lanes))
            acc = tl.where(scanning, acc + p, acc)
            hit = scanning & (coin < acc)
            chosen = tl.where(hit, cur, chosen)
            refused = (lanes[None, :] == cur[:, None]) & (scanning & (hit == 0))[:, None]
            rejected = tl.where(refused, 1, rejected)
            rejected_q = tl.where(refused, _quantize(p)[:, None], rejected_q)
            scanned += 1
            cur = tl.where(scanning & (hit == 0) & (scanned < nodes), _link(sibling, nodes).to(tl.int32), -1)
        standing = chosen >= 0
        if LOGPROBS == 1:
            raw = tl.where(lse > float("-inf"), _pick(x, chosen, lanes) - lse, float("-inf"))
            logprobs = tl.where((width_lanes[None, :] == level[:, None]) & standing[:, None], raw[:, None], logprobs)
        if LOGPROBS == 2:
            processed = tl.log(_pick(row_probs, chosen, lanes))
            logprobs = tl.where((width_lanes[None, :] == level[:, None]) & standing[:, None], processed[:, None], logprobs)
        next_tokens = tl.where((lanes[None, :] == last[:, None]) & standing[:, None], _pick(cand, chosen, lanes)[:, None], next_tokens)
        last = tl.where(standing, chosen, last)
        num_correct += standing.to(tl.int32)
        level += 1
        on_path = tl.where(lanes[None, :] == chosen[:, None], 1, on_path)
        accept = tl.where((width_lanes[None, :] == level[:, None]) & standing[:, None], block_base[:, None] + chosen[:, None], accept)

    # The final token: inverse CDF over the last row's quantised residual (its rejected tokens
    # removed), else over the row, else 0; per-block sums in registers, then the crossing block.
    # A greedy request's is its last row's argmax (the residual of a one-hot row is the row or
    # nothing), so a program of greedy requests reads no final row.
    final_offsets = (block_base + last) * stride_row
    final = argmax.to(tl.int64)
    sampled = req_ok & (greedy == 0)
    if tl.max(sampled.to(tl.int32), axis=0) > 0:
        rejected_tokens = tl.where((rejected != 0) & cand_ok, cand, -1)
        if HASH_COINS:
            final_coin = _keyed_coin(key, tl.zeros([BLOCK_R], dtype=tl.int64), 2)
        else:
            final_coin = tl.load(final_coins_ptr + req, mask=req_ok, other=0.0)
        final_coin = _sanitize_coins(final_coin)
        blocks = tl.arange(0, NB_PAD)
        row_sums = tl.zeros([BLOCK_R, NB_PAD], dtype=tl.int64)
        residual_sums = tl.zeros([BLOCK_R, NB_PAD], dtype=tl.int64)
        num_tiles = tl.cdiv(vocab, BLOCK_V)
        row_len = num_tiles * BLOCK_V  # the final row as chunk 0 (see _row_statistics)
        ahead = _raw_tile(logits_ptr, final_offsets, req_ok, 0, row_len, 0, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
        tests = _walk_tests(sampled, greedy, key_cut, level_limit)
        # A block is BLOCK_TILES tiles, summed per lane and reduced once: a sum a tile synchronised the
        # program's warps at every tile (three barriers a tile in the SASS, sm_90).
        for b in range(tl.cdiv(num_tiles, BLOCK_TILES)):
            lane_sums = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int64)
            for t in range(tl.minimum(BLOCK_TILES, num_tiles - b * BLOCK_TILES)):
                cols, in_row, x, ahead = _next_tile(ahead, logits_ptr, final_offsets, req_ok, 0, row_len, b * BLOCK_TILES + t, vocab,
                                                    stride_col, BLOCK_V, SCALAR_LOADS=True)
                kept = _walk_weights(tests, x, cols[None, :], in_row, row_max, argmax, scale, greedy, key_cut, level_limit, min_weight,
                                     table_ptr)
                lane_sums += _quantize(_probabilities(kept, kept_total))
            block_sum = tl.sum(lane_sums, axis=1)
            in_block = (rejected_tokens >= b * BLOCK_SPAN) & (rejected_tokens < (b + 1) * BLOCK_SPAN)
            removed = tl.sum(tl.where(in_block, rejected_q, 0), axis=1)
            row_sums = tl.where(blocks[None, :] == b, block_sum[:, None], row_sums)
            residual_sums = tl.where(blocks[None, :] == b, (block_sum - removed)[:, None], residual_sums)
        use_residual = tl.sum(residual_sums, axis=1) > 0
        sums = tl.where(use_residual[:, None], residual_sums, row_sums)
        total = tl.sum(sums, axis=1)
        threshold = tl.minimum((final_coin.to(tl.float64) * total.to(tl.float64)).to(tl.int64), total - 1)
        crossing = tl.sum(tl.where(tl.cumsum(sums, axis=1) <= threshold[:, None], 1, 0), axis=1)
        before = tl.sum(tl.where(blocks[None, :] < crossing[:, None], sums, 0), axis=1)
        # The crossing block's tiles, summed one by one up to the one holding the threshold (a
        # rejected token's value is its rejected_q), then that tile in pieces.
        tile = crossing * BLOCK_TILES
        crossed = total <= 0
        for t in tl.static_range(BLOCK_TILES):
            tile_ids = (crossing[:, None] * BLOCK_TILES + t) * BLOCK_V + tl.arange(0, BLOCK_V)[None, :]
            in_tile_row = req_ok[:, None] & (tile_ids < vocab) & (crossed == 0)[:, None]
            tile_x = _gather_logits(logits_ptr, final_offsets, tile_ids, in_tile_row, stride_col)
            tile_kept = _kept_weights(tile_x, tile_ids, in_tile_row, row_max, argmax, scale, greedy, key_cut, level_limit, min_weight, table_ptr)
            tile_sum = tl.sum(_quantize(_probabilities(tile_kept, kept_total)), axis=1)
            tile_start = (crossing * BLOCK_TILES + t) * BLOCK_V
            in_tile = (rejected_tokens >= tile_start[:, None]) & (rejected_tokens < tile_start[:, None] + BLOCK_V)
            tile_sum -= tl.where(use_residual, tl.sum(tl.where(in_tile, rejected_q, 0), axis=1), 0)
            below = (crossed == 0) & (before + tile_sum <= threshold) & (t < BLOCK_TILES - 1)
            before = tl.where(below, before + tile_sum, before)
            tile = tl.where(below, tile + 1, tile)
            crossed = crossed | (below == 0)
        index = tile * BLOCK_V
        for piece in range(BLOCK_V // PIECE):
            cols = tile[:, None] * BLOCK_V + piece * PIECE + tl.arange(0, PIECE)[None, :]
            in_row = req_ok[:, None] & (cols < vocab) & (total[:, None] > 0)
            x = _gather_logits(logits_ptr, final_offsets, cols, in_row, stride_col)
            kept = _kept_weights(x, cols, in_row, row_max, argmax, scale, greedy, key_cut, level_limit, min_weight, table_ptr)
            values = _quantize(_probabilities(kept, kept_total))
            removed = tl.sum(tl.where(cols[:, :, None] == rejected_tokens[:, None, :], 1, 0), axis=2) > 0
            values = tl.where(use_residual[:, None] & removed, 0, values)
            index += tl.sum(tl.where(tl.cumsum(values, axis=1) + before[:, None] <= threshold[:, None], 1, 0), axis=1)
            before += tl.sum(values, axis=1)
        final = tl.where(greedy, final, tl.where(total > 0, index, 0).to(tl.int64))
    if LOGPROBS != 0:
        x = _gather_logits(logits_ptr, final_offsets, final[:, None], req_ok[:, None], stride_col)
        if LOGPROBS == 1:
            value = tl.where(lse[:, None] > float("-inf"), x - lse[:, None], float("-inf"))
        else:
            kept = _kept_weights(x, final[:, None], req_ok[:, None], row_max, argmax, scale, greedy, key_cut, level_limit, min_weight,
                                 table_ptr)
            value = tl.log(_probabilities(kept, kept_total))
        logprobs = tl.where(width_lanes[None, :] == num_correct[:, None], value, logprobs)
        width = num_steps + 1
        tl.store(logprob_ptr + req.to(tl.int64)[:, None] * width + width_lanes[None, :], logprobs,
                 mask=req_ok[:, None] & (width_lanes[None, :] < width))
    next_tokens = tl.where(lanes[None, :] == last[:, None], final[:, None], next_tokens)
    predict = tl.where(on_path != 0, next_tokens, -1)
    _store_verdict(predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, predict, accept, num_correct,
                   req, req_ok, ok, node_ids, width_lanes, num_steps)


# ----------------------------------------------------------------------------------------------
# launch configs


# Tiles of the final row's blocks (the kernel's BLOCK_TILES): its pass reduces each block's per-lane
# sums once, and the crossing block is read again a tile at a time up to the crossing tile. H200,
# with the scalar loads of sampling_rows._raw_tile: the fused walk took 0.73-0.90x main's time at
# V 32000 and 151936 (BENCHMARKS.md, forty-second session); re-reading the crossing block in
# pieces without finding its tile first took 1.30-1.36x at bs 64 N 8 V 32000 (64 pieces a request).
FUSED_BLOCK_TILES = 4


@dataclass(frozen=True)
class FusedLaunch:
    requests: int  # BLOCK_R
    block_v: int
    piece: int  # width of the crossing tile's pieces (bounds the rejected-token comparison)
    warps: int
    block_tiles: int = FUSED_BLOCK_TILES  # tiles of the final row's blocks (BLOCK_TILES)


def fused_launch(target: KernelTarget, bs: int, nodes: int, vocab: int) -> FusedLaunch:
    """One request per program on a GPU, 4 logits a thread (8 left an 88-byte local frame on sm_90
    with unit stride: vectorised loads beside the int64 levels, weights and keys). A request's row
    passes run on one SM, so while the batch leaves SMs to spare (bs <= SMs) a program takes 512
    threads (at the 128-register cap, the SM's whole register file); beyond, 256 threads, so that
    several requests share an SM. A short row takes no more threads than it has logits in 4s
    (a warp at least): at V 10 the walk kept a 360 B local frame at 256 and 512 threads on sm_90
    (Triton 3.9, offline), none at one warp. The interpreter vectorises many requests (tensors
    capped at 2^16 elements per row block)."""
    n_pad = _pow2(nodes)
    if target.vendor == "interpreter":
        block_v = min(max(next_power_of_2(max(vocab, 1)), 16), 4096)
        piece = max(16, min(block_v, 2048 // n_pad))
        requests = max(1, min(_pow2(bs), 2**16 // block_v, 2**18 // (piece * n_pad), 32768 // n_pad))
        return FusedLaunch(requests, block_v, piece, 1)
    threads = FUSED_WIDE_THREADS if bs <= target.multiprocessors else FUSED_THREADS
    threads = min(threads, max(target.warp_size, next_power_of_2(max(vocab, 1)) // 4))
    block_v = min(4 * threads, max(next_power_of_2(max(vocab, 1)), 128))
    return FusedLaunch(1, block_v, max(16, min(block_v, 1024 // n_pad)), target.warps(threads))


def fused_block_pad(vocab: int, config: FusedLaunch) -> int:
    """The kernel's NB_PAD: the final row's blocks, padded."""
    return max(_pow2(cdiv(vocab, config.block_v * config.block_tiles)), 16)


# ptxas under Triton 3.9 compiles the 256-thread walk at 80 registers and spills long-lived values
# into a local frame (docs/sampling.md). 128 is about the budget Triton 3.6 reaches by itself
# (111-128 registers, offline), the compile every GPU measurement here ran; on the H100 (Triton
# 3.6) the cap measured within 1.6% of no cap at 7 shapes, same verdicts.
FUSED_MAXNREG = 128
# Processed logprobs (LOGPROBS 2) at 16 or more lanes kept an 8 B local frame at 128 on sm_90
# (Triton 3.9); 144 compiles them frame-free on sm_80, sm_90 and sm_100 (135-140 registers).
# Only those launches take it: above 128 registers a 256-thread program has an SM to itself.
FUSED_PROCESSED_LOGPROBS_MAXNREG = 144
FUSED_THREADS = 256
# H100, the fused walk forced, same lease, identical verdicts and logprobs: 512 threads (2048 ids
# a pass) took 0.66-0.68x the 256-thread time at bs 64 and 128 (bs 64 N 16 V 151936: 3746 vs
# 5518 us), but 1.06-1.08x at bs 256 and 512 (several programs an SM). 1024 threads measured
# 0.52-0.59x, but at their 64-register share ptxas kept local frames of 48-216 B in 78 of the fused
# specs on sm_80/sm_90/sm_100 (Triton 3.9, offline); 512 at 128 compile frame-free there and on
# sm_90 with 3.6, processed logprobs at 16+ lanes included (their 144 cap becomes 128).
FUSED_WIDE_THREADS = 512


def fused_options(target: KernelTarget, config: FusedLaunch, logprobs_mode: int, n_pad: int) -> dict:
    """Compile options of the fused walk's launches on ``target`` (``config``: the launch;
    ``logprobs_mode``: the kernel's LOGPROBS; ``n_pad``: its N_PAD): a register cap on NVIDIA, at
    most the register file's share of a thread (128 at 512 threads)."""
    if target.vendor != "nvidia":
        return {}
    processed_wide = logprobs_mode == 2 and n_pad >= 16
    cap = FUSED_PROCESSED_LOGPROBS_MAXNREG if processed_wide else FUSED_MAXNREG
    return {"maxnreg": min(cap, REGISTER_FILE // (config.warps * 32))}


def fused_list_top_k(target: KernelTarget) -> int:
    """The largest top-k whose cut the fused walk takes from a list of the row's heaviest ids
    (``_listed_cuts``, the kernel's LIST_TOP_K) rather than the level search."""
    return LIST_TOP_K_MAX


def fused_scratch_len(block_v: int) -> int:
    """int16 elements of a request's scratch: one window of the level search's counts (WINDOW
    int32, ``_count_window``; the two searches count theirs in turn in it) or top-k's list; a row
    uses one or the other."""
    return max(2 * sampling_rows.WINDOW_LEVELS, 2 * _LIST_DEPTH * block_v + _LIST_SCRATCH)


def _pow2(count: int) -> int:
    return max(next_power_of_2(max(count, 1)), 2)


# ----------------------------------------------------------------------------------------------
# host functions


def _coins(bs: int, width: int, device, *, seed, offset, generator, coins, final_coins, target: KernelTarget):
    """The call's coins: the hash kernel for seed/offset, else as the reference draws them."""
    if seed is None or bs == 0:
        return semantics.draw_coins(bs, width, device, seed=seed, offset=offset, generator=generator, coins=coins, final_coins=final_coins)
    accept = torch.empty((bs, width), dtype=torch.float32, device=device)
    final = torch.empty(bs, dtype=torch.float32, device=device)
    block_r = min(_pow2(bs), 1024) if target.vendor == "interpreter" else 128
    _hash_coins_kernel[(cdiv(bs, block_r),)](seed.contiguous(), offset.contiguous(), accept, final, bs, width, BLOCK_R=block_r, W_PAD=_pow2(width),
                                                    num_warps=1 if target.vendor == "interpreter" else target.warps(128))
    return accept, final


def process_logits(logits: torch.Tensor, *, temperature, top_k=0, top_p=1.0, min_p=0.0, out: Optional[torch.Tensor] = None,
                   target: KernelTarget) -> torch.Tensor:
    """Triton provider of ``process_logits`` (arguments validated by the caller)."""
    rows, vocab = logits.shape
    return sampling_rows.process_rows(logits, 1, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, want_lse=False,
                                      target=target, out=out)[0]


def verify_sampling_from_logits(tree: DraftTree, candidates: torch.Tensor, target_logits: torch.Tensor, *, temperature, top_k=0,
                                top_p=1.0, min_p=0.0, seed=None, offset=None, generator=None, coins=None, final_coins=None,
                                logprobs=None, top_logprobs=0, out: Optional[Verdict] = None, max_top_k: Optional[int] = None,
                                target: KernelTarget) -> semantics.SampledVerdict:
    """Triton provider of ``verify_sampling_from_logits`` (arguments validated by the caller): the
    fused walk processes only the rows each request stands on."""
    bs, nodes = candidates.shape
    vocab = target_logits.shape[-1]
    logits = target_logits.reshape(bs * nodes, vocab)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if _every_row_in_parallel(target, bs * nodes, listed=_top_k_listed(top_k, max_top_k, vocab, target)):
        accept, final = _coins(bs, nodes, logits.device, seed=seed, offset=offset, generator=generator, coins=coins,
                               final_coins=final_coins, target=target)
        probs, lse, out = _rows_for_walk(tree, candidates, logits, accept, final, sampling, want_lse=logprobs == "raw",
                                         top_logprobs=top_logprobs, out=out, target=target)
        verdict = verify_kernels.verify_sampling(tree, candidates, probs, accept, final, out=out, target=target)
        return semantics.sampled_verdict(verdict, logprobs, top_logprobs, probs, logits, lse)
    verdict, values = _fused_walk(tree, candidates, logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                                  offset=offset, generator=generator, coins=coins, final_coins=final_coins, logprobs=logprobs, out=out,
                                  target=target)
    if logprobs is None or not top_logprobs:
        return semantics.SampledVerdict(verdict, values)
    return _with_top_logprobs(verdict, values, logits, sampling, logprobs, top_logprobs, target)


# Up to this many rows per SM/CU, processing every row split along the vocabulary and then
# walking beats the fused walk (H100, bf16, top-k 50 + top-p 0.95). The fused walk's time hardly
# depends on the batch while its programs fit on the SMs (one request a program), the every-row
# path's grows with the rows. Since the walk's row passes sum per lane, take 512 threads while
# bs <= SMs and stop a search that cannot bind (2026-11-27, nineteenth session, same lease,
# identical verdicts): at 384 rows the fused walk wins (every-row / fused 1.12-1.23x at V 151936,
# 1.24-1.33x at V 32000), at 264 rows every row does (0.87x and 0.98x, bs 66 N 4): 2 rows per SM.
# Re-measured on the H200 (132 SMs, 2026-11-30, forty-seventh session, both routes forced, bf16,
# identical verdicts) since the fused walk lists small top-k (LIST_TOP_K_MAX): still 2 rows per SM
# with temperature alone (every-row / fused 0.71-0.87x at 256 rows, 1.12-1.42x at 512), min-p
# (0.60-0.75x, 1.01-1.27x) and the level searches, top-p alone or top-k > 128 (0.49-0.64x at 256
# rows, 0.91-1.09x at 512).
EVERY_ROW_ROWS_PER_SM = 2
# When every sampled request's top-k is listed, the fused walk's cut costs about one more pass of
# a row, flat in the batch, and the every-row path's searches grow with the rows: tree verify at
# V 151936 and 128256, every-row / fused 0.62-0.65x at 48 rows, 0.91-0.99x at 80, 1.01-1.11x at 96
# (N 4, 8 and 16; top-k 20-128, with top-p or not), 2.3x at 256; at V 32000 0.74-0.89x at 64 rows,
# 1.16-1.40x at 96. Chains walk one row at a time up to the first rejection, so their crossover
# comes later: 0.90-0.93x at 128 rows, 1.73x at 256 (V 151936, top-k 50 + top-p 0.95).
LISTED_TREE_ROWS_PER_SM = 0.6
LISTED_CHAIN_ROWS_PER_SM = 1.0


def _top_k_listed(top_k, max_top_k: Optional[int], vocab: int, target: KernelTarget) -> bool:
    """Whether every sampled request's top-k cut is one the fused walk lists (0 < k < V, k <= its
    LIST_TOP_K), as the host knows it without reading a tensor: from a number ``top_k``, else from
    the caller's ``max_top_k`` bound (a top-k that is off counts as V)."""
    bound = max_top_k if isinstance(top_k, torch.Tensor) else semantics.top_k_or_vocab(top_k, vocab)
    return bound is not None and bound < vocab and bound <= fused_list_top_k(target)


def _every_row_in_parallel(target: KernelTarget, rows: int, *, listed: bool, chain: bool = False) -> bool:
    """Whether to process every row (kernels/sampling_rows.py, the whole GPU on every row) and
    then walk, rather than run the fused walk (one program per request processes the rows on its
    path one after another: few rows' work, but a small batch uses a few SMs for milliseconds).
    ``listed``: every sampled request's top-k cut is listed (``_top_k_listed``), which makes the
    fused walk cheaper; ``chain``: the walk is a chain's.
    The interpreter always runs the fused walk (the conformance suite checks it there at every
    size; the split processing is checked there through ``process_logits``, the chains with draft
    probabilities, top_logprobs and tests/test_sampling_split.py). AMD never runs the fused walk
    yet: on gfx942 its per-request scalar state spills SGPRs (14 with one request a program, 61
    with two; offline compile matrix), so it is not compiled for AMD until that is solved."""
    if target.vendor == "amd":
        return True
    if target.vendor == "interpreter":
        return False
    rows_per_sm = (LISTED_CHAIN_ROWS_PER_SM if chain else LISTED_TREE_ROWS_PER_SM) if listed else EVERY_ROW_ROWS_PER_SM
    return rows <= rows_per_sm * target.multiprocessors


def _rows_for_walk(tree: DraftTree, candidates: torch.Tensor, logits: torch.Tensor, accept: torch.Tensor, final: torch.Tensor,
                   sampling: dict, *, want_lse: bool, top_logprobs: int, out: Optional[Verdict], target: KernelTarget,
                   record_as_chain: bool = False) -> tuple:
    """(probs, lse, out) for a sampling walk over (bs*N, V) ``logits`` on the every-row path:
    where it pays (``sampling_rows.path_rows_pay``) and without top_logprobs, only what the walk
    reads (``sampling_rows.process_path_rows``: every row at the candidates, each request's final
    row whole, found by a first walk over the candidates; ``out`` is then that walk's Verdict,
    which the full walk overwrites), else every row whole (``process_rows``; the top-n
    alternatives need the path rows)."""
    rows, vocab = logits.shape
    nodes = candidates.shape[1]
    if top_logprobs or not sampling_rows.path_rows_pay(target, rows, vocab):
        probs, lse = sampling_rows.process_rows(logits, nodes, **sampling, want_lse=want_lse, target=target)
        return probs, lse, out

    def walk(probs: torch.Tensor) -> Verdict:
        return verify_kernels.verify_sampling(tree, candidates, probs, accept, final, out=out, target=target,
                                              record_as_chain=record_as_chain, walk_only=True)

    return sampling_rows.process_path_rows(logits, candidates, walk, **sampling, want_lse=want_lse, target=target)


# What the fused walk records (a candidate id < -1 or >= V, a tree link neither -1 nor in [1, N)):
# as the from-logits references do (they record through verify_sampling / verify_chain_sampling).
_TREE_IDS_CODE = error_flag.code("verify_sampling", "candidates")
_CHAIN_IDS_CODE = error_flag.code("verify_chain_sampling", "draft_ids")


def _fused_walk(tree: DraftTree, candidates: torch.Tensor, logits: torch.Tensor, *, temperature, top_k, top_p, min_p, seed, offset,
                generator, coins, final_coins, logprobs, out: Optional[Verdict], target: KernelTarget, as_chain: bool = False):
    """(Verdict, emitted-token logprobs (bs, S+1) or None) of the fused walk on (bs*N, V) logits:
    one launch (the parameters and the seeded coins are computed in the kernel)."""
    bs, nodes = candidates.shape
    vocab = logits.shape[-1]
    width = tree.num_steps + 1
    device = logits.device
    out = verify_kernels._verdict_buffers(bs, nodes, width, device, out)
    values = torch.empty((bs, width), dtype=torch.float32, device=device) if logprobs is not None else None
    if bs == 0:
        return out, values
    table = semantics.exp2_table(device)
    float_placeholder = values if values is not None else torch.empty(1, dtype=torch.float32, device=device)
    params = sampling_rows.kernel_params(vocab, float_placeholder, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    hashed = seed is not None
    if hashed:
        accept, final = float_placeholder, float_placeholder
    else:
        accept, final = semantics.draw_coins(bs, nodes, device, seed=None, offset=None, generator=generator, coins=coins,
                                             final_coins=final_coins)
        accept, final = accept.contiguous(), final.contiguous()
    config = fused_launch(target, bs, nodes, vocab)
    # The level search's window counts and top-k's list, only when a row may use them.
    may_cut = torch.is_tensor(top_p) or top_p < 1 or torch.is_tensor(top_k) or top_k > 0
    window = torch.empty((bs, fused_scratch_len(config.block_v)) if may_cut else (1,), dtype=torch.int16, device=device)
    logprobs_mode = 0 if logprobs is None else semantics.LOGPROB_MODES.index(logprobs) + 1
    _fused_walk_kernel[(cdiv(bs, config.requests),)](
        logits, logits.stride(0), logits.stride(1), vocab, table,
        *params,
        tree.retrieve_next_token.contiguous(), tree.retrieve_next_sibling.contiguous(), candidates.contiguous(), accept, final,
        seed.contiguous() if hashed else table, offset.contiguous() if hashed else table,
        out.predict, out.accept_index, out.num_correct, out.accept_lens, float_placeholder, bs, nodes, tree.num_steps,
        error_flag.flag(device), _CHAIN_IDS_CODE if as_chain else _TREE_IDS_CODE, int(as_chain), window,
        BLOCK_R=config.requests, BLOCK_V=config.block_v, N_PAD=_pow2(nodes), W_PAD=_pow2(width), NB_PAD=fused_block_pad(vocab, config),
        BLOCK_TILES=config.block_tiles, PIECE=config.piece, HASH_COINS=hashed, LOGPROBS=logprobs_mode,
        CUTS=may_cut, LIST_TOP_K=fused_list_top_k(target),
        num_warps=config.warps,
        **fused_options(target, config, logprobs_mode, _pow2(nodes)),
    )
    return out, values


def _with_top_logprobs(verdict: Verdict, values, logits: torch.Tensor, sampling: dict, logprobs: str, top_n: int,
                       target: KernelTarget) -> semantics.SampledVerdict:
    """The top-n alternatives at the emitted positions: the path rows (bs*(S+1)) only are
    processed again, not every row."""
    bs, width = verdict.accept_index.shape
    rows = verdict.accept_index.to(torch.int64).clamp(min=0).reshape(-1)
    path_logits = logits[rows]
    probs, lse = sampling_rows.process_rows(path_logits, width, **sampling, want_lse=logprobs == "raw", target=target)
    local = torch.arange(bs * width, dtype=torch.int32, device=rows.device).reshape(bs, width)
    path_verdict = Verdict(verdict.predict[rows], torch.where(verdict.accept_index >= 0, local, verdict.accept_index), verdict.num_correct,
                           verdict.accept_lens)
    top = semantics.sampled_verdict(path_verdict, logprobs, top_n, probs, path_logits, lse)
    return semantics.SampledVerdict(verdict, values, top.top_ids, top.top_logprobs)


# Per (device, S): (capacity, links) of chain trees for up to `capacity` requests (_chain_links).
# Grown by powers of two; an outgrown generation is kept (_OUTGROWN), never freed: a captured CUDA
# graph may still read it.
_CHAIN_LINKS: dict = {}
_OUTGROWN: list = []
_CHAIN_LINKS_LOCK = threading.Lock()  # taken only to grow: no generation is dropped by a race


def _chain_links(capacity: int, steps: int, device) -> torch.Tensor:
    """(4, capacity, S+1) int64: the chain root -> x_1 -> ... -> x_S of each request as tree links
    (next token, next sibling), its retrieve index (row r of the (bs*(S+1), V) logits), and zeros
    (the root's candidate and coin columns)."""
    nodes = steps + 1
    links = torch.full((4, capacity, nodes), -1, dtype=torch.int64, device=device)
    lanes = torch.arange(nodes, dtype=torch.int64, device=device)
    links[0] = torch.where(lanes < steps, lanes + 1, -1)
    links[2] = torch.arange(capacity * nodes, dtype=torch.int64, device=device).view(capacity, nodes)
    links[3] = 0
    return links


def _chain_parts(bs: int, steps: int, device) -> tuple[DraftTree, torch.Tensor, torch.Tensor]:
    """(the chain as a DraftTree (only the links matter to the walk), a (bs, 1) int64 zero column,
    a (bs, 1) float32 zero column), views of persistent buffers built once per device and S (and
    when bs outgrows them): eight torch launches a call fewer than building them. A buffer is only
    made outside a stream capture: built inside one, it would hold its values only once that graph
    had replayed, and other graphs or eager calls could read it before. So a capture that outgrows
    the buffer builds its own links, into its graph, as every call did before."""
    key = (device, steps)
    entry = _CHAIN_LINKS.get(key)
    if (entry is None or entry[0] < bs) and capturing(device):
        entry = (bs, _chain_links(bs, steps, device))
    elif entry is None or entry[0] < bs:
        with _CHAIN_LINKS_LOCK:
            entry = _CHAIN_LINKS.get(key)
            if entry is None or entry[0] < bs:
                capacity = max(next_power_of_2(bs), 16)
                if entry is not None:
                    _OUTGROWN.append(entry)
                entry = _CHAIN_LINKS[key] = (capacity, allocate_persistent(device, lambda: _chain_links(capacity, steps, device)))
    next_token, next_sibling, index, zeros = entry[1][:, :bs].unbind(0)
    flat = index.reshape(-1)
    tree = DraftTree(flat, flat, index, next_token, next_sibling, None, "qlen", steps)
    return tree, zeros[:, :1], zeros.view(torch.float32)[:, :1]


def verify_chain_sampling_from_logits(draft_ids: torch.Tensor, draft_probs: Optional[torch.Tensor], target_logits: torch.Tensor, *,
                                      temperature, top_k=0, top_p=1.0, min_p=0.0, seed=None, offset=None, generator=None, coins=None,
                                      final_coins=None, logprobs=None, top_logprobs=0, out: Optional[Verdict] = None,
                                      max_top_k: Optional[int] = None, target: KernelTarget) -> semantics.SampledVerdict:
    """Triton provider of ``verify_chain_sampling_from_logits`` (arguments validated by the caller).
    Without draft_probs the chain runs through the fused tree walk (a chain is a tree with one
    child per level; the accept test ``u < p(x)`` and the residual ``p`` without x are the same),
    which processes only the rows up to the first rejection. With draft_probs every row is
    processed, then ``verify_chain_sampling`` runs on the probabilities."""
    bs, steps = draft_ids.shape
    nodes = steps + 1
    vocab = target_logits.shape[-1]
    logits = target_logits.reshape(bs * nodes, vocab)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    listed = _top_k_listed(top_k, max_top_k, vocab, target)
    if draft_probs is None and not _every_row_in_parallel(target, bs * nodes, listed=listed, chain=True):
        chain, zero_ids, zero_coins = _chain_parts(bs, steps, draft_ids.device)
        candidates = torch.cat([zero_ids, draft_ids.to(torch.int64)], dim=1)
        tree_coins = tree_final = None
        if seed is None:  # the chain's coins (bs, S) drawn as the reference draws them, then a node-indexed (bs, N) table
            accept, tree_final = semantics.draw_coins(bs, steps, logits.device, seed=None, offset=None, generator=generator, coins=coins,
                                                      final_coins=final_coins)
            tree_coins = torch.cat([accept, zero_coins], dim=1)
        verdict, values = _fused_walk(chain, candidates, logits, temperature=temperature, top_k=top_k,
                                      top_p=top_p, min_p=min_p, seed=seed, offset=offset, generator=None, coins=tree_coins,
                                      final_coins=tree_final, logprobs=logprobs, out=out, target=target, as_chain=True)
        if logprobs is None or not top_logprobs:
            return semantics.SampledVerdict(verdict, values)
        return _with_top_logprobs(verdict, values, logits, sampling, logprobs, top_logprobs, target)
    # Hashed coins depend on (seed, offset, position) alone, not on the table's width: hashed for all
    # N positions they are the walk's node-indexed table itself (no cat). The leaf's coin (position
    # S) is never read: no node follows the leaf.
    hashed_table = draft_probs is None and seed is not None
    accept, final = _coins(bs, nodes if hashed_table else steps, logits.device, seed=seed, offset=offset, generator=generator,
                           coins=coins, final_coins=final_coins, target=target)
    if draft_probs is None:
        chain, zero_ids, zero_coins = _chain_parts(bs, steps, draft_ids.device)
        candidates = torch.cat([zero_ids, draft_ids.to(torch.int64)], dim=1)
        tree_coins = accept if hashed_table else torch.cat([accept, zero_coins], dim=1)
        probs, lse, out = _rows_for_walk(chain, candidates, logits, tree_coins, final, sampling, want_lse=logprobs == "raw",
                                         top_logprobs=top_logprobs, out=out, target=target, record_as_chain=True)
        verdict = verify_kernels.verify_sampling(chain, candidates, probs, tree_coins, final, out=out, target=target,
                                                 record_as_chain=True)
    else:
        probs, lse = sampling_rows.process_rows(logits, nodes, **sampling, want_lse=logprobs == "raw", target=target)
        verdict = verify_kernels.verify_chain_sampling(draft_ids, draft_probs, probs, accept, final, out=out, target=target)
    return semantics.sampled_verdict(verdict, logprobs, top_logprobs, probs, logits, lse)


PROVIDERS = {
    "process_logits": (process_logits, "kernels/sampling_rows.py: rows split along the vocabulary, cut searches by 16 level bins then window counts"),
    "verify_sampling_from_logits": (verify_sampling_from_logits,
                                    "kernels/sampling.py: every row split + walk up to 2 rows per SM (0.6 with listed top-k), "
                                    "else the fused walk over path rows"),
    "verify_chain_sampling_from_logits": (verify_chain_sampling_from_logits,
                                          "kernels/sampling.py: fused walk (greedy drafter) or every row + kernels/verify.py chain walk"),
}


# ----------------------------------------------------------------------------------------------
# offline compilation and launch descriptions

_LOGIT_TYPES = ("fp32", "bf16", "fp16")
# (bs, N, V, S) of the fused walk: production shapes (bs 1024: more requests than SMs, the narrow
# programs) and an odd tiny one.
_FUSED_SHAPES = ((1, 4, 32000, 3), (64, 16, 151936, 5), (1024, 8, 151936, 4), (3, 6, 10, 5))


def compile_specs(target: KernelTarget):
    """Every (kernel, signature, constexprs, num_warps[, attrs]) the host functions launch."""
    specs = []
    fused_signature = {
        "stride_row": "i64", "stride_col": "i64", "vocab": "i32", "table_ptr": "*i64",
        "temperature_ptr": "*fp32", "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32", "temperature_value": "fp32",
        "top_k_value": "i32", "top_p_value": "fp32", "min_p_value": "fp32", "tensor_params": "i32",
        "next_token_ptr": "*i64", "next_sibling_ptr": "*i64", "cand_ptr": "*i64", "coins_ptr": "*fp32", "final_coins_ptr": "*fp32",
        "seed_ptr": "*i64", "offset_ptr": "*i64", "predict_ptr": "*i32", "accept_ptr": "*i32", "num_correct_ptr": "*i32",
        "accept_lens_ptr": "*i32", "logprob_ptr": "*fp32", "bs": "i32", "nodes": "i32", "num_steps": "i32",
        "flag_ptr": "*i64", "flag_code": "i64", "chain_shift": "i32", "window_ptr": "*i16",
        **{name: "constexpr" for name in ("BLOCK_R", "BLOCK_V", "N_PAD", "W_PAD", "NB_PAD", "PIECE", "HASH_COINS", "LOGPROBS",
                                          "CUTS", "LIST_TOP_K", "BLOCK_TILES")}}
    for bs, nodes, vocab, steps in _FUSED_SHAPES if target.vendor != "amd" else ():  # AMD: see _every_row_in_parallel
        config = fused_launch(target, bs, nodes, vocab)
        shape_constexprs = {"BLOCK_R": config.requests, "BLOCK_V": config.block_v, "N_PAD": _pow2(nodes), "W_PAD": _pow2(steps + 1),
                            "NB_PAD": fused_block_pad(vocab, config), "PIECE": config.piece,
                            "BLOCK_TILES": config.block_tiles}
        # Every logit type with seeded coins; the other coin source and the logprob modes on bf16; the
        # launches where no row can have a cut (CUTS False) on bf16, without and with logprobs.
        variants = ([(logit_type, True, 0, True) for logit_type in _LOGIT_TYPES]
                    + [("bf16", False, 0, True), ("bf16", True, 1, True), ("bf16", True, 2, True)]
                    + [("bf16", True, 0, False), ("bf16", True, 2, False)])
        if vocab < 1024:  # the odd tiny shape: its own block widths, one variant
            variants = [("fp32", True, 2, True)]
        for logit_type, hashed, logprobs, cuts in variants:
            signature = {"logits_ptr": f"*{logit_type}", **fused_signature}
            constexprs = {**shape_constexprs, "HASH_COINS": hashed, "LOGPROBS": logprobs, "CUTS": cuts,
                          "LIST_TOP_K": fused_list_top_k(target)}
            options = fused_options(target, config, logprobs, _pow2(nodes))
            # The generic spec: a strided vocabulary (stride_col an int); the specialised: unit stride.
            specs.append((_fused_walk_kernel, signature, constexprs, config.warps, {}, options))
            specs.append(runtime_specialized(target, _fused_walk_kernel, signature, constexprs, config.warps,
                                             values={"stride_row": vocab, "stride_col": 1, "vocab": vocab, "top_k_value": 50, "tensor_params": 15,
                                                     "bs": bs, "nodes": nodes, "num_steps": steps,
                                                     "flag_code": _TREE_IDS_CODE, "chain_shift": 0}) + (options,))
    coin_signature = {"seed_ptr": "*i64", "offset_ptr": "*i64", "coins_ptr": "*fp32", "final_ptr": "*fp32", "bs": "i32", "width": "i32",
                      "BLOCK_R": "constexpr", "W_PAD": "constexpr"}
    for width in (4, 16):
        specs.append((_hash_coins_kernel, coin_signature, {"BLOCK_R": 128, "W_PAD": _pow2(width)}, target.warps(128)))
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    lines = []
    for bs, nodes, vocab, _ in _FUSED_SHAPES[:2] if target.vendor != "amd" else ():
        config = fused_launch(target, bs, nodes, vocab)
        lines.append(f"fused walk bs={bs} N={nodes} V={vocab}: {config.requests} requests/program, BLOCK_V={config.block_v}, "
                     f"final row in blocks of {config.block_tiles} tiles, crossing tile in pieces of {config.piece}, {config.warps} warps")
    return lines
