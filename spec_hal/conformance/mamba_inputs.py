"""Seeded inputs and guarded state pools for the ``mamba`` conformance cases.

* ``random_verdict``: Verdicts with random accepted paths (root, then strictly increasing node
  ids of the request's own tree, -1 padded), built directly so that these cases do not depend on
  the verification ops.
* ``GuardedPool``: a multi-dimensional state pool (L, slots, *state) living as a strided view
  inside a larger flat buffer, with gaps between slots and between layers and margins at both
  ends. Everything outside the view holds a canary, so a write through a wrong stride or past
  the pool fails ``assert_intact`` on every backend (the guards.guarded_output idea for strided,
  multi-dimensional outputs). The view holds seeded "old" values rather than poison: a scatter
  must leave the slots it does not target exactly as they were.
* ``embedded_scratch``: an intermediate-state tensor (L, rows, N, *state) inside a larger buffer
  whose gaps hold large "attractive" values, so a read through a wrong stride changes the result.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_hal.types import Verdict

from .guards import FLOAT_CANARY, MARGIN, _bits


def random_verdict(bs: int, *, num_steps: int, topk: int, num_nodes: int, seed: int, device="cpu") -> Verdict:
    """A Verdict with random accepted paths: K = 1 gives chains 0..len-1, K > 1 gives random
    strictly increasing node ids after the root (any increasing subset is a path of some tree)."""
    generator = torch.Generator().manual_seed(seed)
    width = num_steps + 1
    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    accept_lens = torch.randint(1, min(width, num_nodes) + 1, (bs,), generator=generator, dtype=torch.int32)
    for b in range(bs):
        length = int(accept_lens[b])
        if topk == 1:
            local = torch.arange(length)
        else:
            drafts = torch.randperm(num_nodes - 1, generator=generator)[:length - 1].sort().values + 1
            local = torch.cat([torch.zeros(1, dtype=torch.int64), drafts])
        accept_index[b, :length] = (local + b * num_nodes).to(torch.int32)
    predict = torch.randint(0, 32000, (bs * num_nodes,), generator=generator, dtype=torch.int32)
    return Verdict(predict.to(device), accept_index.to(device), (accept_lens - 1).to(device), accept_lens.to(device))


def verdict_from_paths(paths: list[list[int]], *, num_steps: int, num_nodes: int, device="cpu") -> Verdict:
    """A Verdict whose request b accepted the LOCAL node ids ``paths[b]`` (root first)."""
    bs = len(paths)
    accept_index = torch.full((bs, num_steps + 1), -1, dtype=torch.int32)
    for b, path in enumerate(paths):
        accept_index[b, :len(path)] = torch.tensor(path, dtype=torch.int32) + b * num_nodes
    accept_lens = torch.tensor([len(path) for path in paths], dtype=torch.int32)
    predict = torch.zeros(bs * num_nodes, dtype=torch.int32)
    return Verdict(predict.to(device), accept_index.to(device), (accept_lens - 1).to(device), accept_lens.to(device))


def state_values(shape, dtype: torch.dtype, *, seed: int) -> torch.Tensor:
    """Seeded CPU values; every element distinct enough that a wrong source shows."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * 4).to(dtype)


def padded_strides(shape, gaps) -> tuple[int, ...]:
    """Strides of a row-major layout where dimension i's stride is padded by ``gaps[i]`` elements
    (gaps of 0 for the state dimensions keep the state contiguous)."""
    strides, extent = [], 1
    for size, gap in zip(reversed(shape), reversed(gaps)):
        strides.append(extent + gap)
        extent = size * (extent + gap) if size else extent + gap
    return tuple(reversed(strides))


def _strided_view(shape, strides, dtype, device, fill):
    span = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides)) if all(shape) else 0
    buffer = torch.full((span + 2 * MARGIN,), fill, dtype=dtype, device=device)
    return buffer, torch.as_strided(buffer, shape, strides, MARGIN)


@dataclass
class GuardedPool:
    """A strided pool view inside a canary-filled flat buffer (see the module docstring)."""

    buffer: torch.Tensor
    tensor: torch.Tensor

    @classmethod
    def create(cls, values: torch.Tensor, device, *, layer_gap: int = 13, slot_gap: int = 5) -> "GuardedPool":
        gaps = (layer_gap, slot_gap) + (0,) * (values.dim() - 2)
        buffer, view = _strided_view(values.shape, padded_strides(values.shape, gaps), values.dtype, device, FLOAT_CANARY)
        view.copy_(values.to(device))
        return cls(buffer, view)

    def outside_view(self) -> torch.Tensor:
        """(buffer numel,) bool: True where the buffer is not part of the view (CPU)."""
        covered = torch.zeros(self.buffer.numel(), dtype=torch.bool)
        positions = torch.arange(self.buffer.numel())
        view_positions = torch.as_strided(positions, self.tensor.shape, self.tensor.stride(), self.tensor.storage_offset())
        covered[view_positions.reshape(-1)] = True
        return ~covered

    def assert_intact(self, name: str) -> None:
        outside = _bits(self.buffer)[self.outside_view()]
        canary = _bits(torch.full((1,), FLOAT_CANARY, dtype=self.buffer.dtype))
        if not bool((outside == canary).all()):
            raise AssertionError(f"{name}: a canary outside the pool view (margins, slot or layer gaps) was overwritten")


def embedded_scratch(values: torch.Tensor, device, *, margin_value: float = 3.0e4) -> torch.Tensor:
    """``values`` (L, rows, N, *state) as a strided view with gaps (and margins) of
    ``margin_value`` between layers, rows and steps."""
    gaps = (7, 3, 2) + (0,) * (values.dim() - 3)
    _, view = _strided_view(values.shape, padded_strides(values.shape, gaps), values.dtype, device, margin_value)
    view.copy_(values.to(device))
    return view
