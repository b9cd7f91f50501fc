"""One full speculative step made of spec_hal ops, and seeded inputs for it (shared by the
custom-op tests and benchmarks/host_overhead.py).

The "models" are lookup tables (token -> logits, token -> target distribution, token -> hidden),
so every value inside the step comes from spec_hal ops and exact gathers: a compiled step must
equal the eager one bit for bit, floats included.
"""
from __future__ import annotations

import torch

import spec_hal

TOPK = 2
STEPS = 2
NODES = 4  # tree nodes per request, root included
# Sizes below avoid the batch sizes the tests use (3, 5): dynamo's duck sizing would tie equal sizes.
PAGE = 2
LAYERS = 2


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
    }
    return {name: value.to(device) for name, value in inputs.items()}


def speculative_step(logits, draft_table, target_table, target_probs_table, hidden_table, hidden, roots, seq_lens,
                     coins, final_coins, kv_node_slots, k_cache, v_cache, req_to_token, req_pool_indices,
                     mamba_slots, ssm_state, ssm_intermediate, conv_state, conv_intermediate):
    """Draft (two EAGLE levels), build the tree, verify greedily and by sampling, take the bonus,
    compact, move the accepted KV, assign the next draft's slots and commit the Mamba state.
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
            *slots, commit.last_step, commit.bytes_moved)


MUTATED = ("k_cache", "v_cache", "ssm_state", "conv_state")
