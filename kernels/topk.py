"""Triton kernels of family ``topk``: ``draft_topk`` in two launches. Semantics: spec_hal/topk.py.

Launch 1 (grid: rows x tiles) reads each logit exactly once. Every program owns one tile of
``BLOCK`` columns of one row and writes the tile's max ``m``, its sum ``s = sum exp(x - m)`` and
its k best elements as sorted rank keys (value and id packed into one int64). Splitting every row into tiles is what keeps a small batch from
running one row per program: at bs = 1 and V = 151,936 that is 38-75 programs, not 1.

Launch 2 (grid: rows) merges a row's tiles: ``M = max m``, ``Z = sum s * exp(m - M)`` (the
online-softmax normaliser), the k best of the tiles' sorted candidate lists by a k-way merge,
``p = exp(v - M) / Z``. For k = 1
this is ``1 / Z``, the exact top-1 probability, without materialising a softmax.

Ranking is by (value descending, id ascending), encoded in the rank key so that one integer
max-reduction selects the next element: ties go to the lower id, no element is selected twice,
and masked tail lanes hold a key below every real one, so an id is always in [0, V).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from spec_hal.topk import MAX_TOPK

from .launch import KernelTarget, runtime_specialized, cdiv, next_power_of_2
from .masks import mask_row_base, tile_allowed, token_allowed

# Rank key below every real one (masked lanes, empty slots); the lowest real key, -inf with id
# 2**31 - 1, is about -9.19e18.
EMPTY_KEY = tl.constexpr(-9223372036854775807)
# Keys of masked tokens (token_bitmask): -2^63 + (2^31 - 1 - id), below every real key (the lowest
# is about -9.19e18) and above EMPTY_KEY, ordered by id ascending, and decoded by _key_id.
MASKED_KEY_TOP = tl.constexpr(-9223372036854775807 + 2147483646)


@triton.jit
def _rank_keys(values, ids):
    """One int64 per element whose signed order is (value descending, id ascending).

    High 32 bits: the float's bits made order-preserving as a signed int (negative floats have
    their magnitude bits flipped; -0.0 is first made +0.0 so it ties with +0.0). Low 32 bits:
    ``2**31 - 1 - id``, so among equal values the lower id has the larger key. One max-reduction
    per selection pass then replaces a max over values plus a min over tied ids.
    """
    values = tl.where(values == 0.0, 0.0, values)
    bits = values.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return ordered.to(tl.int64) * 4294967296 + (2147483647 - ids).to(tl.int64)


@triton.jit
def _key_value(key):
    """The float32 value a rank key was made from."""
    ordered = (key >> 32).to(tl.int32)
    bits = ordered ^ ((ordered >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _key_id(key):
    return 2147483647 - (key & 0xFFFFFFFF).to(tl.int32)


@triton.jit
def _masked_keys(ids):
    return MASKED_KEY_TOP - ids.to(tl.int64)


@triton.jit
def _tile_topk_kernel(
    logits_ptr,
    stride_row,
    stride_col,
    vocab,
    tile_max_ptr,
    tile_sum_ptr,
    cand_key_ptr,
    num_tiles,
    mask_ptr,
    index_ptr,
    map_ptr,
    num_masks,
    mask_width,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    HAS_MAP: tl.constexpr,
):
    row = tl.program_id(0)
    tile = tl.program_id(1)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    in_vocab = cols < vocab
    raw = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols.to(tl.int64) * stride_col, mask=in_vocab, other=0.0)
    values = raw.to(tl.float32)
    values = tl.where(values != values, float("-inf"), values)  # NaN ranks as -inf
    values = tl.minimum(values, 3.4028234663852886e38)  # +inf ranks as FLT_MAX
    values = tl.where(in_vocab, values, float("-inf"))
    if HAS_MASK:
        base, constrained = mask_row_base(index_ptr, row, True, num_masks, mask_width, HAS_INDEX)
        if HAS_MAP:  # the mask is in the target vocabulary
            tokens = tl.load(map_ptr + cols, mask=in_vocab, other=-1)
            allowed = token_allowed(mask_ptr, base, constrained, tokens, in_vocab, mask_width)
        else:
            allowed = tile_allowed(mask_ptr, base, constrained, tile * BLOCK, mask_width, BLOCK)
        values = tl.where(allowed, values, float("-inf"))

    tile_max = tl.max(values, axis=0)
    safe_max = tl.where(tile_max == float("-inf"), 0.0, tile_max)
    tile_sum = tl.sum(tl.where(in_vocab, tl.exp(values - safe_max), 0.0), axis=0)
    tile_sum = tl.where(tile_max == float("-inf"), 0.0, tile_sum)
    slot = row.to(tl.int64) * num_tiles + tile
    tl.store(tile_max_ptr + slot, tile_max)
    tl.store(tile_sum_ptr + slot, tile_sum)

    # Pass j keeps the best key strictly below pass j-1's: no element is selected twice, and a
    # tile with fewer than K valid lanes fills its tail with EMPTY_KEY.
    keys = tl.where(in_vocab, _rank_keys(values, cols), EMPTY_KEY)
    if HAS_MASK:
        keys = tl.where(in_vocab & (allowed == 0), _masked_keys(cols), keys)
    for j in tl.static_range(K):
        best = tl.max(keys, axis=0)
        tl.store(cand_key_ptr + slot * K + j, best)
        keys = tl.where(keys == best, EMPTY_KEY, keys)


@triton.jit
def _merge_tiles_kernel(
    tile_max_ptr,
    tile_sum_ptr,
    cand_key_ptr,
    token_map_ptr,
    probs_ptr,
    ids_ptr,
    num_tiles,
    K: tl.constexpr,
    TILES: tl.constexpr,
    HAS_TOKEN_MAP: tl.constexpr,
):
    row = tl.program_id(0)
    tiles = tl.arange(0, TILES)
    tile_ok = tiles < num_tiles
    base = row.to(tl.int64) * num_tiles
    tile_max = tl.load(tile_max_ptr + base + tiles, mask=tile_ok, other=float("-inf"))
    tile_sum = tl.load(tile_sum_ptr + base + tiles, mask=tile_ok, other=0.0)
    row_max = tl.max(tile_max, axis=0)
    row_finite = row_max > float("-inf")
    safe_row_max = tl.where(row_finite, row_max, 0.0)
    scale = tl.where(tile_max > float("-inf"), tl.exp(tile_max - safe_row_max), 0.0)
    # An all -inf row has no normaliser; 1.0 keeps the (discarded) division finite.
    normaliser = tl.where(row_finite, tl.sum(tile_sum * scale, axis=0), 1.0)

    # k-way merge: each tile's keys are already sorted, so pass j compares only the tiles'
    # current heads and advances the winning tile (keys are unique: they contain the id). A row
    # holds at least k real keys, so EMPTY_KEY is never emitted.
    head = tl.zeros([TILES], dtype=tl.int32)
    for j in tl.static_range(K):
        head_keys = tl.load(cand_key_ptr + (base + tiles) * K + head, mask=tile_ok & (head < K), other=EMPTY_KEY)
        best = tl.max(head_keys, axis=0)
        head += (head_keys == best).to(tl.int32)
        prob = tl.where(row_finite & (best > MASKED_KEY_TOP), tl.exp(_key_value(best) - safe_row_max) / normaliser, 0.0)
        out_id = _key_id(best).to(tl.int64)
        if HAS_TOKEN_MAP:
            out_id = tl.load(token_map_ptr + out_id).to(tl.int64)
        tl.store(probs_ptr + row.to(tl.int64) * K + j, prob)
        tl.store(ids_ptr + row.to(tl.int64) * K + j, out_id)


@dataclass(frozen=True)
class TopkLaunch:
    block: int
    tile_warps: int
    merge_warps: int


MASKED_BLOCK = 2048  # widest tile of a masked launch


def _padded(count: int) -> int:
    """Power-of-two extent (at least 2) for a tl.arange over ``count`` items."""
    return max(next_power_of_2(count), 2)


def launch_config(target: KernelTarget, rows: int, vocab: int) -> TopkLaunch:
    """Tile width and warps per target.

    Small batches use narrower tiles so that a row spreads over more programs (more SMs busy);
    AMD runs wave64, so the same 256 threads per program are 4 warps instead of 8. The
    interpreter runs one Python loop per program, so it takes the widest tile.
    """
    if target.vendor == "interpreter":
        return TopkLaunch(block=min(max(next_power_of_2(vocab), 16), 65536), tile_warps=1, merge_warps=1)
    warps = target.warps(256)
    block = 2048 if rows * cdiv(vocab, 4096) < 2 * target.multiprocessors else 4096
    block = min(block, max(next_power_of_2(vocab), 128))
    return TopkLaunch(block=block, tile_warps=warps, merge_warps=target.warps(128))


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
    """Triton provider of ``draft_topk`` (arguments validated by the caller; see spec_hal.topk)."""
    rows, vocab = logits.shape
    device = logits.device
    if out is None:
        out = (torch.empty((rows, k), dtype=torch.float32, device=device), torch.empty((rows, k), dtype=torch.int64, device=device))
    if rows == 0:
        return out[0], out[1]
    config = launch_config(target, rows, vocab)
    if token_bitmask is not None:  # the mask (and map) loads spill at 16 elements per thread (sm_90)
        config = TopkLaunch(block=min(config.block, MASKED_BLOCK), tile_warps=config.tile_warps, merge_warps=config.merge_warps)
    num_tiles = cdiv(vocab, config.block)
    if token_map is not None:
        token_map = token_map.contiguous()  # indexed with unit stride (a no-op for the usual map)
    # Scratch comes from torch's caching allocator: no device malloc per call, capture-safe.
    tile_max = torch.empty((rows, num_tiles), dtype=torch.float32, device=device)
    tile_sum = torch.empty((rows, num_tiles), dtype=torch.float32, device=device)
    cand_keys = torch.empty((rows, num_tiles, k), dtype=torch.int64, device=device)
    has_mask = token_bitmask is not None
    mask = token_bitmask.contiguous() if has_mask else tile_max  # placeholders, never read
    _tile_topk_kernel[(rows, num_tiles)](
        logits, logits.stride(0), logits.stride(1), vocab,
        tile_max, tile_sum, cand_keys, num_tiles,
        mask, bitmask_index if bitmask_index is not None else mask, token_map if has_mask and token_map is not None else mask,
        mask.shape[0] if has_mask else 0, mask.shape[1] if has_mask else 0,
        K=k, BLOCK=config.block, HAS_MASK=has_mask, HAS_INDEX=bitmask_index is not None,
        HAS_MAP=has_mask and token_map is not None, num_warps=config.tile_warps,
    )
    _merge_tiles_kernel[(rows,)](
        tile_max, tile_sum, cand_keys,
        token_map if token_map is not None else tile_max,  # placeholder pointer, never read
        out[0], out[1], num_tiles,
        K=k, TILES=_padded(num_tiles), HAS_TOKEN_MAP=token_map is not None,
        num_warps=config.merge_warps,
    )
    return out[0], out[1]


PROVIDERS = {"draft_topk": (draft_topk, "kernels/topk.py: tile top-k + merge, 2 launches")}

_LOGIT_TYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


# (HAS_MASK, HAS_INDEX, HAS_MAP, index pointer type, map pointer type) of the tile kernel's launches.
_MASKINGS = ((False, False, False, "*fp32", "*fp32"), (True, False, False, "*i32", "*i32"), (True, True, False, "*i32", "*i32"),
             (True, True, True, "*i64", "*i64"), (True, True, True, "*i32", "*i32"))


def _tile_signature(logit_type: str, k: int, block: int, vocab: int, has_mask, has_index, has_map, index_type, map_type):
    """(signature, constexprs, runtime int values) of one ``_tile_topk_kernel`` launch."""
    mask_type = "*i32" if has_mask else "*fp32"
    signature = {"logits_ptr": f"*{logit_type}", "stride_row": "i64", "stride_col": "i64", "vocab": "i32",
                 "tile_max_ptr": "*fp32", "tile_sum_ptr": "*fp32", "cand_key_ptr": "*i64", "num_tiles": "i32",
                 "mask_ptr": mask_type, "index_ptr": index_type if has_index else mask_type, "map_ptr": map_type if has_map else mask_type,
                 "num_masks": "i32", "mask_width": "i32", "K": "constexpr", "BLOCK": "constexpr", "HAS_MASK": "constexpr",
                 "HAS_INDEX": "constexpr", "HAS_MAP": "constexpr"}
    constexprs = {"K": k, "BLOCK": block, "HAS_MASK": has_mask, "HAS_INDEX": has_index, "HAS_MAP": has_map}
    width = cdiv(vocab, 32) if has_mask else 0
    values = {"stride_row": vocab, "stride_col": 1, "vocab": vocab, "num_tiles": cdiv(vocab, block),
              "num_masks": 64 if has_mask else 0, "mask_width": width}
    return signature, constexprs, values


def compile_specs(target: KernelTarget):
    """Every distinct (kernel, signature, constexprs, num_warps[, attrs]) the host function launches
    on ``target``: each launch config, each logits dtype, and the smallest and largest k (k only
    sets how many selection passes are unrolled, so these bound register use); each generic
    (misaligned pointers) and as Triton specialises it at run time for contiguous logits
    (``launch.runtime_specialized``: the unit column stride is a constexpr)."""
    specs = {}
    for rows, vocab in ((1, 151936), (256, 151936), (1, 127)):
        config = launch_config(target, rows, vocab)
        for k in (1, MAX_TOPK):
            for logit_type in _LOGIT_TYPES:
                for masking in _MASKINGS:
                    block = min(config.block, MASKED_BLOCK) if masking[0] else config.block
                    signature, constexprs, values = _tile_signature(logit_type, k, block, vocab, *masking)
                    key = ("tile", logit_type, k, block, config.tile_warps, masking)
                    specs[key] = (_tile_topk_kernel, signature, constexprs, config.tile_warps)
                    specs[key + (vocab,)] = runtime_specialized(target, _tile_topk_kernel, signature, constexprs, config.tile_warps,
                                                                values=values)
            # Without a token map the placeholder pointer is tile_max (fp32). A masked launch
            # has narrower tiles (MASKED_BLOCK), so more of them to merge.
            for block in sorted({config.block, min(config.block, MASKED_BLOCK)}):
                tiles = _padded(cdiv(vocab, block))
                for map_type, has_map in (("i32", True), ("i64", True), ("fp32", False)):
                    signature = {"tile_max_ptr": "*fp32", "tile_sum_ptr": "*fp32", "cand_key_ptr": "*i64",
                                 "token_map_ptr": f"*{map_type}", "probs_ptr": "*fp32",
                                 "ids_ptr": "*i64", "num_tiles": "i32", "K": "constexpr", "TILES": "constexpr",
                                 "HAS_TOKEN_MAP": "constexpr"}
                    constexprs = {"K": k, "TILES": tiles, "HAS_TOKEN_MAP": has_map}
                    specs[("merge", map_type, k, tiles, config.merge_warps)] = (_merge_tiles_kernel, signature, constexprs, config.merge_warps)
                    specs[("merge", map_type, k, tiles, config.merge_warps, vocab)] = runtime_specialized(
                        target, _merge_tiles_kernel, signature, constexprs, config.merge_warps,
                        values={"num_tiles": cdiv(vocab, block)})
    return list(specs.values())


def describe_launch(target: KernelTarget) -> list[str]:
    lines = []
    for rows, vocab in ((1, 151936), (64, 151936), (256, 32000)):
        config = launch_config(target, rows, vocab)
        lines.append(
            f"draft_topk bs={rows} V={vocab}: BLOCK={config.block}, {cdiv(vocab, config.block)} tiles/row, "
            f"{config.tile_warps} warps x {target.warp_size} lanes, merge {config.merge_warps} warps"
        )
    return lines
