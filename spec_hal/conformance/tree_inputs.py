"""Seeded draft trees for the conformance cases (tree building here, verification elsewhere).

``random_draft_tree`` produces ``build_tree`` inputs the way the draft loop does: random per-step
top-k probabilities, expanded with the reference ``expand_tree`` and selected with the reference
``organize_draft``. Every node of such a tree is reachable (path scores are products of
probabilities <= 1 and ties go to the lower candidate index, so a parent always outranks its
children). ``orphan_draft_tree`` then breaks one parent link, as NaN or tied scores upstream do.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_hal.tree import build_tree, expand_tree, organize_draft
from spec_hal.types import DraftTree, TreeRecord

SCORE_PATTERNS = ("random", "ties")


@dataclass(frozen=True)
class DraftTreeInputs:
    """CPU tensors for ``build_tree(roots, parents, selected, draft_tokens, seq_lens, topk=topk)``."""

    roots: torch.Tensor  # (bs,) int64
    parents: torch.Tensor  # (bs, K(S-1)+1) int64, (bs, 0) for S = 1
    selected: torch.Tensor  # (bs, N-1) int64
    draft_tokens: torch.Tensor  # (bs, N-1) int64
    seq_lens: torch.Tensor  # (bs,) int64
    topk: int
    num_steps: int
    records: tuple  # the TreeRecords they were organised from

    @property
    def num_nodes(self) -> int:
        return self.selected.shape[1] + 1

    def build(self, **kwargs) -> DraftTree:
        """The reference tree of these inputs."""
        return build_tree(self.roots, self.parents, self.selected, self.draft_tokens, self.seq_lens, topk=self.topk, **kwargs)


def feasible(topk: int, num_steps: int, num_nodes: int) -> bool:
    """N - 1 <= K + (S-1) K^2, and N = S + 1 when K = 1 (the engines' constraint)."""
    if topk == 1:
        return num_nodes == num_steps + 1
    return 1 <= num_nodes - 1 <= topk + (num_steps - 1) * topk * topk


def random_step_probs(rows: int, topk: int, generator: torch.Generator, pattern: str) -> torch.Tensor:
    """(rows, K) float32 descending probabilities summing to at most 1, as draft_topk returns.

    "ties" quantises them to multiples of 1/8, so that equal path scores are common.
    """
    weights = torch.rand(rows, topk + 1, generator=generator) ** 3
    probs = (weights / weights.sum(dim=1, keepdim=True))[:, :topk]
    if pattern == "ties":
        probs = torch.floor(probs * 8) / 8
    return torch.sort(probs, dim=1, descending=True).values.to(torch.float32)


def random_records(bs: int, *, topk: int, num_steps: int, seed: int, vocab: int = 32000, pattern: str = "random") -> tuple:
    """The S TreeRecords of a random draft, built with the reference ``expand_tree``."""
    generator = torch.Generator().manual_seed(seed)
    probs = random_step_probs(bs, topk, generator, pattern)
    ids = torch.randint(0, vocab, (bs, topk), generator=generator)
    expansion = expand_tree(0, None, probs, ids)
    records = [expansion.record]
    for step in range(1, num_steps):
        probs = random_step_probs(bs * topk, topk, generator, pattern)
        ids = torch.randint(0, vocab, (bs * topk, topk), generator=generator)
        expansion = expand_tree(step, expansion.scores, probs, ids)
        records.append(expansion.record)
    return tuple(records)


def random_draft_tree(bs: int, *, topk: int, num_steps: int, num_draft_tokens: int, seed: int,
                      vocab: int = 32000, max_seq_len: int = 300, pattern: str = "random") -> DraftTreeInputs:
    """Seeded ``build_tree`` inputs for bs requests of N = ``num_draft_tokens`` nodes."""
    if not feasible(topk, num_steps, num_draft_tokens):
        raise ValueError(f"infeasible tree: K={topk}, S={num_steps}, N={num_draft_tokens}")
    records = random_records(bs, topk=topk, num_steps=num_steps, seed=seed, vocab=vocab, pattern=pattern)
    parents, selected, draft_tokens = organize_draft(records, num_draft_tokens)
    generator = torch.Generator().manual_seed(seed + 1)
    roots = torch.randint(0, vocab, (bs,), generator=generator)
    seq_lens = torch.randint(0, max_seq_len + 1, (bs,), generator=generator)
    return DraftTreeInputs(roots, parents, selected, draft_tokens, seq_lens, topk, num_steps, records)


def orphan_draft_tree(bs: int, *, topk: int, num_steps: int, num_draft_tokens: int, seed: int) -> tuple[DraftTreeInputs, torch.Tensor, torch.Tensor]:
    """A tree in which, per request, one non-root parent was not selected.

    The score of the parent of the last selected node is set to NaN in its record (NaN ranks as
    -inf), as a NaN upstream does; its children keep their scores. Returns the inputs, the (bs,)
    candidate index of the missing parent (the value an out-of-bounds read must not find) and
    the (bs,) candidate index of the orphaned node.
    Needs S >= 2 and a node at depth >= 2 in every request (K >= 2, N >= 2K + 1 suffices).
    """
    records = list(random_records(bs, topk=topk, num_steps=num_steps, seed=seed))
    parents, selected, _ = organize_draft(records, num_draft_tokens)
    last = selected[:, -1]
    missing = parents.gather(1, (last // topk)[:, None]).squeeze(1)
    if bool((last < topk).any()):
        raise ValueError("every request needs a selected node below depth 1")
    offsets = [0] + [topk + step * topk * topk for step in range(num_steps)]
    scores = [record.scores.clone() for record in records]
    for b in range(bs):
        step = max(s for s in range(num_steps) if offsets[s] <= missing[b])
        scores[step][b, missing[b] - offsets[step]] = float("nan")
    records = tuple(TreeRecord(s, r.tokens, r.parents) for s, r in zip(scores, records))
    parents, selected, draft_tokens = organize_draft(records, num_draft_tokens)
    generator = torch.Generator().manual_seed(seed + 1)
    roots = torch.randint(0, 32000, (bs,), generator=generator)
    seq_lens = torch.randint(0, 300, (bs,), generator=generator)
    return DraftTreeInputs(roots, parents, selected, draft_tokens, seq_lens, topk, num_steps, records), missing, last
