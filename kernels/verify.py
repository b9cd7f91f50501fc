"""Triton kernels of family ``verify``. Semantics (every rounding and fallback): spec_hal/verify.py.

* ``_argmax_tile_kernel`` (grid: rows x tiles): the fused argmax over target logits reads each
  logit once; every program reduces one ``BLOCK``-wide tile of one row to (max, lowest id of the
  max). Splitting rows into tiles keeps bs = 1 from running one row per program. The common
  tile tests nothing an id but its mask bit: the maximum is a maxnum over the raw values (NaN
  skipped), the ids matched against it (NaN never matches), +inf clamped once a tile; a tile with
  no maximum above -inf (or a NaN one) ranks every id as the reference does. A row's whole tiles
  load without bounds, and an unconstrained row of a masked launch skips the mask.
* ``_greedy_walk_kernel`` (grid: request blocks): a pointer-chasing walk. Each level follows the
  last accepted node's child list (``retrieve_next_token``, then ``retrieve_next_sibling``) with
  one dependent load pair per child and stops at the first match, so a level costs as many steps
  as children scanned (not N), and the target's token is merged (logits) or loaded (ids) only for
  the S + 1 nodes the walk can stand on.
* ``_sampling_walk_kernel`` / ``_chain_sampling_kernel`` (grid: request blocks x vocabulary
  chunks): every program of a request walks (the tree walk chases pointers like the greedy one; a
  level gathers the last node's row at every candidate token in one load), then sums the
  quantised target row and residual over its chunk of the vocabulary, per ``SUB``-wide block,
  into a scratch buffer (where the residual is the target without some rejected tokens, only the
  target's sums: ``DERIVE_RESIDUAL``). The last of a request's programs to arrive (an acq_rel
  atomic counter) finds the crossing block from the block sums' running total, reads that block
  again and writes the Verdict. Quantised int64 sums are exact, so the result is bit-identical to
  the reference whatever the split; bs = 1 uses as many programs as the row has tiles.

Vocabulary masks (``token_bitmask``/``bitmask_index``, ``HAS_MASK``; helpers in kernels/masks.py):
the tile argmax ranks masked ids below every allowed one (a row allowing nothing gives id 0); the
walks accept a child only if its token is allowed at the parent's row (a masked candidate counts
with p = 0); the block sums and the crossing block's second read both zero the masked ids, so the
split final sampling stays bit-identical to the reference.

``BLOCK_R`` requests share a program: 1 on a GPU (one program per request and chunk); under the
interpreter many, so that a batch of 10^5 requests (the statistical test) is a few vectorised
programs. With one request a program, ``_chain_sampling_kernel``'s GPU launches (padded and
ragged, AMD and NVIDIA) reduce each request's lanes to scalars (``SCALAR_REDUCE``: ``_lanes_reduce``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from spec_hal import error_flag
from spec_hal.device_buffers import int32_parts
from spec_hal.types import DraftTree, Verdict
import spec_hal.verify as semantics

from .error_flag import ARGUMENT_STEP, record_invalid
from .launch import KernelTarget, runtime_specialized, cdiv, next_power_of_2
from .masks import mask_row_base, tile_allowed, tile_words, tile_words_clamped, token_allowed, words_allowed

# Globals read inside kernels must be constexpr.
NO_ID = tl.constexpr(2**31 - 1)
FLT_MAX = tl.constexpr(3.4028234663852886e38)
COIN_MAX = tl.constexpr(semantics.COIN_MAX)
QUANT_SCALE = tl.constexpr(semantics.QUANT_SCALE)

# ----------------------------------------------------------------------------------------------
# device helpers


# From this many lanes (N_PAD) on, the sampling walk loads each scanned child's token and
# probability instead of picking them from the lanes (H100, 2026-11-26: 0.68-0.92x the time at
# N 32-64, 0.91-0.95x at N 16 with bs >= 64; at N 4-8 the picks stay, where loading measured
# 0.97-1.03x and spilled on sm_80 and the AMD targets; BENCHMARKS.md, eleventh session).
LOADED_CHILDREN_FROM = tl.constexpr(16)


@triton.jit
def _pick(matrix, index, lanes):
    """matrix[r, index[r]] for a (R, L) register matrix; 0 where index matches no lane."""
    return tl.sum(tl.where(lanes[None, :] == index[:, None], matrix, 0), axis=1)


@triton.jit
def _link(value, nodes):
    """A tree link, or -1 when it is outside [1, N) (ends the list)."""
    return tl.where((value >= 1) & (value < nodes), value, -1)


@triton.jit
def _record_walk_values(flag_ptr, flag_code, next_token_ptr, next_sibling_ptr, cand, id_index, node_ids, ok, nodes, vocab, chain_shift):
    """The error-flag record of a tree walk (spec_hal.verify.record_walk_values), in ONE predicated
    atomic per program: per node lane, a candidate < -1 or >= V (argument 0 of the op; at flat
    index ``id_index``; ``vocab`` < 0: V unknown, only ids < -1), else a ``retrieve_next_token``
    (argument 1), else a ``retrieve_next_sibling`` (argument 2) that is neither -1 nor in [1, N)
    (at ``node_ids``). ``chain_shift`` 1: the tree is a chain built by the host (its links are
    not the caller's, so not read). The smallest code per lane is the reference's, and the atomic
    min keeps the smallest over lanes. ``ok``: the lanes to check."""
    # Tensors of int1 (the interpreter rejects a mask combined with a scalar such as program_id == 0).
    ok = ok != 0
    link_ok = ok & ((tl.zeros_like(node_ids) + chain_shift) == 0)
    next_token = tl.load(next_token_ptr + node_ids, mask=link_ok, other=-1)
    next_sibling = tl.load(next_sibling_ptr + node_ids, mask=link_ok, other=-1)
    bad_id = ok & ((cand < -1) | ((vocab >= 0) & (cand >= vocab)))
    bad_next = (next_token != -1) & (_link(next_token, nodes) < 0)
    bad_sibling = (next_sibling != -1) & (_link(next_sibling, nodes) < 0)
    argument = tl.where(bad_id, 0, tl.where(bad_next, 1, 2)).to(tl.int64)
    record_invalid(flag_ptr, flag_code + argument * ARGUMENT_STEP, bad_id | bad_next | bad_sibling, tl.where(bad_id, id_index, node_ids))


@triton.jit
def _sanitize_probs(p):
    return tl.where(p > 0, tl.where(p < 1, p, 1.0), 0.0)


@triton.jit
def _sanitize_coins(c):
    return tl.where(c > 0, tl.where(c < COIN_MAX, c, COIN_MAX), 0.0)


@triton.jit
def _quantize(p):
    return (p * QUANT_SCALE).to(tl.int64)


@triton.jit
def _merge_argmax(tile_max_ptr, tile_id_ptr, rows, rows_ok, num_tiles, TILES_PAD: tl.constexpr):
    """Argmax (lowest id of the max) of (R, L) logit rows from their tiles' (max, id), int64, and
    whether the row allows any id (False only where a mask allowed nothing: the argmax is then 0,
    as the reference's). Where a row allows something its argmax is an allowed id, so a token
    equal to it is allowed too: the walks need no mask lookup of their own for logits."""
    tiles = tl.arange(0, TILES_PAD)
    ok = rows_ok[:, :, None] & (tiles[None, None, :] < num_tiles)
    offsets = rows[:, :, None] * num_tiles + tiles[None, None, :]
    tile_max = tl.load(tile_max_ptr + offsets, mask=ok, other=float("-inf"))
    tile_id = tl.load(tile_id_ptr + offsets, mask=ok, other=NO_ID)
    row_max = tl.max(tile_max, axis=2)
    best = tl.min(tl.where(ok & (tile_max == row_max[:, :, None]), tile_id, NO_ID), axis=2)
    allows_any = best != NO_ID
    return tl.where(allows_any, best, 0).to(tl.int64), allows_any


@triton.jit
def _row_argmax(tile_max_ptr, tile_id_ptr, rows, rows_ok, num_tiles, TILES_PAD: tl.constexpr):
    """``_merge_argmax`` of (R,) rows: ((R,) int64 argmax, (R,) whether the row allows any id)."""
    best, allows_any = _merge_argmax(tile_max_ptr, tile_id_ptr, rows[:, None], rows_ok[:, None], num_tiles, TILES_PAD)
    return tl.reshape(best, [rows.shape[0]]), tl.reshape(allows_any, [rows.shape[0]])


@triton.jit
def _reduce(values, OP: tl.constexpr, AXIS: tl.constexpr):
    """``tl.min``/``tl.max``/``tl.sum`` of ``values`` by name (AXIS None: all of them)."""
    if OP == "min":
        return tl.min(values, axis=AXIS)
    if OP == "max":
        return tl.max(values, axis=AXIS)
    return tl.sum(values, axis=AXIS)


@triton.jit
def _lanes_reduce(OP: tl.constexpr, values, SCALAR_REDUCE: tl.constexpr):
    """``tl.min``, ``tl.max`` or ``tl.sum`` (``OP``: "min", "max", "sum") of (R, L) ``values``
    along axis 1: (R,). SCALAR_REDUCE (R = 1; the chain sampling kernel's GPU launches,
    ``SamplingLaunch.scalar_reduce``): the reduction of all of them, a scalar,
    broadcast to (1,): the same value. A scalar has no layout, so each user broadcasts it where
    it needs it. Users of a (R,) reduction in several layouts made Triton 3.6 rematerialise
    the reduction's inputs, loads included, once per layout (five copies of the masked chain walk
    with draft probabilities), or pick one layout for all of them (the final token's 128 block
    sums, 32 a thread, at N_PAD 4); on AMD the copies whose threads each hold all N_PAD lanes kept
    them in SGPRs, and the masked chain walks spilled 2-229 SGPRs on gfx942 (offline compiles).
    On NVIDIA the scalars removed Triton 3.6's local frames of most chain specs on sm_90 and
    measured 0.49-1.02x the time of the (R,) form on the H200 (BENCHMARKS.md, thirty-third and
    thirty-fourth sessions; ``sampling_launch``). The interpreter's many-request programs keep the
    (R,) form."""
    if SCALAR_REDUCE:
        tl.static_assert(values.shape[0] == 1, "SCALAR_REDUCE takes one request a program")
        return tl.broadcast_to(_reduce(values, OP, None), [1])
    return _reduce(values, OP, 1)


@triton.jit
def _tile_loads(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, use_q, req_ok, tile, end_tile, vocab,
                mask_ptr, mask_base, constrained, mask_width, BLOCK_R: tl.constexpr, TILE_V: tl.constexpr,
                HAS_Q: tl.constexpr, HAS_MASK: tl.constexpr, MASK_LOADS: tl.constexpr):
    """The raw loads of ``tile`` of each request's row, nothing at or past ``end_tile``: p and q
    (R, TILE_V) float32 (q: HAS_Q, where use_q) and the tile's mask words (R, TILE_V // 32)
    (HAS_MASK; MASK_LOADS "bounded": masks.tile_words, each word predicated on its bound; "row"
    or "none": masks.tile_words_clamped with that PREDICATE). Unused outputs are placeholders the
    compiler drops."""
    cols = tile * TILE_V + tl.arange(0, TILE_V)
    # tile compared as a (R,) vector: the interpreter rejects a load mask made from a 0-d bool
    rows_ok = req_ok & ((tl.zeros([BLOCK_R], dtype=tl.int32) + tile) < end_tile)
    ok = rows_ok[:, None] & (cols[None, :] < vocab)
    p = tl.load(probs_ptr + p_base[:, None] + cols[None, :].to(tl.int64) * stride_pv, mask=ok, other=0.0)
    q = p
    if HAS_Q:
        q = tl.load(q_ptr + q_base[:, None] + cols[None, :].to(tl.int64) * stride_qv, mask=ok & use_q[:, None], other=0.0)
    words = tl.zeros([BLOCK_R, 1], dtype=tl.int32)
    if HAS_MASK:
        if MASK_LOADS == "bounded":
            words = tile_words(mask_ptr, mask_base, rows_ok & constrained, tile * TILE_V, mask_width, TILE_V)
        else:
            words = tile_words_clamped(mask_ptr, mask_base, rows_ok & constrained, tile * TILE_V, mask_width, TILE_V, MASK_LOADS)
    return p, q, words


@triton.jit
def _removed_sums(rejected, rejected_q, blocks, SUB: tl.constexpr):
    """(R, B): for each of the B SUB-wide ``blocks`` (B,), the quantised p of the ``rejected``
    tokens (R, L; -1 none; their quantised p in ``rejected_q``) that lie in it."""
    block_of = tl.where(rejected >= 0, rejected // SUB, -1)
    return tl.sum(tl.where(block_of[:, None, :] == blocks[None, :, None], rejected_q[:, None, :], 0), axis=2)


@triton.jit
def _removed_block_sums(rejected, rejected_q, blocks, SUB: tl.constexpr):
    """``_removed_sums`` over all of a row's blocks (``blocks``: (NB_PAD,)), one rejected lane at a
    time where there are several: as one (R, NB_PAD, L) comparison the L lanes spread over threads,
    and reducing over them took hundreds of shuffles a thread in the tree walk's final token (sm_90
    SASS, thirty-eighth session). A lane with no rejected token is skipped."""
    L: tl.constexpr = rejected.shape[1]
    if L == 1:
        return _removed_sums(rejected, rejected_q, blocks, SUB)
    lanes = tl.arange(0, L)
    removed = tl.zeros([rejected.shape[0], blocks.shape[0]], dtype=tl.int64)
    for j in tl.static_range(L):
        token = tl.max(tl.where(lanes[None, :] == j, rejected, -1), axis=1)
        if tl.max(token, axis=0) >= 0:
            token_q = tl.sum(tl.where(lanes[None, :] == j, rejected_q, 0), axis=1)
            block_of = tl.where(token >= 0, token // SUB, -1)
            removed += tl.where(blocks[None, :] == block_of[:, None], token_q[:, None], 0)
    return removed


@triton.jit
def _block_sums(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, use_q, req_ok, rejected, rejected_q,
                sums_ptr, sums_base, sums_width, vocab, first_tile, end_tile, mask_ptr, mask_base, constrained, mask_width,
                BLOCK_R: tl.constexpr, TILE_V: tl.constexpr, SUB: tl.constexpr, HAS_Q: tl.constexpr, HAS_REJECTED: tl.constexpr,
                HAS_MASK: tl.constexpr, READ_AHEAD: tl.constexpr, DERIVE_RESIDUAL: tl.constexpr, MASK_LOADS: tl.constexpr):
    """For tiles [first_tile, end_tile) of each request's row, store the sum of every SUB-wide
    block of the quantised target row at sums_ptr[sums_base + k] and of the quantised residual at
    sums_ptr[sums_base + sums_width + k] (k: global block index). The residual is max(0, p - q)
    (HAS_Q; q read where use_q) or p without the ``rejected`` tokens (R, L; -1 none; their
    quantised p in rejected_q) (HAS_REJECTED). DERIVE_RESIDUAL (HAS_REJECTED): the residual's sums
    are not stored; ``_sample_from_sums`` takes the rejected tokens' quantised p off the target's
    (half the stores and int64 sums a tile, and no comparison of the tile's blocks with the
    rejected tokens). HAS_MASK: p is 0 at the ids the row's mask (``mask_base``, ``constrained``:
    ``masks.mask_row_base``) does not allow (TILE_V >= 32), its words loaded as MASK_LOADS says
    (``_tile_loads``). READ_AHEAD: tile t + 1 is loaded before tile t is reduced
    (``SamplingLaunch.read_ahead``)."""
    tl.static_assert(HAS_Q != HAS_REJECTED, "the residual is p - q or p without rejected tokens")
    SUBS: tl.constexpr = TILE_V // SUB
    subs = tl.arange(0, SUBS)
    if READ_AHEAD:
        p_next, q_next, words_next = _tile_loads(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, use_q, req_ok, first_tile,
                                                 end_tile, vocab, mask_ptr, mask_base, constrained, mask_width, BLOCK_R, TILE_V, HAS_Q,
                                                 HAS_MASK, MASK_LOADS)
    for t in range(first_tile, end_tile):
        if READ_AHEAD:
            # Each program keeps a whole tile of loads in flight. Without it ptxas issued a masked
            # tile's 16-byte loads one after the other, each after the previous one's reduction (4
            # round trips a tile: 1.7-1.9x the unmasked time on the H100, either mask-word layout).
            p, q, words = p_next, q_next, words_next
            p_next, q_next, words_next = _tile_loads(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, use_q, req_ok, t + 1,
                                                     end_tile, vocab, mask_ptr, mask_base, constrained, mask_width, BLOCK_R, TILE_V,
                                                     HAS_Q, HAS_MASK, MASK_LOADS)
        else:
            p, q, words = _tile_loads(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, use_q, req_ok, t, end_tile, vocab,
                                      mask_ptr, mask_base, constrained, mask_width, BLOCK_R, TILE_V, HAS_Q, HAS_MASK, MASK_LOADS)
        if HAS_MASK:
            p = tl.where(words_allowed(words, TILE_V), p, 0.0)
        p = _sanitize_probs(p)
        p_sums = tl.sum(tl.reshape(_quantize(p), [BLOCK_R, SUBS, SUB]), axis=2)
        block = t * SUBS + subs
        at = sums_base[:, None] + block[None, :]
        tl.store(sums_ptr + at, p_sums, mask=req_ok[:, None])
        if not DERIVE_RESIDUAL:
            if HAS_Q:
                diff = p - _sanitize_probs(q)
                r_sums = tl.sum(tl.reshape(_quantize(tl.where(diff > 0, diff, 0.0)), [BLOCK_R, SUBS, SUB]), axis=2)
            else:
                r_sums = p_sums - _removed_sums(rejected, rejected_q, block, SUB)
            tl.store(sums_ptr + at + sums_width, r_sums, mask=req_ok[:, None])


@triton.jit
def _finishing(counter_ptr, req, req_ok, SPLIT: tl.constexpr):
    """Whether this program is the last of its request's vocabulary chunks to have stored its
    block sums (always, without a split); the block sums of every chunk are visible to it."""
    tl.debug_barrier()  # every thread's block sums are stored before the release below
    if SPLIT:
        arrived = tl.atomic_add(counter_ptr + req, 1, mask=req_ok, sem="acq_rel")
        last = tl.max(tl.where(req_ok, arrived, 0), axis=0) == tl.num_programs(1) - 1
        tl.debug_barrier()
    else:
        last = tl.full([], 1, tl.int1)
    return last


@triton.jit
def _sample_from_sums(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, use_q, req_ok, rejected, rejected_q, coin,
                      sums_ptr, sums_base, sums_width, vocab, mask_ptr, mask_base, constrained, mask_width,
                      SUB: tl.constexpr, NB_PAD: tl.constexpr, PIECE: tl.constexpr, HAS_Q: tl.constexpr,
                      HAS_REJECTED: tl.constexpr, HAS_MASK: tl.constexpr, SCALAR_REDUCE: tl.constexpr = False,
                      DERIVE_RESIDUAL: tl.constexpr = False):
    """The final token of each request (R,) int64 from its block sums (``_block_sums``):
    inverse-CDF of the quantised residual, else of the target row, else 0. The crossing block is
    read again with the same mask as the sums (HAS_MASK), so its running sum matches them.
    DERIVE_RESIDUAL: the residual's sums are the target's less the ``rejected`` tokens' quantised p
    (``rejected``, ``rejected_q``: (R, L)), the sums ``_block_sums`` would have stored.
    SCALAR_REDUCE: the row reductions as scalars (``_lanes_reduce``)."""
    blocks = tl.arange(0, NB_PAD)
    in_sums = req_ok[:, None] & (blocks[None, :] < sums_width)
    at = sums_base[:, None] + blocks[None, :]
    # .cg: other programs wrote these; never serve them from this SM's L1.
    if DERIVE_RESIDUAL:
        sums = tl.load(sums_ptr + at, mask=in_sums, other=0, cache_modifier=".cg")
        residual = sums - _removed_block_sums(rejected, rejected_q, blocks, SUB)
        use_residual = _lanes_reduce("sum", residual, SCALAR_REDUCE) > 0
        sums = tl.where(use_residual[:, None], residual, sums)
    else:
        total_r = _lanes_reduce("sum", tl.load(sums_ptr + at + sums_width, mask=in_sums, other=0, cache_modifier=".cg"), SCALAR_REDUCE)
        use_residual = total_r > 0
        # Only the row that is sampled is loaded again (half the live registers of keeping both).
        sums = tl.load(sums_ptr + at + tl.where(use_residual, sums_width, 0)[:, None], mask=in_sums, other=0, cache_modifier=".cg")
    total = _lanes_reduce("sum", sums, SCALAR_REDUCE)
    threshold = (coin.to(tl.float64) * total.to(tl.float64)).to(tl.int64)
    threshold = tl.minimum(threshold, total - 1)
    # The crossing block: the number of blocks whose inclusive running sum is <= threshold.
    running = tl.cumsum(sums, axis=1)
    crossing = _lanes_reduce("sum", tl.where(running <= threshold[:, None], 1, 0), SCALAR_REDUCE)
    before = _lanes_reduce("sum", tl.where(blocks[None, :] < crossing[:, None], sums, 0), SCALAR_REDUCE)

    # The crossing block, in PIECE-wide pieces (the rejected-token comparison is PIECE x N_PAD).
    index = crossing * SUB
    for piece in tl.static_range(SUB // PIECE):
        cols = crossing[:, None] * SUB + piece * PIECE + tl.arange(0, PIECE)[None, :]
        ok = req_ok[:, None] & (cols < vocab) & (total[:, None] > 0)
        p_ok = ok
        if HAS_MASK:
            p_ok = ok & token_allowed(mask_ptr, mask_base[:, None], constrained[:, None], cols, ok, mask_width)
        p = _sanitize_probs(tl.load(probs_ptr + p_base[:, None] + cols.to(tl.int64) * stride_pv, mask=p_ok, other=0.0))
        values = _quantize(p)
        if HAS_Q:
            q = _sanitize_probs(tl.load(q_ptr + q_base[:, None] + cols.to(tl.int64) * stride_qv, mask=ok & use_q[:, None], other=0.0))
            diff = p - q
            values = tl.where(use_residual[:, None], _quantize(tl.where(diff > 0, diff, 0.0)), values)
        elif HAS_REJECTED:
            hit = tl.sum(tl.where(cols[:, :, None] == rejected[:, None, :], 1, 0), axis=2) > 0
            values = tl.where(use_residual[:, None] & hit, 0, values)
        running = tl.cumsum(values, axis=1) + before[:, None]
        index += _lanes_reduce("sum", tl.where(running <= threshold[:, None], 1, 0), SCALAR_REDUCE)
        before += _lanes_reduce("sum", values, SCALAR_REDUCE)
    return tl.where(total > 0, index, 0).to(tl.int64)


# ----------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _argmax_tile_kernel(logits_ptr, stride_row, stride_col, vocab, tile_max_ptr, tile_id_ptr, num_tiles, mask_ptr, index_ptr, num_masks,
                        mask_width, BLOCK: tl.constexpr, HAS_MASK: tl.constexpr, HAS_INDEX: tl.constexpr):
    row = tl.program_id(0)
    tile = tl.program_id(1)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    in_vocab = cols < vocab
    if HAS_MASK:  # the row's mask row first: with an index, its words wait on it
        base, constrained = mask_row_base(index_ptr, row, True, num_masks, mask_width, HAS_INDEX)
    # Every tile of a row but its last lies inside the vocabulary: loaded without a bound test (the
    # bounded load first sets each id's register to -inf, an instruction an id).
    logits = logits_ptr + row.to(tl.int64) * stride_row + cols.to(tl.int64) * stride_col
    if (tile + 1) * BLOCK <= vocab:
        values = tl.load(logits).to(tl.float32)
    else:
        values = tl.load(logits, mask=in_vocab, other=float("-inf")).to(tl.float32)
    if HAS_MASK:
        if constrained:  # masked tokens rank below every allowed one: a tile allowing nothing has id NO_ID
            values = tl.where(tile_allowed(mask_ptr, base, constrained, tile * BLOCK, mask_width, BLOCK), values, float("-inf"))
    # NaN ranks as -inf and +inf as FLT_MAX (ties with it: lower id). Triton's max is a maxnum
    # (llvm.maxnum: a NaN operand is skipped; on AMD LLVM quiets each operand first, as the gfx942
    # code shows), so the common tile takes its maximum from the raw values and then compares them
    # with it (NaN never compares true). The NaN test and select, the clamp and the bound select an
    # id were 4 of the unmasked tile's 8 instructions an id (sm_90 SASS, Triton 3.6) in a kernel
    # bound by its ALU pipe (BENCHMARKS.md, thirty-seventh and forty-third sessions).
    tile_max = tl.max(values, axis=0)
    if tile_max > float("-inf"):
        tile_max = tl.minimum(tile_max, FLT_MAX)
        tile_id = tl.min(tl.where(values >= tile_max, cols, NO_ID), axis=0)
    else:  # nothing above -inf, or a NaN maximum (an interpreter whose max keeps NaN): rank each id
        values = tl.where(values != values, float("-inf"), tl.minimum(values, FLT_MAX))
        tile_max = tl.max(values, axis=0)
        candidate = in_vocab  # with nothing above -inf, the lowest allowed id in the vocabulary, else NO_ID
        if HAS_MASK:
            candidate = candidate & tile_allowed(mask_ptr, base, constrained, tile * BLOCK, mask_width, BLOCK)
        tile_id = tl.min(tl.where(candidate & (values == tile_max), cols, NO_ID), axis=0)
    slot = row.to(tl.int64) * num_tiles + tile
    tl.store(tile_max_ptr + slot, tile_max)
    tl.store(tile_id_ptr + slot, tile_id)


@triton.jit
def _store_verdict(predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, predict, accept, num_correct,
                   req, req_ok, ok, node_ids, width_lanes, num_steps):
    """Write a tree walk's Verdict: predict rows, accept_index (S + 1 wide), num_correct, accept_lens."""
    tl.store(predict_ptr + node_ids, predict.to(tl.int32), mask=ok)
    width = num_steps + 1
    tl.store(accept_ptr + req.to(tl.int64)[:, None] * width + width_lanes[None, :], accept.to(tl.int32),
             mask=req_ok[:, None] & (width_lanes[None, :] < width))
    tl.store(num_correct_ptr + req, num_correct, mask=req_ok)
    tl.store(accept_lens_ptr + req, num_correct + 1, mask=req_ok)



@triton.jit
def _greedy_walk_kernel(next_token_ptr, next_sibling_ptr, cand_ptr, target_ptr, tile_max_ptr, tile_id_ptr, num_tiles,
                        predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, bs, nodes, num_steps, vocab, flag_ptr, flag_code,
                        BLOCK_R: tl.constexpr, N_PAD: tl.constexpr, W_PAD: tl.constexpr, TILES_PAD: tl.constexpr, FROM_LOGITS: tl.constexpr):
    """The greedy tree walk over the target's tokens: from logits (FROM_LOGITS) the argmax of each
    row's tiles (``_argmax_tile_kernel``, which applies a token_bitmask), else (bs * N,) ids."""
    req = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    req_ok = req < bs
    lanes = tl.arange(0, N_PAD)
    ok = req_ok[:, None] & (lanes[None, :] < nodes)
    block_base = req.to(tl.int64) * nodes
    width_lanes = tl.arange(0, W_PAD)
    predict = tl.full([BLOCK_R, N_PAD], -1, dtype=tl.int64)
    accept = tl.where(width_lanes[None, :] == 0, block_base[:, None], tl.full([BLOCK_R, W_PAD], -1, dtype=tl.int64))
    last = tl.zeros([BLOCK_R], dtype=tl.int32)
    num_correct = tl.zeros([BLOCK_R], dtype=tl.int32)
    standing = req_ok  # requests whose walk reached ``last`` at this level
    level = tl.zeros([BLOCK_R], dtype=tl.int32)
    while tl.max(standing.to(tl.int32), axis=0) > 0:
        node = block_base + last
        # A child is accepted when its token is the target's and allowed at this node's row. A
        # masked target comes only as logits (the public op rejects ids with a mask), and their
        # argmax is allowed wherever the row allows anything, so ``allows_any`` is the whole mask
        # test: no dependent mask-word load per child (it cost 1.2x the unmasked time at bs 64,
        # V 32000 on the H100).
        if FROM_LOGITS:
            wanted, allows_any = _row_argmax(tile_max_ptr, tile_id_ptr, node, standing, num_tiles, TILES_PAD)
        else:
            wanted = tl.load(target_ptr + node, mask=standing, other=-1).to(tl.int64)
            allows_any = standing
        predict = tl.where((lanes[None, :] == last[:, None]) & standing[:, None], wanted[:, None], predict)
        descend = standing & (level < num_steps) & (level < nodes - 1)  # never more than N - 1 accepts
        cur = _link(tl.load(next_token_ptr + node, mask=descend, other=-1).to(tl.int64), nodes).to(tl.int32)
        chosen = tl.full([BLOCK_R], -1, dtype=tl.int32)
        scanned = tl.zeros([BLOCK_R], dtype=tl.int32)
        while tl.max(cur, axis=0) >= 0:  # follow the child list to the first match (at most N nodes)
            scanning = cur >= 0
            at = block_base + cur
            token = tl.load(cand_ptr + at, mask=scanning, other=-1).to(tl.int64)
            sibling = tl.load(next_sibling_ptr + at, mask=scanning, other=-1).to(tl.int64)
            hit = scanning & (token == wanted) & allows_any
            chosen = tl.where(hit, cur, chosen)
            scanned += 1
            cur = tl.where(scanning & (hit == 0) & (scanned < nodes), _link(sibling, nodes).to(tl.int32), -1)
        standing = chosen >= 0
        last = tl.where(standing, chosen, last)
        num_correct += standing.to(tl.int32)
        level += 1
        accept = tl.where((width_lanes[None, :] == level[:, None]) & standing[:, None], block_base[:, None] + chosen[:, None], accept)

    node_ids = block_base[:, None] + lanes[None, :]
    _store_verdict(predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, predict, accept, num_correct,
                   req, req_ok, ok, node_ids, width_lanes, num_steps)
    # Error flag, after the walk: its rows are cached by now and nothing stays live across it.
    cand = tl.load(cand_ptr + node_ids, mask=ok, other=-1).to(tl.int64)
    _record_walk_values(flag_ptr, flag_code, next_token_ptr, next_sibling_ptr, cand, node_ids, node_ids, ok, nodes, vocab, 0)


@triton.jit
def _sampling_walk_kernel(next_token_ptr, next_sibling_ptr, cand_ptr, probs_ptr, stride_pb, stride_pn, stride_pv,
                          coins_ptr, final_coins_ptr, threshold_single, threshold_acc,
                          predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, bs, nodes, num_steps, vocab,
                          sums_ptr, sums_width, counter_ptr, tiles_per_chunk, mask_ptr, index_ptr, num_masks, mask_width,
                          flag_ptr, flag_code, chain_shift,
                          BLOCK_R: tl.constexpr, N_PAD: tl.constexpr, W_PAD: tl.constexpr, TILE_V: tl.constexpr, SUB: tl.constexpr,
                          NB_PAD: tl.constexpr, SPLIT: tl.constexpr, HAS_MASK: tl.constexpr, HAS_INDEX: tl.constexpr,
                          READ_AHEAD: tl.constexpr, WALK_ONLY: tl.constexpr, DERIVE_RESIDUAL: tl.constexpr):
    """WALK_ONLY: the walk alone, no final token (predict -1 at the final node; one program a
    request): its Verdict names each request's final node, the one row whose every probability
    the full walk then reads (kernels/sampling_rows.py: process_path_rows). DERIVE_RESIDUAL
    (``SamplingLaunch.derive_residual``): the vocabulary pass stores the final row's block sums
    alone, and the last program takes the rejected children's quantised p off them."""
    req = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    req_ok = req < bs
    lanes = tl.arange(0, N_PAD)
    ok = req_ok[:, None] & (lanes[None, :] < nodes)
    block_base = req.to(tl.int64) * nodes
    node_ids = block_base[:, None] + lanes[None, :]
    cand = tl.load(cand_ptr + node_ids, mask=ok, other=-1).to(tl.int64)
    cand_ok = ok & (cand >= 0) & (cand < vocab)
    # Error flag, by the first chunk's program; chain_shift 1 when the walk runs a chain (its links
    # are ours; drafts = nodes 1.., index b*S + j - 1, recorded as the chain op's draft_ids).
    _record_walk_values(flag_ptr, flag_code, next_token_ptr, next_sibling_ptr, cand, node_ids - (req.to(tl.int64)[:, None] + 1) * chain_shift,
                        node_ids, (tl.program_id(1) == 0) & ok, nodes, vocab, chain_shift)
    request_rows = req.to(tl.int64) * stride_pb

    width_lanes = tl.arange(0, W_PAD)
    last = tl.zeros([BLOCK_R], dtype=tl.int32)
    num_correct = tl.zeros([BLOCK_R], dtype=tl.int32)
    rejected = tl.zeros([BLOCK_R, N_PAD], dtype=tl.int32)  # nodes rejected at the last node's row
    rejected_q = tl.zeros([BLOCK_R, N_PAD], dtype=tl.int64)
    on_path = tl.where(lanes[None, :] == 0, 1, tl.zeros([BLOCK_R, N_PAD], dtype=tl.int32))
    next_tokens = tl.full([BLOCK_R, N_PAD], -1, dtype=tl.int64)
    accept = tl.where(width_lanes[None, :] == 0, block_base[:, None], tl.full([BLOCK_R, W_PAD], -1, dtype=tl.int64))
    standing = req_ok
    level = tl.zeros([BLOCK_R], dtype=tl.int32)
    while tl.max(standing.to(tl.int32), axis=0) > 0:
        node = block_base + last
        descend = standing & (level < num_steps) & (level < nodes - 1)  # never more than N - 1 accepts
        rejected = tl.where(standing[:, None], 0, rejected)
        rejected_q = tl.where(standing[:, None], 0, rejected_q)
        coin = _sanitize_coins(tl.load(coins_ptr + node, mask=descend, other=0.0))
        row_base = request_rows + last.to(tl.int64) * stride_pn
        if HAS_MASK:  # masked candidates count with p = 0 and are never accepted
            mask_base, constrained = mask_row_base(index_ptr, node, descend, num_masks, mask_width, HAS_INDEX)
        if N_PAD < LOADED_CHILDREN_FROM:  # the last node's row at every candidate token: one gathered load per level
            row_probs = _sanitize_probs(tl.load(probs_ptr + row_base[:, None] + cand * stride_pv, mask=cand_ok & descend[:, None],
                                                other=0.0))
            if HAS_MASK:
                cand_allowed = token_allowed(mask_ptr, mask_base[:, None], constrained[:, None], cand, ok, mask_width)
                row_probs = tl.where(cand_allowed, row_probs, 0.0)
                cand_allowed = cand_allowed.to(tl.int32)
        cur = _link(tl.load(next_token_ptr + node, mask=descend, other=-1).to(tl.int64), nodes).to(tl.int32)
        acc = tl.zeros([BLOCK_R], dtype=tl.float32)
        chosen = tl.full([BLOCK_R], -1, dtype=tl.int32)
        scanned = tl.zeros([BLOCK_R], dtype=tl.int32)
        while tl.max(cur, axis=0) >= 0:  # follow the child list to the first acceptance (at most N nodes)
            scanning = cur >= 0
            child = block_base + cur
            sibling = tl.load(next_sibling_ptr + child, mask=scanning, other=-1).to(tl.int64)
            if N_PAD >= LOADED_CHILDREN_FROM:
                # The child's token and its probability at the last node's row are loaded, not
                # picked from the lanes: over 16 lanes or more a pick is a reduction across the
                # program's warps (shared memory and a barrier); the token load hits L1.
                token = tl.load(cand_ptr + child, mask=scanning, other=-1).to(tl.int64)
                token_ok = scanning & (token >= 0) & (token < vocab)  # a scanned child's level descends
                p = _sanitize_probs(tl.load(probs_ptr + row_base + token * stride_pv, mask=token_ok, other=0.0))
                if HAS_MASK:
                    allowed = token_allowed(mask_ptr, mask_base, constrained, token, token_ok, mask_width)
                    p = tl.where(allowed, p, 0.0)
            else:
                token = _pick(cand, cur, lanes)
                p = _pick(row_probs, cur, lanes)
                if HAS_MASK:
                    allowed = _pick(cand_allowed, cur, lanes) != 0
            duplicate = tl.sum(tl.where((rejected != 0) & (cand == token[:, None]), 1, 0), axis=1) > 0
            p = tl.where(duplicate, 0.0, p)
            acc = tl.where(scanning, acc + p, acc)
            hit = scanning & ((coin * threshold_acc < acc) | (p >= threshold_single))
            if HAS_MASK:
                hit = hit & allowed
            chosen = tl.where(hit, cur, chosen)
            refused = (lanes[None, :] == cur[:, None]) & (scanning & (hit == 0))[:, None]
            rejected = tl.where(refused, 1, rejected)
            rejected_q = tl.where(refused, _quantize(p)[:, None], rejected_q)
            scanned += 1
            cur = tl.where(scanning & (hit == 0) & (scanned < nodes), _link(sibling, nodes).to(tl.int32), -1)
        standing = chosen >= 0
        next_tokens = tl.where((lanes[None, :] == last[:, None]) & standing[:, None], _pick(cand, chosen, lanes)[:, None], next_tokens)
        last = tl.where(standing, chosen, last)
        num_correct += standing.to(tl.int32)
        level += 1
        on_path = tl.where(lanes[None, :] == chosen[:, None], 1, on_path)
        accept = tl.where((width_lanes[None, :] == level[:, None]) & standing[:, None], block_base[:, None] + chosen[:, None], accept)

    if WALK_ONLY:
        _store_verdict(predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, tl.where(on_path != 0, next_tokens, -1), accept,
                       num_correct, req, req_ok, ok, node_ids, width_lanes, num_steps)
    else:
        rejected_tokens = tl.where((rejected != 0) & cand_ok, cand, -1)
        PIECE: tl.constexpr = SUB if SUB * N_PAD <= 2048 else 2048 // N_PAD  # bounds the final block's token comparison
        last_row = request_rows + last.to(tl.int64) * stride_pn
        sums_base = req.to(tl.int64) * (2 * sums_width)
        first_tile = tl.program_id(1) * tiles_per_chunk
        end_tile = tl.minimum(first_tile + tiles_per_chunk, tl.cdiv(vocab, TILE_V))
        final_base, final_constrained = mask_row_base(index_ptr, block_base + last, req_ok & HAS_MASK, num_masks, mask_width, HAS_INDEX)
        _block_sums(probs_ptr, last_row, stride_pv, probs_ptr, last_row, stride_pv, req_ok, req_ok, rejected_tokens, rejected_q,
                    sums_ptr, sums_base, sums_width, vocab, first_tile, end_tile, mask_ptr, final_base, final_constrained, mask_width,
                    BLOCK_R, TILE_V, SUB, False, True, HAS_MASK, READ_AHEAD, DERIVE_RESIDUAL, "bounded")
        if _finishing(counter_ptr, req, req_ok, SPLIT):
            final_coin = _sanitize_coins(tl.load(final_coins_ptr + req, mask=req_ok, other=0.0))
            final = _sample_from_sums(probs_ptr, last_row, stride_pv, probs_ptr, last_row, stride_pv, req_ok, req_ok, rejected_tokens,
                                      rejected_q, final_coin, sums_ptr, sums_base, sums_width, vocab, mask_ptr, final_base, final_constrained,
                                      mask_width, SUB, NB_PAD, PIECE, False, True, HAS_MASK, False, DERIVE_RESIDUAL)
            next_tokens = tl.where(lanes[None, :] == last[:, None], final[:, None], next_tokens)
            predict = tl.where(on_path != 0, next_tokens, -1)
            _store_verdict(predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, predict, accept, num_correct,
                           req, req_ok, ok, node_ids, width_lanes, num_steps)


@triton.jit
def _chain_greedy_kernel(cand_ptr, target_ptr, tile_max_ptr, tile_id_ptr, num_tiles, num_correct_ptr, bonus_ptr, bs, width, vocab,
                         flag_ptr, flag_code, BLOCK_R: tl.constexpr, B_PAD: tl.constexpr, TILES_PAD: tl.constexpr,
                         FROM_LOGITS: tl.constexpr):
    """The greedy chain prefix match; the target as in ``_greedy_walk_kernel`` (a mask: its
    ``allows_any``, draft j + 1 allowed at row j)."""
    req = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    req_ok = req < bs
    lanes = tl.arange(0, B_PAD)
    ok = req_ok[:, None] & (lanes[None, :] < width)
    ids = req.to(tl.int64)[:, None] * width + lanes[None, :]
    if FROM_LOGITS:
        target, allows_any = _merge_argmax(tile_max_ptr, tile_id_ptr, ids, ok, num_tiles, TILES_PAD)
    else:
        target = tl.load(target_ptr + ids, mask=ok, other=-1).to(tl.int64)
        allows_any = ok
    # Draft j (column j + 1) is compared with the target's token at column j.
    drafts = tl.load(cand_ptr + ids + 1, mask=ok & (lanes[None, :] < width - 1), other=-1).to(tl.int64)
    mismatch = (lanes[None, :] >= width - 1) | (drafts != target) | (allows_any == 0)
    num_correct = tl.min(tl.where(mismatch, lanes[None, :], B_PAD), axis=1)
    bonus = _pick(target, num_correct, lanes)
    tl.store(num_correct_ptr + req, num_correct.to(tl.int32), mask=req_ok)
    tl.store(bonus_ptr + req, bonus, mask=req_ok)
    # Error flag (spec_hal.verify.record_token_ids): every column, the root's included; the row is
    # the drafts' (cached); vocab < 0 when V is unknown (target token ids).
    cand = tl.load(cand_ptr + ids, mask=ok, other=-1).to(tl.int64)
    record_invalid(flag_ptr, flag_code, ok & ((cand < -1) | ((vocab >= 0) & (cand >= vocab))), ids)


# Counts a program sums per step of ``ragged_layout``'s prefix over the requests before its own.
RAGGED_PREFIX_BLOCK = tl.constexpr(1024)


@triton.jit
def ragged_layout(counts_ptr, req, req_ok, max_drafts, BLOCK_R: tl.constexpr, BONUS_ROWS: tl.constexpr):
    """(count, first row) (BLOCK_R,) int64 of a program's requests ``req`` (consecutive, from
    program_id(0) * BLOCK_R) in spec_hal.ragged's flat layout: the count clamped to [0,
    max_drafts] and the request's first flat row, the clamped counts (+ 1 each: BONUS_ROWS) of the
    requests before it summed (``spec_hal.ragged.chain_layout``). Each program sums the prefix
    itself, so the ragged ops launch no layout kernel (H200: that launch was 1.8-2.3 us of a
    8-15 us call); the prefix is at most bs counts, read from L2."""
    first_req = tl.program_id(0) * BLOCK_R
    before = tl.zeros([], dtype=tl.int64)  # rows of the requests before the program's first
    for first in range(0, first_req, RAGGED_PREFIX_BLOCK):
        index = first + tl.arange(0, RAGGED_PREFIX_BLOCK)
        ok = index < first_req
        counts = tl.minimum(tl.maximum(tl.load(counts_ptr + index, mask=ok, other=0).to(tl.int64), 0), max_drafts)
        before += tl.sum(tl.where(ok, counts + 1, 0) if BONUS_ROWS else counts, axis=0)
    count = tl.minimum(tl.maximum(tl.load(counts_ptr + req, mask=req_ok, other=0).to(tl.int64), 0), max_drafts)
    rows = count + 1 if BONUS_ROWS else count
    if BLOCK_R == 1:  # a GPU launch: a cumsum over one request kept an 8 B local frame (sm_90, Triton 3.6)
        start = before + tl.zeros_like(count)
    else:
        start = before + tl.cumsum(rows, axis=0) - rows
    return count, start


# The batch's sizes change with every step: specialising them (== 1, multiples of 16) would
# compile up to three variants for no gain (they bound lanes, never address vectors), and the
# draft-aligned ragged variant specialised at bs = 1 kept an 8-16 B local frame on sm_90 and
# sm_100 (Triton 3.9; 0 B unspecialised).
@triton.jit(do_not_specialize=["bs", "num_drafts", "total_rows"])
def _chain_sampling_kernel(draft_ids_ptr, draft_probs_ptr, stride_qb, stride_qn, stride_qv, probs_ptr, stride_pb, stride_pn, stride_pv,
                           coins_ptr, final_coins_ptr, predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, bs, steps, vocab,
                           sums_ptr, sums_width, counter_ptr, tiles_per_chunk, mask_ptr, index_ptr, num_masks, mask_width,
                           flag_ptr, flag_code, passed_ptr, counts_ptr, num_drafts, total_rows, bonus_ptr,
                           BLOCK_R: tl.constexpr, N_PAD: tl.constexpr, TILE_V: tl.constexpr, SUB: tl.constexpr, NB_PAD: tl.constexpr,
                           SPLIT: tl.constexpr, HAS_MASK: tl.constexpr, HAS_INDEX: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr,
                           COUNT_PASSED: tl.constexpr, RAGGED: tl.constexpr, BONUS: tl.constexpr, READ_AHEAD: tl.constexpr,
                           SCALAR_REDUCE: tl.constexpr):
    """RAGGED: the flat layout of spec_hal/ragged.py (``verify_chain_sampling_ragged``), read in
    place from the caller's draft counts (``ragged_layout``: c_b and r_b): request b's target row
    j is flat row r_b + j, its draft j flat index r_b - b + j (clamped into [0, T) as the
    reference's gather); lanes past c_b or past the flat end are the padded layout's padding
    (draft -1, coin 0, q = 0); a request whose root row is past the flat end emits token 0 (the
    reference's padded zero row). RAGGED and BONUS: the draft-aligned layout (T target rows):
    draft j and its target row are both flat index d_b + j, a chain is cut at the flat end, and a
    fully accepted chain ends with bonus[b] (no row is read for it). Otherwise (and for the error
    flag's index, b * S + j) the padded (bs, S) / (bs, S+1) layout. SCALAR_REDUCE (BLOCK_R = 1): the reductions over the lanes give
    scalars (``_lanes_reduce``: the AMD launches and the ragged ones)."""
    req = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    req_ok = req < bs
    lanes = tl.arange(0, N_PAD)  # step s (0-based) drafts x_{s+1}; node k of the chain
    step_ok = req_ok[:, None] & (lanes[None, :] < steps)
    req64 = req.to(tl.int64)
    padded = req64[:, None] * steps + lanes[None, :]  # the padded draft index
    if RAGGED:
        count, first_row = ragged_layout(counts_ptr, req, req_ok, steps, BLOCK_R, not BONUS)
        rows = first_row[:, None] + lanes[None, :]
        if BONUS:  # draft j is target row j's own flat index
            draft_at = tl.minimum(rows, num_drafts - 1)
            step_ok = step_ok & (lanes[None, :] < count[:, None]) & (rows < total_rows)
        else:
            draft_at = tl.minimum(tl.maximum(rows - req64[:, None], 0), num_drafts - 1)
            step_ok = step_ok & (lanes[None, :] < count[:, None]) & (rows + 1 < total_rows) & (draft_at >= 0)  # draft_at -1 only when T = 0
        p_rows = rows * stride_pn
        q_rows = draft_at * stride_qn
        mask_rows = rows
    else:
        draft_at = padded
        p_rows = req64[:, None] * stride_pb + lanes[None, :].to(tl.int64) * stride_pn
        q_rows = req64[:, None] * stride_qb + lanes[None, :].to(tl.int64) * stride_qn
        mask_rows = req64[:, None] * (steps + 1) + lanes[None, :]
    drafts = tl.load(draft_ids_ptr + draft_at, mask=step_ok, other=-1).to(tl.int64)
    draft_ok = step_ok & (drafts >= 0) & (drafts < vocab)
    record_invalid(flag_ptr, flag_code, (tl.program_id(1) == 0) & step_ok & ((drafts < -1) | (drafts >= vocab)),
                   padded)  # spec_hal.verify.record_token_ids
    p = _sanitize_probs(tl.load(probs_ptr + p_rows + drafts * stride_pv, mask=draft_ok, other=0.0))
    if HAS_MASK:  # the draft at step s is checked at target row s
        base, constrained = mask_row_base(index_ptr, mask_rows, step_ok, num_masks, mask_width, HAS_INDEX)
        p = tl.where(token_allowed(mask_ptr, base, constrained, drafts, draft_ok, mask_width), p, 0.0)
    if HAS_DRAFT_PROBS:
        q = _sanitize_probs(tl.load(draft_probs_ptr + q_rows + drafts * stride_qv, mask=draft_ok, other=0.0))
    else:  # a deterministic draft: q is one-hot at the drafted token
        q = tl.where(draft_ok, 1.0, 0.0)
    coins = _sanitize_coins(tl.load(coins_ptr + draft_at, mask=step_ok, other=0.0))
    accepted = step_ok & (coins * q < p)
    num_correct = _lanes_reduce("min", tl.where(accepted, N_PAD, lanes[None, :]), SCALAR_REDUCE)
    num_correct = tl.minimum(num_correct, steps)

    use_q = req_ok & (num_correct < steps)
    if RAGGED:
        # The final row and the rejected draft's q row as reductions over the lanes (the first
        # lane not accepted; rows and draft_at grow with the lane): deriving them from the
        # reduced num_correct (an int32 -> int64 cast) broke RemoveLayoutConversions on Triton 3.6
        # in the masked variants. The valid lanes are a prefix, so lane num_correct holds a draft
        # (else q is the padding's 0) iff num_correct < their number.
        final_row = _lanes_reduce("min", tl.where(accepted, total_rows, rows), SCALAR_REDUCE)
        q_at = _lanes_reduce("min", tl.where(accepted | (lanes[None, :] >= steps), num_drafts - 1, draft_at), SCALAR_REDUCE)
        use_q = use_q & (num_correct < _lanes_reduce("sum", step_ok.to(tl.int32), SCALAR_REDUCE))
        # Past the flat end only when the root row is: the sums read the last row instead and the
        # final token is the padded zero row's 0.
        final_row = tl.minimum(final_row, total_rows - 1)
        p_row = final_row * stride_pn
        q_row = tl.maximum(q_at, 0) * stride_qn
        final_mask_row = final_row
    else:
        # num_correct again, reduced as int64 (the first lane not accepted; lanes >= S never are):
        # casting the int32 num_correct to int64 broke RemoveLayoutConversions on Triton 3.6 (sm_90,
        # masked with an int64 index, one-hot drafts). Rows are lane * stride after the reduction,
        # not reduced rows, so the loads keep the strides' divisibility (128-bit loads: a reduced
        # row address lost them: the padded chain sampling measured 2-3x slower on the H100).
        lane = _lanes_reduce("min", tl.where(accepted, N_PAD, lanes[None, :].to(tl.int64)), SCALAR_REDUCE)
        p_row = req64 * stride_pb + lane * stride_pn
        q_row = req64 * stride_qb + tl.minimum(lane, steps - 1) * stride_qn
        final_mask_row = req64 * (steps + 1) + lane
    # The requests whose final token is sampled: all but a draft-aligned chain accepted whole
    # (BONUS: its bonus token is emitted, no row is read).
    sampled = use_q if BONUS else req_ok
    sums_base = req64 * (2 * sums_width)
    first_tile = tl.program_id(1) * tiles_per_chunk
    end_tile = tl.minimum(first_tile + tiles_per_chunk, tl.cdiv(vocab, TILE_V))
    final_base, final_constrained = mask_row_base(index_ptr, final_mask_row, req_ok & HAS_MASK, num_masks, mask_width, HAS_INDEX)
    PIECE: tl.constexpr = SUB  # without draft probabilities the crossing block is compared with the one rejected draft
    if HAS_DRAFT_PROBS:  # residual max(0, p - q)
        rejected_tokens = tl.full([BLOCK_R, N_PAD], -1, dtype=tl.int64)
        rejected_q = rejected_tokens
    else:  # residual of a one-hot q: the target row without the rejected draft (its p, masked, quantised)
        # One lane at most is rejected: (R, 1), not N_PAD lanes, through the tile loop and the final token.
        rejected_lane = (lanes[None, :] == num_correct[:, None]) & use_q[:, None] & draft_ok
        rejected_tokens = _lanes_reduce("max", tl.where(rejected_lane, drafts, -1), SCALAR_REDUCE)[:, None]
        rejected_q = _lanes_reduce("sum", tl.where(rejected_lane, _quantize(p), 0), SCALAR_REDUCE)[:, None]
    # The final row's mask words at clamped addresses (masks.tile_words_clamped): with the walk's
    # per-word predicate, ptxas left some masked specs waiting on the loads' operands (with draft
    # probabilities at N_PAD 4 and V 151936: 1.6x the unmasked time on the H200). Of the two
    # forms, each kind takes the one measured faster (BENCHMARKS.md, thirty-fifth and thirty-sixth
    # sessions).
    _block_sums(probs_ptr, p_row, stride_pv, draft_probs_ptr, q_row, stride_qv, use_q, sampled, rejected_tokens, rejected_q,
                sums_ptr, sums_base, sums_width, vocab, first_tile, end_tile, mask_ptr, final_base, final_constrained, mask_width,
                BLOCK_R, TILE_V, SUB, HAS_DRAFT_PROBS, not HAS_DRAFT_PROBS, HAS_MASK, READ_AHEAD, not HAS_DRAFT_PROBS,
                "row" if HAS_DRAFT_PROBS else "none")
    if _finishing(counter_ptr, req, req_ok, SPLIT):
        final_coin = _sanitize_coins(tl.load(final_coins_ptr + req, mask=req_ok, other=0.0))
        final = _sample_from_sums(probs_ptr, p_row, stride_pv, draft_probs_ptr, q_row, stride_qv, use_q, sampled, rejected_tokens,
                                  rejected_q, final_coin, sums_ptr, sums_base, sums_width, vocab, mask_ptr, final_base, final_constrained,
                                  mask_width, SUB, NB_PAD, PIECE, HAS_DRAFT_PROBS, not HAS_DRAFT_PROBS, HAS_MASK, SCALAR_REDUCE,
                                  not HAS_DRAFT_PROBS)
        if BONUS:
            final = tl.where(sampled, final, tl.load(bonus_ptr + req, mask=req_ok, other=0).to(tl.int64))
        elif RAGGED:
            final = tl.where(first_row < total_rows, final, 0)
        nodes = steps + 1
        node_ok = req_ok[:, None] & (lanes[None, :] < nodes)
        predict = tl.where(lanes[None, :] < num_correct[:, None], drafts, tl.where(lanes[None, :] == num_correct[:, None], final[:, None], -1))
        tl.store(predict_ptr + req64[:, None] * nodes + lanes[None, :], predict.to(tl.int32), mask=node_ok)
        accept = tl.where(lanes[None, :] <= num_correct[:, None], req64[:, None] * nodes + lanes[None, :], -1)
        tl.store(accept_ptr + req64[:, None] * nodes + lanes[None, :], accept.to(tl.int32), mask=node_ok)
        tl.store(num_correct_ptr + req, num_correct, mask=req_ok)
        tl.store(accept_lens_ptr + req, num_correct + 1, mask=req_ok)
        if COUNT_PASSED:  # every step's own test, past the first rejection too (passed_counts)
            tl.store(passed_ptr + req, _lanes_reduce("sum", accepted.to(tl.int32), SCALAR_REDUCE), mask=req_ok)


# ----------------------------------------------------------------------------------------------
# launch configs


@dataclass(frozen=True)
class ArgmaxLaunch:
    block: int
    warps: int


@dataclass(frozen=True)
class WalkLaunch:
    """The greedy walks (tree and chain): grid (cdiv(bs, requests),)."""
    requests: int  # BLOCK_R: requests per program
    warps: int


# Programs per SM/CU the sampling walks' vocabulary split aims at (sampling_launch). NVIDIA: 3
# (H100, same run, identical verdicts: verify_sampling bs 64 V 151936 20.2-21.4 us against
# 22.7-23.5 at 2; other sizes within 4%), never more than 4, the programs of 128 threads that
# stay resident at 128 registers a thread. Most unit-stride walks compile to 128 or fewer on
# sm_90 (compile matrix, Triton 3.6 and 3.9); the masked ragged chain variants take 144-155 with
# Triton 3.6, where 3 stay resident: still one wave at 3 per SM. AMD keeps 2: no AMD GPU here
# can measure it.
SAMPLING_PROGRAMS_PER_SM = {"nvidia": 3, "amd": 2}
SAMPLING_RESIDENT_PER_SM = {"nvidia": 4}
SAMPLING_STRIDED_MAXNREG = 128  # SamplingLaunch.read_flags
# From this many tiles per program, and in trees of at most DERIVE_RESIDUAL_MAX_NODES nodes (padded),
# the tree walk's vocabulary pass derives the residual's block sums at the end
# (SamplingLaunch.derive_residual; see sampling_launch).
DERIVE_RESIDUAL_FROM_TILES = 4
DERIVE_RESIDUAL_MAX_NODES = 32


@dataclass(frozen=True)
class SamplingLaunch:
    """The sampling kernels: grid (cdiv(bs, requests), chunks). Chunk c sums the quantised row
    over tiles [c * tiles_per_chunk, (c + 1) * tiles_per_chunk) of ``tile_v`` ids, per ``sub``-wide
    block, into a (bs, 2 * sums_width) int64 scratch buffer."""
    requests: int  # BLOCK_R
    warps: int
    tile_v: int
    sub: int
    num_tiles: int
    tiles_per_chunk: int
    read_ahead: bool  # READ_AHEAD: a tile's loads issued while the previous tile is reduced
    scalar_reduce: bool  # SCALAR_REDUCE of _chain_sampling_kernel (GPUs): lane reductions as scalars (_lanes_reduce)
    strided_maxnreg: Optional[int] = None  # see read_flags
    # DERIVE_RESIDUAL of _sampling_walk_kernel: the tile loop stores the target's block sums alone
    # and the last program derives the residual's (see sampling_launch)
    derive_residual: bool = False

    def read_flags(self, unit_stride: bool) -> tuple[dict, dict]:
        """(READ_AHEAD, compile options) of a ``_sampling_walk_kernel`` or ``_chain_sampling_kernel``
        launch whose probability rows have unit vocabulary strides or not. With ``strided_maxnreg``
        (NVIDIA) a strided launch reads no tile ahead, under that register cap: with the read-ahead
        or without the cap, the strided (generic) specs kept 8-160 B local frames on sm_80, sm_90 or
        sm_100 with Triton 3.6 or 3.9 (the chain kernel), 16-24 B on sm_90 and sm_100 with 3.6 (the
        tree walk at N_PAD 8; offline compiles); a strided row is a gather the read-ahead does
        little for."""
        if unit_stride or self.strided_maxnreg is None:
            return {"READ_AHEAD": self.read_ahead}, {}
        return {"READ_AHEAD": False}, {"maxnreg": self.strided_maxnreg}

    @property
    def chunks(self) -> int:
        return cdiv(self.num_tiles, self.tiles_per_chunk)

    @property
    def sums_width(self) -> int:
        return self.num_tiles * (self.tile_v // self.sub)

    @property
    def nb_pad(self) -> int:
        # At least SUB wide: tl.cumsum over a narrower row than a thread's vector does not lower
        # on Triton 3.6.
        return max(_pow2(self.sums_width), self.sub)


@functools.lru_cache(maxsize=1024)  # a pure function of an int, called several times per launch
def _pow2(count: int) -> int:
    return max(next_power_of_2(max(count, 1)), 2)


@functools.lru_cache(maxsize=4096)  # a pure function of ints: computed once per shape
def argmax_launch(target: KernelTarget, rows: int, vocab: int) -> ArgmaxLaunch:
    """Tile width of the fused argmax: narrower tiles when the batch is too small to fill every SM.
    NVIDIA: 256 threads per program (8 warps), 16 fp32 per thread. AMD: 512 (8 wave64 warps),
    8 fp32 per lane: at 16 per lane the token_bitmask variants spilled SGPRs (the compile matrix)."""
    if target.vendor == "interpreter":
        return ArgmaxLaunch(block=min(max(next_power_of_2(vocab), 16), 65536), warps=1)
    block = 2048 if rows * cdiv(vocab, 4096) < 4 * target.multiprocessors else 4096
    threads = 512 if target.vendor == "amd" else 256
    return ArgmaxLaunch(block=min(block, max(next_power_of_2(vocab), 128)), warps=target.warps(threads))


@functools.lru_cache(maxsize=4096)  # a pure function of ints: computed once per shape
def walk_launch(target: KernelTarget, bs: int, nodes: int) -> WalkLaunch:
    """One request per program and one warp (wave64 on AMD) on a GPU: the walk is a chain of
    dependent scalar loads. The interpreter batches thousands of requests per program so that
    large batches stay vectorised."""
    if target.vendor == "interpreter":
        return WalkLaunch(requests=min(_pow2(bs), 32768 // _pow2(nodes)), warps=1)
    return WalkLaunch(requests=1, warps=1)


@functools.lru_cache(maxsize=4096)  # a pure function of ints: computed once per shape
def chain_launch(target: KernelTarget, bs: int, width: int, tiles: int) -> WalkLaunch:
    """The chain prefix match holds a (width, tiles) matrix of tile maxima: about 8 per thread,
    up to 256 threads on NVIDIA; on AMD about 4 per lane, up to 512 lanes (8 per lane and 256
    lanes spilled SGPRs at width 64 with Triton 3.9, and with a token_bitmask with 3.6)."""
    walk = walk_launch(target, bs, width)
    if target.vendor == "interpreter":
        return walk
    per_thread, max_threads = (4, 512) if target.vendor == "amd" else (8, 256)
    threads = min(max_threads, max(target.warp_size, _pow2(width) * _pow2(tiles) // per_thread))
    return WalkLaunch(requests=walk.requests, warps=target.warps(threads))


@functools.lru_cache(maxsize=4096)  # a pure function of ints: computed once per shape
def sampling_launch(target: KernelTarget, bs: int, nodes: int, vocab: int) -> SamplingLaunch:
    """128 threads per program on NVIDIA (4 warps: the walk's per-step reductions stay short), 256
    on AMD (4 wave64 warps); the vocabulary is split into chunks until the grid has about
    ``SAMPLING_PROGRAMS_PER_SM`` programs per SM/CU, so bs = 1 reads its row with dozens of
    programs. With one request a program the chain kernel reduces its lanes to scalars: on AMD
    (without it Triton 3.6 spilled SGPRs in the masked variants on gfx942) and on NVIDIA (H200,
    with a one-hot chain's residual sums derived in the final pass: 0.62-1.02x the time of the
    (R,) form in 60 padded unit-stride cells, ragged 0.49-0.99x). The interpreter uses 2 chunks
    whenever the row has 2 tiles (the split path is what the conformance suite checks there too)
    and keeps every tensor under its 2^20-element cap.

    ``derive_residual`` (the tree walk's DERIVE_RESIDUAL) on NVIDIA from DERIVE_RESIDUAL_FROM_TILES
    tiles a program in trees of up to DERIVE_RESIDUAL_MAX_NODES nodes, and always under the
    interpreter (so that CI runs that path; tests/test_verify_read_ahead.py runs both): the tile
    loop stores the target row's block sums alone, without comparing each tile's blocks with the
    rejected children and storing the residual's, and the last program takes the rejected
    children's quantised p off the sums. The tile loop lost 30 of 237 instructions and 2 of 4
    barriers (sm_90); on the H200, at bs 64-256 with 8-38 tiles a program, verify_sampling took
    0.88-0.94x the time unmasked and 0.80-0.88x masked (BENCHMARKS.md, thirty-eighth session).
    With fewer tiles the fixed cost at the end is not repaid (bs 64, V 32000, 3 tiles: 1.05x
    unmasked), nor in trees of 64 nodes, where the last program takes the children off one lane
    at a time over 64 lanes (bs 256, N 64, V 32000: 39.3 us against 24.7 stored per tile), so
    they keep the residual's sums per tile. AMD keeps them too: on gfx90a the derived form spilled
    2-4 registers in the masked specs with an index (offline, Triton 3.9 and 3.6), and no AMD GPU
    here can show a gain."""
    if target.vendor == "interpreter":
        sub = 16
        tile_v = max(32, next_power_of_2(cdiv(max(vocab, 1), 2)))
        num_tiles = cdiv(max(vocab, 1), tile_v)
        sums_pad = max(_pow2(num_tiles * tile_v // sub), sub)
        cap = 2**19
        requests = min(_pow2(bs), 32768 // _pow2(nodes), cap // sums_pad, cap // tile_v, cap // (tile_v // sub * _pow2(nodes)))
        return SamplingLaunch(requests=max(requests, 1), warps=1, tile_v=tile_v, sub=sub, num_tiles=num_tiles,
                              tiles_per_chunk=cdiv(num_tiles, 2), read_ahead=True, scalar_reduce=False, derive_residual=True)
    sub = 128
    programs = SAMPLING_PROGRAMS_PER_SM.get(target.vendor, 2) * target.multiprocessors
    # Tiles of 2048 ids (16 fp32 a thread on NVIDIA, 8 a lane on AMD). NVIDIA reads one tile ahead
    # where the rows have a unit vocabulary stride (read_flags): measured faster on the H100 than
    # 1024-id tiles read ahead (bs 64, N 8, V 151936: 23.4 vs 29.6 us unmasked, 29.9 vs 38.7
    # masked). AMD does not read ahead: it cost SGPR spills on gfx942 with Triton 3.6, and no AMD
    # GPU here can show a gain.
    nvidia = target.vendor == "nvidia"
    tile_v = min(2048, max(next_power_of_2(max(vocab, 1)), sub))
    num_tiles = cdiv(max(vocab, 1), tile_v)
    chunks = max(1, min(num_tiles, cdiv(programs, max(bs, 1))))
    if target.vendor in SAMPLING_RESIDENT_PER_SM:  # no partial second wave of chunks
        chunks = max(1, min(chunks, SAMPLING_RESIDENT_PER_SM[target.vendor] * target.multiprocessors // max(bs, 1)))
    # AMD: 16 strided loads a thread spill at 128. Never more threads than a tile has ids: 256 AMD
    # lanes over a 128-id tile (V <= 128) hold each value twice, and with Triton 3.6 the tree walk's
    # N_PAD 8 specs spilled 595-911 VGPRs on gfx90a and gfx950 (offline); at 128 lanes, none.
    threads = min(128 if nvidia else 256, tile_v)
    tiles_per_chunk = cdiv(num_tiles, chunks)
    return SamplingLaunch(requests=1, warps=target.warps(threads), tile_v=tile_v, sub=sub, num_tiles=num_tiles,
                          tiles_per_chunk=tiles_per_chunk, read_ahead=nvidia, scalar_reduce=True,
                          strided_maxnreg=SAMPLING_STRIDED_MAXNREG if nvidia else None,
                          derive_residual=nvidia and tiles_per_chunk >= DERIVE_RESIDUAL_FROM_TILES
                          and _pow2(nodes) <= DERIVE_RESIDUAL_MAX_NODES)


# ----------------------------------------------------------------------------------------------
# host functions


def _verdict_buffers(bs: int, nodes: int, width: int, device, out: Optional[Verdict]) -> Verdict:
    return out if out is not None else semantics.verdict_buffers(bs, nodes, width, device)


def _verdict_and_scratch(bs: int, nodes: int, width: int, device, out: Optional[Verdict], scratch: tuple) -> tuple[Verdict, Optional[list]]:
    """(a fresh Verdict and int32 scratch tensors of ``scratch`` elements each, from one
    allocation: host time, spec_hal.device_buffers), or (``out``, None): the launch then
    allocates its scratch itself. None too where no scratch is asked for."""
    if out is None:
        verdict, parts = semantics.verdict_with_scratch(bs, nodes, width, device, scratch)
        return verdict, parts or None
    return out, None


class MaskArgs:
    """A launch's mask arguments: ``args`` = (mask, index, num_masks, width) pointers/ints and
    ``flags`` = the two constexpr flags (HAS_MASK, HAS_INDEX). Without a mask the pointers are
    ``placeholder`` (never read). A plain class with two slots: built on every verify call, where
    a frozen dataclass's ``__init__`` and properties cost microseconds."""

    __slots__ = ("args", "flags")

    def __init__(self, args: tuple, flags: dict):
        self.args = args
        self.flags = flags  # shared: callers only unpack it (**flags copies)

    @classmethod
    def of(cls, token_bitmask: Optional[torch.Tensor], bitmask_index: Optional[torch.Tensor], placeholder: torch.Tensor) -> "MaskArgs":
        # A mask of no rows constrains no row (spec_hal.masks.mask_rows): launched as no mask, so
        # that no kernel reads it (masks.tile_words_clamped "none" reads row 0 of a real mask).
        if token_bitmask is None or token_bitmask.shape[0] == 0:
            return cls((placeholder, placeholder, 0, 0), _MASK_FLAGS[False, False])
        mask = token_bitmask.contiguous()
        index = bitmask_index.contiguous() if bitmask_index is not None else mask
        rows, width = mask.shape
        return cls((mask, index, rows, width), _MASK_FLAGS[True, bitmask_index is not None])


_MASK_FLAGS = {(mask, index): {"HAS_MASK": mask, "HAS_INDEX": index} for mask in (False, True) for index in (False, True)}


def argmax_tiles_per_row(target_predict: torch.Tensor, target: KernelTarget) -> int:
    """Tiles of the tile argmax per row of (..., V) target logits; 0 for token ids."""
    if not target_predict.dtype.is_floating_point:
        return 0
    vocab = target_predict.shape[-1]
    return cdiv(vocab, argmax_launch(target, target_predict.numel() // max(vocab, 1), vocab).block)


def _argmax_tiles(logits: torch.Tensor, target: KernelTarget, masks: Optional[MaskArgs] = None, scratch: Optional[list] = None):
    """Launch the tile argmax over (rows, V) logits; returns (tile_max, tile_id, num_tiles).
    ``scratch``: two int32 tensors of rows * argmax_tiles_per_row elements to hold them (fresh
    buffers if None)."""
    rows, vocab = logits.shape
    config = argmax_launch(target, rows, vocab)
    num_tiles = cdiv(vocab, config.block)
    if scratch is None:
        tile_max = torch.empty((rows, num_tiles), dtype=torch.float32, device=logits.device)
        tile_id = torch.empty((rows, num_tiles), dtype=torch.int32, device=logits.device)
    else:
        tile_max, tile_id = scratch[0].view(torch.float32), scratch[1]
    masks = masks or MaskArgs.of(None, None, tile_max)
    _argmax_tile_kernel[(rows, num_tiles)](logits, logits.stride(0), logits.stride(1), vocab, tile_max, tile_id, num_tiles, *masks.args,
                                           BLOCK=config.block, **masks.flags, num_warps=config.warps)
    return tile_max, tile_id, num_tiles


def _target_source(target_predict: torch.Tensor, target: KernelTarget, masks: Optional[MaskArgs] = None, scratch: Optional[list] = None):
    """(ids or placeholder, tile_max, tile_id, num_tiles, from_logits) for the walk kernels
    (``scratch``: as _argmax_tiles')."""
    if target_predict.dtype.is_floating_point:
        if target_predict.dim() == 3:  # (bs, N, V) logits: the (bs*N, V) rows (a view when possible)
            target_predict = target_predict.flatten(0, 1)
        tile_max, tile_id, num_tiles = _argmax_tiles(target_predict, target, masks, scratch)
        return tile_max, tile_max, tile_id, num_tiles, True
    # The walks index token ids with unit stride; (bs*N,) ids (the usual call) need no reshape.
    ids = (target_predict if target_predict.dim() == 1 else target_predict.reshape(-1)).contiguous()
    return ids, ids, ids, 1, False


def final_token_scratch_sizes(bs: int, config: SamplingLaunch) -> tuple[int, int]:
    """int32 elements of the final-token scratch: block sums (bs, 2 * sums_width) int64, and arrival
    counters (bs,) when the vocabulary is split."""
    return bs * 4 * config.sums_width, bs if config.chunks > 1 else 0


def _final_token_scratch(bs: int, config: SamplingLaunch, device, parts: Optional[list], *,
                         walk_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(block sums int64, arrival counters int32 zeroed; the sums buffer stands in when there is no
    split): over the two int32 ``parts`` of final_token_scratch_sizes, or fresh buffers if None.
    ``walk_only``: a launch that reads neither (WALK_ONLY, no split) gets them unzeroed: no fill."""
    if parts is None:
        parts = int32_parts(final_token_scratch_sizes(bs, config), device)
    sums = parts[0].view(torch.int64)
    if config.chunks == 1:
        return sums, sums
    return sums, parts[1] if walk_only else parts[1].zero_()


def _probs_strides(probs: torch.Tensor, rows: int) -> tuple[int, int, int]:
    """(request, row, vocabulary) strides of (bs, rows, V) or (bs*rows, V) probabilities."""
    if probs.dim() == 3:
        return probs.stride(0), probs.stride(1), probs.stride(2)
    return probs.stride(0) * rows, probs.stride(0), probs.stride(1)


# The error-flag codes of each op's first argument (the kernels add ARGUMENT_STEP for the others).
_GREEDY_CODE = error_flag.code("verify_greedy", "candidates")
_SAMPLING_CODE = error_flag.code("verify_sampling", "candidates")
_CHAIN_CODE = error_flag.code("verify_chain", "candidates")
_CHAIN_SAMPLING_CODE = error_flag.code("verify_chain_sampling", "draft_ids")


def _vocab_or_unknown(target_predict: torch.Tensor) -> int:
    """V of target logits, -1 for token ids (the greedy kernels then record only ids < -1)."""
    return target_predict.shape[-1] if target_predict.dtype.is_floating_point else -1


def verify_greedy(tree: DraftTree, candidates: torch.Tensor, target_predict: torch.Tensor, *, token_bitmask: Optional[torch.Tensor] = None,
                  bitmask_index: Optional[torch.Tensor] = None, out: Optional[Verdict] = None, target: KernelTarget) -> Verdict:
    """Triton provider of ``verify_greedy`` (arguments validated by the caller; see spec_hal.verify)."""
    bs, nodes = candidates.shape
    width = tree.num_steps + 1
    tiles = argmax_tiles_per_row(target_predict, target) * bs * nodes  # 0 for ids: no scratch
    out, scratch = _verdict_and_scratch(bs, nodes, width, candidates.device, out, (tiles, tiles) if tiles else ())
    if bs == 0:
        return out
    masks = MaskArgs.of(token_bitmask, bitmask_index, out.predict)
    ids, tile_max, tile_id, num_tiles, from_logits = _target_source(target_predict, target, masks, scratch)
    config = walk_launch(target, bs, nodes)
    _greedy_walk_kernel[(cdiv(bs, config.requests),)](
        tree.retrieve_next_token.contiguous(), tree.retrieve_next_sibling.contiguous(), candidates.contiguous(), ids, tile_max, tile_id, num_tiles,
        out.predict, out.accept_index, out.num_correct, out.accept_lens, bs, nodes, tree.num_steps, _vocab_or_unknown(target_predict),
        error_flag.flag(candidates.device), _GREEDY_CODE,
        BLOCK_R=config.requests, N_PAD=_pow2(nodes), W_PAD=_pow2(width), TILES_PAD=_pow2(num_tiles), FROM_LOGITS=from_logits,
        num_warps=config.warps,
    )
    return out


def verify_sampling(tree: DraftTree, candidates: torch.Tensor, target_probs: torch.Tensor, coins: torch.Tensor, final_coins: torch.Tensor,
                    *, threshold_single: float = 1.0, threshold_acc: float = 1.0, token_bitmask: Optional[torch.Tensor] = None,
                    bitmask_index: Optional[torch.Tensor] = None, out: Optional[Verdict] = None, target: KernelTarget,
                    record_as_chain: bool = False, walk_only: bool = False) -> Verdict:
    """Triton provider of ``verify_sampling`` (arguments validated by the caller; see spec_hal.verify).
    ``record_as_chain``: the tree is a chain whose nodes 1.. are the drafts of a
    ``verify_chain_sampling`` call; invalid ids are recorded as that op's ``draft_ids``.
    ``walk_only``: the walk without the final token (the kernel's WALK_ONLY): it reads the
    probabilities at the candidates alone, and predict is -1 at each request's final node."""
    bs, nodes = candidates.shape
    width = tree.num_steps + 1
    vocab = target_probs.shape[-1]
    config = sampling_launch(target, bs, nodes, vocab)
    out, scratch = _verdict_and_scratch(bs, nodes, width, candidates.device, out, final_token_scratch_sizes(bs, config))
    if bs == 0:
        return out
    stride_b, stride_n, stride_v = _probs_strides(target_probs, nodes)
    flags, options = config.read_flags(stride_v == 1)
    sums, counters = _final_token_scratch(bs, config, candidates.device, scratch, walk_only=walk_only)
    masks = MaskArgs.of(token_bitmask, bitmask_index, out.predict)
    _sampling_walk_kernel[(cdiv(bs, config.requests), 1 if walk_only else config.chunks)](
        tree.retrieve_next_token.contiguous(), tree.retrieve_next_sibling.contiguous(), candidates.contiguous(),
        target_probs, stride_b, stride_n, stride_v, coins.contiguous(), final_coins.contiguous(), float(threshold_single), float(threshold_acc),
        out.predict, out.accept_index, out.num_correct, out.accept_lens, bs, nodes, tree.num_steps, vocab,
        sums, config.sums_width, counters, config.tiles_per_chunk, *masks.args, error_flag.flag(candidates.device),
        _CHAIN_SAMPLING_CODE if record_as_chain else _SAMPLING_CODE,
        int(record_as_chain),
        BLOCK_R=config.requests, N_PAD=_pow2(nodes), W_PAD=_pow2(width), TILE_V=config.tile_v, SUB=config.sub,
        NB_PAD=config.nb_pad, SPLIT=config.chunks > 1 and not walk_only, **flags, **masks.flags,
        WALK_ONLY=walk_only, DERIVE_RESIDUAL=config.derive_residual, num_warps=config.warps, **options,
    )
    return out


def verify_chain(candidates: torch.Tensor, target_predict: torch.Tensor, *, token_bitmask: Optional[torch.Tensor] = None,
                 bitmask_index: Optional[torch.Tensor] = None, out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                 target: KernelTarget) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton provider of ``verify_chain`` (arguments validated by the caller; see spec_hal.verify)."""
    bs, width = candidates.shape
    if out is None:
        out = (torch.empty(bs, dtype=torch.int32, device=candidates.device), torch.empty(bs, dtype=torch.int64, device=candidates.device))
    if bs == 0:
        return out[0], out[1]
    masks = MaskArgs.of(token_bitmask, bitmask_index, out[0])
    ids, tile_max, tile_id, num_tiles, from_logits = _target_source(target_predict, target, masks)
    config = chain_launch(target, bs, width, num_tiles)
    _chain_greedy_kernel[(cdiv(bs, config.requests),)](
        candidates.contiguous(), ids, tile_max, tile_id, num_tiles, out[0], out[1], bs, width, _vocab_or_unknown(target_predict),
        error_flag.flag(candidates.device), _CHAIN_CODE,
        BLOCK_R=config.requests, B_PAD=_pow2(width), TILES_PAD=_pow2(num_tiles), FROM_LOGITS=from_logits, num_warps=config.warps,
    )
    return out[0], out[1]


def verify_chain_sampling(draft_ids: torch.Tensor, draft_probs: Optional[torch.Tensor], target_probs: torch.Tensor, coins: torch.Tensor,
                          final_coins: torch.Tensor, *, token_bitmask: Optional[torch.Tensor] = None,
                          bitmask_index: Optional[torch.Tensor] = None, passed_counts: Optional[torch.Tensor] = None,
                          out: Optional[Verdict] = None, target: KernelTarget) -> Verdict:
    """Triton provider of ``verify_chain_sampling`` (arguments validated by the caller; see spec_hal.verify)."""
    bs, steps = draft_ids.shape
    config = sampling_launch(target, bs, steps + 1, target_probs.shape[-1])
    out, scratch = _verdict_and_scratch(bs, steps + 1, steps + 1, draft_ids.device, out, final_token_scratch_sizes(bs, config))
    if bs == 0:
        return out
    launch_chain_sampling(draft_ids.contiguous(), draft_probs, target_probs, coins.contiguous(), final_coins, steps=steps,
                          token_bitmask=token_bitmask, bitmask_index=bitmask_index, out=out, target=target, passed_counts=passed_counts,
                          scratch=scratch)
    return out


def launch_chain_sampling(draft_ids: torch.Tensor, draft_probs: Optional[torch.Tensor], target_probs: torch.Tensor, coins: torch.Tensor,
                          final_coins: torch.Tensor, *, steps: int, token_bitmask: Optional[torch.Tensor], bitmask_index: Optional[torch.Tensor],
                          out: Verdict, target: KernelTarget, ragged_counts: Optional[torch.Tensor] = None,
                          passed_counts: Optional[torch.Tensor] = None, bonus_tokens: Optional[torch.Tensor] = None,
                          scratch: Optional[list] = None) -> None:
    """Launch ``_chain_sampling_kernel`` into ``out`` (bs >= 1). Padded: draft_ids and coins (bs, S)
    contiguous, probabilities (bs, S(+1), V) or flat. ``ragged_counts``: the caller's draft counts
    (bs,) int32/int64 of spec_hal.ragged's flat layout, S = max_drafts (each program derives its
    requests' rows: ``ragged_layout``); draft_ids, coins (T,) and draft_probs (T, V) the flat tensors
    (stand-ins of the same dtype when T = 0: never read), target_probs (T + bs, V): nothing is
    gathered. ``bonus_tokens`` (bs,) with ``ragged_counts``: the draft-aligned layout, target_probs (T, V).
    ``scratch``: int32 tensors of final_token_scratch_sizes (fresh buffers if None)."""
    bs = final_coins.shape[0]
    nodes = steps + 1
    vocab = target_probs.shape[-1]
    has_draft_probs = draft_probs is not None
    if ragged_counts is None:
        q_strides = _probs_strides(draft_probs, steps) if has_draft_probs else (0, 0, 0)
        p_strides = _probs_strides(target_probs, nodes)
        counts = out.num_correct  # a placeholder, never read
        num_drafts, total_rows = bs * steps, bs * nodes
    else:
        counts = ragged_counts.contiguous()
        q_strides = (0, *draft_probs.stride()) if has_draft_probs else (0, 0, 0)
        p_strides = (0, *target_probs.stride())
        total_rows = target_probs.shape[0]  # T + bs, or T draft-aligned
        num_drafts = total_rows - bs if bonus_tokens is None else total_rows
    config = sampling_launch(target, bs, nodes, vocab)
    flags, options = config.read_flags(p_strides[-1] == 1 and (not has_draft_probs or q_strides[-1] == 1))
    sums, counters = _final_token_scratch(bs, config, final_coins.device, scratch)
    masks = MaskArgs.of(token_bitmask, bitmask_index, out.predict)
    _chain_sampling_kernel[(cdiv(bs, config.requests), config.chunks)](
        draft_ids, draft_probs if has_draft_probs else target_probs, *q_strides, target_probs, *p_strides,
        coins, final_coins.contiguous(), out.predict, out.accept_index, out.num_correct, out.accept_lens, bs, steps, vocab,
        sums, config.sums_width, counters, config.tiles_per_chunk, *masks.args, error_flag.flag(final_coins.device),
        _CHAIN_SAMPLING_CODE, out.num_correct if passed_counts is None else passed_counts,
        counts, num_drafts, total_rows, out.num_correct if bonus_tokens is None else bonus_tokens.contiguous(),
        BLOCK_R=config.requests, N_PAD=_pow2(nodes), TILE_V=config.tile_v, SUB=config.sub, NB_PAD=config.nb_pad,
        SPLIT=config.chunks > 1, **masks.flags, HAS_DRAFT_PROBS=has_draft_probs, COUNT_PASSED=passed_counts is not None,
        RAGGED=ragged_counts is not None, BONUS=bonus_tokens is not None, SCALAR_REDUCE=config.scalar_reduce, **flags,
        num_warps=config.warps, **options,
    )


PROVIDERS = {
    "verify_greedy": (verify_greedy, "kernels/verify.py: tile argmax (logits only) + register tree walk"),
    "verify_sampling": (verify_sampling, "kernels/verify.py: register tree walk + one-pass exact final-token sampling"),
    "verify_chain": (verify_chain, "kernels/verify.py: tile argmax (logits only) + prefix match"),
    "verify_chain_sampling": (verify_chain_sampling, "kernels/verify.py: rejection test + one-pass exact residual sampling"),
}


# ----------------------------------------------------------------------------------------------
# offline compilation and launch descriptions

_LOGIT_TYPES = ("fp32", "bf16", "fp16", "fp64")
# (bs, N, V, S): production shapes, an odd tiny one, and the conformance case whose runtime
# specialisation (unit vocabulary stride, V and row stride multiples of 16) once failed to lower.
_SHAPES = ((1, 4, 32000, 3), (64, 8, 151936, 5), (256, 32, 151936, 5), (3, 6, 8, 5), (4, 8, 16, 3), (1, 64, 151936, 6))


def chain_sampling_signature(drafts_type: str, counts_type: str, bonus_type: str = "*i32") -> dict:
    """``_chain_sampling_kernel``'s signature without the mask arguments and flags: draft ids of
    ``drafts_type``, draft counts of ``counts_type`` (an int32 placeholder padded; ragged, the caller's),
    bonus tokens of ``bonus_type`` (an int32 placeholder unless BONUS)."""
    return {"draft_ids_ptr": drafts_type, "draft_probs_ptr": "*fp32", "stride_qb": "i64", "stride_qn": "i64", "stride_qv": "i64",
            "probs_ptr": "*fp32", "stride_pb": "i64", "stride_pn": "i64", "stride_pv": "i64", "coins_ptr": "*fp32", "final_coins_ptr": "*fp32",
            "predict_ptr": "*i32", "accept_ptr": "*i32", "num_correct_ptr": "*i32", "accept_lens_ptr": "*i32", "bs": "i32", "steps": "i32",
            "vocab": "i32", "sums_ptr": "*i64", "sums_width": "i32", "counter_ptr": "*i32", "tiles_per_chunk": "i32", "flag_ptr": "*i64",
            "flag_code": "i64", "passed_ptr": "*i32", "counts_ptr": counts_type, "num_drafts": "i32", "total_rows": "i32",
            "bonus_ptr": bonus_type, "BLOCK_R": "constexpr", "N_PAD": "constexpr", "TILE_V": "constexpr", "SUB": "constexpr", "NB_PAD": "constexpr",
            "SPLIT": "constexpr", "HAS_DRAFT_PROBS": "constexpr", "COUNT_PASSED": "constexpr", "RAGGED": "constexpr", "BONUS": "constexpr",
            "READ_AHEAD": "constexpr", "SCALAR_REDUCE": "constexpr"}


def chain_sampling_constexprs(config: SamplingLaunch, nodes: int, ragged: bool = False, bonus: bool = False) -> dict:
    """The launch constexprs of ``launch_chain_sampling`` (without passed_counts) but HAS_DRAFT_PROBS and the mask flags."""
    return {"BLOCK_R": config.requests, "N_PAD": _pow2(nodes), "TILE_V": config.tile_v, "SUB": config.sub, "NB_PAD": config.nb_pad,
            "SPLIT": config.chunks > 1, "COUNT_PASSED": False, "RAGGED": ragged, "BONUS": bonus, "READ_AHEAD": config.read_ahead,
            "SCALAR_REDUCE": config.scalar_reduce}


def compile_specs(target: KernelTarget):
    """Every (kernel, signature, constexprs, num_warps[, attrs]) the host functions launch on
    ``target``: each launch generic (misaligned pointers) and as Triton specialises it at run time
    for contiguous inputs of each shape (``launch.runtime_specialized``: unit strides become
    constexprs, multiples of 16 get ``tt.divisibility``)."""
    specs = []

    def add_plain(kernel, signature, constexprs, num_warps, strided=({}, {}), **values):
        """The generic spec (``strided``: its constexprs and compile options, where a launch with
        non-unit strides changes them) and the runtime-specialised one."""
        specs.append((kernel, signature, {**constexprs, **strided[0]}, num_warps, None, strided[1]))
        specs.append(runtime_specialized(target, kernel, signature, constexprs, num_warps, values=values))

    def add(kernel, signature, constexprs, num_warps, *, placeholder="*i32", masked=False, extra=(), masked_extra=(), strided=({}, {}),
            **values):
        """The launch without a mask (mask pointers are the ``placeholder``), and with
        ``masked`` its token_bitmask variants (no index, int32 and int64 index); ``extra``:
        further constexpr variants of the unmasked launch, ``masked_extra`` of the masked ones."""
        variants = [(placeholder, placeholder, False, False)]
        if masked:
            variants += [("*i32", "*i32", True, False), ("*i32", "*i32", True, True), ("*i32", "*i64", True, True)]
        for mask_type, index_type, has_mask, has_index in variants:
            for extra_constexprs in ({},) + tuple(masked_extra if has_mask else extra):
                add_plain(kernel, {**signature, "mask_ptr": mask_type, "index_ptr": index_type, "num_masks": "i32", "mask_width": "i32",
                                   "HAS_MASK": "constexpr", "HAS_INDEX": "constexpr", **{name: "constexpr" for name in extra_constexprs}},
                          {**constexprs, "HAS_MASK": has_mask, "HAS_INDEX": has_index, **extra_constexprs}, num_warps, strided,
                          num_masks=values.get("bs", 1) * 8 if has_mask else 0, mask_width=4748 if has_mask else 0, **values)

    walk_links = {"next_token_ptr": "*i64", "next_sibling_ptr": "*i64", "cand_ptr": "*i64"}
    flag = {"flag_ptr": "*i64", "flag_code": "i64"}  # the error flag's two arguments
    verdict = {"predict_ptr": "*i32", "accept_ptr": "*i32", "num_correct_ptr": "*i32", "accept_lens_ptr": "*i32"}
    for bs, nodes, vocab, steps in _SHAPES:
        masked = (bs, nodes) == (64, 8)  # the token_bitmask variants at one production shape
        argmax = argmax_launch(target, bs * nodes, vocab)
        num_tiles = cdiv(vocab, argmax.block)
        for logit_type in _LOGIT_TYPES:
            add(_argmax_tile_kernel,
                {"logits_ptr": f"*{logit_type}", "stride_row": "i64", "stride_col": "i64", "vocab": "i32",
                 "tile_max_ptr": "*fp32", "tile_id_ptr": "*i32", "num_tiles": "i32", "BLOCK": "constexpr"},
                {"BLOCK": argmax.block}, argmax.warps, placeholder="*fp32", masked=masked, stride_row=vocab, stride_col=1, vocab=vocab,
                num_tiles=num_tiles)
        walk = walk_launch(target, bs, nodes)
        for from_logits, target_type in ((True, "*fp32"), (False, "*i64"), (False, "*i32")):
            tiles = num_tiles if from_logits else 1
            add_plain(_greedy_walk_kernel,
                {**walk_links, "target_ptr": target_type, "tile_max_ptr": "*fp32", "tile_id_ptr": "*i32", "num_tiles": "i32",
                 **verdict, "bs": "i32", "nodes": "i32", "num_steps": "i32", "vocab": "i32", **flag, "BLOCK_R": "constexpr",
                 "N_PAD": "constexpr", "W_PAD": "constexpr", "TILES_PAD": "constexpr", "FROM_LOGITS": "constexpr"},
                {"BLOCK_R": walk.requests, "N_PAD": _pow2(nodes), "W_PAD": _pow2(steps + 1), "TILES_PAD": _pow2(tiles), "FROM_LOGITS": from_logits},
                walk.warps, num_tiles=tiles, bs=bs, nodes=nodes, num_steps=steps, vocab=vocab if from_logits else -1,
                flag_code=_GREEDY_CODE)
            add_plain(_chain_greedy_kernel,
                {"cand_ptr": "*i64", "target_ptr": target_type, "tile_max_ptr": "*fp32", "tile_id_ptr": "*i32", "num_tiles": "i32",
                 "num_correct_ptr": "*i32", "bonus_ptr": "*i64", "bs": "i32", "width": "i32", "vocab": "i32", **flag,
                 "BLOCK_R": "constexpr", "B_PAD": "constexpr", "TILES_PAD": "constexpr", "FROM_LOGITS": "constexpr"},
                {"BLOCK_R": walk.requests, "B_PAD": _pow2(nodes), "TILES_PAD": _pow2(tiles), "FROM_LOGITS": from_logits},
                chain_launch(target, bs, nodes, tiles).warps,
                num_tiles=tiles, bs=bs, width=nodes, vocab=vocab if from_logits else -1, flag_code=_CHAIN_CODE)
        sampling = sampling_launch(target, bs, nodes, vocab)
        final = {"sums_ptr": "*i64", "sums_width": "i32", "counter_ptr": "*i32", "tiles_per_chunk": "i32"}
        final_values = {"sums_width": sampling.sums_width, "tiles_per_chunk": sampling.tiles_per_chunk}
        final_constexprs = {"TILE_V": sampling.tile_v, "SUB": sampling.sub, "NB_PAD": sampling.nb_pad, "SPLIT": sampling.chunks > 1,
                            "READ_AHEAD": sampling.read_ahead}
        # NVIDIA launches both residual forms (by tiles per chunk): the masked variants, compiled at one
        # shape, are compiled in the other form too (the unmasked ones take both across the shapes)
        residual_forms = ({"DERIVE_RESIDUAL": not sampling.derive_residual},) if target.vendor == "nvidia" else ()
        add(_sampling_walk_kernel,
            {**walk_links, "probs_ptr": "*fp32", "stride_pb": "i64", "stride_pn": "i64", "stride_pv": "i64",
             "coins_ptr": "*fp32", "final_coins_ptr": "*fp32", "threshold_single": "fp32", "threshold_acc": "fp32",
             **verdict, "bs": "i32", "nodes": "i32", "num_steps": "i32", "vocab": "i32", **final, **flag, "chain_shift": "i32",
             "BLOCK_R": "constexpr", "N_PAD": "constexpr", "W_PAD": "constexpr", **{name: "constexpr" for name in final_constexprs},
             "WALK_ONLY": "constexpr", "DERIVE_RESIDUAL": "constexpr"},
            {"BLOCK_R": sampling.requests, "N_PAD": _pow2(nodes), "W_PAD": _pow2(steps + 1), **final_constexprs, "WALK_ONLY": False,
             "DERIVE_RESIDUAL": sampling.derive_residual},
            sampling.warps, masked=masked, extra=({"WALK_ONLY": True, "SPLIT": False},), masked_extra=residual_forms,
            strided=sampling.read_flags(False), stride_pb=nodes * vocab, stride_pn=vocab, stride_pv=1, bs=bs, nodes=nodes, num_steps=steps,
            vocab=vocab, **final_values, flag_code=_SAMPLING_CODE, chain_shift=0)
        chain_steps = nodes - 1
        # passed_counts (spec_hal.compat.flashinfer's accepted count) at the two masked/production shapes
        add(_chain_sampling_kernel, chain_sampling_signature("*i64", "*i32"), {**chain_sampling_constexprs(sampling, nodes), "HAS_DRAFT_PROBS": True},
            sampling.warps, masked=masked, masked_extra=({"HAS_DRAFT_PROBS": False},), extra=(({"HAS_DRAFT_PROBS": False},) if masked else ())
            + (({"COUNT_PASSED": True},) if (bs, nodes) in ((1, 4), (64, 8)) else ()), strided=sampling.read_flags(False), stride_qb=chain_steps * vocab, stride_qn=vocab,
            stride_qv=1, stride_pb=nodes * vocab, stride_pn=vocab, stride_pv=1, bs=bs, steps=chain_steps, vocab=vocab, **final_values,
            flag_code=_CHAIN_SAMPLING_CODE, num_drafts=bs * chain_steps, total_rows=bs * nodes)
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    lines = []
    for bs, nodes, vocab, _ in _SHAPES[:3]:
        argmax = argmax_launch(target, bs * nodes, vocab)
        walk = walk_launch(target, bs, nodes)
        sampling = sampling_launch(target, bs, nodes, vocab)
        lines.append(f"verify bs={bs} N={nodes} V={vocab}: argmax BLOCK={argmax.block} x {cdiv(vocab, argmax.block)} tiles/row, "
                     f"{argmax.warps} warps; walk {walk.requests} req/program, {walk.warps} warps; sampling {sampling.chunks} chunks x "
                     f"{sampling.tiles_per_chunk} tiles of {sampling.tile_v} (blocks of {sampling.sub}), {sampling.warps} warps x "
                     f"{target.warp_size} lanes")
    return lines
