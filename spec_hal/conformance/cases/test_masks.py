"""Conformance of vocabulary bitmasks (family ``masks``, and the ``token_bitmask`` argument of
``draft_topk`` and the verify ops) against the reference. Semantics: spec_hal/masks.py.

Every case compares a backend with the reference (integers exactly) and checks the mask's own
invariant independently of the reference: no masked token is ever accepted or emitted (except the
documented id 0 of a row that allows nothing).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import spec_hal.masks as masks
import spec_hal.ragged as ragged_reference
import spec_hal.topk as topk_reference
import spec_hal.verify as verify_reference
from spec_hal.conformance.guards import _bits, assert_rejects, call_without_sync, embedded_input, guarded_output, no_host_sync
from spec_hal.conformance.inputs import logits_rows
from spec_hal.conformance.tolerances import assert_close
from spec_hal.conformance.trees import random_tree, replicate, tree_from_parents, tree_to
from spec_hal.conformance.verdicts import VERDICT_FIELDS, assert_same_verdict
from spec_hal.types import Verdict

# Statistical tests: chi-square over V = 8 outcomes (7 degrees of freedom) below 30, the 0.99995
# quantile (seeded, so deterministic). Power: with 100,000 draws, moving 0.01 of probability
# between two outcomes of probability 1/8 gives a noncentrality of 1e5 * 2 * 1e-4 / 0.125 = 160,
# rejected with probability > 0.999; any emission of a masked token fails outright.
CHI_SQUARE_LIMIT = 30.0
DRAWS = 100_000
TREE_DRAWS = 50_000


def random_bitmask(rows: int, vocab: int, *, seed: int, indexed: bool, density: float = 0.6):
    """(token_bitmask, bitmask_index, allowed (rows, V) bool) with the hard rows first: a row
    allowing nothing, one allowing everything, one allowing a single token in the last word;
    with ``indexed``, fewer mask rows than rows and every third row unconstrained (-1)."""
    generator = torch.Generator().manual_seed(seed)
    count = max(rows // 2 + 1, 3) if indexed else rows
    allowed_rows = torch.rand(count, vocab, generator=generator) < density
    for special in range(min(count, 3)):
        allowed_rows[special] = (False, True, False)[special]
    if count > 2:
        allowed_rows[2, vocab - 1] = True
    bitmask = masks.pack_bitmask(allowed_rows)
    if not indexed:
        return bitmask, None, allowed_rows
    index = torch.randint(0, count, (rows,), generator=generator)
    index[::3] = -1
    index[: min(rows, 3)] = torch.arange(min(rows, 3)) if rows > 1 else torch.tensor([0])
    allowed = torch.where((index >= 0)[:, None], allowed_rows[index.clamp(min=0)], torch.ones(rows, vocab, dtype=torch.bool))
    return bitmask, index, allowed


def _to(device, *tensors):
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors)


def _assert_path_allowed(verdict: Verdict, allowed: torch.Tensor, nodes: int) -> None:
    """Every token on the accepted path (drafts and bonus) is allowed at the row that emits it;
    a row allowing nothing may only emit id 0."""
    predict = verdict.predict.cpu()
    for b in range(verdict.batch_size):
        path = [int(i) for i in verdict.accept_index[b].cpu().tolist() if i >= 0]
        for row in path:
            token = int(predict[row])
            assert token >= 0
            if allowed[row].any():
                assert allowed[row, token], f"row {row} emitted masked token {token}"
            else:
                assert token == 0, f"row {row} allows nothing and must emit id 0, not {token}"


# ----------------------------------------------------------------------------------------------
# apply_token_bitmask_


@pytest.mark.spec_hal_op("apply_token_bitmask_")
@pytest.mark.parametrize("vocab", (1, 31, 32, 100))
@pytest.mark.parametrize("indexed", (False, True))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("rows", (0, 1, 7))
def test_apply_token_bitmask(backend, vocab, indexed, dtype, rows):
    logits = logits_rows(rows, vocab, seed=vocab + rows, dtype=dtype)
    bitmask, index, allowed = random_bitmask(rows, vocab, seed=vocab * 7 + rows, indexed=indexed)
    expected = masks.apply_token_bitmask_(logits.clone(), bitmask, bitmask_index=index)
    # Strided logits inside a buffer whose margins must survive (no out-of-bounds write).
    outer = torch.full((rows + 2, vocab + 67), 5.0, dtype=dtype, device=backend.device)
    view = outer[1:rows + 1, :vocab]
    view.copy_(logits)
    before = outer.clone()
    returned = call_without_sync(backend.device, backend.apply_token_bitmask_, view, bitmask, bitmask_index=index)
    assert returned.data_ptr() == view.data_ptr()
    assert torch.equal(view.cpu().float().nan_to_num(nan=7.0), expected.float().nan_to_num(nan=7.0))
    outside = torch.ones_like(outer, dtype=torch.bool)
    outside[1:rows + 1, :vocab] = False
    assert torch.equal(outer[outside].cpu(), before[outside].cpu()), "a logit outside the view was written"
    assert (view.cpu()[~allowed] == float("-inf")).all() if rows else True


@pytest.mark.spec_hal_op("apply_token_bitmask_")
@pytest.mark.parametrize("dtype", (torch.float64, torch.float32, torch.bfloat16, torch.float16))
@pytest.mark.parametrize("indexed", (False, True))
def test_apply_token_bitmask_runs(backend, dtype, indexed):
    """Masks in runs (allowed and masked stretches of 1-96 ids) over an odd vocabulary, so that
    32-byte stretches of a row are wholly allowed, wholly masked or mixed (a kernel may treat
    them apart: kernels/masks.py), the last one cut by the vocabulary's end; logits with NaNs of
    several payloads and infinities. Every bit of the row is the reference's: allowed values
    (NaN payloads included) untouched, masked ones -inf, and nothing around the view written."""
    rows, vocab = 6, 4099
    generator = torch.Generator().manual_seed(4099 + len(str(dtype)) + indexed)
    lengths = torch.randint(1, 97, (rows * vocab,), generator=generator)
    state = torch.repeat_interleave(torch.arange(lengths.shape[0]) % 2 == 0, lengths)[: rows * vocab]
    allowed_rows = state.view(rows, vocab).clone()
    allowed_rows[0] = False  # a row allowing nothing: every sector wholly masked
    bitmask = masks.pack_bitmask(allowed_rows)
    index = torch.tensor([0, -1, 2, 3, -1, 5], dtype=torch.int32) if indexed else None
    logits = (torch.randn(rows, vocab, generator=generator) * 3).to(dtype)
    _bits(logits)[:, 5::17] = _bits(torch.tensor(float("nan"), dtype=dtype)) + 1  # a NaN with another payload (a view: in place)
    logits[:, 7::19] = float("nan")
    logits[:, 3::23] = float("inf")
    logits[:, 11::29] = float("-inf")
    expected = masks.apply_token_bitmask_(logits.clone(), bitmask, bitmask_index=index)
    sector = 32 // logits.element_size()
    kinds = allowed_rows[:, : vocab // sector * sector].reshape(-1, sector).sum(dim=1)
    assert (kinds == 0).any() and (kinds == sector).any() and ((kinds > 0) & (kinds < sector)).any()  # the case's range
    outer = torch.full((rows + 2, vocab + 45), 5.0, dtype=dtype, device=backend.device)
    view = outer[1:rows + 1, 3:vocab + 3]
    view.copy_(logits)
    before = outer.clone()
    call_without_sync(backend.device, backend.apply_token_bitmask_, view, bitmask, bitmask_index=index)
    assert torch.equal(_bits(view), _bits(expected)), "not every bit is the reference's"
    outside = torch.ones_like(outer, dtype=torch.bool)
    outside[1:rows + 1, 3:vocab + 3] = False
    assert torch.equal(outer[outside].cpu(), before[outside].cpu()), "a logit outside the view was written"


# ----------------------------------------------------------------------------------------------
# draft_topk


def _assert_positive_probabilities_allowed(probs: torch.Tensor, ids: torch.Tensor, allowed: torch.Tensor) -> None:
    """Independent of the reference: every (row, slot) of ``draft_topk`` whose probability is
    above 0 holds a token that ``allowed`` ((rows, V) bool, in the ids' vocabulary) allows."""
    probs, ids = probs.cpu(), ids.cpu()
    for row, slot in (probs > 0).nonzero().tolist():
        token = int(ids[row, slot])
        assert allowed[row, token], f"row {row}: masked token {token} has probability > 0"


@pytest.mark.spec_hal_op("draft_topk")
@pytest.mark.parametrize("vocab, k", ((40, 4), (100, 16), (33, 1)))
@pytest.mark.parametrize("indexed", (False, True))
@pytest.mark.parametrize("mapped", (False, True))
def test_draft_topk_masked(backend, vocab, k, indexed, mapped):
    rows = 11
    logits = logits_rows(rows, vocab, seed=vocab + k)
    token_map = torch.randperm(3 * vocab, generator=torch.Generator().manual_seed(vocab))[:vocab] if mapped else None
    mask_vocab = 3 * vocab if mapped else vocab
    bitmask, index, allowed = random_bitmask(rows, mask_vocab, seed=vocab * 3 + k, indexed=indexed, density=0.3)
    expected = topk_reference.draft_topk(logits, k, token_map=token_map, token_bitmask=bitmask, bitmask_index=index)
    device = backend.device
    probs, ids = call_without_sync(device, backend.draft_topk, embedded_input(logits, device, margin_value=1e4), k,
                                   token_map=token_map, token_bitmask=bitmask, bitmask_index=index)
    assert torch.equal(ids.cpu(), expected[1]), f"ids differ:\n got  {ids.cpu().tolist()}\n want {expected[1].tolist()}"
    assert_close("draft_topk", "probs", probs, expected[0], input_dtype=torch.float32)
    _assert_positive_probabilities_allowed(probs, ids, allowed)


@pytest.mark.spec_hal_op("draft_topk")
def test_draft_topk_masked_strided_index(backend):
    """A strided ``bitmask_index`` (every other element of a wider tensor, -5 in between: read
    with unit stride it would leave rows unconstrained) selects the same ids as the reference."""
    rows, vocab, k = 11, 100, 4
    logits = logits_rows(rows, vocab, seed=17)
    bitmask, index, _ = random_bitmask(rows, vocab, seed=19, indexed=True, density=0.3)
    expected = topk_reference.draft_topk(logits, k, token_bitmask=bitmask, bitmask_index=index)
    device = backend.device
    wide = torch.full((rows, 2), -5, dtype=index.dtype, device=device)
    wide[:, 0] = index.to(device)
    strided = wide[:, 0]
    assert strided.stride() == (2,)
    probs, ids = backend.draft_topk(logits.to(device), k, token_bitmask=bitmask.to(device), bitmask_index=strided)
    assert torch.equal(ids.cpu(), expected[1]), f"ids differ:\n got  {ids.cpu().tolist()}\n want {expected[1].tolist()}"
    assert_close("draft_topk", "probs", probs, expected[0], input_dtype=torch.float32)


@pytest.mark.spec_hal_op("draft_topk")
@pytest.mark.parametrize("k", (1, 4, 16))
@pytest.mark.parametrize("indexed", (False, True))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_draft_topk_masked_whole_tiles(backend, k, indexed, dtype):
    """A power-of-two vocabulary (1024), so that every backend's tiles are whole (no id past the
    vocabulary: the statistics pass's branch without bound tests, where masked ids are told from
    ids past the vocabulary by the mask alone), with the sub-tile cases a ranking must get right:
    a row allowing nothing, one allowing everything, one allowing a single id in the last word, a
    256-id block wholly masked holding the row's largest logits, a row whose only allowed ids are
    -inf and in its last block (they rank above the masked blocks), allowed NaN and +inf, signed
    zeros, and (indexed) unconstrained rows; float32 and bfloat16 logits (2-byte logits launch
    other tiles on NVIDIA, kernels/topk.py: launch_config)."""
    rows, vocab = 14, 1024
    logits = logits_rows(rows, vocab, seed=23 + k)
    allowed = torch.rand(rows, vocab, generator=torch.Generator().manual_seed(29 + k)) < 0.3
    allowed[0], allowed[1], allowed[2] = False, True, False
    allowed[2, vocab - 1] = True
    allowed[3, 256:512] = False
    logits[3, 300] = 50.0
    allowed[4] = False
    allowed[4, 800:810] = True
    logits[4, 800:810] = float("-inf")
    logits[5, 600:640] = float("nan")
    logits[5, 641] = float("inf")
    allowed[5, 600:642] = True
    logits[6] = torch.where(torch.arange(vocab) % 2 == 0, torch.tensor(0.0), torch.tensor(-0.0))
    logits = logits.to(dtype)
    bitmask = masks.pack_bitmask(allowed)
    index = None
    if indexed:
        index = torch.arange(rows)
        index[7::3] = -1
    expected = topk_reference.draft_topk(logits, k, token_bitmask=bitmask, bitmask_index=index)
    device = backend.device
    probs, ids = call_without_sync(device, backend.draft_topk, embedded_input(logits, device, margin_value=1e4), k,
                                   token_bitmask=bitmask, bitmask_index=index)
    assert torch.equal(ids.cpu(), expected[1]), f"ids differ:\n got  {ids.cpu().tolist()}\n want {expected[1].tolist()}"
    assert_close("draft_topk", "probs", probs, expected[0], input_dtype=dtype)
    _assert_positive_probabilities_allowed(probs, ids, masks.allowed_matrix(bitmask, index, rows, vocab))


# ----------------------------------------------------------------------------------------------
# verification


def _peaked_logits(tree, candidates, vocab: int, *, seed: int) -> torch.Tensor:
    """(bs*N, V) logits peaked on each node's first child token (so walks accept often)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(candidates.numel(), vocab, generator=generator)
    first = candidates.gather(1, tree.retrieve_next_token.clamp(min=0)).reshape(-1)
    logits[torch.arange(candidates.numel()), first.clamp(0, vocab - 1)] += 4.0
    return logits


@pytest.mark.spec_hal_op("verify_greedy")
@pytest.mark.parametrize("steps, nodes", ((3, 4), (5, 8), (3, 16)))
@pytest.mark.parametrize("bs", (1, 9))
@pytest.mark.parametrize("indexed", (False, True))
def test_verify_greedy_masked(backend, steps, nodes, bs, indexed):
    vocab = 40
    tree, candidates = random_tree(bs, nodes, steps, seed=steps + nodes * 10 + bs, vocab=vocab)
    logits = _peaked_logits(tree, candidates, vocab, seed=bs + nodes)
    bitmask, index, allowed = random_bitmask(bs * nodes, vocab, seed=nodes * 3 + bs, indexed=indexed, density=0.7)
    expected = verify_reference.verify_greedy(tree, candidates, logits, token_bitmask=bitmask, bitmask_index=index)
    device = backend.device
    verdict = call_without_sync(device, backend.verify_greedy, tree, candidates, logits, token_bitmask=bitmask, bitmask_index=index)
    assert_same_verdict(verdict, expected)
    _assert_path_allowed(verdict, allowed, nodes)


@pytest.mark.spec_hal_op("verify_greedy")
def test_verify_greedy_mask_blocks_the_target_token(backend):
    """A chain root -> 1 -> 2 whose target argmax is exactly the drafts: masking token 2 at node 1
    stops acceptance after one draft and the bonus is the best allowed token (derived by hand)."""
    tree = tree_from_parents([[-1, 0, 1]], num_steps=2)
    candidates = torch.tensor([[0, 1, 2]])
    logits = torch.tensor([[0.0, 5.0, 1.0, 0.0], [0.0, 0.0, 5.0, 4.0], [3.0, 0.0, 0.0, 0.0]])
    allowed = torch.ones(3, 4, dtype=torch.bool)
    allowed[1, 2] = False
    device = backend.device
    verdict = backend.verify_greedy(tree_to(tree, device), candidates.to(device), logits.to(device),
                                    token_bitmask=masks.pack_bitmask(allowed).to(device))
    assert verdict.num_correct.cpu().tolist() == [1]
    assert verdict.predict.cpu().tolist() == [1, 3, -1]


@pytest.mark.spec_hal_op("verify_sampling")
@pytest.mark.parametrize("steps, nodes", ((3, 4), (5, 8), (5, 16), (6, 32)))  # N >= 16: the walk loads each child (kernels/verify.py)
@pytest.mark.parametrize("bs", (1, 9))
@pytest.mark.parametrize("indexed", (False, True))
def test_verify_sampling_masked(backend, steps, nodes, bs, indexed):
    vocab = 40
    tree, candidates = random_tree(bs, nodes, steps, seed=steps + nodes * 10 + bs, vocab=vocab)
    probs = torch.softmax(_peaked_logits(tree, candidates, vocab, seed=nodes + bs), dim=1).view(bs, nodes, vocab)
    generator = torch.Generator().manual_seed(bs * nodes)
    coins, final_coins = torch.rand(bs, nodes, generator=generator), torch.rand(bs, generator=generator)
    bitmask, index, allowed = random_bitmask(bs * nodes, vocab, seed=nodes + 5 * bs, indexed=indexed, density=0.7)
    expected = verify_reference.verify_sampling(tree, candidates, probs, coins, final_coins, token_bitmask=bitmask, bitmask_index=index)
    device = backend.device
    verdict = call_without_sync(device, backend.verify_sampling, tree, candidates, probs, coins, final_coins,
                                token_bitmask=bitmask, bitmask_index=index)
    assert_same_verdict(verdict, expected)
    _assert_path_allowed(verdict, allowed, nodes)


@pytest.mark.spec_hal_op("verify_sampling")
def test_verify_sampling_masked_thresholds_zero_never_accept_masked(backend):
    """Thresholds 0 accept the first scanned child whatever its probability, unless it is masked."""
    tree = tree_from_parents([[-1, 0, 0]], num_steps=1)
    candidates = torch.tensor([[0, 3, 5]])
    probs = torch.full((1, 3, 8), 1.0 / 8)
    allowed = torch.ones(3, 8, dtype=torch.bool)
    allowed[0, 3] = False
    device = backend.device
    verdict = backend.verify_sampling(tree_to(tree, device), candidates.to(device), probs.to(device), torch.zeros(1, 3, device=device),
                                      torch.zeros(1, device=device), threshold_single=0.0, threshold_acc=0.0,
                                      token_bitmask=masks.pack_bitmask(allowed).to(device))
    assert verdict.accept_index.cpu().tolist() == [[0, 2]]


@pytest.mark.spec_hal_op("verify_chain")
@pytest.mark.parametrize("width", (1, 4, 9))
@pytest.mark.parametrize("indexed", (False, True))
def test_verify_chain_masked(backend, width, indexed):
    bs, vocab = 13, 36
    generator = torch.Generator().manual_seed(width)
    logits = torch.randn(bs * width, vocab, generator=generator)
    candidates = torch.randint(0, vocab, (bs, width), generator=generator)
    # Peak each position at the next draft, so that prefixes match often.
    peaks = torch.cat([candidates[:, 1:], candidates[:, :1]], dim=1).reshape(-1)
    logits[torch.arange(bs * width), peaks] += 4.0
    bitmask, index, allowed = random_bitmask(bs * width, vocab, seed=width * 11, indexed=indexed, density=0.8)
    expected = verify_reference.verify_chain(candidates, logits, token_bitmask=bitmask, bitmask_index=index)
    device = backend.device
    num_correct, bonus = call_without_sync(device, backend.verify_chain, candidates, logits, token_bitmask=bitmask, bitmask_index=index)
    assert torch.equal(num_correct.cpu(), expected[0]) and torch.equal(bonus.cpu(), expected[1])
    for b in range(bs):
        n, row = int(num_correct[b]), b * width + int(num_correct[b])
        assert all(allowed[b * width + j, int(candidates[b, j + 1])] for j in range(n))
        assert allowed[row, int(bonus[b])] if allowed[row].any() else int(bonus[b]) == 0


@pytest.mark.spec_hal_op("verify_chain")
def test_verify_chain_masked_rows_whose_allowed_logits_are_all_minus_inf(backend):
    """Rows whose allowed tokens all rank as -inf (-inf or NaN logits) while masked tokens are
    finite: the bonus is the lowest allowed id, never a masked one. V spans several argmax tiles
    on a GPU, and the allowed ids sit in a later tile than the finite masked ones, so a backend
    that loses the allowed flags of an all -inf tile picks a masked id or the wrong tile."""
    vocab, width = 9000, 1
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(6, vocab, generator=generator)
    allowed = torch.zeros(6, vocab, dtype=torch.bool)
    allowed[0, 5000:5003] = True  # -inf, in a later tile than the finite masked ids
    logits[0, 5000:5003] = float("-inf")
    allowed[1, [4097, 8999]] = True  # one NaN, one -inf, in different tiles
    logits[1, 4097], logits[1, 8999] = float("nan"), float("-inf")
    allowed[2, 7000:] = True  # a whole tail of -inf
    logits[2, 7000:] = float("-inf")
    allowed[4] = torch.rand(vocab, generator=generator) < 0.5  # an ordinary row
    allowed[5, 8191:8193] = True  # the ids either side of a tile boundary, both -inf
    logits[5, 8191:8193] = float("-inf")
    bitmask = masks.pack_bitmask(allowed)  # row 3 allows nothing
    candidates = torch.randint(0, vocab, (6, width), generator=generator)
    expected = verify_reference.verify_chain(candidates, logits, token_bitmask=bitmask)
    num_correct, bonus = call_without_sync(backend.device, backend.verify_chain, candidates, logits, token_bitmask=bitmask)
    assert torch.equal(num_correct.cpu(), expected[0]) and torch.equal(bonus.cpu(), expected[1])
    lowest_allowed = [5000, 4097, 7000, 0, None, 8191]
    for row, lowest in enumerate(lowest_allowed):
        if lowest is not None:
            assert int(bonus[row]) == lowest, f"row {row}: bonus {int(bonus[row])}, lowest allowed id {lowest}"
    assert allowed[4, int(bonus[4])]


def _rows_allowing_nothing_inputs(vocab: int, indexed: bool):
    """Two chains of 3 drafts, every draft token 0, every target row peaked at token 0; rows 0 and
    5 (request 0's root, request 1's first draft) allow nothing. Derived by hand: request 0
    accepts nothing, request 1 one draft, and both emit id 0 at the row where they stop."""
    candidates = torch.tensor([[5, 0, 0, 0], [7, 0, 0, 0]])
    logits = torch.randn(8, vocab, generator=torch.Generator().manual_seed(vocab))
    logits[:, 0] = 10.0
    nothing = torch.tensor([True, False, False, False, False, True, False, False])
    if indexed:  # mask row 0 allows nothing, mask row 1 everything but the last id
        allowed_rows = torch.ones(2, vocab, dtype=torch.bool)
        allowed_rows[0] = False
        allowed_rows[1, vocab - 1] = False
        bitmask, index = masks.pack_bitmask(allowed_rows), torch.where(nothing, 0, 1)
    else:
        bitmask, index = masks.pack_bitmask(~nothing[:, None].expand(8, vocab)), None
    return candidates, logits, bitmask, index


@pytest.mark.parametrize("op", [pytest.param(op, marks=pytest.mark.spec_hal_op(op))
                                for op in ("verify_greedy", "verify_chain", "verify_chain_ragged")])
@pytest.mark.parametrize("indexed", (False, True))
def test_greedy_verifies_never_accept_at_a_row_allowing_nothing(backend, op, indexed):
    """At a row allowing nothing the target's token is id 0 (the documented fallback), and a draft
    of token 0 there must still be rejected: it is masked. V spans several argmax tiles on a GPU.
    Catches a backend that tests only the draft against the target's token (from logits the
    argmax is otherwise always allowed)."""
    vocab = 9000
    candidates, logits, bitmask, index = _rows_allowing_nothing_inputs(vocab, indexed)
    target = logits
    kwargs = {"token_bitmask": bitmask, "bitmask_index": index}
    device = backend.device
    if op == "verify_greedy":
        tree = tree_from_parents([[-1, 0, 1, 2]] * 2, num_steps=3)
        expected = verify_reference.verify_greedy(tree, candidates, target, **kwargs)
        verdict = call_without_sync(device, backend.verify_greedy, tree, candidates, target, **kwargs)
        assert_same_verdict(verdict, expected)
        num_correct, stops = verdict.num_correct.cpu(), verdict.predict.cpu()[[0, 5]]
    elif op == "verify_chain":
        expected = verify_reference.verify_chain(candidates, target, **kwargs)
        num_correct, bonus = call_without_sync(device, backend.verify_chain, candidates, target, **kwargs)
        assert torch.equal(num_correct.cpu(), expected[0]) and torch.equal(bonus.cpu(), expected[1])
        num_correct, stops = num_correct.cpu(), bonus.cpu()
    else:
        drafts, counts = candidates[:, 1:].reshape(-1), torch.tensor([3, 3])
        expected = ragged_reference.verify_chain_ragged(drafts, counts, target, max_drafts=3, **kwargs)
        verdict = call_without_sync(device, backend.verify_chain_ragged, drafts, counts, target, max_drafts=3, **kwargs)
        assert_same_verdict(verdict, expected)
        num_correct, stops = verdict.num_correct.cpu(), verdict.predict.cpu()[[0, 5]]
    assert num_correct.tolist() == [0, 1]
    assert stops.tolist() == [0, 0]


@pytest.mark.spec_hal_op("verify_chain_sampling")
@pytest.mark.parametrize("steps", (1, 4))
@pytest.mark.parametrize("with_draft_probs", (True, False))
@pytest.mark.parametrize("masked", (False, True))
def test_verify_chain_sampling_masked_and_without_draft_probs(backend, steps, with_draft_probs, masked):
    bs, vocab = 11, 36
    generator = torch.Generator().manual_seed(steps * 7 + with_draft_probs)
    draft_ids = torch.randint(0, vocab, (bs, steps), generator=generator)
    target_logits = torch.randn(bs, steps + 1, vocab, generator=generator)
    target_logits[:, :steps].scatter_add_(2, draft_ids[:, :, None], torch.full((bs, steps, 1), 3.0))
    target = torch.softmax(target_logits, dim=2)
    draft = torch.softmax(torch.randn(bs, steps, vocab, generator=generator), dim=2) if with_draft_probs else None
    coins, final_coins = torch.rand(bs, steps, generator=generator), torch.rand(bs, generator=generator)
    bitmask, index, allowed = random_bitmask(bs * (steps + 1), vocab, seed=steps, indexed=True, density=0.7) if masked else (None, None, None)
    expected = verify_reference.verify_chain_sampling(draft_ids, draft, target, coins, final_coins, token_bitmask=bitmask, bitmask_index=index)
    device = backend.device
    verdict = call_without_sync(device, backend.verify_chain_sampling, draft_ids, draft, target, coins, final_coins,
                                token_bitmask=bitmask, bitmask_index=index)
    assert_same_verdict(verdict, expected)
    if masked:
        _assert_path_allowed(verdict, allowed, steps + 1)


@pytest.mark.parametrize("op, with_draft_probs", [
    pytest.param("verify_chain_sampling", True, marks=pytest.mark.spec_hal_op("verify_chain_sampling")),
    pytest.param("verify_chain_sampling", False, marks=pytest.mark.spec_hal_op("verify_chain_sampling")),
    pytest.param("verify_sampling", False, marks=pytest.mark.spec_hal_op("verify_sampling"))])
def test_sampling_verifies_with_a_mask_of_no_rows(backend, op, with_draft_probs):
    """A (0, ceil(V/32)) token_bitmask whose index is all -1 constrains no row: the verdict is the
    reference's, which equals the unmasked one. A kernel that reads mask words for unconstrained
    rows (at row 0, say) would read past this empty mask: memcheck on a GPU, a crash under the
    interpreter (seen with such a kernel on 2026-11-29)."""
    bs, steps, vocab = 9, 4, 300
    tree, candidates = random_tree(bs, steps + 1, steps, seed=4, vocab=vocab)
    generator = torch.Generator().manual_seed(5)
    target = torch.softmax(2 * torch.randn(bs, steps + 1, vocab, generator=generator), dim=2)
    draft = torch.softmax(torch.randn(bs, steps, vocab, generator=generator), dim=2) if with_draft_probs else None
    coins, final_coins = torch.rand(bs, steps + 1, generator=generator), torch.rand(bs, generator=generator)
    no_rows = torch.zeros(0, masks.mask_width(vocab), dtype=torch.int32)
    index = torch.full((bs * (steps + 1),), -1, dtype=torch.int64)
    if op == "verify_chain_sampling":
        args = (candidates[:, 1:].contiguous(), draft, target, coins[:, 1:].contiguous(), final_coins)
    else:
        args = (tree, candidates, target, coins, final_coins)
    expected = getattr(verify_reference, op)(*args, token_bitmask=no_rows, bitmask_index=index)
    assert_same_verdict(expected, getattr(verify_reference, op)(*args))
    verdict = call_without_sync(backend.device, getattr(backend, op), *args, token_bitmask=no_rows, bitmask_index=index)
    assert_same_verdict(verdict, expected)


# ----------------------------------------------------------------------------------------------
# distributions (lossless under the mask)


def _chi_square(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() * samples.numel()
    support = expected > 0
    assert (counts[~support] == 0).all(), f"emitted a token of probability 0 (masked): counts {counts.tolist()}"
    return float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())


@pytest.mark.spec_hal_op("verify_sampling")
def test_verify_sampling_masked_distribution(backend):
    """A depth-1 tree with three siblings (one masked) under target probabilities that are the
    softmax of masked logits: the first emitted token follows the masked target exactly."""
    vocab = 8
    allowed = torch.tensor([True, False, True, True, False, True, True, True])
    logits = torch.tensor([0.5, 2.0, 1.0, -0.5, 1.5, 0.0, 0.3, 1.2])
    target = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=0)
    tree = replicate(tree_from_parents([[-1, 0, 0, 0]], num_steps=1), DRAWS)
    candidates = torch.tensor([[0, 1, 2, 7]]).expand(DRAWS, 4).contiguous()
    probs = target.expand(DRAWS, 4, vocab).contiguous()
    generator = torch.Generator().manual_seed(2024)
    coins, final_coins = torch.rand(DRAWS, 4, generator=generator), torch.rand(DRAWS, generator=generator)
    bitmask = masks.pack_bitmask(allowed[None, :].expand(4, vocab))
    device = backend.device
    verdict = backend.verify_sampling(tree_to(tree, device), *_to(device, candidates, probs, coins, final_coins),
                                      token_bitmask=bitmask.to(device), bitmask_index=torch.zeros(DRAWS * 4, dtype=torch.int32, device=device))
    first = verdict.predict.cpu().view(DRAWS, 4)[:, 0].long()
    assert _chi_square(first, target) < CHI_SQUARE_LIMIT


@pytest.mark.spec_hal_op("verify_chain_sampling")
def test_verify_chain_without_draft_probs_distribution(backend):
    """draft_probs=None (a deterministic n-gram draft): the first emitted token follows the target
    exactly whatever the draft proposes (here always token 3, and 6 where the mask forbids it)."""
    vocab = 8
    target = torch.tensor([0.05, 0.2, 0.1, 0.25, 0.0, 0.15, 0.05, 0.2])
    draft_ids = torch.full((DRAWS, 2), 3)
    target_probs = target.expand(DRAWS, 3, vocab).contiguous()
    generator = torch.Generator().manual_seed(7)
    coins, final_coins = torch.rand(DRAWS, 2, generator=generator), torch.rand(DRAWS, generator=generator)
    device = backend.device
    verdict = backend.verify_chain_sampling(*_to(device, draft_ids, None, target_probs, coins, final_coins))
    first = verdict.predict.cpu().view(DRAWS, 3)[:, 0].long()
    assert _chi_square(first, target) < CHI_SQUARE_LIMIT


# ----------------------------------------------------------------------------------------------
# bad input


@pytest.mark.spec_hal_op("apply_token_bitmask_")
def test_masks_reject_bad_input(backend):
    device = backend.device
    logits = torch.zeros(3, 70, device=device)
    good = torch.zeros(3, 3, dtype=torch.int32, device=device)
    assert_rejects(backend, "token_bitmask", lambda b: b.apply_token_bitmask_(logits, torch.zeros(3, 2, dtype=torch.int32, device=device)))
    assert_rejects(backend, "token_bitmask", lambda b: b.apply_token_bitmask_(logits, good.to(torch.int64)))
    assert_rejects(backend, "token_bitmask", lambda b: b.apply_token_bitmask_(logits, good[:2]))
    assert_rejects(backend, "bitmask_index", lambda b: b.apply_token_bitmask_(logits, good, bitmask_index=torch.zeros(2, dtype=torch.int32, device=device)))
    assert_rejects(backend, "bitmask_index", lambda b: b.draft_topk(logits, 2, bitmask_index=torch.zeros(3, dtype=torch.int32, device=device)))
    assert_rejects(backend, "token_bitmask", lambda b: b.draft_topk(logits, 2, token_bitmask=good[:, :1]))
    tree = tree_to(tree_from_parents([[-1, 0]], num_steps=1), device)
    candidates = torch.zeros(1, 2, dtype=torch.int64, device=device)
    ids = torch.zeros(2, dtype=torch.int64, device=device)
    assert_rejects(backend, "target_predict", lambda b: b.verify_greedy(tree, candidates, ids, token_bitmask=good[:2]))
    assert_rejects(backend, "token_bitmask", lambda b: b.verify_greedy(tree, candidates, logits[:2], token_bitmask=good[:2, :2]))
    probs = torch.full((1, 2, 70), 1 / 70, device=device)
    assert_rejects(backend, "token_bitmask", lambda b: b.verify_sampling(tree, candidates, probs, torch.zeros(1, 2, device=device),
                                                                         torch.zeros(1, device=device), token_bitmask=good))


# ----------------------------------------------------------------------------------------------
# tree verification with the draft distribution (verify_tree_sampling)


def _tree_sampling_inputs(bs: int, nodes: int, steps: int, vocab: int, *, seed: int):
    """A random tree whose children are drawn from the draft rows q (as the op assumes)."""
    tree, _ = random_tree(bs, nodes, steps, seed=seed, vocab=vocab)
    generator = torch.Generator().manual_seed(seed)
    draft = torch.softmax(torch.randn(bs, nodes, vocab, generator=generator) * 2, dim=2)
    target = torch.softmax(torch.randn(bs, nodes, vocab, generator=generator) * 2, dim=2)
    parents = tree.parents.clamp(min=0)
    rows = draft[torch.arange(bs)[:, None], parents]  # (bs, N, V): each node's parent row
    candidates = torch.multinomial(rows.reshape(-1, vocab), 1, generator=generator).view(bs, nodes)
    candidates[:, 0] = 0
    coins, final_coins = torch.rand(bs, nodes, generator=generator), torch.rand(bs, generator=generator)
    return tree, candidates, draft, target, coins, final_coins


@pytest.mark.spec_hal_op("verify_tree_sampling")
@pytest.mark.parametrize("steps, nodes", ((3, 4), (3, 8), (5, 16)))
@pytest.mark.parametrize("masked, vocab", ((False, 12), (True, 12), (True, 100)))
def test_verify_tree_sampling_matches_reference(backend, steps, nodes, masked, vocab):
    """V = 100: the interpreter's tiles are 64 ids wide, so its masked passes load each tile's mask
    words at once (masks.tile_words) as the GPUs do at every V, the last word partial."""
    bs = 9
    tree, candidates, draft, target, coins, final_coins = _tree_sampling_inputs(bs, nodes, steps, vocab, seed=steps * 10 + nodes)
    kwargs = {}
    if masked:
        bitmask, index, allowed = random_bitmask(bs * nodes, vocab, seed=nodes, indexed=True, density=0.7)
        kwargs = {"token_bitmask": bitmask, "bitmask_index": index}
    expected = verify_reference.verify_tree_sampling(tree, candidates, draft, target, coins, final_coins, **kwargs)
    device = backend.device
    verdict = call_without_sync(device, backend.verify_tree_sampling, tree, candidates, draft, target, coins, final_coins, **kwargs)
    assert_same_verdict(verdict, expected)
    if masked:
        _assert_path_allowed(verdict, allowed, nodes)


@pytest.mark.spec_hal_op("verify_tree_sampling")
def test_verify_tree_sampling_bounded(backend):
    """Long rejection chains (siblings drawn from 3 tokens, so duplicates are rejected in turn),
    candidates outside [0, V), a request with garbage links, unnormalised strided (bs*N, V)
    probabilities inside attractive margins (p = q = 1 next to every row) and canary-guarded out=
    buffers: the reference's verdict, nothing outside the tensors read or written."""
    bs, nodes, steps, vocab = 4, 10, 4, 13
    tree, _ = random_tree(bs, nodes, steps, seed=3, vocab=vocab, chain_bias=0.2)
    generator = torch.Generator().manual_seed(3)
    links = tree.retrieve_next_token.clone(), tree.retrieve_next_sibling.clone()
    links[0][3], links[1][3] = torch.randint(-2, nodes + 2, (2, nodes), generator=generator)
    tree = dataclasses.replace(tree, retrieve_next_token=links[0], retrieve_next_sibling=links[1])
    candidates = torch.randint(0, 3, (bs, nodes), generator=generator)
    candidates[1, 2], candidates[2, 1] = vocab, -1
    draft = torch.softmax(torch.randn(bs * nodes, vocab, generator=generator), dim=1)
    target = torch.rand(bs * nodes, vocab, generator=generator) * 0.3
    coins, final_coins = torch.rand(bs, nodes, generator=generator), torch.rand(bs, generator=generator)
    expected = verify_reference.verify_tree_sampling(tree, candidates, draft, target, coins, final_coins)
    device = backend.device
    guards = [guarded_output((bs * nodes,), torch.int32, device), guarded_output((bs, steps + 1), torch.int32, device),
              guarded_output((bs,), torch.int32, device), guarded_output((bs,), torch.int32, device)]
    out = Verdict(*(guard.tensor for guard in guards))
    inputs = (tree_to(tree, device), candidates.to(device), embedded_input(draft, device, margin_value=1.0),
              embedded_input(target, device, margin_value=1.0), coins.to(device), final_coins.to(device))
    with no_host_sync(device):
        backend.verify_tree_sampling(*inputs, out=out)
    for guard, field in zip(guards, VERDICT_FIELDS):
        guard.assert_intact(field)
    assert_same_verdict(out, expected)
    empty = torch.zeros(0, nodes, dtype=torch.int64, device=device)
    empty_tree = dataclasses.replace(tree_to(tree, device), retrieve_index=empty, retrieve_next_token=empty, retrieve_next_sibling=empty)
    verdict = backend.verify_tree_sampling(empty_tree, empty, torch.zeros(0, nodes, vocab, device=device), torch.zeros(0, nodes, vocab, device=device),
                                           torch.zeros(0, nodes, device=device), torch.zeros(0, device=device))
    assert verdict.predict.shape == (0,) and verdict.accept_index.shape == (0, steps + 1) and verdict.num_correct.shape == (0,)


@pytest.mark.spec_hal_op("verify_tree_sampling")
def test_verify_tree_sampling_distribution(backend):
    """Lossless: a root with three children drawn i.i.d. from q (duplicates happen), each with
    one child drawn from its own q row: the first emitted token follows p_root and, given it,
    the second follows p at that node (the second token after first token 3). Power: the first
    token as CHI_SQUARE_LIMIT with TREE_DRAWS = 50,000 (a 0.01 shift between two outcomes of 1/8
    gives noncentrality 80, rejected with probability > 0.99); the conditional check sees about
    5,000 rounds, so it catches shifts of about 0.03 (noncentrality ~70)."""
    vocab = 8
    generator = torch.Generator().manual_seed(99)
    q_root = torch.tensor([0.3, 0.05, 0.2, 0.1, 0.05, 0.1, 0.15, 0.05])
    p_root = torch.tensor([0.1, 0.2, 0.05, 0.25, 0.1, 0.05, 0.15, 0.1])
    draws = TREE_DRAWS
    tree = replicate(tree_from_parents([[-1, 0, 0, 0, 1, 2, 3]], num_steps=2), draws)
    first = torch.multinomial(q_root, 3 * draws, replacement=True, generator=generator).view(draws, 3)
    q_child = torch.softmax(torch.randn(vocab, vocab, generator=generator), dim=1)  # q at a node whose token is t
    p_child = torch.softmax(torch.randn(vocab, vocab, generator=generator), dim=1)
    second = torch.multinomial(q_child[first.reshape(-1)], 1, generator=generator).view(draws, 3)
    candidates = torch.cat([torch.zeros(draws, 1, dtype=torch.int64), first, second], dim=1)
    tokens = candidates.clone()
    draft = torch.cat([q_root.expand(draws, 1, vocab), q_child[tokens[:, 1:4]], torch.full((draws, 3, vocab), 1.0 / vocab)], dim=1)
    target = torch.cat([p_root.expand(draws, 1, vocab), p_child[tokens[:, 1:4]], torch.full((draws, 3, vocab), 1.0 / vocab)], dim=1)
    coins, final_coins = torch.rand(draws, 7, generator=generator), torch.rand(draws, generator=generator)
    device = backend.device
    verdict = backend.verify_tree_sampling(tree_to(tree, device), *_to(device, candidates, draft.contiguous(), target.contiguous(),
                                                                        coins, final_coins))
    predict = verdict.predict.cpu().view(draws, 7)
    emitted_first = predict[:, 0].long()
    assert _chi_square(emitted_first, p_root) < CHI_SQUARE_LIMIT
    # Second token given the first = 3: the path went to a child with token 3, or the bonus was 3
    # (then no second token exists this round); among rounds that accepted a first child with
    # token 3, the next emitted token must follow p_child[3].
    path = verdict.accept_index.cpu() - (torch.arange(draws) * 7)[:, None]
    went = (verdict.num_correct.cpu() >= 1) & (emitted_first == 3)
    second_tokens = predict[went].gather(1, path[went][:, 1:2].long())[:, 0].long()
    assert _chi_square(second_tokens, p_child[3]) < CHI_SQUARE_LIMIT
