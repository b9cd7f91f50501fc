"""Result types passed between op families. Every width is derived from a tensor shape.

Notation (docs/semantics.md §0.2): bs requests, S draft steps, K top-k per step, N tree nodes per request
including the root (N = S + 1 when K = 1). Node 0 of each request is the root; the global node
index is ``b * N + j``; -1 means none / padding everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

MASK_MODES = ("full", "qlen", "bitpacked")


@dataclass(frozen=True)
class DraftTree:
    """A verify tree, as built by ``build_tree`` (P5).

    tokens:                (bs*N,) int64  [root, drafts...] per request.
    positions:             (bs*N,) int64  seq_len + depth(node).
    retrieve_index:        (bs, N) int64  b*N + j.
    retrieve_next_token:   (bs, N) int64  first child (smallest node id), -1 for none.
    retrieve_next_sibling: (bs, N) int64  next sibling in ascending node order, -1 for none.
    mask:                  per ``mask_mode``: "qlen" (bs, N, N) bool (tree part only; prefix
                           columns are never materialised), "full" flat bool of per-request
                           blocks N x (seq_len_b + N), "bitpacked" (bs, N) uint8/int16/int32
                           rows (bit j: attends node j; N <= 32).
    num_steps:             S, so that the accept width S + 1 never has to be passed separately.
    parents:               (bs, N) int64 local parent node of every reachable node; -1 for the
                           root, unreachable and padded nodes. None when the producer did not
                           record it (``spec_hal.tree.tree_parents`` derives it from the links).
    depth:                 (bs, N) int64 depth of every reachable node (root 0); -1 for
                           unreachable and padded nodes; None as for ``parents``.

    ``spec_hal.tree.tree_paths(tree)`` gives every node's root-to-node path (for walking a
    grammar over the tree).
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    mask: Optional[torch.Tensor]
    mask_mode: str
    num_steps: int
    parents: Optional[torch.Tensor] = None
    depth: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return self.retrieve_index.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.retrieve_index.shape[1]

    @property
    def accept_width(self) -> int:
        return self.num_steps + 1

    @property
    def device(self) -> torch.device:
        return self.retrieve_index.device


@dataclass(frozen=True)
class Verdict:
    """The result of verification (P6/P7/P8/P20).

    predict:      (bs*N,) int32  the target's token after each accepted node (the accepted
                  drafts, then the bonus at the last accepted node); -1 on every other row
                  (so a read at a wrong stride yields an invalid id, not a plausible token).
    accept_index: (bs, S+1) int32 global node ids of the accepted path, root first, -1 padded.
    num_correct:  (bs,) int32  accepted draft tokens (0..S).
    accept_lens:  (bs,) int32  num_correct + 1 (tokens emitted this round, bonus included).
    """

    predict: torch.Tensor
    accept_index: torch.Tensor
    num_correct: torch.Tensor
    accept_lens: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.accept_index.shape[0]

    @property
    def accept_width(self) -> int:
        return self.accept_index.shape[1]

    @property
    def num_nodes(self) -> int:
        return self.predict.shape[0] // max(self.batch_size, 1) if self.batch_size else 0

    @property
    def device(self) -> torch.device:
        return self.accept_index.device


@dataclass(frozen=True)
class TreeRecord:
    """What one draft step contributes to the candidate list (P2 "tree_info", P4 input).

    Candidate-list ("ss") layout per request: step-0 candidates at [0, K); step-i candidates
    (i >= 1) at [K + K^2 (i-1), K + K^2 i), row-major (parent lane r, child c).

    scores:  (bs, K) at step 0, (bs, K*K) later; float32 path scores (products of probabilities).
    tokens:  same shape, int64 token ids of the candidates.
    parents: (bs, K+1) int64 ``[-1, 0, ..., K-1]`` at step 0; (bs, K) later: the candidate-list
             indices of the K candidates this step selected (the parents of the next step).
    """

    scores: torch.Tensor
    tokens: torch.Tensor
    parents: torch.Tensor

    @property
    def device(self) -> torch.device:
        return self.scores.device


@dataclass(frozen=True)
class Expansion:
    """One level of EAGLE beam expansion (``expand_tree``, P2).

    input_ids:   (bs*K,) int64  the token each lane feeds to the next draft forward.
    scores:      (bs, K) float32 path score of each lane (the input ``scores`` of the next step).
    hidden_rows: (bs*K,) int64  the row of the step's input hidden that each lane continues
                 (step 0: the request ``b``; later: the parent lane ``b*K + choice // K``).
    hidden:      (bs*K, H) the gathered hidden states (``hidden[hidden_rows]``), or None.
    record:      the step's :class:`TreeRecord`.
    """

    input_ids: torch.Tensor
    scores: torch.Tensor
    hidden_rows: torch.Tensor
    hidden: Optional[torch.Tensor]
    record: TreeRecord


@dataclass(frozen=True)
class DraftState:
    """Input of ``run_draft``: what the draft extend (or the previous verify) left behind.

    roots:     (bs,) int32/int64 the root token of each tree (the bonus token of the last verify).
    positions: (bs,) int64 absolute position of each root = the committed length ``seq_lens``.
               By the EAGLE shift, draft forward i runs at RoPE position ``positions + i``.
    probs:     (bs, K) float32 top-k probabilities of the first draft token (from draft extend).
    ids:       (bs, K) int64 their token ids.
    hidden:    (bs, H) floating hidden state feeding the first draft forward, or None.
    """

    roots: torch.Tensor
    positions: torch.Tensor
    probs: torch.Tensor
    ids: torch.Tensor
    hidden: Optional[torch.Tensor] = None

    @property
    def device(self) -> torch.device:
        return self.probs.device


@dataclass(frozen=True)
class DraftResult:
    """Output of ``run_draft``: feeds ``organize_draft(result.records, N)`` and then ``build_tree``.

    records: one :class:`TreeRecord` per draft step (S of them).
    hidden:  (bs*K, H) hidden state produced by the last draft forward (None when S == 1 or the
             model has no hidden state).
    """

    records: tuple
    hidden: Optional[torch.Tensor]

    @property
    def num_steps(self) -> int:
        return len(self.records)
