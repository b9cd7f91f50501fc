"""Conformance of family ``ragged`` (chains with per-request draft counts, 0 allowed) against the
reference and against the padded ops on the padded chain. Semantics: spec_hal/ragged.py.
"""
from __future__ import annotations

import os

import pytest
import torch

import spec_hal.compaction as compaction_reference
import spec_hal.kv as kv_reference
import spec_hal.mamba as mamba_reference
import spec_hal.ragged as reference
import spec_hal.verify as verify_reference
from spec_hal.conformance.cases.test_masks import _to, random_bitmask
from spec_hal.conformance.cases.test_verify import _guarded_verdict
from spec_hal.conformance.guards import assert_rejects, call_without_sync, embedded_input, no_host_sync
from spec_hal.conformance.verdicts import VERDICT_FIELDS, assert_same_verdict
from spec_hal.types import Verdict

# (name, counts) with max_drafts = 4: mixed with zeros, all zero, all full, one request.
COUNTS = {"mixed": [0, 3, 4, 1, 0, 2, 4, 0, 1], "all_zero": [0, 0, 0, 0], "all_full": [4, 4, 4], "single": [2], "empty": []}
MAX_DRAFTS = 4


def _greedy_inputs(counts: list[int], vocab: int, *, seed: int):
    """Flat drafts, counts and (T + bs, V) logits peaked so that drafts often match."""
    generator = torch.Generator().manual_seed(seed)
    total, bs = sum(counts), len(counts)
    drafts = torch.randint(0, vocab, (total,), generator=generator)
    logits = torch.randn(total + bs, vocab, generator=generator)
    row = 0
    for b, count in enumerate(counts):
        start_draft = sum(counts[:b])
        for j in range(count):  # row r_b + j predicts draft j (most of the time)
            if torch.rand(1, generator=generator) < 0.8:
                logits[row + j, drafts[start_draft + j]] += 5.0
        row += count + 1
    return drafts, torch.tensor(counts, dtype=torch.int64), logits


def _padded_chain(drafts, counts, flat_rows: torch.Tensor):
    """The same batch padded to max_drafts with -1 drafts: candidates (bs, S+1) and the padded
    rows' flat indices (bs, S+1), -1 padding (derived here by hand, not through spec_hal.ragged)."""
    bs = counts.shape[0]
    candidates = torch.full((bs, MAX_DRAFTS + 1), -1, dtype=torch.int64)
    rows = torch.full((bs, MAX_DRAFTS + 1), -1, dtype=torch.int64)
    draft_start, row_start = 0, 0
    for b, count in enumerate(counts.tolist()):
        candidates[b, 0] = 0
        candidates[b, 1:count + 1] = drafts[draft_start:draft_start + count]
        rows[b, :count + 1] = torch.arange(row_start, row_start + count + 1)
        draft_start += count
        row_start += count + 1
    return candidates, rows


@pytest.mark.spec_hal_op("verify_chain_ragged")
@pytest.mark.parametrize("name", list(COUNTS))
@pytest.mark.parametrize("form", ("ids", "logits", "logits_masked"))
def test_verify_chain_ragged(backend, name, form):
    counts = COUNTS[name]
    vocab = 37
    drafts, counts_t, logits = _greedy_inputs(counts, vocab, seed=len(counts) * 3 + len(form))
    rows = logits.shape[0]
    kwargs = {}
    target = logits.argmax(dim=1) if form == "ids" else logits
    if form == "logits_masked":
        bitmask, index, _ = random_bitmask(rows, vocab, seed=rows, indexed=True, density=0.8)
        kwargs = {"token_bitmask": bitmask, "bitmask_index": index}
    expected = reference.verify_chain_ragged(drafts, counts_t, target, max_drafts=MAX_DRAFTS, **kwargs)
    device = backend.device
    verdict = call_without_sync(device, backend.verify_chain_ragged, drafts, counts_t.to(torch.int32), target, max_drafts=MAX_DRAFTS, **kwargs)
    assert_same_verdict(verdict, expected)
    # Independent oracle: the padded verify_chain (reference) on the -1 padded chain.
    candidates, padded_rows = _padded_chain(drafts, counts_t, rows)
    if form != "logits_masked" and len(counts):
        padded_target = torch.where(padded_rows >= 0, target.argmax(dim=1)[padded_rows.clamp(min=0)] if form == "logits"
                                    else target[padded_rows.clamp(min=0)], torch.zeros_like(padded_rows))
        num_correct, bonus = verify_reference.verify_chain(candidates, padded_target)
        assert verdict.num_correct.cpu().tolist() == num_correct.tolist()
        last = verdict.accept_index.cpu().gather(1, (verdict.accept_lens.cpu().long() - 1)[:, None])[:, 0]
        assert verdict.predict.cpu()[last.long()].tolist() == bonus.tolist()
    zero = counts_t == 0
    assert (verdict.num_correct.cpu()[zero] == 0).all() and (verdict.accept_lens.cpu()[zero] == 1).all()


@pytest.mark.spec_hal_op("verify_chain_sampling_ragged")
@pytest.mark.parametrize("name", ("mixed", "all_zero", "all_full", "empty"))
@pytest.mark.parametrize("with_draft_probs", (True, False))
@pytest.mark.parametrize("masked", (False, True))
def test_verify_chain_sampling_ragged(backend, name, with_draft_probs, masked):
    counts = COUNTS[name]
    vocab = 29
    drafts, counts_t, logits = _greedy_inputs(counts, vocab, seed=len(counts) + 11 * with_draft_probs)
    total, bs = len(drafts), len(counts)
    generator = torch.Generator().manual_seed(total + bs)
    target_probs = torch.softmax(logits, dim=1)
    draft_probs = torch.softmax(torch.randn(total, vocab, generator=generator), dim=1) if with_draft_probs else None
    coins, final_coins = torch.rand(total, generator=generator), torch.rand(bs, generator=generator)
    kwargs = {}
    if masked:
        bitmask, index, _ = random_bitmask(total + bs, vocab, seed=bs, indexed=True, density=0.8)
        kwargs = {"token_bitmask": bitmask, "bitmask_index": index}
    expected = reference.verify_chain_sampling_ragged(drafts, counts_t, draft_probs, target_probs, coins, final_coins,
                                                      max_drafts=MAX_DRAFTS, **kwargs)
    device = backend.device
    verdict = call_without_sync(device, backend.verify_chain_sampling_ragged, drafts, counts_t, draft_probs, target_probs, coins,
                                final_coins, max_drafts=MAX_DRAFTS, **kwargs)
    assert_same_verdict(verdict, expected)
    zero = counts_t == 0
    assert (verdict.num_correct.cpu()[zero] == 0).all()
    assert (verdict.num_correct.cpu() <= counts_t).all()


# Unchecked counts (no SPEC_HAL_CHECKS): negative, above max_drafts, and not summing to T (short
# and long), so the flat rows run out early or are left over.
BAD_COUNTS = {"negative_and_large": ([-3, 2, 9, 1], 6), "short_flat": ([4, 4, 4], 5), "long_flat": ([1, 0, 2], 9)}


@pytest.mark.spec_hal_op("verify_chain_sampling_ragged")
@pytest.mark.parametrize("name", list(BAD_COUNTS))
@pytest.mark.parametrize("with_draft_probs", (True, False))
def test_verify_chain_sampling_ragged_bounded(backend, name, with_draft_probs):
    """Strided inputs inside attractive margins (p = q = 1 next to every row), canary-guarded out=
    buffers and counts that break the layout: the result is the reference's (counts clamped,
    rows past the flat end read as padding) and nothing outside the tensors is read or written."""
    counts, total = BAD_COUNTS[name]
    bs, vocab = len(counts), 21
    generator = torch.Generator().manual_seed(total * 7 + with_draft_probs)
    drafts = torch.randint(0, vocab, (total,), generator=generator)
    target_probs = torch.softmax(torch.randn(total + bs, vocab, generator=generator) * 3, dim=1)
    draft_probs = torch.softmax(torch.randn(total, vocab, generator=generator), dim=1) if with_draft_probs else None
    coins, final_coins = torch.rand(total, generator=generator), torch.rand(bs, generator=generator)
    counts_t = torch.tensor(counts, dtype=torch.int32)
    expected = reference.verify_chain_sampling_ragged(drafts, counts_t, draft_probs, target_probs, coins, final_coins, max_drafts=MAX_DRAFTS)
    device = backend.device
    inputs = (drafts.to(device), counts_t.to(device),
              embedded_input(draft_probs, device, margin_value=1.0) if with_draft_probs else None,
              embedded_input(target_probs, device, margin_value=1.0), coins.to(device), final_coins.to(device))
    guards, out = _guarded_verdict(bs, MAX_DRAFTS + 1, MAX_DRAFTS + 1, device)
    with no_host_sync(device):
        returned = backend.verify_chain_sampling_ragged(*inputs, max_drafts=MAX_DRAFTS, out=out)
    assert returned.predict.data_ptr() == out.predict.data_ptr(), "out= buffers were not used"
    for guard, field in zip(guards, VERDICT_FIELDS):
        guard.assert_intact(field)
    assert_same_verdict(out, expected)


# ------------------------------------------------------------------------------------------------
# the draft-aligned layout (bonus_tokens: vLLM's T target rows, the engine's bonus token)


def _with_bonus_rows(flat: torch.Tensor, counts: list[int], bonus_rows: torch.Tensor) -> torch.Tensor:
    """The draft-aligned rows (T, ...) with request b's ``bonus_rows[b]`` inserted after its
    drafts' rows: the bonus-row layout (T + bs, ...) of the same batch (by hand, not through
    spec_hal.ragged)."""
    parts, start = [], 0
    for b, count in enumerate(counts):
        parts += [flat[start:start + count], bonus_rows[b:b + 1]]
        start += count
    return torch.cat(parts) if parts else flat


def _aligned_inputs(counts: list[int], vocab: int, *, seed: int):
    """Flat drafts, counts, (T, V) logits whose row d_b + j often peaks at draft j, bonus tokens."""
    generator = torch.Generator().manual_seed(seed)
    total, bs = sum(counts), len(counts)
    drafts = torch.randint(0, vocab, (total,), generator=generator)
    logits = torch.randn(total, vocab, generator=generator)
    hits = torch.rand(total, generator=generator) < 0.8
    logits[torch.arange(total)[hits], drafts[hits]] += 5.0
    bonus = torch.randint(0, vocab, (bs,), generator=generator)
    return drafts, torch.tensor(counts, dtype=torch.int64), logits, bonus


@pytest.mark.spec_hal_op("verify_chain_ragged")
@pytest.mark.parametrize("name", list(COUNTS))
@pytest.mark.parametrize("form", ("ids", "logits", "logits_masked"))
def test_verify_chain_ragged_draft_aligned(backend, name, form):
    """bonus_tokens: T target rows; the verdict equals the reference's, and equals the bonus-row
    layout's verdict on the same batch with each request's bonus token as its bonus row's target."""
    counts = COUNTS[name]
    vocab = 37
    drafts, counts_t, logits, bonus = _aligned_inputs(counts, vocab, seed=len(counts) * 5 + len(form))
    target = logits.argmax(dim=1) if form == "ids" else logits
    kwargs = {}
    if form == "logits_masked":
        bitmask, index, _ = random_bitmask(len(drafts), vocab, seed=len(counts) + 2, indexed=True, density=0.8)
        kwargs = {"token_bitmask": bitmask, "bitmask_index": index}
    expected = reference.verify_chain_ragged(drafts, counts_t, target, max_drafts=MAX_DRAFTS, bonus_tokens=bonus, **kwargs)
    verdict = call_without_sync(backend.device, backend.verify_chain_ragged, drafts, counts_t.to(torch.int32), target,
                                max_drafts=MAX_DRAFTS, bonus_tokens=bonus.to(torch.int32), **kwargs)
    assert_same_verdict(verdict, expected)
    if form == "ids":  # independent oracle: the bonus-row layout with the bonus tokens as targets
        with_bonus_rows = reference.verify_chain_ragged(drafts, counts_t, _with_bonus_rows(target, counts, bonus), max_drafts=MAX_DRAFTS)
        assert_same_verdict(verdict, with_bonus_rows)


@pytest.mark.spec_hal_op("verify_chain_sampling_ragged")
@pytest.mark.parametrize("name", ("mixed", "all_zero", "all_full", "empty"))
@pytest.mark.parametrize("with_draft_probs", (True, False))
@pytest.mark.parametrize("masked", (False, True))
def test_verify_chain_sampling_ragged_draft_aligned(backend, name, with_draft_probs, masked):
    """bonus_tokens: T target rows; the verdict equals the reference's, and equals the bonus-row
    layout's verdict (any bonus rows) except that a fully accepted chain ends with its bonus token."""
    counts = COUNTS[name]
    vocab = 29
    drafts, counts_t, logits, bonus = _aligned_inputs(counts, vocab, seed=len(counts) + 13 * with_draft_probs + masked)
    total, bs = len(drafts), len(counts)
    generator = torch.Generator().manual_seed(total + 3 * bs)
    target_probs = torch.softmax(logits, dim=1)
    draft_probs = torch.softmax(torch.randn(total, vocab, generator=generator), dim=1) if with_draft_probs else None
    coins, final_coins = torch.rand(total, generator=generator), torch.rand(bs, generator=generator)
    kwargs = {}
    if masked:
        bitmask, index, _ = random_bitmask(total, vocab, seed=bs + 1, indexed=True, density=0.8)
        kwargs = {"token_bitmask": bitmask, "bitmask_index": index}
    expected = reference.verify_chain_sampling_ragged(drafts, counts_t, draft_probs, target_probs, coins, final_coins,
                                                      max_drafts=MAX_DRAFTS, bonus_tokens=bonus, **kwargs)
    verdict = call_without_sync(backend.device, backend.verify_chain_sampling_ragged, drafts, counts_t, draft_probs, target_probs, coins,
                                final_coins, max_drafts=MAX_DRAFTS, bonus_tokens=bonus, **kwargs)
    assert_same_verdict(verdict, expected)
    if not masked:  # independent oracle: the bonus-row layout, then the bonus token after a whole chain
        uniform_rows = torch.full((bs, vocab), 1.0 / vocab)
        bonus_layout = reference.verify_chain_sampling_ragged(drafts, counts_t, draft_probs, _with_bonus_rows(target_probs, counts, uniform_rows),
                                                              coins, final_coins, max_drafts=MAX_DRAFTS)
        predict = bonus_layout.predict.view(bs, MAX_DRAFTS + 1).clone()
        whole = bonus_layout.num_correct.long() == counts_t
        predict[torch.arange(bs)[whole], counts_t[whole]] = bonus[whole].to(torch.int32)
        assert verdict.num_correct.cpu().tolist() == bonus_layout.num_correct.tolist()
        assert verdict.predict.cpu().tolist() == predict.view(-1).tolist()


@pytest.mark.spec_hal_op("verify_chain_sampling_ragged")
@pytest.mark.parametrize("name", list(BAD_COUNTS))
@pytest.mark.parametrize("op", ("verify_chain_ragged", "verify_chain_sampling_ragged"))
def test_draft_aligned_bounded(backend, name, op):
    """The draft-aligned layout with strided inputs inside attractive margins, canary-guarded out=
    buffers and counts that break the layout: the reference's result (a chain cut at the flat end,
    its bonus token after the drafts that fit) and nothing outside the tensors read or written."""
    counts, total = BAD_COUNTS[name]
    bs, vocab = len(counts), 21
    generator = torch.Generator().manual_seed(total * 5 + len(op))
    drafts = torch.randint(0, vocab, (total,), generator=generator)
    target_probs = torch.softmax(torch.randn(total, vocab, generator=generator) * 3, dim=1)
    drafts = torch.where(torch.rand(total, generator=generator) < 0.7, target_probs.argmax(dim=1), drafts)
    coins, final_coins = torch.rand(total, generator=generator), torch.rand(bs, generator=generator)
    counts_t, bonus = torch.tensor(counts, dtype=torch.int32), torch.randint(0, vocab, (bs,), generator=generator)
    device = backend.device
    guards, out = _guarded_verdict(bs, MAX_DRAFTS + 1, MAX_DRAFTS + 1, device)
    target = embedded_input(target_probs, device, margin_value=1.0)
    on_device = _to(device, drafts, counts_t, coins, final_coins, bonus)  # copied before the no-sync guard
    if op == "verify_chain_ragged":
        expected = reference.verify_chain_ragged(drafts, counts_t, target_probs, max_drafts=MAX_DRAFTS, bonus_tokens=bonus)
        call = lambda d, c, _coins, _final, b: backend.verify_chain_ragged(d, c, target, max_drafts=MAX_DRAFTS, bonus_tokens=b, out=out)
    else:
        expected = reference.verify_chain_sampling_ragged(drafts, counts_t, None, target_probs, coins, final_coins, max_drafts=MAX_DRAFTS,
                                                          bonus_tokens=bonus)
        call = lambda d, c, step, final, b: backend.verify_chain_sampling_ragged(d, c, None, target, step, final, max_drafts=MAX_DRAFTS,
                                                                                 bonus_tokens=b, out=out)
    with no_host_sync(device):
        returned = call(*on_device)
    assert returned.predict.data_ptr() == out.predict.data_ptr(), "out= buffers were not used"
    for guard, field in zip(guards, VERDICT_FIELDS):
        guard.assert_intact(field)
    assert_same_verdict(out, expected)


@pytest.mark.spec_hal_op("verify_chain_sampling_ragged")
@pytest.mark.parametrize("aligned", (False, True))
@pytest.mark.parametrize("op", ("verify_chain_ragged", "verify_chain_sampling_ragged"))
def test_ragged_large_batch(backend, op, aligned):
    """4500 requests (int32 counts 0..4, a quarter 0): where a request's rows start depends on
    every count before it, and a kernel may split that sum across programs (the Triton kernels:
    past 4096 requests under the interpreter, in steps of 1024 counts on a GPU); the reference's
    verdict for each layout."""
    bs, vocab = 4500, 16
    generator = torch.Generator().manual_seed(4500 + 2 * aligned + len(op))
    counts_t = torch.randint(0, MAX_DRAFTS + 1, (bs,), generator=generator, dtype=torch.int32)
    counts_t[::4] = 0
    total = int(counts_t.sum())
    rows = total if aligned else total + bs
    target_probs = torch.softmax(torch.randn(rows, vocab, generator=generator) * 3, dim=1)
    # Draft j is tested at flat row d_b + j (aligned) or r_b + j = d_b + j + b: matching it there
    # most of the time gives chains of every length.
    request = torch.repeat_interleave(torch.arange(bs), counts_t.to(torch.int64))
    tested_rows = torch.arange(total) + (0 if aligned else request)
    drafts = torch.randint(0, vocab, (total,), generator=generator)
    drafts = torch.where(torch.rand(total, generator=generator) < 0.8, target_probs[tested_rows].argmax(dim=1), drafts)
    coins, final_coins = torch.rand(total, generator=generator), torch.rand(bs, generator=generator)
    kwargs = {"bonus_tokens": torch.randint(0, vocab, (bs,), generator=generator)} if aligned else {}
    device = backend.device
    if op == "verify_chain_ragged":  # target token ids: logits would be 13500 argmax programs under the interpreter
        target = target_probs.argmax(dim=1)
        expected = reference.verify_chain_ragged(drafts, counts_t, target, max_drafts=MAX_DRAFTS, **kwargs)
        verdict = call_without_sync(device, backend.verify_chain_ragged, drafts, counts_t, target, max_drafts=MAX_DRAFTS, **kwargs)
    else:
        expected = reference.verify_chain_sampling_ragged(drafts, counts_t, None, target_probs, coins, final_coins, max_drafts=MAX_DRAFTS,
                                                          **kwargs)
        verdict = call_without_sync(device, backend.verify_chain_sampling_ragged, drafts, counts_t, None, target_probs, coins, final_coins,
                                    max_drafts=MAX_DRAFTS, **kwargs)
    assert int(expected.num_correct.max()) == MAX_DRAFTS and int(expected.num_correct[counts_t > 0].min()) == 0  # the case's range
    assert_same_verdict(verdict, expected)


@pytest.mark.spec_hal_op("verify_chain_ragged")
def test_draft_aligned_rejects_bad_input(backend):
    """bonus_tokens of the wrong shape or dtype, and targets with the bonus-row count of rows."""
    device = backend.device
    drafts, counts = torch.tensor([1, 2, 3], device=device), torch.tensor([1, 2], device=device)
    logits, bonus = torch.zeros(3, 8, device=device), torch.tensor([4, 5], device=device)
    assert_rejects(backend, "bonus_tokens", lambda b: b.verify_chain_ragged(drafts, counts, logits, max_drafts=2, bonus_tokens=bonus[:1]))
    assert_rejects(backend, "bonus_tokens", lambda b: b.verify_chain_ragged(drafts, counts, logits, max_drafts=2, bonus_tokens=bonus.float()))
    assert_rejects(backend, "target_predict", lambda b: b.verify_chain_ragged(drafts, counts, torch.zeros(5, 8, device=device), max_drafts=2,
                                                                              bonus_tokens=bonus))
    assert_rejects(backend, "target_probs", lambda b: b.verify_chain_sampling_ragged(
        drafts, counts, None, torch.full((5, 8), 0.125, device=device), torch.zeros(3, device=device), torch.zeros(2, device=device),
        max_drafts=2, bonus_tokens=bonus))


# ------------------------------------------------------------------------------------------------
# the counter-based coin stream (rng_state: coins drawn inside the op, the counter advanced)


def _stream_case(aligned: bool, with_draft_probs: bool):
    counts = COUNTS["mixed"]
    vocab = 29
    drafts, counts_t, logits, bonus = _aligned_inputs(counts, vocab, seed=31 + 2 * aligned + with_draft_probs)
    total, bs = len(drafts), len(counts)
    generator = torch.Generator().manual_seed(total)
    target_logits = logits if aligned else torch.randn(total + bs, vocab, generator=generator)
    target_probs = torch.softmax(target_logits, dim=1)
    draft_probs = torch.softmax(torch.randn(total, vocab, generator=generator), dim=1) if with_draft_probs else None
    kwargs = {"bonus_tokens": bonus} if aligned else {}
    return drafts, counts_t, draft_probs, target_probs, kwargs


@pytest.mark.spec_hal_op("verify_chain_sampling_ragged")
@pytest.mark.parametrize("aligned", (False, True))
@pytest.mark.parametrize("with_draft_probs", (True, False))
def test_verify_chain_sampling_ragged_coin_stream(backend, aligned, with_draft_probs):
    """rng_state: three calls give the reference's verdicts and counters (the counter + 1 per call,
    on the device), and each equals the op given the documented coins of that counter
    (spec_hal.sampling.hash_coins: flat draft i at position i, request b's final coin at b)."""
    from spec_hal.sampling import PURPOSE_ACCEPT, PURPOSE_FINAL, hash_coins

    drafts, counts_t, draft_probs, target_probs, kwargs = _stream_case(aligned, with_draft_probs)
    total, bs = len(drafts), len(counts_t)
    device = backend.device
    inputs = _to(device, drafts, counts_t, draft_probs, target_probs)
    device_kwargs = {name: value.to(device) for name, value in kwargs.items()}
    state, expected_state = torch.tensor([2**40 + 12345, 7], device=device), torch.tensor([2**40 + 12345, 7])
    for call in range(3):
        expected = reference.verify_chain_sampling_ragged(drafts, counts_t, draft_probs, target_probs, None, None, max_drafts=MAX_DRAFTS,
                                                          rng_state=expected_state, **kwargs)
        verdict = call_without_sync(device, backend.verify_chain_sampling_ragged, *inputs, None, None, max_drafts=MAX_DRAFTS,
                                    rng_state=state, **device_kwargs)
        assert_same_verdict(verdict, expected)
        assert state.cpu().tolist() == [2**40 + 12345, 8 + call], "the counter did not advance by one"
        seed, counter = torch.tensor([2**40 + 12345]), torch.tensor([7 + call])
        coins = hash_coins(seed, counter, torch.arange(total), PURPOSE_ACCEPT)[0]
        final_coins = hash_coins(seed, counter, torch.arange(bs), PURPOSE_FINAL)[0]
        given = reference.verify_chain_sampling_ragged(drafts, counts_t, draft_probs, target_probs, coins, final_coins, max_drafts=MAX_DRAFTS,
                                                       **kwargs)
        assert_same_verdict(verdict, given)


@pytest.mark.spec_hal_op("verify_chain_sampling_ragged")
def test_coin_stream_advances_under_graph_replay(backend):
    """On a GPU the op captured once in a graph draws fresh coins on every replay (the counter
    advances on the device): each replay equals the reference's call with the next counter."""
    device = backend.device
    if device.type != "cuda":
        pytest.skip("no CUDA/HIP graphs on a CPU device (the eager calls of the case above cover the stream there)")
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":  # memcheck runs: capture allocates from torch's pools
        pytest.skip("graph capture needs torch's caching allocator (PYTORCH_NO_CUDA_MEMORY_CACHING=1)")
    drafts, counts_t, draft_probs, target_probs, kwargs = _stream_case(True, False)
    inputs = _to(device, drafts, counts_t, draft_probs, target_probs)
    device_kwargs = {name: value.to(device) for name, value in kwargs.items()}
    state = torch.tensor([99, 0], device=device)
    backend.verify_chain_sampling_ragged(*inputs, None, None, max_drafts=MAX_DRAFTS, rng_state=state, **device_kwargs)  # warm-up: counter 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = backend.verify_chain_sampling_ragged(*inputs, None, None, max_drafts=MAX_DRAFTS, rng_state=state, **device_kwargs)
    state.copy_(torch.tensor([99, 1]))  # capture does not run the kernels; counter as after the warm-up
    expected_state = torch.tensor([99, 1])
    for replay in range(3):
        graph.replay()
        expected = reference.verify_chain_sampling_ragged(drafts, counts_t, draft_probs, target_probs, None, None, max_drafts=MAX_DRAFTS,
                                                          rng_state=expected_state, **kwargs)
        assert_same_verdict(captured, expected)
        assert state.cpu().tolist() == [99, 2 + replay]


@pytest.mark.spec_hal_op("verify_chain_sampling_ragged")
def test_coin_stream_rejects_bad_input(backend):
    device = backend.device
    drafts, counts = torch.tensor([1, 2, 3], device=device), torch.tensor([1, 2], device=device)
    probs, state = torch.full((5, 8), 0.125, device=device), torch.tensor([1, 0], device=device)
    coins, final = torch.zeros(3, device=device), torch.zeros(2, device=device)
    call = lambda c, f, s: (lambda b: b.verify_chain_sampling_ragged(drafts, counts, None, probs, c, f, max_drafts=2, rng_state=s))
    assert_rejects(backend, "coins", call(coins, None, state))  # two sources of coins
    assert_rejects(backend, "final_coins", call(None, final, state))
    assert_rejects(backend, "coins", call(None, None, None))  # no source
    assert_rejects(backend, "rng_state", call(None, None, state.to(torch.int32)))
    assert_rejects(backend, "rng_state", call(None, None, state[:1]))


@pytest.mark.spec_hal_op("verify_chain_sampling_ragged")
def test_verify_chain_sampling_ragged_batch_size_zero(backend):
    device = backend.device
    for draft_probs in (None, torch.zeros(0, 10, device=device)):
        verdict = backend.verify_chain_sampling_ragged(torch.zeros(0, dtype=torch.int64, device=device),
                                                       torch.zeros(0, dtype=torch.int64, device=device), draft_probs,
                                                       torch.zeros(0, 10, device=device), torch.zeros(0, device=device),
                                                       torch.zeros(0, device=device), max_drafts=3)
        assert verdict.predict.shape == (0,) and verdict.accept_index.shape == (0, 4)
        assert verdict.num_correct.shape == (0,) and verdict.accept_lens.shape == (0,)


@pytest.mark.spec_hal_op("verify_chain_ragged")
def test_ragged_verdict_through_compaction_kv_and_mamba(backend):
    """The ragged verdict feeds bonus_tokens, compact_accepted, accepted_kv_moves and
    mamba_commit_steps unchanged (each against its reference), and a zero-draft request commits
    the recurrent state of exactly one plain decoding step."""
    counts = COUNTS["mixed"]
    drafts, counts_t, logits = _greedy_inputs(counts, 37, seed=5)
    device = backend.device
    verdict = backend.verify_chain_ragged(*_to(device, drafts, counts_t, logits), max_drafts=MAX_DRAFTS)
    host = Verdict(*(getattr(verdict, field).cpu() for field in VERDICT_FIELDS))
    bs, nodes = len(counts), MAX_DRAFTS + 1
    assert torch.equal(backend.bonus_tokens(verdict).cpu(), compaction_reference.bonus_tokens(host))
    hidden = torch.randn(bs * nodes, 6)
    assert torch.equal(backend.compact_accepted(hidden.to(device), verdict).cpu(), compaction_reference.compact_accepted(hidden, host))
    slots = torch.arange(bs * nodes, dtype=torch.int64).view(bs, nodes) * 3 + 1
    moves = backend.accepted_kv_moves(verdict, slots.to(device))
    expected_moves = kv_reference.accepted_kv_moves(host, slots)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(moves, expected_moves))
    seq_lens = torch.randint(1, 100, (bs,), generator=torch.Generator().manual_seed(1))
    last_step, _ = backend.mamba_commit_steps(verdict, seq_lens.to(device))
    assert torch.equal(last_step.cpu(), mamba_reference.mamba_commit_steps(host, seq_lens)[0])

    # A toy recurrence h' = 0.5 h + x_t over the chain: intermediate state j follows the root and
    # j drafts. Committing last_step must give, for a zero-draft request, one step from h exactly.
    state = torch.randn(1, bs, 4, dtype=torch.float64)
    inputs = torch.randn(bs, nodes, 4, dtype=torch.float64)
    steps = torch.empty(1, bs, nodes, 4, dtype=torch.float64)
    current = state[0].clone()
    for j in range(nodes):
        current = 0.5 * current + inputs[:, j]
        steps[0, :, j] = current
    pool = torch.zeros(1, bs, 4, dtype=torch.float64, device=device)
    backend.scatter_mamba_state(dst=pool, src=steps.to(device), dst_slots=torch.arange(bs, device=device), src_steps=last_step)
    one_step = 0.5 * state[0] + inputs[:, 0]
    zero = counts_t == 0
    assert torch.equal(pool.cpu()[0][zero], one_step[zero]), "a zero-draft request did not commit one plain decoding step"


@pytest.mark.spec_hal_op("verify_chain_ragged")
def test_ragged_checked_mode_rejects_bad_counts(backend, monkeypatch):
    """Value errors (a sync) in checked mode: counts that do not sum to the flat length, negative
    counts, counts above max_drafts, and a mask index outside [-1, M)."""
    monkeypatch.setenv("SPEC_HAL_CHECKS", "1")
    device = backend.device
    drafts = torch.tensor([1, 2, 3], device=device)
    logits = torch.zeros(5, 8, device=device)
    for counts in ([2, 2], [-1, 4], [0, 3]):
        max_drafts = 3 if counts != [0, 3] else 2
        assert_rejects(backend, "num_draft_tokens", lambda b: b.verify_chain_ragged(drafts, torch.tensor(counts, device=device), logits,
                                                                                     max_drafts=max_drafts))
    mask = torch.zeros(2, 1, dtype=torch.int32, device=device)
    assert_rejects(backend, "bitmask_index", lambda b: b.verify_chain_ragged(drafts, torch.tensor([1, 2], device=device), logits,
                                                                              max_drafts=2, token_bitmask=mask,
                                                                              bitmask_index=torch.tensor([0, 1, 2, -1, 0], device=device)))


@pytest.mark.spec_hal_op("verify_chain_ragged")
def test_ragged_rejects_bad_input(backend):
    device = backend.device
    drafts = torch.tensor([1, 2, 3], device=device)
    counts = torch.tensor([1, 2], device=device)
    logits = torch.zeros(5, 8, device=device)
    assert_rejects(backend, "num_draft_tokens", lambda b: b.verify_chain_ragged(drafts, counts.float(), logits, max_drafts=2))
    assert_rejects(backend, "num_draft_tokens", lambda b: b.verify_chain_ragged(drafts, counts[:, None], logits, max_drafts=2))
    assert_rejects(backend, "target_predict", lambda b: b.verify_chain_ragged(drafts, counts, logits[:4], max_drafts=2))
    assert_rejects(backend, "max_drafts", lambda b: b.verify_chain_ragged(drafts, counts, logits, max_drafts=-1))
    assert_rejects(backend, "coins", lambda b: b.verify_chain_sampling_ragged(drafts, counts, None, torch.full((5, 8), 0.125, device=device),
                                                                              torch.zeros(2, device=device), torch.zeros(2, device=device),
                                                                              max_drafts=2))
