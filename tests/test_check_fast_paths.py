"""The verify ops' fast-path checks (spec_hal/verify.py) accept exactly what the detailed checks
accept: each call below is checked twice, once as it comes and once with the fast paths' tests
forced to fail (so only the detailed checks run), and the outcomes (accepted, or the same
InvalidInput message) must agree."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import spec_hal.verify as verify
from spec_hal.conformance.trees import golden_tree
from spec_hal.errors import InvalidInput


def _outcome(check, args, kwargs):
    try:
        check(*args, **kwargs)
    except InvalidInput as exc:
        return str(exc)
    return None


def _tree_variants():
    tree, cand = golden_tree()
    yield "tree", tree, cand
    yield "int32 links", dataclasses.replace(tree, retrieve_next_token=tree.retrieve_next_token.int()), cand
    yield "int16 links", dataclasses.replace(tree, retrieve_next_sibling=tree.retrieve_next_sibling.short()), cand
    yield "narrow links", dataclasses.replace(tree, retrieve_next_token=tree.retrieve_next_token[:, :5]), cand
    yield "bool steps", dataclasses.replace(tree, num_steps=True), cand
    yield "huge steps", dataclasses.replace(tree, num_steps=10**6), cand
    yield "meta index", dataclasses.replace(tree, retrieve_index=tree.retrieve_index.to("meta")), cand
    yield "1-D index", dataclasses.replace(tree, retrieve_index=tree.retrieve_index.reshape(-1)), cand
    yield "float candidates", tree, cand.float()
    yield "narrow candidates", tree, cand[:, :5]
    yield "not a tree", cand, cand


def _calls():
    bs, nodes = golden_tree()[1].shape
    predicts = {
        "flat ids": torch.zeros(bs * nodes, dtype=torch.int64), "2-D ids": torch.zeros(bs, nodes, dtype=torch.int32),
        "short ids": torch.zeros(bs * nodes - 1, dtype=torch.int64), "logits": torch.zeros(bs * nodes, 7),
        "3-D logits": torch.zeros(bs, nodes, 7, dtype=torch.bfloat16), "empty vocab": torch.zeros(bs * nodes, 0),
        "3-D empty vocab": torch.zeros(bs, nodes, 0), "3-D short": torch.zeros(bs, nodes - 1, 7), "bool": torch.zeros(bs * nodes, dtype=torch.bool), "meta": torch.zeros(bs * nodes, dtype=torch.int64, device="meta"),
        "list": [0] * (bs * nodes),
    }
    probs = {"3-D": torch.zeros(bs, nodes, 10), "2-D": torch.zeros(bs * nodes, 10), "double": torch.zeros(bs, nodes, 10).double(),
             "short": torch.zeros(bs, nodes - 1, 10), "empty vocab": torch.zeros(bs, nodes, 0)}
    coins, final = torch.zeros(bs, nodes), torch.zeros(bs)
    for label, tree, cand in _tree_variants():
        for name, predict in predicts.items():
            yield f"greedy {label} {name}", verify.check_verify_greedy, (tree, cand, predict), {}
        for name, prob in probs.items():
            yield f"sampling {label} {name}", verify.check_verify_sampling, (tree, cand, prob, coins, final), {}
    tree, cand = golden_tree()
    for name, value in (("int threshold", 1), ("nan threshold", float("nan")), ("big threshold", 1.5), ("bool threshold", True)):
        yield f"sampling {name}", verify.check_verify_sampling, (tree, cand, probs["3-D"], coins, final), {"threshold_acc": value}
    for name, value in (("short coins", coins[:, :5]), ("double coins", coins.double()), ("int coins", coins.int())):
        yield f"sampling {name}", verify.check_verify_sampling, (tree, cand, probs["3-D"], value, final), {}
    yield "sampling 2-D final", verify.check_verify_sampling, (tree, cand, probs["3-D"], coins, final[:, None]), {}
    for name, predict in predicts.items():
        yield f"chain {name}", verify.check_verify_chain, (cand, predict), {}
        yield f"chain empty {name}", verify.check_verify_chain, (cand[:, :0], predict), {}
        yield f"chain float {name}", verify.check_verify_chain, (cand.float(), predict), {}
    ids, q, p = torch.zeros(bs, 3, dtype=torch.int64), torch.zeros(bs, 3, 10), torch.zeros(bs, 4, 10)
    chain_coins = torch.zeros(bs, 3)
    for name, args in (("ok", (ids, q, p)), ("no q", (ids, None, p)), ("q vocab", (ids, torch.zeros(bs, 3, 11), p)),
                       ("short p", (ids, q, p[:, :3])), ("2-D p", (ids, q, p.reshape(bs * 4, 10))), ("int8 ids", (ids.to(torch.int8), q, p)),
                       ("1-D ids", (ids[0], q, p)), ("meta ids", (ids.to("meta"), q, p))):
        yield f"chain sampling {name}", verify.check_verify_chain_sampling, (*args, chain_coins, final), {}
    yield "chain sampling short coins", verify.check_verify_chain_sampling, (ids, q, p, chain_coins[:, :2], final), {}


CALLS = list(_calls())


@pytest.mark.parametrize("index", range(len(CALLS)), ids=[call[0] for call in CALLS])
def test_fast_path_agrees_with_detailed_checks(index, monkeypatch):
    _, check, args, kwargs = CALLS[index]
    fast = _outcome(check, args, kwargs)
    monkeypatch.setattr(verify, "_tree_ok", lambda tree: None)
    monkeypatch.setattr(verify, "_target_predict_ok", lambda *a: False)
    monkeypatch.setattr(verify, "_probs_ok", lambda *a: None)
    assert fast == _outcome(check, args, kwargs)


def test_fast_paths_take_the_common_calls(monkeypatch):
    """The common calls return from the fast path (the detailed checks are not reached)."""
    tree, cand = golden_tree()
    monkeypatch.setattr(verify, "_check_tree", None)  # would raise TypeError if called
    verify.check_verify_greedy(tree, cand, torch.zeros(cand.numel(), dtype=torch.int64))
    verify.check_verify_sampling(tree, cand, torch.zeros(*cand.shape, 10), torch.zeros(cand.shape), torch.zeros(cand.shape[0]))
