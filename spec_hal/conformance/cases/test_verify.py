"""Conformance of family ``verify`` against the reference and hand-derived goldens.
Semantics: spec_hal/verify.py (P6, P7, P8, P20)."""
from __future__ import annotations

import pytest
import torch

import spec_hal.verify as reference
from spec_hal import error_flag
from spec_hal.conformance.guards import assert_rejects, embedded_input, guarded_output, no_host_sync
from spec_hal.conformance.inputs import logits_rows
from spec_hal.conformance.trees import golden_tree, random_tree, replicate, tree_from_parents, tree_to
from spec_hal.conformance.verdicts import VERDICT_FIELDS, assert_same_verdict
from spec_hal.types import Verdict

COIN_TOP = 1.0 - 2.0**-24
# Statistical tests: chi-square over the V = 8 outcomes (7 degrees of freedom) must stay below
# 30, the 0.99995 quantile; seeded, so the outcome is deterministic.
CHI_SQUARE_LIMIT = 30.0
DRAWS = 100_000


# ----------------------------------------------------------------------------------------------
# helpers


def _guarded_verdict(bs: int, nodes: int, width: int, device):
    guards = [guarded_output((bs * nodes,), torch.int32, device), guarded_output((bs, width), torch.int32, device),
              guarded_output((bs,), torch.int32, device), guarded_output((bs,), torch.int32, device)]
    return guards, Verdict(*(guard.tensor for guard in guards))


def _call(backend, op: str, *args, nodes: int, width: int, **kwargs) -> Verdict:
    """Run a verify op with poisoned, canary-guarded ``out=`` buffers, under the no-sync guard."""
    bs = args[1].shape[0] if op != "verify_chain_sampling" else args[0].shape[0]
    device = backend.device
    guards, out = _guarded_verdict(bs, nodes, width, device)
    with no_host_sync(device):
        returned = getattr(backend, op)(*args, out=out, **kwargs)
    assert returned.predict.data_ptr() == out.predict.data_ptr(), "out= buffers were not used"
    for guard, field in zip(guards, VERDICT_FIELDS):
        guard.assert_intact(field)
    return Verdict(*(getattr(out, field).cpu() for field in VERDICT_FIELDS))


def _check_walk_invariants(tree, candidates, verdict: Verdict) -> None:
    """P6 invariants: root first; each entry a child of the previous; -1 after num_correct;
    predict at path node k is the candidate of node k+1; -1 off the path; accept_lens = n + 1."""
    bs, nodes = candidates.shape
    next_token, next_sibling = tree.retrieve_next_token.cpu(), tree.retrieve_next_sibling.cpu()
    predict = verdict.predict.view(bs, nodes)
    for b in range(bs):
        n = int(verdict.num_correct[b])
        assert 0 <= n <= tree.num_steps and int(verdict.accept_lens[b]) == n + 1
        path = verdict.accept_index[b].tolist()
        assert path[0] == b * nodes and all(entry == -1 for entry in path[n + 1:])
        local = [entry - b * nodes for entry in path[:n + 1]]
        assert all(0 <= node < nodes for node in local)
        for parent, child in zip(local, local[1:]):
            children, cur = [], int(next_token[b, parent])
            while cur != -1:
                children.append(cur)
                cur = int(next_sibling[b, cur])
            assert child in children, f"request {b}: node {child} is not a child of {parent}"
            assert int(predict[b, parent]) == int(candidates[b, child])
        off_path = [j for j in range(nodes) if j not in local]
        assert (predict[b, off_path] == -1).all(), f"request {b}: a row off the accepted path is not -1"
        assert int(predict[b, local[-1]]) >= 0


def _peaked_probs(rows: int, vocab: int, *, seed: int, favourites: torch.Tensor) -> torch.Tensor:
    """(rows, V) float32 distributions with much of the mass on ``favourites`` (rows,), so that
    random trees accept often; every 5th row is uniform-ish noise."""
    generator = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(rows, vocab, generator=generator) * 2, dim=1)
    boost = torch.zeros(rows, vocab)
    boost[torch.arange(rows), favourites.clamp(0, vocab - 1)] = 2.0
    probs = probs + boost * (torch.arange(rows) % 5 != 0).float()[:, None]
    return (probs / probs.sum(dim=1, keepdim=True)).float()


def _first_child_tokens(tree, candidates) -> torch.Tensor:
    """(bs*N,) the token of each node's first child (its own token where it has none): rows
    peaked there make the walk accept often."""
    first = tree.retrieve_next_token.clamp(min=0)
    return candidates.gather(1, first).reshape(-1)


# ----------------------------------------------------------------------------------------------
# goldens (P6, P7, P8)


def _golden_target_ids() -> torch.Tensor:
    ids = torch.full((12,), 18)
    for node, token in ((0, 3), (3, 4), (4, 5), (6, 11), (10, 12)):
        ids[node] = token
    return ids


GOLDEN_PREDICT = [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]
GOLDEN_ACCEPT = [[0, 3, 4, 5], [6, 10, 11, -1]]


@pytest.mark.spec_hal_op("verify_greedy")
@pytest.mark.parametrize("form", ("flat_ids", "matrix_ids_int32", "logits_fp32", "logits_bf16", "logits_batch_first"))
def test_verify_greedy_golden(backend, form):
    tree, candidates = golden_tree()
    ids = _golden_target_ids()
    if form == "flat_ids":
        target = ids
    elif form == "matrix_ids_int32":
        target = ids.view(2, 6).to(torch.int32)
    else:
        target = torch.ones(12, 20)
        target[torch.arange(12), ids] = 10.0
        target = target.to(torch.bfloat16 if form == "logits_bf16" else torch.float32)
        if form == "logits_batch_first":  # (bs, N, V), as verify_sampling takes probabilities
            target = target.view(2, 6, 20)
    verdict = _call(backend, "verify_greedy", tree_to(tree, backend.device), candidates.to(backend.device), target.to(backend.device),
                    nodes=6, width=4)
    assert verdict.predict.tolist() == GOLDEN_PREDICT
    assert verdict.accept_index.tolist() == GOLDEN_ACCEPT
    assert verdict.num_correct.tolist() == [3, 2] and verdict.accept_lens.tolist() == [4, 3]


@pytest.mark.spec_hal_op("verify_sampling")
@pytest.mark.parametrize("thresholds", ((1.0, 1.0), (0.0, 0.0)))
def test_verify_sampling_golden(backend, thresholds):
    """P7: logits 10 on the greedy tokens, 1 elsewhere, T = 0.01: (1, 1) equals greedy; (0, 0)
    always accepts the first child."""
    tree, candidates = golden_tree()
    logits = torch.ones(12, 20)
    logits[torch.arange(12), _golden_target_ids()] = 10.0
    probs = torch.softmax(logits / 0.01, dim=1)
    coins = torch.rand(2, 6, generator=torch.Generator().manual_seed(0))
    final_coins = torch.tensor([0.3, 0.9])
    device = backend.device
    verdict = _call(backend, "verify_sampling", tree_to(tree, device), candidates.to(device), probs.view(2, 6, 20).to(device),
                    coins.to(device), final_coins.to(device), threshold_single=thresholds[0], threshold_acc=thresholds[1], nodes=6, width=4)
    if thresholds == (1.0, 1.0):
        assert verdict.predict.tolist() == GOLDEN_PREDICT and verdict.accept_index.tolist() == GOLDEN_ACCEPT
        assert verdict.num_correct.tolist() == [3, 2]
    else:
        assert verdict.predict.tolist() == [1, 2, 18, -1, -1, -1, 11, -1, -1, -1, 12, 18]
        assert verdict.accept_index.tolist() == [[0, 1, 2, -1], [6, 10, 11, -1]]
        assert verdict.num_correct.tolist() == [2, 2]


def _chain_golden_inputs():
    """x = [1, 2]; q_0 = [0, .5, .5, 0], q_1 uniform; p_0 uniform, p_1 one-hot on 2, p_2 one-hot on 0.
    Step 1 accepts iff coin * 0.5 < 0.25 (coin < 0.5); step 2 always (coin * 0.25 < 1)."""
    draft_ids = torch.tensor([[1, 2]] * 4)
    q = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4]).expand(4, 2, 4).contiguous()
    p = torch.tensor([[0.25] * 4, [0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]).expand(4, 3, 4).contiguous()
    coins = torch.tensor([[0.4, 0.9], [0.5, 0.0], [0.6, 0.1], [COIN_TOP, 0.0]])
    # Rejected at step 1: residual max(0, p_0 - q_0) = [.25, 0, 0, .25], quantised total 2^39;
    # threshold floor(u * 2^39): u = 0.5 lands exactly on the first CDF step, so index 3 (strict).
    final_coins = torch.tensor([0.7, 0.5, 0.49, 0.0])
    return draft_ids, q, p, coins, final_coins


@pytest.mark.spec_hal_op("verify_chain_sampling")
def test_verify_chain_sampling_golden(backend):
    device = backend.device
    verdict = _call(backend, "verify_chain_sampling", *(t.to(device) for t in _chain_golden_inputs()), nodes=3, width=3)
    assert verdict.num_correct.tolist() == [2, 0, 0, 0]
    assert verdict.predict.tolist() == [1, 2, 0, 3, -1, -1, 0, -1, -1, 0, -1, -1]
    assert verdict.accept_index.tolist() == [[0, 1, 2], [3, -1, -1], [6, -1, -1], [9, -1, -1]]


@pytest.mark.spec_hal_op("verify_chain_sampling")
@pytest.mark.parametrize("with_draft_probs", (True, False))
def test_verify_chain_sampling_passed_counts(backend, with_draft_probs):
    """``passed_counts``: every step's own test, past the first rejection too, on dirty inputs (NaN,
    negative and > 1 probabilities, coins outside [0, 1), ids -1 and >= V); the verdict is unchanged."""
    bs, steps, vocab = 6, 4, 9
    generator = torch.Generator().manual_seed(11)
    q = torch.rand(bs, steps, vocab, generator=generator) * 1.4 - 0.2
    p = torch.rand(bs, steps + 1, vocab, generator=generator) * 1.4 - 0.2
    q[0, 1], p[1, 2] = float("nan"), float("nan")
    draft_ids = torch.randint(0, vocab, (bs, steps), generator=generator)
    draft_ids[2, 0], draft_ids[3, 1] = -1, vocab
    coins = torch.rand(bs, steps, generator=generator) * 1.2 - 0.1
    coins[4, 2] = float("nan")
    final_coins = torch.rand(bs, generator=generator)
    q = q if with_draft_probs else None
    device = backend.device
    guard = guarded_output((bs,), torch.int32, device)
    args = (draft_ids.to(device), None if q is None else q.to(device), p.to(device), coins.to(device), final_coins.to(device))
    verdict = _call(backend, "verify_chain_sampling", *args, nodes=steps + 1, width=steps + 1, passed_counts=guard.tensor)
    guard.assert_intact("passed_counts")
    expected = torch.zeros(bs, dtype=torch.int32)
    expected_verdict = reference.verify_chain_sampling(draft_ids, q, p, coins, final_coins, passed_counts=expected)
    assert_same_verdict(verdict, expected_verdict)
    assert guard.tensor.cpu().tolist() == expected.tolist()
    assert_same_verdict(verdict, reference.verify_chain_sampling(draft_ids, q, p, coins, final_coins))
    error_flag.pending_errors()  # the id V recorded by both calls: not this case's subject


@pytest.mark.spec_hal_op("verify_chain")
def test_verify_chain_golden(backend):
    candidates = torch.tensor([[5, 1, 2, 3], [5, 1, 9, 3], [5, 7, 2, 3]])
    target = torch.tensor([[1, 2, 7, 8], [1, 2, 3, 4], [1, 2, 3, 4]])
    num_correct, bonus = backend.verify_chain(candidates.to(backend.device), target.to(backend.device))
    assert num_correct.cpu().tolist() == [2, 1, 0] and num_correct.dtype == torch.int32
    assert bonus.cpu().tolist() == [7, 2, 1] and bonus.dtype == torch.int64


# ----------------------------------------------------------------------------------------------
# random trees against the reference


TREE_SHAPES = ((3, 4), (5, 8), (3, 16), (5, 32), (1, 5), (0, 3))  # (S, N); N = 32 >> S + 1 (bug 4)


@pytest.mark.spec_hal_op("verify_greedy")
@pytest.mark.parametrize("steps, nodes", TREE_SHAPES)
@pytest.mark.parametrize("bs", (1, 3, 17))
@pytest.mark.parametrize("id_dtype", (torch.int64, torch.int32))
def test_verify_greedy_random_trees(backend, steps, nodes, bs, id_dtype):
    tree, candidates = random_tree(bs, nodes, steps, seed=steps * 1000 + nodes * 10 + bs, vocab=3)
    target = torch.randint(0, 3, (bs * nodes,), generator=torch.Generator().manual_seed(bs + nodes)).to(id_dtype)
    device = backend.device
    verdict = _call(backend, "verify_greedy", tree_to(tree, device), candidates.to(id_dtype).to(device), target.to(device),
                    nodes=nodes, width=steps + 1)
    assert_same_verdict(verdict, reference.verify_greedy(tree, candidates, target))
    _check_walk_invariants(tree, candidates, verdict)


def _grid_logits():
    for vocab in (1, 127, 4099, 32003, 151936):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            marks = (pytest.mark.spec_hal_full,) if vocab == 151936 and dtype != torch.float32 else ()
            yield pytest.param(vocab, dtype, marks=marks, id=f"V{vocab}-{str(dtype)[6:]}")


@pytest.mark.spec_hal_op("verify_greedy")
@pytest.mark.parametrize("vocab, dtype", list(_grid_logits()))
def test_verify_greedy_fused_argmax(backend, vocab, dtype):
    """Logits input: ties, NaN/-inf rows, +inf pairs and a max in the unmasked tail (from
    inputs.logits_rows); margins of huge logits catch out-of-bounds reads."""
    bs, nodes, steps = 3, 8, 4
    tree, candidates = random_tree(bs, nodes, steps, seed=vocab, vocab=min(vocab, 3))
    logits_cpu = logits_rows(bs * nodes, vocab, seed=vocab + 1, dtype=dtype)
    # Make half of the rows predict a small id, so that some drafts are accepted.
    favourite_rows = torch.arange(0, bs * nodes, 2)
    logits_cpu[favourite_rows, torch.remainder(favourite_rows, min(vocab, 3))] = 1.0e4
    logits = embedded_input(logits_cpu, backend.device, margin_value=3.0e4)
    device = backend.device
    verdict = _call(backend, "verify_greedy", tree_to(tree, device), candidates.to(device), logits, nodes=nodes, width=steps + 1)
    expected = reference.verify_greedy(tree, candidates, logits_cpu)
    assert_same_verdict(verdict, expected)
    _check_walk_invariants(tree, candidates, verdict)
    on_path = verdict.predict[verdict.predict >= 0]
    assert (on_path < vocab).all(), "an argmax id is outside [0, V)"


@pytest.mark.spec_hal_op("verify_greedy")
def test_verify_greedy_argmax_ties_go_to_the_lower_id(backend):
    """The cut between accept and reject on a tie: the target's logits tie between tokens 2 and 1
    at the root, so the child with token 1 is accepted and the child with token 2 is not."""
    tree = tree_from_parents([[-1, 0, 0]], num_steps=1)
    candidates = torch.tensor([[0, 2, 1]])
    logits = torch.tensor([[0.0, 5.0, 5.0, float("nan")], [0.0] * 4, [float("nan")] * 4])
    verdict = _call(backend, "verify_greedy", tree_to(tree, backend.device), candidates.to(backend.device), logits.to(backend.device),
                    nodes=3, width=2)
    assert verdict.accept_index.tolist() == [[0, 2]]
    assert verdict.predict.tolist() == [1, -1, 0], "ties go to the lower id; an all-NaN row predicts id 0"


SAMPLING_GRID = [(steps, nodes, bs, vocab) for steps, nodes in TREE_SHAPES for bs in (1, 5) for vocab in (8, 1000)] + \
    [(3, 8, 3, 32003), (5, 32, 2, 151936)]


@pytest.mark.spec_hal_op("verify_sampling")
@pytest.mark.parametrize("steps, nodes, bs, vocab", SAMPLING_GRID)
@pytest.mark.parametrize("thresholds", ((1.0, 1.0), (0.4, 0.7), (0.0, 0.0)))
def test_verify_sampling_random_trees(backend, steps, nodes, bs, vocab, thresholds):
    """Exact given coins; probabilities passed as an embedded (bs*N, V) view whose margins hold
    probability 1 (an out-of-bounds read changes the result)."""
    seed = steps * 7919 + nodes * 31 + bs * 7 + vocab
    tree, candidates = random_tree(bs, nodes, steps, seed=seed, vocab=4)
    generator = torch.Generator().manual_seed(seed)
    probs_cpu = _peaked_probs(bs * nodes, vocab, seed=seed, favourites=_first_child_tokens(tree, candidates))
    coins = torch.rand(bs, nodes, generator=generator)
    final_coins = torch.rand(bs, generator=generator)
    device = backend.device
    probs = embedded_input(probs_cpu, device, margin_value=1.0)
    verdict = _call(backend, "verify_sampling", tree_to(tree, device), candidates.to(device), probs, coins.to(device),
                    final_coins.to(device), threshold_single=thresholds[0], threshold_acc=thresholds[1], nodes=nodes, width=steps + 1)
    expected = reference.verify_sampling(tree, candidates, probs_cpu, coins, final_coins, threshold_single=thresholds[0],
                                         threshold_acc=thresholds[1])
    assert_same_verdict(verdict, expected)
    _check_walk_invariants(tree, candidates, verdict)


@pytest.mark.spec_hal_op("verify_sampling")
@pytest.mark.parametrize("coin_kind", ("zero", "top", "boundary", "one_and_nan"))
def test_verify_sampling_edge_coins(backend, coin_kind):
    """Dyadic probabilities put the CDF steps at exact floats: root children with p = 1/4, 1/4
    (a duplicate token), 1/8; the rest of the root row on tokens 5..7 (1/8 each), token 4 zero."""
    tree = tree_from_parents([[-1, 0, 0, 0, 1]] * 4, num_steps=2)
    candidates = torch.tensor([[9, 1, 1, 2, 3]] * 4)
    root = torch.tensor([0.0, 0.25, 0.125, 0.125, 0.0, 0.125, 0.125, 0.25])
    probs = torch.stack([root, torch.full((8,), 0.125), root, root, root]).expand(4, 5, 8).contiguous()
    coin_values = {"zero": [0.0, 0.0, 0.0, 0.0], "top": [COIN_TOP] * 4, "boundary": [0.25, 0.375, 0.125, 0.0],
                   "one_and_nan": [1.0, float("nan"), -0.5, 2.0]}[coin_kind]
    coins = torch.tensor(coin_values)[:, None].expand(4, 5).contiguous()
    final_coins = torch.tensor(coin_values)
    device = backend.device
    verdict = _call(backend, "verify_sampling", tree_to(tree, device), candidates.to(device), probs.to(device), coins.to(device),
                    final_coins.to(device), nodes=5, width=3)
    assert_same_verdict(verdict, reference.verify_sampling(tree, candidates, probs, coins, final_coins))
    if coin_kind == "boundary":
        # coin 0.25: not < acc 0.25 after node 1; node 2 repeats token 1 (p counts 0); node 3 takes
        # acc to 0.375 > 0.25: accepted. Coin 0.375 == acc: rejected everywhere, residual sampled.
        assert verdict.accept_index[0].tolist() == [0, 3, -1]
        assert verdict.num_correct[1].item() == 0
    if coin_kind == "zero":
        assert verdict.accept_index[:, 1].tolist() == [1, 6, 11, 16], "a zero coin accepts the first child with p > 0"


@pytest.mark.spec_hal_op("verify_sampling")
def test_verify_sampling_nan_and_zero_rows(backend):
    """A NaN root row accepts nothing (p counts 0) and has no mass: the final id is 0. A row
    whose only mass sits on the rejected candidate falls back to the unmodified row."""
    tree = tree_from_parents([[-1, 0, 0]] * 3, num_steps=1)
    candidates = torch.tensor([[0, 3, 5], [0, 3, 5], [0, 6, 5]])
    probs = torch.zeros(3, 3, 8)
    probs[0, 0] = float("nan")
    probs[1, 0, 3] = 1.0  # coin top: acc 1.0 > coin -> accepted; checked against the reference
    probs[2, 0, 6] = 0.5
    probs[2, 0, 5] = float("nan")
    coins = torch.full((3, 3), COIN_TOP)
    final_coins = torch.tensor([0.5, 0.5, 0.5])
    device = backend.device
    verdict = _call(backend, "verify_sampling", tree_to(tree, device), candidates.to(device), probs.to(device), coins.to(device),
                    final_coins.to(device), nodes=3, width=2)
    assert_same_verdict(verdict, reference.verify_sampling(tree, candidates, probs, coins, final_coins))
    assert verdict.predict[0].item() == 0 and verdict.num_correct[0].item() == 0
    assert verdict.predict[6].item() == 6, "no residual mass: the unmodified target row is sampled"


@pytest.mark.spec_hal_op("verify_sampling")
def test_verify_sampling_does_not_mutate_inputs(backend):
    tree, candidates = random_tree(4, 8, 3, seed=5, vocab=4)
    probs = _peaked_probs(32, 16, seed=5, favourites=candidates.reshape(-1))
    coins, final_coins = torch.rand(4, 8), torch.rand(4)
    device = backend.device
    inputs = [candidates.to(device), probs.to(device), coins.to(device), final_coins.to(device)]
    device_tree = tree_to(tree, device)
    before = [t.clone() for t in inputs] + [device_tree.retrieve_next_token.clone(), device_tree.retrieve_next_sibling.clone()]
    backend.verify_sampling(device_tree, *inputs, threshold_single=0.5, threshold_acc=0.9)
    after = inputs + [device_tree.retrieve_next_token, device_tree.retrieve_next_sibling]
    for old, new in zip(before, after):
        assert torch.equal(old, new), "verify_sampling changed one of its inputs"


@pytest.mark.spec_hal_op("verify_chain_sampling")
@pytest.mark.parametrize("steps, bs, vocab", ((1, 3, 8), (3, 5, 8), (5, 4, 1000), (3, 2, 32003), (0, 2, 8)))
def test_verify_chain_sampling_random(backend, steps, bs, vocab):
    generator = torch.Generator().manual_seed(steps * 100 + vocab)
    q = _peaked_probs(bs * steps, vocab, seed=steps, favourites=torch.randint(0, 4, (bs * steps,), generator=generator))
    p = _peaked_probs(bs * (steps + 1), vocab, seed=steps + 7, favourites=torch.randint(0, 4, (bs * (steps + 1),), generator=generator))
    draft_ids = torch.randint(0, 4, (bs, steps), generator=generator)
    coins, final_coins = torch.rand(bs, steps, generator=generator), torch.rand(bs, generator=generator)
    device = backend.device
    before = p.clone(), q.clone()
    verdict = _call(backend, "verify_chain_sampling", draft_ids.to(device), embedded_input(q, device, margin_value=1.0) if steps else q.to(device),
                    embedded_input(p, device, margin_value=1.0), coins.to(device), final_coins.to(device), nodes=steps + 1, width=steps + 1)
    assert_same_verdict(verdict, reference.verify_chain_sampling(draft_ids, q, p, coins, final_coins))
    assert torch.equal(before[0], p) and torch.equal(before[1], q)


@pytest.mark.spec_hal_op("verify_chain")
@pytest.mark.parametrize("width, bs, form", ((4, 5, "ids"), (1, 3, "ids"), (16, 7, "ids"), (6, 4, "logits")))
def test_verify_chain_random_and_equals_greedy_on_a_chain(backend, width, bs, form):
    """P20 against the reference, and its invariant: it equals verify_greedy on a chain tree."""
    generator = torch.Generator().manual_seed(width * 10 + bs)
    candidates = torch.randint(0, 2, (bs, width), generator=generator)
    target = torch.randint(0, 2, (bs, width), generator=generator)
    if form == "logits":
        target = logits_rows(bs * width, 4099, seed=width, dtype=torch.float32)
        target[torch.arange(0, bs * width, 2), 1] = 1e4
    device = backend.device
    num_correct, bonus = backend.verify_chain(candidates.to(device), target.to(device))
    expected = reference.verify_chain(candidates, target)
    assert torch.equal(num_correct.cpu(), expected[0]) and torch.equal(bonus.cpu(), expected[1])
    chain = tree_from_parents([[j - 1 for j in range(width)]] * bs, num_steps=width - 1)
    greedy = reference.verify_greedy(chain, candidates, target)
    assert torch.equal(num_correct.cpu(), greedy.num_correct)
    assert torch.equal(bonus.cpu(), greedy.predict.view(bs, width).gather(1, greedy.num_correct.long()[:, None])[:, 0].long())


# ----------------------------------------------------------------------------------------------
# statistical tests: the emitted distribution equals the target's


def _chi_square(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() * samples.numel()
    assert (counts[expected == 0] == 0).all(), "a token with zero target probability was emitted"
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


TARGET_ROOT = torch.tensor([0.05, 0.3, 0.02, 0.13, 0.0, 0.2, 0.1, 0.2])


@pytest.mark.spec_hal_op("verify_sampling")
def test_verify_sampling_preserves_the_target_distribution(backend):
    """10^5 requests on one tree (root children tokens 1, 3, 5 with 3's child token 6): the first
    emitted token follows the root's target row, and the second (after token 3) node 2's row."""
    tree = replicate(tree_from_parents([[-1, 0, 0, 0, 2, 2]], num_steps=2), DRAWS)
    candidates = torch.tensor([[0, 1, 3, 5, 6, 0]]).expand(DRAWS, 6).contiguous()
    after_3 = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.3, 0.1])
    rows = torch.stack([TARGET_ROOT, torch.full((8,), 0.125), after_3, torch.full((8,), 0.125), torch.full((8,), 0.125),
                        torch.full((8,), 0.125)])
    probs = rows[None].expand(DRAWS, 6, 8).contiguous()
    generator = torch.Generator().manual_seed(2024)
    coins, final_coins = torch.rand(DRAWS, 6, generator=generator), torch.rand(DRAWS, generator=generator)
    device = backend.device
    inputs = (tree_to(tree, device), candidates.to(device), probs.to(device), coins.to(device), final_coins.to(device))
    with no_host_sync(device):
        verdict = backend.verify_sampling(*inputs)
    predict = verdict.predict.cpu().view(DRAWS, 6).long()
    first = predict[:, 0]
    assert _chi_square(first, TARGET_ROOT) < CHI_SQUARE_LIMIT
    took_3 = verdict.accept_index.cpu()[:, 1] == torch.arange(DRAWS) * 6 + 2
    assert _chi_square(predict[took_3, 2], after_3) < CHI_SQUARE_LIMIT


@pytest.mark.spec_hal_op("verify_chain_sampling")
def test_verify_chain_sampling_preserves_the_target_distribution(backend):
    """10^5 requests drafting x_1 ~ q (deliberately unlike p): the first emitted token follows p_0."""
    q_row = torch.tensor([0.3, 0.05, 0.05, 0.3, 0.1, 0.1, 0.05, 0.05])
    generator = torch.Generator().manual_seed(77)
    draft_ids = torch.multinomial(q_row, DRAWS, replacement=True, generator=generator)[:, None]
    q = q_row[None, None].expand(DRAWS, 1, 8).contiguous()
    p = torch.stack([TARGET_ROOT, torch.full((8,), 0.125)])[None].expand(DRAWS, 2, 8).contiguous()
    coins, final_coins = torch.rand(DRAWS, 1, generator=generator), torch.rand(DRAWS, generator=generator)
    device = backend.device
    inputs = (draft_ids.to(device), q.to(device), p.to(device), coins.to(device), final_coins.to(device))
    with no_host_sync(device):
        verdict = backend.verify_chain_sampling(*inputs)
    first = verdict.predict.cpu().view(DRAWS, 2)[:, 0].long()
    assert _chi_square(first, TARGET_ROOT) < CHI_SQUARE_LIMIT


# ----------------------------------------------------------------------------------------------
# batch size 0 and invalid inputs


@pytest.mark.spec_hal_op("verify_greedy")
def test_verify_ops_accept_batch_size_zero(backend):
    device = backend.device
    tree = tree_to(tree_from_parents([], num_steps=3), device)
    tree = type(tree)(tree.tokens, tree.positions, torch.zeros(0, 8, dtype=torch.int64, device=device),
                      torch.zeros(0, 8, dtype=torch.int64, device=device), torch.zeros(0, 8, dtype=torch.int64, device=device), None, "qlen", 3)
    empty_ids = torch.zeros(0, 8, dtype=torch.int64, device=device)
    for verdict in (backend.verify_greedy(tree, empty_ids, torch.zeros(0, dtype=torch.int64, device=device)),
                    backend.verify_greedy(tree, empty_ids, torch.zeros(0, 100, device=device)),
                    backend.verify_sampling(tree, empty_ids, torch.zeros(0, 8, 100, device=device), torch.zeros(0, 8, device=device),
                                            torch.zeros(0, device=device))):
        assert verdict.predict.shape == (0,) and verdict.accept_index.shape == (0, 4)
        assert verdict.num_correct.shape == (0,) and verdict.accept_lens.shape == (0,)
    chain = backend.verify_chain_sampling(torch.zeros(0, 3, dtype=torch.int64, device=device), torch.zeros(0, 3, 10, device=device),
                                          torch.zeros(0, 4, 10, device=device), torch.zeros(0, 3, device=device), torch.zeros(0, device=device))
    assert chain.predict.shape == (0,) and chain.accept_index.shape == (0, 4)
    num_correct, bonus = backend.verify_chain(torch.zeros(0, 4, dtype=torch.int64, device=device), torch.zeros(0, 4, dtype=torch.int64, device=device))
    assert num_correct.shape == (0,) and bonus.shape == (0,)


def _invalid_calls(device):
    tree = tree_to(golden_tree()[0], device)
    cand = golden_tree()[1].to(device)
    ids = torch.zeros(12, dtype=torch.int64, device=device)
    probs = torch.zeros(2, 6, 10, device=device)
    coins, final = torch.zeros(2, 6, device=device), torch.zeros(2, device=device)
    bad_tree = type(tree)(tree.tokens, tree.positions, tree.retrieve_index, tree.retrieve_next_token[:, :5], tree.retrieve_next_sibling,
                          None, "qlen", 3)
    chain_ids, q, p = torch.zeros(2, 3, dtype=torch.int64, device=device), torch.zeros(2, 3, 10, device=device), torch.zeros(2, 4, 10, device=device)
    return [
        ("tree", lambda b: b.verify_greedy(cand, cand, ids)),
        ("tree.retrieve_next_token", lambda b: b.verify_greedy(bad_tree, cand, ids)),
        ("candidates", lambda b: b.verify_greedy(tree, cand[:, :5], ids)),
        ("candidates", lambda b: b.verify_greedy(tree, cand.float(), ids)),
        ("target_predict", lambda b: b.verify_greedy(tree, cand, ids[:11])),
        ("target_predict", lambda b: b.verify_greedy(tree, cand, torch.zeros(11, 5, device=device))),
        ("target_predict", lambda b: b.verify_greedy(tree, cand, ids.to("meta"))),
        ("out", lambda b: b.verify_greedy(tree, cand, ids, out=(ids, ids))),
        ("target_probs", lambda b: b.verify_sampling(tree, cand, probs.double(), coins, final)),
        ("target_probs", lambda b: b.verify_sampling(tree, cand, probs[:, :5], coins, final)),
        ("coins", lambda b: b.verify_sampling(tree, cand, probs, coins[:, :5], final)),
        ("final_coins", lambda b: b.verify_sampling(tree, cand, probs, coins, final.double())),
        ("threshold_single", lambda b: b.verify_sampling(tree, cand, probs, coins, final, threshold_single=1.5)),
        ("threshold_acc", lambda b: b.verify_sampling(tree, cand, probs, coins, final, threshold_acc=-0.1)),
        ("candidates", lambda b: b.verify_chain(torch.zeros(2, 0, dtype=torch.int64, device=device), ids)),
        ("target_predict", lambda b: b.verify_chain(cand, ids[:6])),
        ("draft_probs", lambda b: b.verify_chain_sampling(chain_ids, q[:, :2], p, coins[:, :3], final)),
        ("target_probs", lambda b: b.verify_chain_sampling(chain_ids, q, p[:, :3], coins[:, :3], final)),
        ("target_probs", lambda b: b.verify_chain_sampling(chain_ids, q, torch.zeros(2, 4, 11, device=device), coins[:, :3], final)),
        ("coins", lambda b: b.verify_chain_sampling(chain_ids, q, p, coins, final)),
    ]


@pytest.mark.spec_hal_op("verify_greedy")
@pytest.mark.parametrize("case", range(20))
def test_verify_ops_reject_bad_input(backend, case):
    assert_rejects(backend, *_invalid_calls(backend.device)[case])


# ----------------------------------------------------------------------------------------------
# upstream bug 4: K > 1, N much larger than S + 1, bs > 1


@pytest.mark.spec_hal_op("verify_sampling")
@pytest.mark.parametrize("op", ("verify_greedy", "verify_sampling"))
def test_verify_wide_tree_bug4(backend, op):
    """N = 32 nodes, accept width S + 1 = 4, bs = 5: accept_index is (bs, S+1) (not N wide),
    guarded by canaries; each request's bonus sits in its own block at accept_index[b, n]."""
    bs, nodes, steps, vocab = 5, 32, 3, 64
    tree, candidates = random_tree(bs, nodes, steps, seed=4, vocab=3, chain_bias=0.9)
    device = backend.device
    if op == "verify_greedy":
        target = torch.randint(0, 3, (bs * nodes,), generator=torch.Generator().manual_seed(4))
        args = (target.to(device),)
        expected = reference.verify_greedy(tree, candidates, target)
    else:
        probs = _peaked_probs(bs * nodes, vocab, seed=4, favourites=_first_child_tokens(tree, candidates))
        coin_source = torch.Generator().manual_seed(4)  # seeded: the "accepts some drafts" check must not depend on test order
        coins, final_coins = torch.rand(bs, nodes, generator=coin_source), torch.rand(bs, generator=coin_source)
        args = (embedded_input(probs, device, margin_value=1.0), coins.to(device), final_coins.to(device))
        expected = reference.verify_sampling(tree, candidates, probs, coins, final_coins)
    verdict = _call(backend, op, tree_to(tree, device), candidates.to(device), *args, nodes=nodes, width=steps + 1)
    assert_same_verdict(verdict, expected)
    assert verdict.accept_index.shape == (bs, steps + 1)
    for b in range(bs):
        n = int(verdict.num_correct[b])
        bonus_node = int(verdict.accept_index[b, n])
        assert b * nodes <= bonus_node < (b + 1) * nodes, "the bonus is outside the request's own block"
        assert int(verdict.predict[bonus_node]) >= 0
    assert (verdict.num_correct > 0).any(), "the case must accept some drafts to mean anything"
