"""The verify conformance cases fail on deliberately wrong providers (a case that cannot fail
proves nothing). Each broken provider wraps or re-implements the reference with one bug."""
import pytest
import torch

import spec_hal.verify as reference
from spec_hal.backend import Backend, Provider
from spec_hal.conformance import guards
from spec_hal.conformance.cases import test_verify as cases
from spec_hal.conformance.verdicts import VERDICT_FIELDS
from spec_hal.selection import get_backend
from spec_hal.types import DraftTree, Verdict


def backend_with(op, fn):
    cpu = get_backend("cpu")
    providers = dict(cpu.providers)
    providers[op] = Provider(fn, "deliberately broken")
    return Backend("broken", cpu.capabilities, providers)


def _write(result: Verdict, out):
    if out is None:
        return result
    for field in VERDICT_FIELDS:
        getattr(out, field).copy_(getattr(result, field))
    return out


def _first_child_only(tree: DraftTree) -> DraftTree:
    siblings = torch.full_like(tree.retrieve_next_sibling, -1)
    return DraftTree(tree.tokens, tree.positions, tree.retrieve_index, tree.retrieve_next_token, siblings, tree.mask, tree.mask_mode,
                     tree.num_steps)


def greedy_ignoring_siblings(tree, candidates, target_predict, *, out=None):
    """Checks only the first child at every level."""
    return _write(reference.verify_greedy(_first_child_only(tree), candidates, target_predict), out)


def sampling_ignoring_siblings(tree, candidates, target_probs, coins, final_coins, *, threshold_single=1.0, threshold_acc=1.0, out=None):
    return _write(reference.verify_sampling(_first_child_only(tree), candidates, target_probs, coins, final_coins,
                                            threshold_single=threshold_single, threshold_acc=threshold_acc), out)


def sampling_threshold_ignored(tree, candidates, target_probs, coins, final_coins, *, threshold_single=1.0, threshold_acc=1.0, out=None):
    return _write(reference.verify_sampling(tree, candidates, target_probs, coins, final_coins), out)


def sampling_residual_from_root_row(tree, candidates, target_probs, coins, final_coins, *, threshold_single=1.0, threshold_acc=1.0, out=None):
    """Samples the final token from the root's row instead of the last accepted node's row."""
    result = reference.verify_sampling(tree, candidates, target_probs, coins, final_coins, threshold_single=threshold_single,
                                       threshold_acc=threshold_acc)
    bs, nodes = candidates.shape
    probs = reference.sanitize_probs(target_probs.reshape(bs, nodes, -1))
    root_sample = reference.sample_final(probs[:, 0], probs[:, 0], reference.sanitize_coins(final_coins))
    last = result.accept_index.long().gather(1, result.num_correct.long()[:, None])[:, 0]
    predict = result.predict.clone()
    predict[last] = root_sample.to(torch.int32)
    return _write(Verdict(predict, result.accept_index, result.num_correct, result.accept_lens), out)


def sampling_without_residual(tree, candidates, target_probs, coins, final_coins, *, threshold_single=1.0, threshold_acc=1.0, out=None):
    """Samples the final token from the full target row (rejected candidates not removed)."""
    result = reference.verify_sampling(tree, candidates, target_probs, coins, final_coins, threshold_single=threshold_single,
                                       threshold_acc=threshold_acc)
    bs, nodes = candidates.shape
    probs = reference.sanitize_probs(target_probs.reshape(bs, nodes, -1))
    last = result.accept_index.long().gather(1, result.num_correct.long()[:, None])[:, 0]
    rows = probs[torch.arange(bs), last - torch.arange(bs) * nodes]
    predict = result.predict.clone()
    predict[last] = reference.sample_final(rows, rows, reference.sanitize_coins(final_coins)).to(torch.int32)
    return _write(Verdict(predict, result.accept_index, result.num_correct, result.accept_lens), out)


def sampling_mutates_probs(tree, candidates, target_probs, coins, final_coins, *, threshold_single=1.0, threshold_acc=1.0, out=None):
    """Upstream's in-place residual: zeroes the accepted path's rows of the input."""
    result = reference.verify_sampling(tree, candidates, target_probs, coins, final_coins, threshold_single=threshold_single,
                                       threshold_acc=threshold_acc)
    target_probs.view(-1, target_probs.shape[-1])[0].zero_()
    return _write(result, out)


def sampling_accepts_at_equality(tree, candidates, target_probs, coins, final_coins, *, threshold_single=1.0, threshold_acc=1.0, out=None):
    """Upstream's `coin <= acc`: emulated by nudging every coin down by one ulp."""
    lowered = torch.nextafter(coins, torch.zeros_like(coins))
    return _write(reference.verify_sampling(tree, candidates, target_probs, lowered, final_coins, threshold_single=threshold_single,
                                            threshold_acc=threshold_acc), out)


def greedy_writes_accept_index_n_wide(tree, candidates, target_predict, *, out=None):
    """Upstream bug 4b's shape: bs*N accept entries written into the (bs, S+1) buffer (here cut
    at the guard margin, which is where the allocation ends)."""
    result = reference.verify_greedy(tree, candidates, target_predict)
    if out is None:
        return result
    _write(result, out)
    flat = out.accept_index.view(-1)
    overrun = min(candidates.numel() - flat.numel(), guards.MARGIN)
    torch.as_strided(flat, (flat.numel() + overrun,), (1,))[flat.numel():].fill_(-1)
    return out


def chain_residual_is_target(draft_ids, draft_probs, target_probs, coins, final_coins, *, out=None):
    """Residual p instead of max(0, p - q): biased towards the drafts' tokens."""
    return _write(_chain_without_q_residual(draft_ids, draft_probs, target_probs, coins, final_coins), out)


def _chain_without_q_residual(draft_ids, draft_probs, target_probs, coins, final_coins):
    result = reference.verify_chain_sampling(draft_ids, draft_probs, target_probs, coins, final_coins)
    bs, steps = draft_ids.shape
    p = reference.sanitize_probs(target_probs.reshape(bs, steps + 1, -1))
    rows = p[torch.arange(bs), result.num_correct.long()]
    last = result.accept_index.long().gather(1, result.num_correct.long()[:, None])[:, 0]
    predict = result.predict.clone()
    predict[last] = reference.sample_final(rows, rows, reference.sanitize_coins(final_coins)).to(torch.int32)
    return Verdict(predict, result.accept_index, result.num_correct, result.accept_lens)


def chain_accepts_on_target_only(draft_ids, draft_probs, target_probs, coins, final_coins, *, out=None):
    """Ignores q in the acceptance test (coin < p): not rejection sampling."""
    ones = torch.ones_like(draft_probs)
    return _write(reference.verify_chain_sampling(draft_ids, ones, target_probs, coins, final_coins), out)


def test_greedy_walk_ignoring_siblings_is_caught():
    broken = backend_with("verify_greedy", greedy_ignoring_siblings)
    with pytest.raises(AssertionError):
        cases.test_verify_greedy_golden(broken, "flat_ids")
    with pytest.raises(AssertionError):
        cases.test_verify_greedy_random_trees(broken, 5, 8, 17, torch.int64)


def test_sampling_ignoring_siblings_is_caught():
    with pytest.raises(AssertionError):
        cases.test_verify_sampling_golden(backend_with("verify_sampling", sampling_ignoring_siblings), (1.0, 1.0))


def test_sampling_threshold_ignored_is_caught():
    broken = backend_with("verify_sampling", sampling_threshold_ignored)
    with pytest.raises(AssertionError):
        cases.test_verify_sampling_golden(broken, (0.0, 0.0))
    with pytest.raises(AssertionError):
        cases.test_verify_sampling_random_trees(broken, 5, 8, 5, 8, (0.4, 0.7))


def test_sampling_residual_from_the_wrong_row_is_caught():
    broken = backend_with("verify_sampling", sampling_residual_from_root_row)
    with pytest.raises(AssertionError):
        cases.test_verify_sampling_random_trees(broken, 5, 8, 5, 8, (1.0, 1.0))
    with pytest.raises(AssertionError):
        cases.test_verify_sampling_preserves_the_target_distribution(broken)


def test_sampling_without_residual_is_caught_statistically():
    with pytest.raises(AssertionError):
        cases.test_verify_sampling_preserves_the_target_distribution(backend_with("verify_sampling", sampling_without_residual))


def test_sampling_input_mutation_is_caught():
    with pytest.raises(AssertionError, match="changed one of its inputs"):
        cases.test_verify_sampling_does_not_mutate_inputs(backend_with("verify_sampling", sampling_mutates_probs))


def test_sampling_accepting_at_equality_is_caught_by_boundary_coins():
    with pytest.raises(AssertionError):
        cases.test_verify_sampling_edge_coins(backend_with("verify_sampling", sampling_accepts_at_equality), "boundary")


def test_accept_index_written_n_wide_is_caught_by_canaries():
    with pytest.raises(AssertionError, match="canary"):
        cases.test_verify_wide_tree_bug4(backend_with("verify_greedy", greedy_writes_accept_index_n_wide), "verify_greedy")


def test_chain_sampling_bugs_are_caught_statistically():
    with pytest.raises(AssertionError):
        cases.test_verify_chain_sampling_preserves_the_target_distribution(backend_with("verify_chain_sampling", chain_residual_is_target))
    with pytest.raises(AssertionError):
        cases.test_verify_chain_sampling_preserves_the_target_distribution(backend_with("verify_chain_sampling", chain_accepts_on_target_only))
