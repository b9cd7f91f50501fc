"""Seeded verify trees built directly as DraftTree (no build_tree needed), and the P6/P7 golden tree.

A random tree gives every non-root node a parent among the earlier nodes whose depth is below
S, so depths never exceed S; child lists are in ascending node order (as build_tree makes them)
and positions are ``seq_len + depth``. The mask is the "qlen" mode (ancestors and self).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

from spec_hal.types import DraftTree

TENSOR_FIELDS = ("tokens", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "mask", "parents", "depth")


def tree_from_parents(parents: Sequence[Sequence[int]], *, num_steps: int, seq_lens: Optional[Sequence[int]] = None,
                      tokens: Optional[torch.Tensor] = None) -> DraftTree:
    """DraftTree from per-request parent lists (parents[b][j] = parent of node j; -1 for the root
    and for unreachable nodes). Children are linked in ascending node order."""
    bs = len(parents)
    nodes = len(parents[0]) if bs else 1
    seq_lens = list(seq_lens) if seq_lens is not None else [0] * bs
    next_token = torch.full((bs, nodes), -1, dtype=torch.int64)
    next_sibling = torch.full((bs, nodes), -1, dtype=torch.int64)
    depth = torch.zeros(bs, nodes, dtype=torch.int64)
    mask = torch.zeros(bs, nodes, nodes, dtype=torch.bool)
    for b, row in enumerate(parents):
        last_child = {}
        for j in range(nodes):
            mask[b, j, j] = True
            parent = row[j]
            if j == 0 or parent < 0:
                continue
            depth[b, j] = depth[b, parent] + 1
            mask[b, j] |= mask[b, parent]
            if parent in last_child:
                next_sibling[b, last_child[parent]] = j
            else:
                next_token[b, parent] = j
            last_child[parent] = j
    positions = (depth + torch.tensor(seq_lens, dtype=torch.int64)[:, None]).reshape(-1)
    retrieve_index = torch.arange(bs * nodes, dtype=torch.int64).reshape(bs, nodes)
    if tokens is None:
        tokens = torch.zeros(bs * nodes, dtype=torch.int64)
    reachable = torch.zeros(bs, nodes, dtype=torch.bool)
    reachable[:, 0] = True
    node_parents = torch.full((bs, nodes), -1, dtype=torch.int64)
    for b, row in enumerate(parents):
        for j in range(1, nodes):  # parents precede their children
            if 0 <= row[j] < j and reachable[b, row[j]]:
                reachable[b, j] = True
                node_parents[b, j] = row[j]
    return DraftTree(tokens.reshape(-1), positions, retrieve_index, next_token, next_sibling, mask, "qlen", num_steps,
                     parents=node_parents, depth=torch.where(reachable, depth, torch.full_like(depth, -1)))


def random_parents(bs: int, nodes: int, num_steps: int, *, generator: torch.Generator, chain_bias: float = 0.0) -> list[list[int]]:
    """Per request, node j >= 1 gets a parent uniformly among earlier nodes of depth < S.

    ``chain_bias`` is the probability of taking the previous node as the parent when allowed
    (deeper trees: longer accepted paths)."""
    parents = []
    for _ in range(bs):
        depth = [0]
        row = [-1]
        for j in range(1, nodes):
            allowed = [i for i in range(j) if depth[i] < num_steps]
            if not allowed:
                row.append(-1)
                depth.append(0)
                continue
            if depth[j - 1] < num_steps and float(torch.rand((), generator=generator)) < chain_bias:
                parent = j - 1
            else:
                parent = allowed[int(torch.randint(len(allowed), (), generator=generator))]
            row.append(parent)
            depth.append(depth[parent] + 1)
        parents.append(row)
    return parents


def random_tree(bs: int, nodes: int, num_steps: int, *, seed: int, vocab: int, chain_bias: float = 0.5) -> tuple[DraftTree, torch.Tensor]:
    """(tree, candidates (bs, N) int64): a random tree with random tokens in [0, vocab)."""
    generator = torch.Generator().manual_seed(seed)
    parents = random_parents(bs, nodes, num_steps, generator=generator, chain_bias=chain_bias)
    candidates = torch.randint(0, vocab, (bs, nodes), generator=generator)
    seq_lens = torch.randint(0, 1000, (bs,), generator=generator).tolist()
    return tree_from_parents(parents, num_steps=num_steps, seq_lens=seq_lens, tokens=candidates), candidates


def tree_to(tree: DraftTree, device) -> DraftTree:
    """The same tree with every tensor on ``device``."""
    return dataclasses.replace(tree, **{name: getattr(tree, name).to(device) for name in TENSOR_FIELDS if getattr(tree, name) is not None})


def golden_tree() -> tuple[DraftTree, torch.Tensor]:
    """P6/P7 golden: bs = 2, N = 6, S = 3; candidates [[0..5], [7..12]]."""
    next_token = torch.tensor([[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]])
    next_sibling = torch.tensor([[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]])
    candidates = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    tree = DraftTree(candidates.reshape(-1), torch.zeros(12, dtype=torch.int64), torch.arange(12).reshape(2, 6),
                     next_token, next_sibling, None, "qlen", 3)
    return tree, candidates


def replicate(tree: DraftTree, bs: int) -> DraftTree:
    """A one-request tree repeated for ``bs`` requests (fast for statistical batches)."""
    nodes = tree.num_nodes
    mask = tree.mask.expand(bs, nodes, nodes).contiguous() if tree.mask is not None else None
    return DraftTree(tree.tokens.repeat(bs), tree.positions.repeat(bs), torch.arange(bs * nodes, dtype=torch.int64).reshape(bs, nodes),
                     tree.retrieve_next_token.expand(bs, nodes).contiguous(), tree.retrieve_next_sibling.expand(bs, nodes).contiguous(),
                     mask, tree.mask_mode, tree.num_steps,
                     parents=tree.parents.repeat(bs, 1) if tree.parents is not None else None,
                     depth=tree.depth.repeat(bs, 1) if tree.depth is not None else None)
