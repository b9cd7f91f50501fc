"""Conformance of family ``mamba`` (P19) against the reference. Semantics: spec_hal/mamba.py.

Not here: the end-to-end case (accept k of N drafts with the recurrent layer of
``spec_hal.testing``; the live state must equal decoding the k+1 tokens one by one) belongs to
the end-to-end suite, which builds on the drafting and verification families.
"""
from __future__ import annotations

import pytest
import torch

import spec_hal
from spec_hal.conformance.guards import _bits, assert_rejects, no_host_sync
from spec_hal.conformance.mamba_inputs import (GuardedPool, embedded_scratch, random_verdict, state_values,
                                               verdict_from_paths)
from spec_hal.errors import InvalidInput
from spec_hal.mamba import (CHECKS_ENV, commit_bytes_per_request, commit_mamba_state as reference_commit,
                            mamba_commit_steps as reference_steps, scatter_mamba_state as reference_scatter)
from spec_hal.types import Verdict

LAYERS, REQUESTS, SLOTS, NODES = 8, 32, 49, 5  # the upstream test recipe (P19)
STATE_KINDS = {
    "ssm-fp32": ((4, 16, 16), torch.float32),  # 1,024 elements
    "conv-bf16": ((128, 3), torch.bfloat16),  # 384 elements: not a power of two, a masked tail
    "conv-fp16": ((128, 3), torch.float16),
}
NONE_SHARE = {"commit": 0.1, "track": 0.7}  # share of -1 steps: last steps rarely, track steps mostly


def _to(device, *tensors):
    return [None if tensor is None else tensor.to(device) for tensor in tensors]


def _index_set(requests, nodes, num_slots, *, none_share, seed, slot_dtype=torch.int64, step_dtype=torch.int32):
    """Distinct destination slots (two of them -1) and steps with ``none_share`` of them -1."""
    generator = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_slots, generator=generator)[:requests]
    steps = torch.randint(0, nodes, (requests,), generator=generator)
    steps[torch.rand(requests, generator=generator) < none_share] = -1
    steps[0] = -1
    steps[1] = nodes - 1
    slots[2] = -1
    slots[5] = -1
    steps[5] = 0  # a -1 slot with a valid step: skipped too
    return slots.to(slot_dtype), steps.to(step_dtype)


def _loop_scatter(dst, src, dst_slots, src_steps, src_rows):
    """The definition, one request at a time (an oracle independent of the reference's masks)."""
    out = dst.clone()
    for r in range(dst_slots.shape[0]):
        slot, step = int(dst_slots[r]), int(src_steps[r])
        row = r if src_rows is None else int(src_rows[r])
        if 0 <= slot < dst.shape[1] and 0 <= step < src.shape[2] and 0 <= row < src.shape[1]:
            out[:, slot] = src[:, row, step]
    return out


def _assert_bitwise_equal(actual, expected, what):
    actual, expected = actual.cpu(), expected.cpu()
    if not torch.equal(_bits(actual), _bits(expected)):
        differs = (_bits(actual) != _bits(expected)).reshape(actual.shape[0], actual.shape[1], -1).any(dim=2)
        raise AssertionError(f"{what} differs from the reference at (layer, slot) {differs.nonzero()[:8].tolist()}")


def _run_scatter(backend, old, scratch, slots, steps, rows):
    device = backend.device
    pool = GuardedPool.create(old, device)
    src = embedded_scratch(scratch, device)
    slots_d, steps_d, rows_d = _to(device, slots, steps, rows)
    with no_host_sync(device):
        returned = backend.scatter_mamba_state(dst=pool.tensor, src=src, dst_slots=slots_d, src_steps=steps_d, src_rows=rows_d)
    assert returned.data_ptr() == pool.tensor.data_ptr()
    pool.assert_intact("dst")
    return pool.tensor.cpu()


@pytest.mark.spec_hal_op("scatter_mamba_state")
@pytest.mark.parametrize("with_rows", (False, True), ids=("rows-default", "rows-given"))
@pytest.mark.parametrize("index_set", tuple(NONE_SHARE))
@pytest.mark.parametrize("kind", tuple(STATE_KINDS))
def test_scatter_matches_reference(backend, kind, index_set, with_rows):
    """8 layers, 32 requests, 49 slots, N = 5: the fused scatter equals the reference exactly."""
    shape, dtype = STATE_KINDS[kind]
    seed = 1000 * tuple(STATE_KINDS).index(kind) + 100 * tuple(NONE_SHARE).index(index_set) + with_rows
    scratch_rows = REQUESTS + 3 if with_rows else REQUESTS
    old = state_values((LAYERS, SLOTS, *shape), dtype, seed=seed)
    scratch = state_values((LAYERS, scratch_rows, NODES, *shape), dtype, seed=seed + 1)
    slot_dtype, step_dtype = (torch.int32, torch.int64) if with_rows else (torch.int64, torch.int32)
    slots, steps = _index_set(REQUESTS, NODES, SLOTS, none_share=NONE_SHARE[index_set], seed=seed,
                              slot_dtype=slot_dtype, step_dtype=step_dtype)
    rows = torch.randperm(scratch_rows, generator=torch.Generator().manual_seed(seed))[:REQUESTS] if with_rows else None

    expected = old.clone()
    reference_scatter(dst=expected, src=scratch, dst_slots=slots, src_steps=steps, src_rows=rows)
    assert torch.equal(_bits(expected), _bits(_loop_scatter(old, scratch, slots, steps, rows))), "reference disagrees with the definition"
    _assert_bitwise_equal(_run_scatter(backend, old, scratch, slots, steps, rows), expected, "dst")


@pytest.mark.spec_hal_op("scatter_mamba_state")
def test_scatter_skips_out_of_range_indices(backend, monkeypatch):
    """Outside checked mode, a step, slot or row out of range skips the request (no OOB access)."""
    monkeypatch.delenv(CHECKS_ENV, raising=False)
    shape, dtype = STATE_KINDS["ssm-fp32"]
    old = state_values((2, 6, *shape), dtype, seed=1)
    scratch = state_values((2, 4, 3, *shape), dtype, seed=2)
    slots = torch.tensor([0, 6, 2, 3, 100, 5])
    steps = torch.tensor([3, 1, -5, 2, 0, 1])
    rows = torch.tensor([0, 1, 2, 3, 0, 4])
    expected = _loop_scatter(old, scratch, slots, steps, rows)
    assert not torch.equal(_bits(expected), _bits(old))  # request 3 is copied
    _assert_bitwise_equal(_run_scatter(backend, old, scratch, slots, steps, rows), expected, "dst")


@pytest.mark.spec_hal_op("scatter_mamba_state")
def test_scatter_batch_size_zero(backend):
    shape, dtype = STATE_KINDS["conv-bf16"]
    old = state_values((LAYERS, SLOTS, *shape), dtype, seed=3)
    scratch = state_values((LAYERS, 0, NODES, *shape), dtype, seed=4)
    empty = torch.empty(0, dtype=torch.int64)
    _assert_bitwise_equal(_run_scatter(backend, old, scratch, empty, empty, None), old, "dst")


# The track set is the snapshot pass; its slots come from another pool region (distinct).
def _commit_inputs(*, topk, track, with_rows, seed, bs=REQUESTS):
    num_steps = NODES - 1 if topk == 1 else 3
    verdict = random_verdict(bs, num_steps=num_steps, topk=topk, num_nodes=NODES, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    num_slots = 2 * bs + 6
    permutation = torch.randperm(num_slots, generator=generator)
    slots, track_slots = permutation[:bs].clone(), permutation[bs:2 * bs].clone()
    if bs > 3:
        slots[3] = -1  # a padded / freed request
        track_slots[2] = -1
    seq_lens = torch.randint(0, 40, (bs,), generator=generator, dtype=torch.int32)
    rows = torch.randperm(bs + 2, generator=generator)[:bs] if with_rows else None
    scratch_rows = bs + 2 if with_rows else bs
    states = {
        "ssm_state": state_values((4, num_slots, 2, 8, 16), torch.float32, seed=seed + 1),
        "ssm_intermediate": state_values((4, scratch_rows, NODES, 2, 8, 16), torch.float32, seed=seed + 2),
        "conv_state": state_values((3, num_slots, 40, 3), torch.bfloat16, seed=seed + 3),
        "conv_intermediate": state_values((3, scratch_rows, NODES, 40, 3), torch.bfloat16, seed=seed + 4),
    }
    kwargs = dict(verdict=verdict, seq_lens=seq_lens, slots=slots, src_rows=rows,
                  track_slots=track_slots if track else None, track_interval=4 if track else None)
    return kwargs, states


def _verdict_to(verdict: Verdict, device) -> Verdict:
    return Verdict(*_to(device, verdict.predict, verdict.accept_index, verdict.num_correct, verdict.accept_lens))


def _run_commit(backend, kwargs, states):
    device = backend.device
    pools = {name: GuardedPool.create(states[name], device) for name in ("ssm_state", "conv_state")}
    scratch = {name: embedded_scratch(states[name], device) for name in ("ssm_intermediate", "conv_intermediate")}
    moved = {key: (value.to(device) if isinstance(value, torch.Tensor) else value) for key, value in kwargs.items()}
    moved["verdict"] = _verdict_to(kwargs["verdict"], device)
    with no_host_sync(device):
        result = backend.commit_mamba_state(**moved, **{name: pool.tensor for name, pool in pools.items()}, **scratch)
    for name, pool in pools.items():
        pool.assert_intact(name)
    return result, {name: pool.tensor.cpu() for name, pool in pools.items()}


@pytest.mark.spec_hal_op("commit_mamba_state")
@pytest.mark.parametrize("with_rows", (False, True), ids=("rows-default", "rows-given"))
@pytest.mark.parametrize("track", (False, True), ids=("no-track", "track"))
@pytest.mark.parametrize("topk", (1, 4))
def test_commit_matches_reference(backend, topk, track, with_rows):
    kwargs, states = _commit_inputs(topk=topk, track=track, with_rows=with_rows, seed=17 * topk + 2 * track + with_rows)
    expected_states = {name: tensor.clone() for name, tensor in states.items()}
    expected = reference_commit(**kwargs, **expected_states)
    result, pools = _run_commit(backend, kwargs, states)
    assert torch.equal(result.last_step.cpu(), expected.last_step), "last_step differs from the reference"
    assert torch.equal(result.track_step.cpu(), expected.track_step), "track_step differs from the reference"
    for name in ("ssm_state", "conv_state"):
        _assert_bitwise_equal(pools[name], expected_states[name], name)
    assert result.bytes_moved.dtype == torch.int64 and result.bytes_moved.shape == ()
    assert int(result.bytes_moved) == int(expected.bytes_moved)
    # bytes moved in closed form: each copied request reads and writes one slot of both states
    copied = int((expected.last_step >= 0).logical_and(kwargs["slots"] >= 0).sum())
    if track:
        copied += int((expected.track_step >= 0).logical_and(kwargs["track_slots"] >= 0).sum())
    assert int(result.bytes_moved) == copied * commit_bytes_per_request(states["ssm_state"], states["conv_state"])


@pytest.mark.spec_hal_op("commit_mamba_state")
def test_commit_batch_size_zero(backend):
    kwargs, states = _commit_inputs(topk=4, track=True, with_rows=False, seed=5, bs=0)
    result, pools = _run_commit(backend, kwargs, states)
    assert result.last_step.shape == (0,) and result.track_step.shape == (0,)
    assert int(result.bytes_moved) == 0
    for name in ("ssm_state", "conv_state"):
        _assert_bitwise_equal(pools[name], states[name], name)


# ---------------------------------------------------------------------------------------------
# upstream bug 5: step indices of trees, keyword-only signatures

TREE_PATHS = [[0, 1], [0, 2, 3]]  # docs/semantics.md §1.4: request 1 accepts [0, 2, 3] (global [4, 6, 7])


def _marker_states(rows, nodes, slots):
    """Intermediate states whose every element is 100 * row + node + 1 (exact in bf16)."""
    markers = (100 * torch.arange(rows)[:, None] + torch.arange(nodes)[None, :] + 1).float()
    return {
        "ssm_state": torch.zeros(2, slots, 2, 4),
        "ssm_intermediate": markers[None, :, :, None, None].expand(2, rows, nodes, 2, 4).contiguous(),
        "conv_state": torch.zeros(2, slots, 8, 3, dtype=torch.bfloat16),
        "conv_intermediate": markers[None, :, :, None, None].expand(2, rows, nodes, 8, 3).to(torch.bfloat16).contiguous(),
    }


@pytest.mark.spec_hal_op("commit_mamba_state")
def test_commit_tree_commits_last_accepted_node(backend):
    """K > 1: the live state is the last accepted NODE's (node 3), not accept_lens - 1 (node 2)."""
    verdict = verdict_from_paths(TREE_PATHS, num_steps=2, num_nodes=4)
    kwargs = dict(verdict=verdict, seq_lens=torch.tensor([10, 20]), slots=torch.tensor([5, 2]))
    result, pools = _run_commit(backend, kwargs, _marker_states(2, 4, 6))
    for name in ("ssm_state", "conv_state"):
        assert (pools[name][:, 5].float() == 100 * 0 + 1 + 1).all(), f"{name}: request 0 must hold node 1's state"
        assert (pools[name][:, 2].float() == 100 * 1 + 3 + 1).all(), f"{name}: request 1 must hold node 3's state (not node 2's)"
        untouched = [slot for slot in range(6) if slot not in (2, 5)]
        assert (pools[name][:, untouched] == 0).all()
    assert result.last_step.cpu().tolist() == [1, 3]


@pytest.mark.spec_hal_op("mamba_commit_steps")
def test_commit_steps_golden(backend):
    """Hand-derived: docs/semantics.md §1.4's chain (last step 2) and tree (last step 3), and track boundaries."""
    device = backend.device
    chain = verdict_from_paths([[0, 1, 2]], num_steps=3, num_nodes=4, device=device)
    last, track = backend.mamba_commit_steps(chain, torch.tensor([7], device=device), track_interval=8)
    # pre 7, post 10: crosses 8; the state covering 8 tokens is path position 8 - 7 - 1 = 0 (the root)
    assert last.cpu().tolist() == [2] and track.cpu().tolist() == [0]
    assert last.dtype == torch.int32 and track.dtype == torch.int32

    tree = verdict_from_paths([[0, 1], [0, 2, 3], [0, 2, 3], [0]], num_steps=2, num_nodes=4, device=device)
    seq_lens = torch.tensor([3, 6, 9, 7], device=device)
    last, track = backend.mamba_commit_steps(tree, seq_lens, track_interval=8)
    # request 1: pre 6, post 9 -> boundary 8 at path position 1 = node 2; request 2: pre 9, post 12
    # -> no crossing; request 3: pre 7, post 8 -> boundary 8 at position 0 = the root
    assert last.cpu().tolist() == [1, 3, 3, 0]
    assert track.cpu().tolist() == [-1, 2, -1, 0]
    last, track = backend.mamba_commit_steps(tree, seq_lens)
    assert track.cpu().tolist() == [-1, -1, -1, -1]
    # a padded row (its path is -1) commits nothing
    padded = Verdict(tree.predict, torch.cat([tree.accept_index[:3], torch.full_like(tree.accept_index[3:], -1)]),
                     tree.num_correct, tree.accept_lens)
    last, track = backend.mamba_commit_steps(padded, seq_lens, track_interval=1)
    assert last.cpu().tolist() == [1, 3, 3, -1] and track.cpu().tolist()[3] == -1


STEP_GRID = [(0, 3, 1, 4), (1, 3, 1, 4), (7, 2, 2, 4), (33, 5, 4, 8), (64, 5, 8, 32), (1500, 3, 4, 16)]


@pytest.mark.spec_hal_op("mamba_commit_steps")
@pytest.mark.parametrize("track_interval", (None, 1, 3, 64))
@pytest.mark.parametrize("bs, num_steps, topk, num_nodes", STEP_GRID)
def test_commit_steps_match_reference(backend, bs, num_steps, topk, num_nodes, track_interval):
    seed = bs * 7 + num_nodes
    verdict = random_verdict(bs, num_steps=num_steps, topk=topk, num_nodes=num_nodes, seed=seed)
    seq_lens = torch.randint(0, 300, (bs,), generator=torch.Generator().manual_seed(seed), dtype=torch.int64)
    expected_last, expected_track = reference_steps(verdict, seq_lens, track_interval=track_interval)
    device = backend.device
    verdict_device, seq_lens_device = _verdict_to(verdict, device), seq_lens.to(device)
    with no_host_sync(device):
        last, track = backend.mamba_commit_steps(verdict_device, seq_lens_device, track_interval=track_interval)
    assert last.dtype == torch.int32 and track.dtype == torch.int32 and last.shape == (bs,) and track.shape == (bs,)
    assert torch.equal(last.cpu(), expected_last) and torch.equal(track.cpu(), expected_track)
    if topk == 1:  # for a chain the tree-aware step equals accept_lens - 1
        assert torch.equal(expected_last, verdict.accept_lens - 1)


@pytest.mark.spec_hal_op("scatter_mamba_state")
def test_scatter_positional_call_raises_type_error(backend):
    """Upstream bug 5: a positional call against a changed signature bound the wrong arguments."""
    dst = torch.zeros(1, 2, 4, device=backend.device)
    src = torch.zeros(1, 1, 2, 4, device=backend.device)
    index = torch.zeros(1, dtype=torch.int64, device=backend.device)
    with pytest.raises(TypeError):
        backend.scatter_mamba_state(dst, src, index, index)
    with pytest.raises(TypeError):
        backend.scatter_mamba_state(dst, src=src, dst_slots=index, src_steps=index)
    with pytest.raises(TypeError):
        spec_hal.scatter_mamba_state(dst, src, index, index)
    verdict = verdict_from_paths([[0]], num_steps=1, num_nodes=2, device=backend.device)
    with pytest.raises(TypeError):
        backend.commit_mamba_state(verdict, index, index, dst, src, dst, src)
    assert torch.equal(dst, torch.zeros_like(dst))


# ---------------------------------------------------------------------------------------------
# int64 offsets: offsets past 2^31 elements, without allocating them

BIG_STRIDE = 2**29 + 16  # index 4 times this is 2^31 + 64 elements: past int32
STATE = 64


def _huge_view(shape, strides, device):
    """A bf16 view whose largest offset passes 2^31 elements over a ~4.3 GB storage; on CPU the
    storage is reserved, not touched (only the pages of the view's few elements get memory)."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if free < 2 * span * 2:
            pytest.skip(f"needs {2 * span * 2 / 1e9:.1f} GB of free device memory")
    try:
        storage = torch.empty(span, dtype=torch.bfloat16, device=device)
    except (RuntimeError, MemoryError) as exc:
        pytest.skip(f"cannot reserve {span * 2 / 1e9:.1f} GB here: {exc}")
    return torch.as_strided(storage, shape, strides)


# (dst_slots, src_steps, src_rows); request 0 always uses index 4 of the large dimension
OFFSET_CASES = {
    "dst_slot": (torch.tensor([4, 0, 2, -1, 1]), torch.tensor([2, 0, -1, 1, 1]), None),
    "dst_layer": (torch.tensor([1, -1, 0, -1, -1]), torch.tensor([2, 0, 1, 1, 1]), None),  # every layer, up to 4
    "src_step": (torch.tensor([4, 0, 2, -1, 1]), torch.tensor([4, 0, -1, 3, 2]), torch.zeros(5, dtype=torch.int64)),
    "src_row": (torch.tensor([0, 3, -1, 2, 4]), torch.tensor([1, 0, 2, -1, 2]), torch.tensor([4, 0, 1, 2, 3])),
}


@pytest.mark.spec_hal_op("scatter_mamba_state")
@pytest.mark.parametrize("large", tuple(OFFSET_CASES))
def test_scatter_offsets_beyond_int32(backend, large):
    """Index 4 along one dimension with stride 2^29 + 16 sits at element 2^31 + 64: an int32
    offset computation would wrap negative and write (or read) the wrong place. Real tensors,
    real kernel; the storage is ~4.3 GB of address space (device memory on a GPU)."""
    device = backend.device
    slots, steps, rows = OFFSET_CASES[large]
    if large.startswith("dst"):
        shape, strides = ((1, 5, STATE), (5 * BIG_STRIDE, BIG_STRIDE, 1)) if large == "dst_slot" else ((5, 2, STATE), (BIG_STRIDE, STATE, 1))
        dst = _huge_view(shape, strides, device)
        src = state_values((shape[0], 5, 3, STATE), torch.bfloat16, seed=8).to(device)
    else:
        shape, strides = ((1, 1, 5, STATE), (0, 5 * BIG_STRIDE, BIG_STRIDE, 1)) if large == "src_step" else ((1, 5, 3, STATE), (0, BIG_STRIDE, STATE, 1))
        src = _huge_view(shape, strides, device)
        src.copy_(state_values(shape, torch.bfloat16, seed=8).to(device))
        dst = torch.empty(1, 5, STATE, dtype=torch.bfloat16, device=device)
    old = state_values(tuple(dst.shape), torch.bfloat16, seed=9)
    dst.copy_(old.to(device))
    src_cpu = src.cpu()  # small: the view holds only a few hundred elements
    expected = _loop_scatter(old, src_cpu, slots, steps, rows)
    slots_d, steps_d, rows_d = _to(device, slots, steps, rows)
    with no_host_sync(device):
        backend.scatter_mamba_state(dst=dst, src=src, dst_slots=slots_d, src_steps=steps_d, src_rows=rows_d)
    _assert_bitwise_equal(dst, expected, "dst")


# ---------------------------------------------------------------------------------------------
# validation


def _invalid_scatter_calls(device):
    dst = torch.zeros(2, 4, 3, 5, device=device)
    src = torch.zeros(2, 3, 2, 3, 5, device=device)
    index = torch.zeros(3, dtype=torch.int64, device=device)

    def call(**changes):
        arguments = dict(dst=dst, src=src, dst_slots=index, src_steps=index)
        arguments.update(changes)
        return lambda b: b.scatter_mamba_state(**arguments)

    return [
        ("dst", call(dst=dst.to(torch.int32))),
        ("dst", call(dst=dst[0, 0, 0])),
        ("dst", call(dst=torch.zeros(2, 4, 5, 3, device=device).transpose(2, 3))),  # the state must be contiguous
        ("src", call(src=src.to(torch.float16))),
        ("src", call(src=src[0])),
        ("src", call(src=torch.zeros(2, 3, 2, 3, 6, device=device))),
        ("src", call(src=torch.zeros(1, 3, 2, 3, 5, device=device))),
        ("src", call(src=torch.zeros(2, 3, 2, 5, 3, device=device).transpose(3, 4))),
        ("src", call(dst_slots=torch.zeros(4, dtype=torch.int64, device=device), src_steps=torch.zeros(4, dtype=torch.int64, device=device))),
        ("dst_slots", call(dst_slots=index.float())),
        ("dst_slots", call(dst_slots=index[None])),
        ("src_steps", call(src_steps=index[:2])),
        ("src_steps", call(src_steps=index.to("meta"))),
        ("src_rows", call(src_rows=index.to(torch.int16))),
    ]


@pytest.mark.spec_hal_op("scatter_mamba_state")
@pytest.mark.parametrize("case", range(14))
def test_scatter_rejects_bad_input(backend, case):
    assert_rejects(backend, *_invalid_scatter_calls(backend.device)[case])


def _invalid_commit_calls(device):
    verdict = verdict_from_paths([[0, 1], [0]], num_steps=2, num_nodes=3, device=device)
    index = torch.zeros(2, dtype=torch.int64, device=device)
    states = dict(ssm_state=torch.zeros(2, 4, 6, device=device), ssm_intermediate=torch.zeros(2, 2, 3, 6, device=device),
                  conv_state=torch.zeros(1, 4, 5, 3, dtype=torch.bfloat16, device=device),
                  conv_intermediate=torch.zeros(1, 2, 3, 5, 3, dtype=torch.bfloat16, device=device))

    def call(**changes):
        arguments = dict(verdict=verdict, seq_lens=index, slots=index, **states)
        arguments.update(changes)
        return lambda b: b.commit_mamba_state(**arguments)

    return [
        ("verdict", call(verdict=verdict.accept_index)),
        ("seq_lens", call(seq_lens=index[:1])),
        ("slots", call(slots=torch.zeros(3, dtype=torch.int64, device=device))),
        ("track_slots", call(track_slots=index[:1], track_interval=4)),
        ("track_interval", call(track_slots=index)),
        ("track_interval", call(track_slots=index, track_interval=0)),
        ("ssm_intermediate", call(ssm_intermediate=torch.zeros(2, 2, 4, 6, device=device))),
        ("conv_intermediate", call(conv_intermediate=torch.zeros(1, 1, 3, 5, 3, dtype=torch.bfloat16, device=device))),
        ("conv_state", call(conv_state=torch.zeros(1, 5, 5, 3, dtype=torch.bfloat16, device=device))),
        ("conv_intermediate", call(conv_intermediate=torch.zeros(1, 2, 3, 5, 3, device=device))),
        ("verdict.accept_lens", call(verdict=Verdict(verdict.predict, verdict.accept_index, verdict.num_correct, verdict.accept_lens[:1]))),
    ]


@pytest.mark.spec_hal_op("commit_mamba_state")
@pytest.mark.parametrize("case", range(11))
def test_commit_rejects_bad_input(backend, case):
    assert_rejects(backend, *_invalid_commit_calls(backend.device)[case])


CHECKED_MODE_PROBLEMS = {
    # name: (dst_slots, src_steps, src_rows, argument named in the error)
    "duplicate_slot": ([1, 2, 1], [0, 1, 1], None, "dst_slots"),
    "slot_out_of_range": ([1, 4, 0], [0, 1, 1], None, "dst_slots"),
    "step_out_of_range": ([1, 2, 0], [0, 2, 1], None, "src_steps"),
    "step_below_minus_one": ([1, 2, 0], [0, -2, 1], None, "src_steps"),
    "row_out_of_range": ([1, 2, 0], [0, 1, 1], [0, 1, 3], "src_rows"),
}


@pytest.mark.spec_hal_op("scatter_mamba_state")
@pytest.mark.parametrize("problem", tuple(CHECKED_MODE_PROBLEMS))
def test_scatter_checked_mode_rejects_bad_indices(backend, monkeypatch, problem):
    """SPEC_HAL_CHECKS=1 turns skipped out-of-range indices and racing duplicates into errors."""
    slots, steps, rows, argument = CHECKED_MODE_PROBLEMS[problem]
    device = backend.device
    dst = torch.zeros(2, 4, 6, device=device)
    src = torch.ones(2, 3, 2, 6, device=device)

    def as_index(values):
        return None if values is None else torch.tensor(values, device=device)

    def call():
        return backend.scatter_mamba_state(dst=dst, src=src, dst_slots=as_index(slots), src_steps=as_index(steps), src_rows=as_index(rows))

    monkeypatch.setenv(CHECKS_ENV, "1")
    with pytest.raises(InvalidInput) as error:
        call()
    assert error.value.argument == argument
    # a -1 step or slot is "none", never an error
    backend.scatter_mamba_state(dst=dst, src=src, dst_slots=as_index([1, -1, 2]), src_steps=as_index([-1, 0, 1]))
    assert dst.cpu()[:, 2].eq(1).all() and dst.cpu()[:, 1].eq(0).all()


@pytest.mark.spec_hal_op("mamba_commit_steps")
def test_commit_steps_checked_mode_rejects_bad_verdict(backend, monkeypatch):
    device = backend.device
    verdict = verdict_from_paths([[0, 2], [0, 1]], num_steps=2, num_nodes=3, device=device)
    monkeypatch.setenv(CHECKS_ENV, "1")
    backend.mamba_commit_steps(verdict, torch.zeros(2, dtype=torch.int64, device=device))  # valid
    wrong_request = Verdict(verdict.predict, verdict.accept_index.flip(0), verdict.num_correct, verdict.accept_lens)
    decreasing = Verdict(verdict.predict, torch.tensor([[0, 2, 1], [3, -1, -1]], dtype=torch.int32, device=device),
                         verdict.num_correct, torch.tensor([3, 1], dtype=torch.int32, device=device))
    too_long = Verdict(verdict.predict, verdict.accept_index, verdict.num_correct, torch.tensor([4, 1], dtype=torch.int32, device=device))
    for bad, argument in ((wrong_request, "verdict.accept_index"), (decreasing, "verdict.accept_index"), (too_long, "verdict.accept_lens")):
        with pytest.raises(InvalidInput) as error:
            backend.mamba_commit_steps(bad, torch.zeros(2, dtype=torch.int64, device=device))
        assert error.value.argument == argument
