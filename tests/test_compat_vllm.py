"""spec_hal.compat.vllm.rejection_sample pinned to vLLM's rejection sampler, on cpu and triton-interpret.

Greedy worked examples are vLLM's tests re-expressed
(https://github.com/vllm-project/vllm/blob/main/tests/v1/sample/test_rejection_sampler.py:
test_perfect_match, test_early_mismatch, test_multiple_sequences, test_single_token_sequence,
test_empty_sequence, test_multiple_mismatches); layout and placeholder conventions are from
vllm/v1/sample/rejection_sampler.py. Random requests are compared, request by request, with
spec_hal's reference ``verify_chain_sampling`` fed the coins vLLM's generate_uniform_probs draws
from each request's generator.
"""
from types import SimpleNamespace

import pytest
import torch

from compat_lanes import lane, run_interpreter_lane  # noqa: F401
from spec_hal import ragged as ragged_reference
from spec_hal import verify as verify_reference
from spec_hal.compat.vllm import GREEDY_TEMPERATURE, PLACEHOLDER_TOKEN_ID, rejection_sample
from spec_hal.errors import InvalidInput

PH = PLACEHOLDER_TOKEN_ID
VOCAB = 100


def test_vllm_interpreter_lane():
    run_interpreter_lane(__file__)


def metadata(temperature=None, generators=None, all_greedy=False):
    all_random = temperature is not None and bool((temperature != GREEDY_TEMPERATURE).all())
    return SimpleNamespace(all_greedy=all_greedy, all_random=all_random, temperature=temperature, generators=generators or {})


def flat(spec_tokens):
    counts = [len(row) for row in spec_tokens]
    ids = torch.tensor([t for row in spec_tokens for t in row], dtype=torch.int32)
    return ids, counts, torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)


def greedy_logits(spec_tokens, output_tokens):
    """Target logits whose argmax at draft k of request b is output_tokens[b][k] (vLLM's create_logits_tensor)."""
    rows = [out[k] for spec, out in zip(spec_tokens, output_tokens) for k in range(len(spec))]
    logits = torch.full((len(rows), VOCAB), -100.0)
    for row, token in enumerate(rows):
        logits[row, token] = 100.0
    return logits


@pytest.mark.parametrize("spec_tokens, output_tokens, expected", [
    ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),  # test_perfect_match
    ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, PH, PH]]),  # test_early_mismatch
    ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, PH]]),  # test_multiple_sequences
    ([[1]], [[1, 2]], [[1, 2]]),  # test_single_token_sequence
    ([[]], [[5]], [[5]]),  # test_empty_sequence
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, PH], [4, 8, PH, PH]]),  # test_multiple_mismatches
])
def test_greedy_upstream_examples(lane, spec_tokens, output_tokens, expected):
    ids, counts, cu = flat(spec_tokens)
    bonus = torch.tensor([[out[-1]] for out in output_tokens])
    max_spec_len = max(counts)
    output = rejection_sample(ids, counts, max_spec_len, cu, None, greedy_logits(spec_tokens, output_tokens), bonus, metadata(all_greedy=True))
    assert output.dtype == torch.int32
    assert output.tolist() == expected


def random_case(counts, seed, with_draft_probs=True):
    generator = torch.Generator().manual_seed(seed)
    tokens = sum(counts)
    draft_probs = torch.softmax(torch.randn(tokens, VOCAB, generator=generator), -1)
    target_probs = torch.softmax(torch.randn(tokens, VOCAB, generator=generator) + 2 * draft_probs.log().clamp(min=-3), -1)
    ids = torch.multinomial(draft_probs, 1, generator=generator)[:, 0] if tokens else torch.zeros(0, dtype=torch.int64)
    bonus = torch.randint(0, VOCAB, (len(counts), 1), generator=generator)
    return ids, (draft_probs if with_draft_probs else None), target_probs, bonus


def expected_random(ids, counts, draft_probs, target_probs, bonus, seeds):
    """Request by request: spec_hal's reference with the coins vLLM draws from the request's generator."""
    rows, start = [], 0
    width = max(counts) + 1
    for request, count in enumerate(counts):
        generator = torch.Generator().manual_seed(seeds[request])
        coins = torch.empty(count, dtype=torch.float64).uniform_(generator=generator).float() if count else torch.empty(0)
        final = torch.empty(1).uniform_(generator=generator) if count else None
        if count == 0:
            rows.append([int(bonus[request])] + [PH] * (width - 1))
            continue
        q = draft_probs[start:start + count] if draft_probs is not None else torch.nn.functional.one_hot(ids[start:start + count].long(), VOCAB).float()
        p = torch.cat([target_probs[start:start + count], target_probs[start:start + 1]])  # the last row is never emitted
        verdict = verify_reference.verify_chain_sampling(ids[None, start:start + count], q[None], p[None], coins[None], final)
        tokens = verdict.predict.tolist()
        accepted = int(verdict.num_correct[0])
        if accepted == count:
            tokens[count] = int(bonus[request])
        rows.append(tokens + [PH] * (width - len(tokens)))
        start += count
    return rows


@pytest.mark.parametrize("counts", [[3, 3, 3], [3, 0, 1, 2]])
@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_random_matches_native_reference_per_request(lane, counts, with_draft_probs):
    ids, draft_probs, target_probs, bonus = random_case(counts, seed=len(counts), with_draft_probs=with_draft_probs)
    seeds = [100 + r for r in range(len(counts))]
    generators = {r: torch.Generator().manual_seed(s) for r, s in enumerate(seeds)}
    cu = torch.tensor(counts).cumsum(0)
    output = rejection_sample(ids, counts, max(counts), cu, draft_probs, target_probs, bonus,
                              metadata(torch.ones(len(counts)), generators))
    assert output.tolist() == expected_random(ids, counts, draft_probs, target_probs, bonus, seeds)


def test_unseeded_requests_draw_from_the_coin_stream(lane):
    """Without generators the coins come from spec_hal's counter-based stream (the native op's
    rng_state): each call advances this device's counter by one, and the output is the native
    reference's with the stream's coins at the counter the call found."""
    from spec_hal.compat import vllm as compat_vllm

    counts = [3, 0, 2, 3]
    ids, draft_probs, target_probs, bonus = random_case(counts, seed=17)
    state = compat_vllm._stream_state(torch.device("cpu"))
    for _ in range(2):
        before = state.clone()
        output = rejection_sample(ids, counts, 3, torch.tensor(counts).cumsum(0), draft_probs, target_probs, bonus,
                                  metadata(torch.ones(len(counts))))
        assert state.tolist() == [before[0].item(), before[1].item() + 1]
        expected = ragged_reference.verify_chain_sampling_ragged(ids, torch.tensor(counts), draft_probs, target_probs, None, None,
                                                                 max_drafts=3, bonus_tokens=bonus.view(-1), rng_state=before)
        assert output.tolist() == expected.predict.view(len(counts), 4).tolist()


def test_mixed_greedy_and_random_requests(lane):
    counts = [2, 2]
    ids, draft_probs, target_probs, bonus = random_case(counts, seed=5)
    target_probs[0, int(ids[0])] = 10.0  # request 0 (greedy): its first draft is the argmax, its second is not
    target_probs[1, int(ids[1])] = -10.0
    generators = {1: torch.Generator().manual_seed(101)}
    output = rejection_sample(ids, counts, 2, torch.tensor([2, 4]), draft_probs, target_probs, bonus,
                              metadata(torch.tensor([GREEDY_TEMPERATURE, 1.0]), generators))
    assert output[0].tolist() == [int(ids[0]), int(target_probs[1].argmax()), PH]
    assert output[1].tolist() == expected_random(ids[2:], [2], draft_probs[2:], target_probs[2:], bonus[1:], [101])[0]


@pytest.mark.parametrize("counts", [[2, 3, 1], [3, 3, 3]])
def test_draft_equal_to_target_accepts_everything(lane, counts):
    """Every draft passes, so every request emits its drafts then its bonus token (with equal
    counts, each request's chain reads the next request's first row as its lane S)."""
    ids, draft_probs, _, bonus = random_case(counts, seed=9)
    width = max(counts) + 1
    output = rejection_sample(ids, counts, width - 1, torch.tensor(counts).cumsum(0), draft_probs, draft_probs, bonus,
                              metadata(torch.ones(len(counts))))
    starts = [sum(counts[:r]) for r in range(len(counts))]
    expected = [[*ids[s:s + c].tolist(), int(bonus[r])] + [PH] * (width - c - 1) for r, (s, c) in enumerate(zip(starts, counts))]
    assert output.tolist() == expected


def test_uniform_counts_with_strided_inputs(lane):
    """Equal counts take vLLM's rows without a copy: strided drafts, draft and target rows give
    the per-request reference result."""
    counts = [2, 2, 2, 2]
    ids, draft_probs, target_probs, bonus = random_case(counts, seed=21)
    seeds = [300 + r for r in range(len(counts))]
    wide = lambda rows: torch.cat([rows, torch.full_like(rows, 0.5)], dim=1)[:, :VOCAB]  # row stride 2V
    strided_ids = torch.stack([ids, ids], dim=1)[:, 0]
    output = rejection_sample(strided_ids, counts, 2, torch.tensor(counts).cumsum(0), wide(draft_probs), wide(target_probs), bonus,
                              metadata(torch.ones(len(counts)), {r: torch.Generator().manual_seed(s) for r, s in enumerate(seeds)}))
    assert output.tolist() == expected_random(ids, counts, draft_probs, target_probs, bonus, seeds)


def test_empty_batch_and_bad_arguments(lane):
    empty = rejection_sample(torch.zeros(0, dtype=torch.int32), [], 2, torch.zeros(0, dtype=torch.int32), None, torch.zeros(0, 5),
                             torch.zeros(0, 1, dtype=torch.int64), metadata(all_greedy=True))
    assert empty.shape == (0, 3) and empty.dtype == torch.int32
    no_drafts = rejection_sample(torch.zeros(0, dtype=torch.int32), [0, 0], 0, torch.zeros(2, dtype=torch.int32), None, torch.zeros(0, 5),
                                 torch.tensor([[3], [4]]), metadata(torch.ones(2)))
    assert no_drafts.tolist() == [[3], [4]]
    with pytest.raises(InvalidInput, match="^num_draft_tokens"):
        rejection_sample(torch.zeros(3, dtype=torch.int32), [1, 1], 2, torch.tensor([1, 2]), None, torch.zeros(3, 5),
                         torch.zeros(2, 1, dtype=torch.int64), metadata(all_greedy=True))
    with pytest.raises(InvalidInput, match="^max_spec_len"):
        rejection_sample(torch.zeros(3, dtype=torch.int32), [3], 2, torch.tensor([3]), None, torch.zeros(3, 5),
                         torch.zeros(1, 1, dtype=torch.int64), metadata(all_greedy=True))


def ragged_target(rows_per_draft, counts, bonus_rows):
    """vLLM's T target rows in the native ragged layout (T + bs rows): each request's rows, then its bonus row."""
    pieces, start = [], 0
    for request, count in enumerate(counts):
        pieces += [rows_per_draft[start:start + count], bonus_rows[request:request + 1]]
        start += count
    return torch.cat(pieces)


@pytest.mark.parametrize("counts", [[3, 0, 1, 2, 3], [2, 2]])
def test_greedy_equals_native_ragged_op(lane, counts):
    """Differential: vLLM's output is the native verify_chain_ragged verdict over the argmax rows,
    with the bonus token as each request's bonus-row prediction."""
    ids, _, target_probs, bonus = random_case(counts, seed=11)
    ids[::2] = target_probs.argmax(1)[::2]  # about half the drafts match
    output = rejection_sample(ids, counts, 3, torch.tensor(counts).cumsum(0), None, target_probs, bonus, metadata(all_greedy=True))
    argmax_rows = ragged_target(target_probs.argmax(1), counts, bonus[:, 0])
    verdict = ragged_reference.verify_chain_ragged(ids, torch.tensor(counts), argmax_rows, max_drafts=3)
    assert output.tolist() == verdict.predict.view(len(counts), 4).tolist()


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_seeded_random_equals_native_ragged_op(lane, with_draft_probs):
    """Differential: with a generator per request, vLLM's output is the native
    verify_chain_sampling_ragged verdict with the coins drawn from those generators (float64 step
    coins rounded to float32, then the final coin), the bonus token replacing the final token of a
    fully accepted request."""
    counts = [3, 1, 0, 2]
    ids, draft_probs, target_probs, bonus = random_case(counts, seed=12, with_draft_probs=with_draft_probs)
    seeds = [200 + r for r in range(len(counts))]
    output = rejection_sample(ids, counts, 3, torch.tensor(counts).cumsum(0), draft_probs, target_probs, bonus,
                              metadata(torch.ones(len(counts)), {r: torch.Generator().manual_seed(s) for r, s in enumerate(seeds)}))
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    coins = torch.cat([torch.empty(c, dtype=torch.float64).uniform_(generator=g).float() for c, g in zip(counts, generators)])
    final = torch.cat([torch.empty(1).uniform_(generator=g) if c else torch.zeros(1) for c, g in zip(counts, generators)])
    verdict = ragged_reference.verify_chain_sampling_ragged(ids, torch.tensor(counts), draft_probs, ragged_target(target_probs, counts, target_probs[:len(counts)]),
                                                            coins, final, max_drafts=3)
    expected = verdict.predict.view(len(counts), 4).clone()
    for request, count in enumerate(counts):
        if int(verdict.num_correct[request]) == count:
            expected[request, count] = int(bonus[request])
    assert output.tolist() == expected.tolist()
