"""Seeded random verdicts for the compaction and KV cases: a random tree per request and an
accepted path through it, built directly (no verify op involved, so these cases test compaction
alone).

Tree of request b: N nodes, node 0 the root, node j >= 1 with a parent p < j of depth < S, so
child ids are larger than their parent's. The accepted path is the root, then a strictly
increasing chain of children (each a child of the previous), stopped at random or at a leaf or
at depth S; accept_index holds its global ids b*N + j, -1 padded to S+1 columns;
accept_lens = path length; num_correct = accept_lens - 1. ``predict`` holds, at the path's nodes,
the token of the next path node and the bonus at the last; elsewhere arbitrary tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_hal.types import Verdict


@dataclass(frozen=True)
class RandomRound:
    """One verify round's tree and verdict (all CPU tensors).

    tokens: (bs*N,) int64 token of each node. depths: (bs*N,) int64. parents: (bs, N) int64
    (-1 for the root). paths: the accepted local node ids per request. emitted: the emitted
    tokens per request (accepted drafts then bonus), as lists.
    """

    verdict: Verdict
    tokens: torch.Tensor
    depths: torch.Tensor
    parents: torch.Tensor
    paths: list
    emitted: list


def random_round(bs: int, *, num_steps: int, num_nodes: int, generator: torch.Generator, vocab: int = 1000,
                 stop_probability: float = 0.25, index_dtype: torch.dtype = torch.int32,
                 chain: bool = False) -> RandomRound:
    """A random tree and accepted path for each of ``bs`` requests (see module doc); ``chain``
    makes every tree the K = 1 chain 0 -> 1 -> ... -> N-1 (N = S + 1)."""
    width = num_steps + 1
    parents = torch.full((bs, num_nodes), -1, dtype=torch.int64)
    depths = torch.zeros((bs, num_nodes), dtype=torch.int64)
    uniforms = torch.rand((bs, num_nodes, 2), generator=generator).tolist()
    depth_rows, parent_rows = depths.tolist(), parents.tolist()
    for b in range(bs):
        depth_row, parent_row = depth_rows[b], parent_rows[b]
        for j in range(1, num_nodes):
            eligible = [j - 1] if chain else [p for p in range(j) if depth_row[p] < num_steps]
            parent = eligible[int(uniforms[b][j][0] * len(eligible))]
            parent_row[j], depth_row[j] = parent, depth_row[parent] + 1
    parents, depths = torch.tensor(parent_rows, dtype=torch.int64).view(bs, num_nodes), torch.tensor(depth_rows, dtype=torch.int64).view(bs, num_nodes)
    tokens = torch.randint(0, vocab, (bs * num_nodes,), generator=generator)
    predict = torch.randint(0, vocab, (bs * num_nodes,), generator=generator).to(index_dtype)
    accept_index = torch.full((bs, width), -1, dtype=index_dtype)
    coins = torch.rand((bs, width), generator=generator).tolist()
    picks = torch.rand((bs, width), generator=generator).tolist()
    paths, emitted = [], []
    for b in range(bs):
        path = [0]
        while len(path) < width:
            children = [j for j in range(path[-1] + 1, num_nodes) if parent_rows[b][j] == path[-1]]
            if not children or coins[b][len(path)] < stop_probability:
                break
            path.append(children[int(picks[b][len(path)] * len(children))])
        for rank, node in enumerate(path):
            accept_index[b, rank] = b * num_nodes + node
        for node, following in zip(path, path[1:]):
            predict[b * num_nodes + node] = tokens[b * num_nodes + following]
        paths.append(path)
        emitted.append([int(predict[b * num_nodes + node]) for node in path])
    accept_lens = torch.tensor([len(path) for path in paths], dtype=index_dtype).view(bs)
    verdict = Verdict(predict=predict, accept_index=accept_index, num_correct=accept_lens - 1, accept_lens=accept_lens)
    return RandomRound(verdict, tokens, depths.view(-1), parents, paths, emitted)


def verdict_to(verdict: Verdict, device) -> Verdict:
    """The same verdict with every tensor on ``device``."""
    return Verdict(*(getattr(verdict, name).to(device) for name in ("predict", "accept_index", "num_correct", "accept_lens")))


def golden_tree_round() -> RandomRound:
    """docs/semantics.md §1.4's tree example: bs=2, S=2, K=2, N=4; root 0 with children 1, 2; node 3 child of 2.

    Request 0 accepts [0, 1]; request 1 accepts [0, 2, 3] (global [4, 6, 7]). Tokens: node j of
    request b is 100*(b+1) + j; the bonus tokens are 190 and 290.
    """
    parents = torch.tensor([[-1, 0, 0, 2], [-1, 0, 0, 2]])
    depths = torch.tensor([0, 1, 1, 2, 0, 1, 1, 2])
    tokens = torch.tensor([100, 101, 102, 103, 200, 201, 202, 203])
    # predict at accepted nodes = next path token / bonus; -5 marks rows nobody may read.
    predict = torch.tensor([101, 190, -5, -5, 202, -5, 203, 290], dtype=torch.int32)
    accept_index = torch.tensor([[0, 1, -1], [4, 6, 7]], dtype=torch.int32)
    accept_lens = torch.tensor([2, 3], dtype=torch.int32)
    verdict = Verdict(predict=predict, accept_index=accept_index, num_correct=accept_lens - 1, accept_lens=accept_lens)
    return RandomRound(verdict, tokens, depths, parents, [[0, 1], [0, 2, 3]], [[101, 190], [202, 203, 290]])


VERDICT_FIELDS = ("predict", "accept_index", "num_correct", "accept_lens")


def assert_same_verdict(actual: Verdict, expected: Verdict) -> None:
    """Every Verdict field bit-identical to the reference's (compared on the CPU)."""
    for field in VERDICT_FIELDS:
        got, want = getattr(actual, field).cpu(), getattr(expected, field).cpu()
        assert torch.equal(got, want), f"{field} differs from the reference:\n got  {got.tolist()}\n want {want.tolist()}"
