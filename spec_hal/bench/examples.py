"""Inputs of the benchmark suites: one small valid call of every op (host-overhead and cold-start
suites), and the seeded verification inputs the verify, masks and compat suites (and
scripts/compat_vs_sgl_kernel.py) share.

``op_calls(device)`` maps each op name to ``(args, kwargs)`` on ``device``: bs = 1 request, the
shapes of a decode step (S = 3, K = 4, N = 8; V = 32000 for draft_topk, 1000 elsewhere), so
that the device work is a few microseconds and the host cost of a call shows. An op registered
without an entry here appears in the tables as "no example" (tests/test_bench.py asserts there
is none).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

STEPS, TOPK, NODES, BATCH = 3, 4, 8, 1
TOPK_VOCAB, VOCAB = 32000, 1000


class TreeVerifyInputs(NamedTuple):
    """Seeded tree verification inputs on one device: bs requests of N nodes, S steps."""

    tree: object  # DraftTree
    candidates: torch.Tensor  # (bs, N) int64
    logits: torch.Tensor  # (bs*N, V) float32; every other node's first child has logit 20
    target_predict: torch.Tensor  # (bs, N) int64 argmax of the logits
    target_probs: torch.Tensor  # (bs, N, V) float32 softmax of the logits
    coins: torch.Tensor  # (bs, N) float32
    final_coins: torch.Tensor  # (bs,) float32


def tree_verify_inputs(bs: int, nodes: int, steps: int, vocab: int, device, *, sampling: bool = True) -> TreeVerifyInputs:
    """A random tree whose target accepts about half the nodes (every other node predicts its first
    child's token). ``sampling=False`` leaves the argmax, probabilities and coins out (None)."""
    from ..conformance.trees import random_tree, tree_to

    tree, candidates = random_tree(bs, nodes, steps, seed=bs + nodes, vocab=vocab)
    generator = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(bs * nodes, vocab, device=device, generator=generator)
    first_child = candidates.gather(1, tree.retrieve_next_token.clamp(min=0)).reshape(-1).to(device)
    rows = torch.arange(0, bs * nodes, 2, device=device)
    logits[rows, first_child[rows]] = 20.0
    tree, candidates = tree_to(tree, device), candidates.to(device)
    if not sampling:
        return TreeVerifyInputs(tree, candidates, logits, None, None, None, None)
    per_node = logits.view(bs, nodes, vocab)
    return TreeVerifyInputs(tree, candidates, logits, per_node.argmax(dim=-1), torch.softmax(per_node, dim=-1),
                            torch.rand(bs, nodes, device=device, generator=generator), torch.rand(bs, device=device, generator=generator))


def draft_tree_records(bs: int, topk: int, steps: int, nodes: int, *, seed: int, vocab: int = 100):
    """(parent_list, selected_index, draft_tokens) of a seeded EAGLE expansion (build_tree inputs, on the CPU)."""
    from ..conformance.tree_inputs import random_draft_tree

    tree = random_draft_tree(bs, topk=topk, num_steps=steps, num_draft_tokens=nodes, seed=seed, vocab=vocab)
    return tree.parents, tree.selected, tree.draft_tokens


def _verify_calls(device) -> dict:
    from ..conformance.trees import random_tree, tree_to

    tree, candidates = random_tree(BATCH, NODES, STEPS, seed=0, vocab=VOCAB)
    tree, candidates = tree_to(tree, device), candidates.to(device)
    generator = torch.Generator().manual_seed(1)
    predict = torch.randint(0, VOCAB, (BATCH * NODES,), generator=generator).to(device)
    probs = torch.softmax(torch.randn(BATCH, NODES, VOCAB, generator=generator), dim=-1).to(device)
    coins = torch.rand(BATCH, NODES, generator=generator).to(device)
    final_coins = torch.rand(BATCH, generator=generator).to(device)
    chain = torch.randint(0, VOCAB, (BATCH, STEPS + 1), generator=generator).to(device)
    chain_predict = torch.randint(0, VOCAB, (BATCH * (STEPS + 1),), generator=generator).to(device)
    draft_probs = torch.softmax(torch.randn(BATCH, STEPS, VOCAB, generator=generator), dim=-1).to(device)
    target_probs = torch.softmax(torch.randn(BATCH, STEPS + 1, VOCAB, generator=generator), dim=-1).to(device)
    chain_coins = torch.rand(BATCH, STEPS, generator=generator).to(device)
    return {
        "verify_greedy": ((tree, candidates, predict), {}),
        "verify_sampling": ((tree, candidates, probs, coins, final_coins), {}),
        "verify_chain": ((chain, chain_predict), {}),
        "verify_chain_sampling": ((chain[:, 1:], draft_probs, target_probs, chain_coins, final_coins), {}),
        "verify_tree_sampling": ((tree, candidates, probs, probs, coins, final_coins), {}),
        # Ragged: one request with S drafts (flat layout: T = S drafts, T + bs target rows).
        "verify_chain_ragged": ((chain[0, 1:], torch.full((BATCH,), STEPS, device=device), chain_predict), dict(max_drafts=STEPS)),
        "verify_chain_sampling_ragged": ((chain[0, 1:], torch.full((BATCH,), STEPS, device=device), draft_probs[0], target_probs[0],
                                          chain_coins[0], final_coins), dict(max_drafts=STEPS)),
    }


def _round_calls(device) -> dict:
    from ..conformance.verdicts import random_round, verdict_to

    round_ = random_round(BATCH, num_steps=STEPS, num_nodes=NODES, generator=torch.Generator().manual_seed(2))
    verdict = verdict_to(round_.verdict, device)
    slots = (torch.arange(BATCH * NODES, dtype=torch.int64) + 16).view(BATCH, NODES).to(device)
    caches = [torch.zeros(64, 2, 64, dtype=torch.bfloat16, device=device) for _ in range(2)]
    src = torch.tensor([-1, 18, 19, -1], dtype=torch.int64, device=device)
    dst = torch.tensor([-1, 17, 18, -1], dtype=torch.int64, device=device)
    req_to_token = torch.arange(4 * 64, dtype=torch.int64).view(4, 64).to(device)
    seq_lens = torch.full((BATCH,), 10, dtype=torch.int64, device=device)
    return {
        "bonus_tokens": ((verdict,), {}),
        "compact_accepted": ((verdict.predict, verdict), {}),
        "accepted_kv_moves": ((verdict, slots), {}),
        "move_kv": ((caches, src, dst), {}),
        "assign_draft_slots": ((req_to_token,), dict(req_pool_indices=torch.zeros(BATCH, dtype=torch.int64, device=device),
                                                      seq_lens=seq_lens, num_steps=STEPS, topk=TOPK, page_size=1)),
    }


def _tree_calls(device) -> dict:
    from ..conformance.tree_inputs import random_draft_tree, random_step_probs

    tree = random_draft_tree(BATCH, topk=TOPK, num_steps=STEPS, num_draft_tokens=NODES, seed=3)
    move = lambda t: t.to(device)  # noqa: E731
    records = [type(r)(move(r.scores), move(r.tokens), move(r.parents)) for r in tree.records]
    generator = torch.Generator().manual_seed(4)
    scores = move(random_step_probs(BATCH, TOPK, generator, "random"))
    probs = move(random_step_probs(BATCH * TOPK, TOPK, generator, "random"))
    ids = move(torch.randint(0, VOCAB, (BATCH * TOPK, TOPK), generator=generator))
    build = tuple(map(move, (tree.roots, tree.parents, tree.selected, tree.draft_tokens, tree.seq_lens)))
    return {
        "expand_tree": ((1, scores, probs, ids), {}),
        "organize_draft": ((records, NODES), {}),
        "build_tree": (build, dict(topk=TOPK)),
    }


def _mamba_calls(device) -> dict:
    from ..conformance.mamba_inputs import random_verdict

    verdict = random_verdict(BATCH, num_steps=STEPS, topk=1, num_nodes=STEPS + 1, seed=5, device=device)
    seq_lens = torch.full((BATCH,), 31, dtype=torch.int64, device=device)
    slots = torch.arange(BATCH, dtype=torch.int64, device=device) + 1
    ssm_state = torch.zeros(2, BATCH + 2, 4, 16, dtype=torch.float32, device=device)
    ssm_intermediate = torch.randn(2, BATCH, STEPS + 1, 4, 16, device=device)
    conv_state = torch.zeros(2, BATCH + 2, 32, 3, dtype=torch.bfloat16, device=device)
    conv_intermediate = torch.randn(2, BATCH, STEPS + 1, 32, 3, device=device).to(torch.bfloat16)
    steps = torch.zeros(BATCH, dtype=torch.int64, device=device)
    return {
        "mamba_commit_steps": ((verdict, seq_lens), dict(track_interval=16)),
        "scatter_mamba_state": ((), dict(dst=ssm_state, src=ssm_intermediate, dst_slots=slots, src_steps=steps)),
        "commit_mamba_state": ((), dict(verdict=verdict, seq_lens=seq_lens, slots=slots, ssm_state=ssm_state,
                                        ssm_intermediate=ssm_intermediate, conv_state=conv_state, conv_intermediate=conv_intermediate)),
    }


def _sampling_calls(device) -> dict:
    from ..conformance.trees import random_tree, tree_to

    tree, candidates = random_tree(BATCH, NODES, STEPS, seed=6, vocab=VOCAB)
    generator = torch.Generator().manual_seed(6)
    logits = torch.randn(BATCH * NODES, VOCAB, generator=generator).to(device)
    chain_logits = torch.randn(BATCH * (STEPS + 1), VOCAB, generator=generator).to(device)
    draft_ids = torch.randint(0, VOCAB, (BATCH, STEPS), generator=generator).to(device)
    params = dict(temperature=torch.full((BATCH,), 0.8, device=device), top_k=torch.full((BATCH,), 50, dtype=torch.int64, device=device),
                  top_p=torch.full((BATCH,), 0.95, device=device), seed=torch.arange(BATCH, dtype=torch.int64, device=device),
                  offset=torch.zeros(BATCH, dtype=torch.int64, device=device))
    return {
        "process_logits": ((logits,), dict(temperature=0.8, top_k=50, top_p=0.95)),
        "verify_sampling_from_logits": ((tree_to(tree, device), candidates.to(device), logits), params),
        "verify_chain_sampling_from_logits": ((draft_ids, None, chain_logits), params),
    }


def op_calls(device: torch.device) -> dict:
    """op name -> (args, kwargs): one small valid call on ``device`` (an entry whose op is not
    registered in this build is ignored by the suites)."""
    logits = torch.randn(BATCH, TOPK_VOCAB, generator=torch.Generator().manual_seed(0)).to(device)
    masked = logits.clone()  # written in place (to -inf where masked: the same on every call)
    every_token = torch.full((BATCH, (TOPK_VOCAB + 31) // 32), -1, dtype=torch.int32, device=device)
    calls = {"draft_topk": ((logits, TOPK), {}), "apply_token_bitmask_": ((masked, every_token), {})}
    for family in (_verify_calls, _sampling_calls, _round_calls, _tree_calls, _mamba_calls):
        calls.update(family(device))
    return calls
