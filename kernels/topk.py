"""Triton kernels of family ``topk``: ``draft_topk`` in two launches. Semantics: spec_hal/topk.py.

Launch 1 (grid: rows x tiles) reads each logit exactly once and does the same work for every k.
Every program owns one ``BLOCK``-wide tile of one row and writes the tile's max ``m``, its sum
``s = sum exp(x - m)`` and the max of every ``SUB``-wide sub-tile (as an order-preserving int32,
so that a sub-tile holding only masked ids ranks below one holding a real -inf). Splitting every
row into tiles is what keeps a small batch from running one row per program: at bs = 1 and
V = 151,936 a row is 75 programs, not 1.

Launch 2 (grid: rows) finds the row's k best sub-tiles by (max descending, index ascending), reads
those k sub-tiles again (k * SUB ids, not the row) and selects the row's k best elements among
them, with ``M = max m``, ``Z = sum s * exp(m - M)`` (the online-softmax normaliser) and
``p = exp(v - M) / Z``. For k = 1 this is ``1 / Z``, the exact top-1 probability, without
materialising a softmax.

The two launches stay apart: one launch whose last program of each row (an arrival counter)
selects took 1.3-1.7x the time at k >= 4 on the H100, its selection's registers taken by every
tile program, and PDL (the selection launched early, waiting on launch 1) gained nothing
(BENCHMARKS.md, seventeenth session).

From k = 3 (``RANK_FROM_K``) the k best elements are ranked all at once rather than picked one
max-reduction at a time: the candidates are the picked sub-tiles' elements at or above the k-th
picked sub-tile's max; when there are at least k of them they hold the k best, and when there
are at most ``candidate_slots(k)`` they are compacted into a per-row scratch and each one's rank
is the number of candidates above it. Otherwise (ties at that max, masked or missing sub-tiles)
the k serial picks remain. Ids are the same either way; k = 4 takes 0.88-1.01x, k = 8
0.74-0.97x and k = 16 0.60-0.84x of the serial picks' time on the H100 (BENCHMARKS.md,
sixteenth session).

Why the k best sub-tiles hold the k best elements: take an element e outside them, in sub-tile
s'. Each chosen sub-tile p has an element m_p equal to its max, and p ranks above s': either
max(p) > max(s') >= e, or the maxima are equal and p has the lower index, so m_p has the lower
id. Either way m_p ranks above e (value descending, id ascending), and there are k such m_p. With
a mask, a sub-tile of masked ids has a max below -inf, and masked ids rank below every allowed
one, so the argument holds for them too.

Until 2026-11-26 launch 1 ran k selection passes per tile (or, in chunks, k-dependent insertions
into a running list for every tile that beat its floor), so at bs >= 64 on the H100 k = 4 read
the logits at 24-68% of copy bandwidth and k = 8 at 15-50%, where k = 1 reached 39-89%; with the
sub-tiles k = 4 and 8 take 0.35-0.83x of that time (BENCHMARKS.md, thirteenth session).

Ranking is by (value descending, id ascending), encoded in an int64 rank key so that one integer
max-reduction selects the next element: ties go to the lower id, no element is selected twice,
and lanes past the vocabulary hold a key below every real one, so an id is always in [0, V).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from triton import knobs

from spec_hal.device_buffers import int32_parts
from spec_hal.topk import MAX_TOPK

from .launch import SM_REGISTERS, KernelTarget, runtime_specialized, cdiv, next_power_of_2
from .masks import mask_row_base, tile_allowed, tile_words, token_allowed, words_allowed

# Rank key below every real one (masked lanes, empty slots); the lowest real key, -inf with id
# 2**31 - 1, is about -9.19e18.
EMPTY_KEY = tl.constexpr(-9223372036854775807)
# Keys of masked tokens (token_bitmask): -2^63 + (2^31 - 1 - id), below every real key (the lowest
# is about -9.19e18) and above EMPTY_KEY, ordered by id ascending, and decoded by _key_id.
MASKED_KEY_TOP = tl.constexpr(-9223372036854775807 + 2147483646)
LOG2E = tl.constexpr(1.4426950408889634)
# Compiled, NaN logits become -inf through maxnum (``tl.maximum`` without NaN propagation: PTX
# ``max.f32`` and LLVM's maxnum return the other operand), one instruction an id where a compare
# and a select took two. Triton 3.6's interpreter computes ``tl.maximum`` with ``np.maximum``, which
# keeps NaN, so interpreted kernels keep the compare; so do masked launches through a token map,
# where maxnum put an 8 B local frame in bfloat16 statistics specs on sm_80 and sm_100 (offline
# compile matrix, Triton 3.9). Read when the module is imported, as ``triton.jit`` reads the same
# switch when it decides to interpret.
NAN_BY_MAXNUM = tl.constexpr(not knobs.runtime.interpret)


# Orders (``_ordered``) below every real value's (that of -inf is -2139095041): the max of a
# sub-tile whose ids are all masked, and of one wholly past the vocabulary.
MASKED_ORDER = tl.constexpr(-2139095042)
PAST_VOCAB_ORDER = tl.constexpr(-2139095043)


@triton.jit
def _ordered(values):
    """int32 whose signed order is the float32 order of ``values``: negative floats have their
    magnitude bits flipped; -0.0 is first made +0.0 so that it ties with +0.0."""
    values = tl.where(values == 0.0, 0.0, values)
    bits = values.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _unordered(ordered):
    """The float32 an ``_ordered`` int32 was made from."""
    bits = ordered ^ ((ordered >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _rank_keys(order, ids):
    """One int64 per element whose signed order is (``order`` descending, id ascending): ``order``
    (an ``_ordered`` int32) in the high 32 bits, ``2**31 - 1 - id`` in the low ones, so among equal
    values the lower id has the larger key. One max-reduction per selection pass then replaces a
    max over values plus a min over tied ids."""
    return order.to(tl.int64) * 4294967296 + (2147483647 - ids).to(tl.int64)


@triton.jit
def _key_value(key):
    """The float32 value a rank key was made from."""
    return _unordered((key >> 32).to(tl.int32))


@triton.jit
def _key_id(key):
    return 2147483647 - (key & 0xFFFFFFFF).to(tl.int32)


@triton.jit
def _masked_keys(ids):
    return MASKED_KEY_TOP - ids.to(tl.int64)


@triton.jit
def _allowed_ids(cols, in_vocab, base, constrained, first_col, mask_ptr, map_ptr, mask_width, BLOCK: tl.constexpr, HAS_MAP: tl.constexpr,
                 CONTIGUOUS: tl.constexpr):
    """Whether the row's mask (``base``, ``constrained``: masks.mask_row_base) allows each id ``cols``
    (through the token map: HAS_MAP). CONTIGUOUS: ``cols`` is the tile ``first_col + arange(BLOCK)``,
    whose mask words load in one piece."""
    if HAS_MAP:  # the mask is in the target vocabulary
        tokens = tl.load(map_ptr + cols, mask=in_vocab, other=-1)
        allowed = token_allowed(mask_ptr, base, constrained, tokens, in_vocab, mask_width)
    elif CONTIGUOUS:
        allowed = tile_allowed(mask_ptr, base, constrained, first_col, mask_width, BLOCK)
    else:
        allowed = token_allowed(mask_ptr, base, constrained, cols, in_vocab, mask_width)
    return allowed


@triton.jit
def _logit_values(raw, cols, in_vocab, base, constrained, first_col, mask_ptr, map_ptr, mask_width, BLOCK: tl.constexpr,
                  HAS_MASK: tl.constexpr, HAS_MAP: tl.constexpr, CONTIGUOUS: tl.constexpr):
    """(float32 values to rank, allowed) of raw logits at ids ``cols``: NaN ranks as -inf, +inf as
    FLT_MAX, ids past the vocabulary and ids the row's mask (``base``, ``constrained``) does not
    allow are -inf (``_allowed_ids``)."""
    values = raw.to(tl.float32)
    if NAN_BY_MAXNUM and not HAS_MAP:
        values = tl.maximum(values, float("-inf"))  # maxnum: NaN gives the other operand
    else:
        values = tl.where(values != values, float("-inf"), values)
    values = tl.minimum(values, 3.4028234663852886e38)
    values = tl.where(in_vocab, values, float("-inf"))
    allowed = in_vocab
    if HAS_MASK:
        allowed = _allowed_ids(cols, in_vocab, base, constrained, first_col, mask_ptr, map_ptr, mask_width, BLOCK, HAS_MAP, CONTIGUOUS)
        values = tl.where(allowed, values, float("-inf"))
    return values, allowed


@triton.jit
def _masked_sub_orders(values, allowed, in_vocab, BLOCK: tl.constexpr, SUB: tl.constexpr):
    """The ``_ordered`` max of each SUB-wide sub-tile of a masked tile (BLOCK // SUB,), masked ids
    counting as MASKED_ORDER (below a real -inf, as their keys are) and ids past the vocabulary as
    PAST_VOCAB_ORDER."""
    order = tl.where(in_vocab, tl.where(allowed, _ordered(values), MASKED_ORDER), PAST_VOCAB_ORDER)
    return tl.max(tl.reshape(order, [BLOCK // SUB, SUB]), axis=1)


@triton.jit
def _picked_allowed(mask_ptr, base, constrained, picked, mask_width, K_PAD: tl.constexpr, SUB: tl.constexpr):
    """(K_PAD, SUB) flags: whether the row's mask allows each id of the picked sub-tiles (``picked``:
    sub-tile indices, -1 for none: all allowed, the caller's ``in_vocab`` drops them), from each
    sub-tile's SUB // 32 words in one contiguous load (masks.tile_words at a start per sub-tile; a
    word load per id kept a local frame at k = 16 on sm_90)."""
    # The row's scalars broadcast as (K_PAD,) first: the interpreter rejects a load mask made from
    # a 0-d bool; compiled, it folds away.
    lanes_zero = tl.zeros([K_PAD], dtype=tl.int32)
    constrained = ((lanes_zero + constrained.to(tl.int32)) != 0) & (picked >= 0)
    # Each start clamped at 0 (a picked -1 loads nothing): with the start's sign unknown, its
    # `// 32` put an 8 B local frame in two k = 16 specs on sm_90 and sm_100 (Triton 3.9).
    words = tile_words(mask_ptr, lanes_zero.to(tl.int64) + base, constrained, (tl.maximum(picked, 0) * SUB)[:, None], mask_width, SUB)
    return words_allowed(words, SUB)


@triton.jit
def _picked_values(raw, cols, in_vocab, picked, base, constrained, mask_ptr, map_ptr, mask_width, K_PAD: tl.constexpr, SUB: tl.constexpr,
                   HAS_MASK: tl.constexpr, HAS_MAP: tl.constexpr):
    """``_logit_values`` of the selection's picked sub-tiles (``cols``: (K_PAD, SUB)); without a token
    map each picked sub-tile's mask words load in one piece (``_picked_allowed``)."""
    if HAS_MASK and not HAS_MAP and SUB >= 32:
        values, allowed = _logit_values(raw, cols, in_vocab, base, constrained, 0, mask_ptr, map_ptr, mask_width, SUB, False, HAS_MAP,
                                        False)
        allowed = in_vocab & _picked_allowed(mask_ptr, base, constrained, picked, mask_width, K_PAD, SUB)
        values = tl.where(allowed, values, float("-inf"))
    else:
        values, allowed = _logit_values(raw, cols, in_vocab, base, constrained, 0, mask_ptr, map_ptr, mask_width, SUB, HAS_MASK,
                                        HAS_MAP, False)
    return values, allowed


@triton.jit
def _tile_stats(raw, tile, in_vocab, sub_order_row, base, constrained, mask_ptr, map_ptr, mask_width, BLOCK: tl.constexpr,
                SUB: tl.constexpr, HAS_MASK: tl.constexpr, HAS_MAP: tl.constexpr, WHOLE: tl.constexpr):
    """Stores the sub-tile maxima of one tile of raw logits and returns the tile's max ``m`` and
    ``sum exp(x - m)`` (0 for a tile without a finite max). ``in_vocab``: which of the tile's ids
    are in the vocabulary (WHOLE: all of them, a constant whose selects then fold away)."""
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    values, allowed = _logit_values(raw, cols, in_vocab, base, constrained, tile * BLOCK, mask_ptr, map_ptr, mask_width, BLOCK,
                                    HAS_MASK, HAS_MAP, True)
    # Without a mask, ids past the vocabulary count as -inf, which ranks a sub-tile holding them by
    # its index, as the selection needs.
    sub_maxima = tl.max(tl.reshape(values, [BLOCK // SUB, SUB]), axis=1)
    sub_orders = _ordered(sub_maxima)
    if HAS_MASK:
        if WHOLE and not HAS_MAP:
            # Masked ids are -inf in ``values``, so a sub-tile with a finite max has an allowed id of
            # that value, and its order is that max's, as without a mask. Only a tile with a
            # sub-tile of no finite allowed value orders each id (four integer operations and an
            # integer max an id, 1.28x the unmasked pass's instructions on the H200, thirty-eighth
            # session), with the mask's words loaded again: kept from above, its flags took
            # registers from every tile.
            if tl.min(sub_maxima, axis=0) == float("-inf"):
                allowed = _allowed_ids(cols, in_vocab, base, constrained, tile * BLOCK, mask_ptr, map_ptr, mask_width, BLOCK, HAS_MAP,
                                       True)
                sub_orders = _masked_sub_orders(values, allowed, in_vocab, BLOCK, SUB)
        elif not HAS_MAP:
            # A row's last tile: its sub-tiles wholly past the vocabulary take PAST_VOCAB_ORDER, and
            # only an in-vocabulary sub-tile without a finite allowed value orders each id, as above.
            sub_in_vocab = tl.max(tl.reshape(in_vocab.to(tl.int32), [BLOCK // SUB, SUB]), axis=1) != 0
            sub_orders = tl.where(sub_in_vocab, sub_orders, PAST_VOCAB_ORDER)
            if tl.min(tl.where(sub_in_vocab, sub_maxima, 0.0), axis=0) == float("-inf"):
                allowed = _allowed_ids(cols, in_vocab, base, constrained, tile * BLOCK, mask_ptr, map_ptr, mask_width, BLOCK, HAS_MAP,
                                       True)
                sub_orders = _masked_sub_orders(values, allowed, in_vocab, BLOCK, SUB)
        else:
            # Any tile through a token map (with the branch above a frame on sm_100, Triton 3.9).
            sub_orders = _masked_sub_orders(values, allowed, in_vocab, BLOCK, SUB)
    tile_max = tl.max(sub_maxima, axis=0)
    tl.store(sub_order_row + tile * (BLOCK // SUB) + tl.arange(0, BLOCK // SUB), sub_orders)
    safe_max = tl.where(tile_max == float("-inf"), 0.0, tile_max)
    # exp as exp2 of the log2e-scaled difference: tl.exp's denormal-safe ex2 costs two multiplies
    # and a compare an id more on sm_90 (this pass is bound by its instructions). The one result it
    # changes there, an exponential below 2^-126 now 0, is under an ulp of a sum holding the max's 1.
    return tile_max, tl.sum(tl.where(in_vocab, tl.exp2((values - safe_max) * LOG2E), 0.0), axis=0)


@triton.jit
def _row_tile_stats(raw, tile, in_vocab, sub_order_row, base, constrained, mask_ptr, map_ptr, mask_width, BLOCK: tl.constexpr,
                    SUB: tl.constexpr, HAS_MASK: tl.constexpr, HAS_MAP: tl.constexpr, WHOLE: tl.constexpr, ROW_BRANCH: tl.constexpr):
    """``_tile_stats`` of one row's tile. ROW_BRANCH: a row the mask leaves unconstrained (an index
    of -1) takes the unmasked statistics, without its mask's words or tests (one row a program:
    the branch is uniform). Every id of such a row is allowed, so its maxima, sums and sub-tile
    orders are the masked pass's, but for a last tile's sub-tiles wholly past the vocabulary,
    ranked by their index at -inf rather than below every masked id: their ids are never output
    either way (``launch_config`` says which launches take the branch)."""
    if HAS_MASK and ROW_BRANCH:
        if constrained:
            tile_max, tile_sum = _tile_stats(raw, tile, in_vocab, sub_order_row, base, constrained, mask_ptr, map_ptr, mask_width, BLOCK,
                                             SUB, True, HAS_MAP, WHOLE)
        else:
            tile_max, tile_sum = _tile_stats(raw, tile, in_vocab, sub_order_row, base, constrained, mask_ptr, map_ptr, mask_width, BLOCK,
                                             SUB, False, False, WHOLE)
    else:
        tile_max, tile_sum = _tile_stats(raw, tile, in_vocab, sub_order_row, base, constrained, mask_ptr, map_ptr, mask_width, BLOCK,
                                         SUB, HAS_MASK, HAS_MAP, WHOLE)
    return tile_max, tile_sum


@triton.jit
def _tile_stats_kernel(
    logits_ptr,
    stride_row,
    stride_col,
    vocab,
    tile_max_ptr,
    tile_sum_ptr,
    sub_order_ptr,
    num_tiles,
    subs_per_row,
    mask_ptr,
    index_ptr,
    map_ptr,
    num_masks,
    mask_width,
    BLOCK: tl.constexpr,
    SUB: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    HAS_MAP: tl.constexpr,
    ROW_BRANCH: tl.constexpr,
):
    row = tl.program_id(0)
    tile = tl.program_id(1)
    # The row's mask row first: its index load is then in flight with the logits' (issued after
    # them, a row with an index waited on two loads one after the other).
    base, constrained = mask_row_base(index_ptr, row, True, num_masks, mask_width, HAS_INDEX)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    sub_order_row = sub_order_ptr + row.to(tl.int64) * subs_per_row
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    if (tile + 1) * BLOCK <= vocab:  # a whole tile (every one but a row's last): no bound tests
        raw = tl.load(row_ptr + cols.to(tl.int64) * stride_col)
        tile_max, tile_sum = _row_tile_stats(raw, tile, tl.full([BLOCK], 1, tl.int1), sub_order_row, base, constrained, mask_ptr,
                                             map_ptr, mask_width, BLOCK, SUB, HAS_MASK, HAS_MAP, True, ROW_BRANCH)
    else:
        raw = tl.load(row_ptr + cols.to(tl.int64) * stride_col, mask=cols < vocab, other=0.0)
        tile_max, tile_sum = _row_tile_stats(raw, tile, cols < vocab, sub_order_row, base, constrained, mask_ptr, map_ptr, mask_width,
                                             BLOCK, SUB, HAS_MASK, HAS_MAP, False, ROW_BRANCH)
    # Stored as their bits: all of the scratch is one int32 allocation (spec_hal.device_buffers.carve).
    slot = row.to(tl.int64) * num_tiles + tile
    tl.store(tile_max_ptr + slot, tile_max.to(tl.int32, bitcast=True))
    tl.store(tile_sum_ptr + slot, tile_sum.to(tl.int32, bitcast=True))


@triton.jit
def _key_probability(key, row_finite, safe_row_max, normaliser):
    """The softmax probability of a rank key's value (0 for a masked key, or in a row without a
    finite max). Two selects: the interpreter rejects a 0-d bool ANDed with a vector."""
    probability = tl.where(key > MASKED_KEY_TOP, tl.exp(_key_value(key) - safe_row_max) / normaliser, 0.0)
    return tl.where(row_finite, probability, 0.0)


@triton.jit
def _output_ids(key, token_map_ptr, HAS_TOKEN_MAP: tl.constexpr):
    out_id = _key_id(key).to(tl.int64)
    if HAS_TOKEN_MAP:
        out_id = tl.load(token_map_ptr + out_id).to(tl.int64)
    return out_id


@triton.jit
def _store_picked(keys, probs_ptr, ids_ptr, token_map_ptr, row64, row_finite, safe_row_max, normaliser, K: tl.constexpr,
                  HAS_TOKEN_MAP: tl.constexpr):
    """The K best of ``keys`` (rank keys, unique), one max-reduction each, stored in rank order."""
    for j in tl.static_range(K):
        best = tl.max(tl.max(keys, axis=1), axis=0)
        keys = tl.where(keys == best, EMPTY_KEY, keys)
        tl.store(probs_ptr + row64 * K + j, _key_probability(best, row_finite, safe_row_max, normaliser))
        tl.store(ids_ptr + row64 * K + j, _output_ids(best, token_map_ptr, HAS_TOKEN_MAP))


@triton.jit
def _store_ranked_candidates(keys, candidate, per_sub, count, lanes, rank_row_ptr, probs_ptr, ids_ptr, token_map_ptr, row64, row_finite,
                             safe_row_max, normaliser, K: tl.constexpr, C_PAD: tl.constexpr, HAS_TOKEN_MAP: tl.constexpr):
    """The K best of the ``count`` (K..C_PAD) ``candidate`` keys, stored in rank order: the
    candidates are compacted into the row's C_PAD scratch slots (rank_row_ptr), then each one's rank
    is the number of candidates above it, all at once (no serial picks)."""
    # Exclusive prefix of the per-sub-tile counts as a (K_PAD, K_PAD) sum: a cumsum over a few
    # lanes does not lower on every Triton.
    before = tl.sum(tl.where(lanes[None, :] < lanes[:, None], per_sub[None, :], 0), axis=1)
    position = before[:, None] + tl.cumsum(candidate.to(tl.int32), axis=1) - 1
    tl.store(rank_row_ptr + position, keys, mask=candidate)
    tl.debug_barrier()  # every thread's candidates are stored before any is read back
    slots = tl.arange(0, C_PAD)
    compact = tl.load(rank_row_ptr + slots, mask=slots < count, other=EMPTY_KEY)
    rank = tl.sum((compact[None, :] > compact[:, None]).to(tl.int32), axis=1)
    ranked = (slots < count) & (rank < K)
    out = row64 * K + rank
    tl.store(probs_ptr + out, _key_probability(compact, row_finite, safe_row_max, normaliser), mask=ranked)
    if HAS_TOKEN_MAP:
        out_ids = tl.load(token_map_ptr + _key_id(compact), mask=ranked, other=0).to(tl.int64)
    else:
        out_ids = _key_id(compact).to(tl.int64)
    tl.store(ids_ptr + out, out_ids, mask=ranked)


@triton.jit
def _select_kernel(
    logits_ptr,
    stride_row,
    stride_col,
    vocab,
    tile_max_ptr,
    tile_sum_ptr,
    sub_order_ptr,
    num_tiles,
    subs_per_row,
    mask_ptr,
    index_ptr,
    map_ptr,
    num_masks,
    mask_width,
    token_map_ptr,
    probs_ptr,
    ids_ptr,
    rank_ptr,
    K: tl.constexpr,
    K_PAD: tl.constexpr,
    C_PAD: tl.constexpr,
    SUB: tl.constexpr,
    TILES_PAD: tl.constexpr,
    SUBS_PAD: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    HAS_MAP: tl.constexpr,
    HAS_TOKEN_MAP: tl.constexpr,
    ROW_BRANCH: tl.constexpr,
):
    row = tl.program_id(0)
    row64 = row.to(tl.int64)
    base, constrained = mask_row_base(index_ptr, row, True, num_masks, mask_width, HAS_INDEX)
    tiles = tl.arange(0, TILES_PAD)
    tile_ok = tiles < num_tiles
    tile_max = tl.load(tile_max_ptr + row64 * num_tiles + tiles, mask=tile_ok, other=-8388608).to(tl.float32, bitcast=True)  # -inf
    tile_sum = tl.load(tile_sum_ptr + row64 * num_tiles + tiles, mask=tile_ok, other=0).to(tl.float32, bitcast=True)
    row_max = tl.max(tile_max, axis=0)
    row_finite = row_max > float("-inf")
    safe_row_max = tl.where(row_finite, row_max, 0.0)
    scale = tl.where(tile_max > float("-inf"), tl.exp(tile_max - safe_row_max), 0.0)
    # An all -inf row has no normaliser; 1.0 keeps the (discarded) division finite.
    normaliser = tl.where(row_finite, tl.sum(tile_sum * scale, axis=0), 1.0)

    # The row's K best sub-tiles by (max descending, index ascending); lanes past the row's
    # sub-tiles stay -1 (a row of fewer than K sub-tiles still holds K ids, all in those it has).
    subs = tl.arange(0, SUBS_PAD)
    sub_ok = subs < subs_per_row
    sub_orders = tl.load(sub_order_ptr + row64 * subs_per_row + subs, mask=sub_ok, other=0)
    sub_keys = tl.where(sub_ok, _rank_keys(sub_orders, subs), EMPTY_KEY)
    lanes = tl.arange(0, K_PAD)
    picked = tl.full([K_PAD], -1, dtype=tl.int32)
    last_top = tl.full([], EMPTY_KEY, tl.int64)
    for j in tl.static_range(K):
        top = tl.max(sub_keys, axis=0)
        picked = tl.where((lanes == j) & (top > EMPTY_KEY), _key_id(top), picked)
        sub_keys = tl.where(sub_keys == top, EMPTY_KEY, sub_keys)
        last_top = top

    # The K best ids among those sub-tiles' K * SUB ids, read again (K * SUB logits, not the row).
    cols = picked[:, None] * SUB + tl.arange(0, SUB)[None, :]
    in_vocab = (picked[:, None] >= 0) & (cols < vocab)
    raw = tl.load(logits_ptr + row64 * stride_row + cols.to(tl.int64) * stride_col, mask=in_vocab, other=0.0)
    if HAS_MASK and ROW_BRANCH:
        if constrained:
            values, allowed = _picked_values(raw, cols, in_vocab, picked, base, constrained, mask_ptr, map_ptr, mask_width, K_PAD, SUB,
                                             True, HAS_MAP)
        else:  # as in _row_tile_stats: every id allowed
            values, allowed = _picked_values(raw, cols, in_vocab, picked, base, constrained, mask_ptr, map_ptr, mask_width, K_PAD, SUB,
                                             False, False)
    else:
        values, allowed = _picked_values(raw, cols, in_vocab, picked, base, constrained, mask_ptr, map_ptr, mask_width, K_PAD, SUB,
                                         HAS_MASK, HAS_MAP)
    keys = tl.where(in_vocab, _rank_keys(_ordered(values), cols), EMPTY_KEY)
    if HAS_MASK:
        keys = tl.where(in_vocab & (allowed == 0), _masked_keys(cols), keys)
    if C_PAD > 0:  # k >= RANK_FROM_K
        # The candidates: the picked sub-tiles' elements whose value is at least the K-th picked
        # sub-tile's max (keys from the lowest one of that value). If there are at least K of
        # them, they hold the row's K best: any element ranked among the K best lies in a picked
        # sub-tile (module docstring), and one below the floor has K candidates above it. Few
        # enough (C_PAD) are ranked all at once; otherwise (ties at the floor, masked picks) the
        # K serial picks below.
        floor = (last_top >> 32) << 32
        candidate = (keys >= floor) & (keys > EMPTY_KEY)
        per_sub = tl.sum(candidate.to(tl.int32), axis=1)
        count = tl.sum(per_sub, axis=0)
        if (count >= K) & (count <= C_PAD):
            _store_ranked_candidates(keys, candidate, per_sub, count, lanes, rank_ptr + row64 * C_PAD, probs_ptr, ids_ptr, token_map_ptr,
                                     row64, row_finite, safe_row_max, normaliser, K, C_PAD, HAS_TOKEN_MAP)
        else:
            _store_picked(keys, probs_ptr, ids_ptr, token_map_ptr, row64, row_finite, safe_row_max, normaliser, K, HAS_TOKEN_MAP)
    else:
        _store_picked(keys, probs_ptr, ids_ptr, token_map_ptr, row64, row_finite, safe_row_max, normaliser, K, HAS_TOKEN_MAP)


@dataclass(frozen=True)
class TopkLaunch:
    block: int
    tile_warps: int
    sub: int = 256  # sub-tile width (the selection reads k of them again); at most ``block``
    row_branch: bool = False  # a masked launch's unconstrained rows skip the mask (_row_tile_stats)

    def tiles(self, vocab: int) -> int:
        return cdiv(vocab, self.block)

    def subs_per_row(self, vocab: int) -> int:
        return self.tiles(vocab) * (self.block // self.sub)


MASKED_BLOCK = 2048  # widest tile of a masked launch but those of 2- and 4-byte logits without a token map on NVIDIA
# Sub-tiles of SUB_WIDTH ids (fewer in a narrower tile). The selection ranks a row's sub-tile
# maxima in one tensor of at most MAX_SUBS (compiled clean on all six targets at that size), so
# rows over 524,288 ids (no known draft vocabulary) take the reference instead.
SUB_WIDTH = 256
MAX_SUBS = 2048


def _padded(count: int) -> int:
    """Power-of-two extent (at least 2) for a tl.arange over ``count`` items."""
    return max(next_power_of_2(count), 2)


@functools.lru_cache(maxsize=1024)  # a pure function of (target, ints): computed once per shape
def launch_config(target: KernelTarget, rows: int, vocab: int, masked: bool = False, element_size: int = 4,
                  mapped: bool = False) -> TopkLaunch:
    """Tile width, warps and sub-tile width per target; the same for every k. Every program
    reads one tile of one row.

    Small batches use 2048-id tiles so that a row spreads over more programs (more SMs busy),
    others 4096. AMD runs wave64, so the same 256 threads per program are 4 warps instead of 8.
    The interpreter runs one Python loop per program, so it takes the widest tile, one per row,
    and sub-tiles of 256 ids at most. A masked launch has tiles of at most MASKED_BLOCK (the mask
    and map loads spill at 16 elements per thread on sm_90), but for 2- and 4-byte logits without
    a token map (``mapped``) on NVIDIA, below.

    Until 2026-11-27 large batches of long rows (from about 132 rows at V 151,936 on the H100)
    gave each program a chunk of 32 or more 2048-id tiles, read one ahead. One 4096-id tile a
    program took 0.79-0.99x of that time at 160-2048 rows with V >= 128256 and the same time at
    4096 rows (H100; BENCHMARKS.md, seventeenth session), so the chunks are gone.

    On NVIDIA, 2-byte logits (``element_size``) and masked launches take 128 threads a tile (twice
    the ids a thread): measured on the H200 at bs 64-512, bfloat16 took 0.88-0.93x and masked
    float32 0.85x of its time at 256 threads; unmasked float32 gained 1-7% at V >= 128256 but lost
    up to 17% at V 32000-32001 (bs 64), so it keeps 256 (BENCHMARKS.md, thirtieth session). A
    masked float32 launch without a token map there takes the unmasked tile (4096 ids from 2 rows
    of tiles per SM), 32 ids a thread: 0.89-0.99x of its time at 2048 ids with V 151936, about
    the same (0.98-1.04x) with V 32000; bfloat16 then took 0.91-1.08x and kept 2048 (H200, 64-2048
    rows; float64 and AMD not measured; BENCHMARKS.md, thirty-ninth session). With the row branch
    below, masked bfloat16 at 4096 ids took 0.90-0.95x of its time at 2048 with every row masked
    and 0.87-0.97x with half (H200, 256-2048 rows, V 32000 and 151936; 256 threads were slower at
    either width: BENCHMARKS.md, forty-third session), so 2-byte logits take 4096 too; float64
    keeps 2048.

    ``row_branch`` (masked 2-byte logits): a row the mask leaves unconstrained skips the mask's
    words and tests in both kernels (``_row_tile_stats``). With it and 4096-id tiles, masked
    bfloat16 took 0.93-0.99x of the former launch's time (2048 ids, no branch) with every row
    masked and 0.74-0.93x with half the rows (H200, forty-third session; without the branch the
    4096-id tile alone gained nothing with every row masked). Float32 with the branch: half the
    rows 0.94-1.00x, but every row 1.01-1.09x (the unconstrained path's code beside the masked
    one), so float32 does without.
    """
    row_branch = masked and element_size == 2
    if target.vendor == "interpreter":
        block = min(max(next_power_of_2(vocab), 16), 65536)
        return TopkLaunch(block=block, tile_warps=1, sub=min(block, SUB_WIDTH), row_branch=row_branch)
    block = 2048 if rows * cdiv(vocab, 4096) < 2 * target.multiprocessors else 4096
    block = min(block, max(next_power_of_2(vocab), 128))
    if masked and (mapped or target.vendor != "nvidia" or element_size > 4):
        block = min(block, MASKED_BLOCK)
    threads = 128 if target.vendor == "nvidia" and (masked or element_size < 4) else 256
    return TopkLaunch(block=block, tile_warps=target.warps(threads), sub=min(block, SUB_WIDTH), row_branch=row_branch)


# From k = RANK_FROM_K the selection ranks its candidates all at once when there are at most
# candidate_slots(k) of them (_store_ranked_candidates) instead of k serial picks. k = 2 keeps its
# two picks (not measured against ranking; k = 4 gained 0-12% on the H100).
RANK_FROM_K = 3


def candidate_slots(k: int) -> int:
    """C_PAD: how many candidates the selection ranks at once (0 below RANK_FROM_K: no scratch)."""
    return max(32, 4 * _padded(k)) if k >= RANK_FROM_K else 0


# From NARROW_SELECT_ROWS_PER_SM rows per SM, NVIDIA selections up to k = NARROW_SELECT_MAX_K take
# 128 threads.
NARROW_SELECT_ROWS_PER_SM = 2
NARROW_SELECT_MAX_K = 8


def select_warps(target: KernelTarget, k: int, sub: int, rows: int) -> int:
    """Warps of ``_select_kernel``: about 8 of the picked sub-tiles' ids a thread (128 to 512
    threads). With 32 a thread (128 threads, k = 16) the masked selection spilled 81-135
    registers on gfx942. Ampere and Ada (sm_8x) take 256 threads above k = 8: at 512, ptxas kept
    an 8 B frame at 40 registers in the selection with a mask through a token map on sm_80, and at
    1024 three; at 256, with ``select_options``' register cap, every k = 16 spec of sm_80 compiles
    clean (offline compile matrix, Triton 3.9; not timed: no Ampere GPU here).

    On NVIDIA, a launch of at least NARROW_SELECT_ROWS_PER_SM rows per SM and k up to
    NARROW_SELECT_MAX_K takes 128 threads: with that many rows, more programs resident per SM beat
    wider ones (H100, 512-4096 rows: k = 8 0.90-0.98x of the time at 256 threads; at 64-128 rows
    128 threads were up to 3% slower; BENCHMARKS.md, seventeenth session). k = 16 ran in
    0.66-0.87x there too, but at 128 threads it kept 24-272 B local frames under its 168-register
    cap on sm_80 and sm_90 (offline compile matrix), so it keeps 512. AMD keeps the wider launch
    (not measured; spills above)."""
    if target.vendor == "interpreter":
        return 1
    if target.vendor == "nvidia" and k <= NARROW_SELECT_MAX_K and rows >= NARROW_SELECT_ROWS_PER_SM * target.multiprocessors:
        return target.warps(128)
    if k > 8 and target.ampere_or_ada:
        return target.warps(256)
    return target.warps(min(512, max(128, _padded(k) * sub // 8)))


# NVIDIA selections that rank their candidates (k >= RANK_FROM_K) take an explicit register cap:
# left to itself ptxas stopped at 64 registers with an 8 B frame in masked bfloat16 specs (sm_80 at
# k = 8 and 256 threads with Triton 3.9; sm_90 at k = 16 and 512 threads with Triton 3.6) and at
# 128 in masked k = 16 specs of sm_80. SELECT_MAXNREG, or what one program of the launch's threads
# may take, compiles them frame-free (offline compile matrix).
SELECT_MAXNREG = 168


def select_options(target: KernelTarget, k: int, warps: int) -> dict:
    """Compile options of ``_select_kernel`` launched with ``warps``: the register cap on NVIDIA
    from RANK_FROM_K, else none."""
    if target.vendor != "nvidia" or k < RANK_FROM_K:
        return {}
    return {"maxnreg": min(SELECT_MAXNREG, SM_REGISTERS // (warps * target.warp_size))}


def draft_topk(
    logits: torch.Tensor,
    k: int,
    *,
    token_map: Optional[torch.Tensor] = None,
    token_bitmask: Optional[torch.Tensor] = None,
    bitmask_index: Optional[torch.Tensor] = None,
    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    target: KernelTarget,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton provider of ``draft_topk`` (arguments validated by the caller; see spec_hal.topk).
    Rows of more than MAX_SUBS sub-tiles (over 524,288 ids) take the reference."""
    rows, vocab = logits.shape
    device = logits.device
    has_mask = token_bitmask is not None
    config = launch_config(target, rows, vocab, has_mask, logits.element_size(), has_mask and token_map is not None)
    subs_per_row = config.subs_per_row(vocab)
    if subs_per_row > MAX_SUBS:
        from spec_hal.topk import draft_topk as reference
        return reference(logits, k, token_map=token_map, token_bitmask=token_bitmask, bitmask_index=bitmask_index, out=out)
    if out is None:
        out = (torch.empty((rows, k), dtype=torch.float32, device=device), torch.empty((rows, k), dtype=torch.int64, device=device))
    if rows == 0:
        return out[0], out[1]
    num_tiles = config.tiles(vocab)
    if token_map is not None:
        token_map = token_map.contiguous()  # indexed with unit stride (a no-op for the usual map)
    # Scratch from torch's caching allocator (no device malloc per call, capture-safe), one piece.
    tile_max, tile_sum, sub_orders, rank_slots = int32_parts(
        (rows * num_tiles, rows * num_tiles, rows * subs_per_row, rows * 2 * candidate_slots(k)), device)
    mask = token_bitmask.contiguous() if has_mask else tile_max  # placeholders, never read
    index = bitmask_index.contiguous() if bitmask_index is not None else mask  # read with unit stride
    mask_map = token_map if has_mask and token_map is not None else mask
    num_masks, mask_width = (mask.shape[0], mask.shape[1]) if has_mask else (0, 0)
    flags = dict(HAS_MASK=has_mask, HAS_INDEX=bitmask_index is not None, HAS_MAP=has_mask and token_map is not None)
    _tile_stats_kernel[(rows, num_tiles)](
        logits, logits.stride(0), logits.stride(1), vocab, tile_max, tile_sum, sub_orders, num_tiles, subs_per_row,
        mask, index, mask_map, num_masks, mask_width, BLOCK=config.block, SUB=config.sub, **flags, ROW_BRANCH=config.row_branch,
        num_warps=config.tile_warps,
    )
    warps = select_warps(target, k, config.sub, rows)
    _select_kernel[(rows,)](
        logits, logits.stride(0), logits.stride(1), vocab, tile_max, tile_sum, sub_orders, num_tiles, subs_per_row,
        mask, index, mask_map, num_masks, mask_width,
        token_map if token_map is not None else tile_max,  # placeholder pointer, never read
        out[0], out[1], rank_slots.view(torch.int64) if k >= RANK_FROM_K else tile_max,  # placeholder below RANK_FROM_K
        K=k, K_PAD=_padded(k), C_PAD=candidate_slots(k), SUB=config.sub, TILES_PAD=_padded(num_tiles), SUBS_PAD=_padded(subs_per_row), **flags,
        HAS_TOKEN_MAP=token_map is not None, ROW_BRANCH=config.row_branch, num_warps=warps, **select_options(target, k, warps),
    )
    return out[0], out[1]


PROVIDERS = {"draft_topk": (draft_topk, "kernels/topk.py: tile statistics and sub-tile maxima, then the k best sub-tiles read again, 2 launches")}

_LOGIT_TYPES = ("fp32", "bf16", "fp16", "fp64")
_ELEMENT_SIZES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8}


# (HAS_MASK, HAS_INDEX, HAS_MAP, index pointer type, map pointer type) of the launches. Without a
# mask the placeholders are the int32 scratch.
_MASKINGS = ((False, False, False, "*i32", "*i32"), (True, False, False, "*i32", "*i32"), (True, True, False, "*i32", "*i32"),
             (True, True, True, "*i64", "*i64"), (True, True, True, "*i32", "*i32"))


def _mask_signature(has_mask, has_index, has_map, index_type, map_type) -> dict:
    return {"mask_ptr": "*i32", "index_ptr": index_type if has_index else "*i32", "map_ptr": map_type if has_map else "*i32",
            "num_masks": "i32", "mask_width": "i32"}


def _stats_spec(target: KernelTarget, logit_type: str, config: TopkLaunch, vocab: int, masking, specialized: bool):
    has_mask, has_index, has_map = masking[:3]
    signature = {"logits_ptr": f"*{logit_type}", "stride_row": "i64", "stride_col": "i64", "vocab": "i32",
                 "tile_max_ptr": "*i32", "tile_sum_ptr": "*i32", "sub_order_ptr": "*i32", "num_tiles": "i32",
                 "subs_per_row": "i32", **_mask_signature(*masking),
                 "BLOCK": "constexpr", "SUB": "constexpr", "HAS_MASK": "constexpr", "HAS_INDEX": "constexpr",
                 "HAS_MAP": "constexpr", "ROW_BRANCH": "constexpr"}
    constexprs = {"BLOCK": config.block, "SUB": config.sub, "HAS_MASK": has_mask, "HAS_INDEX": has_index,
                  "HAS_MAP": has_map, "ROW_BRANCH": config.row_branch}
    if not specialized:
        return (_tile_stats_kernel, signature, constexprs, config.tile_warps)
    return runtime_specialized(target, _tile_stats_kernel, signature, constexprs, config.tile_warps, values={
        "stride_row": vocab, "stride_col": 1, "vocab": vocab, "num_tiles": config.tiles(vocab),
        "subs_per_row": config.subs_per_row(vocab), "num_masks": 64 if has_mask else 0, "mask_width": cdiv(vocab, 32) if has_mask else 0})


def _select_spec(target: KernelTarget, logit_type: str, k: int, rows: int, config: TopkLaunch, vocab: int, masking, token_map_type,
                 specialized: bool):
    has_mask, has_index, has_map = masking[:3]
    signature = {"logits_ptr": f"*{logit_type}", "stride_row": "i64", "stride_col": "i64", "vocab": "i32",
                 "tile_max_ptr": "*i32", "tile_sum_ptr": "*i32", "sub_order_ptr": "*i32", "num_tiles": "i32", "subs_per_row": "i32",
                 **_mask_signature(*masking), "token_map_ptr": token_map_type or "*i32", "probs_ptr": "*fp32", "ids_ptr": "*i64",
                 "rank_ptr": "*i64" if k >= RANK_FROM_K else "*i32",
                 "K": "constexpr", "K_PAD": "constexpr", "C_PAD": "constexpr", "SUB": "constexpr", "TILES_PAD": "constexpr", "SUBS_PAD": "constexpr",
                 "HAS_MASK": "constexpr", "HAS_INDEX": "constexpr", "HAS_MAP": "constexpr", "HAS_TOKEN_MAP": "constexpr",
                 "ROW_BRANCH": "constexpr"}
    constexprs = {"K": k, "K_PAD": _padded(k), "C_PAD": candidate_slots(k), "SUB": config.sub, "TILES_PAD": _padded(config.tiles(vocab)),
                  "SUBS_PAD": _padded(config.subs_per_row(vocab)), "HAS_MASK": has_mask, "HAS_INDEX": has_index, "HAS_MAP": has_map,
                  "HAS_TOKEN_MAP": token_map_type is not None, "ROW_BRANCH": config.row_branch}
    warps = select_warps(target, k, config.sub, rows)
    options = select_options(target, k, warps)
    if not specialized:
        return (_select_kernel, signature, constexprs, warps, {}, options)
    return runtime_specialized(target, _select_kernel, signature, constexprs, warps, values={
        "stride_row": vocab, "stride_col": 1, "vocab": vocab, "num_tiles": config.tiles(vocab), "subs_per_row": config.subs_per_row(vocab),
        "num_masks": 64 if has_mask else 0, "mask_width": cdiv(vocab, 32) if has_mask else 0}) + (options,)


def compile_specs(target: KernelTarget):
    """Every distinct (kernel, signature, constexprs, num_warps[, attrs]) the host function launches
    on ``target``: each launch config (2048- and 4096-id tiles, masked, a short row), each
    masking and token map, each generic (misaligned pointers) and as Triton specialises it at run
    time for contiguous logits (``launch.runtime_specialized``: the unit column stride is a
    constexpr). The statistics kernel is the same for every k; the selection kernel is compiled
    for the smallest and largest k (k sets its unrolled passes and the picked sub-tiles' width,
    so these bound register use), with every logits dtype at the production shape, and there
    also at k = 8 for float32 and bfloat16: the ranked path at 32 candidate slots and 256 threads,
    where a masked bfloat16 spec kept a frame on sm_80 that k = 16 did not show. 2048 rows (float32
    and bfloat16) build the 128-thread selection NVIDIA takes for many rows (``select_warps``)."""
    specs = {}
    for rows, vocab in ((1, 151936), (256, 151936), (2048, 151936), (1, 127), (64, MAX_SUBS * SUB_WIDTH)):
        production = rows >= 256
        widest = vocab == MAX_SUBS * SUB_WIDTH  # the most sub-tile maxima the selection ranks
        for logit_type in (_LOGIT_TYPES if rows == 256 else ("fp32",) if widest else ("fp32", "bf16")):
            for masking in (_MASKINGS[:2] if widest else _MASKINGS):
                config = launch_config(target, rows, vocab, masking[0], _ELEMENT_SIZES[logit_type], masking[2])
                for specialized in (False, True):
                    key = ("stats", logit_type, config, vocab if specialized else None, masking)
                    specs[key] = _stats_spec(target, logit_type, config, vocab, masking, specialized)
                    for k in (1, 8, MAX_TOPK) if production and logit_type in ("fp32", "bf16") else (1, MAX_TOPK):
                        token_maps = (masking[4],) if masking[2] else (None, "*i64") if production else (None,)
                        for token_map_type in token_maps:
                            warps = select_warps(target, k, config.sub, rows)
                            key = ("select", logit_type, k, config, warps, vocab if specialized else None, masking, token_map_type)
                            specs[key] = _select_spec(target, logit_type, k, rows, config, vocab, masking, token_map_type, specialized)
    return list(specs.values())


def describe_launch(target: KernelTarget) -> list[str]:
    lines = []
    for rows, vocab in ((1, 151936), (64, 151936), (256, 32000), (256, 151936), (2048, 151936)):
        config = launch_config(target, rows, vocab)
        lines.append(
            f"draft_topk bs={rows} V={vocab}: BLOCK={config.block}, {config.tiles(vocab)} tiles/row, "
            f"sub-tiles of {config.sub}, {config.tile_warps} warps x {target.warp_size} lanes; selection "
            f"{select_warps(target, 1, config.sub, rows)}-{select_warps(target, MAX_TOPK, config.sub, rows)} warps (k = 1-{MAX_TOPK})"
        )
    return lines
