"""Triton kernels of family ``ragged``. Semantics and layout: spec_hal/ragged.py.

Both ops read the caller's draft counts as they are: each program derives its requests' counts
and first rows itself (``kernels/verify.py``: ``ragged_layout``, a prefix sum over the counts
before them), so no layout is computed in a launch of its own.

``verify_chain_ragged``: the fused argmax (``kernels/verify.py``'s tile kernel, masks included)
runs over the T + bs flat target rows only, so a request with c_b drafts costs c_b + 1 rows, not
max_drafts + 1; then ``_ragged_chain_greedy_kernel`` (grid: request blocks) merges each request's
tiles at its rows r_b .. r_b + c_b, matches the drafts and writes the padded Verdict.

``verify_chain_sampling_ragged``: ``kernels/verify.py``'s ``_chain_sampling_kernel`` with
``RAGGED``: it reads the (T + bs, V) target and (T, V) draft rows, the flat drafts and coins in
place at each request's rows, so no probability row is copied (the reference's gather into the
padded layout ran ~5 passes over them). Lanes past a request's count are the padded layout's
padding; invalid draft ids are recorded at their padded index, as the reference records them.
With ``rng_state``, ``_stream_coins_kernel`` draws the coins first.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from spec_hal import error_flag
from spec_hal import sampling as stream_purposes  # the coin keying the counter-based stream shares with the from-logits ops
from spec_hal.types import Verdict

from .error_flag import record_invalid
from .launch import KernelTarget, runtime_specialized, cdiv
from .sampling import _hash_key, _keyed_coin
from .verify import (MaskArgs, _chain_sampling_kernel, _merge_argmax, _pow2, _target_source, _verdict_buffers, chain_sampling_constexprs,
                     chain_sampling_signature, launch_chain_sampling, ragged_layout, sampling_launch, walk_launch)

PURPOSE_ACCEPT = tl.constexpr(stream_purposes.PURPOSE_ACCEPT)
PURPOSE_FINAL = tl.constexpr(stream_purposes.PURPOSE_FINAL)


@triton.jit(do_not_specialize=["num_drafts", "total_rows"])  # sizes that change every batch (kernels/verify.py: _chain_sampling_kernel)
def _ragged_chain_greedy_kernel(drafts_ptr, counts_ptr, target_ptr, tile_max_ptr, tile_id_ptr, num_tiles, num_drafts, total_rows,
                                predict_ptr, accept_ptr, num_correct_ptr, accept_lens_ptr, bs, max_drafts, vocab, flag_ptr, flag_code,
                                bonus_ptr, BLOCK_R: tl.constexpr, N_PAD: tl.constexpr, TILES_PAD: tl.constexpr, FROM_LOGITS: tl.constexpr,
                                BONUS: tl.constexpr):
    """BONUS: the draft-aligned layout (spec_hal/ragged.py): request b's draft j and its target
    row are both flat index d_b + j, and lane c_b (c_b cut at the flat end) holds
    bonus[b]. Otherwise target rows r_b + j (j <= c_b), draft j at r_b + j - b. A token_bitmask
    acts through the argmax tiles: a draft must also be allowed at its row, which from logits is
    that the row allows any id (kernels/verify.py: _merge_argmax; a masked target is never ids)."""
    req = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    req_ok = req < bs
    req64 = req.to(tl.int64)
    lanes = tl.arange(0, N_PAD)
    nodes = max_drafts + 1
    count, start = ragged_layout(counts_ptr, req, req_ok, max_drafts, BLOCK_R, not BONUS)
    rows = start[:, None] + lanes[None, :]
    if BONUS:
        count = tl.minimum(count, tl.maximum(total_rows - start, 0))  # the drafts that fit before the flat end
        row_ok = req_ok[:, None] & (lanes[None, :] < count[:, None])
        draft_index = tl.minimum(rows, num_drafts - 1)
        next_ok = row_ok & (draft_index >= 0)
    else:
        row_ok = req_ok[:, None] & (lanes[None, :] <= count[:, None]) & (rows < total_rows)
        # Draft j is checked against row j; it sits at flat index (row of draft j) - (b + 1),
        # clamped into [0, T) exactly as the reference's gather.
        draft_index = tl.minimum(tl.maximum(rows - req64[:, None], 0), num_drafts - 1)  # -1 only when T = 0
        next_ok = req_ok[:, None] & (lanes[None, :] + 1 <= count[:, None]) & (rows + 1 < total_rows) & (draft_index >= 0)
    if FROM_LOGITS:
        target, allows_any = _merge_argmax(tile_max_ptr, tile_id_ptr, rows, row_ok, num_tiles, TILES_PAD)
        target = tl.where(row_ok, target, -1)
    else:
        target = tl.load(target_ptr + rows, mask=row_ok, other=-1).to(tl.int64)
        allows_any = row_ok
    drafts = tl.load(drafts_ptr + draft_index, mask=next_ok, other=-1).to(tl.int64)
    # The reference's record of the drafts it reads (verify.record_token_ids): ids < -1, or >= V
    # when V is known (vocab < 0: token-id targets), at their flat index.
    record_invalid(flag_ptr, flag_code, next_ok & ((drafts < -1) | ((vocab >= 0) & (drafts >= vocab))), draft_index)
    mismatch = (next_ok == 0) | (drafts != target) | (drafts < 0) | (allows_any == 0)
    num_correct = tl.min(tl.where(mismatch, lanes[None, :], N_PAD), axis=1)
    if BONUS:  # lane c_b (never matched: no draft there) emits the bonus token; loaded last, kept live briefly
        bonus = tl.load(bonus_ptr + req, mask=req_ok, other=-1).to(tl.int64)
        target = tl.where(lanes[None, :] == count[:, None], bonus[:, None], target)
    node_ok = req_ok[:, None] & (lanes[None, :] < nodes)
    on_path = lanes[None, :] <= num_correct[:, None]
    out = req64[:, None] * nodes + lanes[None, :]
    tl.store(predict_ptr + out, tl.where(on_path, target, -1).to(tl.int32), mask=node_ok)
    tl.store(accept_ptr + out, tl.where(on_path, out, -1).to(tl.int32), mask=node_ok)
    tl.store(num_correct_ptr + req, num_correct, mask=req_ok)
    tl.store(accept_lens_ptr + req, num_correct + 1, mask=req_ok)


# Coins a step of ``_stream_coins_kernel`` draws: one program of 256 threads loops over them.
COINS_BLOCK = 1024


@triton.jit(do_not_specialize=["num_drafts", "bs"])  # sizes that change every batch
def _stream_coins_kernel(rng_ptr, coins_ptr, num_drafts, bs, BLOCK: tl.constexpr):
    """The coins of the counter-based stream at rng_ptr = [seed, counter]
    (``spec_hal.ragged.stream_coins``: T step coins then bs final coins at coins_ptr), then the
    counter + 1: one program, so no other reads the state while it changes."""
    seed = tl.load(rng_ptr).to(tl.int64)
    counter = tl.load(rng_ptr + 1).to(tl.int64)
    key = _hash_key(seed, counter)
    for first in range(0, num_drafts + bs, BLOCK):
        index = first + tl.arange(0, BLOCK)
        is_final = index >= num_drafts
        position = tl.where(is_final, index - num_drafts, index).to(tl.int64)
        coin = tl.where(is_final, _keyed_coin(key, position, PURPOSE_FINAL), _keyed_coin(key, position, PURPOSE_ACCEPT))
        tl.store(coins_ptr + index, coin, mask=index < num_drafts + bs)
    tl.store(rng_ptr + 1, counter + 1)


def _stream_coins(rng_state: torch.Tensor, num_drafts: int, bs: int, target: KernelTarget) -> tuple[torch.Tensor, torch.Tensor]:
    """(coins (T,), final coins (bs,)) float32 of the stream at ``rng_state``, which this advances."""
    coins = torch.empty((num_drafts + bs,), dtype=torch.float32, device=rng_state.device)
    _stream_coins_kernel[(1,)](rng_state, coins, num_drafts, bs, BLOCK=COINS_BLOCK, num_warps=target.warps(256))
    return coins[:num_drafts], coins[num_drafts:]


_DRAFTS_CODE = error_flag.code("verify_chain_ragged", "draft_tokens")


def verify_chain_ragged(draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor, target_predict: torch.Tensor, *, max_drafts: int,
                        token_bitmask: Optional[torch.Tensor] = None, bitmask_index: Optional[torch.Tensor] = None,
                        bonus_tokens: Optional[torch.Tensor] = None, out: Optional[Verdict] = None, target: KernelTarget) -> Verdict:
    """Triton provider of ``verify_chain_ragged`` (arguments validated by the caller)."""
    bs, total, nodes, out = _ragged_verdict(draft_tokens, num_draft_tokens, max_drafts, out)
    if bs == 0:
        return out
    if total == 0 and bonus_tokens is not None:
        return _bonus_only(bonus_tokens, out)
    bonus_rows = bonus_tokens is None
    total_rows = total + bs if bonus_rows else total
    counts = num_draft_tokens.contiguous()
    masks = MaskArgs.of(token_bitmask, bitmask_index, out.predict)
    ids, tile_max, tile_id, num_tiles, from_logits = _target_source(target_predict, target, masks)
    config = walk_launch(target, bs, nodes)
    warps = _warps(target, config)
    drafts = draft_tokens.contiguous() if total else counts  # an empty tensor may have no address
    _ragged_chain_greedy_kernel[(cdiv(bs, config.requests),)](
        drafts, counts, ids, tile_max, tile_id, num_tiles, total, total_rows,
        out.predict, out.accept_index, out.num_correct, out.accept_lens, bs, max_drafts,
        target_predict.shape[-1] if from_logits else -1, error_flag.flag(out.predict.device), _DRAFTS_CODE,
        counts if bonus_rows else bonus_tokens.contiguous(),  # counts: a placeholder, never read
        BLOCK_R=config.requests, N_PAD=_pow2(nodes), TILES_PAD=_pow2(num_tiles), FROM_LOGITS=from_logits, BONUS=not bonus_rows,
        num_warps=warps,
    )
    return out


def verify_chain_sampling_ragged(draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor, draft_probs: Optional[torch.Tensor],
                                 target_probs: torch.Tensor, coins: torch.Tensor, final_coins: torch.Tensor, *, max_drafts: int,
                                 token_bitmask: Optional[torch.Tensor] = None, bitmask_index: Optional[torch.Tensor] = None,
                                 bonus_tokens: Optional[torch.Tensor] = None, rng_state: Optional[torch.Tensor] = None,
                                 out: Optional[Verdict] = None, target: KernelTarget) -> Verdict:
    """Triton provider of ``verify_chain_sampling_ragged``: the chain sampling kernel reads the flat rows in place (RAGGED)."""
    bs, total, _, out = _ragged_verdict(draft_tokens, num_draft_tokens, max_drafts, out)
    if bs == 0 or (total == 0 and bonus_tokens is not None):  # nothing to sample; a stream still advances
        if rng_state is not None:
            rng_state[1:].add_(1)
        return _bonus_only(bonus_tokens, out) if bs else out
    # Counts that break the layout (rows past the flat end) are the reference's padding: the
    # kernel cuts each chain at the flat end, and a request whose root row is past it emits 0.
    if rng_state is not None:
        coins, final_coins = _stream_coins(rng_state, total, bs, target)
    if total:
        draft_tokens, coins = draft_tokens.contiguous(), coins.contiguous()
    else:  # T = 0: every lane is padding; an empty tensor may have no address
        draft_tokens, coins = num_draft_tokens, final_coins
        draft_probs = target_probs if draft_probs is not None else None
    launch_chain_sampling(draft_tokens, draft_probs, target_probs, coins, final_coins, steps=max_drafts, token_bitmask=token_bitmask,
                          bitmask_index=bitmask_index, out=out, target=target, ragged_counts=num_draft_tokens, bonus_tokens=bonus_tokens)
    return out


def _bonus_only(bonus_tokens: torch.Tensor, out: Verdict) -> Verdict:
    """The verdict of a draft-aligned batch without drafts (T = 0: no target row to read): every
    request accepts nothing and emits its bonus token."""
    bs = bonus_tokens.shape[0]
    predict = out.predict.view(bs, -1)
    predict.fill_(-1)
    predict[:, 0] = bonus_tokens
    out.accept_index.fill_(-1)
    out.accept_index[:, 0] = torch.arange(0, bs * predict.shape[1], predict.shape[1], dtype=torch.int32, device=predict.device)
    out.num_correct.zero_()
    out.accept_lens.fill_(1)
    return out


def _ragged_verdict(draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor, max_drafts: int, out: Optional[Verdict]) -> tuple:
    """(bs, T, N = max_drafts + 1, the padded Verdict to fill) of a ragged call."""
    bs, total, nodes = num_draft_tokens.shape[0], draft_tokens.shape[0], max_drafts + 1
    return bs, total, nodes, _verdict_buffers(bs, nodes, nodes, draft_tokens.device, out)


def _warps(target: KernelTarget, config) -> int:
    """128 threads on a GPU: the (N_PAD, TILES_PAD) tile merge spilled at one warp/wave."""
    return config.warps if target.vendor == "interpreter" else max(config.warps, target.warps(128))


PROVIDERS = {
    "verify_chain_ragged": (verify_chain_ragged, "kernels/ragged.py: tile argmax over the flat rows + ragged prefix match"),
    "verify_chain_sampling_ragged": (verify_chain_sampling_ragged,
                                     "kernels/verify.py chain sampling reading the flat rows in place (RAGGED)"),
}


def compile_specs(target: KernelTarget):
    specs = _coins_specs(target)
    for bs, max_drafts, num_tiles in ((64, 5, 38), (256, 7, 1), (3, 3, 1)):
        nodes = max_drafts + 1
        config = walk_launch(target, bs, nodes)
        # (from logits, target ids type, bonus tokens type: BONUS, the draft-aligned layout, unless
        # None; the caller's counts type)
        variants = [(True, "*fp32", None, "*i64"), (False, "*i64", None, "*i64"), (False, "*i32", None, "*i32"), (True, "*fp32", "*i64", "*i32"),
                    (False, "*i64", "*i32", "*i64")]
        for from_logits, target_type, bonus_type, counts_type in variants:
            signature = {"drafts_ptr": "*i64", "counts_ptr": counts_type, "target_ptr": target_type,
                         "tile_max_ptr": "*fp32", "tile_id_ptr": "*i32", "num_tiles": "i32", "num_drafts": "i32", "total_rows": "i32",
                         "predict_ptr": "*i32", "accept_ptr": "*i32", "num_correct_ptr": "*i32", "accept_lens_ptr": "*i32",
                         "bs": "i32", "max_drafts": "i32", "vocab": "i32", "flag_ptr": "*i64", "flag_code": "i64",
                         "bonus_ptr": bonus_type or "*i64", "BLOCK_R": "constexpr", "N_PAD": "constexpr", "TILES_PAD": "constexpr",
                         "FROM_LOGITS": "constexpr", "BONUS": "constexpr"}
            constexprs = {"BLOCK_R": config.requests, "N_PAD": _pow2(nodes), "TILES_PAD": _pow2(num_tiles if from_logits else 1),
                          "FROM_LOGITS": from_logits, "BONUS": bonus_type is not None}
            specs.append((_ragged_chain_greedy_kernel, signature, constexprs, _warps(target, config)))
            specs.append(runtime_specialized(target, _ragged_chain_greedy_kernel, signature, constexprs, _warps(target, config),
                                             values={"num_tiles": num_tiles if from_logits else 1, "num_drafts": bs * max_drafts // 2,
                                                     "total_rows": bs * max_drafts // 2 + (bs if bonus_type is None else 0),
                                                     "bs": bs, "max_drafts": max_drafts, "vocab": 151936 if from_logits else -1,
                                                     "flag_code": _DRAFTS_CODE}))
    specs += _chain_sampling_specs(target)
    return specs


def _coins_specs(target: KernelTarget) -> list:
    """``_stream_coins_kernel`` as ``verify_chain_sampling_ragged`` launches it with ``rng_state``."""
    signature = {"rng_ptr": "*i64", "coins_ptr": "*fp32", "num_drafts": "i32", "bs": "i32", "BLOCK": "constexpr"}
    constexprs = {"BLOCK": COINS_BLOCK}
    return [(_stream_coins_kernel, signature, constexprs, target.warps(256)),
            runtime_specialized(target, _stream_coins_kernel, signature, constexprs, target.warps(256), values={"num_drafts": 160, "bs": 64})]


def _chain_sampling_specs(target: KernelTarget) -> list:
    """``_chain_sampling_kernel`` with RAGGED, as ``verify_chain_sampling_ragged`` launches it:
    with and without draft probabilities, unmasked and (at the production shape) with a mask
    without an index and with an int32/int64 index; int64 drafts and counts, and int32 (vLLM's) once; and
    the draft-aligned layout (BONUS, as ``spec_hal.compat.vllm`` launches it: int32 drafts, int64
    bonus tokens, unmasked)."""
    specs = []
    for bs, max_drafts, vocab, total in ((64, 5, 151936, 160), (1, 3, 32000, 1), (3, 3, 29, 5)):
        nodes = max_drafts + 1
        config = sampling_launch(target, bs, nodes, vocab)
        masks = [("*i32", "*i32", False, False)]
        if bs == 64:
            masks += [("*i32", "*i32", True, False), ("*i32", "*i32", True, True), ("*i32", "*i64", True, True)]
        layouts = [("*i64", False), ("*i32", False), ("*i32", True)] if bs == 64 else [("*i64", False), ("*i32", True)]
        for drafts_type, bonus in layouts:
            for mask_type, index_type, has_mask, has_index in masks if drafts_type == "*i64" else masks[:1]:
                for has_draft_probs in (True, False):
                    signature = {**chain_sampling_signature(drafts_type, drafts_type, "*i64" if bonus else "*i32"), "mask_ptr": mask_type,
                                 "index_ptr": index_type, "num_masks": "i32", "mask_width": "i32", "HAS_MASK": "constexpr",
                                 "HAS_INDEX": "constexpr"}
                    constexprs = {**chain_sampling_constexprs(config, nodes, ragged=True, bonus=bonus), "HAS_DRAFT_PROBS": has_draft_probs,
                                  "HAS_MASK": has_mask, "HAS_INDEX": has_index}
                    strided_flags, strided_options = config.read_flags(False)
                    specs.append((_chain_sampling_kernel, signature, {**constexprs, **strided_flags}, config.warps, None, strided_options))
                    specs.append(runtime_specialized(target, _chain_sampling_kernel, signature, constexprs, config.warps, values={
                        "stride_qb": 0, "stride_qn": vocab if has_draft_probs else 0, "stride_qv": 1 if has_draft_probs else 0,
                        "stride_pb": 0, "stride_pn": vocab, "stride_pv": 1, "bs": bs, "steps": max_drafts, "vocab": vocab,
                        "sums_width": config.sums_width, "tiles_per_chunk": config.tiles_per_chunk,
                        "num_masks": total + bs if has_mask else 0, "mask_width": cdiv(vocab, 32) if has_mask else 0,
                        "flag_code": error_flag.code("verify_chain_sampling", "draft_ids"), "num_drafts": total,
                        "total_rows": total if bonus else total + bs}))
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    config = walk_launch(target, 64, 6)
    return [f"verify_chain_ragged bs=64 S=5: argmax tiles over T + bs rows; match {config.requests} req/program, {config.warps} warps",
            "verify_chain_sampling_ragged: verify_chain_sampling's launch (RAGGED: the flat rows read in place)"]
