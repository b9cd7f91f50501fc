"""Every op as ``torch.ops.spec_hal.<op>``: opcheck on cpu, the schema's coverage, the wrapper's
results equal to the eager op's, and a full speculative step under torch.compile(fullgraph=True)
with zero graph breaks (dynamo's own counters), equal to eager, static and dynamic shapes."""
from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

import spec_hal
from spec_hal import torch_library
from spec_hal.registry import all_ops
from spec_hal.types import Verdict

from speculative_step import MUTATED, NODES, TOPK, speculative_step, step_inputs


def _pipeline(bs: int = 3):
    """Real intermediate values of one step (trees, verdicts...) to build op examples from."""
    x = step_inputs(bs)
    probs, ids = spec_hal.draft_topk(x["logits"], TOPK)
    level0 = spec_hal.expand_tree(0, None, probs, ids, hidden=x["hidden"])
    probs1, ids1 = spec_hal.draft_topk(x["draft_table"][level0.input_ids], TOPK)
    level1 = spec_hal.expand_tree(1, level0.scores, probs1, ids1, hidden=level0.hidden)
    parents, selected, draft_tokens = spec_hal.organize_draft([level0.record, level1.record], NODES)
    tree = spec_hal.build_tree(x["roots"], parents, selected, draft_tokens, x["seq_lens"], topk=TOPK)
    candidates = tree.tokens.view(bs, NODES)
    verdict = spec_hal.verify_greedy(tree, candidates, x["target_table"][tree.tokens])
    return dict(x=x, probs=probs, ids=ids, level0=level0, probs1=probs1, ids1=ids1, parents=parents, selected=selected,
                draft_tokens=draft_tokens, tree=tree, candidates=candidates, verdict=verdict)


def _empty_verdict(bs: int, nodes: int, width: int) -> Verdict:
    return Verdict(torch.empty(bs * nodes, dtype=torch.int32), torch.empty(bs, width, dtype=torch.int32),
                   torch.empty(bs, dtype=torch.int32), torch.empty(bs, dtype=torch.int32))


def op_examples() -> list[tuple[str, str, tuple, dict]]:
    """(case id, op, args, kwargs): every op, its out= form where it has one, optional inputs."""
    p = _pipeline()
    x, tree, verdict, candidates = p["x"], p["tree"], p["verdict"], p["candidates"]
    bs, vocab = x["logits"].shape
    target_logits = x["target_table"][tree.tokens]
    target_probs = x["target_probs_table"][tree.tokens].view(bs, NODES, vocab)
    chain = torch.randint(0, vocab, (bs, 3))
    chain_probs = torch.softmax(torch.randn(bs * 3, vocab), dim=1)
    roots, seq_lens = x["roots"], x["seq_lens"]
    state = dict(slots=x["mamba_slots"], ssm_state=x["ssm_state"], ssm_intermediate=x["ssm_intermediate"],
                 conv_state=x["conv_state"], conv_intermediate=x["conv_intermediate"])
    draft = dict(req_pool_indices=x["req_pool_indices"], seq_lens=seq_lens, num_steps=2, topk=TOPK, page_size=4)
    rows = bs * 3 * TOPK * 2  # assign_draft_slots with page_size 4: holes = (K-1)(P-1) = 3 per request
    return [
        ("draft_topk", "draft_topk", (x["logits"], TOPK), {}),
        ("draft_topk-token_map", "draft_topk", (x["logits"], 3), {"token_map": torch.randperm(vocab) * 2}),
        ("draft_topk-out", "draft_topk", (x["logits"], TOPK), {"out": (torch.empty(bs, TOPK), torch.empty(bs, TOPK, dtype=torch.int64))}),
        ("expand_tree-0", "expand_tree", (0, None, p["probs"], p["ids"]), {"hidden": x["hidden"]}),
        ("expand_tree-0-nohidden", "expand_tree", (0, None, p["probs"], p["ids"]), {}),
        ("expand_tree-1", "expand_tree", (1, p["level0"].scores, p["probs1"], p["ids1"]), {"hidden": p["level0"].hidden}),
        ("organize_draft", "organize_draft", ([p["level0"].record], 2), {}),
        ("build_tree", "build_tree", (roots, p["parents"], p["selected"], p["draft_tokens"], seq_lens), {"topk": TOPK}),
        ("build_tree-bitpacked", "build_tree", (roots, p["parents"], p["selected"], p["draft_tokens"], seq_lens),
         {"topk": TOPK, "mask_mode": "bitpacked"}),
        ("build_tree-full", "build_tree", (roots, p["parents"], p["selected"], p["draft_tokens"], seq_lens),
         {"topk": TOPK, "mask_mode": "full", "seq_lens_sum": int(seq_lens.sum())}),
        ("verify_greedy", "verify_greedy", (tree, candidates, target_logits), {}),
        ("verify_greedy-ids-out", "verify_greedy", (tree, candidates, target_logits.argmax(1)), {"out": _empty_verdict(bs, NODES, 3)}),
        ("verify_sampling", "verify_sampling", (tree, candidates, target_probs, x["coins"], x["final_coins"]), {"threshold_acc": 0.5}),
        ("verify_sampling-out", "verify_sampling", (tree, candidates, target_probs, x["coins"], x["final_coins"]),
         {"out": _empty_verdict(bs, NODES, 3)}),
        ("verify_chain", "verify_chain", (chain, chain.roll(1, dims=1)), {}),
        ("verify_chain-out", "verify_chain", (chain, chain), {"out": (torch.empty(bs, dtype=torch.int32), torch.empty(bs, dtype=torch.int64))}),
        ("verify_chain_sampling", "verify_chain_sampling",
         (chain[:, :2], chain_probs[: bs * 2], chain_probs, torch.rand(bs, 2), torch.rand(bs)), {}),
        ("verify_chain_sampling-out", "verify_chain_sampling",
         (chain[:, :2], chain_probs[: bs * 2], chain_probs, torch.rand(bs, 2), torch.rand(bs)), {"out": _empty_verdict(bs, 3, 3)}),
        ("bonus_tokens", "bonus_tokens", (verdict,), {}),
        ("bonus_tokens-out", "bonus_tokens", (verdict,), {"out": torch.empty(bs, dtype=torch.int32)}),
        ("compact_accepted", "compact_accepted", (x["hidden_table"][tree.tokens], verdict), {}),
        ("compact_accepted-out", "compact_accepted", (verdict.predict, verdict), {"out": torch.empty_like(verdict.predict)}),
        ("accepted_kv_moves", "accepted_kv_moves", (verdict, x["kv_node_slots"]), {}),
        ("accepted_kv_moves-out", "accepted_kv_moves", (verdict, x["kv_node_slots"]),
         {"out": (torch.empty(bs * 3, dtype=torch.int64), torch.empty(bs * 3, dtype=torch.int64))}),
        ("move_kv", "move_kv", ([x["k_cache"], x["v_cache"]], *spec_hal.accepted_kv_moves(verdict, x["kv_node_slots"])), {}),
        ("assign_draft_slots", "assign_draft_slots", (x["req_to_token"],), draft),
        ("assign_draft_slots-out", "assign_draft_slots", (x["req_to_token"],),
         {**draft, "out": tuple(torch.empty(n, dtype=torch.int64) for n in (bs * TOPK * 2, rows // 4, rows // 4))}),
        ("mamba_commit_steps", "mamba_commit_steps", (verdict, seq_lens), {"track_interval": 4}),
        ("scatter_mamba_state", "scatter_mamba_state", (),
         dict(dst=x["ssm_state"], src=x["ssm_intermediate"], dst_slots=x["mamba_slots"], src_steps=torch.tensor([0, 2, 1]))),
        ("commit_mamba_state", "commit_mamba_state", (), dict(verdict=verdict, seq_lens=seq_lens, **state)),
    ]


EXAMPLES = op_examples()


def test_every_op_is_a_custom_op_with_an_example():
    ops = torch_library.register()
    assert not torch_library._UNREGISTERED
    assert set(ops) == set(all_ops())
    assert {op for _, op, _, _ in EXAMPLES} == set(all_ops())
    with_out = {op for case, op, _, kwargs in EXAMPLES if "out" in kwargs}
    assert with_out == {name for name, op in ops.items() if op.has_out}


@pytest.mark.parametrize("case,op,args,kwargs", EXAMPLES, ids=[case for case, *_ in EXAMPLES])
def test_opcheck(case, op, args, kwargs):
    overload, flat = torch_library.flat_call(op, *args, **kwargs)
    torch.library.opcheck(overload, flat)


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_clone(v) for v in value)
    if dataclasses.is_dataclass(value) or hasattr(value, "_fields"):
        fields = [getattr(value, f.name) for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value) else list(value)
        return type(value)(*[_clone(v) for v in fields])
    return value


def _assert_same(got, want, where=""):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want), where
    elif dataclasses.is_dataclass(want) or isinstance(want, (list, tuple)):
        assert type(got) is type(want), where
        items = [(getattr(got, f.name), getattr(want, f.name)) for f in dataclasses.fields(want)] if dataclasses.is_dataclass(want) else zip(got, want)
        for index, (g, w) in enumerate(items):
            _assert_same(g, w, f"{where}[{index}]")
    else:
        assert got == want, where


@pytest.mark.parametrize("case,op,args,kwargs", EXAMPLES, ids=[case for case, *_ in EXAMPLES])
def test_custom_op_path_equals_the_eager_op(case, op, args, kwargs):
    """The wrapper rebuilds the same result types and values, and mutates the same buffers."""
    eager_args, eager_kwargs = _clone(args), _clone(kwargs)
    want = getattr(spec_hal, op)(*eager_args, **eager_kwargs)
    got_args, got_kwargs = _clone(args), _clone(kwargs)
    got = torch_library.call_custom_op(op, got_args, got_kwargs)
    _assert_same(got, want, op)
    _assert_same(got_args, eager_args, "args")
    _assert_same(got_kwargs, eager_kwargs, "kwargs")


def test_wrong_signature_names_the_public_op():
    with pytest.raises(TypeError, match=r"spec_hal\.build_tree\(\)"):
        spec_hal.build_tree(torch.zeros(1, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"spec_hal\.draft_topk\(\)"):
        spec_hal.draft_topk(torch.zeros(1, 4), 1, bogus=1)
    with pytest.raises(TypeError, match=r"spec_hal\.verify_chain\(\)"):
        spec_hal.get_backend("cpu").verify_chain(torch.zeros(1, 2, dtype=torch.int64))


def test_invalid_input_through_the_dispatcher_keeps_its_type():
    overload, flat = torch_library.flat_call("draft_topk", torch.zeros(2, 4), 1)
    with pytest.raises(spec_hal.InvalidInput, match="k"):
        overload(flat[0], 9, None)


needs_compiler = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                    reason="torch.compile (inductor) on cpu needs a C++ compiler")


@needs_compiler
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_step_has_no_graph_break_and_equals_eager(dynamic):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(speculative_step, fullgraph=True, dynamic=dynamic)
    sizes = (3, 5) if dynamic else (3,)
    for seed, bs in enumerate(sizes):
        inputs = step_inputs(bs, seed=seed)
        eager_inputs = {name: value.clone() for name, value in inputs.items()}
        got = compiled(**inputs)
        want = speculative_step(**eager_inputs)
        assert len(got) == len(want)
        for index, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and torch.equal(g, w), f"output {index} at bs={bs}"
        for name in MUTATED:
            assert torch.equal(inputs[name], eager_inputs[name]), name
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1  # dynamic: the second batch size reused the graph
