"""One full speculative step made of spec_hal ops, seeded inputs for it, and one example call of
every op (shared by tests/test_torch_library.py and spec_hal/bench/host_overhead.py).

The "models" are lookup tables (token -> logits, token -> target distribution, token -> hidden),
so every value inside the step comes from spec_hal ops and exact gathers: a compiled step must
equal the eager one bit for bit, floats included.
"""
from __future__ import annotations

import dataclasses

import torch

import spec_hal
from spec_hal.types import Verdict

TOPK = 2
STEPS = 2
NODES = 4  # tree nodes per request, root included
# Sizes below avoid the batch sizes the tests use (3, 5): dynamo's duck sizing would tie equal sizes.
PAGE = 2
LAYERS = 2


MUTATED = ("k_cache", "v_cache", "ssm_state", "conv_state")
CHAIN_TOP_K = 3  # top-k of the chain verification from logits


def step_inputs(bs: int, *, vocab: int = 16, hidden: int = 8, seed: int = 0, device="cpu") -> dict:
    """Every input of :func:`speculative_step` for ``bs`` requests (fresh tensors each call)."""
    gen = torch.Generator().manual_seed(seed)
    draft_table = torch.randn(vocab, vocab, generator=gen)
    target_table = torch.randn(vocab, vocab, generator=gen)
    seq_lens = torch.randint(3, 9, (bs,), generator=gen)
    kv_slots = bs * NODES + 8
    table_width = 64
    req_to_token = (torch.arange(bs * table_width) + 5).view(bs, table_width)
    inputs = {
        "logits": torch.randn(bs, vocab, generator=gen),
        "draft_table": draft_table,
        "target_table": target_table,
        "target_probs_table": torch.softmax(target_table, dim=1),
        "hidden_table": torch.randn(vocab, hidden, generator=gen),
        "hidden": torch.randn(bs, hidden, generator=gen),
        "roots": torch.randint(0, vocab, (bs,), generator=gen),
        "seq_lens": seq_lens,
        "coins": torch.rand(bs, NODES, generator=gen),
        "final_coins": torch.rand(bs, generator=gen),
        "kv_node_slots": (torch.randperm(bs * NODES, generator=gen) + 8).view(bs, NODES),
        "k_cache": torch.randn(kv_slots, 2, 6, generator=gen),
        "v_cache": torch.randn(kv_slots, 2, 6, generator=gen),
        "req_to_token": req_to_token,
        "req_pool_indices": torch.randperm(bs, generator=gen),
        "mamba_slots": torch.randperm(bs + 2, generator=gen)[:bs],
        "ssm_state": torch.randn(LAYERS, bs + 2, 6, 10, generator=gen),
        "ssm_intermediate": torch.randn(LAYERS, bs, NODES, 6, 10, generator=gen),
        "conv_state": torch.randn(LAYERS, bs + 2, 9, generator=gen),
        "conv_intermediate": torch.randn(LAYERS, bs, NODES, 9, generator=gen),
        # per-request sampling parameters (request 0 greedy) and the counter-based RNG's key
        "temperature": torch.cat([torch.zeros(1), torch.rand(bs - 1, generator=gen) + 0.5]),
        "seed": torch.randint(0, 2**62, (bs,), generator=gen),
        "offset": torch.randint(0, 1000, (bs,), generator=gen),
    }
    return {name: value.to(device) for name, value in inputs.items()}


def speculative_step(logits, draft_table, target_table, target_probs_table, hidden_table, hidden, roots, seq_lens,
                     coins, final_coins, kv_node_slots, k_cache, v_cache, req_to_token, req_pool_indices,
                     mamba_slots, ssm_state, ssm_intermediate, conv_state, conv_intermediate, temperature, seed, offset):
    """Draft (two EAGLE levels), build the tree, verify greedily and by sampling (from
    probabilities and coins, and from raw logits with per-request temperature and seeded coins, a
    tree and a chain), take the bonus, compact, move the accepted KV, assign the next draft's
    slots and commit the Mamba state.
    Returns the step's tensors; the KV caches and Mamba pools are updated in place."""
    bs = logits.shape[0]
    probs, ids = spec_hal.draft_topk(logits, TOPK)
    level0 = spec_hal.expand_tree(0, None, probs, ids, hidden=hidden)
    probs1, ids1 = spec_hal.draft_topk(draft_table[level0.input_ids], TOPK)
    level1 = spec_hal.expand_tree(1, level0.scores, probs1, ids1, hidden=level0.hidden)
    parents, selected, draft_tokens = spec_hal.organize_draft([level0.record, level1.record], NODES)
    tree = spec_hal.build_tree(roots, parents, selected, draft_tokens, seq_lens, topk=TOPK)
    candidates = tree.tokens.view(bs, NODES)
    verdict = spec_hal.verify_greedy(tree, candidates, target_table[tree.tokens])
    sampled = spec_hal.verify_sampling(tree, candidates, target_probs_table[tree.tokens], coins, final_coins)
    from_logits = spec_hal.verify_sampling_from_logits(tree, candidates, target_table[tree.tokens], temperature=temperature, top_p=0.9,
                                                       seed=seed, offset=offset, logprobs="processed", top_logprobs=2)
    chain_rows = torch.cat([roots[:, None], ids], dim=1).reshape(-1)
    chain = spec_hal.verify_chain_sampling_from_logits(ids, None, target_table[chain_rows], temperature=temperature,
                                                       top_k=CHAIN_TOP_K, seed=seed, offset=offset, logprobs="raw")
    processed = spec_hal.process_logits(logits, temperature=0.8, min_p=0.05)
    bonus = spec_hal.bonus_tokens(verdict)
    compacted = spec_hal.compact_accepted(hidden_table[tree.tokens], verdict)
    src, dst = spec_hal.accepted_kv_moves(verdict, kv_node_slots)
    spec_hal.move_kv([k_cache, v_cache], src, dst)
    slots = spec_hal.assign_draft_slots(req_to_token, req_pool_indices=req_pool_indices, seq_lens=seq_lens + verdict.accept_lens,
                                        num_steps=STEPS, topk=TOPK, page_size=PAGE)
    commit = spec_hal.commit_mamba_state(verdict=verdict, seq_lens=seq_lens, slots=mamba_slots, ssm_state=ssm_state,
                                         ssm_intermediate=ssm_intermediate, conv_state=conv_state,
                                         conv_intermediate=conv_intermediate)
    return (probs, ids, level1.scores, level1.hidden, tree.positions, tree.mask, tree.retrieve_next_token, verdict.predict,
            verdict.accept_index, verdict.accept_lens, sampled.predict, sampled.accept_index, bonus, compacted, src, dst,
            *slots, commit.last_step, commit.bytes_moved, from_logits.verdict.accept_index, from_logits.logprobs,
            from_logits.top_ids, from_logits.top_logprobs, chain.verdict.predict, chain.logprobs, processed)


# ---------------------------------------------------------------------------------------------
# one example call of every op (and of its out= form), from the values of a real step


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
    return Verdict(*(torch.empty(shape, dtype=torch.int32) for shape in ((bs * nodes,), (bs, width), (bs,), (bs,))))


def op_examples(device="cpu") -> list[tuple[str, str, tuple, dict]]:
    """(case id, op, args, kwargs): every op, its out= form where it has one, optional inputs.
    Built on the cpu by the reference, then moved to ``device``."""
    return [(case, op, _to(args, device), _to(kwargs, device)) for case, op, args, kwargs in _cpu_examples()]


def _to(value, device):
    """``value`` with every tensor inside (lists, tuples, dicts, dataclasses) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, torch.Generator):
        return torch.Generator(device=device).manual_seed(value.initial_seed())
    if isinstance(value, dict):
        return {key: _to(item, device) for key, item in value.items()}
    if dataclasses.is_dataclass(value):
        return type(value)(*(_to(getattr(value, f.name), device) for f in dataclasses.fields(value)))
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_to(item, device) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to(item, device) for item in value)
    return value


def _cpu_examples() -> list[tuple[str, str, tuple, dict]]:
    gen = torch.Generator().manual_seed(1)
    p = _pipeline()
    x, tree, verdict, candidates = p["x"], p["tree"], p["verdict"], p["candidates"]
    bs, vocab = x["logits"].shape
    target_logits = x["target_table"][tree.tokens]
    target_probs = x["target_probs_table"][tree.tokens].view(bs, NODES, vocab)
    chain = torch.randint(0, vocab, (bs, 3), generator=gen)
    chain_probs = torch.softmax(torch.randn(bs * 3, vocab, generator=gen), dim=1)
    roots, seq_lens = x["roots"], x["seq_lens"]
    state = dict(slots=x["mamba_slots"], ssm_state=x["ssm_state"], ssm_intermediate=x["ssm_intermediate"],
                 conv_state=x["conv_state"], conv_intermediate=x["conv_intermediate"])
    draft = dict(req_pool_indices=x["req_pool_indices"], seq_lens=seq_lens, num_steps=2, topk=TOPK, page_size=4)
    rows = bs * 3 * TOPK * 2  # assign_draft_slots with page_size 4: holes = (K-1)(P-1) = 3 per request
    node_mask = spec_hal.pack_bitmask(torch.rand(bs * NODES, vocab, generator=gen) < 0.7)
    draft_probs = torch.softmax(torch.randn(bs, NODES, vocab, generator=gen), dim=-1)
    counts = torch.randint(0, 4, (bs,), generator=gen)  # ragged chains, max_drafts 3
    flat = int(counts.sum())
    ragged_drafts = torch.randint(0, vocab, (flat,), generator=gen)
    ragged_probs = torch.softmax(torch.randn(flat + bs, vocab, generator=gen), dim=1)
    ragged_sampling = (ragged_drafts, counts, ragged_probs[:flat], ragged_probs, torch.rand(flat, generator=gen), torch.rand(bs, generator=gen))
    return [
        ("draft_topk", "draft_topk", (x["logits"], TOPK), {}),
        ("draft_topk-token_map", "draft_topk", (x["logits"], 3), {"token_map": torch.randperm(vocab, generator=gen) * 2}),
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
         (chain[:, :2], chain_probs[: bs * 2], chain_probs, torch.rand(bs, 2, generator=gen), torch.rand(bs, generator=gen)), {}),
        ("verify_chain_sampling-out", "verify_chain_sampling",
         (chain[:, :2], chain_probs[: bs * 2], chain_probs, torch.rand(bs, 2, generator=gen), torch.rand(bs, generator=gen)), {"out": _empty_verdict(bs, 3, 3)}),
        ("verify_greedy-masked", "verify_greedy", (tree, candidates, target_logits),
         {"token_bitmask": node_mask[:2], "bitmask_index": torch.arange(bs * NODES) % 3 - 1}),
        ("verify_tree_sampling", "verify_tree_sampling", (tree, candidates, draft_probs, target_probs, x["coins"], x["final_coins"]),
         {"token_bitmask": node_mask}),
        ("verify_tree_sampling-out", "verify_tree_sampling", (tree, candidates, draft_probs, target_probs, x["coins"], x["final_coins"]),
         {"out": _empty_verdict(bs, NODES, 3)}),
        ("verify_chain_ragged", "verify_chain_ragged", (ragged_drafts, counts, ragged_probs.log()), {"max_drafts": 3}),
        ("verify_chain_ragged-out", "verify_chain_ragged", (ragged_drafts, counts, ragged_probs.argmax(1)),
         {"max_drafts": 3, "out": _empty_verdict(bs, 4, 4)}),
        ("verify_chain_sampling_ragged", "verify_chain_sampling_ragged", ragged_sampling, {"max_drafts": 3}),
        ("verify_chain_sampling_ragged-out", "verify_chain_sampling_ragged", (ragged_drafts, counts, None, *ragged_sampling[3:]),
         {"max_drafts": 3, "out": _empty_verdict(bs, 4, 4)}),
        ("apply_token_bitmask_", "apply_token_bitmask_", (target_logits.clone(), node_mask), {}),
        ("apply_token_bitmask_-index", "apply_token_bitmask_", (target_logits.clone(), node_mask[:2]),
         {"bitmask_index": torch.arange(bs * NODES, dtype=torch.int32) % 3 - 1}),
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
        *_sampling_examples(p, gen),
    ]


def _sampling_examples(p: dict, gen: torch.Generator) -> list[tuple[str, str, tuple, dict]]:
    """The from-logits family: numbers and per-request tensors, every source of randomness
    (the ``-generator`` cases take a torch.Generator: eager only, see docs/torch-compile.md),
    logprobs modes, top logprobs, out=."""
    x, tree, candidates = p["x"], p["tree"], p["candidates"]
    bs, vocab = x["logits"].shape
    target_logits = x["target_table"][tree.tokens]
    key = dict(seed=x["seed"], offset=x["offset"])
    per_request = dict(temperature=x["temperature"], top_k=torch.tensor([0, 3, 5]), top_p=torch.tensor([1.0, 0.8, 0.95]),
                       min_p=torch.tensor([0.0, 0.1, 0.0]))
    chain = p["ids"]
    chain_logits = x["target_table"][torch.cat([x["roots"][:, None], chain], dim=1).reshape(-1)]
    chain_q = torch.softmax(torch.randn(bs * TOPK, vocab, generator=gen), dim=1)
    coins = dict(coins=torch.rand(bs, NODES, generator=gen), final_coins=torch.rand(bs, generator=gen))
    return [
        ("process_logits", "process_logits", (x["logits"],), dict(temperature=0.7, top_k=4, top_p=0.9)),
        ("process_logits-per_request", "process_logits", (x["logits"],), per_request),
        ("process_logits-out", "process_logits", (x["logits"],), dict(temperature=1, min_p=0.1, out=torch.empty(bs, vocab))),
        ("verify_sampling_from_logits", "verify_sampling_from_logits", (tree, candidates, target_logits),
         dict(**per_request, **key, logprobs="processed", top_logprobs=2)),
        ("verify_sampling_from_logits-greedy", "verify_sampling_from_logits", (tree, candidates, target_logits), dict(temperature=0)),
        ("verify_sampling_from_logits-coins-out", "verify_sampling_from_logits", (tree, candidates, target_logits),
         dict(temperature=0.9, top_k=3, **coins, logprobs="raw", out=_empty_verdict(bs, NODES, 3))),
        ("verify_sampling_from_logits-generator", "verify_sampling_from_logits", (tree, candidates, target_logits),
         dict(temperature=1.0, generator=torch.Generator().manual_seed(7))),
        ("verify_chain_sampling_from_logits", "verify_chain_sampling_from_logits", (chain, None, chain_logits),
         dict(**per_request, **key, logprobs="raw", top_logprobs=3)),
        ("verify_chain_sampling_from_logits-q-out", "verify_chain_sampling_from_logits", (chain, chain_q, chain_logits),
         dict(temperature=0.6, **key, out=_empty_verdict(bs, TOPK + 1, TOPK + 1))),
    ]
