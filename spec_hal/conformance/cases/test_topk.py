"""Conformance of family ``topk`` (``draft_topk``) against the reference. Semantics: spec_hal/topk.py."""
from __future__ import annotations

import math

import pytest
import torch

from spec_hal.conformance.guards import assert_rejects, embedded_input, guarded_output, no_host_sync
from spec_hal.conformance.inputs import logits_rows
from spec_hal.conformance.tolerances import assert_close
from spec_hal.topk import draft_topk as reference_draft_topk

pytestmark = pytest.mark.spec_hal_op("draft_topk")

VOCABS = (1, 127, 8193, 32000, 151666, 151936)
TOPKS = (1, 2, 4, 8, 10)
BATCHES = (0, 1, 3, 64)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _grid():
    for vocab in VOCABS:
        for k in TOPKS:
            if k > vocab:
                continue
            for rows in BATCHES:
                for dtype in DTYPES:
                    big = rows == 64 and vocab >= 32000 and k not in (1, 8)
                    marks = (pytest.mark.spec_hal_full,) if big else ()
                    yield pytest.param(vocab, k, rows, dtype, marks=marks, id=f"V{vocab}-k{k}-bs{rows}-{str(dtype)[6:]}")


def _run_guarded(backend, logits, k, **kwargs):
    """Call the backend with poisoned, canary-guarded outputs and a no-sync guard."""
    rows = logits.shape[0]
    probs = guarded_output((rows, k), torch.float32, logits.device)
    ids = guarded_output((rows, k), torch.int64, logits.device)
    with no_host_sync(logits.device):
        returned = backend.draft_topk(logits, k, out=(probs.tensor, ids.tensor), **kwargs)
    assert returned[0].data_ptr() == probs.tensor.data_ptr() and returned[1].data_ptr() == ids.tensor.data_ptr()
    probs.assert_intact("probs")
    ids.assert_intact("ids")
    return probs.tensor.cpu(), ids.tensor.cpu()


def _check_invariants(logits_cpu, k, probs, ids):
    vocab = logits_cpu.shape[1]
    assert ((ids >= 0) & (ids < vocab)).all(), "an id is outside [0, V)"
    assert ((probs >= 0) & (probs <= 1)).all(), "a probability is outside [0, 1]"
    assert (probs[:, :-1] >= probs[:, 1:]).all(), "probabilities are not descending"
    for row in range(ids.shape[0]):
        assert len(set(ids[row].tolist())) == k, f"row {row} repeats an id"


@pytest.mark.parametrize("vocab, k, rows, dtype", list(_grid()))
def test_draft_topk_matches_reference(backend, vocab, k, rows, dtype):
    logits_cpu = logits_rows(rows, vocab, seed=vocab * 131 + k * 7 + rows, dtype=dtype)
    # Margins of large logits: a kernel reading past a row or the tensor would select them.
    logits = embedded_input(logits_cpu, backend.device, margin_value=3.0e4)
    probs, ids = _run_guarded(backend, logits, k)
    expected_probs, expected_ids = reference_draft_topk(logits_cpu, k)
    assert torch.equal(ids, expected_ids), f"ids differ from the reference: {(ids != expected_ids).nonzero()[:8].tolist()}"
    assert_close("draft_topk", "probs", probs, expected_probs, input_dtype=dtype)
    _check_invariants(logits_cpu, k, probs, ids)


# Long rows in a large batch: a row is many tiles, and 320 rows are over two a SM on a 132-SM H100,
# where the selection up to k = 8 runs at 128 threads (kernels/topk.py: select_warps); the grid
# above stays below that. The selection reads each row's k best 256-id sub-tiles again: an
# ascending row puts them all at the end, and bfloat16 rounding and the "ties" rows put equal
# maxima on many sub-tiles, where the lower index must win.
@pytest.mark.parametrize("k, dtype, masked", [(1, torch.float32, False), (4, torch.bfloat16, False), (8, torch.float32, False),
                                              (16, torch.float32, False), (8, torch.float32, True)],
                         ids=["k1-float32", "k4-bfloat16", "k8-float32", "k16-float32", "k8-masked"])
def test_draft_topk_large_batch_long_rows(backend, k, dtype, masked):
    from spec_hal.masks import pack_bitmask

    rows, vocab = 320, 66000
    logits_cpu = logits_rows(rows, vocab, seed=29 + k, dtype=dtype)
    logits_cpu[5] = torch.arange(vocab, dtype=torch.float32).to(dtype)
    device_kwargs, reference_kwargs = {}, {}
    if masked:
        generator = torch.Generator().manual_seed(31)
        allowed = torch.rand(rows, vocab, generator=generator) < 0.5
        allowed[7] = False
        allowed[7, [11, vocab - 1]] = True  # fewer allowed tokens than k
        index = torch.arange(rows, dtype=torch.int32)
        index[1::3] = -1  # every third row unconstrained, but not row 7, which allows fewer ids than k
        index[7] = 7
        reference_kwargs = {"token_bitmask": pack_bitmask(allowed), "bitmask_index": index}
        device_kwargs = {name: value.to(backend.device) for name, value in reference_kwargs.items()}
    logits = embedded_input(logits_cpu, backend.device, margin_value=3.0e4)
    probs, ids = _run_guarded(backend, logits, k, **device_kwargs)
    expected_probs, expected_ids = reference_draft_topk(logits_cpu, k, **reference_kwargs)
    assert torch.equal(ids, expected_ids), f"ids differ from the reference: {(ids != expected_ids).nonzero()[:8].tolist()}"
    assert_close("draft_topk", "probs", probs, expected_probs, input_dtype=dtype)


def test_draft_topk_golden(backend):
    """Hand-computed: ties go to the lower id; probabilities from the closed form."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, float("nan")], [float("-inf")] * 5], device=backend.device)
    probs, ids = backend.draft_topk(logits, 3)
    denominator = math.exp(1) + 2 * math.exp(3) + math.exp(0)
    assert ids.cpu().tolist() == [[1, 2, 0], [0, 1, 2]]
    expected = torch.tensor([[math.exp(3) / denominator, math.exp(3) / denominator, math.exp(1) / denominator], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(probs.cpu(), expected, atol=1e-6, rtol=1e-5)


def test_draft_topk_top1_probability_is_exact(backend):
    """k = 1 returns 1 / sum(exp(x - max)), never a hard-coded 1.0 (upstream bug 3)."""
    logits_cpu = logits_rows(16, 151666, seed=3)[2:3].repeat(4, 1)
    logits_cpu[1, -1] = 100.0  # unique max in the unmasked tail of V = 151,666
    probs, ids = backend.draft_topk(logits_cpu.to(backend.device), 1)
    expected = 1.0 / torch.exp(logits_cpu.double() - logits_cpu.double().max(dim=1, keepdim=True).values).sum(dim=1)
    torch.testing.assert_close(probs.cpu().squeeze(1).double(), expected, atol=1e-7, rtol=1e-5)
    assert ids[1].item() == 151665
    assert (probs.cpu() < 1.0).any()


@pytest.mark.parametrize("map_dtype", (torch.int32, torch.int64))
def test_draft_topk_token_map(backend, map_dtype):
    vocab, k = 8193, 4
    logits_cpu = logits_rows(5, vocab, seed=11)
    token_map_cpu = (torch.randperm(4 * vocab, generator=torch.Generator().manual_seed(5))[:vocab]).to(map_dtype)
    probs, ids = _run_guarded(backend, logits_cpu.to(backend.device), k, token_map=token_map_cpu.to(backend.device))
    expected_probs, expected_ids = reference_draft_topk(logits_cpu, k, token_map=token_map_cpu)
    assert torch.equal(ids, expected_ids)
    assert_close("draft_topk", "probs", probs, expected_probs, input_dtype=torch.float32)


def test_draft_topk_transposed_logits(backend):
    """A column stride other than 1 (a transposed view) gives the same result."""
    logits_cpu = logits_rows(4, 1000, seed=21)
    logits = logits_cpu.t().contiguous().to(backend.device).t()
    probs, ids = backend.draft_topk(logits, 4)
    expected_probs, expected_ids = reference_draft_topk(logits_cpu, 4)
    assert torch.equal(ids.cpu(), expected_ids)
    assert_close("draft_topk", "probs", probs, expected_probs, input_dtype=torch.float32)


def test_draft_topk_allocates_outputs(backend):
    logits = logits_rows(3, 127, seed=2).to(backend.device)
    probs, ids = backend.draft_topk(logits, 2)
    assert probs.shape == (3, 2) and probs.dtype == torch.float32 and probs.device == backend.device
    assert ids.shape == (3, 2) and ids.dtype == torch.int64 and ids.device == backend.device
    empty_probs, empty_ids = backend.draft_topk(logits[:0], 2)
    assert empty_probs.shape == (0, 2) and empty_ids.shape == (0, 2)


def _invalid_calls(device):
    logits = torch.zeros(2, 10, device=device)
    other_device = "meta"
    return [
        ("logits", lambda b: b.draft_topk(logits.tolist(), 1)),
        ("logits", lambda b: b.draft_topk(logits[0], 1)),
        ("logits", lambda b: b.draft_topk(logits.to(torch.int32), 1)),
        ("logits", lambda b: b.draft_topk(torch.zeros(2, 0, device=device), 1)),
        ("k", lambda b: b.draft_topk(logits, 0)),
        ("k", lambda b: b.draft_topk(logits, 11)),
        ("k", lambda b: b.draft_topk(logits, 2.0)),
        ("k", lambda b: b.draft_topk(torch.zeros(2, 100, device=device), 17)),
        ("token_map", lambda b: b.draft_topk(logits, 1, token_map=torch.zeros(9, dtype=torch.int64, device=device))),
        ("token_map", lambda b: b.draft_topk(logits, 1, token_map=torch.zeros(10, device=device))),
        ("token_map", lambda b: b.draft_topk(logits, 1, token_map=torch.zeros(10, dtype=torch.int64, device=other_device))),
        ("out", lambda b: b.draft_topk(logits, 1, out=torch.zeros(2, 1, device=device))),
        ("out[0]", lambda b: b.draft_topk(logits, 2, out=(torch.zeros(2, 1, device=device), torch.zeros(2, 2, dtype=torch.int64, device=device)))),
        ("out[1]", lambda b: b.draft_topk(logits, 2, out=(torch.zeros(2, 2, device=device), torch.zeros(2, 2, dtype=torch.int32, device=device)))),
    ]


@pytest.mark.parametrize("case", range(14))
def test_draft_topk_rejects_bad_input(backend, case):
    assert_rejects(backend, *_invalid_calls(backend.device)[case])


def test_draft_topk_largest_k(backend):
    """k = MAX_TOPK, with a vocabulary split into many tiles."""
    from spec_hal.topk import MAX_TOPK

    logits_cpu = logits_rows(8, 151936, seed=16)
    probs, ids = _run_guarded(backend, embedded_input(logits_cpu, backend.device, margin_value=3.0e4), MAX_TOPK)
    expected_probs, expected_ids = reference_draft_topk(logits_cpu, MAX_TOPK)
    assert torch.equal(ids, expected_ids)
    assert_close("draft_topk", "probs", probs, expected_probs, input_dtype=torch.float32)
