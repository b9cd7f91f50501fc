"""The draft-loop driver ``run_draft`` (docs/architecture.md §4; docs/semantics.md P17, P18): it owns the state mutations that
engines kept getting wrong (upstream bugs 1 and 2).

Loop for S steps (S - 1 draft forwards):

    expansion_0 = expand_tree(0, None, state.probs, state.ids, hidden=state.hidden)
    for step in 1..S-1:  expansion_step = draft_step(..., step=step)   # forward step-1 + expand
    result.records = (expansion_0.record, ..., expansion_{S-1}.record)

* Positions (bug 1). Forward i runs at RoPE position ``root position + i`` for every lane (the
  EAGLE shift: it consumes the tokens at depth i+1). The driver writes ``root_positions + i``
  into its own buffer before each forward: positions are computed, never incremented, so nothing
  can drift, and the caller's tensors are never written (``state.positions`` is read once).
  ``eagle_shift=False`` (standalone drafts: a small LM with its own KV cache, no feature shift)
  runs forward i at the absolute position of the tokens it consumes, ``root position + i + 1``.
* Parent lanes (drafts with a KV cache). Lane j of forward i >= 1 continues lane
  ``parent_lanes[b, j]`` of forward i-1 (the lane whose output token it feeds; its KV entries
  are the lane's ancestors). ``pass_parent_lanes=True`` hands the model that (bs, K) int64 index
  as the keyword argument ``parent_lanes`` (forward 0: all -1, every lane continues the root),
  so a draft that keeps per-lane KV can reorder it (``cache[:, lanes] = cache[:, parent lanes]``)
  before writing the new tokens. Default False: the model keeps its 4-argument signature.
* Token map. ``token_map`` (V_draft,) maps the draft's top-k ids to target ids inside every
  step's ``draft_topk``: absolute ids, or EAGLE-3 offsets (``d2t``, target id = draft id +
  ``d2t[draft id]``) with ``token_map_offsets=True``, converted on the device per call (no host
  read, capture-safe). ``state.ids`` are already target ids (the draft extend maps them).
* Hidden states (bug 2). Forward i+1 receives, for each lane, the hidden state that forward i
  produced for the lane's parent lane (``Expansion.hidden_rows``; for forward 0 the state's
  hidden, repeated K times per request). ``chain_hidden=True`` declares a chained multi-layer
  MTP draft (P18: the model's ``step`` argument selects its layer): it requires K = 1, where the
  parent lane is the lane itself, so step i+1 receives exactly step i's output, and it requires
  the model to return a hidden state. A non-chained MTP draft (every layer fed the target hidden)
  is a model that returns its input hidden unchanged.

Graph capture (``graph=DraftGraphs(batch_sizes)``): the whole loop (step 0 expansion and the S - 1
steps) is one function of the batch-first state tensors (positions, probs, ids, hidden), captured
by a :class:`~spec_hal.graphs.GraphRunner` per (model, steps, topk, loop options, token map,
backend, input signature). The :class:`DraftGraphs` object owns those runners; the engine keeps it
across decode rounds, so capture happens on the first round and every later round replays. The captured loop
returns the step records concatenated batch first (scores, tokens, parents: (bs, sum of widths))
and the last hidden as (bs, K, H); ``run_draft`` repacks them into a :class:`DraftResult` whose
records are column slices (views) of those cloned outputs. No runner input is mutable: the
positions are computed out of place, so the state guard proves that the loop leaves the caller's
state (copied into the static buffers) untouched (bug 1).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from . import checks
from .device_buffers import capturing
from .errors import GraphStateError, InvalidInput
from .graphs import GraphRunner
from .topk import absolute_token_ids, check_token_map, check_token_map_values
from .tree import MAX_TREE_TOPK
from .types import DraftResult, DraftState, Expansion, TreeRecord

DraftModel = Callable[..., tuple]  # (input_ids, positions, hidden, step[, parent_lanes=]) -> (logits, hidden)


def check_run_draft(model, state, *, steps, topk, chain_hidden, pass_parent_lanes=False, eagle_shift=True,
                    token_map=None, token_map_offsets=False) -> None:
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
    for name, flag in (("pass_parent_lanes", pass_parent_lanes), ("eagle_shift", eagle_shift), ("token_map_offsets", token_map_offsets)):
        if not isinstance(flag, bool):
            raise InvalidInput(name, "a bool", type(flag).__name__)
    if token_map is None:
        if token_map_offsets:
            raise InvalidInput("token_map", "a (V_draft,) map when token_map_offsets=True", None)
        return
    check_token_map("token_map", token_map, device=device)  # its length is checked against each step's logits
    if checks.value_checks_enabled():  # checked mode: mapped ids feed the model's embedding
        check_token_map_values("token_map", absolute_token_ids(token_map, offsets=token_map_offsets), target_vocab=None,
                               what="target ids" + (" (draft id + offset)" if token_map_offsets else ""))


def _check_model_output(output, *, lanes: int, chain_hidden: bool, step: int, topk: int):
    if not isinstance(output, tuple) or len(output) != 2:
        raise InvalidInput("model", "a (logits, hidden) tuple", type(output).__name__)
    logits, hidden = output
    checks.tensor(f"model output logits (step {step})", logits, ndim=2, dtypes=checks.FLOAT_DTYPES, shape=(lanes, None))
    if logits.shape[1] < topk:  # else draft_topk would name its own argument k, not the caller's
        raise InvalidInput("topk", f"at most the model's vocabulary ({logits.shape[1]} logits at step {step})", topk)
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
    pass_parent_lanes: bool = False,
    eagle_shift: bool = True,
    token_map: Optional[torch.Tensor] = None,
) -> tuple[Expansion, Optional[torch.Tensor]]:
    """Draft forward ``step - 1`` and expansion ``step``, over static-shaped lane tensors.

    Args:
        model: ``model(input_ids (bs*K,), positions (bs*K,), hidden (bs*K, H) or None, step)``,
            plus ``parent_lanes=`` (bs, K) int64 when ``pass_parent_lanes``.
        expansion: the previous step's Expansion (its input_ids, scores and gathered hidden).
        step: 1..S-1; the forward index is ``step - 1``.
        root_positions: (bs*K,) int64 root position of each lane's request (read only).
        positions: (bs*K,) int64 buffer owned by the driver; overwritten with
            ``root_positions + step - 1`` (``+ step`` when not ``eagle_shift``) before the
            forward (never incremented).
        topk: K. chain_hidden, pass_parent_lanes, eagle_shift: see the module docstring.
        ops: the backend running the ops.
        token_map: None or the (V_draft,) int64 absolute draft-to-target map for draft_topk.

    Returns:
        (expansion of ``step``, hidden produced by the forward (bs*K, H) or None).
    """
    forward_index = step - 1
    torch.add(root_positions, forward_index if eagle_shift else step, out=positions)
    extra = {"parent_lanes": parent_lanes(expansion, step=step, topk=topk)} if pass_parent_lanes else {}
    logits, hidden = _check_model_output(model(expansion.input_ids, positions, expansion.hidden, forward_index, **extra),
                                         lanes=positions.shape[0], chain_hidden=chain_hidden, step=forward_index, topk=topk)
    probs, ids = ops.draft_topk(logits, topk, token_map=token_map)
    # Each lane continues its parent lane: expand_tree gathers hidden rows by parent lane. With
    # K = 1 (chain_hidden) the parent lane is the lane itself: step i+1 gets step i's output.
    return ops.expand_tree(step, expansion.scores, probs, ids, hidden=hidden), hidden


def parent_lanes(expansion: Expansion, *, step: int, topk: int) -> torch.Tensor:
    """(bs, K) int64: for forward ``step - 1``, the lane of forward ``step - 2`` that each lane
    continues, in [0, K) within its request; all -1 for forward 0 (its lanes continue the root).
    Read from ``expansion.hidden_rows`` (global parent lane ``b*K + choice // K``); no host read."""
    bs = expansion.scores.shape[0]
    device = expansion.hidden_rows.device
    if step == 1:
        return torch.full((bs, topk), -1, dtype=torch.int64, device=device)
    request_start = torch.arange(bs, dtype=torch.int64, device=device)[:, None] * topk
    return expansion.hidden_rows.to(torch.int64).view(bs, topk) - request_start


class DraftGraphs:
    """Captured draft loops, one :class:`~spec_hal.graphs.GraphRunner` per (model, steps, topk,
    chain_hidden, the other run_draft options, token_map address, backend, input signature), for
    ``run_draft(..., graph=graphs)``.

    Create one per draft model and batch-size bucket list and keep it for the engine's lifetime:
    the first ``run_draft`` call for a key captures one graph per bucket (warm-up, state guard,
    capture), every later call replays. The model's weights (and anything else it closes over)
    must keep their addresses while the object lives; it holds the model and the graph memory.

    Attributes: ``batch_sizes`` (sorted buckets), ``runners`` (key -> GraphRunner; inspect
    ``mode``, ``fallback_reason``, ``replays``). ``modes`` lists each runner's mode.
    """

    def __init__(self, batch_sizes: Sequence[int]):
        self.batch_sizes = GraphRunner._check_batch_sizes(batch_sizes)
        self.runners: dict[tuple, GraphRunner] = {}
        self._models: dict[int, object] = {}  # id -> model: keeps ids unique while keyed by them

    @property
    def modes(self) -> list[str]:
        return [runner.mode for runner in self.runners.values()]

    def runner(self, model, inputs: dict, *, steps: int, topk: int, chain_hidden: bool, backend, token_map=None,
               **options) -> GraphRunner:
        """The runner for this loop, captured on first use. ``inputs``: the batch-first tensors;
        ``token_map`` and ``options`` (pass_parent_lanes, eagle_shift, token_map_offsets): as run_draft.
        The captured loop reads ``token_map`` at its address: keep that tensor alive and in place."""
        signature = tuple((name, tuple(value.shape[1:]), value.dtype, value.device) for name, value in inputs.items())
        map_key = None if token_map is None else (token_map.data_ptr(), token_map.dtype, tuple(token_map.shape), token_map.stride())
        key = (id(model), steps, topk, chain_hidden, tuple(sorted(options.items())), map_key, backend.name, signature)
        if key not in self.runners:
            loop = _CapturedLoop(model, steps=steps, topk=topk, chain_hidden=chain_hidden, backend=backend,
                                 token_map=token_map, **options)
            examples = {name: value[:0] for name, value in inputs.items()}
            loop.guard_model_arguments = True  # warm-ups only: they may sync the host
            try:
                self.runners[key] = GraphRunner(loop, inputs=examples, batch_sizes=self.batch_sizes)
            finally:
                loop.guard_model_arguments = False
            self._models[id(model)] = model
        return self.runners[key]

    def explain(self) -> str:
        return "\n".join(runner.explain() for runner in self.runners.values()) or "DraftGraphs: nothing captured yet"


class _CapturedLoop:
    """The draft loop as a GraphRunner function: batch-first inputs, batch-first outputs."""

    def __init__(self, model, *, steps: int, topk: int, chain_hidden: bool, backend, **options):
        self.model, self.steps, self.topk, self.chain_hidden, self.backend = model, steps, topk, chain_hidden, backend
        self.options = options  # pass_parent_lanes, eagle_shift, token_map, token_map_offsets
        self.guard_model_arguments = False

    def __call__(self, *, positions, probs, ids, hidden=None) -> dict[str, torch.Tensor]:
        model = _ArgumentGuard(self.model) if self.guard_model_arguments and not capturing(positions.device) else self.model
        records, last_hidden = _draft_loop(model, positions, probs, ids, hidden, steps=self.steps, topk=self.topk,
                                           chain_hidden=self.chain_hidden, backend=self.backend, **self.options)
        outputs = {field: torch.cat([getattr(record, field) for record in records], dim=1) for field in ("scores", "tokens", "parents")}
        if last_hidden is not None:
            outputs["hidden"] = last_hidden.view(probs.shape[0], self.topk, last_hidden.shape[1])
        return outputs


class _ArgumentGuard:
    """Wraps the model during the capture warm-ups: a forward that changes its ``positions`` or
    ``input_ids`` argument in place raises :class:`GraphStateError` (upstream bug 1: positions
    advanced inside the forward). The driver recomputes positions per step, so such a model
    would not drift here, but the engine state it shares with the model would, replay after
    replay; the warm-up is the one place where checking costs no replay time."""

    def __init__(self, model):
        self.model = model

    def __call__(self, input_ids, positions, hidden, step, **extra):
        before = {"positions": positions.clone(), "input_ids": input_ids.clone()}
        output = self.model(input_ids, positions, hidden, step, **extra)
        for name, after in (("positions", positions), ("input_ids", input_ids)):
            if not torch.equal(before[name], after):
                raise GraphStateError(
                    f"draft model argument {name!r}: forward {step} changed it in place during the capture warm-up; "
                    f"a captured draft loop must not advance or overwrite its inputs (upstream bug 1: positions "
                    f"advanced by the forward). The driver computes the positions of every step.")
        return output


def _record_widths(steps: int, topk: int) -> list[tuple[int, int]]:
    """(candidate columns, parent columns) of each step record."""
    return [(topk, topk + 1)] + [(topk * topk, topk)] * (steps - 1)


def _repack(outputs: dict[str, torch.Tensor], *, steps: int, topk: int) -> DraftResult:
    records, candidate_start, parent_start = [], 0, 0
    for candidates, parent_columns in _record_widths(steps, topk):
        columns = slice(candidate_start, candidate_start + candidates)
        records.append(TreeRecord(scores=outputs["scores"][:, columns], tokens=outputs["tokens"][:, columns],
                                  parents=outputs["parents"][:, parent_start:parent_start + parent_columns]))
        candidate_start, parent_start = candidate_start + candidates, parent_start + parent_columns
    hidden = outputs.get("hidden")
    return DraftResult(tuple(records), None if hidden is None else hidden.reshape(-1, hidden.shape[2]))


def _draft_loop(model, positions, probs, ids, hidden, *, steps, topk, chain_hidden, backend, pass_parent_lanes=False,
                eagle_shift=True, token_map=None, token_map_offsets=False):
    """The loop itself on (bs,) int64 root positions: records and the last forward's hidden."""
    if token_map is not None:  # on the device, inside the loop: a captured graph reads the caller's map
        token_map = absolute_token_ids(token_map, offsets=token_map_offsets)
    root_positions = positions.repeat_interleave(topk)  # a new tensor: the input is only read
    lane_positions = torch.empty_like(root_positions)
    expansion = backend.expand_tree(0, None, probs, ids, hidden=hidden)
    records = [expansion.record]
    last_hidden = None
    for step in range(1, steps):
        expansion, last_hidden = draft_step(model, expansion, step=step, root_positions=root_positions, positions=lane_positions,
                                            topk=topk, chain_hidden=chain_hidden, ops=backend, pass_parent_lanes=pass_parent_lanes,
                                            eagle_shift=eagle_shift, token_map=token_map)
        records.append(expansion.record)
    return records, last_hidden


def run_draft(
    model: DraftModel,
    state: DraftState,
    *,
    steps: int,
    topk: int,
    chain_hidden: bool = False,
    pass_parent_lanes: bool = False,
    eagle_shift: bool = True,
    token_map: Optional[torch.Tensor] = None,
    token_map_offsets: bool = False,
    backend=None,
    graph: Optional[DraftGraphs] = None,
) -> DraftResult:
    """Run S draft steps (S - 1 forwards) and return the step records (P17, P18).

    Args:
        model: the engine's draft forward, ``model(input_ids, positions, hidden, step) ->
            (logits (bs*K, V) float, hidden (bs*K, H) float or None)``; ``step`` is the forward
            index 0..S-2 (a multi-layer MTP draft picks its layer by it). With
            ``pass_parent_lanes`` it is also given ``parent_lanes=`` (bs, K) int64.
        state: :class:`~spec_hal.types.DraftState` (roots, root positions, first top-k, hidden).
        steps: S >= 1. topk: K, equal to ``state.probs.shape[1]``.
        chain_hidden: chained MTP (K = 1 only): step i+1 consumes step i's output hidden.
        pass_parent_lanes: call the model with ``parent_lanes=`` (bs, K) int64: lane j of forward
            i >= 1 continues lane ``parent_lanes[b, j]`` (in [0, K)) of forward i-1; all -1 at
            forward 0 (every lane continues the root). For drafts that keep per-lane KV.
        eagle_shift: True (EAGLE/MTP): forward i runs at ``state.positions + i``. False
            (standalone draft LMs): at ``state.positions + i + 1``, the absolute position of
            the depth-(i+1) tokens it consumes.
        token_map: None, or (V_draft,) int32/int64 draft-to-target map applied to every step's
            top-k ids (reduced-vocabulary drafts); absolute target ids, or EAGLE-3 offsets
            (target id = i + token_map[i]) with ``token_map_offsets=True``. Checked mode
            (SPEC_HAL_CHECKS=1) rejects maps giving negative ids; ``spec_hal.topk.
            token_map_from_offsets`` / ``reverse_token_map`` check against the target vocabulary.
        backend: the backend running the ops (default: the one for the state's device).
        graph: None (eager), or a :class:`DraftGraphs` built once with the batch-size buckets and
            passed on every decode round: the first call for a (model, S, K, chain_hidden, the
            other options, token_map address, backend, state dtypes/widths) key captures the
            whole loop for every bucket (the graph reads ``token_map`` in place), later
            calls replay the smallest bucket >= bs (padding rows: zeros). bs above the largest
            bucket raises :class:`InvalidInput` ("batch size"); run those batches with
            ``graph=None``. Under a graph the model runs only at capture: it must read every
            per-round value from its arguments (never from attributes the engine rebinds between
            rounds; upstream bug 2) and keep its weights at fixed addresses. On CPU tensors, or
            where capture fails, the runner's eager emulation runs (``graph.modes``, ``explain()``).

    Returns:
        :class:`~spec_hal.types.DraftResult`; ``organize_draft(result.records, N)`` then
        ``build_tree(state.roots, ..., state.positions, topk=K)`` build the verify tree.
        The caller's tensors are never written. With ``graph``, the records are column views of
        three (bs, total width) tensors, bit-identical to the eager records of the same padded
        batch.
    """
    options = {"pass_parent_lanes": pass_parent_lanes, "eagle_shift": eagle_shift, "token_map_offsets": token_map_offsets}
    check_run_draft(model, state, steps=steps, topk=topk, chain_hidden=chain_hidden, token_map=token_map, **options)
    if graph is not None and not isinstance(graph, DraftGraphs):
        raise InvalidInput("graph", "None or a DraftGraphs kept across rounds (capture happens once)", type(graph).__name__)
    if backend is None:
        from .selection import backend_for_device

        backend = backend_for_device(state.device)
    positions = state.positions.to(torch.int64)  # the caller's tensor itself when already int64: only read
    if graph is None:
        records, hidden = _draft_loop(model, positions, state.probs, state.ids, state.hidden, steps=steps, topk=topk,
                                      chain_hidden=chain_hidden, backend=backend, token_map=token_map, **options)
        return DraftResult(tuple(records), hidden)
    inputs = {"positions": positions, "probs": state.probs, "ids": state.ids}
    if state.hidden is not None:
        inputs["hidden"] = state.hidden
    runner = graph.runner(model, inputs, steps=steps, topk=topk, chain_hidden=chain_hidden, backend=backend,
                          token_map=token_map, **options)
    return _repack(runner.run(**inputs), steps=steps, topk=topk)
