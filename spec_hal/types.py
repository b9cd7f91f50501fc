"""Result types passed between op families. Every width is derived from a tensor shape.

Notation (DESIGN.md §4): bs requests, S draft steps, K top-k per step, N tree nodes per request
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
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    mask: Optional[torch.Tensor]
    mask_mode: str
    num_steps: int

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
