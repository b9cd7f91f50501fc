"""Conformance of family ``compaction`` (``bonus_tokens``, ``compact_accepted``) against the
reference, docs/semantics.md §1.4's golden tree, and the regression for upstream bug 4 (a/c). Semantics:
spec_hal/compaction.py."""
from __future__ import annotations

import pytest
import torch

from spec_hal.compaction import bonus_tokens as reference_bonus_tokens
from spec_hal.compaction import compact_accepted as reference_compact_accepted
from spec_hal.conformance.guards import assert_rejects, embedded_input, guarded_output, no_host_sync
from spec_hal.conformance.verdicts import golden_tree_round, random_round, verdict_to
from spec_hal.types import Verdict

# (bs, S, N): chains (N = S+1), trees, and N much larger than S+1 (bug 4's regime).
SHAPES = ((0, 3, 4), (1, 3, 4), (3, 5, 8), (5, 3, 16), (64, 5, 32), (7, 1, 3))
INVALID_INDEX = 1  # margins of embedded accept_index: a valid-looking id that a stray read would use


def embedded_verdict(verdict: Verdict, device) -> Verdict:
    """The verdict's tensors inside larger buffers with attractive margins (strided views)."""
    def embed(values, margin):
        return embedded_input(values.view(1, -1), device, margin_value=margin)[0] if values.dim() == 1 else embedded_input(values, device, margin_value=margin)
    return Verdict(predict=embed(verdict.predict, -9), accept_index=embed(verdict.accept_index, INVALID_INDEX),
                   num_correct=embed(verdict.num_correct, 1), accept_lens=embed(verdict.accept_lens, 1))


def run_bonus(backend, verdict):
    bs = verdict.batch_size
    out = guarded_output((bs,), verdict.predict.dtype, backend.device)
    with no_host_sync(backend.device):
        returned = backend.bonus_tokens(verdict, out=out.tensor)
    assert returned.data_ptr() == out.tensor.data_ptr() or bs == 0
    out.assert_intact("bonus_tokens")
    return out.tensor.cpu()


def run_compact(backend, x, verdict):
    out = guarded_output(tuple(x.shape), x.dtype, backend.device)
    with no_host_sync(backend.device):
        backend.compact_accepted(x, verdict, out=out.tensor)
    out.assert_intact("compact_accepted")
    return out.tensor.cpu()


def check_compaction_invariant(compacted_predict, round_):
    """P14: rows 0..accept_lens-1 of each block are the emitted tokens in order, last = bonus."""
    verdict = round_.verdict
    nodes = verdict.predict.shape[0] // max(verdict.batch_size, 1)
    for b, emitted in enumerate(round_.emitted):
        got = compacted_predict[b * nodes:b * nodes + len(emitted)].tolist()
        assert got == emitted, f"request {b}: compacted rows {got} are not the emitted tokens {emitted}"


@pytest.mark.spec_hal_op("bonus_tokens")
def test_bonus_tokens_golden(backend):
    """docs/semantics.md §1.4: request 1's bonus sits at flat index 1*(S+1) + 3 - 1 = 5 of predict[accept_index]."""
    round_ = golden_tree_round()
    accept_tokens = round_.verdict.predict[round_.verdict.accept_index.clamp(min=0).long()].view(-1)
    assert int(accept_tokens[5]) == 290
    bonus = run_bonus(backend, verdict_to(round_.verdict, backend.device))
    assert bonus.tolist() == [190, 290]


@pytest.mark.spec_hal_op("compact_accepted")
def test_compact_accepted_golden(backend):
    """docs/semantics.md §1.4: request 1's rows become [cand2, cand3, bonus]; rows past the path stay unchanged."""
    round_ = golden_tree_round()
    verdict = verdict_to(round_.verdict, backend.device)
    compacted = run_compact(backend, verdict.predict, verdict)
    assert compacted.tolist() == [101, 190, -5, -5, 202, 203, 290, 290]


@pytest.mark.spec_hal_op("bonus_tokens")
@pytest.mark.parametrize("bs, steps, nodes", SHAPES)
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64))
def test_bonus_tokens_matches_reference(backend, bs, steps, nodes, index_dtype):
    round_ = random_round(bs, num_steps=steps, num_nodes=nodes, generator=torch.Generator().manual_seed(bs * 31 + nodes), index_dtype=index_dtype)
    bonus = run_bonus(backend, embedded_verdict(round_.verdict, backend.device))
    assert torch.equal(bonus, reference_bonus_tokens(round_.verdict))
    assert bonus.tolist() == [emitted[-1] for emitted in round_.emitted]


def _node_tensors(rows, seed):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, 96, generator=generator)
    return {
        "predict_int32": torch.randint(-50, 50, (rows,), generator=generator, dtype=torch.int32),
        "hidden_bf16": hidden.to(torch.bfloat16),
        "hidden_fp32": hidden,
        "hidden_fp16_wide": torch.randn(rows, 4097, generator=generator).to(torch.float16),
        "int64_3d": torch.randint(-(2**40), 2**40, (rows, 2, 3), generator=generator),
        "bool": torch.rand(rows, 5, generator=generator) < 0.5,
    }


@pytest.mark.spec_hal_op("compact_accepted")
@pytest.mark.parametrize("bs, steps, nodes", SHAPES)
@pytest.mark.parametrize("kind", ("predict_int32", "hidden_bf16", "hidden_fp32", "hidden_fp16_wide", "int64_3d", "bool"))
def test_compact_accepted_matches_reference(backend, bs, steps, nodes, kind):
    round_ = random_round(bs, num_steps=steps, num_nodes=nodes, generator=torch.Generator().manual_seed(bs * 17 + nodes))
    x_cpu = _node_tensors(bs * nodes, seed=nodes)[kind]
    x = x_cpu.to(backend.device)
    if x.dim() == 2 and x.shape[1] > 1:
        x = embedded_input(x_cpu, backend.device, margin_value=True if x.dtype == torch.bool else 7)  # strided rows
    compacted = run_compact(backend, x, embedded_verdict(round_.verdict, backend.device))
    expected = reference_compact_accepted(x_cpu, round_.verdict)
    assert torch.equal(compacted, expected), f"{kind}: compacted rows differ from the reference"
    assert torch.equal(x.cpu(), x_cpu), "compact_accepted modified its input"


@pytest.mark.spec_hal_op("compact_accepted")
def test_compact_accepted_takes_batch_first_rows(backend):
    """(bs, N, H) hidden states compact like their (bs*N, H) view (docs/conventions.md)."""
    bs, nodes = 3, 8
    round_ = random_round(bs, num_steps=3, num_nodes=nodes, generator=torch.Generator().manual_seed(9))
    x_cpu = torch.randn(bs, nodes, 5, generator=torch.Generator().manual_seed(10))
    compacted = run_compact(backend, x_cpu.to(backend.device), embedded_verdict(round_.verdict, backend.device))
    assert compacted.shape == (bs, nodes, 5)
    assert torch.equal(compacted.view(bs * nodes, 5), reference_compact_accepted(x_cpu.view(bs * nodes, 5), round_.verdict))


@pytest.mark.spec_hal_op("compact_accepted")
def test_compact_accepted_allocates_output(backend):
    round_ = random_round(3, num_steps=3, num_nodes=8, generator=torch.Generator().manual_seed(4))
    verdict = verdict_to(round_.verdict, backend.device)
    hidden = torch.randn(24, 8).to(backend.device)
    compacted = backend.compact_accepted(hidden, verdict)
    assert compacted.shape == hidden.shape and compacted.dtype == hidden.dtype and compacted.data_ptr() != hidden.data_ptr()
    assert torch.equal(compacted.cpu(), reference_compact_accepted(hidden.cpu(), round_.verdict))


@pytest.mark.spec_hal_op("compact_accepted")
def test_bug4_tree_regression(backend):
    """Upstream bug 4 (a, c): K > 1, N = 32 >> S+1 = 4, bs = 6. Each request's bonus is its own
    last emitted token, and after compaction rows 0..accept_lens-1 of each block are the emitted
    tokens in order (the last one the bonus)."""
    round_ = random_round(6, num_steps=3, num_nodes=32, generator=torch.Generator().manual_seed(26866), stop_probability=0.05)
    assert max(len(path) for path in round_.paths) > 2, "the seed must accept drafts for the case to mean anything"
    verdict = embedded_verdict(round_.verdict, backend.device)
    bonus = run_bonus(backend, verdict)
    assert bonus.tolist() == [emitted[-1] for emitted in round_.emitted], "a bonus token was read from another request's row"
    compacted = run_compact(backend, verdict.predict, verdict)
    check_compaction_invariant(compacted, round_)
    for b, emitted in enumerate(round_.emitted):
        assert int(compacted[b * 32 + len(emitted) - 1]) == int(bonus[b])


@pytest.mark.spec_hal_op("compact_accepted")
def test_compaction_batch_size_zero(backend):
    verdict = verdict_to(random_round(0, num_steps=3, num_nodes=8, generator=torch.Generator()).verdict, backend.device)
    assert backend.bonus_tokens(verdict).shape == (0,)
    compacted = backend.compact_accepted(torch.zeros(0, 16, device=backend.device), verdict)
    assert compacted.shape == (0, 16)


def _invalid_calls(device):
    verdict = verdict_to(random_round(2, num_steps=2, num_nodes=4, generator=torch.Generator().manual_seed(1)).verdict, device)
    bad_lens = Verdict(verdict.predict, verdict.accept_index, verdict.num_correct, verdict.accept_lens[:1])
    bad_predict = Verdict(verdict.predict[:7], verdict.accept_index, verdict.num_correct, verdict.accept_lens)
    float_index = Verdict(verdict.predict, verdict.accept_index.float(), verdict.num_correct, verdict.accept_lens)
    hidden = torch.zeros(8, 3, device=device)
    return [
        ("verdict", lambda b: b.bonus_tokens((verdict.predict, verdict.accept_index))),
        ("verdict.accept_lens", lambda b: b.bonus_tokens(bad_lens)),
        ("verdict.predict", lambda b: b.bonus_tokens(bad_predict)),
        ("verdict.accept_index", lambda b: b.compact_accepted(hidden, float_index)),
        ("x", lambda b: b.compact_accepted(hidden[:7], verdict)),
        ("x", lambda b: b.compact_accepted(hidden.to(torch.complex64), verdict)),
        ("out", lambda b: b.compact_accepted(hidden, verdict, out=hidden)),
        ("out", lambda b: b.bonus_tokens(verdict, out=torch.zeros(2, dtype=torch.int64, device=device))),
    ]


@pytest.mark.spec_hal_op("compact_accepted")
@pytest.mark.parametrize("case", range(8))
def test_compaction_rejects_bad_input(backend, case):
    assert_rejects(backend, *_invalid_calls(backend.device)[case])
