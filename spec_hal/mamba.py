"""Family ``mamba``: commit the recurrent (Mamba2 / GDN) state of the last accepted node. P19.

Hybrid models (Qwen3-Next, Nemotron-H) keep a recurrent state per request: an SSM state
("temporal", fp32) and a convolution window ("conv", bf16/fp16) per layer, in a pool indexed by
mamba slot. During verify the target writes the state after every tree node j of the request in
batch row r into scratch ``intermediate[:, r, j]`` and leaves the pool untouched. After verify:

* ``mamba_commit_steps`` says which node's state becomes live: the LOCAL node id of the last
  accepted node, ``accept_index[b, accept_lens[b] - 1] - b * N``. For a chain (K = 1) that equals
  ``accept_lens - 1``; for a tree it does not (upstream bug 5 / PR #27463: the chain formula
  committed the state of the wrong node). With prefix caching (``track_interval`` I), it also
  gives the node whose state covers exactly the last multiple of I crossed this round: with
  ``pre = seq_lens``, ``post = pre + accept_lens``, a boundary is crossed when
  ``pre // I != post // I``; the node is ``accept_index[b, (post // I) * I - pre - 1] - b * N``
  (path position k covers ``pre + k + 1`` tokens), else -1.
* ``scatter_mamba_state`` copies ``dst[:, dst_slots[r]] = src[:, src_rows[r], src_steps[r]]`` for
  every layer (the leading dimension). A request is skipped when its step or slot is negative (-1
  means none) or out of range; ranges are errors only in checked mode (``SPEC_HAL_CHECKS=1``),
  because finding them needs a device sync. Active slots must be distinct (two requests writing
  one slot is a race on a GPU); checked mode rejects duplicates. All arguments are keyword-only:
  upstream bug 5 was a positional call against a signature whose order had changed.
* ``commit_mamba_state`` does both for the SSM and conv states, plus the prefix-cache snapshot
  into ``track_slots``, and reports the bytes it moved.

Layouts: pool ``state`` (L, slots, *state_shape) with arbitrary layer and slot strides and a
contiguous state; scratch ``intermediate`` (L, rows, N, *state_shape) with arbitrary layer, row and
step strides and a contiguous state. Offsets exceed 2^31 elements in real pools (64 slots of a
2 MiB state per layer is already 2^25 elements per layer, times the layer stride), so kernels
compute them in int64.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import checks
from .error_flag import record as record_invalid
from .compaction import verdict_ok
from .errors import InvalidInput
from .registry import register_op
from .types import Verdict

STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
CHECKS_ENV = "SPEC_HAL_CHECKS"
OPTIONAL_VECTORS = ("src_rows", "track_slots")


def value_checks_enabled() -> bool:
    """Checked mode: value checks that need a device sync (``SPEC_HAL_CHECKS=1``)."""
    return checks.value_checks_enabled()


@dataclass(frozen=True)
class MambaCommit:
    """What ``commit_mamba_state`` did.

    last_step:   (bs,) int32 local node id whose state became live (-1: none).
    track_step:  (bs,) int32 local node id snapshotted into ``track_slots`` (-1: none).
    bytes_moved: 0-dim int64 tensor on the device: bytes read plus bytes written by the state
                 copies (the accounting of the measured copy bandwidth). A tensor, not an int,
                 because counting the active requests on the host would need a device sync.
    """

    last_step: torch.Tensor
    track_step: torch.Tensor
    bytes_moved: torch.Tensor


# ---------------------------------------------------------------------------------------------
# checks (metadata only, except in checked mode)


def _check_verdict(verdict: object) -> Verdict:
    if verdict_ok(verdict):  # the common case, and stricter than this check (num_correct, predict's dtype)
        return verdict
    if not isinstance(verdict, Verdict):
        raise InvalidInput("verdict", "a spec_hal.types.Verdict", type(verdict).__name__)
    accept_index = checks.tensor("verdict.accept_index", verdict.accept_index, ndim=2, dtypes=checks.INDEX_DTYPES)
    bs, device = accept_index.shape[0], accept_index.device
    if accept_index.shape[1] == 0:
        raise InvalidInput("verdict.accept_index", "at least one column (S + 1 >= 1)", f"shape {tuple(accept_index.shape)}")
    checks.tensor("verdict.accept_lens", verdict.accept_lens, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs,))
    predict = checks.tensor("verdict.predict", verdict.predict, ndim=1, device=device)
    if bs and (predict.shape[0] == 0 or predict.shape[0] % bs):
        raise InvalidInput("verdict.predict", f"(bs * N,) rows with bs = {bs}", f"shape {tuple(predict.shape)}")
    return verdict


def _check_verdict_values(verdict: Verdict) -> None:
    """Checked mode: accept_lens in [1, S+1]; each path is root first, strictly increasing node
    ids of its own request, then -1 padding (a padded graph row may be all -1)."""
    bs, width = verdict.accept_index.shape
    if bs == 0:
        return
    nodes = verdict.num_nodes
    lens = verdict.accept_lens.long()
    if bool(((lens < 1) | (lens > width)).any()):
        raise InvalidInput("verdict.accept_lens", f"values in [1, {width}]", lens.tolist())
    index = verdict.accept_index.long()
    position = torch.arange(width, device=index.device)
    on_path = position[None, :] < lens[:, None]
    padded_row = (index == -1).all(dim=1)
    local = index - torch.arange(bs, device=index.device)[:, None] * nodes
    valid = torch.where(on_path, (local >= 0) & (local < nodes), index == -1)
    valid &= ~on_path[:, :1] | (local[:, :1] == 0)
    increasing = (local[:, 1:] > local[:, :-1]) | ~on_path[:, 1:]
    if not bool(((valid.all(dim=1) & increasing.all(dim=1)) | padded_row).all()):
        raise InvalidInput("verdict.accept_index", "per request: its root, then strictly increasing ids of its own nodes, then -1", index.tolist())


def _check_track_interval(track_interval: object) -> None:
    if track_interval is not None:
        checks.integer("track_interval", track_interval, low=1)


def check_mamba_commit_steps(verdict, seq_lens, *, track_interval=None) -> None:
    verdict = _check_verdict(verdict)
    checks.tensor("seq_lens", seq_lens, dtypes=checks.INDEX_DTYPES, device=verdict.device, shape=(verdict.batch_size,))
    _check_track_interval(track_interval)
    if value_checks_enabled():
        _check_verdict_values(verdict)
        if bool((seq_lens < 0).any()):
            raise InvalidInput("seq_lens", "non-negative lengths", seq_lens.tolist())


def _state_strides_contiguous(tensor: torch.Tensor, leading: int) -> bool:
    expected = 1
    for size, stride in reversed(list(zip(tensor.shape[leading:], tensor.stride()[leading:]))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _check_state_pair(dst_name: str, dst: object, src_name: str, src: object) -> None:
    """A pool (L, slots, *state) and its scratch (L, rows, N, *state) of one dtype and device."""
    checks.tensor(dst_name, dst, dtypes=STATE_DTYPES)
    checks.writable(dst_name, dst)  # the pool is written in place
    if dst.dim() < 2:
        raise InvalidInput(dst_name, "an (L, slots, *state) tensor of at least 2 dimensions", f"shape {tuple(dst.shape)}")
    want = (dst.shape[0], None, None, *dst.shape[2:])
    checks.tensor(src_name, src, dtypes=(dst.dtype,), device=dst.device, ndim=dst.dim() + 1, shape=want)
    for name, tensor, leading in ((dst_name, dst, 2), (src_name, src, 3)):
        # a contiguous tensor (the common case, one C++ call) has contiguous trailing dimensions
        if not tensor.is_contiguous() and not _state_strides_contiguous(tensor, leading):
            raise InvalidInput(name, f"a contiguous state (dimensions {leading} onward)", f"strides {tensor.stride()}")


def _check_request_vectors(names: tuple[str, ...], vectors: tuple, length: Optional[int], device: torch.device) -> int:
    """1-D int32/int64 vectors of one length on ``device``; returns that length."""
    for name, vector in zip(names, vectors):
        if vector is None and name not in OPTIONAL_VECTORS:
            raise InvalidInput(name, "a 1-D int32/int64 tensor", "None")
        if vector is None:
            continue
        checks.tensor(name, vector, ndim=1, dtypes=checks.INDEX_DTYPES, device=device, shape=None if length is None else (length,))
        length = vector.shape[0]
    return length


def _check_index_values(name: str, values: torch.Tensor, high: int, *, active: torch.Tensor) -> None:
    """Checked mode: values are -1 (none) or in [0, high) where ``active``."""
    values = values.long()
    bad = (values < -1) | (active & (values >= high))
    if bool(bad.any()):
        raise InvalidInput(name, f"-1 or values in [0, {high})", values.tolist())


def _check_distinct(name: str, slots: torch.Tensor, active: torch.Tensor) -> None:
    used = slots.long()[active]
    if used.numel() != torch.unique(used).numel():
        raise InvalidInput(name, "distinct slots among the copied requests (duplicates race)", slots.tolist())


def _check_scatter_values(*, num_slots, num_steps, num_rows, dst_slots, src_steps, src_rows) -> None:
    """Checked mode: index ranges and distinct active slots."""
    active = (dst_slots.long() >= 0) & (src_steps.long() >= 0)
    _check_index_values("dst_slots", dst_slots, num_slots, active=active)
    _check_index_values("src_steps", src_steps, num_steps, active=active)
    if src_rows is not None:
        rows = src_rows.long()
        if bool((active & ((rows < 0) | (rows >= num_rows))).any()):
            raise InvalidInput("src_rows", f"values in [0, {num_rows}) where a request is copied", rows.tolist())
    _check_distinct("dst_slots", dst_slots, active)


def record_scatter_values(*, num_slots, num_steps, num_rows, dst_slots, src_steps, src_rows) -> None:
    """Default mode: record the indices the skip rule drops that checked mode would reject (a
    slot or step < -1, or past its range where the request would be copied; a row out of range
    where it would be copied), index r, in the error flag."""
    slots, steps = dst_slots.long(), src_steps.long()
    active = (slots >= 0) & (steps >= 0)
    record_invalid("scatter_mamba_state", "dst_slots", (slots < -1) | (active & (slots >= num_slots)), rule=f"-1 or [0, {num_slots})")
    record_invalid("scatter_mamba_state", "src_steps", (steps < -1) | (active & (steps >= num_steps)), rule=f"-1 or [0, {num_steps})")
    if src_rows is not None:
        rows = src_rows.long()
        record_invalid("scatter_mamba_state", "src_rows", active & ((rows < 0) | (rows >= num_rows)), rule=f"[0, {num_rows})")


def record_commit_values(*, num_slots, num_rows, slots, track_slots, src_rows, last_step, track_step) -> None:
    """The slot and row rules of ``commit_mamba_state`` (index b): a slot or track slot < -1, or
    past the pool where its step is >= 0; a row out of range where either set copies. Records
    in the default mode; raises InvalidInput naming the argument in checked mode."""
    slots, last_step = slots.long(), last_step.long()
    record_invalid("commit_mamba_state", "slots", (slots < -1) | ((last_step >= 0) & (slots >= num_slots)), rule=f"-1 or [0, {num_slots})")
    copies = (slots >= 0) & (last_step >= 0)
    if track_slots is not None:
        track_slots, track_step = track_slots.long(), track_step.long()
        record_invalid("commit_mamba_state", "track_slots", (track_slots < -1) | ((track_step >= 0) & (track_slots >= num_slots)),
                       rule=f"-1 or [0, {num_slots})")
        copies |= (track_slots >= 0) & (track_step >= 0)
    if src_rows is not None:
        rows = src_rows.long()
        record_invalid("commit_mamba_state", "src_rows", copies & ((rows < 0) | (rows >= num_rows)), rule=f"[0, {num_rows})")


def _index_vector_ok(value, length: int, device) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in _INDEX_DTYPES and value.shape == (length,) and value.device == device


def _scatter_ok(dst, src, dst_slots, src_steps) -> bool:
    """``check_scatter_mamba_state``'s common call (no src_rows) in a few comparisons: a
    contiguous pool and scratch (so trailing-contiguous, and the pool has no overlapping
    elements) of one state dtype and device, and two index vectors of one length <= the
    scratch's rows. Anything else goes to the detailed checks, which name the argument."""
    if not (isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor) and dst.is_contiguous() and src.is_contiguous()):
        return False
    dtype, device, shape, src_shape = dst.dtype, dst.device, dst.shape, src.shape
    if dtype not in _STATE_DTYPES or src.dtype != dtype or src.device != device or dst.is_meta:
        return False
    if len(shape) < 2 or len(src_shape) != len(shape) + 1 or src_shape[0] != shape[0] or src_shape[3:] != shape[2:]:
        return False
    if not isinstance(dst_slots, torch.Tensor) or len(dst_slots.shape) != 1:
        return False
    requests = dst_slots.shape[0]
    return requests <= src_shape[1] and _index_vector_ok(dst_slots, requests, device) and _index_vector_ok(src_steps, requests, device)


_STATE_DTYPES = frozenset(STATE_DTYPES)
_INDEX_DTYPES = frozenset(checks.INDEX_DTYPES)


def check_scatter_mamba_state(*, dst, src, dst_slots, src_steps, src_rows=None) -> None:
    if src_rows is None and not value_checks_enabled() and _scatter_ok(dst, src, dst_slots, src_steps):
        return
    _check_state_pair("dst", dst, "src", src)
    requests = _check_request_vectors(("dst_slots", "src_steps", "src_rows"), (dst_slots, src_steps, src_rows), None, dst.device)
    if src_rows is None and requests > src.shape[1]:
        raise InvalidInput("src", f"at least {requests} rows (one per request; or pass src_rows)", f"shape {tuple(src.shape)}")
    if value_checks_enabled():
        _check_scatter_values(num_slots=dst.shape[1], num_steps=src.shape[2], num_rows=src.shape[1],
                              dst_slots=dst_slots, src_steps=src_steps, src_rows=src_rows)


def check_commit_mamba_state(
    *, verdict, seq_lens, slots, ssm_state, ssm_intermediate, conv_state, conv_intermediate,
    track_slots=None, track_interval=None, src_rows=None,
) -> None:
    check_mamba_commit_steps(verdict, seq_lens, track_interval=track_interval)
    bs, device = verdict.batch_size, verdict.device
    _check_state_pair("ssm_state", ssm_state, "ssm_intermediate", ssm_intermediate)
    _check_state_pair("conv_state", conv_state, "conv_intermediate", conv_intermediate)
    for name, tensor in (("ssm_state", ssm_state), ("conv_state", conv_state)):
        checks.tensor(name, tensor, device=device)
    # One slot pool and one scratch row per request for both states: a request is copied for
    # both or for neither, so the bytes moved follow from one count of active requests.
    if conv_state.shape[1] != ssm_state.shape[1]:
        raise InvalidInput("conv_state", f"{ssm_state.shape[1]} slots (the pool of ssm_state)", f"shape {tuple(conv_state.shape)}")
    if conv_intermediate.shape[1] != ssm_intermediate.shape[1]:
        raise InvalidInput("conv_intermediate", f"{ssm_intermediate.shape[1]} rows (those of ssm_intermediate)", f"shape {tuple(conv_intermediate.shape)}")
    nodes = verdict.num_nodes
    for name, scratch in (("ssm_intermediate", ssm_intermediate), ("conv_intermediate", conv_intermediate)):
        if bs and scratch.shape[2] != nodes:
            raise InvalidInput(name, f"N = {nodes} steps (dimension 2, one per tree node)", f"shape {tuple(scratch.shape)}")
        if src_rows is None and scratch.shape[1] < bs:
            raise InvalidInput(name, f"at least bs = {bs} rows (or pass src_rows)", f"shape {tuple(scratch.shape)}")
    _check_request_vectors(("slots", "track_slots", "src_rows"), (slots, track_slots, src_rows), bs, device)
    if (track_slots is None) != (track_interval is None):
        raise InvalidInput("track_interval", "given together with track_slots (prefix-cache snapshots)", track_interval)
    if value_checks_enabled() and bs:
        last_step, track_step = mamba_commit_steps(verdict, seq_lens, track_interval=track_interval)
        record_commit_values(num_slots=ssm_state.shape[1], num_rows=ssm_intermediate.shape[1], slots=slots,
                             track_slots=track_slots, src_rows=src_rows, last_step=last_step, track_step=track_step)
        _check_distinct("slots", slots, (slots.long() >= 0) & (last_step >= 0))
        if track_slots is not None:  # a snapshot slot must differ from every committed one too
            steps, dst_slots, _ = _commit_index_sets(slots, track_slots, src_rows, last_step, track_step)
            _check_distinct("track_slots", dst_slots, (dst_slots >= 0) & (steps >= 0))


# ---------------------------------------------------------------------------------------------
# reference


def _local_node(accept_index: torch.Tensor, position: torch.Tensor, nodes: int) -> torch.Tensor:
    """Local node id at path ``position`` of each request (int64); -1 where the path holds -1."""
    bs = accept_index.shape[0]
    global_id = accept_index.long().gather(1, position[:, None])[:, 0]
    base = torch.arange(bs, device=accept_index.device) * nodes
    local = global_id - base
    # Rule: an id outside the request's own block [b*N, (b+1)*N) (and -1 padding) gives -1.
    return torch.where((local >= 0) & (local < nodes), local, torch.full_like(local, -1))


def fake_mamba_commit_steps(verdict, seq_lens, *, track_interval=None):
    bs = verdict.accept_index.shape[0]
    return seq_lens.new_empty((bs,), dtype=torch.int32), seq_lens.new_empty((bs,), dtype=torch.int32)


@register_op("mamba_commit_steps", family="mamba", check=check_mamba_commit_steps, fake=fake_mamba_commit_steps)
def mamba_commit_steps(
    verdict: Verdict, seq_lens: torch.Tensor, *, track_interval: Optional[int] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which intermediate step (tree node) each request commits, and which it snapshots.

    Args:
        verdict: the verification result; ``accept_index`` (bs, S+1) int32/int64 global node
            ids (RAW tree ids, before compaction), root first, -1 padded; ``accept_lens`` (bs,)
            int32/int64 (>= 1); N = ``predict.shape[0] // bs``.
        seq_lens: (bs,) int32/int64 tokens committed BEFORE this verify (the root's position).
        track_interval: prefix-cache snapshot interval I (tokens) or None (no snapshots).

    Returns:
        last_step (bs,) int32: local node id of the last accepted node,
        ``accept_index[b, accept_lens[b]-1] - b*N`` (not ``accept_lens - 1``: that is only right
        for a chain); -1 where that entry is -1 (a padded row).
        track_step (bs,) int32: local node id whose state covers exactly ``(post // I) * I``
        tokens where this round crossed a multiple of I, else -1 (all -1 without an interval).
    """
    accept_index = verdict.accept_index
    bs, width = accept_index.shape
    device = accept_index.device
    if bs == 0:
        empty = torch.empty(0, dtype=torch.int32, device=device)
        return empty, empty.clone()
    last_step, track_step = _commit_steps(verdict, seq_lens, track_interval, op="mamba_commit_steps")
    return last_step.to(torch.int32), track_step.to(torch.int32)


def _commit_steps(verdict: Verdict, seq_lens: torch.Tensor, track_interval: Optional[int], *, op: str):
    """(last_step, track_step) int64 of a non-empty batch; records what it met for ``op``.

    Error flag (default mode, docs/reliability.md): ``verdict.accept_lens`` outside [1, S+1]
    (index b); an ``accept_index`` entry the op reads (the last position, and the boundary's when
    a snapshot is due) that is neither -1 (padding) nor an id of the request's own block (flat
    index b * (S+1) + position); with a track interval, ``seq_lens`` < 0 (index b).
    """
    accept_index = verdict.accept_index
    bs, width = accept_index.shape
    nodes = verdict.num_nodes
    lens = verdict.accept_lens.long()
    record_invalid(op, "verdict.accept_lens", (lens < 1) | (lens > width), rule=f"values in [1, {width}]")
    read = torch.zeros((bs, width), dtype=torch.bool, device=accept_index.device)
    last_position = (lens - 1).clamp(0, width - 1)
    read[torch.arange(bs, device=read.device), last_position] = True
    last_step = _local_node(accept_index, last_position, nodes)
    if track_interval is None:
        track_step = torch.full((bs,), -1, dtype=torch.int64, device=accept_index.device)
    else:
        pre = seq_lens.long()
        record_invalid(op, "seq_lens", pre < 0, rule="non-negative lengths")
        post = pre + lens
        # Rule: a negative seq_len takes no snapshot (floor and truncating division disagree there).
        crossed = (pre >= 0) & (post >= 0) & (pre // track_interval != post // track_interval)
        boundary = post // track_interval * track_interval
        position = (boundary - pre - 1).clamp(0, width - 1)
        requests = torch.arange(bs, device=read.device)
        read[requests, position] = read[requests, position] | crossed
        track_step = torch.where(crossed, _local_node(accept_index, position, nodes), torch.full_like(pre, -1))
    local = accept_index.long() - torch.arange(bs, device=read.device)[:, None] * nodes
    foreign = (accept_index != -1) & ((local < 0) | (local >= nodes))
    record_invalid(op, "verdict.accept_index", read & foreign, rule="-1 or ids of the request's own block")
    return last_step, track_step


def active_requests(*, num_slots: int, num_steps: int, num_rows: int, dst_slots, src_steps, src_rows) -> torch.Tensor:
    """(R,) bool: the requests a scatter copies (step and slot >= 0 and every index in range)."""
    slots, steps = dst_slots.long(), src_steps.long()
    rows = torch.arange(slots.shape[0], device=slots.device) if src_rows is None else src_rows.long()
    return (slots >= 0) & (slots < num_slots) & (steps >= 0) & (steps < num_steps) & (rows >= 0) & (rows < num_rows)


@register_op("scatter_mamba_state", family="mamba", check=check_scatter_mamba_state, mutates=("dst",))
def scatter_mamba_state(
    *, dst: torch.Tensor, src: torch.Tensor, dst_slots: torch.Tensor, src_steps: torch.Tensor,
    src_rows: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``dst[:, dst_slots[r]] = src[:, src_rows[r], src_steps[r]]`` for every layer; keyword-only.

    Args:
        dst: (L, slots, *state) float32/bfloat16/float16/float64 pool, written in place; any
            layer and slot strides, contiguous state.
        src: (L, rows, N, *state) same dtype; any layer/row/step strides, contiguous state.
        dst_slots: (R,) int32/int64 destination slot per request; -1 (none) skips the request.
        src_steps: (R,) int32/int64 intermediate step (local node id); -1 skips the request.
        src_rows: optional (R,) int32/int64 scratch row per request (default: row r).

    Requests whose indices are out of range are skipped (errors in checked mode). Active slots
    must be distinct. Returns ``dst``.
    """
    if dst_slots.shape[0] == 0:
        return dst
    record_scatter_values(num_slots=dst.shape[1], num_steps=src.shape[2], num_rows=src.shape[1],
                          dst_slots=dst_slots, src_steps=src_steps, src_rows=src_rows)
    _scatter(dst, src, dst_slots, src_steps, src_rows)
    return dst


def _scatter(dst, src, dst_slots, src_steps, src_rows) -> None:
    """The copies of ``scatter_mamba_state`` (no checks, no records)."""
    active = active_requests(num_slots=dst.shape[1], num_steps=src.shape[2], num_rows=src.shape[1],
                             dst_slots=dst_slots, src_steps=src_steps, src_rows=src_rows)
    rows = torch.arange(dst_slots.shape[0], device=dst.device) if src_rows is None else src_rows.long()
    # Boolean selection syncs on a GPU; this is the oracle (and the cpu provider), not a kernel.
    dst[:, dst_slots.long()[active]] = src[:, rows[active], src_steps.long()[active]]


def state_bytes(state: torch.Tensor) -> int:
    """Bytes of one slot of ``state`` (L, slots, *state) over all its layers."""
    per_slot = state.element_size() * state.shape[0]
    for size in state.shape[2:]:
        per_slot *= size
    return per_slot


def commit_bytes_per_request(ssm_state: torch.Tensor, conv_state: torch.Tensor) -> int:
    """Bytes read plus written when one request's SSM and conv states are copied."""
    return 2 * (state_bytes(ssm_state) + state_bytes(conv_state))


def _commit_index_sets(slots, track_slots, src_rows, last_step, track_step):
    """(steps, dst_slots, src_rows) of the commit set, then the track set when there is one."""
    rows = torch.arange(slots.shape[0], device=slots.device) if src_rows is None else src_rows.long()
    if track_slots is None:
        return last_step.long(), slots.long(), rows
    return (torch.cat([last_step.long(), track_step.long()]), torch.cat([slots.long(), track_slots.long()]),
            torch.cat([rows, rows]))


def fake_commit_mamba_state(*, verdict, seq_lens, slots, ssm_state, ssm_intermediate, conv_state, conv_intermediate,
                            track_slots=None, track_interval=None, src_rows=None) -> MambaCommit:
    last_step, track_step = fake_mamba_commit_steps(verdict, seq_lens)
    return MambaCommit(last_step, track_step, seq_lens.new_empty((), dtype=torch.int64))


@register_op("commit_mamba_state", family="mamba", check=check_commit_mamba_state, fake=fake_commit_mamba_state,
             mutates=("ssm_state", "conv_state"))
def commit_mamba_state(
    *, verdict: Verdict, seq_lens: torch.Tensor, slots: torch.Tensor,
    ssm_state: torch.Tensor, ssm_intermediate: torch.Tensor,
    conv_state: torch.Tensor, conv_intermediate: torch.Tensor,
    track_slots: Optional[torch.Tensor] = None, track_interval: Optional[int] = None,
    src_rows: Optional[torch.Tensor] = None,
) -> MambaCommit:
    """Make the last accepted node's state live (and snapshot the track boundary); keyword-only.

    Args:
        verdict, seq_lens: as for ``mamba_commit_steps`` (seq_lens before this verify).
        slots: (bs,) int32/int64 mamba pool slot of each request; -1 skips it.
        ssm_state: (L, slots, *ssm_shape) pool (fp32 by default), written in place.
        ssm_intermediate: (L, rows, N, *ssm_shape) state after each tree node, by batch row.
        conv_state: (L', slots, *conv_shape) pool (bf16/fp16), same slot count, written in place.
        conv_intermediate: (L', rows, N, *conv_shape).
        track_slots: optional (bs,) int32/int64 prefix-cache snapshot slot per request (-1:
            none); given together with ``track_interval``.
        src_rows: optional (bs,) scratch row of each request (default b).

    Both states get ``scatter_mamba_state`` of the commit set (slots, last_step) and of the track
    set (track_slots, track_step). A track slot must differ from every committed slot.

    Returns:
        MambaCommit(last_step, track_step, bytes_moved) (see the class).
    """
    device = verdict.device
    if verdict.batch_size == 0:
        empty = torch.empty(0, dtype=torch.int32, device=device)
        return MambaCommit(empty, empty.clone(), torch.zeros((), dtype=torch.int64, device=device))
    last_step, track_step = _commit_steps(verdict, seq_lens, track_interval, op="commit_mamba_state")
    record_commit_values(num_slots=ssm_state.shape[1], num_rows=ssm_intermediate.shape[1], slots=slots,
                         track_slots=track_slots, src_rows=src_rows, last_step=last_step, track_step=track_step)
    steps, dst_slots, rows = _commit_index_sets(slots, track_slots, src_rows, last_step, track_step)
    for state, scratch in ((ssm_state, ssm_intermediate), (conv_state, conv_intermediate)):
        _scatter(state, scratch, dst_slots, steps, rows)
    active = active_requests(num_slots=ssm_state.shape[1], num_steps=ssm_intermediate.shape[2],
                             num_rows=ssm_intermediate.shape[1], dst_slots=dst_slots, src_steps=steps, src_rows=rows)
    bytes_moved = active.sum() * commit_bytes_per_request(ssm_state, conv_state)
    return MambaCommit(last_step.to(torch.int32), track_step.to(torch.int32), bytes_moved.to(torch.int64))
