"""Triton kernels of family ``sampling``: the row processing of spec_hal/sampling.py (steps 1-5,
every rounding, tie and key defined there), split along the vocabulary so that many programs
process one row at once.

Why split: processing a row takes a max pass, a search for the top-p and top-k cut levels, a tie
split and a kept total. Done by one program per row (``_row_statistics`` in kernels/sampling.py,
about 21 passes with both masks), a small batch ran on a few SMs for milliseconds: 2.8 ms at
bs 1, V 151936 on the H100, 2.4-6x slower than the torch code it replaces at bs 1.

Here each pass is one launch over a (chunks, row blocks) grid. A program owns ``chunk_len``
consecutive ids of its rows and writes a few numbers per chunk that the next launch combines
(every combined sum is of exact integers, so the order does not matter). The cut searches of the
16-bit levels take two passes. The first counts the tokens (top-k) and sums the weights (top-p)
in 16 bins of 4096 levels, which decides each cut's top 4 bits: a window of 4096 levels that
holds it. The second counts, per chunk, the tokens at every level of the windows with global
atomics; a token's weight is a function of its level, so those counts give the exact weight of
every level too: a fold sums the chunks' counts per tile of levels, and one program per row reads
the cuts off the tiles' sums. The chunks' counts at the top-k cut level give the tie split
without a search over ids: the one chunk that holds the need-th tied token finds its id.

Launches (the host skips 2-5 when no row can have a top-k or top-p mask):

1. ``_chunk_max_kernel``: each chunk's max, its lowest argmax and sum exp(x - chunk max).
2. ``_level_bins_kernel``: this chunk's 16 bins of 4096 levels (count and weight).
3. ``_window_counts_kernel``: the first digit of each search from 2's bins (the chunk-0 program
   stores it), then this chunk's token count at each level of the two windows (after a fill
   that zeroes the counts).
4. ``_window_fold_kernel`` (grid: window tiles, row blocks): the chunks' counts summed, and each
   tile's weight (top-p) and count (top-k); ``_window_cuts_kernel`` (one program per row block):
   the exact cuts, from the tiles' sums and the one tile that holds each cut.
5. ``_kept_kernel``: the final cuts, the top-k tie split, each chunk's kept total.
6. ``_probs_kernel``: the row's kept total, the probabilities (and the log-sum-exp).

A sampling walk reads few of those probabilities: each row's at its request's candidate tokens,
and one row a request whole (its final node's). Where step 5 on every row would take more than one
wave of programs, the from-logits verifies (kernels/sampling.py) take ``process_path_rows``
instead of launch 6: ``_candidate_probs_kernel`` (the candidates' probabilities, every row's
log-sum-exp), the walk alone (kernels/verify.py, WALK_ONLY), which names each request's final node,
then ``_probs_kernel`` on those rows alone (FINAL_ROWS); the full walk follows.

``BLOCK_R`` rows share a program: 1 on a GPU; many under the interpreter (one chunk a row there,
so that the statistical cases stay a few vectorised programs; tests/test_sampling_split.py runs
the interpreter with many short chunks).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import triton
import triton.language as tl
from packaging.version import Version

import spec_hal.sampling as semantics
from spec_hal.types import Verdict

from .launch import KernelTarget, cdiv, next_power_of_2, runtime_specialized

FLT_MAX = tl.constexpr(3.4028234663852886e38)
NO_ID = tl.constexpr(2**31 - 1)
LEVEL_BITS = tl.constexpr(semantics.LEVEL_BITS)
LEVEL_MAX = tl.constexpr(semantics.LEVEL_MAX)
TOP_WEIGHT = tl.constexpr(2**semantics.WEIGHT_BITS)
LEVEL_MASK = tl.constexpr((1 << semantics.LEVEL_BITS) - 1)
ID_BITS = tl.constexpr(semantics.ID_BITS)
ID_SCALE = tl.constexpr(1 << semantics.ID_BITS)
ID_LAST = tl.constexpr((1 << semantics.ID_BITS) - 1)
LOG2E_SCALED = tl.constexpr(semantics.LOG2E_SCALED)
MIN_TOP_P = tl.constexpr(semantics.MIN_TOP_P)
KEEP_ALL_KEY = tl.constexpr(semantics.LEVEL_MAX * (1 << semantics.ID_BITS) + (1 << semantics.ID_BITS) - 1)
# The level search (LEVEL_MAX < 2^16): the first pass decides the top 4 bits in 16 bins, which
# leaves a window of 2^12 levels for the second.
DIGIT_BINS = tl.constexpr(16)
FIRST_SHIFT = tl.constexpr(12)
# The first pass's weights by digit (_level_bins_kernel): a level is at most LEVEL_MAX (digit 10),
# and a weight is 2^39 * 2^(-level / 1024) rounded, so digits 8 and 9 weigh at most 2^7 and 2^3 an
# id and digit 10 nothing. Digits 0-7 take an int64 sum each; 8 and 9 share one int64 a lane, a
# 32-bit field each (at most 2^23 ids a row: a field sums to less than 2^30).
HEAVY_DIGITS = tl.constexpr(8)
LIGHT_FIELD_BITS = tl.constexpr(32)
LIGHT_FIELD_MASK = tl.constexpr(0xFFFFFFFF)
WINDOW_LEVELS = 1 << 12
WINDOW = tl.constexpr(WINDOW_LEVELS)
PACKED_TILES = tl.constexpr(255)  # tiles a lane counts in 8-bit fields before they are unpacked (one id a lane a tile)
SEARCH_FIELDS = tl.constexpr(5)  # (top-p prefix, mass below it, top-k prefix, count below it, total weight)
CUT_FIELDS = tl.constexpr(4)  # (top-p cut, top-k cut, count below the top-k cut, its offset in the window or -1)
# The window counts' groups of consecutive ids lie along the axis whose lanes a warp fills first
# (_window_counts_kernel): Triton orders a memory access's axes by its pointer's contiguity, and
# the atomic adds' addresses (levels) have none, so the tie decides: the first axis in Triton
# 3.6, the last in 3.7, 3.8 and 3.9 (TTGIR and SASS, sm_90, offline). On the other axis a group
# spread over the warps, and every tile went through shared memory and barriers to sum it.
GROUP_AXIS = tl.constexpr(2 if Version(triton.__version__).release >= (3, 7) else 1)


# ----------------------------------------------------------------------------------------------
# the processing steps as device functions (also used by the walks of kernels/sampling.py)


@triton.jit
def _sanitized(raw, ok):
    """float32 of loaded logits, NaN -> -inf, +inf -> FLT_MAX; -inf outside ``ok``."""
    x = raw.to(tl.float32)
    x = tl.where(x != x, float("-inf"), x)
    x = tl.minimum(x, FLT_MAX)
    return tl.where(ok, x, float("-inf"))


@triton.jit
def _load_logits(logits_ptr, row_offsets, cols, ok, stride_col):
    """Sanitised float32 logits (NaN -> -inf, +inf -> FLT_MAX); -inf outside ``ok``."""
    return _sanitized(tl.load(logits_ptr + row_offsets[:, None] + cols[None, :].to(tl.int64) * stride_col, mask=ok, other=float("-inf")), ok)


@triton.jit
def _online_max(x, cols, ok, run_max, argmax, sum_exp):
    """One tile (x: (R, T) logits at ids ``cols``, ``ok`` in range) of the online pass over a row:
    (max, argmax, sum of exp(x - max)). argmax is the lowest id of the maximum; it starts at NO_ID
    and takes the first tile's id even when that tile is all -inf."""
    tile_max = tl.max(x, axis=1)
    tile_arg = tl.min(tl.where(ok & (x == tile_max[:, None]), cols[None, :], NO_ID), axis=1)
    argmax = tl.where((tile_max > run_max) | (argmax == NO_ID), tile_arg, argmax)
    new_max = tl.maximum(run_max, tile_max)
    finite = new_max > float("-inf")
    rescale = tl.where(finite & (run_max > float("-inf")), tl.exp(run_max - new_max), 0.0)
    tile_sum = tl.sum(tl.where(finite[:, None], tl.exp(x - new_max[:, None]), 0.0), axis=1)
    return new_max, argmax, sum_exp * rescale + tile_sum


@triton.jit
def _lane_max(x, cols, ok, lane_max, lane_arg):
    """One tile (x: (R, T) logits at ids ``cols``, ``ok`` in range) of a max pass that keeps each
    lane's running max and its lowest id there, reduced once after the pass (``_lanes_max``): a
    lane's ids rise tile by tile, so its first id at its max is its lowest, and an in-range id is
    taken while its lane has none, even at -inf. The per-tile max and argmax of ``_online_max``
    synchronise the program's warps twice a tile."""
    take = ok & ((x > lane_max) | (lane_arg == NO_ID))
    return tl.where(take, x, lane_max), tl.where(take, cols, lane_arg)


@triton.jit
def _lanes_max(lane_max, lane_arg):
    """(max, lowest id of it) of (R,) rows from ``_lane_max``'s lanes: what ``_online_max`` finds
    (an all -inf row: its lowest in-range id; no id in range: NO_ID)."""
    row_max = tl.max(lane_max, axis=1)
    return row_max, tl.min(tl.where(lane_max == row_max[:, None], lane_arg, NO_ID), axis=1)


@triton.jit
def _levels(x, row_max, scale, DTYPE: tl.constexpr = tl.int64):
    """Step 3 levels (int64, or DTYPE: levels < 2^16 fit int32) of logits ``x`` (R, L): 0 at the
    max, floor(min((m - x) * c, LEVEL_MAX)) elsewhere."""
    return _distance_levels(row_max[:, None] - x, scale[:, None], DTYPE)


@triton.jit
def _distance_levels(distance, scale, DTYPE: tl.constexpr):
    """``_levels`` of logits at ``distance`` = m - x below their row's max, ``scale`` (c)
    broadcast to it (any rank)."""
    scaled = distance * scale
    level = tl.where(scaled < LEVEL_MAX, scaled, LEVEL_MAX)  # NaN -> LEVEL_MAX
    level = tl.where(distance == 0, 0.0, level)
    return level.to(DTYPE)


@triton.jit
def _weights(level, table_ptr, needed):
    """2^39 * 2^(-level / 1024) from the exact table (int64; 0 from LEVEL_MAX on) where ``needed``
    (None: every id), 0 elsewhere. The table load is a gather (its index is the level's low bits),
    so it is masked off where the weight is not used: the kept and probability passes took
    0.69-0.77x of their time with no gather at all (H100; BENCHMARKS.md, eighteenth session)."""
    if needed is None:  # every id: the fused walk's register budget was measured with this load
        mantissa = tl.load(table_ptr + (level & LEVEL_MASK))
    else:
        mantissa = tl.load(table_ptr + (level & LEVEL_MASK), mask=needed, other=0)
    return mantissa >> (level >> LEVEL_BITS)


@triton.jit
def _kept_weights(x, ids, ok, row_max, argmax, scale, greedy, key_cut, level_cut, min_weight, table_ptr, INT32_KEYS: tl.constexpr = False):
    """Steps 2-4: the kept weights (int64, 0 outside ``ok``) of logits ``x`` (R, L) at token
    ``ids`` (R, L) or (1, L) of their rows. INT32_KEYS: the rank key level * 2^23 + id compared
    as its two int32 parts, (level, id) <= (key_cut >> 23, key_cut & ID_LAST) in lexicographic
    order (levels < 2^16, ids < 2^23): the split passes' choice (H200, bs 64 N 4 V 151936,
    temperature alone: with int32 levels and keys the verify took 0.94x of its time, same
    verdicts; BENCHMARKS.md, twenty-sixth session). The fused walk keeps the
    int64 key: with int32 keys two of its sm_90 specs (processed logprobs) kept an 8 B local
    frame at the 128-register cap with Triton 3.6 (offline), and it measured 0.97-1.03x."""
    if INT32_KEYS:
        level = _levels(x, row_max, scale, tl.int32)
        cut_level = (key_cut >> ID_BITS).to(tl.int32)[:, None]  # -1 for the key -1: nothing kept
        within_key = (level < cut_level) | ((level == cut_level) & (ids.to(tl.int32) <= (key_cut & ID_LAST).to(tl.int32)[:, None]))
        within_level = level <= level_cut.to(tl.int32)[:, None]
    else:
        level = _levels(x, row_max, scale)
        within_key = level * ID_SCALE + ids.to(tl.int64) <= key_cut[:, None]
        within_level = level <= level_cut[:, None]
    within_cuts = ok & within_key & within_level & (greedy[:, None] == 0)
    weight = _weights(level, table_ptr, within_cuts)
    kept = tl.where(within_cuts & (weight >= min_weight[:, None]), weight, 0)
    return tl.where(ok, tl.where(greedy[:, None], tl.where(ids == argmax[:, None], TOP_WEIGHT, 0), kept), 0)


@triton.jit
def _uncut(row_ok, greedy, key_cut, level_cut, min_weight):
    """Whether none of (R,) rows is greedy or has a key cut, a level cut or a min-p weight: then
    every id's kept weight is its plain weight (``_plain_weights``), and a pass skips the tests
    (temperature alone, engines' most common sampling, as (bs,) tensors the host cannot read)."""
    cut = row_ok & ((greedy != 0) | (key_cut != KEEP_ALL_KEY) | (level_cut < LEVEL_MAX) | (min_weight > 0))
    return tl.max(cut.to(tl.int32), axis=0) == 0


@triton.jit
def _plain_weights(x, ok, row_max, scale, table_ptr):
    """``_kept_weights`` of rows that ``_uncut`` passes: each in-range id's weight (KEEP_ALL_KEY
    and LEVEL_MAX keep every level and id, a min weight <= 0 every weight), 0 elsewhere."""
    return tl.where(ok, _weights(_levels(x, row_max, scale, tl.int32), table_ptr, ok), 0)


@triton.jit
def _pass_weights(uncut, x, ids, ok, row_max, argmax, scale, greedy, key_cut, level_cut, min_weight, table_ptr,
                  INT32_KEYS: tl.constexpr = False):
    """A pass's kept weights of a tile: ``_kept_weights``, or, where ``uncut`` (a scalar: ``_uncut``
    of the program's rows), ``_plain_weights``, the same values without the tests. H200, bs 64 N 4
    V 151936, temperature alone: the kept pass took 135 us with the tests; a sum of plain weights
    over the same rows 58-61 (BENCHMARKS.md, twenty-ninth session)."""
    if uncut:
        kept = _plain_weights(x, ok, row_max, scale, table_ptr)
    else:
        kept = _kept_weights(x, ids, ok, row_max, argmax, scale, greedy, key_cut, level_cut, min_weight, table_ptr, INT32_KEYS)
    return kept


@triton.jit
def _probabilities(kept, kept_total):
    """Step 5: float32(w) / float32(W') (one correctly rounded division), 0 where W' = 0."""
    denominator = tl.maximum(kept_total.to(tl.float32), 1.0)
    probs = tl.math.div_rn(kept.to(tl.float32), tl.zeros_like(kept.to(tl.float32)) + denominator[:, None])
    return tl.where(kept_total[:, None] > 0, probs, 0.0)


# ----------------------------------------------------------------------------------------------
# split helpers


@triton.jit
def _request_params(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value, min_p_value,
                    tensor_params, req, req_ok, vocab):
    """RowParams of (R,) requests (``semantics.row_params``, in the kernel: no launches on the
    host). Bit b of ``tensor_params`` set: parameter b (temperature, top_k, top_p, min_p) comes
    from its (bs,) tensor, else from the scalar (already float32 / a normalised int)."""
    flags = tl.zeros_like(req) + tensor_params
    temperature = tl.load(temperature_ptr + req, mask=req_ok & ((flags & 1) != 0), other=temperature_value).to(tl.float32)
    greedy = (temperature > 0) == 0
    scale = tl.math.div_rn(tl.zeros_like(temperature) + LOG2E_SCALED, tl.where(greedy, 1.0, temperature))
    scale = tl.where(greedy, 1.0, scale)
    top_k = tl.load(top_k_ptr + req, mask=req_ok & ((flags & 2) != 0), other=top_k_value).to(tl.int64)
    top_k = tl.where((top_k > 0) & (top_k < vocab), top_k, 0).to(tl.int32)  # < V <= 2^23
    top_p = tl.load(top_p_ptr + req, mask=req_ok & ((flags & 4) != 0), other=top_p_value).to(tl.float32).to(tl.float64)
    top_p = tl.where(top_p < 1, top_p, 1.0)  # NaN: off
    top_p = tl.where(top_p > 0, top_p, MIN_TOP_P)  # <= 0: the top level alone
    min_p = tl.load(min_p_ptr + req, mask=req_ok & ((flags & 8) != 0), other=min_p_value).to(tl.float32).to(tl.float64)
    min_p = tl.where(min_p > 0, tl.where(min_p < 1, min_p, 1.0), 0.0)
    scaled = min_p * TOP_WEIGHT  # exact: a power-of-two scale
    min_weight = scaled.to(tl.int64)
    min_weight = tl.where(min_weight.to(tl.float64) < scaled, min_weight + 1, min_weight)  # ceil
    return greedy, scale, top_k, top_p, min_weight


@triton.jit
def _row_params(row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value,
                top_p_value, min_p_value, tensor_params):
    """(greedy, scale, top_k, top_p, min_weight) of (R,) rows: their requests' parameters."""
    request = tl.where(row_ok, row // rows_per_request, 0)
    return _request_params(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value, min_p_value,
                           tensor_params, request, row_ok, vocab)


@triton.jit
def _row_block(axis: tl.constexpr, rows, BLOCK_R: tl.constexpr):
    """(rows (R,), in range) of this program's block of rows along grid ``axis``."""
    row = tl.program_id(axis) * BLOCK_R + tl.arange(0, BLOCK_R)
    return row, row < rows


@triton.jit
def _searching_rows(row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value,
                    top_p_value, min_p_value, tensor_params):
    """``_row_params`` of (R,) rows and which cut searches each asks for: (greedy, scale, top_k,
    top_p, min_weight, use_top_p, use_top_k); a greedy row asks for none."""
    greedy, scale, top_k, top_p, min_weight = _row_params(
        row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value,
        min_p_value, tensor_params)
    use_top_p = row_ok & (greedy == 0) & (top_p < 1)
    use_top_k = row_ok & (greedy == 0) & (top_k > 0)
    return greedy, scale, top_k, top_p, min_weight, use_top_p, use_top_k


@triton.jit
def _tile_start(chunk, chunk_len, tile, BLOCK: tl.constexpr):
    """The first id of tile ``tile`` of chunk ``chunk`` (a scalar)."""
    return chunk * chunk_len + tile * BLOCK


@triton.jit
def _chunk_cols(chunk, chunk_len, tile, BLOCK: tl.constexpr):
    return _tile_start(chunk, chunk_len, tile, BLOCK) + tl.arange(0, BLOCK)


@triton.jit
def _sanitized_tile(raw, row_ok, lanes, row_room):
    """(in range, sanitised float32 logits) of the raw logits of the tile a loop works on
    (``_raw_tile``, ``_raw_groups``): ``row_ok`` and ``lanes`` (the lane indices in the tile)
    broadcast to the tile's shape; ``row_room``: how many ids the row has from the tile's first.
    The chunk's end is not tested: a loop works on its chunk's tiles only (only the load a tile
    ahead of the last one reaches past the chunk, and the loads' ``room`` masks it)."""
    ok = row_ok & (lanes < row_room)
    return ok, _sanitized(raw, ok)


@triton.jit
def _raw_tile(logits_ptr, row_offsets, row_ok, chunk, chunk_len, tile, vocab, stride_col, BLOCK: tl.constexpr,
              SCALAR_LOADS: tl.constexpr = False):
    """The raw logits of a chunk's tile, as loaded (-inf past the row, the chunk or ``row_ok``):
    ``_next_tile`` loads them a tile ahead and sanitises them when they are used.

    The bounds are one scalar a tile (``room``: the tile's ids left in the row and the chunk)
    against the lane index, and the addresses a row base a tile plus the lane: with an id a lane
    compared with V and the chunk's end, ptxas widened the ids to 64 bits and tested each against
    both (four compares an id; the fused walk's max pass took 86 instructions a tile of 4 ids a
    thread, 71 this way with its vector loads; sm_90, Triton 3.6). SCALAR_LOADS: one 2-4 byte
    load a logit instead of one vector load a thread (the fused walk, kernels/sampling.py). The
    walk's passes gather from the weight table, whose one-id-a-thread layout Triton 3.6 then gave
    its tiles, so the vector loads went through shared memory and two barriers a tile to reach it;
    without them the fused walk took 0.73-0.84x its time at V 151936 (H200, BENCHMARKS.md,
    forty-second session).
    Of the every-row passes, the kept and probability passes (which gather from the table too)
    take scalar loads since the forty-fifth session: with vector loads their tile loops held two
    barriers and a shared-memory round trip a tile (SASS, sm_90, Triton 3.6: kept 648 -> 496
    instructions, 11 -> 2 barriers, 64 -> 44 registers; probabilities 920 -> 776, 10 -> 2); the
    every-row verify then took 0.83-0.97x its time, process_logits 0.84-0.97x (H200). The max
    and level-bin passes keep vector loads: with scalar loads in every pass the every-row verify
    took 1.14-1.25x its time with top-k 50 and top-p 0.95 (forty-second session), and the
    level-bin pass gains no barrier-free loop from them. The window pass loads one logit a load
    in groups of its own (``_raw_groups``)."""
    start = _tile_start(chunk, chunk_len, tile, BLOCK)
    room = tl.minimum(vocab, (chunk + 1) * chunk_len) - start
    lanes = tl.arange(0, BLOCK)
    ok = row_ok[:, None] & (lanes[None, :] < room)
    base = logits_ptr + (row_offsets + start.to(tl.int64) * stride_col)
    if SCALAR_LOADS:
        lanes = tl.max_contiguous(lanes, 1)  # contiguity 1: Triton does not vectorise the load
    return tl.load(base[:, None] + lanes[None, :] * stride_col, mask=ok, other=float("-inf"))


@triton.jit
def _next_tile(ahead, logits_ptr, row_offsets, row_ok, chunk, chunk_len, tile, vocab, stride_col, BLOCK: tl.constexpr,
               SCALAR_LOADS: tl.constexpr = False):
    """Tile ``tile`` of a chunk from ``ahead``, its raw logits loaded one tile earlier: (ids,
    in range, sanitised float32 logits, the raw logits of tile + 1). Each pass's loop issues the
    next tile's load before it works on this one, so the load's latency overlaps the work: with
    one load in flight a program, the passes waited on memory (H100, bs 64 N 4 V 151936: the
    from-logits verify took 0.78x of its time with every pass reading ahead (chunk max, the four
    bin passes, kept, probabilities); BENCHMARKS.md, twenty-first session). The fused walk's row
    passes (kernels/sampling.py) read whole rows through it as chunk 0, with SCALAR_LOADS
    (``_raw_tile``)."""
    start = _tile_start(chunk, chunk_len, tile, BLOCK)
    lanes = tl.arange(0, BLOCK)
    cols = start + lanes
    ok, x = _sanitized_tile(ahead, row_ok[:, None], lanes[None, :], vocab - start)
    return cols, ok, x, _raw_tile(logits_ptr, row_offsets, row_ok, chunk, chunk_len, tile + 1, vocab, stride_col, BLOCK, SCALAR_LOADS)


@triton.jit
def _max_pass(logits_ptr, row_offsets, row_ok, chunk, chunk_len, vocab, stride_col, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
              WANT_LSE: tl.constexpr, SCALAR_LOADS: tl.constexpr = False):
    """(max, lowest argmax, sum of exp(x - max) (WANT_LSE; else 0), each lane's max (R, BLOCK_V))
    of chunk ``chunk`` of (R,) rows (the fused walk: a whole row as chunk 0; its listed top-k
    takes the lanes' maxima, callers that do not use them compile without them): the online pass
    with the log-sum-exp, else per-lane maxima reduced once (``_lane_max``)."""
    run_max = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    argmax = tl.full([BLOCK_R], NO_ID, dtype=tl.int32)
    sum_exp = tl.zeros([BLOCK_R], dtype=tl.float32)
    lane_max = tl.full([BLOCK_R, BLOCK_V], float("-inf"), dtype=tl.float32)
    ahead = _raw_tile(logits_ptr, row_offsets, row_ok, chunk, chunk_len, 0, vocab, stride_col, BLOCK_V, SCALAR_LOADS)
    if WANT_LSE:
        for tile in range(chunk_len // BLOCK_V):
            cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, row_ok, chunk, chunk_len, tile, vocab, stride_col, BLOCK_V,
                                            SCALAR_LOADS)
            run_max, argmax, sum_exp = _online_max(x, cols, ok, run_max, argmax, sum_exp)
            lane_max = tl.maximum(lane_max, x)
    else:
        lane_arg = tl.full([BLOCK_R, BLOCK_V], NO_ID, dtype=tl.int32)
        for tile in range(chunk_len // BLOCK_V):
            cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, row_ok, chunk, chunk_len, tile, vocab, stride_col, BLOCK_V,
                                            SCALAR_LOADS)
            lane_max, lane_arg = _lane_max(x, cols[None, :], ok, lane_max, lane_arg)
        run_max, argmax = _lanes_max(lane_max, lane_arg)
    return run_max, argmax, sum_exp, lane_max


@triton.jit
def _row_max(max_ptr, arg_ptr, row, row_ok, chunks, C_PAD: tl.constexpr):
    """(max, argmax) of (R,) rows from their chunks': the lowest id of the max, as one pass would
    find it (an all -inf row: id 0, chunk 0's lowest)."""
    lanes = tl.arange(0, C_PAD)
    ok = row_ok[:, None] & (lanes[None, :] < chunks)
    offsets = row.to(tl.int64)[:, None] * chunks + lanes[None, :]
    chunk_max = tl.load(max_ptr + offsets, mask=ok, other=float("-inf"))
    row_max = tl.max(chunk_max, axis=1)
    chunk_arg = tl.load(arg_ptr + offsets, mask=ok, other=NO_ID)
    argmax = tl.min(tl.where(ok & (chunk_max == row_max[:, None]), chunk_arg, NO_ID), axis=1)
    return row_max, argmax


@triton.jit
def _row_lse(max_ptr, sum_ptr, row, row_ok, chunks, row_max, C_PAD: tl.constexpr):
    """The raw log-sum-exp of (R,) rows from their chunks' (max, sum exp(x - max))."""
    lanes = tl.arange(0, C_PAD)
    ok = row_ok[:, None] & (lanes[None, :] < chunks)
    offsets = row.to(tl.int64)[:, None] * chunks + lanes[None, :]
    chunk_max = tl.load(max_ptr + offsets, mask=ok, other=float("-inf"))
    chunk_sum = tl.load(sum_ptr + offsets, mask=ok, other=0.0)
    finite = ok & (chunk_max > float("-inf"))
    total = tl.sum(tl.where(finite, chunk_sum * tl.exp(tl.where(finite, chunk_max - row_max[:, None], 0.0)), 0.0), axis=1)
    return tl.where(row_max > float("-inf"), row_max + tl.log(total), float("-inf"))


@triton.jit
def _chunk_bins(bins_ptr, row, row_ok, chunks, lanes, COUNTS: tl.constexpr):
    """The first pass's mass bins (COUNTS: its count bins) at chunks ``lanes`` (L,) of (R,) rows:
    (R, L, 16) int64, 0 past ``chunks``."""
    base = (row.to(tl.int64)[:, None] * chunks + lanes[None, :]) * (2 * DIGIT_BINS) + COUNTS * DIGIT_BINS
    offsets = base[:, :, None] + tl.arange(0, DIGIT_BINS)[None, None, :]
    ok = (row_ok[:, None] & (lanes[None, :] < chunks))[:, :, None]
    return tl.load(bins_ptr + offsets, mask=ok, other=0)


@triton.jit
def _summed_bins(bins_ptr, row, row_ok, chunks, C_PAD: tl.constexpr):
    """(mass bins, count bins), (R, 16) int64 each, of the first pass summed over the chunks.
    The chunks' bins are loaded 8 chunks at a time, every load issued before the sums: a loop
    over the chunks waited for each chunk's bins in turn (H100, bs 1 N 16 V 32000 at 32 chunks a
    row: the from-logits verify took 101.9 us with these loads, 113.3 with the loop); all C_PAD
    chunks in one load kept a 40-48 B local frame at the 128-register cap (sm_80, sm_90; offline
    compile matrix)."""
    mass = tl.zeros([row.shape[0], DIGIT_BINS], dtype=tl.int64)
    count = tl.zeros([row.shape[0], DIGIT_BINS], dtype=tl.int64)
    GROUP: tl.constexpr = 8 if C_PAD > 8 else C_PAD
    for group in tl.static_range(C_PAD // GROUP):
        lanes = group * GROUP + tl.arange(0, GROUP)
        mass += tl.sum(_chunk_bins(bins_ptr, row, row_ok, chunks, lanes, False), axis=1)
        count += tl.sum(_chunk_bins(bins_ptr, row, row_ok, chunks, lanes, True), axis=1)
    return mass, count


@triton.jit
def _next_digit(prefix, below, before, holds, use, shift):
    """One search's next digit at ``shift``: the largest bin j whose candidate prefix | (j << shift)
    is <= LEVEL_MAX and ``holds`` (R, 16) (the search's predicate on the bins' ``before`` sums);
    (new prefix, new sum below it), unchanged for rows that do not ``use`` the search (0 for rows
    that never search)."""
    bins = tl.arange(0, DIGIT_BINS)[None, :]
    candidate = prefix[:, None] + (bins.to(tl.int64) << shift)
    digit = tl.max(tl.where((candidate <= LEVEL_MAX) & holds, bins, 0), axis=1)
    below = tl.where(use, below + tl.sum(tl.where(bins == digit[:, None], before, 0), axis=1), below)
    prefix = tl.where(use, prefix + (digit.to(tl.int64) << shift), prefix)
    return prefix, below


@triton.jit
def _binding(prefix_p, prefix_k, use_top_p, use_top_k):
    """(top-p, top-k) searches still to run, given the prefixes of their cuts decided so far:
    with the top b of the 16 bits decided (4 after the first pass here, 1 a step in the fused
    walk's bitwise search) each cut lies in [prefix, prefix + 2^(16 - b) - 1] and both prefixes
    are multiples of 2^(16 - b), so prefix_p > prefix_k puts the whole range of cut_p above
    cut_k's. Then top-p (level <= cut_p) keeps every token top-k keeps and changes nothing: its
    search stops, its prefix (still above cut_k) standing in for cut_p; the same for top-k (keys
    up to level cut_k) when prefix_k > prefix_p."""
    p_above = use_top_k & (prefix_p > prefix_k)
    k_above = use_top_p & (prefix_k > prefix_p)
    return use_top_p & (p_above == 0), use_top_k & (k_above == 0)


@triton.jit
def _first_digit(bins_ptr, row, row_ok, chunks, use_top_p, use_top_k, top_p, top_k, C_PAD: tl.constexpr):
    """The cut searches after the first pass: (top-p prefix, the mass of the levels below it,
    top-k prefix, the count of the levels below it, the total weight), int64 (R,) each.

    The first digit of both searches is the largest candidate prefix j << 12 that is <= LEVEL_MAX
    and keeps the predicate true (top-p: float64(mass below) < top_p * float64(total); top-k:
    count below < k). Both predicates are monotone in the candidate, so each cut lies in the
    window of 4096 levels from its prefix."""
    zero = tl.zeros_like(row).to(tl.int64)
    mass, count = _summed_bins(bins_ptr, row, row_ok, chunks, C_PAD)
    total = tl.sum(mass, axis=1)  # the first pass's bins hold every level
    mass_before = tl.cumsum(mass, axis=1) - mass
    holds_p = mass_before.to(tl.float64) < (top_p * total.to(tl.float64))[:, None]
    prefix_p, below_p = _next_digit(zero, zero, mass_before, holds_p, use_top_p, FIRST_SHIFT)
    count_before = tl.cumsum(count, axis=1) - count
    prefix_k, below_k = _next_digit(zero, zero, count_before, count_before < top_k[:, None], use_top_k, FIRST_SHIFT)
    return prefix_p, below_p, prefix_k, below_k, total


@triton.jit
def _summed_window(counts_ptr, row, row_ok, chunks, offsets, SEARCH: tl.constexpr, C_PAD: tl.constexpr):
    """(R, T) int64: the window counts of search SEARCH at levels ``offsets`` (T,) summed over the
    chunks, 8 chunks a load in a loop to ``chunks`` (all C_PAD chunks of a 256-level tile in one load,
    or a loop to C_PAD, spilled 78-93 SGPRs on gfx90a/gfx942/gfx950 at 32 chunks in the generic
    spec; offline compile matrix)."""
    total = tl.zeros([row.shape[0], offsets.shape[0]], dtype=tl.int64)
    GROUP: tl.constexpr = 8 if C_PAD > 8 else C_PAD
    for first in range(0, chunks, GROUP):
        lanes = first + tl.arange(0, GROUP)
        total += tl.sum(_window_counts(counts_ptr, row, row_ok, chunks, lanes, offsets[None, :], SEARCH), axis=1).to(tl.int64)
    return total


@triton.jit
def _window_counts(counts_ptr, row, row_ok, chunks, lanes, offsets, SEARCH: tl.constexpr):
    """The count of tokens at window levels ``offsets`` ((R, T) or (1, T), in [0, 4096)) of search
    SEARCH (0: top-p, 1: top-k) in each of chunks ``lanes`` (L,) of (R,) rows: (R, L, T) int32, 0
    past ``chunks`` and where not ``row_ok``."""
    base = ((row.to(tl.int64)[:, None] * chunks + lanes[None, :]) * 2 + SEARCH) * WINDOW
    ok = (row_ok[:, None] & (lanes[None, :] < chunks))[:, :, None]
    return tl.load(counts_ptr + base[:, :, None] + offsets[:, None, :], mask=ok, other=0)


# ----------------------------------------------------------------------------------------------
# kernels (grid: (chunks, row blocks))


@triton.jit
def _chunk_max_kernel(logits_ptr, stride_row, stride_col, rows, vocab, chunk_len, max_ptr, arg_ptr, sum_ptr, chunks,
                      BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, WANT_LSE: tl.constexpr):
    """Step 1 per chunk: max, lowest argmax and (WANT_LSE) the online sum exp(x - max)."""
    chunk = tl.program_id(0)
    row, row_ok = _row_block(1, rows, BLOCK_R)
    row_offsets = row.to(tl.int64) * stride_row
    chunk_max, argmax, sum_exp, _ = _max_pass(logits_ptr, row_offsets, row_ok, chunk, chunk_len, vocab, stride_col, BLOCK_R, BLOCK_V,
                                              WANT_LSE)
    offsets = row.to(tl.int64) * chunks + chunk
    tl.store(max_ptr + offsets, chunk_max, mask=row_ok)
    tl.store(arg_ptr + offsets, argmax, mask=row_ok)
    if WANT_LSE:
        tl.store(sum_ptr + offsets, sum_exp, mask=row_ok)


@triton.jit
def _packed_count(low, high, digit, counted):
    """Add one to bin ``digit`` (0..15) of each lane's packed counts where ``counted``: bins 0-7 in
    the 8-bit fields of ``low``, 8-15 in ``high`` (int64 (R, T) each; a field overflows past 255,
    hence PACKED_TILES)."""
    one = tl.full(digit.shape, 1, dtype=tl.int64) << ((digit & 7) * 8).to(tl.int64)
    low += tl.where(counted & (digit < 8), one, 0)
    high += tl.where(counted & (digit >= 8), one, 0)
    return low, high


@triton.jit
def _unpacked_counts(low, high):
    """(R, 16) int64: the packed counts of every lane (``_packed_count``) summed per bin."""
    bins = tl.arange(0, DIGIT_BINS)[None, :, None]
    fields = tl.where(bins < 8, low[:, None, :], high[:, None, :]) >> ((bins & 7) * 8).to(tl.int64)
    return tl.sum(fields & 255, axis=2)


@triton.jit
def _level_bins_kernel(logits_ptr, stride_row, stride_col, rows, vocab, chunk_len, rows_per_request,
                       temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value, min_p_value,
                       tensor_params, table_ptr,
                       max_ptr, arg_ptr, bins_ptr, chunks,
                       BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, C_PAD: tl.constexpr):
    """The first pass of the cut searches: this chunk's weight (top-p rows) and token count (top-k
    rows) in each of the 16 bins of 4096 levels."""
    chunk = tl.program_id(0)
    row, row_ok = _row_block(1, rows, BLOCK_R)
    greedy, scale, top_k, top_p, _, use_top_p, use_top_k = _searching_rows(
        row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value,
        min_p_value, tensor_params)
    row_offsets = row.to(tl.int64) * stride_row
    heavy_digits = tl.arange(0, HEAVY_DIGITS)
    heavy = heavy_digits[None, :, None]
    # Per-lane sums, reduced once after the chunk (a reduction per tile, two (tile, 16) sums
    # through shared memory, made this pass 4x slower on the H100). The digits are the middle axis
    # so that a thread holds all of its ids' sums: with them last, the default layout spread them
    # over 16 lanes, and every tile's digits and weights went through shared memory to reach them
    # (3 layout conversions a tile: 1.6-1.75x this pass's time now, H100). The weights of digits
    # 0-7 take a compare, a select and an int64 add each an id, digits 8 and 9 one shifted add
    # (HEAVY_DIGITS; a select-add for each of the 16 bins took twice the instructions).
    mass = tl.zeros([BLOCK_R, HEAVY_DIGITS, BLOCK_V], dtype=tl.int64)
    light = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int64)
    count = tl.zeros([BLOCK_R, DIGIT_BINS], dtype=tl.int64)
    any_top_p = tl.max(use_top_p.to(tl.int32), axis=0) > 0
    any_top_k = tl.max(use_top_k.to(tl.int32), axis=0) > 0
    tiles = chunk_len // BLOCK_V
    # A program none of whose rows searches (tensor parameters with the masks off) reads no
    # partials nor logits (the row max is a chain of dependent loads): its bins are stored as
    # zeros, so nothing reads uninitialised memory.
    if any_top_p | any_top_k:
        row_max = _row_max(max_ptr, arg_ptr, row, row_ok, chunks, C_PAD)[0]
        ahead = _raw_tile(logits_ptr, row_offsets, row_ok, chunk, chunk_len, 0, vocab, stride_col, BLOCK_V)
        for first in range(0, tiles, PACKED_TILES):
            # The counts of a lane's ids, 8 bits a bin (_packed_count: a shift and two int64 adds an
            # id, where a 16-bin int32 one-hot compared and added 16 times), unpacked every
            # PACKED_TILES tiles (H100: 0.93-0.98x of the passes' time with top-k on).
            packed_low = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int64)
            packed_high = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int64)
            for tile in range(first, tl.minimum(first + PACKED_TILES, tiles)):
                cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, row_ok, chunk, chunk_len, tile, vocab, stride_col, BLOCK_V)
                level = _levels(x, row_max, scale, tl.int32)
                digit = level >> FIRST_SHIFT
                if any_top_p:
                    counted = ok & use_top_p[:, None]
                    weight = _weights(level, table_ptr, counted)
                    mass += tl.where(digit[:, None, :] == heavy, weight[:, None, :], 0)
                    field = tl.minimum(tl.maximum(digit - HEAVY_DIGITS, 0), 1) * LIGHT_FIELD_BITS  # digit 10 weighs 0
                    light += tl.where(digit >= HEAVY_DIGITS, weight << field.to(tl.int64), 0)
                if any_top_k:
                    packed_low, packed_high = _packed_count(packed_low, packed_high, digit, ok & use_top_k[:, None])
            if any_top_k:
                count += _unpacked_counts(packed_low, packed_high)
    # The 16 bins of mass: digits 0-7, then 8 and 9 from the two fields, then zeros (10-15).
    first_bin = (row.to(tl.int64) * chunks + chunk)[:, None] * (2 * DIGIT_BINS)  # (R, 1): this chunk's 2 x 16 bins
    offsets = first_bin + tl.arange(0, DIGIT_BINS)[None, :]
    lanes = heavy_digits[None, :]
    heavy_offsets = first_bin + lanes
    light_low = tl.sum(light & LIGHT_FIELD_MASK, axis=1)
    light_high = tl.sum(light >> LIGHT_FIELD_BITS, axis=1)
    light_bins = tl.where(lanes == 0, light_low[:, None], tl.where(lanes == 1, light_high[:, None], 0))
    tl.store(bins_ptr + heavy_offsets, tl.sum(mass, axis=2), mask=row_ok[:, None])
    tl.store(bins_ptr + heavy_offsets + HEAVY_DIGITS, light_bins, mask=row_ok[:, None])
    tl.store(bins_ptr + offsets + DIGIT_BINS, count, mask=row_ok[:, None])


@triton.jit
def _group_lanes(BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """The lane indices of a tile in groups of GROUP consecutive ids along axis GROUP_AXIS:
    (1, BLOCK // GROUP, GROUP) or (1, GROUP, BLOCK // GROUP) (see ``_window_counts_kernel``)."""
    if GROUP_AXIS == 2:
        lanes = tl.arange(0, GROUP)[None, None, :] + tl.arange(0, BLOCK // GROUP)[None, :, None] * GROUP
    else:
        lanes = tl.arange(0, GROUP)[None, :, None] + tl.arange(0, BLOCK // GROUP)[None, None, :] * GROUP
    return tl.max_contiguous(lanes, [1, 1, 1])  # one logit a load: the layout of the atomic adds


@triton.jit
def _raw_groups(logits_ptr, row_offsets, row_ok, chunk, chunk_len, tile, vocab, stride_col, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """``_raw_tile`` as (R, ...) of ``_group_lanes``: -inf past the row, the chunk or ``row_ok``. Its
    start, room and base repeat ``_raw_tile``'s: computed in a helper that both call, they changed
    the fused walk's sm_90 SASS (Triton 3.6 and 3.9; the same PTX but for its line info, and the
    same SASS with TRITON_DISABLE_LINE_INFO=1)."""
    start = _tile_start(chunk, chunk_len, tile, BLOCK)
    room = tl.minimum(vocab, (chunk + 1) * chunk_len) - start
    lanes = _group_lanes(BLOCK, GROUP)
    ok = row_ok[:, None, None] & (lanes < room)
    base = logits_ptr + (row_offsets + start.to(tl.int64) * stride_col)
    return tl.load(base[:, None, None] + lanes * stride_col, mask=ok, other=float("-inf"))


@triton.jit
def _count_in_window(window, above, inside, first):
    """Add one at ``window`` (R,) + ``above`` (R, ...) of ``_group_lanes`` for each id ``inside``,
    with relaxed atomics. A group (axis GROUP_AXIS) whose ids inside share one level adds its
    count at once, at its ``first`` lane: atomic adds at one address wait on each other, and every
    id of a constant row (or of a run of equal logits) has one level (H200, 256 rows of 151936
    zeros: 1202 us with an add an id; process_logits with top-k 50 and top-p 0.9 on them, 884 us
    with groups of 32)."""
    low = tl.expand_dims(tl.min(tl.where(inside, above, WINDOW), axis=GROUP_AXIS), GROUP_AXIS)
    high = tl.expand_dims(tl.max(tl.where(inside, above, -1), axis=GROUP_AXIS), GROUP_AXIS)
    count = tl.expand_dims(tl.sum(inside.to(tl.int32), axis=GROUP_AXIS), GROUP_AXIS)
    single = low == high  # one level, and some id inside
    tl.atomic_add(window[:, None, None] + tl.where(single, low, above), tl.where(single, count, 1), mask=tl.where(single, first, inside),
                  sem="relaxed")


@triton.jit
def _window_counts_kernel(logits_ptr, stride_row, stride_col, rows, vocab, chunk_len, rows_per_request,
                          temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value, min_p_value,
                          tensor_params, table_ptr,
                          max_ptr, arg_ptr, bins_ptr, search_ptr, counts_ptr, chunks,
                          BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, C_PAD: tl.constexpr):
    """The second pass of the cut searches: the first digit of each from the first pass's bins
    (stored by the chunk-0 program), then this chunk's count of tokens at each level of the
    windows of 4096 levels above the prefixes ((rows, chunks, 2, 4096) int32, zeroed by the host):
    relaxed atomic adds (``_count_in_window``). The windows are narrow, so few tokens but the
    heaviest fall in them. The counts are per chunk because the tie split needs each chunk's count
    at the top-k cut level (``_kept_kernel``). The weights follow from the levels, so these counts
    are all that the exact cuts need (``_window_fold_kernel``, ``_window_cuts_kernel``)."""
    # Groups of 32 ids, one a lane, so that a warp holds whole groups and their sums are warp
    # reductions; the loads and the adds share that layout (GROUP_AXIS): with vector loads, 128-id
    # groups and two adds, every tile went through 20 barriers (sm_90, Triton 3.6 and 3.9), and the
    # every-row verify took 1.01-1.02x its time with top-k/top-p (H200, forty-sixth session).
    GROUP: tl.constexpr = 32 if BLOCK_V > 32 else BLOCK_V
    chunk = tl.program_id(0)
    row, row_ok = _row_block(1, rows, BLOCK_R)
    greedy, scale, top_k, top_p, _, use_top_p, use_top_k = _searching_rows(
        row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value,
        min_p_value, tensor_params)
    if tl.max((use_top_p | use_top_k).to(tl.int32), axis=0) > 0:  # else: no partials, no logits read
        prefix_p, below_p, prefix_k, below_k, total = _first_digit(bins_ptr, row, row_ok, chunks, use_top_p, use_top_k, top_p, top_k, C_PAD)
        state = search_ptr + row.to(tl.int64) * SEARCH_FIELDS
        first_chunk = row_ok & (row * 0 + chunk == 0)
        tl.store(state, prefix_p, mask=first_chunk)
        tl.store(state + 1, below_p, mask=first_chunk)
        tl.store(state + 2, prefix_k, mask=first_chunk)
        tl.store(state + 3, below_k, mask=first_chunk)
        tl.store(state + 4, total, mask=first_chunk)
        use_top_p, use_top_k = _binding(prefix_p, prefix_k, use_top_p, use_top_k)
        row_max = _row_max(max_ptr, arg_ptr, row, row_ok, chunks, C_PAD)[0]
        row_offsets = row.to(tl.int64) * stride_row
        window_p = counts_ptr + ((row.to(tl.int64) * chunks + chunk) * 2) * WINDOW
        window_k = window_p + WINDOW
        lanes = _group_lanes(BLOCK_V, GROUP)
        first = lanes % GROUP == 0
        ahead = _raw_groups(logits_ptr, row_offsets, row_ok, chunk, chunk_len, 0, vocab, stride_col, BLOCK_V, GROUP)
        for tile in range(chunk_len // BLOCK_V):
            raw = ahead
            ahead = _raw_groups(logits_ptr, row_offsets, row_ok, chunk, chunk_len, tile + 1, vocab, stride_col, BLOCK_V, GROUP)
            ok, x = _sanitized_tile(raw, row_ok[:, None, None], lanes, vocab - _tile_start(chunk, chunk_len, tile, BLOCK_V))
            level = _distance_levels(row_max[:, None, None] - x, scale[:, None, None], tl.int32)
            above_p = level - prefix_p.to(tl.int32)[:, None, None]
            _count_in_window(window_p, above_p, ok & use_top_p[:, None, None] & (above_p >= 0) & (above_p < WINDOW), first)
            above_k = level - prefix_k.to(tl.int32)[:, None, None]
            _count_in_window(window_k, above_k, ok & use_top_k[:, None, None] & (above_k >= 0) & (above_k < WINDOW), first)


@triton.jit
def _window_searches(search_ptr, row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value,
                     top_k_value, top_p_value, min_p_value, tensor_params):
    """What the window kernels need of (R,) rows: (searching (either search asked for), top-p
    running, top-k running (after ``_binding``), top_p, top_k, prefix_p, below_p, prefix_k,
    below_k, total) from the parameters and the state the window counts stored."""
    _, _, top_k, top_p, _, use_top_p, use_top_k = _searching_rows(
        row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value,
        min_p_value, tensor_params)
    searching = use_top_p | use_top_k
    state = search_ptr + row.to(tl.int64) * SEARCH_FIELDS
    prefix_p = tl.load(state, mask=searching, other=0)
    below_p = tl.load(state + 1, mask=searching, other=0)
    prefix_k = tl.load(state + 2, mask=searching, other=0)
    below_k = tl.load(state + 3, mask=searching, other=0)
    total = tl.load(state + 4, mask=searching, other=0)
    use_top_p, use_top_k = _binding(prefix_p, prefix_k, use_top_p, use_top_k)
    return searching, use_top_p, use_top_k, top_p, top_k, prefix_p, below_p, prefix_k, below_k, total


@triton.jit
def _window_fold_kernel(rows, vocab, rows_per_request,
                        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value, min_p_value,
                        tensor_params, table_ptr,
                        search_ptr, counts_ptr, folded_ptr, tile_sums_ptr, chunks,
                        BLOCK_R: tl.constexpr, TILE: tl.constexpr, C_PAD: tl.constexpr):
    """One tile of TILE window levels of each row (grid: tiles, row blocks): the chunks' counts
    summed ((rows, 2, 4096) int32 ``folded``) and the tile's total, the weight of its levels in the
    top-p window and the count in the top-k window ((rows, 2, tiles) int64 ``tile_sums``). One
    program per row reading all the chunks' counts in turn took 57-134 us at 8-64 rows (H200); a
    program per tile reads one tile of them."""
    tile = tl.program_id(0)
    row, row_ok = _row_block(1, rows, BLOCK_R)
    searching, use_top_p, use_top_k, _, _, prefix_p, _, _, _, _ = _window_searches(
        search_ptr, row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value,
        top_p_value, min_p_value, tensor_params)
    if tl.max(searching.to(tl.int32), axis=0) > 0:  # rows that do not search: never read
        offsets = tile * TILE + tl.arange(0, TILE)
        count_p = _summed_window(counts_ptr, row, use_top_p, chunks, offsets, 0, C_PAD)
        count_k = _summed_window(counts_ptr, row, use_top_k, chunks, offsets, 1, C_PAD)
        level_p = prefix_p[:, None] + offsets[None, :]
        mass = count_p * _weights(level_p, table_ptr, (count_p > 0) & (level_p <= LEVEL_MAX))
        folded = folded_ptr + (row.to(tl.int64) * 2)[:, None] * WINDOW + offsets[None, :]
        tl.store(folded, count_p.to(tl.int32), mask=searching[:, None])
        tl.store(folded + WINDOW, count_k.to(tl.int32), mask=searching[:, None])
        sums = tile_sums_ptr + (row.to(tl.int64) * 2) * tl.num_programs(0) + tile
        tl.store(sums, tl.sum(mass, axis=1), mask=searching)
        tl.store(sums + tl.num_programs(0), tl.sum(count_k, axis=1), mask=searching)


@triton.jit
def _cut_in_window(before_tiles, holds_tiles, folded_ptr, row, run, below, tiles_lane, SEARCH: tl.constexpr, TILES: tl.constexpr,
                   TILE: tl.constexpr):
    """One search's cut tile of (R,) rows: the last tile whose first level's predicate holds
    (``holds_tiles`` (R, TILES), a prefix of the tiles), its first level's offset, the sum before
    it, and its folded counts (R, TILE) int64 (0 where not ``run``)."""
    cut_tile = tl.maximum(tl.sum(holds_tiles.to(tl.int32), axis=1) - 1, 0)
    before = below + tl.sum(tl.where(tiles_lane[None, :] == cut_tile[:, None], before_tiles, 0), axis=1)
    first = cut_tile * TILE
    offsets = first[:, None] + tl.arange(0, TILE)[None, :]
    counts = tl.load(folded_ptr + (row.to(tl.int64) * 2 + SEARCH)[:, None] * WINDOW + offsets, mask=run[:, None], other=0).to(tl.int64)
    return first, before, offsets, counts


@triton.jit
def _window_cuts_kernel(rows, vocab, rows_per_request,
                        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value, min_p_value,
                        tensor_params, table_ptr,
                        search_ptr, folded_ptr, tile_sums_ptr, cuts_ptr,
                        BLOCK_R: tl.constexpr, TILE: tl.constexpr):
    """Each row's exact cuts from its folded window counts: the top-p cut is the largest level
    whose heavier mass (below the prefix, then the window's levels before it, each level's count
    times its weight) is < top_p * total; the top-k cut the largest whose heavier count is < k,
    with that count. Both predicates hold on a prefix of the window (the first digit chose it so):
    the tiles' sums give the cut's tile, and the cut is that tile's first level plus the number of
    its levels where the predicate holds, minus one. A search that ``_binding`` stopped keeps its
    prefix. Stored as CUT_FIELDS int64 a row (the top-k cut's window offset -1 where no window was
    counted)."""
    row, row_ok = _row_block(0, rows, BLOCK_R)
    searching, use_top_p, use_top_k, top_p, top_k, prefix_p, below_p, prefix_k, below_k, total = _window_searches(
        search_ptr, row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value,
        top_p_value, min_p_value, tensor_params)
    if tl.max(searching.to(tl.int32), axis=0) > 0:  # rows that do not search: their cuts are never read
        TILES: tl.constexpr = WINDOW // TILE
        threshold = top_p * total.to(tl.float64)
        tiles_lane = tl.arange(0, TILES)
        sums = tile_sums_ptr + (row.to(tl.int64) * 2)[:, None] * TILES + tiles_lane[None, :]
        mass_tiles = tl.load(sums, mask=use_top_p[:, None], other=0)
        count_tiles = tl.load(sums + TILES, mask=use_top_k[:, None], other=0)
        starts = tiles_lane[None, :] * TILE
        before_p = tl.cumsum(mass_tiles, axis=1) - mass_tiles
        holds_p = ((below_p[:, None] + before_p).to(tl.float64) < threshold[:, None]) & (prefix_p[:, None] + starts <= LEVEL_MAX)
        before_k = tl.cumsum(count_tiles, axis=1) - count_tiles
        holds_k = (below_k[:, None] + before_k < top_k[:, None]) & (prefix_k[:, None] + starts <= LEVEL_MAX)
        first_p, below_p, offsets_p, count_p = _cut_in_window(before_p, holds_p, folded_ptr, row, use_top_p, below_p, tiles_lane, 0,
                                                              TILES, TILE)
        first_k, below_k, offsets_k, count_k = _cut_in_window(before_k, holds_k, folded_ptr, row, use_top_k, below_k, tiles_lane, 1,
                                                              TILES, TILE)
        level_p = prefix_p[:, None] + offsets_p
        mass = count_p * _weights(level_p, table_ptr, (count_p > 0) & (level_p <= LEVEL_MAX))
        before = below_p[:, None] + tl.cumsum(mass, axis=1) - mass
        steps_p = tl.sum(((before.to(tl.float64) < threshold[:, None]) & (level_p <= LEVEL_MAX)).to(tl.int64), axis=1)
        before = below_k[:, None] + tl.cumsum(count_k, axis=1) - count_k
        holds = (before < top_k[:, None]) & (prefix_k[:, None] + offsets_k <= LEVEL_MAX)
        steps_k = tl.sum(holds.to(tl.int64), axis=1)
        heavier_k = tl.max(tl.where(holds, before, 0), axis=1)  # the count heavier than the cut: before its level
        cut_p = tl.where(use_top_p, prefix_p + first_p + steps_p - 1, prefix_p)
        cut_k = tl.where(use_top_k, prefix_k + first_k + steps_k - 1, prefix_k)
        cuts = cuts_ptr + row.to(tl.int64) * CUT_FIELDS
        tl.store(cuts, cut_p, mask=searching)
        tl.store(cuts + 1, cut_k, mask=searching)
        tl.store(cuts + 2, tl.where(use_top_k, heavier_k, below_k), mask=searching)
        tl.store(cuts + 3, tl.where(use_top_k, first_k + steps_k - 1, -1), mask=searching)


@triton.jit
def _kept_kernel(logits_ptr, stride_row, stride_col, rows, vocab, chunk_len, rows_per_request,
                 temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value, min_p_value,
                 tensor_params, table_ptr,
                 max_ptr, arg_ptr, window_cuts_ptr, counts_ptr, cuts_ptr, kept_ptr, chunks,
                 SEARCH: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, C_PAD: tl.constexpr):
    """The cuts (key cut, level cut) of each row, stored in ``cuts``, and this chunk's kept total.

    The top-k cut keeps every token below its level and the ``need`` lowest ids at it. The tied
    tokens of the chunks come in id order, so a chunk before the one where the count of tied
    tokens reaches ``need`` keeps all of its own, a chunk after it none, and that chunk finds the
    id of the need-th (the key cut's id) in one more pass over itself."""
    chunk = tl.program_id(0)
    row, row_ok = _row_block(1, rows, BLOCK_R)
    greedy, scale, top_k, top_p, min_weight, use_top_p, use_top_k = _searching_rows(
        row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value,
        min_p_value, tensor_params)
    row_max, argmax = _row_max(max_ptr, arg_ptr, row, row_ok, chunks, C_PAD)
    row_offsets = row.to(tl.int64) * stride_row
    level_cut = tl.full([BLOCK_R], LEVEL_MAX, dtype=tl.int64)
    key_cut = tl.full([BLOCK_R], KEEP_ALL_KEY, dtype=tl.int64)  # the row's
    chunk_key_cut = key_cut  # what this chunk keeps of the tie
    crossing = row_ok & (row < 0)  # no row: the chunk that finds a split tie's id
    split = crossing
    if SEARCH:
        # A program without a searching row reads no partials (as in _level_bins_kernel).
        searching = use_top_p | use_top_k
        if tl.max(searching.to(tl.int32), axis=0) > 0:
            window_cuts = window_cuts_ptr + row.to(tl.int64) * CUT_FIELDS
            cut_p = tl.load(window_cuts, mask=searching, other=0)
            cut_k = tl.load(window_cuts + 1, mask=searching, other=0)
            below_k = tl.load(window_cuts + 2, mask=searching, other=0)
            tie_offset = tl.load(window_cuts + 3, mask=searching, other=-1)
            level_cut = tl.where(use_top_p, cut_p, level_cut)
            # Tokens at the cut level, per chunk: the chunks' window counts at its offset (none
            # where the top-k search stopped: it keeps its whole level).
            others = tl.arange(0, C_PAD)
            in_chunk = tl.sum(_window_counts(counts_ptr, row, use_top_k & (tie_offset >= 0), chunks, others,
                                             tl.maximum(tie_offset, 0)[:, None], 1), axis=2).to(tl.int64)  # (R, C_PAD): one load
            tied_before = tl.sum(tl.where(others[None, :] < chunk, in_chunk, 0), axis=1)
            tied_here = tl.sum(tl.where(others[None, :] == chunk, in_chunk, 0), axis=1)
            tied = tl.sum(in_chunk, axis=1)
            need = top_k - below_k
            split = use_top_k & (tied > need)
            keep_tie = cut_k * ID_SCALE + ID_LAST
            key_cut = tl.where(use_top_k, keep_tie, key_cut)
            crossing = split & (tied_before < need) & (need <= tied_before + tied_here)
            chunk_key_cut = tl.where(split & (tied_before >= need), cut_k * ID_SCALE - 1, key_cut)
            if tl.max(crossing.to(tl.int32), axis=0) > 0:
                rank = need - tied_before  # of the tied token that is kept last, among this chunk's
                seen = tl.zeros([BLOCK_R], dtype=tl.int64)
                id_cut = tl.full([BLOCK_R], NO_ID, dtype=tl.int32)
                for tile in range(chunk_len // BLOCK_V):
                    cols = _chunk_cols(chunk, chunk_len, tile, BLOCK_V)
                    ok = crossing[:, None] & (cols[None, :] < vocab)
                    x = _load_logits(logits_ptr, row_offsets, cols, ok, stride_col)
                    at_cut = ok & (_levels(x, row_max, scale, tl.int32) == cut_k.to(tl.int32)[:, None])
                    order = seen[:, None] + tl.cumsum(at_cut.to(tl.int64), axis=1)
                    id_cut = tl.minimum(id_cut, tl.min(tl.where(at_cut & (order == rank[:, None]), cols[None, :], NO_ID), axis=1))
                    seen += tl.sum(at_cut.to(tl.int64), axis=1)
                key_cut = tl.where(crossing, cut_k * ID_SCALE + id_cut, key_cut)
                chunk_key_cut = tl.where(crossing, key_cut, chunk_key_cut)
    # Per-lane sums, reduced once after the chunk: a (rows, tile) sum per tile synchronised the
    # program's warps at every tile. One logit a thread a load, as in the probability pass
    # (_raw_tile's SCALAR_LOADS: the table gather's layout without a shared-memory round trip).
    kept_sums = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int64)
    ahead = _raw_tile(logits_ptr, row_offsets, row_ok, chunk, chunk_len, 0, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
    uncut = _uncut(row_ok, greedy, chunk_key_cut, level_cut, min_weight)
    for tile in range(chunk_len // BLOCK_V):
        cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, row_ok, chunk, chunk_len, tile, vocab, stride_col, BLOCK_V,
                                        SCALAR_LOADS=True)
        kept_sums += _pass_weights(uncut, x, cols[None, :], ok, row_max, argmax, scale, greedy, chunk_key_cut, level_cut, min_weight,
                                   table_ptr, True)
    tl.store(kept_ptr + row.to(tl.int64) * chunks + chunk, tl.sum(kept_sums, axis=1), mask=row_ok)
    # One writer per row: the chunk that found the tie's id, else chunk 0 (which writes the level cut).
    tl.store(cuts_ptr + row.to(tl.int64) * 2, key_cut, mask=crossing | (row_ok & (row * 0 + chunk == 0) & (split == 0)))
    tl.store(cuts_ptr + row.to(tl.int64) * 2 + 1, level_cut, mask=row_ok & (row * 0 + chunk == 0))


@triton.jit
def _processed_row(row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value,
                   top_p_value, min_p_value, tensor_params, max_ptr, arg_ptr, sum_ptr, cuts_ptr, kept_ptr, lse_ptr, lse_ok, chunks,
                   C_PAD: tl.constexpr, WANT_LSE: tl.constexpr):
    """What step 5 needs of (R,) rows, from the partials of launches 1-5: (greedy, scale,
    min_weight, row max, argmax, key cut, level cut, kept total); WANT_LSE: the raw log-sum-exp
    stored where ``lse_ok``."""
    greedy, scale, _, _, min_weight = _row_params(
        row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value,
        min_p_value, tensor_params)
    row_max, argmax = _row_max(max_ptr, arg_ptr, row, row_ok, chunks, C_PAD)
    if WANT_LSE:
        tl.store(lse_ptr + row, _row_lse(max_ptr, sum_ptr, row, row_ok, chunks, row_max, C_PAD), mask=lse_ok)
    key_cut = tl.load(cuts_ptr + row.to(tl.int64) * 2, mask=row_ok, other=0)
    level_cut = tl.load(cuts_ptr + row.to(tl.int64) * 2 + 1, mask=row_ok, other=0)
    lanes = tl.arange(0, C_PAD)
    kept_total = tl.sum(tl.load(kept_ptr + row.to(tl.int64)[:, None] * chunks + lanes[None, :],
                                mask=row_ok[:, None] & (lanes[None, :] < chunks), other=0), axis=1)
    return greedy, scale, min_weight, row_max, argmax, key_cut, level_cut, kept_total


@triton.jit
def _probs_kernel(logits_ptr, stride_row, stride_col, rows, vocab, chunk_len, rows_per_request,
                  temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value, min_p_value,
                  tensor_params, table_ptr,
                  max_ptr, arg_ptr, sum_ptr, cuts_ptr, kept_ptr, probs_ptr, lse_ptr, chunks,
                  accept_ptr, num_correct_ptr, accept_width, requests, parts,
                  BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, C_PAD: tl.constexpr, WANT_LSE: tl.constexpr, FINAL_ROWS: tl.constexpr):
    """Step 5 on this part of a chunk (axis 0: chunk * ``parts`` + part; a part holds
    cdiv(tiles, parts) of the chunk's tiles, the last fewer or none): float32(w) / float32(W')
    with W' the row's kept total. FINAL_ROWS: axis 1 counts requests, and a request's row is its
    walk's final node, accept_index[b, num_correct[b]] of a Verdict ((requests, accept_width) and
    (requests,) int32): the whole row that a sampling walk reads (``process_path_rows``); no
    log-sum-exp then."""
    chunk = tl.program_id(0) // parts
    tiles = chunk_len // BLOCK_V
    part_tiles = tl.cdiv(tiles, parts)
    first_tile = (tl.program_id(0) - chunk * parts) * part_tiles
    if FINAL_ROWS:
        request, request_ok = _row_block(1, requests, BLOCK_R)
        accepted = tl.load(num_correct_ptr + request, mask=request_ok, other=0)
        row = tl.load(accept_ptr + request.to(tl.int64) * accept_width + accepted, mask=request_ok, other=-1)
        row_ok = request_ok & (row >= 0) & (row < rows)  # never otherwise: the walk wrote it
        row = tl.where(row_ok, row, 0)
    else:
        row, row_ok = _row_block(1, rows, BLOCK_R)
    greedy, scale, min_weight, row_max, argmax, key_cut, level_cut, kept_total = _processed_row(
        row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value,
        min_p_value, tensor_params, max_ptr, arg_ptr, sum_ptr, cuts_ptr, kept_ptr, lse_ptr, row_ok & (row * 0 + tl.program_id(0) == 0),
        chunks, C_PAD, WANT_LSE)
    row_offsets = row.to(tl.int64) * stride_row
    ahead = _raw_tile(logits_ptr, row_offsets, row_ok, chunk, chunk_len, first_tile, vocab, stride_col, BLOCK_V, SCALAR_LOADS=True)
    uncut = _uncut(row_ok, greedy, key_cut, level_cut, min_weight)
    for tile in range(first_tile, tl.minimum(first_tile + part_tiles, tiles)):
        cols, ok, x, ahead = _next_tile(ahead, logits_ptr, row_offsets, row_ok, chunk, chunk_len, tile, vocab, stride_col, BLOCK_V,
                                        SCALAR_LOADS=True)
        kept = _pass_weights(uncut, x, cols[None, :], ok, row_max, argmax, scale, greedy, key_cut, level_cut, min_weight, table_ptr, True)
        tl.store(probs_ptr + row.to(tl.int64)[:, None] * vocab + cols[None, :], _probabilities(kept, kept_total), mask=ok)


@triton.jit
def _candidate_probs_kernel(logits_ptr, stride_row, stride_col, rows, vocab, rows_per_request,
                            temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value, min_p_value,
                            tensor_params, table_ptr,
                            max_ptr, arg_ptr, sum_ptr, cuts_ptr, kept_ptr, probs_ptr, lse_ptr, chunks, cand_ptr,
                            BLOCK_R: tl.constexpr, N_PAD: tl.constexpr, C_PAD: tl.constexpr, WANT_LSE: tl.constexpr):
    """Step 5 at the candidate tokens alone: row r's probabilities at the N = rows_per_request
    tokens of its request's (requests, N) ``cand`` (ids outside [0, V) skipped; a repeated id
    writes the same value twice), and every row's log-sum-exp (WANT_LSE): what a sampling walk
    reads of a row it passes through (``process_path_rows``)."""
    row, row_ok = _row_block(0, rows, BLOCK_R)
    greedy, scale, min_weight, row_max, argmax, key_cut, level_cut, kept_total = _processed_row(
        row, row_ok, rows_per_request, vocab, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, temperature_value, top_k_value, top_p_value,
        min_p_value, tensor_params, max_ptr, arg_ptr, sum_ptr, cuts_ptr, kept_ptr, lse_ptr, row_ok, chunks, C_PAD, WANT_LSE)
    lanes = tl.arange(0, N_PAD)
    request = tl.where(row_ok, row // rows_per_request, 0).to(tl.int64)
    ids = tl.load(cand_ptr + request[:, None] * rows_per_request + lanes[None, :],
                  mask=row_ok[:, None] & (lanes[None, :] < rows_per_request), other=-1).to(tl.int64)
    ok = row_ok[:, None] & (ids >= 0) & (ids < vocab)
    ids = tl.where(ok, ids, 0)
    row_offsets = row.to(tl.int64) * stride_row
    x = _sanitized(tl.load(logits_ptr + row_offsets[:, None] + ids * stride_col, mask=ok, other=float("-inf")), ok)
    kept = _kept_weights(x, ids, ok, row_max, argmax, scale, greedy, key_cut, level_cut, min_weight, table_ptr, True)
    tl.store(probs_ptr + row.to(tl.int64)[:, None] * vocab + ids, _probabilities(kept, kept_total), mask=ok)


# ----------------------------------------------------------------------------------------------
# launch config

# Left to itself, ptxas compiled the level-bin pass (Triton 3.9, sm_90) and the kept pass with
# its per-lane sums (Triton 3.9 on sm_90 and sm_100, 3.6 on sm_90) at 64-80 registers and kept
# long-lived values in an 8 B local frame; under an explicit 128 both compile frame-free (offline
# compile matrix). 128 registers x 256 threads still lets two programs share an SM.
SEARCH_MAXNREG = 128

MAX_CHUNKS = 32  # bounds what every program reads of its row's partials (C_PAD values a pass)
# NVIDIA: the level-bin programs (256 threads at 80-128 registers) hold 2 an SM, so a launch runs
# in waves of 2 x SMs programs. A row is cut into as few chunks as keep every chunk within
# CHUNK_IDS while the launch fills whole waves, at most MAX_WAVES of them: each program pays a
# chain of dependent loads (parameters, the search state, the row max) and a reduction of its
# per-lane bins, so at small batches fewer, longer programs win (H100, bs 8 N 4 V 32000: 90 us
# against 112 with the 16 chunks of about 4 programs an SM, which ran 2 waves), and beyond 4 waves
# more chunks cost the top-p passes more than they gain (process_logits 256 x 151936, top-p only:
# 2214 us in 7 chunks, 2144 in 4, 2133 in 3; with top-k 50 as well 2010, 1994, 2031).
# BENCHMARKS.md, twentieth session.
SPLIT_RESIDENT_PER_SM = {"nvidia": 2}
CHUNK_IDS = 24576
MAX_WAVES = 4
# AMD keeps about PROGRAMS_PER_SM programs a CU, rounded up: no AMD GPU here measures a change.
PROGRAMS_PER_SM = 4


def _chunks_wanted(target: KernelTarget, rows: int, vocab: int) -> int:
    """How many chunks a row is cut into, at most (see SPLIT_RESIDENT_PER_SM)."""
    rows = max(rows, 1)
    if target.vendor in SPLIT_RESIDENT_PER_SM:
        slots = SPLIT_RESIDENT_PER_SM[target.vendor] * target.multiprocessors  # programs a wave
        # the fewest waves whose chunks hold at most CHUNK_IDS ids, at most MAX_WAVES
        waves = min(MAX_WAVES, cdiv(cdiv(vocab, CHUNK_IDS) * rows, slots))
        return min(MAX_CHUNKS, max(1, waves * slots // rows))
    return min(MAX_CHUNKS, max(1, cdiv(PROGRAMS_PER_SM * target.multiprocessors, rows)))


@dataclass(frozen=True)
class SplitLaunch:
    rows: int  # BLOCK_R
    chunks: int  # per row
    chunk_len: int  # ids a chunk, a multiple of both tiles
    block_v: int  # tile of the max, kept and probability passes
    bins_block: int  # tile of the level-bin passes ((rows, 8, tile) int64 sums and a packed (rows, tile))
    kept_block: int  # tile of the kept pass
    warps: int
    search_maxnreg: int = 0  # the level-bin and kept passes' register cap (0: none)
    # Window levels a program of ``_window_fold_kernel`` (a tile of the cuts). 1024: fewer, larger
    # programs; the every-row verify and process_logits with top-k/top-p took 0.94-0.96x their
    # time at 256 (H200, bs 8-64, V 32000 and 151936, same results; 512: 0.96-1.00x, 128:
    # 0.98-1.12x; BENCHMARKS.md, forty-sixth session).
    cuts_tile: int = 1024

    @property
    def search_options(self) -> dict:
        """Compile options of ``_level_bins_kernel``'s and ``_kept_kernel``'s launches."""
        return {"maxnreg": self.search_maxnreg} if self.search_maxnreg else {}

    @property
    def c_pad(self) -> int:
        return max(next_power_of_2(self.chunks), 2)


@functools.lru_cache(maxsize=256)
def split_launch(target: KernelTarget, rows: int, vocab: int) -> SplitLaunch:
    """On a GPU, one row a program, 256 threads, and at most ``_chunks_wanted`` chunks a row;
    the interpreter vectorises many rows with one chunk a row."""
    if target.vendor == "interpreter":
        block_v = min(max(next_power_of_2(max(vocab, 1)), 16), 4096)
        bins_block = min(block_v, 512)
        block_r = max(1, min(next_power_of_2(max(rows, 1)), 2**14 // bins_block))
        # the window fold loads (rows, 2 chunk lanes, tile) counts: at most 2^19 at once
        cuts_tile = min(WINDOW_LEVELS, 2**18 // block_r)
        return SplitLaunch(block_r, 1, cdiv(vocab, block_v) * block_v, block_v, bins_block, bins_block, 1, cuts_tile=cuts_tile)
    block_v = min(1024, max(next_power_of_2(max(vocab, 1)), 128))
    # 128 ids a level-bin tile on AMD: 256 spilled 9-12 VGPRs on gfx942 with Triton 3.6 (the first pass,
    # 32 chunks; 3.9 is clean); offline compile matrix.
    bins_block = min(block_v, 128 if target.vendor == "amd" else 256)
    # The kept pass's tile is the max pass's. It was half of it (1024 ids kept a 24 B local frame
    # on sm_100 with the tie search, Triton 3.9) until its tiles took scalar loads (_raw_tile),
    # which compile frame-free at 1024 on the six targets with Triton 3.9 and on sm_90 and gfx942
    # with 3.6 (offline compile matrix); H200: 0.91-1.00x the time of 512 with scalar loads
    # (BENCHMARKS.md, forty-fifth session). AMD takes the same tile and loads, not timed (no AMD GPU).
    kept_block = block_v
    chunk_len = cdiv(cdiv(vocab, _chunks_wanted(target, rows, vocab)), block_v) * block_v  # the chunks: at most the wanted
    return SplitLaunch(1, cdiv(vocab, chunk_len), chunk_len, block_v, bins_block, kept_block, target.warps(256),
                       SEARCH_MAXNREG if target.vendor == "nvidia" else 0)


# ----------------------------------------------------------------------------------------------
# host functions


def cuts_possible(top_k, top_p, vocab: int) -> bool:
    """Whether some row may have a top-k or top-p mask (a tensor parameter always may): when not,
    the search passes are skipped."""
    if isinstance(top_k, torch.Tensor) or isinstance(top_p, torch.Tensor):
        return True
    return 0 < top_k < vocab or top_p < 1


def _scalar_or_tensor(value, dtype, placeholder: torch.Tensor, bit: int):
    """(pointer, scalar, flag bit) of a per-request parameter for ``_request_params``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype).contiguous(), 0, bit  # the kernel indexes it by request: stride 1
    return placeholder, value, 0


def kernel_params(vocab: int, placeholder: torch.Tensor, *, temperature, top_k, top_p, min_p) -> tuple:
    """The 9 kernel arguments of ``_request_params``: 4 pointers, 4 scalars, the flags of which
    parameters are (bs,) tensors. ``placeholder``: any float32 tensor on the device, passed (never
    read) for a parameter given as a number."""
    table = semantics.exp2_table(placeholder.device)
    if isinstance(top_k, torch.Tensor):
        top_k_arg = _scalar_or_tensor(top_k, torch.int64, table, 2)
    else:  # normalised on the host: off unless 0 < k < V (a Python int may exceed int64 range checks)
        top_k_arg = (table, top_k if 0 < top_k < vocab else 0, 0)
    params = (_scalar_or_tensor(temperature, torch.float32, placeholder, 1), top_k_arg,
              _scalar_or_tensor(top_p, torch.float32, placeholder, 4), _scalar_or_tensor(min_p, torch.float32, placeholder, 8))
    pointers = [param[0] for param in params]
    scalars = [float(params[0][1]), int(params[1][1]), float(params[2][1]), float(params[3][1])]
    return (*pointers, *scalars, sum(param[2] for param in params))


# CUDA caps grid axes 1 and 2 at 65535 programs; the row blocks run on axis 1 (the chunks of a
# row on axis 0 launch together), so more rows are processed in slabs of whole requests.
MAX_ROW_BLOCKS = 65535
# The window counts take 32 KiB a chunk of a row (two windows of 4096 int32), whatever the
# vocabulary. Where that is more than the row's logits (2 bytes an id), a slab holds at most this
# many bytes of them (2048 rows of one chunk), so that many rows of a small vocabulary (the
# statistical cases: 24,000 rows of 8 ids) are not a gigabyte of counts.
WINDOW_COUNTS_BYTES = 64 << 20


def slab_rows(config: SplitLaunch, rows_per_request: int, vocab: int, *, search: bool) -> int:
    """Rows of a slab: whole requests (one at least), at most MAX_ROW_BLOCKS row blocks and, where
    a row's window counts (``search``) outweigh its logits, at most WINDOW_COUNTS_BYTES of them."""
    limit = config.rows * MAX_ROW_BLOCKS
    row_counts_bytes = config.chunks * 2 * WINDOW_LEVELS * 4
    if search and row_counts_bytes > 2 * vocab:
        limit = min(limit, WINDOW_COUNTS_BYTES // row_counts_bytes)
    return max(1, limit // rows_per_request) * rows_per_request


def process_rows(logits: torch.Tensor, rows_per_request: int, *, temperature, top_k, top_p, min_p, want_lse: bool, target: KernelTarget,
                 out: Optional[torch.Tensor] = None):
    """(probs (R, V) float32, lse (R,) float32 or None) of 2-D logits (any strides) whose row r
    belongs to request r // rows_per_request; the parameters are numbers or (requests,) tensors
    (validated by the caller)."""
    rows, vocab = logits.shape
    device = logits.device
    probs = out if out is not None else torch.empty((rows, vocab), dtype=torch.float32, device=device)
    lse = torch.empty(rows if want_lse else 1, dtype=torch.float32, device=device)
    if rows == 0:
        return probs, (lse if want_lse else None)
    config = split_launch(target, rows, vocab)
    search = cuts_possible(top_k, top_p, vocab)
    slab = slab_rows(config, rows_per_request, vocab, search=search)
    for start in range(0, rows, slab):
        end = min(rows, start + slab)
        params = {name: value[start // rows_per_request:] if isinstance(value, torch.Tensor) else value
                  for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("min_p", min_p))}
        _process_slab(logits[start:end], probs[start:end], lse[start:end] if want_lse else lse, rows_per_request, params,
                      search=search, want_lse=want_lse, config=config)
    return probs, (lse if want_lse else None)


@dataclass
class _RowPartials:
    """What launches 1-5 leave for step 5 (the probabilities) on a slab of rows."""
    row_args: tuple  # (logits, its strides, rows, V, chunk_len)
    param_args: tuple  # (rows_per_request, the parameters, the exp2 table)
    chunk_max: torch.Tensor
    chunk_arg: torch.Tensor
    chunk_sum: torch.Tensor
    cuts: torch.Tensor
    kept: torch.Tensor

    def step5_args(self, probs: torch.Tensor, lse: torch.Tensor) -> tuple:
        """The arguments ``_probs_kernel`` and ``_candidate_probs_kernel`` share after the row's."""
        return (*self.param_args, self.chunk_max, self.chunk_arg, self.chunk_sum, self.cuts, self.kept, probs, lse, self.kept.shape[1])


def _row_partials(logits: torch.Tensor, rows_per_request: int, params: dict, *, search: bool, want_lse: bool,
                  config: SplitLaunch) -> _RowPartials:
    """Launches 1-5 of :func:`process_rows` on the rows of one slab (:func:`slab_rows`)."""
    rows, vocab = logits.shape
    device = logits.device
    chunks = config.chunks
    grid = (chunks, cdiv(rows, config.rows))
    chunk_max = torch.empty((rows, chunks), dtype=torch.float32, device=device)
    chunk_arg = torch.empty((rows, chunks), dtype=torch.int32, device=device)
    chunk_sum = torch.empty((rows, chunks) if want_lse else 1, dtype=torch.float32, device=device)
    bins = torch.empty((rows, chunks, 2, 16) if search else 1, dtype=torch.int64, device=device)
    search_state = torch.empty((rows, 5) if search else 1, dtype=torch.int64, device=device)
    # Zeroed only where launches 3-5 read it (a fill launch, host and device time, otherwise).
    window_counts = torch.zeros((rows, chunks, 2, WINDOW_LEVELS), dtype=torch.int32, device=device) if search else chunk_arg
    window_cuts = torch.empty((rows, 4) if search else 1, dtype=torch.int64, device=device)
    cuts = torch.empty((rows, 2), dtype=torch.int64, device=device)
    kept = torch.empty((rows, chunks), dtype=torch.int64, device=device)
    row_args = (logits, logits.stride(0), logits.stride(1), rows, vocab, config.chunk_len)
    param_args = (rows_per_request, *kernel_params(vocab, chunk_max, **params), semantics.exp2_table(device))
    _chunk_max_kernel[grid](*row_args, chunk_max, chunk_arg, chunk_sum, chunks,
                            BLOCK_R=config.rows, BLOCK_V=config.block_v, WANT_LSE=want_lse, num_warps=config.warps)
    if search:
        _level_bins_kernel[grid](*row_args, *param_args, chunk_max, chunk_arg, bins, chunks,
                                 BLOCK_R=config.rows, BLOCK_V=config.bins_block, C_PAD=config.c_pad, num_warps=config.warps,
                                 **config.search_options)
        _window_counts_kernel[grid](*row_args, *param_args, chunk_max, chunk_arg, bins, search_state, window_counts, chunks,
                                    BLOCK_R=config.rows, BLOCK_V=config.block_v, C_PAD=config.c_pad, num_warps=config.warps)
        tiles = WINDOW_LEVELS // config.cuts_tile
        folded = torch.empty((rows, 2, WINDOW_LEVELS), dtype=torch.int32, device=device)
        tile_sums = torch.empty((rows, 2, tiles), dtype=torch.int64, device=device)
        _window_fold_kernel[(tiles, cdiv(rows, config.rows))](rows, vocab, *param_args, search_state, window_counts, folded, tile_sums, chunks,
                                                              BLOCK_R=config.rows, TILE=config.cuts_tile, C_PAD=config.c_pad,
                                                              num_warps=config.warps)
        _window_cuts_kernel[(cdiv(rows, config.rows),)](rows, vocab, *param_args, search_state, folded, tile_sums, window_cuts,
                                                        BLOCK_R=config.rows, TILE=config.cuts_tile, num_warps=config.warps)
    _kept_kernel[grid](*row_args, *param_args, chunk_max, chunk_arg, window_cuts, window_counts, cuts, kept, chunks,
                       SEARCH=search, BLOCK_R=config.rows, BLOCK_V=config.kept_block, C_PAD=config.c_pad, num_warps=config.warps,
                       **config.search_options)
    return _RowPartials(row_args, param_args, chunk_max, chunk_arg, chunk_sum, cuts, kept)


def _process_slab(logits: torch.Tensor, probs: torch.Tensor, lse: torch.Tensor, rows_per_request: int, params: dict, *, search: bool,
                  want_lse: bool, config: SplitLaunch) -> None:
    """The launches of :func:`process_rows` on the rows of one slab (:func:`slab_rows`)."""
    partials = _row_partials(logits, rows_per_request, params, search=search, want_lse=want_lse, config=config)
    rows = logits.shape[0]
    _probs_kernel[(config.chunks, cdiv(rows, config.rows))](
        *partials.row_args, *partials.step5_args(probs, lse), partials.chunk_arg, partials.chunk_arg, 0, 0, 1,  # no Verdict: int32 placeholders
        BLOCK_R=config.rows, BLOCK_V=config.block_v, C_PAD=config.c_pad, WANT_LSE=want_lse, FINAL_ROWS=False, num_warps=config.warps)


def path_rows_pay(target: KernelTarget, rows: int, vocab: int) -> bool:
    """Whether a sampling walk over ``rows`` is faster on :func:`process_path_rows` than on
    :func:`process_rows`: when step 5 on every row takes more than one wave of programs (more
    chunks than stay resident at once), so that its one row a request finishes sooner. Its two
    extra launches (the candidates, the first walk) cost more than it saves where every row's step
    5 is a single wave (H200, bs 1 N 8 V 151936: 1.05-1.08x the time; bs 8 N 8 V 32000:
    1.03-1.05x), and it gains from two waves on (bs 8 N 8 V 151936 and bs 64 N 4 V 32000:
    0.82-0.83x with temperature alone; bs 64 N 4 V 151936: 0.73x; BENCHMARKS.md, twenty-seventh
    session). Rows past one slab (:func:`slab_rows`) keep process_rows: the path rows have no
    slabs. The interpreter takes it whenever it fits (tests choose either path)."""
    config = split_launch(target, rows, vocab)
    if rows > slab_rows(config, 1, vocab, search=True):
        return False
    if target.vendor == "interpreter":
        return True
    resident = SPLIT_RESIDENT_PER_SM.get(target.vendor, PROGRAMS_PER_SM) * target.multiprocessors
    return cdiv(rows, config.rows) * config.chunks > resident


def process_path_rows(logits: torch.Tensor, candidates: torch.Tensor, walk: Callable[[torch.Tensor], Verdict], *, temperature, top_k,
                      top_p, min_p, want_lse: bool, target: KernelTarget):
    """(probs (R, V) float32, lse (R,) float32 or None, the walk's Verdict): probs and lse as
    :func:`process_rows` gives them, but written only where a sampling walk over (requests, N)
    ``candidates`` (R = requests * N rows, row r of request r // N) reads them: each row's
    probabilities at its request's N candidate tokens, and the whole row of each request's final
    node. ``walk(probs)`` runs the walk on the
    candidate probabilities alone (``verify_sampling(..., walk_only=True)``) and returns its
    Verdict, whose accept_index at num_correct names that node. Every other entry of ``probs`` is
    left unwritten. The statistics of every row (launches 1-5) are the same as process_rows'; step
    5 runs on N candidates a row and on one row a request instead of on all R rows. Rows must
    fit one slab (:func:`path_rows_pay` checks)."""
    rows, vocab = logits.shape
    requests, nodes = candidates.shape
    device = logits.device
    probs = torch.empty((rows, vocab), dtype=torch.float32, device=device)
    lse = torch.empty(rows if want_lse else 1, dtype=torch.float32, device=device)
    if rows == 0:
        return probs, (lse if want_lse else None), walk(probs)
    config = split_launch(target, rows, vocab)
    params = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    partials = _row_partials(logits, nodes, params, search=cuts_possible(top_k, top_p, vocab), want_lse=want_lse, config=config)
    block_r = candidate_rows_per_program(target, nodes)
    _candidate_probs_kernel[(cdiv(rows, block_r),)](
        logits, logits.stride(0), logits.stride(1), rows, vocab, *partials.step5_args(probs, lse), candidates.contiguous(),
        BLOCK_R=block_r, N_PAD=max(next_power_of_2(nodes), 2), C_PAD=config.c_pad, WANT_LSE=want_lse, num_warps=config.warps)
    verdict = walk(probs)
    parts = final_row_parts(target, config, requests)
    _probs_kernel[(config.chunks * parts, cdiv(requests, config.rows))](
        *partials.row_args, *partials.step5_args(probs, lse), verdict.accept_index, verdict.num_correct, verdict.accept_index.shape[1],
        requests, parts, BLOCK_R=config.rows, BLOCK_V=config.block_v, C_PAD=config.c_pad, WANT_LSE=False, FINAL_ROWS=True,
        num_warps=config.warps)
    return probs, (lse if want_lse else None), verdict


# Programs an SM of the final rows' probabilities (process_path_rows), about two waves of the
# probability pass's (4 resident an SM at its 48-64 registers and 256 threads).
FINAL_PROGRAMS_PER_SM = 8


def final_row_parts(target: KernelTarget, config: SplitLaunch, requests: int) -> int:
    """Parts each chunk of the final rows' probability launch is cut into. That launch has one
    row a request, an N-th of the rows whose statistics set the chunks, so its chunks alone left
    most of the GPU idle (bs 64 N 4 V 151936 on 132 SMs: 256 programs of 37 tiles, one wave at
    two an SM); parts of whole tiles give it about FINAL_PROGRAMS_PER_SM programs an SM. The
    interpreter keeps whole chunks (tests/test_sampling_split.py patches this to cut them)."""
    if target.vendor == "interpreter":
        return 1
    tiles = config.chunk_len // config.block_v
    programs = config.chunks * cdiv(requests, config.rows)
    return max(1, min(tiles, cdiv(FINAL_PROGRAMS_PER_SM * target.multiprocessors, programs)))


def candidate_rows_per_program(target: KernelTarget, nodes: int) -> int:
    """Rows of ``_candidate_probs_kernel``'s programs: 256 candidates a program on a GPU (one
    gathered logit a thread of the split launch's 256); the interpreter vectorises them. 512 (two
    a thread) kept an 8 B local frame at 48 registers in the unit-stride N 4 spec on sm_90 with
    Triton 3.6 (offline compile matrix; 256 is clean on all six targets with 3.9 and 3.6)."""
    n_pad = max(next_power_of_2(nodes), 2)
    if target.vendor == "interpreter":
        return max(1, 2**14 // n_pad)
    return max(1, 256 // n_pad)


PROVIDERS: dict = {}  # the ops are kernels/sampling.py's; this module is their row processing


# ----------------------------------------------------------------------------------------------
# offline compilation and launch descriptions

_LOGIT_TYPES = ("fp32", "bf16", "fp16")
# (rows, V): a small batch (many chunks a row), a large one (one chunk a row), an odd tiny one.
_SHAPES = ((4, 32000), (1024, 151936), (6, 10))
_ROW_SIGNATURE = {"stride_row": "i64", "stride_col": "i64", "rows": "i32", "vocab": "i32", "chunk_len": "i32"}
_PARAM_SIGNATURE = {"rows_per_request": "i32", "temperature_ptr": "*fp32", "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32",
                    "temperature_value": "fp32", "top_k_value": "i32", "top_p_value": "fp32", "min_p_value": "fp32", "tensor_params": "i32",
                    "table_ptr": "*i64"}
_PARTIALS = {"max_ptr": "*fp32", "arg_ptr": "*i32"}
_STEP5 = {**_PARTIALS, "sum_ptr": "*fp32", "cuts_ptr": "*i64", "kept_ptr": "*i64", "probs_ptr": "*fp32", "lse_ptr": "*fp32", "chunks": "i32"}


def _kernel_specs(config: SplitLaunch):
    """(kernel, signature without logits_ptr, constexprs, options) of every launch of one config."""
    row = dict(_ROW_SIGNATURE)
    params = dict(_PARAM_SIGNATURE)
    specs = []
    for want_lse in (False, True):
        specs.append((_chunk_max_kernel, {**row, **_PARTIALS, "sum_ptr": "*fp32", "chunks": "i32", "BLOCK_R": "constexpr",
                                          "BLOCK_V": "constexpr", "WANT_LSE": "constexpr"},
                      {"BLOCK_R": config.rows, "BLOCK_V": config.block_v, "WANT_LSE": want_lse}, {}))
        # FINAL_ROWS (process_path_rows) never wants the log-sum-exp
        for final_rows in (False, True) if not want_lse else (False,):
            specs.append((_probs_kernel, {**row, **params, **_STEP5, "accept_ptr": "*i32", "num_correct_ptr": "*i32", "accept_width": "i32",
                                          "requests": "i32", "parts": "i32", "BLOCK_R": "constexpr", "BLOCK_V": "constexpr", "C_PAD": "constexpr",
                                          "WANT_LSE": "constexpr", "FINAL_ROWS": "constexpr"},
                          {"BLOCK_R": config.rows, "BLOCK_V": config.block_v, "C_PAD": config.c_pad, "WANT_LSE": want_lse,
                           "FINAL_ROWS": final_rows}, {}))
    specs.append((_level_bins_kernel, {**row, **params, **_PARTIALS, "bins_ptr": "*i64", "chunks": "i32", "BLOCK_R": "constexpr",
                                       "BLOCK_V": "constexpr", "C_PAD": "constexpr"},
                  {"BLOCK_R": config.rows, "BLOCK_V": config.bins_block, "C_PAD": config.c_pad}, config.search_options))
    specs.append((_window_counts_kernel, {**row, **params, **_PARTIALS, "bins_ptr": "*i64", "search_ptr": "*i64", "counts_ptr": "*i32",
                                          "chunks": "i32", "BLOCK_R": "constexpr", "BLOCK_V": "constexpr", "C_PAD": "constexpr"},
                  {"BLOCK_R": config.rows, "BLOCK_V": config.block_v, "C_PAD": config.c_pad}, {}))
    for search in (False, True):
        specs.append((_kept_kernel, {**row, **params, **_PARTIALS, "window_cuts_ptr": "*i64", "counts_ptr": "*i32", "cuts_ptr": "*i64",
                                     "kept_ptr": "*i64", "chunks": "i32", "SEARCH": "constexpr", "BLOCK_R": "constexpr",
                                     "BLOCK_V": "constexpr", "C_PAD": "constexpr"},
                      {"SEARCH": search, "BLOCK_R": config.rows, "BLOCK_V": config.kept_block, "C_PAD": config.c_pad}, config.search_options))
    return specs


def _candidate_specs(target: KernelTarget, config: SplitLaunch):
    """``_candidate_probs_kernel``'s launches of :func:`process_path_rows` for trees of N 4 and 16."""
    signature = {"stride_row": "i64", "stride_col": "i64", "rows": "i32", "vocab": "i32", **_PARAM_SIGNATURE, **_STEP5, "cand_ptr": "*i64",
                 "BLOCK_R": "constexpr", "N_PAD": "constexpr", "C_PAD": "constexpr", "WANT_LSE": "constexpr"}
    return [(_candidate_probs_kernel, signature, {"BLOCK_R": candidate_rows_per_program(target, nodes), "N_PAD": nodes,
                                                  "C_PAD": config.c_pad, "WANT_LSE": want_lse}, {})
            for nodes in (4, 16) for want_lse in (False, True)]


def compile_specs(target: KernelTarget):
    """Every (kernel, signature, constexprs, num_warps[, attrs]) :func:`process_rows` and
    :func:`process_path_rows` launch: every logit type generically, bf16 also as the JIT
    specialises a contiguous production launch (the window cuts, which read no logits, once each
    way)."""
    specs = []
    for rows, vocab in _SHAPES:
        config = split_launch(target, rows, vocab)
        logit_types = _LOGIT_TYPES if vocab >= 1024 else ("fp32",)
        for kernel, signature, constexprs, options in _kernel_specs(config) + _candidate_specs(target, config):
            for logit_type in logit_types:
                full = {"logits_ptr": f"*{logit_type}", **signature}
                specs.append((kernel, full, constexprs, config.warps, {}, options))
                if logit_type == "bf16":
                    nodes = constexprs.get("N_PAD", 8)  # a tree of N nodes a request (the candidates' launch: N_PAD = N)
                    final = constexprs.get("FINAL_ROWS", False)
                    values = {"stride_row": vocab, "stride_col": 1, "rows": rows, "vocab": vocab, "chunk_len": config.chunk_len,
                              "rows_per_request": nodes, "chunks": config.chunks, "top_k_value": 50, "tensor_params": 15,
                              "accept_width": 6 if final else 0, "requests": max(rows // nodes, 1) if final else 0,
                              "parts": final_row_parts(target, config, max(rows // nodes, 1)) if final else 1}
                    specs.append(runtime_specialized(target, kernel, full, constexprs, config.warps,
                                                     values={name: value for name, value in values.items() if name in full}) + (options,))
        # the window fold and cuts read no logits
        head = {"rows": "i32", "vocab": "i32", **_PARAM_SIGNATURE, "search_ptr": "*i64"}
        fold = ({**head, "counts_ptr": "*i32", "folded_ptr": "*i32", "tile_sums_ptr": "*i64", "chunks": "i32", "BLOCK_R": "constexpr",
                 "TILE": "constexpr", "C_PAD": "constexpr"}, {"BLOCK_R": config.rows, "TILE": config.cuts_tile, "C_PAD": config.c_pad})
        cuts = ({**head, "folded_ptr": "*i32", "tile_sums_ptr": "*i64", "cuts_ptr": "*i64", "BLOCK_R": "constexpr", "TILE": "constexpr"},
                {"BLOCK_R": config.rows, "TILE": config.cuts_tile})
        for kernel, (signature, constexprs) in ((_window_fold_kernel, fold), (_window_cuts_kernel, cuts)):
            specs.append((kernel, signature, constexprs, config.warps, {}, {}))
            values = {"rows": rows, "vocab": vocab, "rows_per_request": 4, "chunks": config.chunks, "top_k_value": 50, "tensor_params": 15}
            specs.append(runtime_specialized(target, kernel, signature, constexprs, config.warps,
                                             values={name: value for name, value in values.items() if name in signature}) + ({},))
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    lines = []
    for rows, vocab in _SHAPES[:2]:
        config = split_launch(target, rows, vocab)
        lines.append(f"process rows={rows} V={vocab}: {config.chunks} chunks/row of {config.chunk_len} ids, {config.rows} rows/program, "
                     f"tiles {config.block_v} (level bins {config.bins_block}), {config.warps} warps")
    return lines
