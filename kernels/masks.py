"""Triton kernels of family ``masks``. Semantics: spec_hal/masks.py.

Device helpers other kernels import (``from .masks import mask_row_base, token_allowed``):

* ``mask_row_base(index_ptr, rows, ok, width, HAS_INDEX)``: each row's mask row as a word offset
  (int64) and whether it is constrained. Without an index row r uses mask row r.
* ``token_allowed(mask_ptr, base, constrained, tokens, ok, width)``: the bit of ``tokens`` in
  the row's mask; True where the row is unconstrained. An unconstrained row loads nothing, so
  rows without a grammar cost no memory traffic.
* ``tile_words`` + ``words_allowed`` ((R,) rows' tiles of ids, at one start for all rows or one
  per row; the load apart from the bit test; ``tile_words_clamped``: the same words loaded at
  clamped addresses, without a per-word predicate), ``rows_tile_allowed`` (both, at one start) and
  ``tile_allowed`` (both, for one row): each mask word loaded once, contiguously.

``_apply_bitmask_kernel`` (grid: rows x tiles) works per 32-byte sector of a constrained row
(``SECTOR`` ids a thread): a sector whose ids are all allowed is left alone, one with none allowed
is written -inf without a read, a mixed one is read and written whole. An unconstrained row is
neither read nor written.
"""
from __future__ import annotations

import functools

from typing import Optional

import torch
import triton
import triton.language as tl

from .launch import KernelTarget, runtime_specialized, cdiv, next_power_of_2


@triton.jit
def mask_row_base(index_ptr, rows, ok, num_masks, width, HAS_INDEX: tl.constexpr):
    """(word offset of each row's mask row (int64), constrained (bool)) for row ids ``rows``."""
    if HAS_INDEX:
        mask_row = tl.load(index_ptr + rows, mask=ok, other=-1).to(tl.int64)
    else:
        mask_row = tl.where(ok, rows.to(tl.int64), -1)
    constrained = ok & (mask_row >= 0) & (mask_row < num_masks)
    mask_row = tl.where(constrained, mask_row, 0)
    if HAS_INDEX:
        if index_ptr.dtype.element_ty == tl.int64:
            # In [0, num_masks) here, so an int32 holds it exactly wherever num_masks is an int32
            # (or the constexpr 1): an int64 index's row kept 64 bits live, one SGPR too many for
            # the tree sampling walk on gfx90a (a spill at 100). Compile-time branches only.
            if isinstance(num_masks, tl.tensor):
                if num_masks.dtype == tl.int32:
                    mask_row = mask_row.to(tl.int32).to(tl.int64)
            else:
                mask_row = mask_row.to(tl.int32).to(tl.int64)
    return mask_row * width, constrained


@triton.jit
def token_allowed(mask_ptr, base, constrained, tokens, ok, width):
    """Bit ``tokens`` of the mask words at ``base`` (shapes broadcast); True where unconstrained.
    A token outside [0, 32 * width) is not allowed at a constrained row."""
    tokens = tokens.to(tl.int64)
    in_range = (tokens >= 0) & (tokens < width * 32)
    load = ok & constrained & in_range
    word = tl.load(mask_ptr + base + tl.where(in_range, tokens >> 5, 0), mask=load, other=0)
    bit = (word >> tl.where(in_range, tokens & 31, 0).to(tl.int32)) & 1
    return tl.where(constrained, in_range & (bit != 0), True)


@triton.jit
def tile_words(mask_ptr, base, constrained, first_col, width, BLOCK: tl.constexpr):
    """The BLOCK // 32 mask words of ids ``first_col + arange(BLOCK)`` of each row (``first_col``
    a multiple of 32, one for all rows (a scalar) or one per row ((R, 1)); BLOCK a power of two
    >= 32; ``base``, ``constrained``: (R,)), as (R, BLOCK // 32) int32: one contiguous load per
    row. An unconstrained row's words are all ones, so that ``words_allowed`` needs no per-id
    select; a constrained row's words past the mask's width are 0 (nothing allowed there) and
    never loaded. Loaded apart from ``words_allowed`` so that a loop can issue them a tile ahead."""
    word_ids = first_col // 32 + tl.arange(0, BLOCK // 32)[None, :]
    words = tl.load(mask_ptr + base[:, None] + word_ids, mask=constrained[:, None] & (word_ids < width), other=0)
    return tl.where(constrained[:, None], words, -1)


@triton.jit
def tile_words_clamped(mask_ptr, base, constrained, first_col, width, BLOCK: tl.constexpr, PREDICATE: tl.constexpr):
    """``tile_words`` with every load's address clamped into its row's ``width`` words, so that no
    load carries a per-word bound (the words past the width are set to 0 after the load).
    PREDICATE "row": the loads are predicated on the row's ``constrained`` flag alone (the same
    for every thread of a one-request program), so an unconstrained row loads nothing. "none":
    no predicate at all; an unconstrained row (``mask_row_base`` gives it row 0) loads row 0's
    words and discards them, so a launch must have at least one mask row (``MaskArgs.of`` drops
    a mask of zero rows, under which every row is unconstrained). Why: with the per-word
    predicate of ``tile_words`` read a tile ahead, ptxas scheduled some chain sampling launches
    so that the loop waited on the loads' operands (Nsight Compute, H200: 7.7 against 5.7 cycles
    an issued instruction, same instruction count; BENCHMARKS.md, thirty-fifth session)."""
    word_ids = first_col // 32 + tl.arange(0, BLOCK // 32)[None, :]
    in_row = tl.minimum(word_ids, width - 1)
    tl.static_assert(PREDICATE == "row" or PREDICATE == "none", "PREDICATE is \"row\" or \"none\"")
    if PREDICATE == "row":
        words = tl.load(mask_ptr + base[:, None] + in_row, mask=constrained[:, None], other=-1)
        return tl.where(word_ids < width, words, tl.where(constrained[:, None], 0, -1))
    words = tl.load(mask_ptr + base[:, None] + in_row)
    return tl.where(constrained[:, None], tl.where(word_ids < width, words, 0), -1)


@triton.jit
def words_allowed(words, BLOCK: tl.constexpr):
    """(R, BLOCK) allowed flags of the ids whose ``tile_words`` are ``words`` (bit j of word i:
    id 32 i + j). Each id is tested against its bit as a constant (1 << j: the same few
    registers a thread in every tile): one AND an id, where shifting the word by j first cost
    two. Unconstrained rows need no test of their own (``tile_words`` gives them all-ones words)."""
    bit_of_id = 1 << tl.arange(0, 32)  # int32: 1 << 31 is the sign bit, still one bit
    return tl.reshape((words[:, :, None] & bit_of_id[None, None, :]) != 0, [words.shape[0], BLOCK])


@triton.jit
def rows_tile_allowed(mask_ptr, base, constrained, first_col, width, BLOCK: tl.constexpr):
    """``token_allowed`` of the BLOCK consecutive ids ``first_col + arange(BLOCK)`` of each of R
    rows (``first_col`` a multiple of 32 (a scalar); BLOCK a power of two; ``base``,
    ``constrained``: (R,)), as (R, BLOCK): ``tile_words`` + ``words_allowed``, the tile's BLOCK /
    32 words of a row in one contiguous load (a word load per id, as token_allowed does, cost
    1.4x the unmasked time in the sampling walks and 1.5-2.0x in verify_tree_sampling on the
    H100). Narrower than one word (the interpreter's tiles of tiny vocabularies): token_allowed."""
    if BLOCK < 32:
        cols = first_col + tl.arange(0, BLOCK)[None, :]
        allowed = token_allowed(mask_ptr, base[:, None], constrained[:, None], cols, True, width)
    else:
        allowed = words_allowed(tile_words(mask_ptr, base, constrained, first_col, width, BLOCK), BLOCK)
    return allowed


@triton.jit
def tile_allowed(mask_ptr, base, constrained, first_col, width, BLOCK: tl.constexpr):
    """``rows_tile_allowed`` of one row (``base``, ``constrained`` scalars), as (BLOCK,)."""
    # the row's scalars broadcast as (1,) ints first: the interpreter rejects a load mask made
    # from the 0-d bool (a scalar row's flag); compiled, it folds away.
    one_row = tl.zeros([1], dtype=tl.int32)
    allowed = rows_tile_allowed(mask_ptr, one_row + base, (one_row + constrained.to(tl.int32)) != 0, first_col, width, BLOCK)
    return tl.reshape(allowed, [BLOCK])


@triton.jit
def _apply_bitmask_kernel(logits_ptr, stride_row, stride_col, vocab, mask_ptr, index_ptr, num_masks, width,
                          BLOCK: tl.constexpr, HAS_INDEX: tl.constexpr, SECTOR: tl.constexpr):
    """One row's BLOCK ids, as (BLOCK / SECTOR, SECTOR) groups of 32 bytes. A -inf store per masked
    id (the kernel until 2026-11-30: scalar stores, sectors written partially) took 1.4-1.9x the
    time of a logits copy with 30% of the ids masked at random and 1.05-1.7x with 99.5% (H200, up
    to 311 MB of logits); whole sectors, read only where mixed, 0.23-1.12x over those masks, 0.5%
    masked and runs (BENCHMARKS.md, forty-fourth session)."""
    row = tl.program_id(0)
    first_col = tl.program_id(1) * BLOCK
    base, constrained = mask_row_base(index_ptr, row, True, num_masks, width, HAS_INDEX)
    if constrained:  # one row a program: a row the index leaves unconstrained is neither read nor written
        cols = first_col + tl.arange(0, BLOCK // SECTOR)[:, None] * SECTOR + tl.arange(0, SECTOR)[None, :]
        in_vocab = cols < vocab
        pointers = logits_ptr + row.to(tl.int64) * stride_row + cols.to(tl.int64) * stride_col
        allowed = tl.reshape(tile_allowed(mask_ptr, base, constrained, first_col, width, BLOCK), [BLOCK // SECTOR, SECTOR])
        any_masked = tl.max((allowed == 0).to(tl.int32), axis=1)[:, None] != 0
        any_allowed = tl.max(allowed.to(tl.int32), axis=1)[:, None] != 0
        values = tl.load(pointers, mask=in_vocab & any_masked & any_allowed, other=float("-inf"))
        tl.store(pointers, tl.where(allowed, values, float("-inf")), mask=in_vocab & any_masked)


@functools.lru_cache(maxsize=1024)  # a pure function of ints: computed once per shape
def _launch(target: KernelTarget, vocab: int, element_size: int) -> tuple[int, int]:
    """(BLOCK, SECTOR): 32 bytes of logits a group; on a GPU one group a thread, 256 threads."""
    sector = 32 // element_size
    if target.vendor == "interpreter":
        return min(max(next_power_of_2(vocab), 32), 65536), sector
    return min(256 * sector, max(next_power_of_2(vocab), 128)), sector


def apply_token_bitmask_(logits: torch.Tensor, token_bitmask: torch.Tensor, *, bitmask_index: Optional[torch.Tensor] = None,
                         target: KernelTarget) -> torch.Tensor:
    """Triton provider of ``apply_token_bitmask_`` (arguments validated by the caller)."""
    rows, vocab = logits.shape
    if rows == 0:
        return logits
    block, sector = _launch(target, vocab, logits.element_size())
    # the kernel reads the index with stride 1 (a sliced or expanded index is copied)
    index = bitmask_index.contiguous() if bitmask_index is not None else token_bitmask  # placeholder, never read
    stride_row, stride_col = logits.stride()
    num_masks, width = token_bitmask.shape
    _apply_bitmask_kernel[(rows, cdiv(vocab, block))](
        logits, stride_row, stride_col, vocab, token_bitmask.contiguous(), index, num_masks, width, BLOCK=block,
        HAS_INDEX=bitmask_index is not None, SECTOR=sector, num_warps=target.warps(256))
    return logits


PROVIDERS = {"apply_token_bitmask_": (apply_token_bitmask_, "kernels/masks.py: per 32-byte sector: skipped, -inf written, or read and written")}


def compile_specs(target: KernelTarget):
    specs = []
    for rows, vocab in ((64, 151936), (3, 100)):
        width = cdiv(vocab, 32)
        for logit_type, element_size in (("fp32", 4), ("bf16", 2), ("fp16", 2), ("fp64", 8)):
            block, sector = _launch(target, vocab, element_size)
            for index_type, has_index in (("*i32", True), ("*i64", True), ("*i32", False)):
                signature = {"logits_ptr": f"*{logit_type}", "stride_row": "i64", "stride_col": "i64", "vocab": "i32",
                             "mask_ptr": "*i32", "index_ptr": index_type, "num_masks": "i32", "width": "i32",
                             "BLOCK": "constexpr", "HAS_INDEX": "constexpr", "SECTOR": "constexpr"}
                constexprs = {"BLOCK": block, "HAS_INDEX": has_index, "SECTOR": sector}
                specs.append((_apply_bitmask_kernel, signature, constexprs, target.warps(256)))
                specs.append(runtime_specialized(target, _apply_bitmask_kernel, signature, constexprs, target.warps(256),
                                                 values={"stride_row": vocab, "stride_col": 1, "vocab": vocab, "num_masks": rows,
                                                         "width": width}))
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    block, sector = _launch(target, 151936, 4)
    return [f"apply_token_bitmask_ V=151936 float32: BLOCK={block} in groups of {sector} ids (32 bytes), {target.warps(256)} warps; "
            "a group is skipped (all allowed), written -inf (none allowed) or read and written (mixed)"]
