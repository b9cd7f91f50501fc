"""spec_hal.compat.flashinfer pinned to FlashInfer's behaviour, on cpu and triton-interpret.

Worked examples are the docstring examples of flashinfer/sampling.py
(https://github.com/flashinfer-ai/flashinfer/blob/main/flashinfer/sampling.py: softmax,
top_k_renorm_probs, top_p_renorm_probs, chain_speculative_sampling); the semantics of
``maybe_output_*`` (added in place) and the -1 padding come from the same docstrings. Differential
cases compare with spec_hal's reference ``verify_chain_sampling`` (the oracle).
"""
import pytest
import torch

from compat_lanes import lane, run_interpreter_lane  # noqa: F401
from spec_hal import verify as verify_reference
from spec_hal.compat import flashinfer
from spec_hal.errors import InvalidInput

DOC_PROBS = torch.tensor([[0.2499, 0.2592, 0.1085, 0.2718, 0.1106], [0.2205, 0.0942, 0.2912, 0.3452, 0.0489],
                          [0.2522, 0.1602, 0.2346, 0.1532, 0.2000], [0.1543, 0.3182, 0.2062, 0.0958, 0.2255]])


def test_flashinfer_interpreter_lane():
    run_interpreter_lane(__file__)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chain_speculative_sampling_docstring_example(lane, seed):
    draft_probs = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
    draft_token_ids = torch.tensor([[2, 1]], dtype=torch.int32)
    target_probs = torch.tensor([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])
    generator = torch.Generator().manual_seed(seed)
    output, accepted, emitted = flashinfer.chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, generator=generator)
    assert output.dtype == torch.int32 and output.tolist() == [[2, 0, -1]]
    assert accepted.tolist() == [1] and emitted.tolist() == [1]


def test_chain_speculative_sampling_adds_counts_in_place(lane):
    draft_probs = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]])
    target_probs = torch.tensor([[[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]])
    accepted, emitted = torch.tensor([10], dtype=torch.int32), torch.tensor([20], dtype=torch.int32)
    output, accepted_out, emitted_out = flashinfer.chain_speculative_sampling(
        draft_probs, torch.tensor([[0, 1]]), target_probs, accepted, emitted, uniform_samples=torch.tensor([[0.2, 0.7, 0.9]]))
    assert accepted_out is accepted and emitted_out is emitted
    assert accepted.tolist() == [12] and emitted.tolist() == [22]  # p == q: every draft is accepted
    assert output.tolist() == [[0, 1, 1]]  # bonus from target row 2 at u = 0.9 (exact CDF: [0.5, 1.0])


@pytest.mark.parametrize("bs, steps, vocab", [(6, 3, 12), (0, 2, 5)])
def test_chain_speculative_sampling_matches_native_reference(lane, bs, steps, vocab):
    generator = torch.Generator().manual_seed(bs + steps)
    draft_probs = torch.softmax(torch.randn(bs, steps, vocab, generator=generator), -1)
    target_probs = torch.softmax(torch.randn(bs, steps + 1, vocab, generator=generator), -1)
    draft_ids = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=generator).view(bs, steps) if bs else torch.zeros(0, steps, dtype=torch.int64)
    uniform = torch.rand(bs, steps + 1, generator=generator)
    output, accepted, emitted = flashinfer.chain_speculative_sampling(draft_probs, draft_ids, target_probs, uniform_samples=uniform)
    expected = verify_reference.verify_chain_sampling(draft_ids, draft_probs, target_probs, uniform[:, :steps].contiguous(), uniform[:, steps].contiguous())
    assert output.tolist() == expected.predict.view(bs, steps + 1).tolist()
    assert emitted.tolist() == expected.num_correct.tolist()
    p = target_probs[:, :steps].gather(2, draft_ids[:, :, None])[:, :, 0]
    q = draft_probs.gather(2, draft_ids[:, :, None])[:, :, 0]
    assert accepted.tolist() == (uniform[:, :steps] * q < p).sum(1).tolist()


def test_chain_accepted_count_is_the_native_step_decision_on_dirty_inputs(lane):
    """The accepted count (each draft tested on its own) equals the sum of the native op's decision
    for every step run as a one-draft chain, with NaN, negative and > 1 probabilities, coins out of
    [0, 1) and ids outside the vocabulary."""
    bs, steps, vocab = 5, 4, 6
    generator = torch.Generator().manual_seed(3)
    draft_probs = torch.rand(bs, steps, vocab, generator=generator) * 1.4 - 0.2
    target_probs = torch.rand(bs, steps + 1, vocab, generator=generator) * 1.4 - 0.2
    draft_probs[0, 0], target_probs[1, 1], draft_probs[2, 3, :] = float("nan"), float("nan"), 0.0
    draft_ids = torch.randint(-1, vocab + 1, (bs, steps), generator=generator, dtype=torch.int32)
    uniform = torch.rand(bs, steps + 1, generator=generator) * 1.2 - 0.1
    uniform[3, 0] = float("nan")
    _, accepted, _ = flashinfer.chain_speculative_sampling(draft_probs, draft_ids, target_probs, uniform_samples=uniform)
    expected = sum(verify_reference.verify_chain_sampling(draft_ids[:, s:s + 1], draft_probs[:, s:s + 1], target_probs[:, s:s + 2],
                                                          uniform[:, s:s + 1].contiguous(), uniform[:, steps].contiguous()).num_correct
                   for s in range(steps))
    assert accepted.tolist() == expected.tolist()


def test_chain_speculative_sampling_names_bad_arguments(lane):
    with pytest.raises(InvalidInput, match="^target_probs"):
        flashinfer.chain_speculative_sampling(torch.rand(1, 2, 4), torch.zeros(1, 2, dtype=torch.int64), torch.rand(1, 2, 4))
    with pytest.raises(InvalidInput, match="^seed"):
        flashinfer.chain_speculative_sampling(torch.rand(1, 2, 4), torch.zeros(1, 2, dtype=torch.int64), torch.rand(1, 3, 4),
                                              seed=torch.tensor([1]), offset=torch.tensor([0]))


def test_softmax_docstring_example(lane):
    logits = torch.tensor([[0.8823, 0.9150, 0.3829, 0.9593, 0.3904], [0.6009, 0.2566, 0.7936, 0.9408, 0.1332],
                           [0.9346, 0.5936, 0.8694, 0.5677, 0.7411], [0.4294, 0.8854, 0.5739, 0.2666, 0.6274]])
    expected = torch.tensor([[0.2309, 0.2385, 0.1401, 0.2493, 0.1412], [0.2019, 0.1431, 0.2448, 0.2837, 0.1265],
                             [0.2401, 0.1707, 0.2249, 0.1664, 0.1979], [0.1724, 0.2719, 0.1991, 0.1465, 0.2101]])
    torch.testing.assert_close(flashinfer.softmax(logits, temperature=1.0), expected, atol=1e-4, rtol=0)
    per_row = flashinfer.softmax(logits, temperature=torch.tensor([1.0, 0.5, 2.0, 1.0]))
    torch.testing.assert_close(per_row[1], torch.softmax(logits[1] / 0.5, -1))


def test_renorm_docstring_examples(lane):
    top_k = torch.tensor([[0.3201, 0.3319, 0.0000, 0.3480, 0.0000], [0.2573, 0.0000, 0.3398, 0.4028, 0.0000],
                          [0.3672, 0.0000, 0.3416, 0.0000, 0.2912], [0.0000, 0.4243, 0.2750, 0.0000, 0.3007]])
    top_p = torch.tensor([[0.0000, 0.4882, 0.0000, 0.5118, 0.0000], [0.0000, 0.0000, 0.0000, 1.0000, 0.0000],
                          [0.5181, 0.0000, 0.4819, 0.0000, 0.0000], [0.0000, 1.0000, 0.0000, 0.0000, 0.0000]])
    torch.testing.assert_close(flashinfer.top_k_renorm_probs(DOC_PROBS, 3), top_k, atol=2e-4, rtol=0)
    torch.testing.assert_close(flashinfer.top_p_renorm_probs(DOC_PROBS, 0.3), top_p, atol=2e-4, rtol=0)
    assert flashinfer.top_k_renorm_probs(DOC_PROBS.to(torch.bfloat16), 3).dtype == torch.bfloat16


def test_sampling_from_probs_is_exact_inverse_cdf(lane):
    probs = torch.tensor([[0.25, 0.25, 0.5]] * 5)
    coins = torch.tensor([0.0, 0.24, 0.3, 0.5, 0.99])
    # Cumulative masses 0.25, 0.5, 1.0: id = first index whose running sum exceeds u (strict <:
    # u = 0.5 lands in id 2, where a `<=` scan would answer 1).
    assert flashinfer.sampling_from_probs(probs, uniform_samples=coins).tolist() == [0, 0, 1, 2, 2]
    assert flashinfer.sampling_from_probs(probs, coins).tolist() == [0, 0, 1, 2, 2]  # older positional form


def test_sampling_from_probs_indices_valid_and_seeds(lane):
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    samples, valid = flashinfer.sampling_from_probs(probs, indices=torch.tensor([0, 0, 1], dtype=torch.int64), return_valid=True)
    assert samples.dtype == torch.int64 and samples.tolist() == [1, 1, 0]
    assert valid.tolist() == [True, True, False]
    rows = torch.softmax(torch.randn(8, 10, generator=torch.Generator().manual_seed(0)), -1)
    assert flashinfer.sampling_from_probs(rows, seed=7, offset=3).tolist() == flashinfer.sampling_from_probs(rows, seed=7, offset=3).tolist()
    with pytest.raises(ValueError, match="NaN"):
        flashinfer.sampling_from_probs(torch.full((1, 3), float("nan")), check_nan=True)


def test_filtered_sampling_stays_in_the_filtered_set(lane):
    generator = torch.Generator().manual_seed(0)
    samples_k = flashinfer.top_k_sampling_from_probs(DOC_PROBS.repeat(8, 1), 2, generator=generator)
    top2 = DOC_PROBS.topk(2, dim=1).indices.repeat(8, 1)
    assert (samples_k[:, None] == top2).any(1).all()
    samples_p = flashinfer.top_p_sampling_from_probs(DOC_PROBS.repeat(8, 1), 0.3, generator=generator)
    kept = flashinfer.top_p_renorm_probs(DOC_PROBS, 0.3).repeat(8, 1)
    assert (kept.gather(1, samples_p[:, None].long()) > 0).all()
    samples_min = flashinfer.min_p_sampling_from_probs(DOC_PROBS.repeat(8, 1), 0.9, generator=generator)
    assert (DOC_PROBS.repeat(8, 1).gather(1, samples_min[:, None].long())[:, 0] >= 0.9 * DOC_PROBS.repeat(8, 1).amax(1)).all()
    joint = flashinfer.top_k_top_p_sampling_from_probs(DOC_PROBS.repeat(8, 1), 3, 0.3, filter_apply_order="joint", generator=generator)
    assert (kept.gather(1, joint[:, None].long()) > 0).all()
    with pytest.raises(InvalidInput, match="^filter_apply_order"):
        flashinfer.top_k_top_p_sampling_from_probs(DOC_PROBS, 3, 0.3, filter_apply_order="both")


def test_sampling_from_probs_distribution():
    """4000 draws of one row: every id's frequency within 5 sigma of its probability."""
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).repeat(4000, 1)
    samples = flashinfer.sampling_from_probs(probs, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(samples.long(), minlength=4).double()
    expected = probs[0].double() * 4000
    assert ((counts - expected).abs() <= 5 * (expected * (1 - probs[0].double())).sqrt()).all(), counts


def test_top_k_renorm_int_k_equals_per_request_k(lane):
    """A Python int k (the k-th value by torch.topk) and the same k per request (a full sort) keep
    the same entries, ties at the k-th value included, and give the same values; k = 0 and k >= V
    keep the row (and the hand-computed renormalisation of the kept entries)."""
    generator = torch.Generator().manual_seed(4)
    probs = torch.rand(6, 40, generator=generator).round(decimals=1)  # many exact ties
    for k in (1, 3, 7, 39, 40, 0):
        by_int = flashinfer.top_k_renorm_probs(probs, k)
        by_tensor = flashinfer.top_k_renorm_probs(probs, torch.full((6,), k, dtype=torch.int64))
        assert torch.equal(by_int, by_tensor), k
        kth = probs.sort(dim=1, descending=True).values[:, max(k, 1) - 1:max(k, 1)] if 0 < k < 40 else torch.zeros(6, 1)
        kept = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        torch.testing.assert_close(by_int, kept / kept.sum(dim=1, keepdim=True), rtol=1e-6, atol=0)


def test_renorms_keep_upstream_values_where_process_logits_would_not(lane):
    """Why the renormalisations are not ``spec_hal.process_logits`` of the logs (docs/compat.md): of
    two probabilities within 1/1024 of a halving, FlashInfer's top-1 keeps the larger (id 1 here),
    process_logits the lower id; and its quantised weights move the renormalised values."""
    import spec_hal

    probs = torch.tensor([[0.3, 0.30001, 0.2, 0.19999]])
    assert flashinfer.top_k_renorm_probs(probs, 1).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert spec_hal.process_logits(probs.log(), temperature=1.0, top_k=1).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    renormalised = flashinfer.top_k_renorm_probs(probs, 2)
    torch.testing.assert_close(renormalised, torch.tensor([[0.3, 0.30001, 0.0, 0.0]]) / 0.60001, rtol=1e-6, atol=0)
    assert not torch.equal(spec_hal.process_logits(probs.log(), temperature=1.0, top_k=2), renormalised)
