"""Differential cases over invalid VALUES in the default (unchecked, graph-capturable) mode: the
categories of issues #20/#21. Every backend must apply the op's written rule (docs/reliability.md)
exactly as the reference does: identical integers, identical in-place effects, identical error-flag
records, out= canaries intact, inputs unmodified (``fuzz.outcome`` checks all of these). Strided,
transposed and expanded (stride 0) views of every index argument are in test_fuzz.py's matrix."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from spec_hal import error_flag
from spec_hal.conformance import fuzz
from spec_hal.registry import op_spec


@pytest.fixture(autouse=True)
def default_mode(monkeypatch):
    monkeypatch.delenv("SPEC_HAL_CHECKS", raising=False)


def _with(op: str, **changes) -> fuzz.Call:
    call = fuzz.BASELINES[op]()
    args = dict(call.args)
    for name, value in changes.items():
        if "__" in name:  # verdict__accept_index -> a field of a Verdict/DraftTree argument
            outer, field = name.split("__")
            current = getattr(args[outer], field)
            args[outer] = dataclasses.replace(args[outer], **{field: value(current) if callable(value) else value})
        else:
            args[name] = value(args[name]) if callable(value) else value
    return dataclasses.replace(call, args=args)


def _set(position, number):
    """A changer: copy of the tensor with flat element ``position`` set to ``number``."""
    def change(tensor):
        changed = tensor.clone()
        changed.view(-1)[position] = number
        return changed
    return change


def _set_many(changes: dict):
    """A changer: copy of the tensor with flat elements ``position: number`` set."""
    def change(tensor):
        changed = tensor.clone()
        for position, number in changes.items():
            changed.view(-1)[position] = number
        return changed
    return change


# A (3, 4) accept_index of own-block ids (N = 5) whose accept_lens [2, 3, 4] use flat entries
# 0-1, 4-6 and 8-11; flat 3 (rank 3 of request 0) is unused: a foreign id there is no error.
_OWN_BLOCK = torch.arange(4)[None, :] + 5 * torch.arange(3)[:, None]
_LENS = torch.tensor([2, 3, 4])


def _verdict_values(op: str, *, lens=_LENS, index: dict, **changes) -> fuzz.Call:
    return _with(op, verdict__accept_lens=lens, verdict__accept_index=_set_many(index)(_OWN_BLOCK), **changes)


def _long_moves(changes: dict, first: int = 0) -> torch.Tensor:
    """A (600,) move list for the (40-slot) caches of move_kv's baseline: slots ``first ..
    first + 9`` at entries 100, 110, ..., 190, -1 elsewhere, then ``changes``."""
    slots = torch.full((600,), -1)
    slots[100:200:10] = torch.arange(first, first + 10)
    return _set_many(changes)(slots)


# Two invalid entries of one argument (the smaller flat index is recorded, whatever the order of
# the kernel's threads), and invalid entries of both arguments (the first argument wins, even at a
# larger index): the record codes of docs/reliability.md. Value: (call, the record expected).
TWO_INVALID = {
    **{f"{op} foreign accept_index entries of two requests": (
        lambda op=op: (_verdict_values(op, index={3: 99, 9: 2**40, 6: -1}), (op, "verdict.accept_index", 6)))
       for op in ("accepted_kv_moves", "compact_accepted", "bonus_tokens")},
    **{f"{op} foreign accept_index entries of one request": (
        lambda op=op: (_verdict_values(op, index={11: 2**40, 9: 4}), (op, "verdict.accept_index", 9)))
       for op in ("accepted_kv_moves", "compact_accepted", "bonus_tokens")},
    **{f"{op} two invalid accept_lens": (lambda op=op: (_verdict_values(op, lens=torch.tensor([2, 0, 9]), index={}),
                                                        (op, "verdict.accept_lens", 1)))
       for op in ("accepted_kv_moves", "compact_accepted", "bonus_tokens")},
    **{f"{op} invalid accept_lens and accept_index": (lambda op=op: (_verdict_values(op, lens=torch.tensor([2, 3, 7]), index={0: -1}),
                                                                     (op, "verdict.accept_lens", 2)))
       for op in ("accepted_kv_moves", "compact_accepted", "bonus_tokens")},
    # 600 entries, mostly -1: the GPU kernels pack the used moves first; records keep the caller's indices.
    "move_kv invalid entries of a long list": lambda: (_with("move_kv", src=_long_moves({530: 2**40, 590: -2}),
                                                             dst=_long_moves({50: 45}, first=20)), ("move_kv", "src", 530)),
    # Rows of 5000 floats: several column tiles on GPUs, of which only the first records.
    "compact_accepted wide rows two foreign entries": lambda: (
        _verdict_values("compact_accepted", index={9: 2**40, 6: -1}, x=torch.randn(15, 5000)),
        ("compact_accepted", "verdict.accept_index", 6)),
    "move_kv two invalid sources": lambda: (_with("move_kv", src=torch.tensor([3, 7, -1, 12, 50, -2])), ("move_kv", "src", 4)),
    "move_kv invalid destination and source": lambda: (_with("move_kv", src=torch.tensor([3, 7, -1, 12, 30, 41]),
                                                             dst=torch.tensor([-3, 8, 9, -1, 31, 2])), ("move_kv", "src", 5)),
    # Caches of 40 and 30 slots: slot 35 is invalid (the smallest num_slots counts) though the
    # first cache has it; the kernel launches once per cache here, and both record the same.
    "move_kv slot past the smaller cache": lambda: (_with("move_kv", caches=lambda caches: [caches[0], caches[1][:30]],
                                                          src=torch.tensor([3, 7, -1, 12, 35, 1]), dst=torch.tensor([4, 8, 9, 33, 31, 2])),
                                                    ("move_kv", "src", 4)),
    # The tree walks record candidates, then retrieve_next_token, then retrieve_next_sibling
    # (one atomic per program: the kernels take the smallest code per node lane).
    **{f"{op} invalid candidate and links": (lambda op=op: (
        _with(op, candidates=_set(10, -3), tree__retrieve_next_token=_set(0, 99), tree__retrieve_next_sibling=_set(1, 0)),
        (op, "candidates", 10))) for op in ("verify_greedy", "verify_sampling")},
    **{f"{op} invalid next_token and next_sibling": (lambda op=op: (
        _with(op, tree__retrieve_next_token=_set(11, 6), tree__retrieve_next_sibling=_set(3, -2)), (op, "tree.retrieve_next_token", 11)))
       for op in ("verify_greedy", "verify_sampling")},
    **{f"{op} two invalid next_sibling entries": (lambda op=op: (
        _with(op, tree__retrieve_next_sibling=_set_many({9: 2**40, 4: 0})), (op, "tree.retrieve_next_sibling", 4)))
       for op in ("verify_greedy", "verify_sampling")},
}


CASES = {
    # build_tree: a full mask sized by a seq_lens_sum that lies, negative lengths (#20).
    "build_tree seq_lens_sum 0": lambda: _with("build_tree", seq_lens_sum=0),
    "build_tree seq_lens_sum too small": lambda: _with("build_tree", seq_lens=torch.tensor([5, 9]), seq_lens_sum=3),
    "build_tree seq_lens_sum too big": lambda: _with("build_tree", seq_lens=torch.tensor([5, 9]), seq_lens_sum=40),
    "build_tree negative seq_len": lambda: _with("build_tree", seq_lens=torch.tensor([-3, 17]), seq_lens_sum=14),
    "build_tree negative seq_len qlen": lambda: _with("build_tree", seq_lens=torch.tensor([-3, 17]), mask_mode="qlen", seq_lens_sum=None),
    "build_tree negative seq_len bitpacked": lambda: _with("build_tree", seq_lens=torch.tensor([-9, -1]), mask_mode="bitpacked",
                                                            seq_lens_sum=None),
    # assign_draft_slots: pool rows outside the table, negative lengths (#21).
    "assign_draft_slots pool row = R": lambda: _with("assign_draft_slots", req_pool_indices=torch.tensor([4, 0, 3])),
    "assign_draft_slots pool row -1": lambda: _with("assign_draft_slots", req_pool_indices=torch.tensor([2, -1, 3])),
    "assign_draft_slots pool row 2^31-1": lambda: _with("assign_draft_slots", req_pool_indices=torch.tensor([2**31 - 1, 0, 3])),
    "assign_draft_slots pool row 2^40": lambda: _with("assign_draft_slots", req_pool_indices=torch.tensor([2**40, 0, 3])),
    "assign_draft_slots seq_len -5": lambda: _with("assign_draft_slots", seq_lens=torch.tensor([5, -5, 0])),
    "assign_draft_slots seq_len past the row": lambda: _with("assign_draft_slots", seq_lens=torch.tensor([5, 62, 2**40])),
    "assign_draft_slots int32 indices": lambda: _with("assign_draft_slots", req_pool_indices=torch.tensor([3, -1, 9], dtype=torch.int32),
                                                       seq_lens=torch.tensor([-1, 4, 2], dtype=torch.int32)),
    # commit_mamba_state: an int64 slot past 2^32 must not alias slot 1 (#21).
    "commit_mamba_state slot 2^32+1": lambda: _with("commit_mamba_state", slots=torch.tensor([2**32 + 1, 4, 0])),
    "commit_mamba_state track slot 2^32+2": lambda: _with("commit_mamba_state", track_slots=torch.tensor([2**32 + 2, -1, 5])),
    "commit_mamba_state scratch row 2^32": lambda: _with("commit_mamba_state", src_rows=torch.tensor([2**32, 1, 2])),
    "commit_mamba_state accept_index of another request": lambda: _with("commit_mamba_state", verdict__accept_index=_set(0, 7)),
    "mamba_commit_steps negative seq_lens": lambda: _with("mamba_commit_steps", seq_lens=torch.tensor([-3, -14, 7])),
    "mamba_commit_steps accept_index 2^40": lambda: _with("mamba_commit_steps", verdict__accept_index=_set(1, 2**40)),
    # accepted_kv_moves / compact_accepted / bonus_tokens with invalid accept_index / accept_lens.
    **{f"{op} accept_lens {n}": (lambda op=op, n=n: _with(op, verdict__accept_lens=torch.tensor([n, 1, 2])))
       for op in ("accepted_kv_moves", "compact_accepted", "bonus_tokens") for n in (0, -1, 5, 6, 2**40)},
    **{f"{op} accept_index {n}": (lambda op=op, n=n: _with(op, verdict__accept_index=_set(1, n)))
       for op in ("accepted_kv_moves", "compact_accepted", "bonus_tokens") for n in (-1, -2, 7, 14, 15, 2**40)},
    # move_kv: slots past the cache, negative slots other than -1.
    "move_kv source past the cache": lambda: _with("move_kv", src=torch.tensor([3, 40, -1, 12, 2**40, 1])),
    "move_kv destination past the cache": lambda: _with("move_kv", dst=torch.tensor([4, 8, 9, 41, 31, 2**32 + 2])),
    "move_kv negative slots": lambda: _with("move_kv", src=torch.tensor([3, -2, -1, 12, 30, -2**40])),
    # verify: a tree whose num_steps exceeds N - 1, and cyclic links.
    "verify_greedy num_steps 1024": lambda: _with("verify_greedy", tree=lambda t: dataclasses.replace(t, num_steps=1024)),
    "verify_greedy cyclic links": lambda: _with("verify_greedy", tree=lambda t: dataclasses.replace(
        t, num_steps=40, retrieve_next_token=torch.ones_like(t.retrieve_next_token), retrieve_next_sibling=torch.ones_like(t.retrieve_next_token))),
    "verify_sampling num_steps 1024": lambda: _with("verify_sampling", tree=lambda t: dataclasses.replace(t, num_steps=1024)),
    "verify_greedy candidates out of vocabulary": lambda: _with("verify_greedy", candidates=_set(1, -5)),
    "verify_sampling candidates out of vocabulary": lambda: _with("verify_sampling", candidates=_set(1, 2**40)),
    "verify_chain_sampling draft ids out of vocabulary": lambda: _with("verify_chain_sampling", draft_ids=_set(0, 20)),
    "draft_topk token_map entries -1": lambda: _with("draft_topk", token_map=lambda m: torch.full_like(m, -1)),
    "scatter_mamba_state slot 2^32+1": lambda: _with("scatter_mamba_state", dst_slots=torch.tensor([2**32 + 1, -1, 4])),
    "scatter_mamba_state step -2": lambda: _with("scatter_mamba_state", src_steps=torch.tensor([-2, 2, 3])),
    **{label: (lambda case=case: case()[0]) for label, case in TWO_INVALID.items()},
}


# The mamba and sampling-verify kernels record in the error flag what their rules met
# (docs/reliability.md): the record (op, argument, first offending index) must be the reference's
# (fuzz.outcome compares it) and the one the case expects.
FLAGGED_RULES = {
    "mamba_commit_steps accept_lens 0": (("mamba_commit_steps", "verdict.accept_lens", 1),
                                         lambda: _with("mamba_commit_steps", verdict__accept_lens=_set(1, 0))),
    "mamba_commit_steps accept_index of another request": (("mamba_commit_steps", "verdict.accept_index", None),
                                                           lambda: _with("mamba_commit_steps", verdict__accept_index=lambda a: a.roll(1, 0))),
    "mamba_commit_steps negative seq_lens": (("mamba_commit_steps", "seq_lens", 0),
                                             lambda: _with("mamba_commit_steps", seq_lens=torch.tensor([-3, -14, 7]))),
    "commit_mamba_state accept_lens past S+1": (("commit_mamba_state", "verdict.accept_lens", 2),
                                                lambda: _with("commit_mamba_state", verdict__accept_lens=_set(2, 9))),
    "commit_mamba_state accept_index 2^40": (("commit_mamba_state", "verdict.accept_index", None),
                                             lambda: _with("commit_mamba_state", verdict__accept_index=lambda a: torch.where(a > 0, 2**40, a))),
    "commit_mamba_state negative seq_len": (("commit_mamba_state", "seq_lens", 1),
                                            lambda: _with("commit_mamba_state", seq_lens=torch.tensor([3, -14, -7]))),
    "commit_mamba_state slot -2": (("commit_mamba_state", "slots", 1), lambda: _with("commit_mamba_state", slots=torch.tensor([1, -2, 0]))),
    "commit_mamba_state slot past the pool": (("commit_mamba_state", "slots", 0),
                                              lambda: _with("commit_mamba_state", slots=torch.tensor([2**32 + 1, 4, 6]))),
    "commit_mamba_state track slot past the pool": (("commit_mamba_state", "track_slots", None),
                                                    lambda: _with("commit_mamba_state", track_slots=torch.tensor([6, 6, 6]))),
    "commit_mamba_state scratch row -1": (("commit_mamba_state", "src_rows", 2),
                                          lambda: _with("commit_mamba_state", src_rows=torch.tensor([0, 1, -1]))),
    "scatter_mamba_state slot -3": (("scatter_mamba_state", "dst_slots", 2),
                                    lambda: _with("scatter_mamba_state", dst_slots=torch.tensor([1, -1, -3]))),
    "scatter_mamba_state step past N": (("scatter_mamba_state", "src_steps", 0),
                                        lambda: _with("scatter_mamba_state", src_steps=torch.tensor([4, 2, 9]))),
    "scatter_mamba_state row past the scratch": (("scatter_mamba_state", "src_rows", 2),
                                                 lambda: _with("scatter_mamba_state", src_rows=torch.tensor([0, 7, 3]))),
    # the sampling verifies: token ids outside [0, V) (-1 is padding and is not recorded)
    "verify_sampling candidates past V": (("verify_sampling", "candidates", 7),
                                          lambda: _with("verify_sampling", candidates=lambda c: torch.where(
                                              torch.arange(c.numel()).view(c.shape) >= 7, torch.full_like(c, 20), c))),
    "verify_sampling candidate -2": (("verify_sampling", "candidates", 3), lambda: _with("verify_sampling", candidates=_set(3, -2))),
    "verify_chain_sampling draft id 2^40": (("verify_chain_sampling", "draft_ids", 4),
                                            lambda: _with("verify_chain_sampling", draft_ids=_set(4, 2**40))),
    "verify_chain_sampling draft ids -1 and -5": (("verify_chain_sampling", "draft_ids", 2),
                                                  lambda: _with("verify_chain_sampling", draft_ids=lambda d: _set(2, -5)(_set(0, -1)(d)))),
    # the greedy verifies: ids are compared, never dereferenced; with target token ids V is
    # unknown (only ids < -1 count), with logits ids >= V count too
    "verify_greedy candidate -2": (("verify_greedy", "candidates", 3), lambda: _with("verify_greedy", candidates=_set(3, -2))),
    "verify_greedy candidate -1 is padding": ((None, None, None), lambda: _with("verify_greedy", candidates=_set(3, -1))),
    "verify_greedy candidate past V of the logits": (("verify_greedy", "candidates", 8), lambda: _with(
        "verify_greedy", candidates=_set(8, 50), target_predict=torch.randn(12, 50, generator=torch.Generator().manual_seed(8)))),
    "verify_chain candidate -7": (("verify_chain", "candidates", 6), lambda: _with("verify_chain", candidates=_set(6, -7))),
    "verify_chain candidate past V of the logits": (("verify_chain", "candidates", 2), lambda: _with(
        "verify_chain", candidates=_set_many({2: 12, 7: -4}), target_predict=torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(9)))),
    # the tree walks: a link that is neither -1 (none) nor in [1, N) ends the list and is recorded
    **{f"{op} next_token 0": ((op, "tree.retrieve_next_token", 7), lambda op=op: _with(op, tree__retrieve_next_token=_set(7, 0)))
       for op in ("verify_greedy", "verify_sampling")},
    **{f"{op} next_token past N": ((op, "tree.retrieve_next_token", 1), lambda op=op: _with(op, tree__retrieve_next_token=_set(1, 2**40)))
       for op in ("verify_greedy", "verify_sampling")},
    **{f"{op} next_sibling -2": ((op, "tree.retrieve_next_sibling", 6), lambda op=op: _with(op, tree__retrieve_next_sibling=_set(6, -2)))
       for op in ("verify_greedy", "verify_sampling")},
    # the greedy ragged op records the drafts it reads at their flat index into draft_tokens
    # (counts [2, 0, 3]: every one of the 5 drafts is read); V only from logits, as above
    "verify_chain_ragged draft id -3": (("verify_chain_ragged", "draft_tokens", 3),
                                        lambda: _with("verify_chain_ragged", draft_tokens=_set(3, -3))),
    "verify_chain_ragged draft ids past V of the logits": (("verify_chain_ragged", "draft_tokens", 1), lambda: _with(
        "verify_chain_ragged", draft_tokens=_set_many({4: 12, 1: 40}), target_predict=torch.randn(8, 12, generator=torch.Generator().manual_seed(10)))),
    "verify_chain_ragged draft id past any token id is no error": ((None, None, None),
                                                                   lambda: _with("verify_chain_ragged", draft_tokens=_set(2, 10**6))),
    # the sampling ragged op records its drafts at their padded index b * max_drafts + j (counts [2, 0, 3],
    # max_drafts 3: flat drafts 3 and 4 are request 2's drafts 1 and 2, padded 7 and 8)
    "verify_chain_sampling_ragged draft ids past V and -2": (("verify_chain_sampling", "draft_ids", 7),
                                                             lambda: _with("verify_chain_sampling_ragged",
                                                                           draft_tokens=_set_many({3: 2**40, 4: -2}))),
}


@pytest.mark.parametrize("label", [pytest.param(label, marks=pytest.mark.spec_hal_op(label.split()[0])) for label in FLAGGED_RULES])
def test_rule_is_recorded_like_the_reference(backend, label):
    (op, argument, index), make = FLAGGED_RULES[label]
    call = make()
    # the flag equals the reference's (nothing recorded on either: op None)
    assert fuzz.outcome(backend, call, label) == ("reference answer (flagged)" if op else "reference answer")
    args = fuzz._to(call.args, backend.device)
    error_flag.pending_errors(backend.device)
    getattr(backend, call.op)(*(args[name] for name in call.positional), **{k: v for k, v in args.items() if k not in call.positional})
    recorded = error_flag.pending_errors(backend.device)
    if op is None:
        assert recorded == [], recorded
        return
    assert len(recorded) == 1 and recorded[0][:2] == (op, argument), recorded
    if index is not None:
        assert recorded[0][2] == index, recorded


@pytest.mark.spec_hal_op("verify_chain_sampling_from_logits")
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_chain_from_logits_records_draft_ids(backend, with_draft_probs):
    """Without draft_probs the kernels run the chain through the tree walk; the record must still
    be verify_chain_sampling's draft_ids at the draft's own index, as on the reference."""
    call = fuzz.BASELINES["verify_chain_sampling"]()
    draft_ids = call.args["draft_ids"].clone()
    draft_ids[1, 1] = 2**40  # flat index 4
    args = {"draft_ids": draft_ids, "draft_probs": call.args["draft_probs"] if with_draft_probs else None,
            "target_logits": torch.log(call.args["target_probs"]), "temperature": 1.0, "coins": call.args["coins"],
            "final_coins": call.args["final_coins"]}
    records = []
    for device, run in ((torch.device("cpu"), op_spec("verify_chain_sampling_from_logits").reference),
                        (backend.device, backend.verify_chain_sampling_from_logits)):
        moved = fuzz._to(args, device)
        error_flag.pending_errors(device)
        run(moved.pop("draft_ids"), moved.pop("draft_probs"), moved.pop("target_logits"), **moved)
        records.append(error_flag.pending_errors(device))
    assert records[0] == records[1] == [("verify_chain_sampling", "draft_ids", 4)], records


def _walk_call(op: str, tree, candidates, call: fuzz.Call) -> tuple:
    """(positional, keywords) of a call of ``op`` on verify_sampling's baseline arguments."""
    probs, coins, final_coins = call.args["target_probs"], call.args["coins"], call.args["final_coins"]
    if op == "verify_tree_sampling":
        draft_probs = torch.softmax(torch.randn(probs.shape, generator=torch.Generator().manual_seed(10)), dim=-1)
        return (tree, candidates, draft_probs, probs, coins, final_coins), {}
    return (tree, candidates, torch.log(probs)), {"temperature": 1.0, "coins": coins, "final_coins": final_coins}


# The walks of the other ops that take a DraftTree record like verify_sampling's (the from-logits
# op records as verify_sampling: its reference runs verify_sampling on the processed rows).
OTHER_WALKS = {
    "verify_tree_sampling links": ("verify_tree_sampling", {"retrieve_next_token": {11: 6}, "retrieve_next_sibling": {3: 0}}, {},
                                   ("verify_tree_sampling", "tree.retrieve_next_token", 11)),
    "verify_tree_sampling candidate -2 and a link": ("verify_tree_sampling", {"retrieve_next_sibling": {2: -5}}, {9: -2},
                                                     ("verify_tree_sampling", "candidates", 9)),
    "verify_sampling_from_logits links": ("verify_sampling_from_logits", {"retrieve_next_sibling": {8: 2**40, 10: 0}}, {},
                                          ("verify_sampling", "tree.retrieve_next_sibling", 8)),
}


@pytest.mark.parametrize("label", [pytest.param(label, marks=pytest.mark.spec_hal_op(label.split()[0])) for label in OTHER_WALKS])
def test_other_walks_record_like_the_reference(backend, label):
    op, link_changes, candidate_changes, expected = OTHER_WALKS[label]
    call = fuzz.BASELINES["verify_sampling"]()
    tree = call.args["tree"]
    tree = dataclasses.replace(tree, **{name: _set_many(changes)(getattr(tree, name)) for name, changes in link_changes.items()})
    positional, keywords = _walk_call(op, tree, _set_many(candidate_changes)(call.args["candidates"]), call)
    records = []
    for device, run in ((torch.device("cpu"), op_spec(op).reference), (backend.device, getattr(backend, op))):
        moved = fuzz._to({"positional": list(positional), **keywords}, device)
        error_flag.pending_errors(device)
        run(*moved.pop("positional"), **moved)
        records.append(error_flag.pending_errors(device))
    assert records[0] == records[1] == [expected], records


# Checked mode raises at once, naming the argument the caller passed (the first in code order).
CHECKED = {
    "verify_greedy next_sibling 0": ("tree.retrieve_next_sibling", lambda: _with("verify_greedy", tree__retrieve_next_sibling=_set(4, 0))),
    "verify_greedy candidate -3 and a link": ("candidates", lambda: _with("verify_greedy", candidates=_set(5, -3),
                                                                          tree__retrieve_next_token=_set(0, 6))),
    "verify_sampling next_token past N": ("tree.retrieve_next_token", lambda: _with("verify_sampling", tree__retrieve_next_token=_set(2, 6))),
    "verify_chain candidate -2": ("candidates", lambda: _with("verify_chain", candidates=_set(1, -2))),
}


@pytest.mark.parametrize("label", [pytest.param(label, marks=pytest.mark.spec_hal_op(label.split()[0])) for label in CHECKED])
def test_walk_values_raise_in_checked_mode(backend, label, monkeypatch):
    argument, make = CHECKED[label]
    monkeypatch.setenv("SPEC_HAL_CHECKS", "1")
    assert fuzz.outcome(backend, make(), label) == f"InvalidInput({argument})"


@pytest.mark.parametrize("label", [pytest.param(label, marks=pytest.mark.spec_hal_op(label.split()[0])) for label in CASES])
def test_invalid_value_follows_the_rule(backend, label):
    outcome = fuzz.outcome(backend, CASES[label](), label)
    assert outcome.startswith("reference answer"), outcome


@pytest.mark.parametrize("label", [pytest.param(label, marks=pytest.mark.spec_hal_op(label.split()[0])) for label in TWO_INVALID])
def test_smallest_record_wins(backend, label):
    """The flag holds the record written in TWO_INVALID (reliability.md's codes, not an output)."""
    call, expected = TWO_INVALID[label]()
    _, _, flagged = fuzz._run(getattr(backend, call.op), call, fuzz._to(call.args, backend.device), backend.device)
    assert flagged == [expected]


def _sliced(tensor):
    return fuzz._strided(tensor)


def _expanded(tensor):
    return tensor[:1].expand(tensor.shape)


# Layouts the shared checks reject on every backend (the fuzz hands each backend the exact layout
# the reference saw: before, Tensor.to made a sliced or expanded view contiguous on the way to a
# GPU, so the cuda lane accepted what the reference rejected).
REJECTED_LAYOUTS = {
    "commit_mamba_state conv_state sliced": ("conv_state", lambda: _with("commit_mamba_state", conv_state=_sliced)),
    "commit_mamba_state ssm_state sliced": ("ssm_state", lambda: _with("commit_mamba_state", ssm_state=_sliced)),
    "commit_mamba_state ssm_state expanded": ("ssm_state", lambda: _with("commit_mamba_state", ssm_state=_expanded)),
    "scatter_mamba_state dst expanded": ("dst", lambda: _with("scatter_mamba_state", dst=_expanded)),
    "move_kv cache expanded": ("caches[0]", lambda: _with("move_kv", caches=lambda c: [_expanded(c[0]), c[1]])),
}


@pytest.mark.parametrize("label", [pytest.param(label, marks=pytest.mark.spec_hal_op(label.split()[0])) for label in REJECTED_LAYOUTS])
def test_rejected_layout(backend, label):
    argument, make = REJECTED_LAYOUTS[label]
    assert fuzz.outcome(backend, make(), label) == f"InvalidInput({argument})"


# Found when the masks and ragged ops joined the fuzz: a strided mask index, a mask with no rows,
# a huge max_drafts (a terabyte allocation), a (1, rows, V) probability table (a raw reshape error).
FOUND_BY_FUZZ = {
    "apply_token_bitmask_ bitmask_index sliced": ("reference answer", lambda: _with("apply_token_bitmask_", bitmask_index=_sliced)),
    "apply_token_bitmask_ bitmask_index expanded": ("reference answer", lambda: _with("apply_token_bitmask_", bitmask_index=_expanded)),
    "apply_token_bitmask_ no mask rows": ("reference answer", lambda: _with("apply_token_bitmask_", token_bitmask=lambda m: m[:0])),
    "verify_chain_ragged max_drafts 2^40": ("InvalidInput(max_drafts)", lambda: _with("verify_chain_ragged", max_drafts=2**40)),
    "verify_chain_sampling_ragged max_drafts 1025": ("InvalidInput(max_drafts)",
                                                     lambda: _with("verify_chain_sampling_ragged", max_drafts=1025)),
    "verify_chain_sampling_ragged draft_probs (1, T, V)": ("InvalidInput(draft_probs)",
                                                           lambda: _with("verify_chain_sampling_ragged", draft_probs=lambda q: q[None])),
    "verify_chain_sampling_ragged target_probs (1, T + bs, V)": ("InvalidInput(target_probs)",
                                                                 lambda: _with("verify_chain_sampling_ragged", target_probs=lambda p: p[None])),
    # The fused from-logits walk and the hash-coins kernel index per-request parameters and seeds
    # by request: a strided or expanded one gave a request another request's (or no) value.
    "verify_sampling_from_logits temperature expanded": ("reference answer",
                                                         lambda: _with("verify_sampling_from_logits", temperature=_expanded)),
    "verify_sampling_from_logits seed expanded": ("reference answer", lambda: _with("verify_sampling_from_logits", seed=_expanded)),
    "verify_chain_sampling_from_logits top_k sliced (one-hot drafts)": (
        "reference answer", lambda: _with("verify_chain_sampling_from_logits", draft_probs=None, top_k=_sliced)),
}


@pytest.mark.parametrize("label", [pytest.param(label, marks=pytest.mark.spec_hal_op(label.split()[0])) for label in FOUND_BY_FUZZ])
def test_found_by_fuzz(backend, label):
    expected, make = FOUND_BY_FUZZ[label]
    assert fuzz.outcome(backend, make(), label) == expected


# Two copies into one slot break the distinct-destinations precondition: which write lands is
# unspecified (a race on a GPU), every other output, slot and flag must still be the reference's.
CONTESTED = {
    # the H100 fuzz case: slots [0, 4, 0] (requests 0 and 2 commit into slot 0)
    "commit_mamba_state two requests commit into one slot": (
        [0], lambda: _with("commit_mamba_state", slots=torch.tensor([0, 4, 0]))),
    "commit_mamba_state track slot = another request's slot": (
        [4], lambda: _with("commit_mamba_state", track_slots=torch.tensor([4, -1, 5]))),
    "scatter_mamba_state duplicate dst_slots": ([1], lambda: _with("scatter_mamba_state", dst_slots=torch.tensor([1, 1, 4]))),
    "move_kv duplicate dst": ([8], lambda: _with("move_kv", dst=torch.tensor([4, 8, 9, -1, 8, 2]))),
}


@pytest.mark.parametrize("label", [pytest.param(label, marks=pytest.mark.spec_hal_op(label.split()[0])) for label in CONTESTED])
def test_contested_slot_is_the_only_unspecified_output(backend, label):
    slots, make = CONTESTED[label]
    call = make()
    assert fuzz.contested_slots(call.op, call.args) == slots  # the case does break the precondition
    assert fuzz.outcome(backend, call, label).startswith("reference answer, contested slots unspecified")


@pytest.mark.spec_hal_op("commit_mamba_state")
def test_slot_past_2_to_32_leaves_slot_1_alone(backend):
    """Slot 2^32 + 1 is out of range: skipped, never truncated to slot 1 (another request's)."""
    call = CASES["commit_mamba_state slot 2^32+1"]()
    args = fuzz._to(call.args, backend.device)
    before = args["ssm_state"][:, 1].clone()
    backend.commit_mamba_state(**args)
    assert torch.equal(args["ssm_state"][:, 1], before)


@pytest.mark.spec_hal_op("build_tree")
def test_error_flag_records_and_raises(backend):
    """The default mode records (op, argument, first index); raise_pending_errors names the argument."""
    error_flag.pending_errors(backend.device)
    call = CASES["build_tree negative seq_len"]()
    args = fuzz._to(call.args, backend.device)
    backend.build_tree(*(args[name] for name in call.positional), topk=args["topk"], mask_mode="full", seq_lens_sum=14)
    with pytest.raises(Exception) as raised:
        error_flag.raise_pending_errors(backend.device)
    assert getattr(raised.value, "argument", None) == "seq_lens" and "index 0" in str(raised.value)
    error_flag.raise_pending_errors(backend.device)  # cleared: nothing pending now


@pytest.mark.spec_hal_op("assign_draft_slots")
def test_checked_mode_raises_at_once(backend, monkeypatch):
    monkeypatch.setenv("SPEC_HAL_CHECKS", "1")
    call = CASES["assign_draft_slots pool row -1"]()
    args = fuzz._to(call.args, backend.device)
    with pytest.raises(Exception) as raised:
        backend.assign_draft_slots(args["req_to_token"], **{k: v for k, v in args.items() if k != "req_to_token"})
    assert getattr(raised.value, "argument", None) == "req_pool_indices"
