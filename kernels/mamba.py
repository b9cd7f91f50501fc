"""Triton kernels of family ``mamba``. Semantics: spec_hal/mamba.py (P19).

``_scatter_state_kernel`` copies one tile of one layer of one request per program; grid
(layers x tiles, requests): ONE launch for all layers of a state tensor. A skipped request
(-1 or out-of-range step, slot or row) keeps its programs but masks every access, so no index
ever needs the host. Every offset is ``index.to(int64) * stride`` (``_offset``): an index and a
stride can both arrive as int32 while their product passes 2^31 elements (a 64-slot pool of a
2 MiB fp32 state already spans 2^25 elements per layer).

``_commit_steps_kernel`` (one program; bs is at most a few thousand) computes last_step and
track_step from the Verdict, and for ``commit_mamba_state`` also the concatenated (commit, track)
index vectors the scatters read and the bytes moved, so a commit is three launches: steps, SSM
scatter, conv scatter, with no host sync and no small torch ops in between.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import triton
import triton.language as tl

from spec_hal import error_flag
from spec_hal.mamba import MambaCommit, commit_bytes_per_request

from .error_flag import ARGUMENT_STEP, record_invalid
from .launch import KernelTarget, cdiv, next_power_of_2

MAX_GRID_Y = 65535  # CUDA/HIP limit of grid dimension 1: requests per launch
STEPS_BLOCK = 1024
# 1024 requests x a dozen int64 vectors per program: 256 lanes spill on gfx942, and 256 threads
# (8 warps) leave an 8 B local frame on sm_80 since the error-flag record (compile matrix).
STEPS_THREADS = 512


@triton.jit
def _offset(index, stride):
    """``index * stride`` in int64: both may be int32 while the product passes 2^31."""
    return index.to(tl.int64) * stride


@triton.jit
def _scatter_state_kernel(
    dst_ptr, src_ptr, dst_slots_ptr, src_steps_ptr, src_rows_ptr,
    dst_stride_layer, dst_stride_slot, src_stride_layer, src_stride_row, src_stride_step,
    num_slots, num_steps, num_rows, state_numel, tiles_per_state, first_request, flag_ptr, flag_code,
    HAS_ROWS: tl.constexpr, RECORD: tl.constexpr, BLOCK: tl.constexpr,
):
    program = tl.program_id(0)
    layer = program // tiles_per_state
    tile = program % tiles_per_state
    request = first_request + tl.program_id(1)
    slot = tl.load(dst_slots_ptr + request).to(tl.int64)
    step = tl.load(src_steps_ptr + request).to(tl.int64)
    if HAS_ROWS:
        row = tl.load(src_rows_ptr + request).to(tl.int64)
    else:
        row = request.to(tl.int64)
    if RECORD:  # the error flag's rules (spec_hal.mamba.record_scatter_values); program 0 of a request
        copies = (program == 0) & (slot >= 0) & (step >= 0)
        record_invalid(flag_ptr, flag_code, (program == 0) & ((slot < -1) | (copies & (slot >= num_slots))), request)
        record_invalid(flag_ptr, flag_code + ARGUMENT_STEP, (program == 0) & ((step < -1) | (copies & (step >= num_steps))), request)
        if HAS_ROWS:
            record_invalid(flag_ptr, flag_code + 2 * ARGUMENT_STEP, copies & ((row < 0) | (row >= num_rows)), request)
    active = (slot >= 0) & (slot < num_slots) & (step >= 0) & (step < num_steps) & (row >= 0) & (row < num_rows)
    # A skipped request's indices become 0 so that even its masked addresses stay in range.
    slot = tl.where(active, slot, 0)
    step = tl.where(active, step, 0)
    row = tl.where(active, row, 0)
    elements = tile.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = elements < tl.where(active, state_numel, 0)  # a skipped request masks every element
    src_base = _offset(layer, src_stride_layer) + _offset(row, src_stride_row) + _offset(step, src_stride_step)
    dst_base = _offset(layer, dst_stride_layer) + _offset(slot, dst_stride_slot)
    values = tl.load(src_ptr + src_base + elements, mask=mask)
    tl.store(dst_ptr + dst_base + elements, values, mask=mask)


@triton.jit
def _local_node(accept_index_ptr, stride_request, request, position, nodes, mask, flag_ptr, flag_code, width):
    """Local node id at ``position`` of each request's path (int64); -1 where it holds -1 or an
    id outside the own block, which (not being -1 padding) is recorded at b * width + position."""
    global_id = tl.load(accept_index_ptr + _offset(request, stride_request) + position, mask=mask, other=-1).to(tl.int64)
    local = global_id - _offset(request, nodes)
    own = (local >= 0) & (local < nodes)
    record_invalid(flag_ptr, flag_code, (global_id != -1) & ~own, _offset(request, width) + position)
    return tl.where(own, local, -1)


@triton.jit
def _commit_steps_kernel(
    accept_index_ptr, accept_lens_ptr, seq_lens_ptr, slots_ptr, track_slots_ptr, src_rows_ptr,
    steps_ptr, index_ptr, bytes_moved_ptr,
    batch, accept_stride, width, nodes, track_interval, num_slots, num_rows, bytes_per_request, flag_ptr, flag_code,
    HAS_TRACK: tl.constexpr, FOR_COMMIT: tl.constexpr, HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    """steps (2, batch): last_step, track_step. FOR_COMMIT: index (2, 2*batch) = destination
    slots and source rows of the (commit, track) sets (written only with HAS_TRACK), and
    bytes_moved = active copies x bytes_per_request. Error flag (``flag_code``: the op's first
    argument, verdict.accept_lens; then accept_index, seq_lens, slots, track_slots, src_rows):
    the rules of spec_hal.mamba._commit_steps and record_commit_values."""
    copies = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, batch, BLOCK):
        request = start + tl.arange(0, BLOCK)
        in_batch = request < batch
        lens = tl.load(accept_lens_ptr + request, mask=in_batch, other=1).to(tl.int64)
        record_invalid(flag_ptr, flag_code, (lens < 1) | (lens > width), request)
        last_position = tl.minimum(tl.maximum(lens - 1, 0), width - 1)
        last_step = _local_node(accept_index_ptr, accept_stride, request, last_position, nodes, in_batch,
                                flag_ptr, flag_code + ARGUMENT_STEP, width)
        track_step = tl.full([BLOCK], -1, dtype=tl.int64)
        if HAS_TRACK:
            pre = tl.load(seq_lens_ptr + request, mask=in_batch, other=0).to(tl.int64)
            record_invalid(flag_ptr, flag_code + 2 * ARGUMENT_STEP, pre < 0, request)
            post = pre + lens
            crossed = (pre >= 0) & (post >= 0) & ((pre // track_interval) != (post // track_interval))
            boundary = (post // track_interval) * track_interval
            track_position = tl.minimum(tl.maximum(boundary - pre - 1, 0), width - 1)
            track_step = _local_node(accept_index_ptr, accept_stride, request, track_position, nodes, in_batch & crossed,
                                     flag_ptr, flag_code + ARGUMENT_STEP, width)
        tl.store(steps_ptr + request, last_step.to(tl.int32), mask=in_batch)
        tl.store(steps_ptr + batch + request, track_step.to(tl.int32), mask=in_batch)
        if FOR_COMMIT:
            if HAS_ROWS:
                row = tl.load(src_rows_ptr + request, mask=in_batch, other=-1).to(tl.int64)
            else:
                row = request.to(tl.int64)
            row_ok = in_batch & (row >= 0) & (row < num_rows)
            slot = tl.load(slots_ptr + request, mask=in_batch, other=-1).to(tl.int64)
            record_invalid(flag_ptr, flag_code + 3 * ARGUMENT_STEP, (slot < -1) | ((last_step >= 0) & (slot >= num_slots)), request)
            wants_copy = (slot >= 0) & (last_step >= 0)  # the row matters (and is recorded) only here
            active = row_ok & (slot >= 0) & (slot < num_slots) & (last_step >= 0) & (last_step < nodes)
            copies += active.to(tl.int64)
            if HAS_TRACK:
                track_slot = tl.load(track_slots_ptr + request, mask=in_batch, other=-1).to(tl.int64)
                record_invalid(flag_ptr, flag_code + 4 * ARGUMENT_STEP,
                               (track_slot < -1) | ((track_step >= 0) & (track_slot >= num_slots)), request)
                wants_copy |= (track_slot >= 0) & (track_step >= 0)
                active = row_ok & (track_slot >= 0) & (track_slot < num_slots) & (track_step >= 0) & (track_step < nodes)
                copies += active.to(tl.int64)
                # Out-of-range slots and rows become -1 before the int32 store: truncating an
                # int64 slot such as 2^32 + 1 would alias slot 1 (another request's state).
                slot32 = tl.where((slot >= 0) & (slot < num_slots), slot, -1).to(tl.int32)
                track32 = tl.where((track_slot >= 0) & (track_slot < num_slots), track_slot, -1).to(tl.int32)
                row32 = tl.where(row_ok, row, -1).to(tl.int32)
                tl.store(index_ptr + request, slot32, mask=in_batch)
                tl.store(index_ptr + batch + request, track32, mask=in_batch)
                tl.store(index_ptr + 2 * batch + request, row32, mask=in_batch)
                tl.store(index_ptr + 3 * batch + request, row32, mask=in_batch)
            if HAS_ROWS:
                record_invalid(flag_ptr, flag_code + 5 * ARGUMENT_STEP, wants_copy & ((row < 0) | (row >= num_rows)), request)
    if FOR_COMMIT:
        tl.store(bytes_moved_ptr, tl.sum(copies, axis=0) * bytes_per_request)


# ---------------------------------------------------------------------------------------------
# launch configs


@functools.lru_cache(maxsize=1024)  # a pure function of ints: computed once per shape
def scatter_config(target: KernelTarget, element_size: int, state_numel: int) -> tuple[int, int]:
    """(BLOCK elements, num_warps) of the scatter.

    GPUs: 16 KiB per program, 256 threads (8 warps of 32, or 4 wave64 wavefronts on AMD), so each
    thread moves 64 bytes as four 16-byte vectors. The interpreter runs one Python call per
    program, so it takes whole states up to 64 Ki elements.
    """
    fitted = max(next_power_of_2(max(state_numel, 1)), 16)
    if target.vendor == "interpreter":
        return min(fitted, 65536), 1
    return min(16384 // element_size, fitted), 256 // target.warp_size


def _vector(tensor: torch.Tensor) -> torch.Tensor:
    """The kernels index 1-D vectors with stride 1 (a no-op for the usual contiguous ones)."""
    return tensor if tensor.stride(0) == 1 else tensor.contiguous()


# ---------------------------------------------------------------------------------------------
# host functions


def _launch_scatter(*, dst, src, dst_slots, src_steps, src_rows, record: bool, target: KernelTarget) -> None:
    """``record``: the launch of ``scatter_mamba_state`` itself records its index rules in the error
    flag; commit's scatters do not (its steps kernel recorded the caller's arguments)."""
    requests = dst_slots.shape[0]
    dst_shape, src_shape = dst.shape, src.shape  # read once: each read of a tensor's metadata is a C++ call
    state_numel = math.prod(dst_shape[2:])
    if requests == 0 or dst_shape[0] == 0 or state_numel == 0:
        return
    block, warps = scatter_config(target, dst.element_size(), state_numel)
    tiles = cdiv(state_numel, block)
    rows = _vector(src_rows) if src_rows is not None else dst_slots  # placeholder pointer, never read
    dst_stride, src_stride = dst.stride(), src.stride()
    for first in range(0, requests, MAX_GRID_Y):  # one launch unless there are > 65,535 requests
        _scatter_state_kernel[(dst_shape[0] * tiles, min(requests - first, MAX_GRID_Y))](
            dst, src, dst_slots, src_steps, rows,
            dst_stride[0], dst_stride[1], src_stride[0], src_stride[1], src_stride[2],
            dst_shape[1], src_shape[2], src_shape[1], state_numel, tiles, first,
            error_flag.flag(dst.device), error_flag.code("scatter_mamba_state", "dst_slots"),
            HAS_ROWS=src_rows is not None, RECORD=record, BLOCK=block, num_warps=warps,
        )


def scatter_mamba_state(*, dst, src, dst_slots, src_steps, src_rows=None, target: KernelTarget) -> torch.Tensor:
    """Triton provider of ``scatter_mamba_state`` (validated by the caller; see spec_hal.mamba)."""
    _launch_scatter(dst=dst, src=src, dst_slots=_vector(dst_slots), src_steps=_vector(src_steps),
                    src_rows=src_rows, record=True, target=target)
    return dst


def _steps_launch(verdict, seq_lens, *, op, track_interval, steps, target: KernelTarget, slots=None, track_slots=None, src_rows=None,
                  index=None, bytes_moved=None, num_slots=0, num_rows=0, bytes_per_request=0) -> None:
    """Run ``_commit_steps_kernel``; with ``bytes_moved`` also the commit outputs (see the kernel)."""
    accept_index = verdict.accept_index
    if accept_index.stride(1) != 1:
        accept_index = accept_index.contiguous()
    bs, width = accept_index.shape  # read once (Verdict's batch_size and num_nodes are properties over them)
    nodes = verdict.predict.shape[0] // bs if bs else 0
    placeholder = steps  # pointer arguments a variant never reads
    has_track = track_interval is not None
    _commit_steps_kernel[(1,)](
        accept_index, _vector(verdict.accept_lens), _vector(seq_lens),
        placeholder if slots is None else slots,
        placeholder if track_slots is None else track_slots,
        placeholder if src_rows is None else src_rows,
        steps, placeholder if index is None else index, placeholder if bytes_moved is None else bytes_moved,
        bs, accept_index.stride(0), width, nodes,
        track_interval if has_track else 1, num_slots, num_rows, bytes_per_request,
        error_flag.flag(steps.device), error_flag.code(op, "verdict.accept_lens"),
        HAS_TRACK=has_track, FOR_COMMIT=bytes_moved is not None, HAS_ROWS=src_rows is not None,
        BLOCK=min(max(next_power_of_2(bs), 16), STEPS_BLOCK), num_warps=target.warps(STEPS_THREADS),
    )


def mamba_commit_steps(verdict, seq_lens, *, track_interval: Optional[int] = None, target: KernelTarget):
    """Triton provider of ``mamba_commit_steps`` (one launch)."""
    accept_index = verdict.accept_index
    bs = accept_index.shape[0]
    steps = torch.empty((2, bs), dtype=torch.int32, device=accept_index.device)
    if bs:
        _steps_launch(verdict, seq_lens, op="mamba_commit_steps", track_interval=track_interval, steps=steps, target=target)
    return steps.unbind(0)  # one call for both rows (two Python indexes cost twice as much)


def commit_mamba_state(
    *, verdict, seq_lens, slots, ssm_state, ssm_intermediate, conv_state, conv_intermediate,
    track_slots=None, track_interval=None, src_rows=None, target: KernelTarget,
) -> MambaCommit:
    """Triton provider of ``commit_mamba_state``: steps kernel + one scatter launch per state."""
    bs = verdict.batch_size
    device = verdict.device
    steps = torch.empty((2, bs), dtype=torch.int32, device=device)
    bytes_moved = torch.empty((), dtype=torch.int64, device=device)  # the steps kernel writes it (no fill launch)
    if bs == 0:
        return MambaCommit(steps[0], steps[1], bytes_moved.zero_())
    slots = _vector(slots)
    track_slots = None if track_slots is None else _vector(track_slots)
    src_rows = None if src_rows is None else _vector(src_rows)
    index = torch.empty((2, 2 * bs), dtype=torch.int32, device=device) if track_slots is not None else None
    _steps_launch(verdict, seq_lens, op="commit_mamba_state", track_interval=track_interval, steps=steps, target=target, slots=slots, track_slots=track_slots,
                  src_rows=src_rows, index=index, bytes_moved=bytes_moved, num_slots=ssm_state.shape[1],
                  num_rows=ssm_intermediate.shape[1], bytes_per_request=commit_bytes_per_request(ssm_state, conv_state))
    if index is None:  # commit set only: the caller's slots and rows, our last_step
        dst_slots, src_steps, rows = slots, steps[0], src_rows
    else:  # (commit, track) concatenated by the steps kernel
        dst_slots, src_steps, rows = index[0], steps.view(-1), index[1]
    for state, scratch in ((ssm_state, ssm_intermediate), (conv_state, conv_intermediate)):
        _launch_scatter(dst=state, src=scratch, dst_slots=dst_slots, src_steps=src_steps, src_rows=rows, record=False,
                        target=target)
    return MambaCommit(steps[0], steps[1], bytes_moved)


PROVIDERS = {
    "mamba_commit_steps": (mamba_commit_steps, "kernels/mamba.py: step indices from the Verdict, 1 launch"),
    "scatter_mamba_state": (scatter_mamba_state, "kernels/mamba.py: fused all-layer state scatter, 1 launch"),
    "commit_mamba_state": (commit_mamba_state, "kernels/mamba.py: steps + SSM scatter + conv scatter, 3 launches"),
}

_STATE_TYPES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8}
# (dst_slots, src_steps, src_rows) pointer types the host functions pass: a caller's int64
# vectors; commit without track (caller's slots, our int32 steps); commit with track (all ours).
_INDEX_VARIANTS = (("*i64", "*i64", None), ("*i64", "*i64", "*i64"), ("*i64", "*i32", None), ("*i32", "*i32", "*i32"),
                   ("*i32", "*i32", None))


def compile_specs(target: KernelTarget):
    """Every (kernel, signature, constexprs, num_warps) the host functions launch on ``target``."""
    specs = []
    for state_type, element_size in _STATE_TYPES.items():
        # a large state (the widest tile) with every index variant, a small one, int32 strides
        variants = [(32 * 128 * 128, index, "i64") for index in _INDEX_VARIANTS]
        variants += [(100, _INDEX_VARIANTS[0], "i64"), (8192 * 3, _INDEX_VARIANTS[3], "i32")]
        for state_numel, (slots_type, steps_type, rows_type), stride_type in variants:
            block, warps = scatter_config(target, element_size, state_numel)
            signature = {"dst_ptr": f"*{state_type}", "src_ptr": f"*{state_type}", "dst_slots_ptr": slots_type,
                         "src_steps_ptr": steps_type, "src_rows_ptr": rows_type or slots_type}
            signature.update({name: stride_type for name in (
                "dst_stride_layer", "dst_stride_slot", "src_stride_layer", "src_stride_row", "src_stride_step")})
            signature.update({name: "i32" for name in (
                "num_slots", "num_steps", "num_rows", "state_numel", "tiles_per_state", "first_request")})
            signature.update({"flag_ptr": "*i64", "flag_code": "i64", "HAS_ROWS": "constexpr", "RECORD": "constexpr", "BLOCK": "constexpr"})
            # scatter_mamba_state's own launches take the caller's int64 vectors and record
            record = slots_type == "*i64" and steps_type == "*i64"
            specs.append((_scatter_state_kernel, signature, {"HAS_ROWS": rows_type is not None, "RECORD": record, "BLOCK": block}, warps))
    for index_type in ("*i32", "*i64"):
        for has_track in (False, True):
            for for_commit in (False, True):
                for has_rows in (False, True) if for_commit else (False,):
                    signature = {"accept_index_ptr": index_type, "accept_lens_ptr": index_type, "seq_lens_ptr": index_type,
                                 "slots_ptr": index_type, "track_slots_ptr": index_type, "src_rows_ptr": index_type,
                                 "steps_ptr": "*i32", "index_ptr": "*i32", "bytes_moved_ptr": "*i64"}
                    signature.update({name: "i32" for name in (
                        "batch", "accept_stride", "width", "nodes", "track_interval", "num_slots", "num_rows")})
                    signature.update({"bytes_per_request": "i64", "flag_ptr": "*i64", "flag_code": "i64", "HAS_TRACK": "constexpr", "FOR_COMMIT": "constexpr",
                                      "HAS_ROWS": "constexpr", "BLOCK": "constexpr"})
                    constexprs = {"HAS_TRACK": has_track, "FOR_COMMIT": for_commit, "HAS_ROWS": has_rows, "BLOCK": STEPS_BLOCK}
                    specs.append((_commit_steps_kernel, signature, constexprs, target.warps(STEPS_THREADS)))
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    lines = []
    for label, element_size, state_numel in (("ssm (32,128,128) fp32", 4, 32 * 128 * 128), ("conv (8192,3) bf16", 2, 8192 * 3)):
        block, warps = scatter_config(target, element_size, state_numel)
        lines.append(f"scatter_mamba_state {label}: BLOCK={block}, {cdiv(state_numel, block)} tiles/layer/request, "
                     f"{warps} warps x {target.warp_size} lanes, grid (L x tiles, requests)")
    lines.append(f"mamba_commit_steps: 1 program, BLOCK<={STEPS_BLOCK}, {target.warps(STEPS_THREADS)} warps x {target.warp_size} lanes")
    return lines
