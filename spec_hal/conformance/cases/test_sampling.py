"""Conformance of family ``sampling`` against the reference, the ``verify`` family and softmax.
Semantics: spec_hal/sampling.py."""
from __future__ import annotations

import pytest
import torch

import spec_hal.sampling as reference
import spec_hal.verify as verify_reference
from spec_hal.conformance.guards import assert_rejects, embedded_input, guarded_output, no_host_sync
from spec_hal.conformance.inputs import logits_rows
from spec_hal.conformance.trees import random_tree, replicate, tree_from_parents, tree_to
from spec_hal.conformance.verdicts import assert_same_verdict
from spec_hal.topk import draft_topk

# Statistical cases: chi-square over the V = 8 outcomes (at most 7 degrees of freedom) must stay
# below 30, the 0.99995 quantile of chi-square(7), so a correct backend fails one case in 20000.
# Power: with DRAWS = 12000 emitted tokens, a distribution off by Σ δ_v² / p_v >= 0.004 (for
# example 0.02 of mass moved between two tokens of probability 0.2) gives a noncentrality of
# DRAWS * 0.004 = 48, and chi-square(7, λ = 48) exceeds 30 with probability 0.97 (0.85 at
# λ = 36; simulated). The tree case tests the sampled half of the requests (6000 draws: the
# same power for deviations twice as large), and its second level only the requests that took
# token 3, so its power there is lower still.
CHI_SQUARE_LIMIT = 30.0
DRAWS = 12_000
STAT_LOGITS = torch.tensor([1.0, 2.5, 0.0, 1.8, -1.0, 2.2, 1.2, 0.5])


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.cpu().contiguous().view(torch.int32)


def _assert_logprobs_close(actual, expected) -> None:
    torch.testing.assert_close(actual.cpu(), expected.cpu(), atol=2e-5, rtol=2e-5, equal_nan=True)


# Parameter patterns, assigned to request r as PARAM_PATTERNS[(r + r // 8) % 8]: the first 8
# requests meet the logits pattern of their own index (inputs.LOGIT_ROW_PATTERNS cycles with r),
# the next 8 the previous one, so every mask binds alone on ordinary rows and on degenerate ones.
PARAM_PATTERNS = ("greedy", "plain", "top_k", "top_p", "min_p", "top_k+top_p", "all", "top_k_off+min_p")


def _mixed_params(bs: int, vocab: int, *, seed: int) -> dict:
    """Per-request parameters covering greedy, plain, top-k, top-p, min-p and combinations."""
    generator = torch.Generator().manual_seed(seed)
    temperature = torch.rand(bs, generator=generator) * 1.8 + 0.1
    top_k = torch.randint(1, max(2, min(6, vocab)), (bs,), generator=generator)
    top_p = torch.rand(bs, generator=generator) * 0.8 + 0.1
    min_p = torch.rand(bs, generator=generator) * 0.4 + 0.05
    for r in range(bs):
        pattern = PARAM_PATTERNS[(r + r // 8) % len(PARAM_PATTERNS)]
        if pattern == "greedy":
            temperature[r] = 0.0
        if "top_k" not in pattern and pattern != "all":
            top_k[r] = 0
        if pattern == "top_k_off+min_p":
            top_k[r] = vocab + 1
        if "top_p" not in pattern and pattern != "all":
            top_p[r] = 1.0
        if "min_p" not in pattern and pattern != "all":
            min_p[r] = 0.0
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}


def _params_to(params: dict, device) -> dict:
    return {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in params.items()}


def _seeds(bs: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(-2**62, 2**62, (bs,), generator=generator), torch.randint(0, 2**40, (bs,), generator=generator))


# ----------------------------------------------------------------------------------------------
# process_logits


@pytest.mark.spec_hal_op("process_logits")
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16))
@pytest.mark.parametrize("rows, vocab", ((16, 37), (9, 300), (3, 1)))
def test_process_logits_bit_identical(backend, dtype, rows, vocab):
    """Every processed probability bit-identical to the reference (ties, NaN, -inf and +inf
    rows included), strided input, poisoned and canary-guarded output."""
    logits = logits_rows(rows, vocab, seed=rows * vocab, dtype=dtype)
    params = _mixed_params(rows, vocab, seed=rows + vocab)
    expected = reference.process_logits(logits, **params)
    device = backend.device
    guard = guarded_output((rows, vocab), torch.float32, device)
    logits_on_device, params_on_device = embedded_input(logits, device, margin_value=100.0), _params_to(params, device)
    with no_host_sync(device):  # inputs are moved first: a host-to-device copy is a sync
        got = backend.process_logits(logits_on_device, **params_on_device, out=guard.tensor)
    guard.assert_intact("out")
    assert got.data_ptr() == guard.tensor.data_ptr()
    assert torch.equal(_bits(got), _bits(expected)), f"probabilities differ from the reference: max diff {(got.cpu() - expected).abs().max()}"


@pytest.mark.spec_hal_op("process_logits")
def test_process_logits_matches_softmax_and_draft_topk(backend):
    """Independent oracles: without masks the row is softmax(x / T) within the quantisation
    (0.07% relative); top-k keeps draft_topk's ids (ties to the lower id); top-p keeps the smallest
    heaviest-first set reaching p; min-p keeps p_v >= min_p * p_max; greedy is one-hot."""
    rows, vocab = 12, 64
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(rows, vocab, generator=generator) * 2
    logits[3, :8] = logits[3].max()  # ties at the top
    device = backend.device
    temperature = torch.linspace(0.3, 2.0, rows)
    plain = backend.process_logits(logits.to(device), temperature=temperature.to(device)).cpu()
    softmax = torch.softmax(logits / temperature[:, None], dim=1)
    assert ((plain - softmax).abs() <= 1e-3 * softmax + 1e-9).all(), "the processed row is not softmax(x / T)"
    top_k = backend.process_logits(logits.to(device), temperature=1.0, top_k=5).cpu()
    ranked = logits.sort(dim=1, descending=True).values
    for row in range(rows):
        if ranked[row, 4] - ranked[row, 5] < 1e-3 and ranked[row, 4] != ranked[row, 5]:
            continue  # a near-tie: the quantised weights may rank it by id (exact ties go to the lower id)
        assert set(top_k[row].nonzero()[:, 0].tolist()) == set(draft_topk(logits[row:row + 1], 5)[1][0].tolist())
    top_p = backend.process_logits(logits.to(device), temperature=1.0, top_p=0.6).cpu()
    exact = torch.softmax(logits, dim=1)
    for row in range(rows):
        heavier = torch.stack([exact[row][exact[row] > exact[row, v]].sum() for v in range(vocab)])
        kept = top_p[row] > 0
        # Kept iff the strictly heavier tokens hold less than p (the quantised weights decide near-ties).
        assert kept[heavier < 0.6 - 1e-3].all() and not kept[heavier > 0.6 + 1e-3].any()
    min_p = backend.process_logits(logits.to(device), temperature=1.0, min_p=0.3).cpu()
    ratio = torch.softmax(logits, 1) / torch.softmax(logits, 1).max(dim=1, keepdim=True).values
    assert ((min_p > 0) == (ratio >= 0.3))[(ratio - 0.3).abs() > 1e-3].all()
    greedy = backend.process_logits(logits.to(device), temperature=0.0).cpu()
    assert torch.equal(greedy, torch.nn.functional.one_hot(draft_topk(logits, 1)[1][:, 0], vocab).float())


# ----------------------------------------------------------------------------------------------
# verification from logits: bit-identical, equal to processing + verify, greedy rows


def _tree_inputs(bs: int, nodes: int, steps: int, vocab: int, *, seed: int, dtype=torch.float32):
    tree, candidates = random_tree(bs, nodes, steps, seed=seed, vocab=min(vocab, 4), chain_bias=0.7)
    logits = logits_rows(bs * nodes, vocab, seed=seed, dtype=dtype)
    # Peak most rows on the first child's token so that walks go deep.
    first_child = candidates.gather(1, tree.retrieve_next_token.clamp(min=0)).reshape(-1)
    boost = (torch.arange(bs * nodes) % 3 != 0).to(logits.dtype) * 4
    logits[torch.arange(bs * nodes), first_child] = (logits[torch.arange(bs * nodes), first_child].float().nan_to_num(0.0) + boost).to(dtype)
    return tree, candidates, logits


@pytest.mark.spec_hal_op("verify_sampling_from_logits")
@pytest.mark.parametrize("steps, nodes", ((3, 4), (5, 8), (3, 16)))
@pytest.mark.parametrize("bs", (1, 7))
@pytest.mark.parametrize("randomness", ("seed", "coins"))
@pytest.mark.parametrize("logprobs", ("raw", "processed"))
def test_verify_sampling_from_logits_bit_identical(backend, steps, nodes, bs, randomness, logprobs):
    vocab = 24
    tree, candidates, logits = _tree_inputs(bs, nodes, steps, vocab, seed=steps * 100 + nodes + bs)
    params = _mixed_params(bs, vocab, seed=bs * nodes)
    if randomness == "seed":
        seed, offset = _seeds(bs, seed=nodes)
        source = {"seed": seed, "offset": offset}
    else:
        generator = torch.Generator().manual_seed(nodes)
        source = {"coins": torch.rand(bs, nodes, generator=generator), "final_coins": torch.rand(bs, generator=generator)}
    expected = reference.verify_sampling_from_logits(tree, candidates, logits, **params, **source, logprobs=logprobs, top_logprobs=3)
    device = backend.device
    inputs = (tree_to(tree, device), candidates.to(device), embedded_input(logits, device, margin_value=50.0))
    kwargs = {**_params_to(params, device), **_params_to(source, device)}
    with no_host_sync(device):
        got = backend.verify_sampling_from_logits(*inputs, **kwargs, logprobs=logprobs, top_logprobs=3)
    assert_same_verdict(got.verdict, expected.verdict)
    _assert_logprobs_close(got.logprobs, expected.logprobs)
    assert torch.equal(got.top_ids.cpu(), expected.top_ids), "top_logprobs ids differ from the reference"
    _assert_logprobs_close(got.top_logprobs, expected.top_logprobs)
    # The emitted token's logprob never exceeds the best alternative's; padding matches.
    emitted = ~torch.isnan(expected.logprobs)
    assert (expected.logprobs[emitted] <= expected.top_logprobs[..., 0][emitted]).all()
    assert ((expected.top_ids >= 0) == emitted[..., None]).all()


@pytest.mark.spec_hal_op("verify_sampling_from_logits")
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_verify_from_logits_equals_processing_then_verify(backend, dtype):
    """The differential contract on the backend itself: verify_sampling_from_logits equals
    process_logits (per row) then verify_sampling with the same coins; temperature-0 requests
    equal verify_greedy on the logits."""
    bs, nodes, steps, vocab = 9, 8, 4, 40
    tree, candidates, logits = _tree_inputs(bs, nodes, steps, vocab, seed=11, dtype=dtype)
    params = _mixed_params(bs, vocab, seed=3)
    generator = torch.Generator().manual_seed(8)
    coins, final_coins = torch.rand(bs, nodes, generator=generator), torch.rand(bs, generator=generator)
    device = backend.device
    dev = lambda t: t.to(device)  # noqa: E731
    fused = backend.verify_sampling_from_logits(tree_to(tree, device), dev(candidates), dev(logits), **_params_to(params, device),
                                                coins=dev(coins), final_coins=dev(final_coins)).verdict
    row_params = {name: value.repeat_interleave(nodes) for name, value in params.items()}
    probs = backend.process_logits(dev(logits), **_params_to(row_params, device))
    two_step = backend.verify_sampling(tree_to(tree, device), dev(candidates), probs, dev(coins), dev(final_coins))
    assert_same_verdict(fused, two_step)
    greedy = verify_reference.verify_greedy(tree, candidates, logits)
    for b in (params["temperature"] == 0).nonzero()[:, 0].tolist():
        assert fused.accept_index[b].tolist() == greedy.accept_index[b].tolist()
        block = slice(b * nodes, (b + 1) * nodes)
        assert fused.predict[block].tolist() == greedy.predict[block].tolist(), f"temperature-0 request {b} is not greedy"


@pytest.mark.spec_hal_op("verify_chain_sampling_from_logits")
@pytest.mark.parametrize("draft", ("one_hot", "probs"))
@pytest.mark.parametrize("steps, bs", ((3, 1), (4, 6), (0, 2)))
def test_verify_chain_sampling_from_logits(backend, draft, steps, bs):
    """Bit-identical to the reference, and equal on the backend to process_logits then
    verify_chain_sampling (with a one-hot q for a greedy drafter)."""
    vocab = 16
    generator = torch.Generator().manual_seed(steps * 10 + bs)
    draft_ids = torch.randint(0, 4, (bs, steps), generator=generator)
    logits = logits_rows(bs * (steps + 1), vocab, seed=steps + bs)
    logits[:, :4] += 3.0
    q = torch.softmax(torch.randn(bs, steps, vocab, generator=generator), dim=2) if draft == "probs" else None
    params = _mixed_params(bs, vocab, seed=bs + 1)
    seed, offset = _seeds(bs, seed=steps)
    expected = reference.verify_chain_sampling_from_logits(draft_ids, q, logits, **params, seed=seed, offset=offset, logprobs="processed")
    device = backend.device
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    inputs, kwargs = (dev(draft_ids), dev(q), dev(logits)), {**_params_to(params, device), "seed": dev(seed), "offset": dev(offset)}
    with no_host_sync(device):
        got = backend.verify_chain_sampling_from_logits(*inputs, **kwargs, logprobs="processed")
    assert_same_verdict(got.verdict, expected.verdict)
    _assert_logprobs_close(got.logprobs, expected.logprobs)
    coins, final = reference.draw_coins(bs, steps, "cpu", seed=seed, offset=offset, generator=None, coins=None, final_coins=None)
    probs = backend.process_logits(dev(logits), **_params_to({k: v.repeat_interleave(steps + 1) for k, v in params.items()}, device))
    q_used = reference.one_hot_draft_probs(draft_ids, vocab) if q is None else q
    two_step = backend.verify_chain_sampling(dev(draft_ids), dev(q_used), probs, dev(coins), dev(final))
    assert_same_verdict(got.verdict, two_step)


# 160 rows of 32000 ids and no top_logprobs: where a GPU's every-row processing of them takes more
# than one wave of programs (132-SM H100 and H200, 148-SM B200, 304-CU MI300), the walk reads only
# the candidates' probabilities and each request's final row (kernels/sampling_rows.py:
# process_path_rows, after a first walk finds that row); any other path must agree just the same.
@pytest.mark.spec_hal_op("verify_sampling_from_logits")
def test_verify_sampling_from_logits_many_long_rows(backend):
    _check_many_long_rows(backend, "tree")


@pytest.mark.spec_hal_op("verify_chain_sampling_from_logits")
def test_verify_chain_sampling_from_logits_many_long_rows(backend):
    _check_many_long_rows(backend, "chain")


def _check_many_long_rows(backend, op: str) -> None:
    bs, vocab = 40, 32000
    params = _mixed_params(bs, vocab, seed=43)
    seed, offset = _seeds(bs, seed=44)
    device = backend.device
    dev = lambda t: t.to(device)  # noqa: E731
    kwargs = {**_params_to(params, device), "seed": dev(seed), "offset": dev(offset)}
    if op == "tree":
        tree, candidates, logits = _tree_inputs(bs, 4, 3, vocab, seed=41, dtype=torch.bfloat16)
        expected = reference.verify_sampling_from_logits(tree, candidates, logits, **params, seed=seed, offset=offset, logprobs="processed")
        inputs = (tree_to(tree, device), dev(candidates), embedded_input(logits, device, margin_value=50.0))
        with no_host_sync(device):
            got = backend.verify_sampling_from_logits(*inputs, **kwargs, logprobs="processed")
    else:  # a greedy drafter's chain: the tree walk over the chain's rows
        steps = 3
        draft_ids = torch.randint(0, 4, (bs, steps), generator=torch.Generator().manual_seed(45))
        logits = logits_rows(bs * (steps + 1), vocab, seed=46)
        logits[:, :4] += 3.0
        expected = reference.verify_chain_sampling_from_logits(draft_ids, None, logits, **params, seed=seed, offset=offset, logprobs="raw")
        inputs = (dev(draft_ids), None, embedded_input(logits, device, margin_value=50.0))
        with no_host_sync(device):
            got = backend.verify_chain_sampling_from_logits(*inputs, **kwargs, logprobs="raw")
    assert_same_verdict(got.verdict, expected.verdict)
    _assert_logprobs_close(got.logprobs, expected.logprobs)


# The route hint max_top_k (spec_hal/sampling.py, "Route hint") never changes a result. 160 rows
# (40 requests of 4) whose sampled requests all have a top-k of 1-128 (a listed cut), greedy ones
# with top-k off, verified without the hint, with the true bound and with a bound below some
# request's top-k (the default mode trusts it: only the time may change); checked mode rejects the
# low bound and accepts the true one, which leaves the greedy requests' top-k out. On the 132-SM
# H100 and H200 the call without the hint processes every row and the hinted ones run the fused
# walk (kernels/sampling.py: _every_row_in_parallel).
@pytest.mark.spec_hal_op("verify_sampling_from_logits")
def test_verify_sampling_route_hint_never_changes_the_result(backend, monkeypatch):
    _check_route_hint(backend, "tree", monkeypatch)


@pytest.mark.spec_hal_op("verify_chain_sampling_from_logits")
def test_verify_chain_sampling_route_hint_never_changes_the_result(backend, monkeypatch):
    _check_route_hint(backend, "chain", monkeypatch)


def _check_route_hint(backend, op: str, monkeypatch) -> None:
    bs, vocab = 40, 4096
    params = _mixed_params(bs, vocab, seed=61)
    greedy = params["temperature"] == 0
    top_k = torch.randint(1, 129, (bs,), generator=torch.Generator().manual_seed(62))
    top_k[:3] = 128
    params["top_k"] = torch.where(greedy, 0, top_k)
    bound = int(params["top_k"].max())
    seed, offset = _seeds(bs, seed=63)
    device = backend.device
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    kwargs = {**_params_to(params, device), "seed": dev(seed), "offset": dev(offset), "logprobs": "processed"}
    if op == "tree":
        tree, candidates, logits = _tree_inputs(bs, 4, 3, vocab, seed=64, dtype=torch.bfloat16)
        expected = reference.verify_sampling_from_logits(tree, candidates, logits, **params, seed=seed, offset=offset, logprobs="processed")
        inputs = (tree_to(tree, device), dev(candidates), dev(logits))
        call = backend.verify_sampling_from_logits
    else:
        draft_ids = torch.randint(0, 4, (bs, 3), generator=torch.Generator().manual_seed(65))
        logits = logits_rows(bs * 4, vocab, seed=66, dtype=torch.bfloat16)
        logits[:, :4] += 3.0
        expected = reference.verify_chain_sampling_from_logits(draft_ids, None, logits, **params, seed=seed, offset=offset,
                                                               logprobs="processed")
        inputs = (dev(draft_ids), None, dev(logits))
        call = backend.verify_chain_sampling_from_logits
    for hint in (None, bound, 1):
        with no_host_sync(device):
            got = call(*inputs, **kwargs, max_top_k=hint)
        assert_same_verdict(got.verdict, expected.verdict)
        _assert_logprobs_close(got.logprobs, expected.logprobs)
    monkeypatch.setenv("SPEC_HAL_CHECKS", "1")
    assert_same_verdict(call(*inputs, **kwargs, max_top_k=bound).verdict, expected.verdict)
    assert_rejects(backend, "max_top_k", lambda b: call(*inputs, **kwargs, max_top_k=bound - 1))


# ----------------------------------------------------------------------------------------------
# losslessness (statistical), batch invariance, reproducibility


def _chi_square(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() * samples.numel()
    assert (counts[expected == 0] == 0).all(), "a token with zero processed probability was emitted"
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


STAT_CONFIGS = (
    {"temperature": 1.0},
    {"temperature": 0.6, "top_k": 4},
    {"temperature": 1.5, "top_p": 0.8},
    {"temperature": 1.0, "min_p": 0.15},
    {"temperature": 0.8, "top_k": 6, "top_p": 0.9, "min_p": 0.05},
)


@pytest.mark.spec_hal_op("verify_sampling_from_logits")
@pytest.mark.parametrize("config", (0, 3, 4))
def test_tree_from_logits_is_lossless(backend, config):
    """DRAWS requests on one tree (root children tokens 1, 3, 5; node 2 (token 3) has children
    6 and 0), every other request greedy: the sampled requests' first emitted token follows the
    processed root row, their second (after token 3) the processed row of node 2; the greedy
    requests emit the argmaxes. Seeds 0..DRAWS-1 drive the backend's own RNG."""
    params = STAT_CONFIGS[config]
    tree = replicate(tree_from_parents([[-1, 0, 0, 0, 2, 2]], num_steps=2), DRAWS)
    candidates = torch.tensor([[0, 1, 3, 5, 6, 0]]).expand(DRAWS, 6).contiguous()
    after_3 = STAT_LOGITS.flip(0)
    rows = torch.stack([STAT_LOGITS, STAT_LOGITS * 0.5, after_3, STAT_LOGITS, STAT_LOGITS, STAT_LOGITS])
    logits = rows[None].expand(DRAWS, 6, 8).contiguous()
    temperature = torch.full((DRAWS,), float(params["temperature"]))
    temperature[1::2] = 0.0
    call = {**params, "temperature": temperature}
    device = backend.device
    inputs = (tree_to(tree, device), candidates.to(device), logits.to(device))
    kwargs = {**_params_to(call, device), "seed": torch.arange(DRAWS, device=device), "offset": torch.full((DRAWS,), 7, device=device)}
    with no_host_sync(device):
        verdict = backend.verify_sampling_from_logits(*inputs, **kwargs).verdict
    predict = verdict.predict.cpu().view(DRAWS, 6).long()
    sampled = torch.arange(DRAWS) % 2 == 0
    expected_root = reference.process_logits(STAT_LOGITS[None], **params)[0]
    expected_after_3 = reference.process_logits(after_3[None], **params)[0]
    assert _chi_square(predict[sampled, 0], expected_root) < CHI_SQUARE_LIMIT
    took_3 = sampled & (verdict.accept_index.cpu()[:, 1] == torch.arange(DRAWS) * 6 + 2)
    assert int(took_3.sum()) > 300, "the case must take token 3 often to test the second level"
    assert _chi_square(predict[took_3, 2], expected_after_3) < CHI_SQUARE_LIMIT
    greedy_first = int(STAT_LOGITS.argmax())
    assert (predict[~sampled, 0] == greedy_first).all(), "a temperature-0 request did not emit the argmax"


@pytest.mark.spec_hal_op("verify_chain_sampling_from_logits")
@pytest.mark.parametrize("draft, config", (("one_hot", 1), ("probs", 2)))
def test_chain_from_logits_is_lossless(backend, draft, config):
    """DRAWS requests drafting x_1 from q (a distribution unlike the target): the first emitted
    token follows the processed target row 0, whether q is given or the drafter was greedy."""
    params = STAT_CONFIGS[config]
    q_row = torch.tensor([0.3, 0.05, 0.05, 0.3, 0.1, 0.1, 0.05, 0.05])
    generator = torch.Generator().manual_seed(77 + config)
    draft_ids = torch.multinomial(q_row, DRAWS, replacement=True, generator=generator)[:, None]
    q = q_row[None, None].expand(DRAWS, 1, 8).contiguous() if draft == "probs" else None
    logits = torch.stack([STAT_LOGITS, STAT_LOGITS.flip(0)])[None].expand(DRAWS, 2, 8).contiguous()
    device = backend.device
    inputs = (draft_ids.to(device), None if q is None else q.to(device), logits.to(device))
    kwargs = {**params, "seed": torch.arange(DRAWS, device=device), "offset": torch.zeros(DRAWS, dtype=torch.int64, device=device)}
    with no_host_sync(device):
        verdict = backend.verify_chain_sampling_from_logits(*inputs, **kwargs).verdict
    first = verdict.predict.cpu().view(DRAWS, 2)[:, 0].long()
    assert _chi_square(first, reference.process_logits(STAT_LOGITS[None], **params)[0]) < CHI_SQUARE_LIMIT


@pytest.mark.spec_hal_op("verify_sampling_from_logits")
def test_batch_invariance_and_reproducibility(backend):
    """Request 0 alone and at row 37 of a batch of 64 (other requests with other logits,
    parameters and seeds) gives the same verdict and logprobs; the same seed and offset repeat
    the result; another offset changes the coins."""
    bs, nodes, steps, vocab = 64, 8, 4, 32
    tree, candidates, logits = _tree_inputs(bs, nodes, steps, vocab, seed=21)
    params = _mixed_params(bs, vocab, seed=21)
    params["temperature"][37] = 0.9
    seed, offset = _seeds(bs, seed=21)
    device = backend.device
    dev = lambda t: t.to(device)  # noqa: E731
    batch = backend.verify_sampling_from_logits(tree_to(tree, device), dev(candidates), dev(logits), **_params_to(params, device),
                                                seed=dev(seed), offset=dev(offset), logprobs="raw")
    one = slice(37, 38)
    single_tree = type(tree)(tree.tokens.view(bs, nodes)[one].reshape(-1), tree.positions.view(bs, nodes)[one].reshape(-1),
                             torch.arange(nodes).view(1, nodes), tree.retrieve_next_token[one], tree.retrieve_next_sibling[one], None,
                             "qlen", steps)
    alone = backend.verify_sampling_from_logits(tree_to(single_tree, device), dev(candidates[one]),
                                                dev(logits.view(bs, nodes, vocab)[one]), **_params_to({k: v[one] for k, v in params.items()}, device),
                                                seed=dev(seed[one]), offset=dev(offset[one]), logprobs="raw")
    block = slice(37 * nodes, 38 * nodes)
    assert alone.verdict.predict.cpu().tolist() == batch.verdict.predict.cpu()[block].tolist()
    assert alone.verdict.accept_index.cpu()[0].tolist() == [i - 37 * nodes if i >= 0 else -1 for i in batch.verdict.accept_index.cpu()[37].tolist()]
    assert torch.equal(alone.logprobs.cpu()[0].nan_to_num(7.0), batch.logprobs.cpu()[37].nan_to_num(7.0))
    again = backend.verify_sampling_from_logits(tree_to(tree, device), dev(candidates), dev(logits), **_params_to(params, device),
                                                seed=dev(seed), offset=dev(offset), logprobs="raw")
    assert_same_verdict(again.verdict, batch.verdict)
    c0 = reference.hash_coins(seed, offset, torch.arange(nodes), reference.PURPOSE_ACCEPT)
    c1 = reference.hash_coins(seed, offset + 1, torch.arange(nodes), reference.PURPOSE_ACCEPT)
    assert not torch.equal(c0, c1)
    # The coins are well spread: 64 * 8 draws pass a coarse uniformity check over 8 bins.
    counts = torch.bincount((c0.reshape(-1) * 8).long(), minlength=8).double()
    assert float(((counts - 64) ** 2 / 64).sum()) < 30


# ----------------------------------------------------------------------------------------------
# batch size 0 and invalid inputs


@pytest.mark.spec_hal_op("verify_sampling_from_logits")
def test_sampling_ops_accept_batch_size_zero(backend):
    device = backend.device
    probs = backend.process_logits(torch.zeros(0, 10, device=device), temperature=1.0)
    assert probs.shape == (0, 10)
    tree = type(tree_from_parents([[-1, 0]], num_steps=1))(
        torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(0, dtype=torch.int64, device=device),
        torch.zeros(0, 4, dtype=torch.int64, device=device), torch.zeros(0, 4, dtype=torch.int64, device=device),
        torch.zeros(0, 4, dtype=torch.int64, device=device), None, "qlen", 2)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    result = backend.verify_sampling_from_logits(tree, torch.zeros(0, 4, dtype=torch.int64, device=device), torch.zeros(0, 10, device=device),
                                                 temperature=1.0, seed=empty, offset=empty, logprobs="raw")
    assert result.verdict.predict.shape == (0,) and result.verdict.accept_index.shape == (0, 3) and result.logprobs.shape == (0, 3)
    chain = backend.verify_chain_sampling_from_logits(torch.zeros(0, 3, dtype=torch.int64, device=device), None,
                                                      torch.zeros(0, 10, device=device), temperature=0.5, seed=empty, offset=empty)
    assert chain.verdict.accept_index.shape == (0, 4) and chain.logprobs is None


def _invalid_calls(device):
    tree = tree_to(tree_from_parents([[-1, 0, 0, 1]] * 2, num_steps=2), device)
    cand = torch.zeros(2, 4, dtype=torch.int64, device=device)
    logits = torch.zeros(8, 10, device=device)
    seed = torch.zeros(2, dtype=torch.int64, device=device)
    ok = {"seed": seed, "offset": seed}
    ids = torch.zeros(2, 3, dtype=torch.int64, device=device)
    chain_logits = torch.zeros(8, 10, device=device)
    verify = lambda b, **kw: b.verify_sampling_from_logits(tree, cand, logits, **{"temperature": 1.0, **ok, **kw})  # noqa: E731
    return [
        ("temperature", lambda b: verify(b, temperature=-0.5)),
        ("temperature", lambda b: verify(b, temperature=float("nan"))),
        ("temperature", lambda b: b.process_logits(logits, temperature=torch.ones(7, device=device))),
        ("temperature", lambda b: verify(b, temperature=torch.ones(2, device="meta"))),
        ("top_p", lambda b: verify(b, top_p=0.0)),
        ("top_p", lambda b: verify(b, top_p=1.5)),
        ("top_k", lambda b: verify(b, top_k=-1)),
        ("top_k", lambda b: verify(b, top_k=torch.ones(2, device=device))),
        ("min_p", lambda b: verify(b, min_p=1.5)),
        ("seed", lambda b: verify(b, seed=seed[:1])),
        ("seed", lambda b: verify(b, seed=seed.to(torch.int32))),
        ("offset", lambda b: verify(b, offset=None)),
        ("seed", lambda b: b.verify_sampling_from_logits(tree, cand, logits, temperature=1.0)),
        ("coins", lambda b: verify(b, seed=None, offset=None, generator=torch.Generator(), coins=torch.zeros(2, 4, device=device),
                                       final_coins=seed.float())),
        ("logprobs", lambda b: verify(b, logprobs="probs")),
        ("target_logits", lambda b: b.verify_sampling_from_logits(tree, cand, logits[:7], temperature=1.0, **ok)),
        ("target_logits", lambda b: b.verify_chain_sampling_from_logits(ids, None, chain_logits[:6], temperature=1.0, **ok)),
        ("draft_probs", lambda b: b.verify_chain_sampling_from_logits(ids, torch.zeros(2, 3, 9, device=device), chain_logits, temperature=1.0, **ok)),
        ("logits", lambda b: b.process_logits(logits.to(torch.int64), temperature=1.0)),
        ("logprobs", lambda b: verify(b, top_logprobs=2)),
        ("top_logprobs", lambda b: verify(b, logprobs="raw", top_logprobs=11)),
        ("max_top_k", lambda b: verify(b, top_k=5, max_top_k=0)),
        ("max_top_k", lambda b: verify(b, top_k=5, max_top_k=5.0)),
        ("max_top_k", lambda b: verify(b, top_k=5, max_top_k=4)),
        ("max_top_k", lambda b: verify(b, max_top_k=9)),  # top-k off counts as V (10)
        ("max_top_k", lambda b: b.verify_chain_sampling_from_logits(ids, None, chain_logits, temperature=1.0, top_k=3, max_top_k=True,
                                                                    **ok)),
    ]


@pytest.mark.spec_hal_op("verify_sampling_from_logits")
@pytest.mark.parametrize("case", range(26))
def test_sampling_ops_reject_bad_input(backend, case):
    assert_rejects(backend, *_invalid_calls(backend.device)[case])
