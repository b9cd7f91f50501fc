"""The checks' metadata fast paths (verify ops in spec_hal/verify.py; draft_topk, scatter_mamba_state,
the Verdict argument of compaction/kv/mamba ops, move_kv and build_tree) accept exactly what the
detailed checks accept: each call below is checked twice, once as it comes and once with the fast
paths' tests forced to fail (so only the detailed checks run), and the outcomes (accepted, or the
same InvalidInput message) must agree."""
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


def _assert_agrees_with_detailed_checks(call, monkeypatch, disabled):
    """The call's outcome with its fast paths equals the outcome with ``disabled`` (module, name,
    stand-in) patched in, which sends it through the detailed checks."""
    _, check, args, kwargs = call
    fast = _outcome(check, args, kwargs)
    for module, name, stand_in in disabled:
        monkeypatch.setattr(module, name, stand_in)
    assert fast == _outcome(check, args, kwargs)


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
    _assert_agrees_with_detailed_checks(CALLS[index], monkeypatch, [
        (verify, "_tree_ok", lambda tree: None), (verify, "_target_predict_ok", lambda *a: False), (verify, "_probs_ok", lambda *a: None)])


def test_fast_paths_take_the_common_calls(monkeypatch):
    """The common calls return from the fast path (the detailed checks are not reached)."""
    tree, cand = golden_tree()
    monkeypatch.setattr(verify, "_check_tree", None)  # would raise TypeError if called
    verify.check_verify_greedy(tree, cand, torch.zeros(cand.numel(), dtype=torch.int64))
    verify.check_verify_sampling(tree, cand, torch.zeros(*cand.shape, 10), torch.zeros(cand.shape), torch.zeros(cand.shape[0]))


# ----------------------------------------------------------------------------------------------
# draft_topk and scatter_mamba_state: the same agreement, their fast paths forced off by patching
# the module's common-call test.

import spec_hal.mamba as mamba  # noqa: E402
import spec_hal.topk as topk  # noqa: E402


def _topk_calls():
    logits = torch.zeros(3, 20)
    logit_variants = {"ok": logits, "bf16": logits.bfloat16(), "int": logits.int(), "1-D": logits[0], "3-D": logits[None],
                      "no vocab": logits[:, :0], "meta": logits.to("meta"), "strided": logits[:, ::2], "list": [[0.0] * 20]}
    for name, value in logit_variants.items():
        for k in (1, 4, 16, 17, 0, True, 2.0):
            yield f"topk {name} k={k!r}", topk.check_draft_topk, (value, k), {}
    for name, token_map in (("map", torch.arange(20)), ("int32 map", torch.arange(20, dtype=torch.int32)), ("short map", torch.arange(19)),
                            ("float map", torch.zeros(20)), ("2-D map", torch.arange(20)[None]), ("meta map", torch.arange(20, device="meta"))):
        yield f"topk {name}", topk.check_draft_topk, (logits, 4), {"token_map": token_map}
    yield "topk index without mask", topk.check_draft_topk, (logits, 4), {"bitmask_index": torch.zeros(3, dtype=torch.int64)}


def _scatter_calls():
    dst, src = torch.zeros(2, 5, 3, 4), torch.zeros(2, 3, 4, 3, 4)
    slots, steps = torch.tensor([0, 1, -1]), torch.tensor([0, 2, 1], dtype=torch.int32)
    pairs = {"ok": (dst, src), "bf16": (dst.bfloat16(), src.bfloat16()), "mixed dtypes": (dst, src.double()),
             "int pool": (dst.int(), src.int()), "expanded pool": (dst[:, :1].expand(2, 5, 3, 4), src),
             "strided pool": (dst[:, :, :, ::2], src[..., ::2]), "transposed state": (dst.transpose(2, 3), src.transpose(3, 4)),
             "short scratch": (dst, src[:, :2].contiguous()), "other layers": (dst, src[:1]), "state shape, contiguous": (dst, src[..., :3].contiguous()), "state shape": (dst, src[..., :3]),
             "1-D pool": (dst[0, 0, 0], src), "meta": (dst.to("meta"), src.to("meta")), "not a tensor": (None, src)}
    vectors = {"ok": (slots, steps), "int32": (slots.int(), steps), "float slots": (slots.float(), steps),
               "short steps": (slots, steps[:2]), "2-D slots": (slots[None], steps), "none": (None, steps)}
    for pair_name, (pool, scratch) in pairs.items():
        for vector_name, (dst_slots, src_steps) in vectors.items():
            kwargs = dict(dst=pool, src=scratch, dst_slots=dst_slots, src_steps=src_steps)
            yield f"scatter {pair_name} {vector_name}", mamba.check_scatter_mamba_state, (), kwargs
    yield "scatter rows", mamba.check_scatter_mamba_state, (), dict(dst=dst, src=src, dst_slots=slots, src_steps=steps, src_rows=slots)


OTHER_CALLS = list(_topk_calls()) + list(_scatter_calls())


@pytest.mark.parametrize("index", range(len(OTHER_CALLS)), ids=[call[0] for call in OTHER_CALLS])
def test_topk_and_scatter_fast_paths_agree_with_detailed_checks(index, monkeypatch):
    _assert_agrees_with_detailed_checks(OTHER_CALLS[index], monkeypatch, [
        (topk, "_common_call_ok", lambda *a: False), (mamba, "_scatter_ok", lambda *a: False)])


def test_topk_and_scatter_fast_paths_take_the_common_calls(monkeypatch):
    monkeypatch.setattr(topk.checks, "tensor", None)  # the detailed checks would raise TypeError
    topk.check_draft_topk(torch.zeros(3, 20), 4)
    topk.check_draft_topk(torch.zeros(3, 20), 4, token_map=torch.arange(20))
    mamba.check_scatter_mamba_state(dst=torch.zeros(2, 5, 3), src=torch.zeros(2, 3, 4, 3), dst_slots=torch.tensor([0, 1]),
                                    src_steps=torch.tensor([1, 2]))


# ----------------------------------------------------------------------------------------------
# Verdict metadata (bonus_tokens, compact_accepted, accepted_kv_moves, the mamba ops): the fast
# test spec_hal.compaction.verdict_ok against the detailed checks.

import spec_hal.compaction as compaction  # noqa: E402
import spec_hal.kv as kv  # noqa: E402
from spec_hal.types import Verdict  # noqa: E402


def _verdict_variants():
    bs, width, nodes = 3, 4, 5
    predict, index = torch.zeros(bs * nodes, dtype=torch.int32), torch.zeros(bs, width, dtype=torch.int64)
    lens, correct = torch.ones(bs, dtype=torch.int32), torch.zeros(bs, dtype=torch.int32)
    ok = Verdict(predict, index, correct, lens)
    yield "ok", ok
    yield "empty batch", Verdict(predict[:0], index[:0], correct[:0], lens[:0])
    yield "empty batch, predict rows", Verdict(predict, index[:0], correct[:0], lens[:0])
    for field, values in (("predict", {"float": predict.float(), "2-D": predict.view(bs, nodes), "empty": predict[:0],
                                       "not a multiple": predict[:-1], "meta": predict.to("meta"), "list": [0]}),
                          ("accept_index", {"int16": index.short(), "1-D": index[0], "no columns": index[:, :0], "meta": index.to("meta"),
                                            "transposed": index.t().contiguous().t()}),
                          ("accept_lens", {"short": lens[:2], "float": lens.float(), "2-D": lens[:, None], "meta": lens.to("meta")}),
                          ("num_correct", {"short": correct[:2], "bool": correct.bool(), "none": None})):
        for name, value in values.items():
            yield f"{field} {name}", dataclasses.replace(ok, **{field: value})
    yield "not a verdict", (predict, index, correct, lens)


def _verdict_calls():
    slots = torch.zeros(3, 5, dtype=torch.int64)
    for name, verdict in _verdict_variants():
        yield f"verdict {name} bonus", compaction.check_bonus_tokens, (verdict,), {}
        yield f"verdict {name} compact", compaction.check_compact_accepted, (torch.zeros(15, 2), verdict), {}
        yield f"verdict {name} kv moves", kv.check_accepted_kv_moves, (verdict, slots), {}
        yield f"verdict {name} mamba steps", mamba.check_mamba_commit_steps, (verdict, torch.zeros(3, dtype=torch.int64)), {}


VERDICT_CALLS = list(_verdict_calls())


@pytest.mark.parametrize("index", range(len(VERDICT_CALLS)), ids=[call[0] for call in VERDICT_CALLS])
def test_verdict_fast_path_agrees_with_detailed_checks(index, monkeypatch):
    _assert_agrees_with_detailed_checks(VERDICT_CALLS[index], monkeypatch, [
        (compaction, "verdict_ok", lambda verdict: False), (mamba, "verdict_ok", lambda verdict: False)])


def test_verdict_fast_path_takes_the_common_call():
    assert compaction.verdict_ok(next(_verdict_variants())[1])


# ----------------------------------------------------------------------------------------------
# move_kv and build_tree

import spec_hal.tree as tree_ops  # noqa: E402


def _move_kv_calls():
    cache = torch.zeros(6, 2, 4)
    src, dst = torch.tensor([0, 1]), torch.tensor([2, 3], dtype=torch.int32)
    caches = {"ok": [cache, cache.half()], "tuple": (cache,), "empty": [], "not a list": cache, "int8": [cache.to(torch.int8)],
              "bool": [cache.bool()], "0-D": [torch.zeros(())], "expanded": [torch.zeros(1, 2, 4).expand(6, 2, 4)],
              "strided rows": [cache[:, :, ::2]], "strided slots": [torch.zeros(12, 2, 4)[::2]], "meta": [cache.to("meta")],
              "not a tensor": [cache, None], "empty slots": [cache[:0]]}
    vectors = {"ok": (src, dst), "short dst": (src, dst[:1]), "float src": (src.float(), dst), "2-D src": (src[None], dst[None]),
               "meta": (src.to("meta"), dst.to("meta")), "none": (None, dst)}
    for cache_name, value in caches.items():
        for vector_name, (s, d) in vectors.items():
            yield f"move_kv {cache_name} {vector_name}", kv.check_move_kv, (value, s, d), {}


def _build_tree_calls():
    bs, topk, steps = 2, 2, 3
    columns = topk * (steps - 1) + 1
    roots, seq_lens = torch.zeros(bs, dtype=torch.int64), torch.full((bs,), 5, dtype=torch.int32)
    parents, selected = torch.zeros(bs, columns, dtype=torch.int64), torch.zeros(bs, 6, dtype=torch.int64)
    base = dict(roots=roots, parents=parents, selected=selected, draft_tokens=selected.clone(), seq_lens=seq_lens)
    variants = {"ok": {}, "int32": {"parents": parents.int(), "selected": selected.int()}, "float roots": {"roots": roots.float()},
                "2-D roots": {"roots": roots[None]}, "meta roots": {"roots": roots.to("meta")}, "short parents": {"parents": parents[:1]},
                "bad parent columns": {"parents": parents[:, :4]}, "one parent column": {"parents": parents[:, :1]},
                "no parents": {"parents": parents[:, :0]}, "too many drafts": {"selected": torch.zeros(bs, 20, dtype=torch.int64)},
                "tokens shape": {"draft_tokens": selected[:, :5]}, "seq_lens shape": {"seq_lens": seq_lens[:1]},
                "float seq_lens": {"seq_lens": seq_lens.float()}, "list selected": {"selected": [[0] * 6] * bs}}
    options = {"qlen": {}, "full": {"mask_mode": "full"}, "bitpacked": {"mask_mode": "bitpacked"}, "odd mode": {"mask_mode": "dense"},
               "topk 0": {"topk": 0}, "topk bool": {"topk": True}, "topk 65": {"topk": 65}, "sum": {"mask_mode": "full", "seq_lens_sum": 10}}
    for name, change in variants.items():
        for option, extra in options.items():
            kwargs = {**base, **change, "topk": topk, **extra}
            args = tuple(kwargs.pop(key) for key in ("roots", "parents", "selected", "draft_tokens", "seq_lens"))
            yield f"build_tree {name} {option}", tree_ops.check_build_tree, args, kwargs
    wide = torch.zeros(bs, 40, dtype=torch.int64)
    yield "build_tree bitpacked N > 32", tree_ops.check_build_tree, (roots, torch.zeros(bs, 1 + 8 * 4, dtype=torch.int64), wide, wide, seq_lens), {
        "topk": 8, "mask_mode": "bitpacked"}


MORE_CALLS = list(_move_kv_calls()) + list(_build_tree_calls())


@pytest.mark.parametrize("index", range(len(MORE_CALLS)), ids=[call[0] for call in MORE_CALLS])
def test_move_kv_and_build_tree_fast_paths_agree_with_detailed_checks(index, monkeypatch):
    _assert_agrees_with_detailed_checks(MORE_CALLS[index], monkeypatch, [
        (kv, "_move_kv_ok", lambda *a: False), (tree_ops, "_build_tree_ok", lambda *a: False)])


def test_move_kv_and_build_tree_fast_paths_take_the_common_calls(monkeypatch):
    assert kv._move_kv_ok([torch.zeros(6, 2, 4)], torch.tensor([0]), torch.tensor([1]))
    args, kwargs = next((args, kwargs) for name, _, args, kwargs in MORE_CALLS if name == "build_tree ok qlen")
    assert tree_ops._build_tree_ok(*args, kwargs["topk"], "qlen")
