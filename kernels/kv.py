"""Triton kernels of family ``kv``: ``accepted_kv_moves``, ``move_kv``, ``assign_draft_slots``.
Semantics: spec_hal/kv.py.

``accepted_kv_moves``: one lane per (request, rank) over exactly bs*(S+1) entries (S+1 =
``accept_index.shape[1]``); nothing is sized by N (upstream bug 4b launched bs*N).

``move_kv``: ONE launch for all caches that share (dtype, row length, slot stride); the
usual K and V of every layer are one group. The caches' base addresses go in as element offsets
from the first cache (a small int64 table, cached per set of caches), so the kernel needs no
pointer array. Grid: (cache, column tile). A program owns one column tile of one cache for ALL
moves, so no two programs touch the same bytes; it walks the move list in chunks of ``CHUNK``
moves: load the chunk's source tiles, barrier, store them, next chunk, with the next chunk's tiles
read before this one is stored. Inside a chunk every read precedes every write; across chunks a
slot's reader precedes its writer by the op's precondition (reader index < writer index), which
also makes reading ahead safe, so the result is the gather-then-scatter of the reference.
The list is walked as the caller laid it out, -1 entries and all: a first launch that packed the
used moves to the front (until 2026-11-29) cost about 3 us, more than its fuller chunks saved once
the walk kept no atomics (BENCHMARKS.md, thirty-third session). The default-mode records of bad
entries come before the walk, a few entries a program.

``assign_draft_slots``: one program per request computes P9's formula for its K*S draft slots
and its (K-1)*(P-1) prefix-tail copies.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import triton
import triton.language as tl

from spec_hal import error_flag
from spec_hal.device_buffers import allocate_persistent, carve
from spec_hal.kv import DraftSlots, record_move_values

from .error_flag import ARGUMENT_STEP, record_invalid
from .launch import KernelTarget, cdiv, next_power_of_2, runtime_specialized


@triton.jit
def _accepted_moves_kernel(accept_index_ptr, index_stride_row, index_stride_col, accept_lens_ptr, lens_stride,
                           slots_ptr, slots_stride_row, slots_stride_col, src_ptr, dst_ptr,
                           rows, width, num_nodes, flag_ptr, flag_code, BLOCK: tl.constexpr):
    entry = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = entry < rows * width
    b = entry // width
    rank = entry - b * width
    length = tl.load(accept_lens_ptr + b * lens_stride, mask=in_range, other=0).to(tl.int64)
    accepted = in_range & (rank < length) & (rank < num_nodes)
    node = tl.load(accept_index_ptr + b * index_stride_row + rank * index_stride_col, mask=accepted, other=0).to(tl.int64)
    local = node - b * num_nodes
    # Default-mode records (spec_hal.compaction.record_verdict_values): accept_lens outside
    # [1, min(W, N)] at index b (from rank 0), a used entry outside the block at index b*W + rank.
    record_invalid(flag_ptr, flag_code, in_range & (rank == 0) & ((length < 1) | (length > tl.minimum(width, num_nodes))), b)
    record_invalid(flag_ptr, flag_code + ARGUMENT_STEP, accepted & ((local < 0) | (local >= num_nodes)), entry)
    moved = accepted & (local != rank) & (local >= 0) & (local < num_nodes)
    source = tl.load(slots_ptr + b * slots_stride_row + local * slots_stride_col, mask=moved, other=-1)
    destination = tl.load(slots_ptr + b * slots_stride_row + rank * slots_stride_col, mask=moved, other=-1)
    tl.store(src_ptr + entry, tl.where(moved, source, -1), mask=in_range)
    tl.store(dst_ptr + entry, tl.where(moved, destination, -1), mask=in_range)


@triton.jit
def _record_moves(src_ptr, dst_ptr, start, num_moves, check_slots, flag_ptr, flag_code, BLOCK: tl.constexpr):
    """Default-mode records (spec_hal.kv.record_move_values) of entries ``start .. start + BLOCK -
    1``: an entry other than -1 outside [0, check_slots) (the smallest num_slots of ALL caches)
    at index i."""
    moves = start + tl.arange(0, BLOCK)
    in_list = moves < num_moves
    source = tl.load(src_ptr + moves, mask=in_list, other=-1).to(tl.int64)
    destination = tl.load(dst_ptr + moves, mask=in_list, other=-1).to(tl.int64)
    record_invalid(flag_ptr, flag_code, ((source < -1) | (source >= check_slots)) & in_list, moves)
    record_invalid(flag_ptr, flag_code + ARGUMENT_STEP, ((destination < -1) | (destination >= check_slots)) & in_list, moves)


@triton.jit
def _chunk_rows(cache_base, src_ptr, dst_ptr, start, num_moves, num_slots, slot_stride, cols, in_row, CHUNK: tl.constexpr):
    """(the rows of moves ``start .. start + CHUNK - 1`` in one column tile, their destinations,
    which of them copy something). One unsigned compare a slot: -1 (skip), every other negative
    and num_slots or more all copy nothing (four signed compares before; H200, (3, 1, 4) bs 256:
    39.6 -> 39.2 us)."""
    moves = start + tl.arange(0, CHUNK)
    in_list = moves < num_moves
    source = tl.load(src_ptr + moves, mask=in_list, other=-1).to(tl.int64)
    destination = tl.load(dst_ptr + moves, mask=in_list, other=-1).to(tl.int64)
    slots = num_slots.to(tl.uint64)
    valid = (source.to(tl.uint64, bitcast=True) < slots) & (destination.to(tl.uint64, bitcast=True) < slots)
    values = tl.load(cache_base + source[:, None] * slot_stride + cols[None, :], mask=valid[:, None] & in_row[None, :])
    return values, destination, valid


@triton.jit
def _move_rows_kernel(base_ptr, cache_offsets_ptr, slot_stride, num_slots, row_length, src_ptr, dst_ptr, num_moves,
                      check_slots, flag_ptr, flag_code, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                      OFFSET_MULTIPLE: tl.constexpr, RECORD_BLOCK: tl.constexpr):
    # The host promises that each cache's offset from the first is a multiple of OFFSET_MULTIPLE
    # elements (16 bytes when every cache is 16-byte aligned). A loaded offset has no known
    # alignment otherwise, and every element becomes its own 1-8 byte access.
    cache_base = base_ptr + tl.multiple_of(tl.load(cache_offsets_ptr + tl.program_id(0)), OFFSET_MULTIPLE)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < row_length
    # The default-mode records first, RECORD_BLOCK entries a program (grid-stride), so that no
    # program's walk holds an atomic. Recorded per chunk by program (0, 0), as until 2026-11-29,
    # they put an atomic (lanes masked off everywhere else) in every program's walk: unpacked, in
    # 64-move chunks, the (3, 1, 4) bs-256 move took 52.5 us (60% of copy bandwidth), 39.3 (81%)
    # now (H200). Before the walk rather than after: this placement compiles without spills on
    # all six targets.
    program = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    for start in range(program * RECORD_BLOCK, num_moves, tl.num_programs(0) * tl.num_programs(1) * RECORD_BLOCK):
        _record_moves(src_ptr, dst_ptr, start, num_moves, check_slots, flag_ptr, flag_code, RECORD_BLOCK)
    # A software pipeline: chunk c's rows are stored while chunk c+1's are in flight. Reading ahead
    # is safe by the op's precondition: a slot read by move j is never written by a move i < j, so
    # no store of chunk c touches what chunk c+1 reads. Only the reads and writes of one chunk
    # need the barrier between them.
    values, destination, valid = _chunk_rows(cache_base, src_ptr, dst_ptr, 0, num_moves, num_slots, slot_stride, cols, in_row, CHUNK)
    for start in range(0, num_moves, CHUNK):
        next_values, next_destination, next_valid = _chunk_rows(cache_base, src_ptr, dst_ptr, start + CHUNK, num_moves, num_slots,
                                                                slot_stride, cols, in_row, CHUNK)
        # Every thread of the program has read this chunk before any thread overwrites a slot.
        tl.debug_barrier()
        tl.store(cache_base + destination[:, None] * slot_stride + cols[None, :], values, mask=valid[:, None] & in_row[None, :])
        values, destination, valid = next_values, next_destination, next_valid


@triton.jit
def _draft_slots_kernel(table_ptr, table_stride_row, table_stride_col, table_width, pool_ptr, pool_stride,
                        seq_lens_ptr, seq_stride, out_cache_loc_ptr, prefix_src_ptr, prefix_dst_ptr,
                        num_table_rows, flag_ptr, flag_code, STEPS: tl.constexpr, TOPK: tl.constexpr, PAGE: tl.constexpr,
                        SLOTS_PAD: tl.constexpr, HOLES_PAD: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    pool_row = tl.load(pool_ptr + b * pool_stride).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b * seq_stride).to(tl.int64)
    # Rule: a pool row outside [0, R) or a negative seq_len makes every output of the request -1.
    record_invalid(flag_ptr, flag_code, (pool_row < 0) | (pool_row >= num_table_rows), b)
    record_invalid(flag_ptr, flag_code + ARGUMENT_STEP, seq_len < 0, b)
    usable = (pool_row >= 0) & (pool_row < num_table_rows) & (seq_len >= 0)
    table_row = table_ptr + tl.where(usable, pool_row, 0) * table_stride_row
    seq_len = tl.where(usable, seq_len, 0)
    # An unusable request sees a row of width 0 (a scalar bound, not a scalar-and-vector mask:
    # the interpreter cannot broadcast a scalar bool into a vector mask).
    width = tl.where(usable, table_width, 0)
    last_page = seq_len % PAGE
    prefix_base = seq_len - last_page
    lane_span = ((last_page + STEPS + PAGE - 1) // PAGE) * PAGE

    index = tl.arange(0, SLOTS_PAD)
    lane = index // STEPS
    position = prefix_base + lane * lane_span + last_page + (index - lane * STEPS)
    inside = (index < TOPK * STEPS) & (position < width)
    slot = tl.load(table_row + position * table_stride_col, mask=inside, other=-1)
    tl.store(out_cache_loc_ptr + b * (TOPK * STEPS) + index, slot, mask=index < TOPK * STEPS)

    if TOPK > 1 and PAGE > 1:
        holes = (TOPK - 1) * (PAGE - 1)
        hole = tl.arange(0, HOLES_PAD)
        hole_lane = hole // (PAGE - 1) + 1
        offset = hole - (hole_lane - 1) * (PAGE - 1)
        source_pos = prefix_base + offset
        dest_pos = prefix_base + hole_lane * lane_span + offset
        copied = (hole < holes) & (offset < last_page) & (dest_pos < width) & (source_pos < width)
        source = tl.load(table_row + source_pos * table_stride_col, mask=copied, other=-1)
        destination = tl.load(table_row + dest_pos * table_stride_col, mask=copied, other=-1)
        both = copied & (source >= 0) & (destination >= 0)
        tl.store(prefix_src_ptr + b * holes + hole, tl.where(both, source, -1), mask=hole < holes)
        tl.store(prefix_dst_ptr + b * holes + hole, tl.where(both, destination, -1), mask=hole < holes)


def _padded(count: int) -> int:
    return max(next_power_of_2(max(count, 1)), 16)


def accepted_kv_moves(verdict, slots, *, out=None, target: KernelTarget):
    """Triton provider of ``accepted_kv_moves`` (validated by the caller; see spec_hal.kv)."""
    rows, width = verdict.accept_index.shape
    if out is None:
        out = carve((rows * width, rows * width), slots.dtype, slots.device)
    if rows == 0:
        return out[0], out[1]
    block = 256
    _accepted_moves_kernel[(cdiv(rows * width, block),)](
        verdict.accept_index, verdict.accept_index.stride(0), verdict.accept_index.stride(1),
        verdict.accept_lens, verdict.accept_lens.stride(0), slots, slots.stride(0), slots.stride(1),
        out[0], out[1], rows, width, slots.shape[1], error_flag.flag(slots.device), _ACCEPTED_MOVES_CODE, BLOCK=block, num_warps=1 if target.vendor == "interpreter" else 4,
    )
    return out[0], out[1]


_OFFSET_TABLES: "OrderedDict[tuple, tuple]" = OrderedDict()
_MAX_TABLES = 64


def clear_offset_tables() -> None:
    """Forget the cached cache-offset tables (tests; after an engine reallocates its caches)."""
    _OFFSET_TABLES.clear()


def _offset_table(group: list, device: torch.device) -> tuple[torch.Tensor, int]:
    """((caches,) int64 element offsets of each cache from the first, on ``device``; the multiple
    of elements every offset is), cached per set of caches.

    The multiple is 16 bytes' worth where all caches are 16-byte aligned (torch's allocations
    are), else 1: the kernel's promise about the offsets it loads (``OFFSET_MULTIPLE``). Built once
    per set of caches, with a pinned non-blocking copy so that even the first call does not
    synchronise the host (an engine's caches live for the whole run).
    """
    key = (str(device),) + tuple(cache.data_ptr() for cache in group)
    if key in _OFFSET_TABLES:
        _OFFSET_TABLES.move_to_end(key)
        table, multiple, _ = _OFFSET_TABLES[key]
        return table, multiple
    size = group[0].element_size()
    offsets = torch.tensor([(pointer - key[1]) // size for pointer in key[1:]], dtype=torch.int64)
    multiple = max(1, 16 // size) if all(pointer % 16 == 0 for pointer in key[1:]) else 1
    if device.type == "cpu":
        table, staging = offsets, None
    else:
        staging = offsets.pin_memory()
        # Outside any graph pool: under torch.compile(mode="reduce-overhead") the first call runs
        # in the cudagraph-trees warm-up, whose pool must hold only the graph's outputs.
        table = allocate_persistent(device, lambda: staging.to(device, non_blocking=True))
    _OFFSET_TABLES[key] = (table, multiple, staging)
    if len(_OFFSET_TABLES) > _MAX_TABLES:
        _OFFSET_TABLES.popitem(last=False)
    return table, multiple


def _groups(caches) -> list:
    """Caches that one launch can move: same dtype, row length, slot stride, slot count, and an
    address difference that is a whole number of elements."""
    groups: dict = {}
    for cache in caches:
        row_length = 1
        for size in cache.shape[1:]:
            row_length *= size
        key = (cache.dtype, row_length, cache.stride(0), cache.shape[0], cache.data_ptr() % cache.element_size())
        groups.setdefault(key, []).append(cache)
    return list(groups.items())


RECORD_BLOCK = 32  # entries a program of the row launch records before its walk
LONG_LIST = 257  # entries from which NVIDIA launches move 64 rows a chunk (move_launch)


def move_launch(target: KernelTarget, row_length: int, element_size: int, num_moves: int, aligned: bool = True) -> tuple[int, int, int]:
    """(BLOCK columns, CHUNK moves, warps) of ``_move_rows_kernel`` for a list of ``num_moves``
    entries.

    NVIDIA: 512-byte column tiles, 4 16-byte vectors a thread at 32 moves a chunk (8 warps for
    whole tiles); chunks of 64 moves from ``LONG_LIST`` entries on, 32 below (H200: a list of 4-6
    entries took 3.5 us in 64-move chunks and 2.5 in 32; one of 1024 entries 39.7 and 44.9). AMD:
    64-byte tiles, 64 moves, at most 16 elements a thread. Interpreter: whole rows and big chunks
    (few Python-level programs and iterations). Caches that are not all 16-byte aligned
    (``aligned=False``) cannot be read in vectors: every element then carries its own 64-bit
    address, so chunks of 8 moves keep the two chunks in flight from spilling.
    """
    if target.vendor == "interpreter":
        return max(next_power_of_2(row_length), 16), 256, 1
    if target.vendor == "nvidia":
        block = min(max(next_power_of_2(row_length), 16), 512 // element_size)
        if not aligned:
            # Two warps: at eight a whole misaligned tile kept a 16-byte frame on sm_90 (Triton 3.9).
            return block, 8, 2
        chunk = 64 if num_moves >= LONG_LIST else 32
        # At least two warps for rows of a few elements (one, 16 elements a thread, kept an
        # 8-byte frame on sm_80 with Triton 3.6), but one for bytes (two kept one on sm_90 with 3.9).
        fewest = 1 if element_size == 1 else 2
        return block, chunk, max(fewest, min(8, 32 * block * element_size // (16 * target.warp_size * 4)))
    block = min(max(next_power_of_2(row_length), 16), 64 // element_size)
    chunk = 64 if aligned else 8
    # At most 16 elements a thread (8 for bytes) at 64 moves a chunk.
    per_thread = 8 if element_size == 1 else 16
    return block, chunk, target.warps(min(512, max(target.warp_size, 64 * block // per_thread)))


def move_kv(caches, src, dst, *, target: KernelTarget):
    """Triton provider of ``move_kv`` (validated by the caller; see spec_hal.kv). One launch per
    group of caches with equal (dtype, row length, slot stride); K and V of all layers of a
    usual pool are one group."""
    num_moves = src.shape[0]
    if num_moves == 0:
        return None
    src, dst = src.contiguous(), dst.contiguous()  # the kernel indexes the move lists with unit stride
    # Every launch records the whole list (a few entries a program; the atomic min keeps the smallest code).
    check_slots, flag = min(cache.shape[0] for cache in caches), error_flag.flag(src.device)
    for (dtype, row_length, slot_stride, num_slots, _), group in _groups(caches):
        if not (row_length and num_slots):  # nothing to move
            continue
        # fp8 rows are moved as bytes: a bit copy needs no fp8 support in the interpreter.
        base = group[0].view(torch.uint8) if dtype.is_floating_point and group[0].element_size() == 1 else group[0]
        offsets, multiple = _offset_table(group, src.device)
        block, chunk, warps = move_launch(target, row_length, group[0].element_size(), num_moves, aligned=multiple > 1)
        _move_rows_kernel[(len(group), cdiv(row_length, block))](
            base, offsets, slot_stride, num_slots, row_length, src, dst, num_moves,
            check_slots, flag, _MOVE_KV_CODE, CHUNK=chunk, BLOCK=block, OFFSET_MULTIPLE=multiple, RECORD_BLOCK=RECORD_BLOCK,
            num_warps=warps,
        )
    return None


def assign_draft_slots(req_to_token, *, req_pool_indices, seq_lens, num_steps, topk, page_size, out=None, target: KernelTarget):
    """Triton provider of ``assign_draft_slots`` (validated by the caller; see spec_hal.kv)."""
    rows = req_pool_indices.shape[0]
    holes = (topk - 1) * (page_size - 1)
    device, dtype = req_to_token.device, req_to_token.dtype
    if out is None:
        out = carve((rows * topk * num_steps, rows * holes, rows * holes), dtype, device)
    if rows == 0:
        return DraftSlots(*out)
    _draft_slots_kernel[(rows,)](
        req_to_token, req_to_token.stride(0), req_to_token.stride(1), req_to_token.shape[1],
        req_pool_indices, req_pool_indices.stride(0), seq_lens, seq_lens.stride(0), out[0], out[1], out[2],
        req_to_token.shape[0], error_flag.flag(device), _DRAFT_SLOTS_CODE, STEPS=num_steps, TOPK=topk, PAGE=page_size, SLOTS_PAD=_padded(topk * num_steps), HOLES_PAD=_padded(holes),
        num_warps=1 if target.vendor == "interpreter" else 4,
    )
    return DraftSlots(*out)


# The ops' first error-flag codes (the second argument is + ARGUMENT_STEP).
_ACCEPTED_MOVES_CODE = error_flag.code("accepted_kv_moves", "verdict.accept_lens")
_MOVE_KV_CODE = error_flag.code("move_kv", "src")
_DRAFT_SLOTS_CODE = error_flag.code("assign_draft_slots", "req_pool_indices")

PROVIDERS = {
    "accepted_kv_moves": (accepted_kv_moves, "kernels/kv.py: one lane per (request, rank), bs*(S+1) entries, 1 launch"),
    "move_kv": (move_kv, "kernels/kv.py: chunked gather/barrier/scatter with one chunk read ahead, 1 launch per (dtype, row, stride) group of caches"),
    "assign_draft_slots": (assign_draft_slots, "kernels/kv.py: P9 page-aware formula, one program per request, 1 launch"),
}

# One type per element size the host launches (the kernel only loads and stores; fp8 goes as u8).
_TYPES = {"bf16": 2, "fp32": 4, "i64": 8, "u8": 1}


def compile_specs(target: KernelTarget):
    """Every (kernel, signature, constexprs, num_warps) the host functions launch on ``target``."""
    specs = []
    for index_type in ("i32", "i64"):
        specs.append((_accepted_moves_kernel,
                      {"accept_index_ptr": f"*{index_type}", "index_stride_row": "i64", "index_stride_col": "i64",
                       "accept_lens_ptr": f"*{index_type}", "lens_stride": "i64", "slots_ptr": f"*{index_type}",
                       "slots_stride_row": "i64", "slots_stride_col": "i64", "src_ptr": f"*{index_type}",
                       "dst_ptr": f"*{index_type}", "rows": "i64", "width": "i64", "num_nodes": "i64",
                       "flag_ptr": "*i64", "flag_code": "i64", "BLOCK": "constexpr"},
                      {"BLOCK": 256}, 4))
        signature = {"base_ptr": None, "cache_offsets_ptr": "*i64", "slot_stride": "i64", "num_slots": "i64", "row_length": "i64",
                     "src_ptr": f"*{index_type}", "dst_ptr": f"*{index_type}", "num_moves": "i64", "check_slots": "i64",
                     "flag_ptr": "*i64", "flag_code": "i64", "CHUNK": "constexpr", "BLOCK": "constexpr", "OFFSET_MULTIPLE": "constexpr",
                     "RECORD_BLOCK": "constexpr"}
        for data_type, size in _TYPES.items():
            signature["base_ptr"] = f"*{data_type}"
            for row_length in (3, 1024):
                generic_block, generic_chunk, generic_warps = move_launch(target, row_length, size, 1, aligned=False)
                # Generic (misaligned caches) and as the JIT specialises aligned caches of a pool,
                # for short and long lists.
                specs.append((_move_rows_kernel, dict(signature), {"CHUNK": generic_chunk, "BLOCK": generic_block, "OFFSET_MULTIPLE": 1,
                                                                   "RECORD_BLOCK": RECORD_BLOCK}, generic_warps))
                for num_moves in (LONG_LIST - 1, LONG_LIST):
                    block, chunk, warps = move_launch(target, row_length, size, num_moves)
                    spec = runtime_specialized(
                        target, _move_rows_kernel, signature,
                        {"CHUNK": chunk, "BLOCK": block, "OFFSET_MULTIPLE": max(1, 16 // size), "RECORD_BLOCK": RECORD_BLOCK}, warps,
                        values=dict(slot_stride=row_length, num_slots=65536, row_length=row_length, num_moves=num_moves * 5,
                                    check_slots=65536, flag_code=_MOVE_KV_CODE))
                    if spec not in specs:  # AMD moves 64 a chunk at every length
                        specs.append(spec)
        for steps, topk, page in ((3, 1, 1), (5, 4, 16)):
            holes = (topk - 1) * (page - 1)
            specs.append((_draft_slots_kernel,
                          {"table_ptr": f"*{index_type}", "table_stride_row": "i64", "table_stride_col": "i64", "table_width": "i64",
                           "pool_ptr": f"*{index_type}", "pool_stride": "i64", "seq_lens_ptr": f"*{index_type}", "seq_stride": "i64",
                           "out_cache_loc_ptr": f"*{index_type}", "prefix_src_ptr": f"*{index_type}", "prefix_dst_ptr": f"*{index_type}",
                           "num_table_rows": "i64", "flag_ptr": "*i64", "flag_code": "i64", "STEPS": "constexpr", "TOPK": "constexpr", "PAGE": "constexpr", "SLOTS_PAD": "constexpr", "HOLES_PAD": "constexpr"},
                          {"STEPS": steps, "TOPK": topk, "PAGE": page, "SLOTS_PAD": _padded(topk * steps), "HOLES_PAD": _padded(holes)}, 4))
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    lines = []
    for row_length, size in ((1024, 2), (576, 2), (1024, 4)):
        block, chunk, warps = move_launch(target, row_length, size, LONG_LIST)
        short_chunk = move_launch(target, row_length, size, 1)[1]
        lines.append(f"move_kv row {row_length} x {size} B (16-byte aligned caches): BLOCK={block} columns, CHUNK={chunk} moves "
                     f"({short_chunk} below {LONG_LIST} entries), {warps} warps")
    lines.append("accepted_kv_moves: 256 entries per program; assign_draft_slots: one program per request")
    return lines
