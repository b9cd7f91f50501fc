"""The tree and draft-loop conformance cases fail on wrong implementations: deliberately broken
build_tree providers and draft-loop drivers with upstream bugs 1 and 2 (P17, P18)."""
import dataclasses

import pytest
import torch

from spec_hal.backend import Backend, Provider
from spec_hal.conformance.cases import test_draft_loop as loop_cases
from spec_hal.conformance.cases import test_tree as tree_cases
from spec_hal.draft_loop import run_draft
from spec_hal.selection import get_backend
from spec_hal.testing import ChainedMtpDraftModel, EagleDraftModel
from spec_hal.tree import build_tree as reference_build_tree
from spec_hal.types import DraftResult


def backend_with(op, fn):
    cpu = get_backend("cpu")
    providers = dict(cpu.providers)
    providers[op] = Provider(fn, "deliberately broken")
    return Backend("broken", cpu.capabilities, providers)


# ---------------------------------------------------------------------------------------------
# Broken build_tree providers


def _replace(tree, **fields):
    return dataclasses.replace(tree, **fields)


def siblings_descending(*args, **kwargs):
    """Pushes children at the back instead of the front: child lists in descending node order."""
    tree = reference_build_tree(*args, **kwargs)
    next_token, next_sibling = tree.retrieve_next_token.clone(), torch.full_like(tree.retrieve_next_sibling, -1)
    for b in range(next_token.shape[0]):
        for parent in range(next_token.shape[1]):
            children = []
            child = int(tree.retrieve_next_token[b, parent])
            while child != -1:
                children.append(child)
                child = int(tree.retrieve_next_sibling[b, child])
            children.reverse()
            next_token[b, parent] = children[0] if children else -1
            for first, second in zip(children, children[1:]):
                next_sibling[b, first] = second
    return _replace(tree, retrieve_next_token=next_token, retrieve_next_sibling=next_sibling)


def positions_from_depth_one(*args, **kwargs):
    """Positions start one too far (seq_len + depth + 1 for drafts): an off-by-one."""
    tree = reference_build_tree(*args, **kwargs)
    bump = (torch.arange(tree.positions.numel()) % tree.num_nodes > 0).long()
    return _replace(tree, positions=tree.positions + bump)


def reads_one_past_the_selected_row(roots, parents, selected, draft_tokens, seq_lens, **kwargs):
    """The CUDA kernel's parent search scans N entries of an N-1 wide row (P5): the element past
    the row becomes a node, an orphan finds its parent there and gets that node's depth."""
    bs, drafts = selected.shape
    wider_shape = (bs, drafts + 1)
    wider = reference_build_tree(roots, parents, torch.as_strided(selected, wider_shape, selected.stride()),
                                 torch.as_strided(draft_tokens, wider_shape, draft_tokens.stride()), seq_lens, topk=kwargs["topk"])
    tree = reference_build_tree(roots, parents, selected, draft_tokens, seq_lens, **kwargs)
    return _replace(tree, positions=wider.positions.view(bs, drafts + 2)[:, :drafts + 1].reshape(-1))


def full_mask_prefix_unset(*args, **kwargs):
    tree = reference_build_tree(*args, **kwargs)
    if tree.mask_mode != "full":
        return tree
    return _replace(tree, mask=torch.zeros_like(tree.mask) | _tree_columns_only(tree, args[4]))


def _tree_columns_only(tree, seq_lens):
    keep = torch.zeros_like(tree.mask)
    start, num_nodes = 0, tree.num_nodes
    for seq_len in seq_lens.tolist():
        width = seq_len + num_nodes
        block = keep[start:start + num_nodes * width].view(num_nodes, width)
        block[:, seq_len:] = tree.mask[start:start + num_nodes * width].view(num_nodes, width)[:, seq_len:]
        start += num_nodes * width
    return keep


def test_descending_siblings_are_caught():
    broken = backend_with("build_tree", siblings_descending)
    with pytest.raises(AssertionError):
        tree_cases.test_build_tree_golden(broken, "qlen", torch.int64)
    with pytest.raises(AssertionError):
        tree_cases.test_build_tree_random(broken, 3, 4, 3, 16)


def test_position_off_by_one_is_caught():
    with pytest.raises(AssertionError):
        tree_cases.test_build_tree_random(backend_with("build_tree", positions_from_depth_one), 1, 2, 3, 8)


def test_one_past_the_row_parent_search_is_caught_by_input_margins():
    with pytest.raises(AssertionError):
        tree_cases.test_build_tree_missing_parent(backend_with("build_tree", reads_one_past_the_selected_row), 4, 3, 16)


def test_full_mask_without_prefix_is_caught():
    with pytest.raises(AssertionError, match="prefix"):
        tree_cases.test_build_tree_golden(backend_with("build_tree", full_mask_prefix_unset), "full", torch.int64)
    with pytest.raises(AssertionError, match="mask differs from the reference"):
        tree_cases.test_build_tree_random(backend_with("build_tree", full_mask_prefix_unset), 3, 4, 3, 16)


# ---------------------------------------------------------------------------------------------
# Draft-loop drivers with upstream bugs


def buggy_driver(*, position_offset=0, hidden_source="parent_lane", mutate_caller_positions=False):
    """A draft loop with one injected mistake.

    position_offset=1: positions advanced before the forward (bug 1). hidden_source="first":
    every forward gets the first hidden state (bug 2a). hidden_source="own_lane": lanes keep their
    own hidden instead of their parent lane's. mutate_caller_positions: increments the caller's
    positions buffer after each forward and never restores it (the drift of bug 1's graph runner).
    """

    def driver(model, state, *, steps, topk, chain_hidden=False, backend):
        expansion = backend.expand_tree(0, None, state.probs, state.ids, hidden=state.hidden)
        first_hidden, records, hidden = expansion.hidden, [expansion.record], expansion.hidden
        for step in range(1, steps):
            lanes = state.positions.repeat_interleave(topk)
            positions = lanes + (0 if mutate_caller_positions else step - 1) + position_offset
            logits, hidden_out = model(expansion.input_ids, positions, hidden, step - 1)
            if mutate_caller_positions:
                state.positions.add_(1)
            probs, ids = backend.draft_topk(logits, topk)
            expansion = backend.expand_tree(step, expansion.scores, probs, ids, hidden=hidden_out)
            records.append(expansion.record)
            hidden = {"parent_lane": expansion.hidden, "first": first_hidden, "own_lane": hidden_out}[hidden_source]
        return DraftResult(tuple(records), hidden)

    return driver


def test_positions_advanced_before_the_forward_fail_bug1_check():
    with pytest.raises(AssertionError, match="expected root"):
        loop_cases.check_positions(get_backend("cpu"), steps=3, topk=4, driver=buggy_driver(position_offset=1))


def test_drifting_caller_positions_fail_bug1_check():
    with pytest.raises(AssertionError, match="changed the caller's state.positions"):
        loop_cases.check_positions(get_backend("cpu"), steps=3, topk=1, driver=buggy_driver(mutate_caller_positions=True))


def test_reusing_the_first_hidden_fails_bug2_check():
    with pytest.raises(AssertionError, match="did not receive the hidden state forward"):
        loop_cases.check_chain_hidden(get_backend("cpu"), steps=3, driver=buggy_driver(hidden_source="first"))


def test_own_lane_hidden_fails_the_parent_lane_check():
    with pytest.raises(AssertionError, match="another lane's hidden"):
        loop_cases.check_eagle_parent_lanes(get_backend("cpu"), steps=4, topk=4, driver=buggy_driver(hidden_source="own_lane"))


def test_the_correct_driver_passes_the_same_checks():
    cpu = get_backend("cpu")
    loop_cases.check_positions(cpu, steps=3, topk=4, driver=run_draft)
    loop_cases.check_chain_hidden(cpu, steps=3, driver=run_draft)
    loop_cases.check_eagle_parent_lanes(cpu, steps=4, topk=4, driver=run_draft)
    loop_cases.check_positions(cpu, steps=3, topk=4, driver=buggy_driver())  # the harness itself is sound


def test_buggy_drivers_change_the_drafted_tokens():
    """The testing models are sensitive enough: a position or hidden-state mistake changes the
    drafted tree tokens (otherwise e2e acceptance tests could not see bugs 1 and 2)."""
    cpu = get_backend("cpu")
    model = EagleDraftModel(seed=3)
    state = loop_cases.make_state(16, 4, seed=3, device="cpu")

    def drafted(driver):
        result = driver(model, state, steps=5, topk=4, backend=cpu)
        return cpu.organize_draft(result.records, 16)[2]

    correct = drafted(run_draft)
    for mistake in (dict(position_offset=1), dict(hidden_source="first"), dict(hidden_source="own_lane")):
        wrong = drafted(buggy_driver(**mistake))
        changed_requests = (wrong != correct).any(dim=1).float().mean().item()
        assert changed_requests >= 0.5, f"{mistake}: only {changed_requests:.0%} of requests drafted different tokens"


def test_chained_mtp_hidden_mistake_changes_the_drafted_tokens():
    cpu = get_backend("cpu")
    model = ChainedMtpDraftModel(num_layers=4, seed=5)
    state = loop_cases.make_state(16, 1, seed=5, device="cpu")

    def drafted(driver, **kwargs):
        result = driver(model, state, steps=5, topk=1, backend=cpu, **kwargs)
        return cpu.organize_draft(result.records, 6)[2]

    correct = drafted(run_draft, chain_hidden=True)
    for mistake in (dict(position_offset=1), dict(hidden_source="first")):
        changed_requests = (drafted(buggy_driver(**mistake)) != correct).any(dim=1).float().mean().item()
        assert changed_requests >= 0.5, f"{mistake}: only {changed_requests:.0%} of requests drafted different tokens"


# ---------------------------------------------------------------------------------------------
# Drivers that get the KV-cache / standalone / token-map options wrong (issue #14)


def lanes_as_identity(model, state, **kwargs):
    """Tells the model that every lane continues its own lane (what a draft that never learns its
    parent lane assumes: SGLang's draft KV lanes are never permuted, P2)."""
    def model_with_identity_lanes(input_ids, positions, hidden, step, *, parent_lanes):
        identity = torch.arange(parent_lanes.shape[1]).expand_as(parent_lanes)
        return model(input_ids, positions, hidden, step, parent_lanes=parent_lanes if step == 0 else identity)
    return run_draft(model_with_identity_lanes, state, **kwargs)


def ignores_eagle_shift(model, state, *, eagle_shift=True, **kwargs):
    """A standalone draft run at EAGLE-shifted positions (one position early)."""
    return run_draft(model, state, **kwargs)


def offsets_as_ids(model, state, *, token_map_offsets=False, **kwargs):
    """EAGLE-3 d2t offsets used as if they were absolute target ids."""
    return run_draft(model, state, **kwargs)


def test_identity_parent_lanes_fail_the_lane_cache_check():
    with pytest.raises(AssertionError):
        loop_cases.check_parent_lanes(get_backend("cpu"), bs=3, steps=4, topk=2, driver=lanes_as_identity)


def test_eagle_shifted_standalone_positions_fail_the_check():
    with pytest.raises(AssertionError, match="standalone positions"):
        loop_cases.check_standalone_positions(get_backend("cpu"), steps=3, topk=3, driver=ignores_eagle_shift)


def test_offsets_read_as_ids_fail_the_token_map_check():
    with pytest.raises(AssertionError, match="candidate tokens differ"):
        loop_cases.check_token_map(get_backend("cpu"), form="offsets", map_dtype=torch.int64, driver=offsets_as_ids)


def test_the_correct_driver_passes_the_option_checks():
    cpu = get_backend("cpu")
    loop_cases.check_parent_lanes(cpu, bs=3, steps=4, topk=2)
    loop_cases.check_standalone_positions(cpu, steps=3, topk=3)
    loop_cases.check_token_map(cpu, form="offsets", map_dtype=torch.int64)
