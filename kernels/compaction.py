"""Triton kernels of family ``compaction``: ``bonus_tokens`` and ``compact_accepted``, one launch
each. Semantics: spec_hal/compaction.py.

Strides come from tensors: the accept width W is ``accept_index.shape[1]`` and N is
``predict.shape[0] // bs``; the kernels take the row strides of every input, so strided views work.

``compact_accepted`` is a row gather over a 2-D grid (rows, column tiles): row ``b*N + r`` reads
row ``accept_index[b, r]`` when ``r < accept_lens[b]``, else itself. It writes a separate output,
so no program reads a row another program writes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spec_hal import error_flag
from spec_hal.compaction import batch_first, record_verdict_values

from .error_flag import ARGUMENT_STEP, record_invalid
from .launch import KernelTarget, cdiv, next_power_of_2


@triton.jit
def _record_verdict(accept_index_ptr, index_stride_row, index_stride_col, b, in_batch, length, width, nodes,
                    flag_ptr, flag_code):
    """The default-mode records of spec_hal.compaction.record_verdict_values for requests ``b``:
    accept_lens outside [1, min(W, N)] at index b, and the first used accept_index entry (rank r
    < min(accept_lens, W, N)) outside the request's block at index b*W + r (the smallest flat
    index of the request, so the atomic min keeps what the reference keeps)."""
    limit = tl.minimum(width, nodes).to(tl.int64)
    record_invalid(flag_ptr, flag_code, in_batch & ((length < 1) | (length > limit)), b)
    used = tl.where(in_batch, tl.minimum(length, limit), 0)
    first = tl.zeros_like(b) + width
    for rank in range(0, width):
        checked = (rank < used) & (first == width)
        node = tl.load(accept_index_ptr + b * index_stride_row + rank * index_stride_col, mask=checked, other=0).to(tl.int64)
        foreign = checked & ((node < b * nodes) | (node >= (b + 1) * nodes))
        first = tl.where(foreign, rank, first)
    record_invalid(flag_ptr, flag_code + ARGUMENT_STEP, first < width, b * width + first)


@triton.jit
def _bonus_tokens_kernel(predict_ptr, predict_stride, accept_index_ptr, index_stride_row, index_stride_col,
                         accept_lens_ptr, lens_stride, out_ptr, rows, width, num_predict, flag_ptr, flag_code,
                         BLOCK: tl.constexpr):
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_batch = b < rows
    length = tl.load(accept_lens_ptr + b.to(tl.int64) * lens_stride, mask=in_batch, other=1).to(tl.int64)
    in_width = in_batch & (length >= 1) & (length <= width)
    node = tl.load(accept_index_ptr + b.to(tl.int64) * index_stride_row + (length - 1) * index_stride_col, mask=in_width, other=0).to(tl.int64)
    nodes = num_predict // rows
    in_range = in_width & (node >= b.to(tl.int64) * nodes) & (node < (b.to(tl.int64) + 1) * nodes)  # own block only
    token = tl.load(predict_ptr + node * predict_stride, mask=in_range, other=-1)
    tl.store(out_ptr + b, token, mask=in_batch)
    _record_verdict(accept_index_ptr, index_stride_row, index_stride_col, b.to(tl.int64), in_batch, length, width, nodes,
                    flag_ptr, flag_code)


@triton.jit
def _compact_rows_kernel(x_ptr, x_stride, out_ptr, accept_index_ptr, index_stride_row, index_stride_col,
                         accept_lens_ptr, lens_stride, num_nodes, width, total_rows, columns, flag_ptr, flag_code,
                         ROWS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    in_rows = row < total_rows
    b = row // num_nodes
    rank = row - b * num_nodes
    length = tl.load(accept_lens_ptr + b * lens_stride, mask=in_rows, other=0).to(tl.int64)
    on_path = in_rows & (rank < length) & (rank < width)
    # Ranks past the path (or past the accept width) never read accept_index: bug 4b's OOB read.
    source = tl.load(accept_index_ptr + b * index_stride_row + rank * index_stride_col, mask=on_path, other=0).to(tl.int64)
    own = (source >= b * num_nodes) & (source < (b + 1) * num_nodes)
    # Default-mode records (spec_hal.compaction.record_verdict_values), by the first column tile,
    # one atomic a row: accept_lens outside [1, min(W, N)] at index b (from rank 0; it sorts
    # before any accept_index record), else a used entry outside the block at index b*W + rank.
    records = in_rows & (tl.program_id(1) == 0)
    lens_bad = (rank == 0) & ((length < 1) | (length > tl.minimum(width, num_nodes)))
    record_invalid(flag_ptr, flag_code, records & (lens_bad | (on_path & ~own)),
                   tl.where(lens_bad, b, ARGUMENT_STEP + b * width + rank))
    source = tl.where(on_path & own, source, row)  # own block only
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = in_rows[:, None] & (cols < columns)[None, :]
    values = tl.load(x_ptr + source[:, None] * x_stride + cols[None, :], mask=mask)
    tl.store(out_ptr + row[:, None] * columns + cols[None, :], values, mask=mask)


def compact_launch(target: KernelTarget, columns: int, element_size: int) -> tuple[int, int, int]:
    """(ROWS, BLOCK columns, warps): tiles of up to 16 KiB on GPUs (narrow rows such as predict
    share a program, wide hidden rows split into column tiles); the interpreter takes whole rows
    and many of them per program (its cost is per program).

    Per-thread limits keep every tile in registers (the compile matrix's resource report): at most
    8 rows per thread (each row carries its own int64 source index and pointers: 16384 one-column
    rows in 256 threads spilled on every target) and 64 bytes per thread on NVIDIA, 32 on AMD
    (a 64-byte share spilled VGPRs on CDNA; there the 16 KiB tile takes 8 wavefronts)."""
    block = max(next_power_of_2(columns), 1)
    if target.vendor == "interpreter":
        return max(1, min(1024, 65536 // block)), block, 1
    block = min(block, 16384 // element_size)
    bytes_per_thread = 32 if target.vendor == "amd" else 64
    max_threads = 8 * target.warp_size
    rows = max(1, min(16384 // (block * element_size), 8 * max_threads))
    threads = max(rows * block * element_size // bytes_per_thread, cdiv(rows, 8))
    return rows, block, max(1, min(8, threads // target.warp_size))


def bonus_tokens(verdict, *, out=None, target: KernelTarget):
    """Triton provider of ``bonus_tokens`` (validated by the caller; see spec_hal.compaction)."""
    rows, width = verdict.accept_index.shape
    predict = verdict.predict
    if out is None:
        out = torch.empty((rows,), dtype=predict.dtype, device=predict.device)
    if rows == 0:
        return out
    block = 128
    _bonus_tokens_kernel[(cdiv(rows, block),)](
        predict, predict.stride(0), verdict.accept_index, verdict.accept_index.stride(0), verdict.accept_index.stride(1),
        verdict.accept_lens, verdict.accept_lens.stride(0), out, rows, width, predict.shape[0],
        error_flag.flag(predict.device), _BONUS_CODE, BLOCK=block, num_warps=1 if target.vendor == "interpreter" else 4,
    )
    return out


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """(rows, columns) view with unit column stride (bool moved as uint8); copies only if needed."""
    if x.dtype == torch.bool:
        x = x.view(torch.uint8)
    rows = x.reshape(x.shape[0], -1) if x.dim() != 2 else x
    if rows.shape[1] > 1 and rows.stride(1) != 1:
        rows = rows.contiguous()
    return rows


def compact_accepted(x, verdict, *, out=None, target: KernelTarget):
    """Triton provider of ``compact_accepted`` (validated by the caller; see spec_hal.compaction)."""
    if batch_first(x, verdict):  # (bs, N, ...): compact the (bs*N, ...) view
        flat_out = None if out is None else out.view(-1, *x.shape[2:])
        return compact_accepted(x.flatten(0, 1), verdict, out=flat_out, target=target).view(x.shape)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows, width = verdict.accept_index.shape
    if rows == 0:
        return out
    if x.numel() == 0:  # nothing to move, no launch: the (degenerate) records come from torch ops
        record_verdict_values("compact_accepted", verdict)
        return out
    source = _as_rows(x.unsqueeze(1) if x.dim() == 1 else x)
    total_rows, columns = source.shape
    tile_rows, block, warps = compact_launch(target, columns, source.element_size())
    _compact_rows_kernel[(cdiv(total_rows, tile_rows), cdiv(columns, block))](
        source, source.stride(0), out.view(torch.uint8) if out.dtype == torch.bool else out,
        verdict.accept_index, verdict.accept_index.stride(0), verdict.accept_index.stride(1),
        verdict.accept_lens, verdict.accept_lens.stride(0), total_rows // rows, width, total_rows, columns,
        error_flag.flag(x.device), _COMPACT_CODE, ROWS=tile_rows, BLOCK=block, num_warps=warps,
    )
    return out


# The ops' first error-flag codes (accept_lens; accept_index is + ARGUMENT_STEP).
_BONUS_CODE = error_flag.code("bonus_tokens", "verdict.accept_lens")
_COMPACT_CODE = error_flag.code("compact_accepted", "verdict.accept_lens")

PROVIDERS = {
    "bonus_tokens": (bonus_tokens, "kernels/compaction.py: one gather per request, 1 launch"),
    "compact_accepted": (compact_accepted, "kernels/compaction.py: row gather over (rows, column tiles), 1 launch"),
}

# One type per element size the host launches (the kernel only loads and stores).
_DATA_TYPES = ("i32", "i64", "bf16", "fp32", "u8")
_SIZES = {"i32": 4, "i64": 8, "bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8, "u8": 1, "i8": 1, "i16": 2}


def compile_specs(target: KernelTarget):
    """Every (kernel, signature, constexprs, num_warps) the host functions launch on ``target``."""
    specs = []
    for index_type in ("i32", "i64"):
        specs.append((_bonus_tokens_kernel,
                      {"predict_ptr": f"*{index_type}", "predict_stride": "i64", "accept_index_ptr": f"*{index_type}",
                       "index_stride_row": "i64", "index_stride_col": "i64", "accept_lens_ptr": f"*{index_type}",
                       "lens_stride": "i64", "out_ptr": f"*{index_type}", "rows": "i32", "width": "i32",
                       "num_predict": "i64", "flag_ptr": "*i64", "flag_code": "i64", "BLOCK": "constexpr"}, {"BLOCK": 128}, 4))
        for data_type in _DATA_TYPES:
            for columns in (1, 4096):
                tile_rows, block, warps = compact_launch(target, columns, _SIZES[data_type])
                specs.append((_compact_rows_kernel,
                              {"x_ptr": f"*{data_type}", "x_stride": "i64", "out_ptr": f"*{data_type}",
                               "accept_index_ptr": f"*{index_type}", "index_stride_row": "i64", "index_stride_col": "i64",
                               "accept_lens_ptr": f"*{index_type}", "lens_stride": "i64", "num_nodes": "i64", "width": "i64",
                               "total_rows": "i64", "columns": "i64", "flag_ptr": "*i64", "flag_code": "i64",
                               "ROWS": "constexpr", "BLOCK": "constexpr"},
                              {"ROWS": tile_rows, "BLOCK": block}, warps))
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    lines = ["bonus_tokens: 128 requests per program"]
    for columns, size in ((1, 4), (4096, 2), (8192, 4)):
        tile_rows, block, warps = compact_launch(target, columns, size)
        lines.append(f"compact_accepted row of {columns} x {size} B: {tile_rows} rows x {block} columns, {warps} warps")
    return lines
