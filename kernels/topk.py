"""Triton kernels of family ``topk``: ``draft_topk`` in two launches. Semantics: spec_hal/topk.py.

Launch 1 (grid: rows x chunks) reads each logit exactly once. Every program owns one chunk of
consecutive ``BLOCK``-wide tiles of one row and writes the chunk's max ``m``, its sum
``s = sum exp(x - m)`` (online softmax over its tiles) and its k best elements as sorted rank keys
(value and id packed into one int64). Splitting every row into chunks is what keeps a small
batch from running one row per program: at bs = 1 and V = 151,936 a chunk is one tile, 38-75
programs, not 1.

The k best of a chunk are kept as a running list whose lowest key is a floor. A tile whose max
logit is not above the floor's value cannot enter the list (its ids are larger, so a tie ranks
below), and costs no more than k = 1: a max, an exp-sum and one scalar compare. Only the other
tiles build rank keys, count the keys above the floor and insert that many (at most k), one
max-reduction each. On random and real logits most tiles after a chunk's first few are skipped,
so the k selection passes per tile of the old kernel (compute-bound at k > 1: 30-37% of copy
bandwidth at k = 4 on the H100) become about k * ln(tiles) insertions per chunk.

Launch 2 (grid: rows) merges a row's chunks: ``M = max m``, ``Z = sum s * exp(m - M)`` (the
online-softmax normaliser), the k best of the chunks' sorted candidate lists by a k-way merge,
``p = exp(v - M) / Z``. For k = 1 this is ``1 / Z``, the exact top-1 probability, without
materialising a softmax.

Ranking is by (value descending, id ascending), encoded in the rank key so that one integer
max-reduction selects the next element: ties go to the lower id, no element is selected twice,
and masked tail lanes hold a key below every real one, so an id is always in [0, V).
"""
from __future__ import annotations

import functools
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
def _tile_values(raw, cols, in_vocab, row, tile, mask_ptr, index_ptr, map_ptr, num_masks, mask_width,
                 BLOCK: tl.constexpr, HAS_MASK: tl.constexpr, HAS_INDEX: tl.constexpr, HAS_MAP: tl.constexpr):
    """(float32 values to rank, allowed) of one tile of raw logits: NaN ranks as -inf, +inf as
    FLT_MAX, ids past the vocabulary and ids the row's mask does not allow are -inf."""
    values = raw.to(tl.float32)
    values = tl.where(values != values, float("-inf"), values)
    values = tl.minimum(values, 3.4028234663852886e38)
    values = tl.where(in_vocab, values, float("-inf"))
    allowed = in_vocab
    if HAS_MASK:
        base, constrained = mask_row_base(index_ptr, row, True, num_masks, mask_width, HAS_INDEX)
        if HAS_MAP:  # the mask is in the target vocabulary
            tokens = tl.load(map_ptr + cols, mask=in_vocab, other=-1)
            allowed = token_allowed(mask_ptr, base, constrained, tokens, in_vocab, mask_width)
        else:
            allowed = tile_allowed(mask_ptr, base, constrained, tile * BLOCK, mask_width, BLOCK)
        values = tl.where(allowed, values, float("-inf"))
    return values, allowed


@triton.jit
def _tile_keys(values, allowed, cols, in_vocab, HAS_MASK: tl.constexpr):
    """Rank keys of a tile (``_tile_values``): masked ids below every allowed one, EMPTY_KEY past
    the vocabulary."""
    keys = tl.where(in_vocab, _rank_keys(values, cols), EMPTY_KEY)
    if HAS_MASK:
        keys = tl.where(in_vocab & (allowed == 0), _masked_keys(cols), keys)
    return keys


@triton.jit
def _empty_list(lanes, K: tl.constexpr):
    """A running list with no key yet: lanes 0..K-1 hold distinct keys below every real and masked
    key (EMPTY_KEY + lane), so that the list's floor is always one lane; pad lanes (>= K) hold the
    largest int64 and never become the floor."""
    return tl.where(lanes < K, EMPTY_KEY + lanes.to(tl.int64), 9223372036854775807)


@triton.jit
def _best_of_tile(keys, lanes, K: tl.constexpr):
    """A chunk's first running list: the K best ``keys`` in lanes 0..K-1, by K max-reductions;
    lanes the tile cannot fill keep their ``_empty_list`` keys."""
    best = _empty_list(lanes, K)
    for j in tl.static_range(K):
        top = tl.max(keys, axis=0)
        best = tl.where(lanes == j, tl.maximum(top, EMPTY_KEY + j), best)
        keys = tl.where(keys == top, EMPTY_KEY, keys)
    return best


@triton.jit
def _chunk_topk_kernel(
    logits_ptr,
    stride_row,
    stride_col,
    vocab,
    chunk_max_ptr,
    chunk_sum_ptr,
    cand_key_ptr,
    num_chunks,
    tiles_per_chunk,
    mask_ptr,
    index_ptr,
    map_ptr,
    num_masks,
    mask_width,
    K: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKED: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    HAS_MAP: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    lanes = tl.arange(0, K_PAD)
    slot = row.to(tl.int64) * num_chunks + chunk
    if CHUNKED:  # several tiles a program, kept above a running floor
        first_tile = chunk * tiles_per_chunk
        end_tile = tl.minimum(first_tile + tiles_per_chunk, tl.cdiv(vocab, BLOCK))
        # Loads stop at the chunk's end (a scalar bound: the interpreter rejects a vector mask
        # combined with a 0-d bool).
        chunk_end = tl.minimum(end_tile * BLOCK, vocab)
        best = _empty_list(lanes, K)  # replaced by the first tile's list
        run_max = tl.full([], float("-inf"), tl.float32)
        run_sum = tl.full([], 0.0, tl.float32)
        cols = first_tile * BLOCK + tl.arange(0, BLOCK)
        raw_next = tl.load(row_ptr + cols.to(tl.int64) * stride_col, mask=cols < chunk_end, other=0.0)
        for tile in range(first_tile, end_tile):
            # The next tile's logits are in flight while this one is reduced.
            raw = raw_next
            cols = tile * BLOCK + tl.arange(0, BLOCK)
            next_cols = cols + BLOCK
            raw_next = tl.load(row_ptr + next_cols.to(tl.int64) * stride_col, mask=next_cols < chunk_end, other=0.0)
            in_vocab = cols < vocab
            values, allowed = _tile_values(raw, cols, in_vocab, row, tile, mask_ptr, index_ptr, map_ptr, num_masks, mask_width,
                                           BLOCK, HAS_MASK, HAS_INDEX, HAS_MAP)
            tile_max = tl.max(values, axis=0)
            new_max = tl.maximum(run_max, tile_max)
            safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
            tile_sum = tl.sum(tl.where(in_vocab, tl.exp(values - safe_max), 0.0), axis=0)
            run_sum = run_sum * tl.exp(run_max - safe_max) + tile_sum
            run_max = new_max
            if tile == first_tile:
                best = _best_of_tile(_tile_keys(values, allowed, cols, in_vocab, HAS_MASK), lanes, K)
            else:
                floor = tl.min(best, axis=0)
                # A real floor (above every masked key) is beaten only by a larger value: this
                # tile's ids are larger than every id already kept, so an equal value ranks below.
                if (floor <= MASKED_KEY_TOP) | (tile_max > _key_value(floor)):
                    keys = _tile_keys(values, allowed, cols, in_vocab, HAS_MASK)
                    entering = tl.minimum(tl.sum((keys > floor).to(tl.int32), axis=0), K)
                    for _ in range(entering):
                        # The tile's best remaining key replaces the current floor if it beats it.
                        top = tl.max(keys, axis=0)
                        floor = tl.min(best, axis=0)
                        best = tl.where(best == floor, tl.maximum(top, floor), best)
                        keys = tl.where(keys == top, EMPTY_KEY, keys)
        # Sorted (descending) for the merge's k-way heads.
        sorted_best = best
        for j in tl.static_range(K):
            top = tl.max(tl.where(lanes < K, best, EMPTY_KEY), axis=0)
            sorted_best = tl.where(lanes == j, top, sorted_best)
            best = tl.where(best == top, EMPTY_KEY, best)
        tl.store(cand_key_ptr + slot * K + lanes, sorted_best, mask=lanes < K)
    else:  # one tile a program (tiles_per_chunk is 1): K passes over it
        cols = chunk * BLOCK + tl.arange(0, BLOCK)
        in_vocab = cols < vocab
        raw = tl.load(row_ptr + cols.to(tl.int64) * stride_col, mask=in_vocab, other=0.0)
        values, allowed = _tile_values(raw, cols, in_vocab, row, chunk, mask_ptr, index_ptr, map_ptr, num_masks, mask_width,
                                       BLOCK, HAS_MASK, HAS_INDEX, HAS_MAP)
        run_max = tl.max(values, axis=0)
        safe_max = tl.where(run_max == float("-inf"), 0.0, run_max)
        run_sum = tl.sum(tl.where(in_vocab, tl.exp(values - safe_max), 0.0), axis=0)
        # Each pass's key stored as it is found: collecting them in a list first measured 4-10%
        # slower at k = 8 and 16 on the H100. Pass j keeps the best key strictly below pass j-1's;
        # a tile with fewer than K valid lanes fills its tail with EMPTY_KEY (never merged: a row
        # holds at least k keys).
        keys = _tile_keys(values, allowed, cols, in_vocab, HAS_MASK)
        for j in tl.static_range(K):
            top = tl.max(keys, axis=0)
            tl.store(cand_key_ptr + slot * K + j, top)
            keys = tl.where(keys == top, EMPTY_KEY, keys)
    tl.store(chunk_max_ptr + slot, run_max)
    tl.store(chunk_sum_ptr + slot, run_sum)


@triton.jit
def _merge_chunks_kernel(
    chunk_max_ptr,
    chunk_sum_ptr,
    cand_key_ptr,
    token_map_ptr,
    probs_ptr,
    ids_ptr,
    num_chunks,
    K: tl.constexpr,
    CHUNKS_PAD: tl.constexpr,
    HAS_TOKEN_MAP: tl.constexpr,
):
    row = tl.program_id(0)
    chunks = tl.arange(0, CHUNKS_PAD)
    chunk_ok = chunks < num_chunks
    base = row.to(tl.int64) * num_chunks
    chunk_max = tl.load(chunk_max_ptr + base + chunks, mask=chunk_ok, other=float("-inf"))
    chunk_sum = tl.load(chunk_sum_ptr + base + chunks, mask=chunk_ok, other=0.0)
    row_max = tl.max(chunk_max, axis=0)
    row_finite = row_max > float("-inf")
    safe_row_max = tl.where(row_finite, row_max, 0.0)
    scale = tl.where(chunk_max > float("-inf"), tl.exp(chunk_max - safe_row_max), 0.0)
    # An all -inf row has no normaliser; 1.0 keeps the (discarded) division finite.
    normaliser = tl.where(row_finite, tl.sum(chunk_sum * scale, axis=0), 1.0)

    # k-way merge: each chunk's keys are already sorted, so pass j compares only the chunks'
    # current heads and advances the winning chunk (keys are unique: they contain the id). A row
    # holds at least k real keys, so EMPTY_KEY is never emitted.
    head = tl.zeros([CHUNKS_PAD], dtype=tl.int32)
    for j in tl.static_range(K):
        head_keys = tl.load(cand_key_ptr + (base + chunks) * K + head, mask=chunk_ok & (head < K), other=EMPTY_KEY)
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
    tiles_per_chunk: int

    @property
    def chunked(self) -> bool:
        return self.tiles_per_chunk > 1

    def chunks(self, vocab: int) -> int:
        return cdiv(cdiv(vocab, self.block), self.tiles_per_chunk)


MASKED_BLOCK = 2048  # widest tile of a masked launch
# Long rows over few programs: 2048-id tiles in chunks of at least CHUNK_MIN_TILES (32K ids), about
# CHUNK_PROGRAMS_PER_SM programs per SM. Measured on the H100 (bs 256, V 151936, k 4 / 8: 139.6 /
# 236.8 us with one tile a program, 93.2 / 125.3 us chunked); shorter chunks (8 tiles at V 32000,
# 5 of 4096 ids at bs 64) were slower than one tile a program: each chunk's first tiles still
# need their k passes, and fewer programs hide less latency.
# Unmasked launches of k <= CHUNK_MAX_K only: with k = 16 the running list spills 6-75 registers on
# gfx90a/gfx942/gfx950, and the mask and map loads beside it keep an 8-16 B local frame on sm_80 /
# sm_90 / sm_100 (offline compile matrix, Triton 3.9).
# k = 1 has one selection pass a tile either way; chunks of it measured 3-8% slower at 21-25 tiles
# (bs 128) and 6-9% faster at 32 or more (bs >= 256, V >= 128256).
CHUNK_MIN_TILES = 16
CHUNK_MIN_TILES_K1 = 32
CHUNK_PROGRAMS_PER_SM = 2
CHUNK_MAX_K = 8


def _padded(count: int) -> int:
    """Power-of-two extent (at least 2) for a tl.arange over ``count`` items."""
    return max(next_power_of_2(count), 2)


@functools.lru_cache(maxsize=1024)  # a pure function of (target, ints): computed once per shape
def launch_config(target: KernelTarget, rows: int, vocab: int, masked: bool = False, k: int = 1) -> TopkLaunch:
    """Tile width, warps and tiles per chunk per target.

    Large unmasked batches of long rows give each program a chunk of its row (``CHUNK_MIN_TILES``,
    ``CHUNK_MAX_K``); other shapes give each program one tile, and small batches use narrower
    tiles so that a row spreads over more programs (more SMs busy). AMD runs wave64, so the same
    256 threads per program are 4 warps instead of 8. The interpreter runs one Python loop per program, so it takes the widest
    tile, one per row. A masked launch has tiles of at most MASKED_BLOCK (the mask and map loads
    spill at 16 elements per thread on sm_90).
    """
    if target.vendor == "interpreter":
        return TopkLaunch(block=min(max(next_power_of_2(vocab), 16), 65536), tile_warps=1, merge_warps=1, tiles_per_chunk=1)
    warps, merge_warps = target.warps(256), target.warps(128)
    tiles = cdiv(vocab, 2048)
    chunk_tiles = cdiv(tiles, max(1, min(tiles, cdiv(CHUNK_PROGRAMS_PER_SM * target.multiprocessors, max(rows, 1)))))
    if chunk_tiles >= (CHUNK_MIN_TILES_K1 if k == 1 else CHUNK_MIN_TILES) and k <= CHUNK_MAX_K and not masked:
        return TopkLaunch(block=2048, tile_warps=warps, merge_warps=merge_warps, tiles_per_chunk=chunk_tiles)
    block = 2048 if rows * cdiv(vocab, 4096) < 2 * target.multiprocessors else 4096
    block = min(block, max(next_power_of_2(vocab), 128))
    if masked:
        block = min(block, MASKED_BLOCK)
    return TopkLaunch(block=block, tile_warps=warps, merge_warps=merge_warps, tiles_per_chunk=1)


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
    has_mask = token_bitmask is not None
    config = launch_config(target, rows, vocab, has_mask, k)
    num_chunks = config.chunks(vocab)
    if token_map is not None:
        token_map = token_map.contiguous()  # indexed with unit stride (a no-op for the usual map)
    # Scratch comes from torch's caching allocator: no device malloc per call, capture-safe.
    chunk_max = torch.empty((rows, num_chunks), dtype=torch.float32, device=device)
    chunk_sum = torch.empty((rows, num_chunks), dtype=torch.float32, device=device)
    cand_keys = torch.empty((rows, num_chunks, k), dtype=torch.int64, device=device)
    mask = token_bitmask.contiguous() if has_mask else chunk_max  # placeholders, never read
    _chunk_topk_kernel[(rows, num_chunks)](
        logits, logits.stride(0), logits.stride(1), vocab,
        chunk_max, chunk_sum, cand_keys, num_chunks, config.tiles_per_chunk,
        mask, bitmask_index if bitmask_index is not None else mask, token_map if has_mask and token_map is not None else mask,
        mask.shape[0] if has_mask else 0, mask.shape[1] if has_mask else 0,
        K=k, K_PAD=next_power_of_2(k), BLOCK=config.block, CHUNKED=config.chunked, HAS_MASK=has_mask, HAS_INDEX=bitmask_index is not None,
        HAS_MAP=has_mask and token_map is not None, num_warps=config.tile_warps,
    )
    _merge_chunks_kernel[(rows,)](
        chunk_max, chunk_sum, cand_keys,
        token_map if token_map is not None else chunk_max,  # placeholder pointer, never read
        out[0], out[1], num_chunks,
        K=k, CHUNKS_PAD=_padded(num_chunks), HAS_TOKEN_MAP=token_map is not None,
        num_warps=config.merge_warps,
    )
    return out[0], out[1]


PROVIDERS = {"draft_topk": (draft_topk, "kernels/topk.py: chunk top-k above a running floor + merge, 2 launches")}

_LOGIT_TYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


# (HAS_MASK, HAS_INDEX, HAS_MAP, index pointer type, map pointer type) of the chunk kernel's launches.
_MASKINGS = ((False, False, False, "*fp32", "*fp32"), (True, False, False, "*i32", "*i32"), (True, True, False, "*i32", "*i32"),
             (True, True, True, "*i64", "*i64"), (True, True, True, "*i32", "*i32"))


def _chunk_signature(logit_type: str, k: int, config: TopkLaunch, vocab: int, has_mask, has_index, has_map, index_type, map_type):
    """(signature, constexprs, runtime int values) of one ``_chunk_topk_kernel`` launch."""
    mask_type = "*i32" if has_mask else "*fp32"
    signature = {"logits_ptr": f"*{logit_type}", "stride_row": "i64", "stride_col": "i64", "vocab": "i32",
                 "chunk_max_ptr": "*fp32", "chunk_sum_ptr": "*fp32", "cand_key_ptr": "*i64", "num_chunks": "i32",
                 "tiles_per_chunk": "i32", "mask_ptr": mask_type, "index_ptr": index_type if has_index else mask_type,
                 "map_ptr": map_type if has_map else mask_type, "num_masks": "i32", "mask_width": "i32", "K": "constexpr",
                 "K_PAD": "constexpr", "BLOCK": "constexpr", "CHUNKED": "constexpr", "HAS_MASK": "constexpr", "HAS_INDEX": "constexpr",
                 "HAS_MAP": "constexpr"}
    constexprs = {"K": k, "K_PAD": next_power_of_2(k), "BLOCK": config.block, "CHUNKED": config.chunked, "HAS_MASK": has_mask,
                  "HAS_INDEX": has_index, "HAS_MAP": has_map}
    width = cdiv(vocab, 32) if has_mask else 0
    values = {"stride_row": vocab, "stride_col": 1, "vocab": vocab, "num_chunks": config.chunks(vocab),
              "tiles_per_chunk": config.tiles_per_chunk, "num_masks": 64 if has_mask else 0, "mask_width": width}
    return signature, constexprs, values


def compile_specs(target: KernelTarget):
    """Every distinct (kernel, signature, constexprs, num_warps[, attrs]) the host function launches
    on ``target``: each launch config, each logits dtype, and the smallest and largest k (k sets
    the candidate list's width and how many passes are unrolled, so these bound register use; a
    chunked launch's largest k is CHUNK_MAX_K); each generic (misaligned pointers) and as Triton specialises it at run time for
    contiguous logits (``launch.runtime_specialized``: the unit column stride is a constexpr)."""
    specs = {}
    for rows, vocab in ((1, 151936), (256, 151936), (1, 127)):
        for k in (1, CHUNK_MAX_K, MAX_TOPK):
            for logit_type in _LOGIT_TYPES:
                for masking in _MASKINGS:
                    config = launch_config(target, rows, vocab, masking[0], k)
                    if k == CHUNK_MAX_K and not config.chunked:
                        continue  # one tile a program: bounded by k = 1 and MAX_TOPK
                    signature, constexprs, values = _chunk_signature(logit_type, k, config, vocab, *masking)
                    key = ("chunk", logit_type, k, config.block, config.chunked, config.tile_warps, masking)
                    specs[key] = (_chunk_topk_kernel, signature, constexprs, config.tile_warps)
                    specs[key + (vocab,)] = runtime_specialized(target, _chunk_topk_kernel, signature, constexprs, config.tile_warps,
                                                                values=values)
            # Without a token map the placeholder pointer is chunk_max (fp32). A masked launch
            # has narrower tiles (MASKED_BLOCK), so possibly more chunks to merge.
            for masked in (False, True):
                config = launch_config(target, rows, vocab, masked, k)
                if k == CHUNK_MAX_K and not config.chunked:
                    continue  # bounded by k = 1 and MAX_TOPK, as the chunk kernel above
                chunks = config.chunks(vocab)
                for map_type, has_map in (("i32", True), ("i64", True), ("fp32", False)):
                    signature = {"chunk_max_ptr": "*fp32", "chunk_sum_ptr": "*fp32", "cand_key_ptr": "*i64",
                                 "token_map_ptr": f"*{map_type}", "probs_ptr": "*fp32",
                                 "ids_ptr": "*i64", "num_chunks": "i32", "K": "constexpr", "CHUNKS_PAD": "constexpr",
                                 "HAS_TOKEN_MAP": "constexpr"}
                    constexprs = {"K": k, "CHUNKS_PAD": _padded(chunks), "HAS_TOKEN_MAP": has_map}
                    key = ("merge", map_type, k, _padded(chunks), config.merge_warps)
                    specs[key] = (_merge_chunks_kernel, signature, constexprs, config.merge_warps)
                    specs[key + (chunks,)] = runtime_specialized(target, _merge_chunks_kernel, signature, constexprs, config.merge_warps,
                                                                 values={"num_chunks": chunks})
    return list(specs.values())


def describe_launch(target: KernelTarget) -> list[str]:
    lines = []
    for rows, vocab in ((1, 151936), (64, 151936), (256, 32000), (256, 151936)):
        config = launch_config(target, rows, vocab)
        lines.append(
            f"draft_topk bs={rows} V={vocab}: BLOCK={config.block}, {cdiv(vocab, config.block)} tiles/row in "
            f"{config.chunks(vocab)} chunks, {config.tile_warps} warps x {target.warp_size} lanes, merge {config.merge_warps} warps"
        )
    return lines
