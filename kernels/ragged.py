"""Triton kernels of family ``ragged``. Semantics and layout: spec_hal/ragged.py.

``verify_chain_ragged``: the fused argmax (``kernels/verify.py``'s tile kernel, masks included)
runs over the T + bs flat target rows only, so a request with c_b drafts costs c_b + 1 rows, not
max_drafts + 1; then ``_ragged_chain_greedy_kernel`` (grid: request blocks) merges each request's
tiles at its rows r_b .. r_b + c_b, matches the drafts and writes the padded Verdict.

``verify_chain_sampling_ragged``: ``_ragged_chain_sampling_kernel`` (grid: request blocks x
vocabulary chunks) is ``_chain_sampling_kernel`` over each request's c_b drafts at its flat rows:
the rejection test reads draft j at flat index d_b + j and target row r_b + j, and the final token
is sampled from the rows r_b + num_correct (target) and d_b + num_correct (draft) with the same
split, exact block sums (``_block_sums`` / ``_finishing`` / ``_sample_from_sums`` of
kernels/verify.py). Padding never reaches memory: a lane past c_b or past the flat end reads as
the reference's padding (draft -1, probabilities 0).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from spec_hal.ragged import chain_layout
from spec_hal.types import Verdict

from .launch import KernelTarget, runtime_specialized, cdiv
from .masks import mask_row_base, token_allowed
from .verify import (MaskArgs, _block_sums, _final_token_scratch, _finishing, _merge_argmax, _pow2, _quantize, _sample_from_sums,
                     _sanitize_coins, _sanitize_probs, _target_source, _verdict_buffers, sampling_launch, walk_launch)


@triton.jit
def _ragged_chain_greedy_kernel(drafts_ptr, counts_ptr, starts_ptr, target_ptr, tile_max_ptr, tile_id_ptr, num_tiles, num_drafts, total_rows,
                                mask_ptr, index_ptr, num_masks, mask_width,
                                predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, bs, max_drafts,
                                BLOCK_R: tl.constexpr, N_PAD: tl.constexpr, TILES_PAD: tl.constexpr, FROM_LOGITS: tl.constexpr,
                                HAS_MASK: tl.constexpr, HAS_INDEX: tl.constexpr):
    req = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    req_ok = req < bs
    req64 = req.to(tl.int64)
    lanes = tl.arange(0, N_PAD)
    nodes = max_drafts + 1
    count = tl.load(counts_ptr + req, mask=req_ok, other=0).to(tl.int64)
    count = tl.minimum(tl.maximum(count, 0), max_drafts)
    start = tl.load(starts_ptr + req, mask=req_ok, other=0)
    rows = start[:, None] + lanes[None, :]
    row_ok = req_ok[:, None] & (lanes[None, :] <= count[:, None]) & (rows < total_rows)
    if FROM_LOGITS:
        target = tl.where(row_ok, _merge_argmax(tile_max_ptr, tile_id_ptr, rows, row_ok, num_tiles, TILES_PAD), -1)
    else:
        target = tl.load(target_ptr + rows, mask=row_ok, other=-1).to(tl.int64)
    # Draft j is checked against row j; it sits at flat index (row of draft j) - (b + 1), clamped
    # into [0, T) exactly as the reference's gather.
    draft_index = tl.minimum(tl.maximum(rows - req64[:, None], 0), num_drafts - 1)  # -1 only when T = 0
    next_ok = req_ok[:, None] & (lanes[None, :] + 1 <= count[:, None]) & (rows + 1 < total_rows) & (draft_index >= 0)
    drafts = tl.load(drafts_ptr + draft_index, mask=next_ok, other=-1).to(tl.int64)
    mismatch = (next_ok == 0) | (drafts != target) | (drafts < 0)
    if HAS_MASK:
        base, constrained = mask_row_base(index_ptr, rows, row_ok, num_masks, mask_width, HAS_INDEX)
        mismatch = mismatch | (token_allowed(mask_ptr, base, constrained, drafts, next_ok, mask_width) == 0)
    num_correct = tl.min(tl.where(mismatch, lanes[None, :], N_PAD), axis=1)
    node_ok = req_ok[:, None] & (lanes[None, :] < nodes)
    on_path = lanes[None, :] <= num_correct[:, None]
    out = req64[:, None] * nodes + lanes[None, :]
    tl.store(predict_ptr + out, tl.where(on_path, target, -1).to(tl.int32), mask=node_ok)
    tl.store(accept_ptr + out, tl.where(on_path, out, -1).to(tl.int32), mask=node_ok)
    tl.store(num_correct_ptr + req, num_correct, mask=req_ok)
    tl.store(accept_lens_ptr + req, num_correct + 1, mask=req_ok)


@triton.jit
def _ragged_chain_sampling_kernel(drafts_ptr, counts_ptr, starts_ptr, num_drafts, total_rows, draft_probs_ptr, stride_qn, stride_qv,
                                  probs_ptr, stride_pn, stride_pv, coins_ptr, final_coins_ptr,
                                  predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, bs, max_drafts, vocab,
                                  sums_ptr, sums_width, counter_ptr, tiles_per_chunk, mask_ptr, index_ptr, num_masks, mask_width,
                                  BLOCK_R: tl.constexpr, N_PAD: tl.constexpr, TILE_V: tl.constexpr, SUB: tl.constexpr,
                                  NB_PAD: tl.constexpr, SPLIT: tl.constexpr, HAS_MASK: tl.constexpr, HAS_INDEX: tl.constexpr,
                                  HAS_DRAFT_PROBS: tl.constexpr):
    req = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    req_ok = req < bs
    req64 = req.to(tl.int64)
    lanes = tl.arange(0, N_PAD)  # step s drafts x_{s+1} at target row r_b + s; node s of the padded chain
    count = tl.load(counts_ptr + req, mask=req_ok, other=0).to(tl.int64)
    count = tl.minimum(tl.maximum(count, 0), max_drafts)
    start = tl.load(starts_ptr + req, mask=req_ok, other=0)
    rows = start[:, None] + lanes[None, :]
    # Step s exists iff its draft does (s < c_b) and the row after it is inside the flat rows, as
    # the reference's padded gather; the draft sits at flat index rows - b, clamped like its gather.
    step_ok = req_ok[:, None] & (lanes[None, :] < count[:, None]) & (rows + 1 < total_rows)
    draft_index = tl.minimum(tl.maximum(rows - req64[:, None], 0), num_drafts - 1)
    drafts = tl.load(drafts_ptr + draft_index, mask=step_ok, other=-1).to(tl.int64)
    draft_ok = step_ok & (drafts >= 0) & (drafts < vocab)
    p = _sanitize_probs(tl.load(probs_ptr + rows * stride_pn + drafts * stride_pv, mask=draft_ok, other=0.0))
    if HAS_MASK:
        base, constrained = mask_row_base(index_ptr, rows, step_ok, num_masks, mask_width, HAS_INDEX)
        p = tl.where(token_allowed(mask_ptr, base, constrained, drafts, draft_ok, mask_width), p, 0.0)
    if HAS_DRAFT_PROBS:
        q = _sanitize_probs(tl.load(draft_probs_ptr + draft_index * stride_qn + drafts * stride_qv, mask=draft_ok, other=0.0))
    else:  # a deterministic draft: q is one-hot at the drafted token
        q = tl.where(draft_ok, 1.0, 0.0)
    coins = _sanitize_coins(tl.load(coins_ptr + draft_index, mask=step_ok, other=0.0))
    accepted = step_ok & (coins * q < p)
    num_correct = tl.min(tl.where(accepted, N_PAD, lanes[None, :]), axis=1)
    num_correct = tl.minimum(num_correct, count).to(tl.int32)

    # The final token: target row r_b + num_correct (padding past the flat end: p = 0, so id 0) and,
    # after a rejection, the rejected draft's q row d_b + num_correct.
    final_row = start + num_correct
    p_ok = req_ok & (final_row < total_rows)
    use_q = p_ok & (num_correct < count) & (final_row + 1 < total_rows)
    p_row = final_row * stride_pn
    q_row = tl.minimum(tl.maximum(final_row - req64, 0), tl.maximum(num_drafts - 1, 0)) * stride_qn
    sums_base = req64 * (2 * sums_width)
    first_tile = tl.program_id(1) * tiles_per_chunk
    end_tile = tl.minimum(first_tile + tiles_per_chunk, tl.cdiv(vocab, TILE_V))
    final_base, final_constrained = mask_row_base(index_ptr, final_row, p_ok & HAS_MASK, num_masks, mask_width, HAS_INDEX)
    PIECE: tl.constexpr = SUB if HAS_DRAFT_PROBS or SUB * N_PAD <= 2048 else 2048 // N_PAD
    if HAS_DRAFT_PROBS:  # residual max(0, p - q)
        rejected_tokens = tl.full([BLOCK_R, N_PAD], -1, dtype=tl.int64)
        rejected_q = rejected_tokens
    else:  # residual of a one-hot q: the target row without the rejected draft
        rejected_lane = (lanes[None, :] == num_correct[:, None]) & use_q[:, None] & draft_ok
        rejected_tokens = tl.where(rejected_lane, drafts, -1)
        rejected_q = tl.where(rejected_lane, _quantize(p), 0)
    # p_ok stands for req_ok in the sums: a request whose final row is past the flat end neither
    # stores nor reads block sums, so its total is 0 and its final token id 0 (the reference's).
    _block_sums(probs_ptr, p_row, stride_pv, draft_probs_ptr, q_row, stride_qv, use_q, p_ok, rejected_tokens, rejected_q,
                sums_ptr, sums_base, sums_width, vocab, first_tile, end_tile, mask_ptr, final_base, final_constrained, mask_width,
                BLOCK_R, TILE_V, SUB, HAS_DRAFT_PROBS, not HAS_DRAFT_PROBS, HAS_MASK)
    if _finishing(counter_ptr, req, req_ok, SPLIT):
        final_coin = _sanitize_coins(tl.load(final_coins_ptr + req, mask=req_ok, other=0.0))
        final = _sample_from_sums(probs_ptr, p_row, stride_pv, draft_probs_ptr, q_row, stride_qv, use_q, p_ok, rejected_tokens,
                                  final_coin, sums_ptr, sums_base, sums_width, vocab, mask_ptr, final_base, final_constrained, mask_width,
                                  SUB, NB_PAD, PIECE, HAS_DRAFT_PROBS, not HAS_DRAFT_PROBS, HAS_MASK)
        nodes = max_drafts + 1
        node_ok = req_ok[:, None] & (lanes[None, :] < nodes)
        out = req64[:, None] * nodes + lanes[None, :]
        predict = tl.where(lanes[None, :] < num_correct[:, None], drafts,
                           tl.where(lanes[None, :] == num_correct[:, None], final[:, None], -1))
        tl.store(predict_ptr + out, predict.to(tl.int32), mask=node_ok)
        tl.store(accept_ptr + out, tl.where(lanes[None, :] <= num_correct[:, None], out, -1).to(tl.int32), mask=node_ok)
        tl.store(num_correct_ptr + req, num_correct, mask=req_ok)
        tl.store(accept_lens_ptr + req, num_correct + 1, mask=req_ok)


def verify_chain_ragged(draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor, target_predict: torch.Tensor, *, max_drafts: int,
                        token_bitmask: Optional[torch.Tensor] = None, bitmask_index: Optional[torch.Tensor] = None,
                        out: Optional[Verdict] = None, target: KernelTarget) -> Verdict:
    """Triton provider of ``verify_chain_ragged`` (arguments validated by the caller)."""
    bs, total = num_draft_tokens.shape[0], draft_tokens.shape[0]
    nodes = max_drafts + 1
    out = _verdict_buffers(bs, nodes, nodes, draft_tokens.device, out)
    if bs == 0:
        return out
    counts, starts = chain_layout(num_draft_tokens, max_drafts)
    masks = MaskArgs.of(token_bitmask, bitmask_index, out.predict)
    ids, tile_max, tile_id, num_tiles, from_logits = _target_source(target_predict, target, masks)
    config = walk_launch(target, bs, nodes)
    warps = _warps(target, config)
    drafts = draft_tokens.contiguous() if total else counts  # an empty tensor may have no address
    _ragged_chain_greedy_kernel[(cdiv(bs, config.requests),)](
        drafts, counts, starts, ids, tile_max, tile_id, num_tiles, total, total + bs, *masks.args,
        out.predict, out.accept_index, out.num_correct, out.accept_lens, bs, max_drafts,
        BLOCK_R=config.requests, N_PAD=_pow2(nodes), TILES_PAD=_pow2(num_tiles), FROM_LOGITS=from_logits, **masks.flags,
        num_warps=warps,
    )
    return out


def verify_chain_sampling_ragged(draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor, draft_probs: Optional[torch.Tensor],
                                 target_probs: torch.Tensor, coins: torch.Tensor, final_coins: torch.Tensor, *, max_drafts: int,
                                 token_bitmask: Optional[torch.Tensor] = None, bitmask_index: Optional[torch.Tensor] = None,
                                 out: Optional[Verdict] = None, target: KernelTarget) -> Verdict:
    """Triton provider of ``verify_chain_sampling_ragged`` (arguments validated by the caller)."""
    bs, total = num_draft_tokens.shape[0], draft_tokens.shape[0]
    nodes = max_drafts + 1
    out = _verdict_buffers(bs, nodes, nodes, draft_tokens.device, out)
    if bs == 0:
        return out
    counts, starts = chain_layout(num_draft_tokens, max_drafts)
    vocab = target_probs.shape[-1]
    target_probs = target_probs.flatten(0, 1) if target_probs.dim() == 3 else target_probs  # (1, T + bs, V) -> rows
    has_draft_probs = draft_probs is not None and total > 0
    if has_draft_probs:
        draft_probs = draft_probs.flatten(0, 1) if draft_probs.dim() == 3 else draft_probs
    # An empty tensor may have no address: T = 0 passes stand-ins that are never read.
    drafts = draft_tokens.contiguous() if total else counts
    step_coins = coins.contiguous() if total else final_coins
    q = draft_probs if has_draft_probs else target_probs
    config = sampling_launch(target, bs, nodes, vocab)
    sums, counters = _final_token_scratch(bs, config, draft_tokens.device)
    masks = MaskArgs.of(token_bitmask, bitmask_index, out.predict)
    _ragged_chain_sampling_kernel[(cdiv(bs, config.requests), config.chunks)](
        drafts, counts, starts, total, total + bs, q, q.stride(0), q.stride(1), target_probs, target_probs.stride(0), target_probs.stride(1),
        step_coins, final_coins.contiguous(), out.predict, out.accept_index, out.num_correct, out.accept_lens, bs, max_drafts, vocab,
        sums, config.sums_width, counters, config.tiles_per_chunk, *masks.args,
        BLOCK_R=config.requests, N_PAD=_pow2(nodes), TILE_V=config.tile_v, SUB=config.sub, NB_PAD=config.nb_pad,
        SPLIT=config.chunks > 1, **masks.flags, HAS_DRAFT_PROBS=draft_probs is not None, num_warps=config.warps,
    )
    return out


def _warps(target: KernelTarget, config) -> int:
    """128 threads on a GPU: the (N_PAD, TILES_PAD) tile merge spilled at one warp/wave."""
    return config.warps if target.vendor == "interpreter" else max(config.warps, target.warps(128))


PROVIDERS = {
    "verify_chain_ragged": (verify_chain_ragged, "kernels/ragged.py: tile argmax over the flat rows + ragged prefix match"),
    "verify_chain_sampling_ragged": (verify_chain_sampling_ragged,
                                     "kernels/ragged.py: ragged rejection test + one-pass exact residual sampling"),
}


def compile_specs(target: KernelTarget):
    specs = []
    for bs, max_drafts, num_tiles in ((64, 5, 38), (256, 7, 1), (3, 3, 1)):
        nodes = max_drafts + 1
        config = walk_launch(target, bs, nodes)
        for from_logits, target_type in ((True, "*fp32"), (False, "*i64"), (False, "*i32")):
            for has_mask, has_index in ((False, False), (True, False), (True, True)):
                mask_type = "*i32"  # the placeholder without a mask is out.predict (int32)
                signature = {"drafts_ptr": "*i64", "counts_ptr": "*i64", "starts_ptr": "*i64", "target_ptr": target_type,
                             "tile_max_ptr": "*fp32", "tile_id_ptr": "*i32", "num_tiles": "i32", "num_drafts": "i32", "total_rows": "i32",
                             "mask_ptr": mask_type, "index_ptr": "*i64" if has_index else mask_type, "num_masks": "i32", "mask_width": "i32",
                             "predict_ptr": "*i32", "accept_ptr": "*i32", "num_correct_ptr": "*i32", "accept_lens_ptr": "*i32",
                             "bs": "i32", "max_drafts": "i32", "BLOCK_R": "constexpr", "N_PAD": "constexpr", "TILES_PAD": "constexpr",
                             "FROM_LOGITS": "constexpr", "HAS_MASK": "constexpr", "HAS_INDEX": "constexpr"}
                constexprs = {"BLOCK_R": config.requests, "N_PAD": _pow2(nodes), "TILES_PAD": _pow2(num_tiles if from_logits else 1),
                              "FROM_LOGITS": from_logits, "HAS_MASK": has_mask, "HAS_INDEX": has_index}
                specs.append((_ragged_chain_greedy_kernel, signature, constexprs, _warps(target, config)))
                specs.append(runtime_specialized(target, _ragged_chain_greedy_kernel, signature, constexprs, _warps(target, config),
                                                 values={"num_tiles": num_tiles if from_logits else 1, "num_drafts": bs * max_drafts // 2,
                                                         "total_rows": bs * max_drafts // 2 + bs, "num_masks": bs * nodes if has_mask else 0,
                                                         "mask_width": 4748 if has_mask else 0, "bs": bs, "max_drafts": max_drafts}))
    specs.extend(_sampling_compile_specs(target))
    return specs


def _sampling_compile_specs(target: KernelTarget):
    """``_ragged_chain_sampling_kernel`` at production shapes (bs, max_drafts, V), with and without
    draft probabilities, and the mask variants at one shape."""
    specs = []
    verdict = {"predict_ptr": "*i32", "accept_ptr": "*i32", "num_correct_ptr": "*i32", "accept_lens_ptr": "*i32"}
    for bs, max_drafts, vocab in ((1, 3, 32000), (64, 5, 151936), (256, 7, 151936), (3, 4, 29)):
        nodes = max_drafts + 1
        config = sampling_launch(target, bs, nodes, vocab)
        masked = (bs, max_drafts) == (64, 5)
        variants = [("*i32", "*i32", False, False)]
        if masked:
            variants += [("*i32", "*i32", True, False), ("*i32", "*i64", True, True)]
        for mask_type, index_type, has_mask, has_index in variants:
            for has_draft_probs in (True, False):
                total = bs * max_drafts // 2
                signature = {"drafts_ptr": "*i64", "counts_ptr": "*i64", "starts_ptr": "*i64", "num_drafts": "i32", "total_rows": "i32",
                             "draft_probs_ptr": "*fp32", "stride_qn": "i64", "stride_qv": "i64", "probs_ptr": "*fp32", "stride_pn": "i64",
                             "stride_pv": "i64", "coins_ptr": "*fp32", "final_coins_ptr": "*fp32", **verdict, "bs": "i32",
                             "max_drafts": "i32", "vocab": "i32", "sums_ptr": "*i64", "sums_width": "i32", "counter_ptr": "*i32",
                             "tiles_per_chunk": "i32", "mask_ptr": mask_type, "index_ptr": index_type, "num_masks": "i32",
                             "mask_width": "i32", **{name: "constexpr" for name in ("BLOCK_R", "N_PAD", "TILE_V", "SUB", "NB_PAD", "SPLIT",
                                                                                    "HAS_MASK", "HAS_INDEX", "HAS_DRAFT_PROBS")}}
                constexprs = {"BLOCK_R": config.requests, "N_PAD": _pow2(nodes), "TILE_V": config.tile_v, "SUB": config.sub,
                              "NB_PAD": config.nb_pad, "SPLIT": config.chunks > 1, "HAS_MASK": has_mask, "HAS_INDEX": has_index,
                              "HAS_DRAFT_PROBS": has_draft_probs}
                specs.append((_ragged_chain_sampling_kernel, signature, constexprs, config.warps))
                specs.append(runtime_specialized(target, _ragged_chain_sampling_kernel, signature, constexprs, config.warps,
                                                 values={"num_drafts": total, "total_rows": total + bs, "stride_qn": vocab, "stride_qv": 1,
                                                         "stride_pn": vocab, "stride_pv": 1, "bs": bs, "max_drafts": max_drafts,
                                                         "vocab": vocab, "sums_width": config.sums_width,
                                                         "tiles_per_chunk": config.tiles_per_chunk,
                                                         "num_masks": total + bs if has_mask else 0,
                                                         "mask_width": (vocab + 31) // 32 if has_mask else 0}))
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    config = walk_launch(target, 64, 6)
    sampling = sampling_launch(target, 64, 6, 151936)
    return [f"verify_chain_ragged bs=64 S=5: argmax tiles over T + bs rows; match {config.requests} req/program, {config.warps} warps",
            f"verify_chain_sampling_ragged bs=64 S=5 V=151936: {sampling.chunks} chunks x {sampling.tiles_per_chunk} tiles of "
            f"{sampling.tile_v}, {sampling.warps} warps"]
