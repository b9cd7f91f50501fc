"""Triton kernels of family ``sampling``. Semantics (every rounding, tie and key): spec_hal/sampling.py.

* ``_process_kernel`` (grid: row blocks): logits rows to processed probabilities. Per row, passes
  over the vocabulary: max/argmax (and the raw log-sum-exp when logprobs are asked for); when a
  row of the block has top_p < 1 or 0 < top_k < V, the total weight and a 16-step bitwise search
  over levels that finds the top-p and the top-k cut levels in the same passes, one pass counting
  the ties at the top-k level and, only when the cut splits them, a ceil(log2 V)-step search for
  the last tied id kept; the kept total; the probabilities (about 21 passes with both masks). Every quantity the masks use
  is an exact integer (levels, weights, keys, int64 sums) or a single correctly rounded float
  operation, so the result is bit-identical to the reference.
* ``_hash_coins_kernel``: the counter-based coins (``hash(seed, offset, position, purpose)``),
  int64 arithmetic emulating uint32 exactly as the reference does.

The from-logits verify ops process every row (bs*N) with ``_process_kernel`` and then run the
``verify`` family's sampling walk kernels (kernels/verify.py) on the probabilities. (Processing
only the rows the walk visits, fused into the walk, is the planned fast path: not done yet.)

``BLOCK_R`` rows share a program: 1 on a GPU; many under the interpreter, so that the statistical
cases (thousands of rows) stay a few vectorised programs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

import spec_hal.sampling as semantics
from spec_hal.types import DraftTree, Verdict

from . import verify as verify_kernels
from .launch import KernelTarget, runtime_specialized, cdiv, next_power_of_2

FLT_MAX = tl.constexpr(3.4028234663852886e38)
NO_ID = tl.constexpr(2**31 - 1)
LEVEL_BITS = tl.constexpr(semantics.LEVEL_BITS)
LEVEL_MAX = tl.constexpr(semantics.LEVEL_MAX)
TOP_WEIGHT = tl.constexpr(2**semantics.WEIGHT_BITS)
LEVEL_MASK = tl.constexpr((1 << semantics.LEVEL_BITS) - 1)
ID_SCALE = tl.constexpr(1 << semantics.ID_BITS)
ID_LAST = tl.constexpr((1 << semantics.ID_BITS) - 1)
LEVEL_SEARCH_BITS = tl.constexpr(16)  # LEVEL_MAX < 2^16
KEEP_ALL_KEY = tl.constexpr(semantics.LEVEL_MAX * (1 << semantics.ID_BITS) + (1 << semantics.ID_BITS) - 1)


# ----------------------------------------------------------------------------------------------
# device helpers


@triton.jit
def _load_logits(logits_ptr, row_offsets, cols, ok, stride_col):
    """Sanitised float32 logits (NaN -> -inf, +inf -> FLT_MAX); -inf outside ``ok``."""
    x = tl.load(logits_ptr + row_offsets[:, None] + cols[None, :].to(tl.int64) * stride_col, mask=ok, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("-inf"), x)
    x = tl.minimum(x, FLT_MAX)
    return tl.where(ok, x, float("-inf"))


@triton.jit
def _levels(x, row_max, scale):
    """Step 3 levels (int64): 0 at the max, floor(min((m - x) * c, LEVEL_MAX)) elsewhere."""
    distance = row_max[:, None] - x
    scaled = distance * scale[:, None]
    level = tl.where(scaled < LEVEL_MAX, scaled, LEVEL_MAX)  # NaN -> LEVEL_MAX
    level = tl.where(distance == 0, 0.0, level)
    return level.to(tl.int64)


@triton.jit
def _weights(level, table_ptr):
    """2^39 * 2^(-level / 1024) from the exact table (int64; 0 from LEVEL_MAX on)."""
    mantissa = tl.load(table_ptr + (level & LEVEL_MASK))
    return mantissa >> (level >> LEVEL_BITS)


@triton.jit
def _kept_weights(x, cols, ok, row_max, argmax, scale, greedy, key_cut, level_cut, min_weight, table_ptr):
    """Steps 2-4: the kept weights (int64) of one vocabulary block."""
    level = _levels(x, row_max, scale)
    weight = _weights(level, table_ptr)
    rank_key = level * ID_SCALE + cols[None, :].to(tl.int64)
    keep = ok & (rank_key <= key_cut[:, None]) & (level <= level_cut[:, None]) & (weight >= min_weight[:, None])
    kept = tl.where(keep, weight, 0)
    return tl.where(greedy[:, None], tl.where(cols[None, :] == argmax[:, None], TOP_WEIGHT, 0), kept)


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
def _hash_coin(seed, offset, position, purpose):
    """The counter-based coin in [0, 1 - 2^-24] (float32) of int64 (seed, offset, position)."""
    h = tl.zeros_like(position) + 0x9E3779B9
    h = _fmix32(h ^ (seed & 0xFFFFFFFF))
    h = _fmix32(h ^ ((seed >> 32) & 0xFFFFFFFF))
    h = _fmix32(h ^ (offset & 0xFFFFFFFF))
    h = _fmix32(h ^ ((offset >> 32) & 0xFFFFFFFF))
    h = _fmix32(h ^ (position & 0xFFFFFFFF))
    h = _fmix32(h ^ purpose)
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)


# ----------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _process_kernel(logits_ptr, stride_row, stride_col, rows, vocab, id_bits, rows_per_request,
                    greedy_ptr, scale_ptr, top_k_ptr, top_p_ptr, min_weight_ptr, table_ptr, probs_ptr, lse_ptr,
                    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, WANT_LSE: tl.constexpr):
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = row < rows
    request = tl.where(row_ok, row // rows_per_request, 0)
    greedy = tl.load(greedy_ptr + request, mask=row_ok, other=1) != 0
    scale = tl.load(scale_ptr + request, mask=row_ok, other=1.0)
    top_k = tl.load(top_k_ptr + request, mask=row_ok, other=0)
    top_p = tl.load(top_p_ptr + request, mask=row_ok, other=1.0)
    min_weight = tl.load(min_weight_ptr + request, mask=row_ok, other=0)
    row_offsets = row.to(tl.int64) * stride_row
    num_blocks = tl.cdiv(vocab, BLOCK_V)

    # Pass 1: max, argmax (lowest id of the max) and, for raw logprobs, the online log-sum-exp.
    row_max = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    argmax = tl.zeros([BLOCK_R], dtype=tl.int32)
    sum_exp = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k in range(num_blocks):
        cols = k * BLOCK_V + tl.arange(0, BLOCK_V)
        ok = row_ok[:, None] & (cols[None, :] < vocab)
        x = _load_logits(logits_ptr, row_offsets, cols, ok, stride_col)
        block_max = tl.max(x, axis=1)
        block_arg = tl.min(tl.where(ok & (x == block_max[:, None]), cols[None, :], NO_ID), axis=1)
        argmax = tl.where(block_max > row_max, block_arg, argmax)
        new_max = tl.maximum(row_max, block_max)
        if WANT_LSE:
            finite = new_max > float("-inf")
            rescale = tl.where(finite & (row_max > float("-inf")), tl.exp(row_max - new_max), 0.0)
            block_sum = tl.sum(tl.where(finite[:, None], tl.exp(x - new_max[:, None]), 0.0), axis=1)
            sum_exp = sum_exp * rescale + block_sum
        row_max = new_max
    if WANT_LSE:
        lse = tl.where(row_max > float("-inf"), row_max + tl.log(sum_exp), float("-inf"))
        tl.store(lse_ptr + row, lse, mask=row_ok)

    # The cuts, by bitwise searches for the largest level L whose (monotone) predicate holds:
    # top-p's float64(mass of levels < L) < top_p * W, top-k's count(levels < L) < k. The two
    # searches share their passes over the row.
    use_top_p = row_ok & (greedy == 0) & (top_p < 1)
    use_top_k = row_ok & (greedy == 0) & (top_k > 0)
    level_cut = tl.full([BLOCK_R], LEVEL_MAX, dtype=tl.int64)
    key_cut = tl.full([BLOCK_R], KEEP_ALL_KEY, dtype=tl.int64)
    if tl.max((use_top_p | use_top_k).to(tl.int32), axis=0) > 0:
        total = tl.zeros([BLOCK_R], dtype=tl.int64)
        if tl.max(use_top_p.to(tl.int32), axis=0) > 0:
            for k in range(num_blocks):
                cols = k * BLOCK_V + tl.arange(0, BLOCK_V)
                ok = row_ok[:, None] & (cols[None, :] < vocab)
                x = _load_logits(logits_ptr, row_offsets, cols, ok, stride_col)
                total += tl.sum(tl.where(ok, _weights(_levels(x, row_max, scale), table_ptr), 0), axis=1)
        bound = top_p * total.to(tl.float64)
        cut_p = tl.zeros([BLOCK_R], dtype=tl.int64)
        cut_k = tl.zeros([BLOCK_R], dtype=tl.int64)
        below_k = tl.zeros([BLOCK_R], dtype=tl.int64)  # count(levels < cut_k)
        for step in range(LEVEL_SEARCH_BITS):
            bit = tl.full([BLOCK_R], 1, dtype=tl.int64) << (LEVEL_SEARCH_BITS - 1 - step)
            candidate_p = cut_p | bit
            candidate_k = cut_k | bit
            mass = tl.zeros([BLOCK_R], dtype=tl.int64)
            count = tl.zeros([BLOCK_R], dtype=tl.int64)
            for k in range(num_blocks):
                cols = k * BLOCK_V + tl.arange(0, BLOCK_V)
                ok = row_ok[:, None] & (cols[None, :] < vocab)
                x = _load_logits(logits_ptr, row_offsets, cols, ok, stride_col)
                level = _levels(x, row_max, scale)
                mass += tl.sum(tl.where(ok & (level < candidate_p[:, None]), _weights(level, table_ptr), 0), axis=1)
                count += tl.sum(tl.where(ok & (level < candidate_k[:, None]), 1, 0), axis=1).to(tl.int64)
            cut_p = tl.where((candidate_p <= LEVEL_MAX) & (mass.to(tl.float64) < bound), candidate_p, cut_p)
            move_k = (candidate_k <= LEVEL_MAX) & (count < top_k)
            below_k = tl.where(move_k, count, below_k)
            cut_k = tl.where(move_k, candidate_k, cut_k)
        level_cut = tl.where(use_top_p, cut_p, level_cut)
        # top-k keeps the levels below cut_k and the (k - below_k) lowest ids at cut_k.
        need = top_k - below_k
        tied = tl.zeros([BLOCK_R], dtype=tl.int64)
        if tl.max(use_top_k.to(tl.int32), axis=0) > 0:
            for k in range(num_blocks):
                cols = k * BLOCK_V + tl.arange(0, BLOCK_V)
                ok = row_ok[:, None] & (cols[None, :] < vocab)
                x = _load_logits(logits_ptr, row_offsets, cols, ok, stride_col)
                tied += tl.sum(tl.where(ok & (_levels(x, row_max, scale) == cut_k[:, None]), 1, 0), axis=1).to(tl.int64)
        id_cut = tl.full([BLOCK_R], ID_LAST, dtype=tl.int64)
        split_tie = use_top_k & (tied > need)
        if tl.max(split_tie.to(tl.int32), axis=0) > 0:
            # The largest id I with count(level == cut_k and id < I) < need: the need-th tied id.
            found = tl.zeros([BLOCK_R], dtype=tl.int64)
            for step in range(id_bits):
                candidate = found | (tl.full([BLOCK_R], 1, dtype=tl.int64) << (id_bits - 1 - step))
                count = tl.zeros([BLOCK_R], dtype=tl.int64)
                for k in range(num_blocks):
                    cols = k * BLOCK_V + tl.arange(0, BLOCK_V)
                    ok = row_ok[:, None] & (cols[None, :] < vocab)
                    x = _load_logits(logits_ptr, row_offsets, cols, ok, stride_col)
                    hit = ok & (_levels(x, row_max, scale) == cut_k[:, None]) & (cols[None, :].to(tl.int64) < candidate[:, None])
                    count += tl.sum(tl.where(hit, 1, 0), axis=1).to(tl.int64)
                found = tl.where(count < need, candidate, found)
            id_cut = tl.where(split_tie, found, id_cut)
        key_cut = tl.where(use_top_k, cut_k * ID_SCALE + id_cut, key_cut)

    # The kept total, then the probabilities (one correctly rounded float32 division each).
    kept_total = tl.zeros([BLOCK_R], dtype=tl.int64)
    for k in range(num_blocks):
        cols = k * BLOCK_V + tl.arange(0, BLOCK_V)
        ok = row_ok[:, None] & (cols[None, :] < vocab)
        x = _load_logits(logits_ptr, row_offsets, cols, ok, stride_col)
        kept = _kept_weights(x, cols, ok, row_max, argmax, scale, greedy, key_cut, level_cut, min_weight, table_ptr)
        kept_total += tl.sum(tl.where(ok, kept, 0), axis=1)
    denominator = tl.maximum(kept_total.to(tl.float32), 1.0)
    for k in range(num_blocks):
        cols = k * BLOCK_V + tl.arange(0, BLOCK_V)
        ok = row_ok[:, None] & (cols[None, :] < vocab)
        x = _load_logits(logits_ptr, row_offsets, cols, ok, stride_col)
        kept = _kept_weights(x, cols, ok, row_max, argmax, scale, greedy, key_cut, level_cut, min_weight, table_ptr)
        probs = tl.math.div_rn(kept.to(tl.float32), tl.zeros_like(kept.to(tl.float32)) + denominator[:, None])
        probs = tl.where(kept_total[:, None] > 0, probs, 0.0)
        tl.store(probs_ptr + row.to(tl.int64)[:, None] * vocab + cols[None, :], probs, mask=ok)


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


# ----------------------------------------------------------------------------------------------
# launch configs


@dataclass(frozen=True)
class ProcessLaunch:
    rows: int  # BLOCK_R
    block_v: int
    warps: int


def process_launch(target: KernelTarget, rows: int, vocab: int) -> ProcessLaunch:
    """One row per program, 256 threads over a 2048-wide block on a GPU; the interpreter
    vectorises many rows (tensors capped at 2^18 elements to bound its memory)."""
    if target.vendor == "interpreter":
        block_v = min(max(next_power_of_2(max(vocab, 1)), 16), 4096)
        block_r = max(1, min(next_power_of_2(max(rows, 1)), 2**18 // block_v))
        return ProcessLaunch(block_r, block_v, 1)
    return ProcessLaunch(1, min(2048, max(next_power_of_2(max(vocab, 1)), 128)), target.warps(256))


def _pow2(count: int) -> int:
    return max(next_power_of_2(max(count, 1)), 2)


# ----------------------------------------------------------------------------------------------
# host functions


def _process_rows(logits: torch.Tensor, params: semantics.RowParams, rows_per_request: int, *, want_lse: bool, target: KernelTarget,
                  out: Optional[torch.Tensor] = None):
    """(probs (R, V) float32, lse (R,) float32 or None) of 2-D logits (any strides)."""
    rows, vocab = logits.shape
    probs = out if out is not None else torch.empty((rows, vocab), dtype=torch.float32, device=logits.device)
    lse = torch.empty(rows if want_lse else 1, dtype=torch.float32, device=logits.device)
    if rows == 0:
        return probs, (lse if want_lse else None)
    config = process_launch(target, rows, vocab)
    _process_kernel[(cdiv(rows, config.rows),)](
        logits, logits.stride(0), logits.stride(1), rows, vocab, max(1, (vocab - 1).bit_length()), rows_per_request,
        params.greedy.to(torch.int8), params.scale, params.top_k, params.top_p, params.min_weight,
        semantics.exp2_table(logits.device), probs, lse,
        BLOCK_R=config.rows, BLOCK_V=config.block_v, WANT_LSE=want_lse, num_warps=config.warps,
    )
    return probs, (lse if want_lse else None)


def _coins(bs: int, width: int, device, *, seed, offset, generator, coins, final_coins, target: KernelTarget):
    """The call's coins: the hash kernel for seed/offset, else as the reference draws them."""
    if seed is None or bs == 0:
        return semantics.draw_coins(bs, width, device, seed=seed, offset=offset, generator=generator, coins=coins, final_coins=final_coins)
    accept = torch.empty((bs, width), dtype=torch.float32, device=device)
    final = torch.empty(bs, dtype=torch.float32, device=device)
    block_r = min(_pow2(bs), 1024) if target.vendor == "interpreter" else 128
    _hash_coins_kernel[(cdiv(bs, block_r),)](seed, offset, accept, final, bs, width, BLOCK_R=block_r, W_PAD=_pow2(width),
                                                    num_warps=1 if target.vendor == "interpreter" else target.warps(128))
    return accept, final


def process_logits(logits: torch.Tensor, *, temperature, top_k=0, top_p=1.0, min_p=0.0, out: Optional[torch.Tensor] = None,
                   target: KernelTarget) -> torch.Tensor:
    """Triton provider of ``process_logits`` (arguments validated by the caller)."""
    rows, vocab = logits.shape
    params = semantics.row_params(rows, vocab, logits.device, temperature, top_k, top_p, min_p)
    return _process_rows(logits, params, 1, want_lse=False, target=target, out=out)[0]


def verify_sampling_from_logits(tree: DraftTree, candidates: torch.Tensor, target_logits: torch.Tensor, *, temperature, top_k=0,
                                top_p=1.0, min_p=0.0, seed=None, offset=None, generator=None, coins=None, final_coins=None,
                                logprobs=None, top_logprobs=0, out: Optional[Verdict] = None, target: KernelTarget) -> semantics.SampledVerdict:
    """Triton provider of ``verify_sampling_from_logits`` (arguments validated by the caller)."""
    bs, nodes = candidates.shape
    vocab = target_logits.shape[-1]
    logits = target_logits.reshape(bs * nodes, vocab)
    params = semantics.row_params(bs, vocab, logits.device, temperature, top_k, top_p, min_p)
    probs, lse = _process_rows(logits, params, nodes, want_lse=logprobs == "raw", target=target)
    accept, final = _coins(bs, nodes, logits.device, seed=seed, offset=offset, generator=generator, coins=coins,
                           final_coins=final_coins, target=target)
    verdict = verify_kernels.verify_sampling(tree, candidates, probs, accept, final, out=out, target=target)
    return semantics.sampled_verdict(verdict, logprobs, top_logprobs, probs, logits, lse)


def _chain_tree(bs: int, steps: int, device) -> DraftTree:
    """A chain root -> x_1 -> ... -> x_S as a DraftTree (only the links matter to the walk)."""
    nodes = steps + 1
    lanes = torch.arange(nodes, dtype=torch.int64, device=device)
    next_token = torch.where(lanes < steps, lanes + 1, torch.full_like(lanes, -1)).expand(bs, nodes).contiguous()
    next_sibling = torch.full((bs, nodes), -1, dtype=torch.int64, device=device)
    index = torch.arange(bs * nodes, dtype=torch.int64, device=device).reshape(bs, nodes)
    return DraftTree(index.reshape(-1), index.reshape(-1), index, next_token, next_sibling, None, "qlen", steps)


def verify_chain_sampling_from_logits(draft_ids: torch.Tensor, draft_probs: Optional[torch.Tensor], target_logits: torch.Tensor, *,
                                      temperature, top_k=0, top_p=1.0, min_p=0.0, seed=None, offset=None, generator=None, coins=None,
                                      final_coins=None, logprobs=None, top_logprobs=0, out: Optional[Verdict] = None,
                                      target: KernelTarget) -> semantics.SampledVerdict:
    """Triton provider of ``verify_chain_sampling_from_logits`` (arguments validated by the caller).
    Without draft_probs the chain runs through the tree walk (a chain is a tree with one child
    per level; the accept test ``u < p(x)`` and the residual ``p`` without x are the same)."""
    bs, steps = draft_ids.shape
    nodes = steps + 1
    vocab = target_logits.shape[-1]
    logits = target_logits.reshape(bs * nodes, vocab)
    params = semantics.row_params(bs, vocab, logits.device, temperature, top_k, top_p, min_p)
    probs, lse = _process_rows(logits, params, nodes, want_lse=logprobs == "raw", target=target)
    accept, final = _coins(bs, steps, logits.device, seed=seed, offset=offset, generator=generator, coins=coins,
                           final_coins=final_coins, target=target)
    if draft_probs is None:
        candidates = torch.cat([torch.zeros(bs, 1, dtype=torch.int64, device=draft_ids.device), draft_ids.to(torch.int64)], dim=1)
        tree_coins = torch.cat([accept, torch.zeros(bs, 1, dtype=torch.float32, device=accept.device)], dim=1)
        verdict = verify_kernels.verify_sampling(_chain_tree(bs, steps, draft_ids.device), candidates, probs, tree_coins, final,
                                                 out=out, target=target)
    else:
        verdict = verify_kernels.verify_chain_sampling(draft_ids, draft_probs, probs, accept, final, out=out, target=target)
    return semantics.sampled_verdict(verdict, logprobs, top_logprobs, probs, logits, lse)


PROVIDERS = {
    "process_logits": (process_logits, "kernels/sampling.py: exact integer processing (levels, bitwise top-k/top-p searches)"),
    "verify_sampling_from_logits": (verify_sampling_from_logits,
                                    "kernels/sampling.py: processing of every row + hash coins + kernels/verify.py sampling walk"),
    "verify_chain_sampling_from_logits": (verify_chain_sampling_from_logits,
                                          "kernels/sampling.py: processing of every row + hash coins + kernels/verify.py chain/tree walk"),
}


# ----------------------------------------------------------------------------------------------
# offline compilation and launch descriptions

_LOGIT_TYPES = ("fp32", "bf16", "fp16")
_SHAPES = ((4, 32000), (1024, 151936), (6, 10))


def compile_specs(target: KernelTarget):
    """Every (kernel, signature, constexprs, num_warps[, attrs]) the host functions launch."""
    specs = []
    for rows, vocab in _SHAPES:
        config = process_launch(target, rows, vocab)
        for logit_type in _LOGIT_TYPES:
            for want_lse in (False, True):
                signature = {"logits_ptr": f"*{logit_type}", "stride_row": "i64", "stride_col": "i64", "rows": "i32", "vocab": "i32",
                             "id_bits": "i32", "rows_per_request": "i32", "greedy_ptr": "*i8", "scale_ptr": "*fp32", "top_k_ptr": "*i64",
                             "top_p_ptr": "*fp64", "min_weight_ptr": "*i64", "table_ptr": "*i64", "probs_ptr": "*fp32",
                             "lse_ptr": "*fp32", "BLOCK_R": "constexpr", "BLOCK_V": "constexpr", "WANT_LSE": "constexpr"}
                constexprs = {"BLOCK_R": config.rows, "BLOCK_V": config.block_v, "WANT_LSE": want_lse}
                specs.append((_process_kernel, signature, constexprs, config.warps))
                specs.append(runtime_specialized(target, _process_kernel, signature, constexprs, config.warps,
                                                 values={"stride_row": vocab, "stride_col": 1, "rows": rows, "vocab": vocab,
                                                         "id_bits": max(1, (vocab - 1).bit_length()), "rows_per_request": 8}))
    coin_signature = {"seed_ptr": "*i64", "offset_ptr": "*i64", "coins_ptr": "*fp32", "final_ptr": "*fp32", "bs": "i32", "width": "i32",
                      "BLOCK_R": "constexpr", "W_PAD": "constexpr"}
    for width in (4, 16):
        specs.append((_hash_coins_kernel, coin_signature, {"BLOCK_R": 128, "W_PAD": _pow2(width)}, target.warps(128)))
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    lines = []
    for rows, vocab in _SHAPES[:2]:
        config = process_launch(target, rows, vocab)
        lines.append(f"process rows={rows} V={vocab}: {config.rows} rows/program, BLOCK_V={config.block_v}, {config.warps} warps")
    return lines
