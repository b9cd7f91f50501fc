"""The draft-loop driver ``run_draft`` (DESIGN.md §4; P17, P18): it owns the state mutations that
engines kept getting wrong (upstream bugs 1 and 2).

Loop for S steps (S - 1 draft forwards):

    expansion_0 = expand_tree(0, None, state.probs, state.ids, hidden=state.hidden)
    for step in 1..S-1:  expansion_step = draft_step(..., step=step)   # forward step-1 + expand
    result.records = (expansion_0.record, ..., expansion_{S-1}.record)

* Positions (bug 1). Forward i runs at RoPE position ``root position + i`` for every lane (the
  EAGLE shift: it consumes the tokens at depth i+1). The driver writes ``root_positions + i``
  into its own buffer before each forward: positions are computed, never incremented, so nothing
  can drift, and the caller's tensors are never written (``state.positions`` is read once).
* Hidden states (bug 2). Forward i+1 receives, for each lane, the hidden state that forward i
  produced for the lane's parent lane (``Expansion.hidden_rows``; for forward 0 the state's
  hidden, repeated K times per request). ``chain_hidden=True`` declares a chained multi-layer
  MTP draft (P18: the model's ``step`` argument selects its layer): it requires K = 1, where the
  parent lane is the lane itself, so step i+1 receives exactly step i's output, and it requires
  the model to return a hidden state. A non-chained MTP draft (every layer fed the target hidden)
  is a model that returns its input hidden unchanged.

Graph capture (for the graph runner that will wrap this loop): :func:`draft_step` is one step as a
function of static-shaped tensors only: lane tensors of bs*K rows, a fixed positions buffer
written in place, no host reads, no shape that depends on values. A runner captures
``draft_step`` per step (``step`` is a Python constant per capture) or the whole loop, with the
positions buffer and the expansion tensors as its static buffers.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from . import checks
from .errors import InvalidInput
from .tree import MAX_TREE_TOPK
from .types import DraftResult, DraftState, Expansion

DraftModel = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor], int], tuple]


def check_run_draft(model, state, *, steps, topk, chain_hidden) -> None:
    if not callable(model):
        raise InvalidInput("model", "a callable model(input_ids, positions, hidden, step) -> (logits, hidden)", type(model).__name__)
    if not isinstance(state, DraftState):
        raise InvalidInput("state", "a DraftState", type(state).__name__)
    checks.integer("steps", steps, low=1)
    checks.integer("topk", topk, low=1, high=MAX_TREE_TOPK)
    checks.tensor("state.probs", state.probs, ndim=2, dtypes=checks.FLOAT_DTYPES)
    bs, width = state.probs.shape
    device = state.probs.device
    if width != topk:
        raise InvalidInput("topk", f"the width of state.probs ({width})", topk)
    checks.tensor("state.ids", state.ids, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs, topk))
    checks.tensor("state.roots", state.roots, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs,))
    checks.tensor("state.positions", state.positions, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs,))
    if state.hidden is not None:
        checks.tensor("state.hidden", state.hidden, ndim=2, dtypes=checks.FLOAT_DTYPES, device=device, shape=(bs, None))
    if not isinstance(chain_hidden, bool):
        raise InvalidInput("chain_hidden", "a bool", type(chain_hidden).__name__)
    if chain_hidden and topk != 1:
        raise InvalidInput("chain_hidden", "topk == 1 (a chained MTP draft is a chain)", f"chain_hidden with topk={topk}")
    if chain_hidden and state.hidden is None and steps > 1:
        raise InvalidInput("state.hidden", "a (bs, H) tensor when chain_hidden (the chain starts from it)", None)


def _check_model_output(output, *, lanes: int, chain_hidden: bool, step: int):
    if not isinstance(output, tuple) or len(output) != 2:
        raise InvalidInput("model", "a (logits, hidden) tuple", type(output).__name__)
    logits, hidden = output
    checks.tensor(f"model output logits (step {step})", logits, ndim=2, dtypes=checks.FLOAT_DTYPES, shape=(lanes, None))
    if hidden is None and chain_hidden:
        raise InvalidInput(f"model output hidden (step {step})", "a hidden state (chain_hidden propagates it)", None)
    if hidden is not None:
        checks.tensor(f"model output hidden (step {step})", hidden, ndim=2, dtypes=checks.FLOAT_DTYPES, shape=(lanes, None))
    return logits, hidden


def draft_step(
    model: DraftModel,
    expansion: Expansion,
    *,
    step: int,
    root_positions: torch.Tensor,
    positions: torch.Tensor,
    topk: int,
    chain_hidden: bool,
    ops,
) -> tuple[Expansion, Optional[torch.Tensor]]:
    """Draft forward ``step - 1`` and expansion ``step``, over static-shaped lane tensors.

    Args:
        model: ``model(input_ids (bs*K,), positions (bs*K,), hidden (bs*K, H) or None, step)``.
        expansion: the previous step's Expansion (its input_ids, scores and gathered hidden).
        step: 1..S-1; the forward index is ``step - 1``.
        root_positions: (bs*K,) int64 root position of each lane's request (read only).
        positions: (bs*K,) int64 buffer owned by the driver; overwritten with
            ``root_positions + step - 1`` before the forward (never incremented).
        topk: K. chain_hidden: see the module docstring. ops: the backend running the ops.

    Returns:
        (expansion of ``step``, hidden produced by the forward (bs*K, H) or None).
    """
    forward_index = step - 1
    torch.add(root_positions, forward_index, out=positions)
    logits, hidden = _check_model_output(model(expansion.input_ids, positions, expansion.hidden, forward_index),
                                         lanes=positions.shape[0], chain_hidden=chain_hidden, step=forward_index)
    probs, ids = ops.draft_topk(logits, topk)
    # Each lane continues its parent lane: expand_tree gathers hidden rows by parent lane. With
    # K = 1 (chain_hidden) the parent lane is the lane itself: step i+1 gets step i's output.
    return ops.expand_tree(step, expansion.scores, probs, ids, hidden=hidden), hidden


def run_draft(
    model: DraftModel,
    state: DraftState,
    *,
    steps: int,
    topk: int,
    chain_hidden: bool = False,
    backend=None,
) -> DraftResult:
    """Run S draft steps (S - 1 forwards) and return the step records (P17, P18).

    Args:
        model: the engine's draft forward, ``model(input_ids, positions, hidden, step) ->
            (logits (bs*K, V) float, hidden (bs*K, H) float or None)``; ``step`` is the forward
            index 0..S-2 (a multi-layer MTP draft picks its layer by it).
        state: :class:`~spec_hal.types.DraftState` (roots, root positions, first top-k, hidden).
        steps: S >= 1. topk: K, equal to ``state.probs.shape[1]``.
        chain_hidden: chained MTP (K = 1 only): step i+1 consumes step i's output hidden.
        backend: the backend running the ops (default: the one for the state's device).

    Returns:
        :class:`~spec_hal.types.DraftResult`; ``organize_draft(result.records, N)`` then
        ``build_tree(state.roots, ..., state.positions, topk=K)`` build the verify tree.
        The caller's tensors are never written.
    """
    check_run_draft(model, state, steps=steps, topk=topk, chain_hidden=chain_hidden)
    if backend is None:
        from .selection import backend_for_device

        backend = backend_for_device(state.device)
    root_positions = state.positions.to(torch.int64).repeat_interleave(topk)  # a new tensor
    positions = torch.empty_like(root_positions)
    expansion = backend.expand_tree(0, None, state.probs, state.ids, hidden=state.hidden)
    records = [expansion.record]
    hidden = None
    for step in range(1, steps):
        expansion, hidden = draft_step(model, expansion, step=step, root_positions=root_positions, positions=positions,
                                       topk=topk, chain_hidden=chain_hidden, ops=backend)
        records.append(expansion.record)
    return DraftResult(tuple(records), hidden)
