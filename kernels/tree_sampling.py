"""Triton kernel of ``verify_tree_sampling`` (family ``verify``: tree verification with the true
draft distribution, multi-draft recursive rejection sampling). Semantics and every rounding:
``spec_hal.verify.verify_tree_sampling``. Its own module because its residual is not a function
of one vocabulary pass as in kernels/verify.py's sampling kernels.

``_tree_sampling_kernel`` (grid: request blocks) walks the tree like ``_sampling_walk_kernel``
(first child, then siblings, stopping at the first acceptance). At the last accepted node j the
residual after k rejections is, token by token,

    r_0 = quantise(p_j),  r_{i+1} = floor(max(0, r_i / max(m_i, 1) - q_j / 2^40) * 2^40),

with m_i = sum(r_i): every entry depends only on its own p_j, q_j and the scalar masses m_0 ..
m_{i-1}. So no (bs, V) residual buffer exists: the kernel keeps the masses of the current level
(at most N, in registers) and recomputes r_k tile by tile from the p and q rows whenever it needs
it. Testing child k costs one pass over the row (m_k) plus one gathered load (r_k(x), q(x));
the final token costs two passes (totals, then the inverse CDF's count of running sums <= t).
Integer sums are exact and every float64 step is one correctly rounded IEEE operation, so the
result is bit-identical to the reference on every backend. The per-id division r_i / m_i is
computed without dividing, from the correctly rounded reciprocal of m_i (``_reciprocal``, once
per rejection, by Newton steps and an exact rounding check) and two fmas (``_divide``: the same
correctly rounded quotient). No fp64 division is left on GPU targets.

``BLOCK_R`` requests share a program: 1 on a GPU, many under the interpreter (the statistical
test runs 5 x 10^4 requests).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from spec_hal import error_flag
from spec_hal.types import DraftTree, Verdict

from .launch import MAX_THREAD_REGISTERS, SM_REGISTERS, KernelTarget, cdiv, next_power_of_2, runtime_specialized
from .masks import mask_row_base, tile_words, token_allowed, words_allowed
from .verify import (QUANT_SCALE, MaskArgs, _link, _pow2, _probs_strides, _quantize, _record_walk_values, _sanitize_coins,
                     _sanitize_probs, _store_verdict, _verdict_buffers)

INV_QUANT_SCALE = tl.constexpr(2.0**-40)
# bits(1 / b) ~ SEED - bits(b) for a float64 b: |1 - b y| <= 0.051 (the classic bit-level guess)
RECIPROCAL_SEED = tl.constexpr(0x7FDE623822FC16E6)


# ----------------------------------------------------------------------------------------------
# device helpers


@triton.jit
def _quantized_rows(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, cols, ok, p_ok):
    """(quantised target p, quantised draft q) int64 at token ids ``cols`` (R, L) of each request's
    rows (``p_base``/``q_base`` (R,) element offsets); q is 0 where not ``ok``, p where not
    ``p_ok`` (``ok`` and allowed by the row's mask: token_allowed). The walk's gathered token;
    the passes over a row load through ``_tile_p_loads`` and ``_tile_q_loads``."""
    cols = cols.to(tl.int64)
    p = _sanitize_probs(tl.load(probs_ptr + p_base[:, None] + cols * stride_pv, mask=p_ok, other=0.0))
    q = _sanitize_probs(tl.load(q_ptr + q_base[:, None] + cols * stride_qv, mask=ok, other=0.0))
    return _quantize(p), _quantize(q)


@triton.jit
def _divisor(mass):
    """The float64 divisor of a residual of mass ``mass`` (int64): max(mass, 1), as the reference."""
    return tl.maximum(mass.to(tl.float64), 1.0)


@triton.jit
def _reciprocal(b, FMA_DIVIDE: tl.constexpr):
    """1 / b correctly rounded (float64, b >= 1), with no division under FMA_DIVIDE: a bit-level
    guess, four Newton steps (|1 - b y| 0.051 -> 2.6e-3 -> 6.5e-6 -> 4.2e-11 -> 1.1e-16, within an
    ulp), then twice the nearer of y and its neighbour towards 1 / b, compared by their exact
    remainders 1 - b y (one fma each: exact within a couple of ulps). tests/test_exact_division.py
    checks it against ``1 / b``. A division here would be ptxas's fp64 subroutine call, which
    kept an 8-16 B local frame in some variants."""
    if FMA_DIVIDE:
        y = (-b.to(tl.int64, bitcast=True) + RECIPROCAL_SEED).to(tl.float64, bitcast=True)  # tensor first: the interpreter
        for _ in tl.static_range(4):
            y = tl.fma(tl.fma(-b, y, 1.0), y, y)
        for _ in tl.static_range(2):
            remainder = tl.fma(-b, y, 1.0)
            neighbour = (y.to(tl.int64, bitcast=True) + tl.where(remainder > 0, 1, -1)).to(tl.float64, bitcast=True)
            y = tl.where(tl.abs(tl.fma(-b, neighbour, 1.0)) < tl.abs(remainder), neighbour, y)
    else:
        y = 1.0 / b
    return y


@triton.jit
def _divide(a, b, b_reciprocal, FMA_DIVIDE: tl.constexpr):
    """a / b correctly rounded (float64). FMA_DIVIDE: from ``b_reciprocal`` = 1 / b correctly
    rounded, with no division: Markstein's correction (q = a y; the remainder a - b q is exact in
    one fma; q + r y rounds to the quotient), exact whenever nothing overflows or underflows: here
    0 <= a <= 2^40 and 1 <= b <= 2^63 (tests/test_exact_division.py checks it against ``/``). A
    correctly rounded fp64 division is a subroutine call on NVIDIA: inlined per id at four call
    sites it kept a 16-24 B local frame. Without FMA_DIVIDE (an interpreter whose fma rounds
    twice: ``fma_rounds_once``) it divides."""
    if FMA_DIVIDE:
        q = a * b_reciprocal
        remainder = tl.fma(-b, q, a)
        quotient = tl.fma(remainder, b_reciprocal, q)
    else:
        quotient = a / b
    return quotient


@triton.jit
def _quantized_fraction(q):
    """quantise(q) / 2^40 (float32, q sanitised into [0, 1]), exactly: q 2^40 and the product
    with 2^-40 are scalings by powers of two, the floor is exact, and the result is a multiple of
    2^-40 with at most 24 significant bits (q 2^40 of a q >= 2^-16 is an integer already). Half the
    registers of the float64 it becomes inside the residual loop: that loop's live state is what a
    tile read ahead has to fit beside."""
    return tl.floor(q * QUANT_SCALE) * INV_QUANT_SCALE


@triton.jit
def _residual(p_int, q_fraction, divisors, reciprocals, rejections, lanes, max_rejections, FMA_DIVIDE: tl.constexpr):
    """r_k (R, L) int64 from r_0 = ``p_int`` after each request's ``rejections`` (R,) rejections,
    rejection i dividing by ``divisors[:, i]`` (R, N_PAD; ``reciprocals[:, i]``: 1 / it) and
    subtracting ``q_fraction`` (``_quantized_fraction`` of q): the reference's float64 update,
    elementwise."""
    r = p_int
    for i in range(0, max_rejections):
        at_i = lanes[None, :] == i
        # Both picks in one lane reduction (joined as (R, N_PAD, 2)): a reduction per pick per tile
        # took 1.35x the time of the per-id divisions they replace at N = 64 on the H100.
        picked = tl.sum(tl.where(at_i[:, :, None], tl.join(divisors, reciprocals), 0.0), axis=1)
        divisor, reciprocal = tl.split(picked)
        active = (i < rejections)[:, None]
        # Rows past their rejections divide 0 (their slot holds 1 or a stale divisor: r * 2^40 could overflow the cast).
        quotient = _divide(tl.where(active, r.to(tl.float64), 0.0), divisor[:, None], reciprocal[:, None], FMA_DIVIDE)
        update = (tl.maximum(quotient - q_fraction.to(tl.float64), 0.0) * QUANT_SCALE).to(tl.int64)
        r = tl.where(active, update, r)
    return r


@triton.jit
def _tile_p_loads(probs_ptr, p_base, stride_pv, rows_ok, tile, vocab, mask_ptr, mask_base, constrained, mask_width,
                  TILE_V: tl.constexpr, HAS_MASK: tl.constexpr):
    """The raw target loads of ``tile`` of each request's row, nothing past the vocabulary: p (R,
    TILE_V) float32 under the row's bounds alone (so that they can be vectorised), and, HAS_MASK,
    the tile's mask as ``_tile_values`` takes it: its words (R, TILE_V // 32) (masks.tile_words),
    or narrower than a word (the interpreter's tiles of tiny vocabularies) each id's allowed flag
    (masks.token_allowed). Apart from ``_tile_values`` so that a pass can issue them a tile ahead."""
    cols = tile * TILE_V + tl.arange(0, TILE_V)
    ok = rows_ok[:, None] & (cols[None, :] < vocab)
    p = tl.load(probs_ptr + p_base[:, None] + cols[None, :].to(tl.int64) * stride_pv, mask=ok, other=0.0)
    mask = ok  # a placeholder the compiler drops without a mask
    if HAS_MASK:
        if TILE_V >= 32:
            mask = tile_words(mask_ptr, mask_base, rows_ok & constrained, tile * TILE_V, mask_width, TILE_V)
        else:
            mask = token_allowed(mask_ptr, mask_base[:, None], constrained[:, None], cols[None, :], ok, mask_width)
    return p, mask


@triton.jit
def _tile_q_loads(q_ptr, q_base, stride_qv, rows_ok, tile, vocab, TILE_V: tl.constexpr):
    """The raw draft loads q (R, TILE_V) float32 of ``tile`` of each request's row, under the row's
    bounds."""
    cols = tile * TILE_V + tl.arange(0, TILE_V)
    ok = rows_ok[:, None] & (cols[None, :] < vocab)
    return tl.load(q_ptr + q_base[:, None] + cols[None, :].to(tl.int64) * stride_qv, mask=ok, other=0.0)


@triton.jit
def _tile_values(p, q, mask, TILE_V: tl.constexpr, HAS_MASK: tl.constexpr):
    """(quantised target p int64, ``_quantized_fraction`` of the draft q) (R, TILE_V) of a tile's
    raw loads (``_tile_p_loads``, ``_tile_q_loads``): p is 0 where the row's mask does not allow
    the id (no draft q is masked). The mask is applied after the load by a select, so that p's
    loads carry the row's bounds alone and stay 16-byte vectors (under the mask bits they were
    scalar: 0.78-0.92x the masked time on the H200, thirty-seventh session)."""
    if HAS_MASK:
        if TILE_V >= 32:
            p = tl.where(words_allowed(mask, TILE_V), p, 0.0)
        else:
            p = tl.where(mask, p, 0.0)
    return _quantize(_sanitize_probs(p)), _quantized_fraction(_sanitize_probs(q))


@triton.jit
def _row_pass(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, rows_ok, divisors, reciprocals, rejections, lanes, vocab, threshold,
              mask_ptr, mask_base, constrained, mask_width, BLOCK_R: tl.constexpr, TILE_V: tl.constexpr, HAS_MASK: tl.constexpr,
              FMA_DIVIDE: tl.constexpr, READ_AHEAD: tl.constexpr, COUNT: tl.constexpr):
    """One pass over each request's row: (sum of r_k, sum of r_0, and, COUNT, the number of ids
    whose inclusive running sum of r_k is <= ``threshold`` (R,)), each (R,) int64. READ_AHEAD: tile
    t + 1 is loaded before tile t is reduced (``TreeSamplingLaunch.read_ahead``)."""
    max_rejections = tl.max(tl.where(rows_ok, rejections, 0), axis=0)
    total_r = tl.zeros([BLOCK_R], dtype=tl.int64)
    total_p = tl.zeros([BLOCK_R], dtype=tl.int64)
    count = tl.zeros([BLOCK_R], dtype=tl.int64)
    if READ_AHEAD:
        p_next, mask_next = _tile_p_loads(probs_ptr, p_base, stride_pv, rows_ok, 0, vocab, mask_ptr, mask_base, constrained, mask_width,
                                          TILE_V, HAS_MASK)
    for t in range(0, tl.cdiv(vocab, TILE_V)):
        q = _tile_q_loads(q_ptr, q_base, stride_qv, rows_ok, t, vocab, TILE_V)
        if READ_AHEAD:
            # A pass is a chain of tile steps, one program a request: without the read-ahead each
            # step waited on its own loads. Only p and the mask words are read ahead: q too kept
            # 8-208 B local frames on sm_90 under the 255-register cap (offline, Triton 3.9).
            p, mask = p_next, mask_next
            p_next, mask_next = _tile_p_loads(probs_ptr, p_base, stride_pv, rows_ok, t + 1, vocab, mask_ptr, mask_base, constrained,
                                              mask_width, TILE_V, HAS_MASK)
        else:
            p, mask = _tile_p_loads(probs_ptr, p_base, stride_pv, rows_ok, t, vocab, mask_ptr, mask_base, constrained, mask_width,
                                    TILE_V, HAS_MASK)
        p_int, q_fraction = _tile_values(p, q, mask, TILE_V, HAS_MASK)
        r = _residual(p_int, q_fraction, divisors, reciprocals, rejections, lanes, max_rejections, FMA_DIVIDE)
        if COUNT:
            count += tl.sum(tl.where(tl.cumsum(r, axis=1) + total_r[:, None] <= threshold[:, None], 1, 0), axis=1)
        total_r += tl.sum(r, axis=1)
        total_p += tl.sum(p_int, axis=1)
    return total_r, total_p, count


@triton.jit
def _row_totals(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, rows_ok, divisors, reciprocals, rejections, lanes, vocab,
                mask_ptr, mask_base, constrained, mask_width, BLOCK_R: tl.constexpr, TILE_V: tl.constexpr, HAS_MASK: tl.constexpr,
                FMA_DIVIDE: tl.constexpr, READ_AHEAD: tl.constexpr):
    """(sum of r_k, sum of r_0) (R,) int64 over each request's row: one ``_row_pass``."""
    no_threshold = rejections  # read only by a counting pass
    total_r, total_p, _ = _row_pass(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, rows_ok, divisors, reciprocals, rejections,
                                    lanes, vocab, no_threshold, mask_ptr, mask_base, constrained, mask_width, BLOCK_R, TILE_V, HAS_MASK,
                                    FMA_DIVIDE, READ_AHEAD, False)
    return total_r, total_p


@triton.jit
def _inverse_cdf(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, rows_ok, divisors, reciprocals, rejections, lanes, vocab, total,
                 coin, mask_ptr, mask_base, constrained, mask_width, BLOCK_R: tl.constexpr, TILE_V: tl.constexpr, HAS_MASK: tl.constexpr,
                 FMA_DIVIDE: tl.constexpr, READ_AHEAD: tl.constexpr):
    """The id whose inclusive running sum of r_k first exceeds min(floor(u * total), total - 1),
    counted as the number of ids whose running sum is <= it; 0 where total = 0. (R,) int64."""
    threshold = tl.minimum((coin.to(tl.float64) * total.to(tl.float64)).to(tl.int64), total - 1)
    _, _, index = _row_pass(probs_ptr, p_base, stride_pv, q_ptr, q_base, stride_qv, rows_ok, divisors, reciprocals, rejections, lanes,
                            vocab, threshold, mask_ptr, mask_base, constrained, mask_width, BLOCK_R, TILE_V, HAS_MASK, FMA_DIVIDE,
                            READ_AHEAD, True)
    return tl.where(total > 0, index, 0)


# ----------------------------------------------------------------------------------------------
# kernel


@triton.jit
def _tree_sampling_kernel(next_token_ptr, next_sibling_ptr, cand_ptr, draft_probs_ptr, stride_qb, stride_qn, stride_qv,
                          probs_ptr, stride_pb, stride_pn, stride_pv, coins_ptr, final_coins_ptr,
                          predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, bs, nodes, num_steps, vocab,
                          mask_ptr, index_ptr, num_masks, mask_width,
                          BLOCK_R: tl.constexpr, N_PAD: tl.constexpr, W_PAD: tl.constexpr, TILE_V: tl.constexpr,
                          HAS_MASK: tl.constexpr, HAS_INDEX: tl.constexpr, FMA_DIVIDE: tl.constexpr, READ_AHEAD: tl.constexpr):
    req = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    req_ok = req < bs
    req64 = req.to(tl.int64)
    lanes = tl.arange(0, N_PAD)
    ok = req_ok[:, None] & (lanes[None, :] < nodes)
    block_base = req64 * nodes
    node_ids = block_base[:, None] + lanes[None, :]

    width_lanes = tl.arange(0, W_PAD)
    last = tl.zeros([BLOCK_R], dtype=tl.int32)
    num_correct = tl.zeros([BLOCK_R], dtype=tl.int32)
    on_path = tl.where(lanes[None, :] == 0, 1, tl.zeros([BLOCK_R, N_PAD], dtype=tl.int32))
    next_tokens = tl.full([BLOCK_R, N_PAD], -1, dtype=tl.int64)
    accept = tl.where(width_lanes[None, :] == 0, block_base[:, None], tl.full([BLOCK_R, W_PAD], -1, dtype=tl.int64))
    # Each rejection of this level divides the residual by its mass (_divisor), from its reciprocal
    # (_reciprocal, once per rejection); slots past a request's rejections are never read.
    divisors = tl.full([BLOCK_R, N_PAD], 1.0, dtype=tl.float64)
    reciprocals = tl.full([BLOCK_R, N_PAD], 1.0, dtype=tl.float64)
    rejections = tl.zeros([BLOCK_R], dtype=tl.int32)
    standing = req_ok
    level = tl.zeros([BLOCK_R], dtype=tl.int32)
    while tl.max(standing.to(tl.int32), axis=0) > 0:
        node = block_base + last
        descend = standing & (level < num_steps) & (level < nodes - 1)  # never more than N - 1 accepts
        rejections = tl.where(standing, 0, rejections)
        p_base = req64 * stride_pb + last.to(tl.int64) * stride_pn
        q_base = req64 * stride_qb + last.to(tl.int64) * stride_qn
        mask_base, constrained = mask_row_base(index_ptr, node, descend & HAS_MASK, num_masks, mask_width, HAS_INDEX)
        cur = _link(tl.load(next_token_ptr + node, mask=descend, other=-1).to(tl.int64), nodes).to(tl.int32)
        chosen = tl.full([BLOCK_R], -1, dtype=tl.int32)
        chosen_token = tl.full([BLOCK_R], -1, dtype=tl.int64)
        scanned = tl.zeros([BLOCK_R], dtype=tl.int32)
        while tl.max(cur, axis=0) >= 0:  # follow the child list to the first acceptance (at most N nodes)
            scanning = cur >= 0
            sibling = tl.load(next_sibling_ptr + block_base + cur, mask=scanning, other=-1).to(tl.int64)
            token = tl.load(cand_ptr + block_base + cur, mask=scanning, other=-1).to(tl.int64)
            in_vocab = scanning & (token >= 0) & (token < vocab)
            mass, _ = _row_totals(probs_ptr, p_base, stride_pv, draft_probs_ptr, q_base, stride_qv, scanning, divisors, reciprocals,
                                  rejections, lanes, vocab, mask_ptr, mask_base, constrained, mask_width, BLOCK_R, TILE_V, HAS_MASK,
                                  FMA_DIVIDE, READ_AHEAD)
            token_ok = in_vocab[:, None]
            p_x_ok = token_ok
            if HAS_MASK:
                p_x_ok = token_ok & token_allowed(mask_ptr, mask_base[:, None], constrained[:, None], token[:, None], token_ok, mask_width)
            p_x, q_x = _quantized_rows(probs_ptr, p_base, stride_pv, draft_probs_ptr, q_base, stride_qv, token[:, None], token_ok, p_x_ok)
            q_x_fraction = q_x.to(tl.float64) * INV_QUANT_SCALE  # exact: a power-of-two scale
            r_x = tl.sum(_residual(p_x, q_x_fraction, divisors, reciprocals, rejections, lanes,
                                   tl.max(tl.where(in_vocab, rejections, 0), axis=0), FMA_DIVIDE), axis=1)
            coin = _sanitize_coins(tl.load(coins_ptr + block_base + cur, mask=scanning, other=0.0)).to(tl.float64)
            # u * q(x) < r(x) / sum(r), in the reference's float64 operation order.
            hit = in_vocab & (coin * tl.sum(q_x, axis=1).to(tl.float64) * mass.to(tl.float64) < r_x.to(tl.float64) * QUANT_SCALE)
            chosen = tl.where(hit, cur, chosen)
            chosen_token = tl.where(hit, token, chosen_token)
            rejected = scanning & (hit == 0)
            recorded = (lanes[None, :] == rejections[:, None]) & rejected[:, None]
            divisor = _divisor(mass)
            divisors = tl.where(recorded, divisor[:, None], divisors)
            reciprocals = tl.where(recorded, _reciprocal(divisor, FMA_DIVIDE)[:, None], reciprocals)
            rejections += rejected.to(tl.int32)
            scanned += 1
            cur = tl.where(rejected & (scanned < nodes), _link(sibling, nodes).to(tl.int32), -1)
        standing = chosen >= 0
        next_tokens = tl.where((lanes[None, :] == last[:, None]) & standing[:, None], chosen_token[:, None], next_tokens)
        last = tl.where(standing, chosen, last)
        num_correct += standing.to(tl.int32)
        level += 1
        on_path = tl.where(lanes[None, :] == chosen[:, None], 1, on_path)
        accept = tl.where((width_lanes[None, :] == level[:, None]) & standing[:, None], block_base[:, None] + chosen[:, None], accept)

    # The final token: the residual left at the last node, else its target row, else id 0.
    p_base = req64 * stride_pb + last.to(tl.int64) * stride_pn
    q_base = req64 * stride_qb + last.to(tl.int64) * stride_qn
    mask_base, constrained = mask_row_base(index_ptr, block_base + last, req_ok & HAS_MASK, num_masks, mask_width, HAS_INDEX)
    total_r, total_p = _row_totals(probs_ptr, p_base, stride_pv, draft_probs_ptr, q_base, stride_qv, req_ok, divisors, reciprocals,
                                   rejections, lanes, vocab, mask_ptr, mask_base, constrained, mask_width, BLOCK_R, TILE_V, HAS_MASK,
                                   FMA_DIVIDE, READ_AHEAD)
    use_residual = total_r > 0
    final_coin = _sanitize_coins(tl.load(final_coins_ptr + req, mask=req_ok, other=0.0))
    final = _inverse_cdf(probs_ptr, p_base, stride_pv, draft_probs_ptr, q_base, stride_qv, req_ok, divisors, reciprocals,
                         tl.where(use_residual, rejections, 0), lanes, vocab, tl.where(use_residual, total_r, total_p), final_coin,
                         mask_ptr, mask_base, constrained, mask_width, BLOCK_R, TILE_V, HAS_MASK, FMA_DIVIDE, READ_AHEAD)
    next_tokens = tl.where(lanes[None, :] == last[:, None], final[:, None], next_tokens)
    predict = tl.where(on_path != 0, next_tokens, -1)
    _store_verdict(predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, predict, accept, num_correct,
                   req, req_ok, ok, node_ids, width_lanes, num_steps)


# AMD launches read one id a thread, so alignment gains their loads nothing, and the JIT's
# specialisation of a pointer there (on by default: 16-byte alignment and a 2 GiB range, so buffer
# ops) gives each base a 4-SGPR buffer descriptor. The masked variants then ran out of SGPRs and
# spilled 1-8 into VGPR lanes on gfx90a, gfx942 and gfx950 (offline compile matrix, Triton 3.9).
# This copy leaves the per-request arrays, the coins, the mask words and index and the Verdict
# outputs unspecialised (global loads and stores of 64-bit addresses): clean on gfx942 and gfx950,
# one SGPR spilled into a VGPR lane on gfx90a in the 64-bit-stride spec with an int64 index. The
# probability rows keep theirs. NVIDIA and the interpreter launch the kernel above, unchanged.
_TREE_SAMPLING_KERNEL_AMD = triton.jit(do_not_specialize=[
    "next_token_ptr", "next_sibling_ptr", "cand_ptr", "coins_ptr", "final_coins_ptr", "mask_ptr", "index_ptr", "predict_ptr",
    "accept_ptr", "num_correct_ptr", "accept_lens_ptr"])(_tree_sampling_kernel.fn)


@triton.jit
def _walk_records_kernel(next_token_ptr, next_sibling_ptr, cand_ptr, entries, nodes, vocab, flag_ptr, flag_code, BLOCK: tl.constexpr):
    """The walk's error-flag record (spec_hal.verify.record_walk_values) over BLOCK flat (request,
    node) entries of contiguous (bs, N) candidates and links a program. A launch of its own: in
    the walk kernel the record added register spills on gfx942 and gfx950 and local frames on
    sm_80; as the reference's torch ops it was about 30 small launches a call."""
    node_ids = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = node_ids < entries
    cand = tl.load(cand_ptr + node_ids, mask=ok, other=-1).to(tl.int64)
    _record_walk_values(flag_ptr, flag_code, next_token_ptr, next_sibling_ptr, cand, node_ids, node_ids, ok, nodes, vocab, 0)


RECORD_BLOCK = 1024  # (request, node) entries a program of _walk_records_kernel records


def _kernel_for(target: KernelTarget):
    """The kernel object a launch on ``target`` takes (both are module attributes, so
    ``install_launchers`` pins fp fusion off and installs the fast launcher on each)."""
    return _TREE_SAMPLING_KERNEL_AMD if target.vendor == "amd" else _tree_sampling_kernel


# ----------------------------------------------------------------------------------------------
# launch config and host function


def fma_rounds_once(target: KernelTarget) -> bool:
    """Whether ``tl.fma`` rounds once on ``target`` (``_divide``'s FMA_DIVIDE): always compiled;
    under the interpreter only where it has a float64 fma (Triton 3.9; 3.6 multiplies and adds in
    numpy, rounding twice)."""
    if target.vendor != "interpreter":
        return True
    from triton._C.libtriton import interpreter
    return hasattr(interpreter, "fma_fp64")


@dataclass(frozen=True)
class TreeSamplingLaunch:
    """Grid (cdiv(bs, requests),); each pass reads the vocabulary in ``tile_v``-wide tiles.
    ``options``: compile options of the launch (a register cap on sm_90 and newer)."""
    requests: int  # BLOCK_R
    warps: int
    tile_v: int
    read_ahead: bool  # READ_AHEAD: a pass loads tile t + 1 before it reduces tile t
    options: tuple = ()  # (name, value) pairs: hashable, as the frozen dataclass needs


# Ids of a tile each thread holds on NVIDIA. A pass over a row is a chain of tile steps, each
# waiting on its loads, so the number of steps sets the op's speed more than the threads do: on
# the H100 (Triton 3.6, fifteenth session) 16 ids a thread at 256 threads took 0.26-0.42x the time
# of the earlier one id a thread at 1024 (BENCHMARKS.md).
IDS_PER_THREAD = 16


def tree_sampling_launch(target: KernelTarget, bs: int, nodes: int, vocab: int) -> TreeSamplingLaunch:
    """One request per program on a GPU. NVIDIA: ``IDS_PER_THREAD`` ids a thread in each tile, 256
    threads on sm_90 and newer and 128 on sm_8x, under an explicit register cap (255). AMD: 256
    threads (4 wave64 warps), one id a thread.

    The widths are the fastest spill-free ones of the offline compile matrix. On sm_90, 512
    threads of 16 ids (0.84-1.0x this launch's time on the H100) kept local frames (64 and 144 B
    among them) at their 128-register cap with Triton 3.9, and 256 threads of 32 ids frames in 6
    of 14 specs at 255; 256 of 16 compile at 168-216 registers, clean with 3.9 and 3.6. Without an
    explicit cap Triton 3.6 chose too few registers for wide launches (32-64, with 24-56 B frames,
    fourteenth session). On sm_80 wider than 128 threads left 8-16 B frames; 128 of 16 ids
    compile clean under the cap (without one, ptxas stopped at 168 registers and kept a 24 B frame
    in the masked variants once their mask words came a tile at a time; not timed: no Ampere GPU
    here). On gfx942 tiles of 1024 or 4096 ids spilled in 6-11 of 14 specs. The interpreter batches
    requests so that a tile holds at most 2^17 elements, and reads a row in at least 2 tiles (the
    running sums across tiles are what the conformance suite checks there).

    ``read_ahead`` (each pass loads tile t + 1's p and mask words before it reduces tile t): on
    sm_90, where every spec compiles frame-free with it (Triton 3.6 and 3.9) and the H200 ran it at
    0.89-0.97x the time of the plain loop masked and 0.91-0.98x unmasked (BENCHMARKS.md,
    thirty-seventh session); and under the interpreter, so that CI runs that loop. Not on sm_80 or
    sm_100, where 1-2 masked specs kept 16-32 B frames with Triton 3.9, nor on AMD (one id a
    thread); q is never read ahead (with it, 8-208 B frames on sm_90)."""
    if target.vendor == "interpreter":
        tile_v = min(max(next_power_of_2(cdiv(max(vocab, 1), 2)), 8), 4096)
        requests = min(_pow2(bs), 32768 // _pow2(nodes), max(2**17 // tile_v, 1))
        return TreeSamplingLaunch(requests=requests, warps=1, tile_v=tile_v, read_ahead=True)
    if target.vendor != "nvidia":
        return TreeSamplingLaunch(requests=1, warps=target.warps(256), tile_v=256, read_ahead=False)
    threads = 128 if target.ampere_or_ada else 256
    return TreeSamplingLaunch(requests=1, warps=target.warps(threads), tile_v=threads * IDS_PER_THREAD, read_ahead=target.arch == "sm_90",
                              options=(("maxnreg", min(MAX_THREAD_REGISTERS, SM_REGISTERS // threads)),))


def verify_tree_sampling(tree: DraftTree, candidates: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                         coins: torch.Tensor, final_coins: torch.Tensor, *, token_bitmask: Optional[torch.Tensor] = None,
                         bitmask_index: Optional[torch.Tensor] = None, out: Optional[Verdict] = None, target: KernelTarget) -> Verdict:
    """Triton provider of ``verify_tree_sampling`` (arguments validated by the caller; see spec_hal.verify):
    the walk, and the error flag's record in a small launch of its own (``_walk_records_kernel``)."""
    bs, nodes = candidates.shape
    width = tree.num_steps + 1
    out = _verdict_buffers(bs, nodes, width, candidates.device, out)
    if bs == 0:
        return out
    vocab = target_probs.shape[-1]
    next_token, next_sibling, candidates = (tree.retrieve_next_token.contiguous(), tree.retrieve_next_sibling.contiguous(),
                                            candidates.contiguous())
    _walk_records_kernel[(cdiv(bs * nodes, RECORD_BLOCK),)](
        next_token, next_sibling, candidates, bs * nodes, nodes, vocab, error_flag.flag(candidates.device), _TREE_SAMPLING_CODE,
        BLOCK=RECORD_BLOCK, num_warps=1 if target.vendor == "interpreter" else 4)
    config = tree_sampling_launch(target, bs, nodes, vocab)
    masks = MaskArgs.of(token_bitmask, bitmask_index, out.predict)
    _kernel_for(target)[(cdiv(bs, config.requests),)](
        next_token, next_sibling, candidates,
        draft_probs, *_probs_strides(draft_probs, nodes), target_probs, *_probs_strides(target_probs, nodes),
        coins.contiguous(), final_coins.contiguous(), out.predict, out.accept_index, out.num_correct, out.accept_lens,
        bs, nodes, tree.num_steps, vocab, *masks.args,
        BLOCK_R=config.requests, N_PAD=_pow2(nodes), W_PAD=_pow2(width), TILE_V=config.tile_v, **masks.flags,
        FMA_DIVIDE=fma_rounds_once(target), READ_AHEAD=config.read_ahead, num_warps=config.warps, **dict(config.options),
    )
    return out


_TREE_SAMPLING_CODE = error_flag.code("verify_tree_sampling", "candidates")

PROVIDERS = {
    "verify_tree_sampling": (verify_tree_sampling,
                             "kernels/tree_sampling.py: tree walk + recursive rejection with the residual recomputed per tile, "
                             "after a launch that records bad candidates and links"),
}


# ----------------------------------------------------------------------------------------------
# offline compilation and launch descriptions

# (bs, N, V, S): production shapes (bs 256: past one program per SM on NVIDIA) and the conformance shapes.
_SHAPES = ((1, 8, 32000, 3), (64, 8, 151936, 5), (256, 8, 32000, 4), (16, 64, 151936, 6), (9, 16, 12, 5))


def compile_specs(target: KernelTarget):
    """Every launch of ``_tree_sampling_kernel``: generic and runtime-specialised (contiguous
    (bs, N, V) probabilities), with the mask variants at one production shape."""
    specs = []
    for cand_type in ("*i32", "*i64"):
        signature = {"next_token_ptr": "*i64", "next_sibling_ptr": "*i64", "cand_ptr": cand_type, "entries": "i32", "nodes": "i32",
                     "vocab": "i32", "flag_ptr": "*i64", "flag_code": "i64", "BLOCK": "constexpr"}
        specs.append((_walk_records_kernel, signature, {"BLOCK": RECORD_BLOCK}, 4))
        specs.append(runtime_specialized(target, _walk_records_kernel, signature, {"BLOCK": RECORD_BLOCK}, 4,
                                         values={"entries": 512, "nodes": 8, "vocab": 151936, "flag_code": _TREE_SAMPLING_CODE}))
    for bs, nodes, vocab, steps in _SHAPES:
        config = tree_sampling_launch(target, bs, nodes, vocab)
        variants = [("*i32", "*i32", False, False)]
        if (bs, nodes) == (64, 8):
            variants += [("*i32", "*i32", True, False), ("*i32", "*i32", True, True), ("*i32", "*i64", True, True)]
        for mask_type, index_type, has_mask, has_index in variants:
            signature = {"next_token_ptr": "*i64", "next_sibling_ptr": "*i64", "cand_ptr": "*i64", "draft_probs_ptr": "*fp32",
                         "stride_qb": "i64", "stride_qn": "i64", "stride_qv": "i64", "probs_ptr": "*fp32", "stride_pb": "i64",
                         "stride_pn": "i64", "stride_pv": "i64", "coins_ptr": "*fp32", "final_coins_ptr": "*fp32",
                         "predict_ptr": "*i32", "accept_ptr": "*i32", "num_correct_ptr": "*i32", "accept_lens_ptr": "*i32",
                         "bs": "i32", "nodes": "i32", "num_steps": "i32", "vocab": "i32", "mask_ptr": mask_type, "index_ptr": index_type,
                         "num_masks": "i32", "mask_width": "i32", "BLOCK_R": "constexpr", "N_PAD": "constexpr", "W_PAD": "constexpr",
                         "TILE_V": "constexpr", "HAS_MASK": "constexpr", "HAS_INDEX": "constexpr", "FMA_DIVIDE": "constexpr",
                         "READ_AHEAD": "constexpr"}
            constexprs = {"BLOCK_R": config.requests, "N_PAD": _pow2(nodes), "W_PAD": _pow2(steps + 1), "TILE_V": config.tile_v,
                          "HAS_MASK": has_mask, "HAS_INDEX": has_index, "FMA_DIVIDE": fma_rounds_once(target),
                          "READ_AHEAD": config.read_ahead}
            specs.append((_kernel_for(target), signature, constexprs, config.warps, {}, dict(config.options)))
            specs.append(runtime_specialized(target, _kernel_for(target), signature, constexprs, config.warps,
                                             values={"stride_qb": nodes * vocab, "stride_qn": vocab, "stride_qv": 1, "stride_pb": nodes * vocab,
                                                     "stride_pn": vocab, "stride_pv": 1, "bs": bs, "nodes": nodes, "num_steps": steps,
                                                     "vocab": vocab, "num_masks": bs * nodes if has_mask else 0,
                                                     "mask_width": (vocab + 31) // 32 if has_mask else 0})
                         + (dict(config.options),))
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    config = tree_sampling_launch(target, 64, 8, 151936)
    return [f"verify_tree_sampling bs=64 N=8 V=151936: {config.requests} req/program, {config.warps} warps, tiles of {config.tile_v}; "
            "one vocabulary pass per scanned child, two for the final token"]
