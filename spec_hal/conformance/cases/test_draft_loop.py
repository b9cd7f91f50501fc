"""Conformance of the draft-loop driver ``run_draft`` (P17, P18; upstream bugs 1 and 2).

A probe wraps a ``spec_hal.testing`` draft model and records what every forward receives. The
checks take the driver as a parameter so that tests/ can prove that a driver with bug 1 or bug 2
fails them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from spec_hal.conformance.guards import no_host_sync
from spec_hal.capabilities import graph_support
from spec_hal.draft_loop import DraftGraphs, run_draft
from spec_hal.errors import GraphStateError, InvalidInput
from spec_hal.testing import ChainedMtpDraftModel, EagleDraftModel
from spec_hal.topk import draft_topk as reference_draft_topk, reverse_token_map
from spec_hal.tree import expand_tree as reference_expand_tree
from spec_hal.types import DraftState, TreeRecord

pytestmark = pytest.mark.spec_hal_op("run_draft")

STATE_FIELDS = ("roots", "positions", "probs", "ids", "hidden")


@dataclass
class Call:
    input_ids: torch.Tensor
    positions: torch.Tensor
    hidden: Optional[torch.Tensor]
    step: int
    hidden_out: torch.Tensor


class ProbeModel:
    """Records (cloned) inputs and output hidden of every forward of the wrapped draft model."""

    def __init__(self, model):
        self.model, self.recorded = model, []

    def __call__(self, input_ids, positions, hidden, step):
        logits, hidden_out = self.model(input_ids, positions, hidden, step)
        # Clones stay on the device: copying to the host inside the loop would synchronise.
        self.recorded.append((input_ids.clone(), positions.clone(), None if hidden is None else hidden.clone(), step, hidden_out.clone()))
        return logits, hidden_out

    @property
    def calls(self) -> list[Call]:
        return [Call(ids.cpu(), positions.cpu(), None if hidden is None else hidden.cpu(), step, out.cpu())
                for ids, positions, hidden, step, out in self.recorded]

    def to(self, device) -> "ProbeModel":
        self.model.to(device)
        return self


def make_state(bs: int, topk: int, *, seed: int, device, vocab: int = 64, hidden_size: int = 16) -> DraftState:
    """A draft state as a draft extend leaves it: roots, root positions, first top-k, hidden."""
    generator = torch.Generator().manual_seed(seed)
    first_logits = torch.randn(bs, vocab, generator=generator, dtype=torch.float64) * 3
    probs, ids = reference_draft_topk(first_logits, topk)
    return DraftState(
        roots=torch.randint(0, vocab, (bs,), generator=generator).to(device),
        positions=torch.randint(0, 500, (bs,), generator=generator).to(device),
        probs=probs.to(device),
        ids=ids.to(device),
        hidden=torch.randn(bs, hidden_size, generator=generator, dtype=torch.float64).to(device),
    )


def _run(driver, backend, model, state, **kwargs):
    snapshot = {name: getattr(state, name).clone() for name in STATE_FIELDS if getattr(state, name) is not None}
    model.to(backend.device)  # weights on the device first: a host-to-device copy synchronises
    with no_host_sync(backend.device):
        result = driver(model, state, backend=backend, **kwargs)
    for name, before in snapshot.items():
        assert torch.equal(getattr(state, name), before), f"run_draft changed the caller's state.{name}"
    return result


def check_positions(backend, *, steps: int, topk: int, driver=run_draft) -> None:
    """Bug 1: forward i runs at root position + i; the caller's positions are unchanged."""
    model = ProbeModel(EagleDraftModel(seed=steps))
    state = make_state(5, topk, seed=10 * steps + topk, device=backend.device)
    _run(driver, backend, model, state, steps=steps, topk=topk)
    assert [call.step for call in model.calls] == list(range(steps - 1)), "the model was not called once per forward 0..S-2"
    roots = state.positions.cpu().repeat_interleave(topk)
    for index, call in enumerate(model.calls):
        assert torch.equal(call.positions, roots + index), \
            f"forward {index} ran at positions {call.positions[:4].tolist()}..., expected root + {index} = {(roots + index)[:4].tolist()}..."


def check_chain_hidden(backend, *, steps: int, driver=run_draft) -> None:
    """Bug 2: with chain_hidden, forward i+1 receives the hidden state forward i produced."""
    model = ProbeModel(ChainedMtpDraftModel(num_layers=steps - 1, seed=steps))
    state = make_state(4, 1, seed=steps, device=backend.device)
    _run(driver, backend, model, state, steps=steps, topk=1, chain_hidden=True)
    assert len(model.calls) == steps - 1
    assert torch.equal(model.calls[0].hidden, state.hidden.cpu()), "forward 0 did not receive the state's hidden"
    for index in range(1, steps - 1):
        received, produced = model.calls[index].hidden, model.calls[index - 1].hidden_out
        assert received is not None and torch.equal(received, produced), \
            f"forward {index} did not receive the hidden state forward {index - 1} produced"


def check_eagle_parent_lanes(backend, *, steps: int, topk: int, driver=run_draft) -> None:
    """EAGLE: lane j of forward i receives forward i-1's hidden of its parent lane and the token
    the expansion chose for it (both read from the step records of the result)."""
    model = ProbeModel(EagleDraftModel(seed=7))
    bs = 3
    state = make_state(bs, topk, seed=topk + steps, device=backend.device)
    result = _run(driver, backend, model, state, steps=steps, topk=topk)
    assert torch.equal(model.calls[0].hidden, state.hidden.cpu().repeat_interleave(topk, dim=0)), \
        "forward 0 did not receive each request's hidden on all K lanes"
    for index in range(1, steps - 1):
        record = result.records[index]  # expansion `index` chose the lanes of forward `index`
        choice = record.parents.cpu() - (topk + topk * topk * (index - 1))
        parent_rows = (torch.arange(bs)[:, None] * topk + choice // topk).reshape(-1)
        expected_hidden = model.calls[index - 1].hidden_out[parent_rows]
        assert torch.equal(model.calls[index].hidden, expected_hidden), f"forward {index}: a lane got another lane's hidden"
        expected_ids = record.tokens.cpu().gather(1, choice).reshape(-1)
        assert torch.equal(model.calls[index].input_ids, expected_ids), f"forward {index}: input ids are not the chosen tokens"


def reference_draft(model, state: DraftState, *, steps: int, topk: int, eagle_shift: bool = True,
                    token_map: Optional[torch.Tensor] = None):
    """The draft loop written out plainly with the reference ops on CPU (the oracle).
    ``token_map``: absolute draft-to-target ids; without ``eagle_shift`` forward i runs at the
    absolute position of the depth-(i+1) tokens, root + i + 1."""
    cpu = {name: None if getattr(state, name) is None else getattr(state, name).cpu() for name in STATE_FIELDS}
    expansion = reference_expand_tree(0, None, cpu["probs"], cpu["ids"], hidden=cpu["hidden"])
    records = [expansion.record]
    for step in range(1, steps):
        positions = cpu["positions"].repeat_interleave(topk) + (step - 1) + (0 if eagle_shift else 1)
        logits, hidden = model(expansion.input_ids, positions, expansion.hidden, step - 1)
        probs, ids = reference_draft_topk(logits, topk, token_map=None if token_map is None else token_map.cpu())
        expansion = reference_expand_tree(step, expansion.scores, probs, ids, hidden=hidden)
        records.append(expansion.record)
    return records


@pytest.mark.parametrize("steps", (2, 3, 5))
@pytest.mark.parametrize("topk", (1, 4))
def test_run_draft_positions(backend, steps, topk):
    check_positions(backend, steps=steps, topk=topk)


@pytest.mark.parametrize("steps", (2, 3, 5))
def test_run_draft_chain_hidden(backend, steps):
    check_chain_hidden(backend, steps=steps)


@pytest.mark.parametrize("steps, topk", [(3, 2), (5, 4), (4, 8)])
def test_run_draft_eagle_parent_lanes(backend, steps, topk):
    check_eagle_parent_lanes(backend, steps=steps, topk=topk)


def _assert_records_match(result, expected, what: str = "") -> None:
    """Integers bit-identical to the reference loop's records, scores within float tolerance."""
    assert result.num_steps == len(expected)
    for index, (got, want) in enumerate(zip(result.records, expected)):
        assert torch.equal(got.tokens.cpu(), want.tokens), f"{what}step {index}: candidate tokens differ from the reference loop"
        assert torch.equal(got.parents.cpu(), want.parents), f"{what}step {index}: parents differ from the reference loop"
        torch.testing.assert_close(got.scores.cpu(), want.scores, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("bs, steps, topk, nodes", [(0, 3, 4, 8), (1, 1, 4, 5), (3, 3, 1, 4), (6, 5, 4, 8), (4, 5, 8, 32)])
def test_run_draft_matches_reference_loop(backend, bs, steps, topk, nodes):
    """The records equal the plain reference loop's, and feed organize_draft and build_tree."""
    model = EagleDraftModel(seed=bs + steps)
    state = make_state(bs, topk, seed=bs * 7 + steps, device=backend.device)
    result = _run(run_draft, backend, model, state, steps=steps, topk=topk)
    assert result.num_steps == steps
    _assert_records_match(result, reference_draft(model, state, steps=steps, topk=topk))
    with no_host_sync(backend.device):
        parents, selected, draft_tokens = backend.organize_draft(result.records, nodes)
        tree = backend.build_tree(state.roots, parents, selected, draft_tokens, state.positions, topk=topk)
    assert tree.tokens.shape == (bs * nodes,) and tree.num_steps == steps
    assert torch.equal(tree.positions.cpu().view(bs, nodes)[:, 0], state.positions.cpu())


def test_run_draft_rejects_bad_input(backend):
    model = EagleDraftModel()
    state = make_state(2, 4, seed=0, device=backend.device)
    cases = [
        ("state", lambda: run_draft(model, (state.probs, state.ids), steps=2, topk=4, backend=backend)),
        ("topk", lambda: run_draft(model, state, steps=2, topk=2, backend=backend)),
        ("steps", lambda: run_draft(model, state, steps=0, topk=4, backend=backend)),
        ("chain_hidden", lambda: run_draft(model, state, steps=2, topk=4, chain_hidden=True, backend=backend)),
        ("model", lambda: run_draft(lambda *args: args[0], state, steps=2, topk=4, backend=backend)),
    ]
    for argument, call in cases:
        with pytest.raises(InvalidInput) as error:
            call()
        assert error.value.argument == argument


# ------------------------------------------------------------------------- graph=DraftGraphs
GRAPH_BUCKETS = (1, 4)
# Every bucket exactly (4 is the largest), a padded batch replaying bucket 4 again with new
# inputs (3 -> 4), and bs = 0. Small: draft_topk under the interpreter costs ~0.1 s per row.
GRAPH_ROUNDS = (4, 3, 1, 0)
EXPECTED_GRAPH_MODE = {"cuda": "cuda_graph", "rocm": "hip_graph", "cpu": "eager", "triton-interpret": "eager"}


def _padded(state: DraftState, rows: int) -> DraftState:
    """The state with zero rows appended up to ``rows`` (the runner's padding values)."""
    def pad(tensor):
        if tensor is None:
            return None
        extra = torch.zeros((rows - tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        return torch.cat([tensor, extra])
    return DraftState(*(pad(getattr(state, name)) for name in STATE_FIELDS))


def _bucket(bs: int) -> int:
    return min(bucket for bucket in GRAPH_BUCKETS if bucket >= bs)


def _assert_same_result(got, want, bs: int, what: str) -> None:
    """Bit-identical records (and last hidden) for the first ``bs`` rows."""
    assert got.num_steps == want.num_steps
    for index, (g, w) in enumerate(zip(got.records, want.records)):
        for field in ("scores", "tokens", "parents"):
            a, b = getattr(g, field), getattr(w, field)[:bs]
            assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: step {index} {field} shape/dtype {tuple(a.shape)} {a.dtype}"
            assert torch.equal(a, b), f"{what}: step {index} {field} differ between graph replay and eager"
    if want.hidden is not None:
        lanes = bs * (want.hidden.shape[0] // max(want.records[0].tokens.shape[0], 1))
        assert got.hidden is not None and torch.equal(got.hidden, want.hidden[:lanes]), f"{what}: last hidden differs"


def check_graph_rounds(backend, model, *, steps: int, topk: int, chain_hidden: bool = False, nodes: int, driver=run_draft) -> None:
    """run_draft(graph=...) over decode rounds of new states equals run_draft without a graph:
    records bit-identical to the eager loop on the same padded batch (what the replay computes),
    the verify tree built from them equal, caller state unchanged, one capture, every bucket
    replayed, the mode expected for the backend. (The eager loop itself is checked against the
    reference loop by test_run_draft_matches_reference_loop.)

    ``driver`` is the engine's call of run_draft; tests/ passes broken ones (upstream bug 2)."""
    model.to(backend.device)
    graphs = DraftGraphs(GRAPH_BUCKETS)
    for round_index, bs in enumerate(GRAPH_ROUNDS):
        state = make_state(bs, topk, seed=100 * round_index + steps, device=backend.device)
        what = f"round {round_index} (bs={bs}, S={steps}, K={topk})"
        kwargs = dict(steps=steps, topk=topk, chain_hidden=chain_hidden)
        if round_index == 0:  # capture: the warm-ups synchronise the host, outside the no-sync guard
            got = driver(model, state, backend=backend, graph=graphs, **kwargs)
        else:
            got = _run(driver, backend, model, state, graph=graphs, **kwargs)
        want = run_draft(model, _padded(state, _bucket(bs)), backend=backend, **kwargs)
        _assert_same_result(got, want, bs, what)
        trees = []
        for records in (got.records, [TreeRecord(*(getattr(r, f)[:bs] for f in ("scores", "tokens", "parents"))) for r in want.records]):
            with no_host_sync(backend.device):
                parents, selected, draft_tokens = backend.organize_draft(records, nodes)
                trees.append(backend.build_tree(state.roots, parents, selected, draft_tokens, state.positions, topk=topk))
        for field in ("tokens", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "mask"):
            assert torch.equal(getattr(trees[0], field), getattr(trees[1], field)), f"{what}: tree {field} differs from the eager tree"
    assert len(graphs.runners) == 1, "the loop was captured more than once across rounds"
    runner = next(iter(graphs.runners.values()))
    assert all(count >= 1 for count in runner.replays.values()), f"a bucket was never replayed: {runner.replays}"
    expected_mode = EXPECTED_GRAPH_MODE.get(backend.name, graph_support(backend.device).mode)
    assert runner.mode == expected_mode, f"mode {runner.mode!r}, expected {expected_mode!r}: {runner.explain()}"


@pytest.mark.parametrize("steps, topk, nodes", [(3, 1, 4), (3, 4, 8)])
def test_run_draft_graph_equals_eager(backend, steps, topk, nodes):
    check_graph_rounds(backend, EagleDraftModel(seed=steps), steps=steps, topk=topk, nodes=nodes)


def test_run_draft_graph_chain_hidden_equals_eager(backend):
    """Chained MTP under a graph (bug 2): every round replays the chain from the new state."""
    check_graph_rounds(backend, ChainedMtpDraftModel(num_layers=3, seed=5), steps=4, topk=1, chain_hidden=True, nodes=5)


class PositionAdvancingModel:
    """Upstream bug 1: the forward advances its positions buffer in place after running."""

    def __init__(self, model):
        self.model = model

    def __call__(self, input_ids, positions, hidden, step):
        output = self.model(input_ids, positions, hidden, step)
        positions.add_(1)
        return output

    def to(self, device):
        self.model.to(device)
        return self


def test_run_draft_graph_rejects_drifting_positions(backend):
    """Bug 1 regression: a forward that advances positions is a GraphStateError at capture."""
    model = PositionAdvancingModel(EagleDraftModel(seed=3)).to(backend.device)
    state = make_state(3, 4, seed=1, device=backend.device)
    with pytest.raises(GraphStateError, match="'positions'"):
        run_draft(model, state, steps=3, topk=4, backend=backend, graph=DraftGraphs((4,)))


def test_run_draft_graph_rejects_bad_input(backend):
    model = EagleDraftModel().to(backend.device)
    state = make_state(3, 4, seed=0, device=backend.device)
    with pytest.raises(InvalidInput) as error:
        run_draft(model, state, steps=2, topk=4, backend=backend, graph=(1, 4))
    assert error.value.argument == "graph"
    with pytest.raises(InvalidInput) as error:
        run_draft(model, state, steps=2, topk=4, backend=backend, graph=DraftGraphs((2,)))
    assert error.value.argument == "batch size"


# ----------------------------------------------- drafts with a KV cache, standalone, token maps
class LaneCacheDraftModel:
    """A draft that keeps its own per-lane state (standing in for a per-lane KV cache) instead of
    using the hidden state the driver passes: at forward 0 it fills every lane with the request's
    hidden (the shared prefix), and before each later forward it reorders the lanes by
    ``parent_lanes`` (``cache[b, j] = cache[b, parent_lanes[b, j]]``), as an engine would copy KV
    lanes. It equals the driver-propagated EAGLE loop exactly when ``parent_lanes`` is right.
    Records every ``parent_lanes`` it got (device clones: a host copy would synchronise)."""

    def __init__(self, model, prefix_hidden: torch.Tensor, topk: int):
        self.model, self.prefix_hidden, self.topk = model, prefix_hidden, topk
        self.cache, self.received = None, []

    def __call__(self, input_ids, positions, hidden, step, *, parent_lanes):
        self.received.append(parent_lanes.clone())
        if step == 0:
            cache = self.prefix_hidden.repeat_interleave(self.topk, dim=0)
        else:
            bs, width = parent_lanes.shape[0], self.cache.shape[1]
            lanes = self.cache.view(bs, self.topk, width)
            cache = lanes.gather(1, parent_lanes[:, :, None].expand(bs, self.topk, width)).view(bs * self.topk, width)
        logits, self.cache = self.model(input_ids, positions, cache, step)
        return logits, None

    def to(self, device) -> "LaneCacheDraftModel":
        self.model.to(device)
        self.prefix_hidden = self.prefix_hidden.to(device)
        return self


def check_parent_lanes(backend, *, bs: int, steps: int, topk: int, driver=run_draft) -> None:
    """pass_parent_lanes: a draft that keeps its own lane state, reordered by the parent lanes it
    is given, drafts exactly what the reference loop drafts with driver-propagated hidden."""
    state = make_state(bs, topk, seed=31 + steps, device=backend.device)
    model = LaneCacheDraftModel(EagleDraftModel(seed=steps), state.hidden, topk)
    without_hidden = DraftState(state.roots, state.positions, state.probs, state.ids, None)
    result = _run(driver, backend, model, without_hidden, steps=steps, topk=topk, pass_parent_lanes=True)
    _assert_records_match(result, reference_draft(EagleDraftModel(seed=steps), state, steps=steps, topk=topk))
    assert len(model.received) == steps - 1
    for index, lanes in enumerate(model.received):
        assert lanes.shape == (bs, topk) and lanes.dtype == torch.int64, f"forward {index}: parent_lanes {tuple(lanes.shape)} {lanes.dtype}"
        if index == 0:
            assert bool((lanes == -1).all()), "forward 0: parent_lanes must be -1 (every lane continues the root)"
        else:  # from the record's parents (candidate-list indices): lane = choice // K
            choice = result.records[index].parents.cpu() - (topk + topk * topk * (index - 1))
            assert torch.equal(lanes.cpu(), choice // topk), f"forward {index}: parent_lanes disagree with the record's parents"


@pytest.mark.parametrize("bs, steps, topk", [(3, 4, 2), (2, 3, 4), (0, 3, 2)])
def test_run_draft_parent_lanes_drive_a_lane_cache(backend, bs, steps, topk):
    check_parent_lanes(backend, bs=bs, steps=steps, topk=topk)


def check_standalone_positions(backend, *, steps: int, topk: int, driver=run_draft) -> None:
    """eagle_shift=False: forward i runs at root + i + 1 (the tokens' own positions), and the
    records equal the reference loop run at those positions."""
    model = ProbeModel(EagleDraftModel(seed=steps + 11))
    state = make_state(3, topk, seed=steps * topk, device=backend.device)
    result = _run(driver, backend, model, state, steps=steps, topk=topk, eagle_shift=False)
    roots = state.positions.cpu().repeat_interleave(topk)
    for index, call in enumerate(model.calls):
        assert torch.equal(call.positions, roots + index + 1), f"forward {index}: standalone positions must be root + {index + 1}"
    _assert_records_match(result, reference_draft(EagleDraftModel(seed=steps + 11), state, steps=steps, topk=topk, eagle_shift=False))


@pytest.mark.parametrize("steps, topk", [(3, 1), (4, 3)])
def test_run_draft_standalone_positions(backend, steps, topk):
    check_standalone_positions(backend, steps=steps, topk=topk)


TARGET_VOCAB = 200


class ReducedVocabularyModel:
    """An EAGLE-3-style draft: reads target ids (mapped back to its own vocabulary through the
    reverse map, as its embedding would), writes logits over the reduced draft vocabulary."""

    def __init__(self, model, reverse_map: torch.Tensor):
        self.model, self.reverse_map = model, reverse_map

    def __call__(self, input_ids, positions, hidden, step, **parent_lanes):
        return self.model(self.reverse_map[input_ids], positions, hidden, step, **parent_lanes)

    def to(self, device) -> "ReducedVocabularyModel":
        self.model.to(device)
        self.reverse_map = self.reverse_map.to(device)
        return self


def _draft_to_target(vocab: int = 64) -> torch.Tensor:
    """A seeded (vocab,) int64 map onto distinct target ids in [0, TARGET_VOCAB)."""
    return torch.randperm(TARGET_VOCAB, generator=torch.Generator().manual_seed(3))[:vocab]


def check_token_map(backend, *, form: str, map_dtype: torch.dtype, driver=run_draft) -> None:
    """token_map as absolute ids or EAGLE-3 offsets (d2t): the records' tokens are target ids,
    equal to the reference loop's with the absolute map."""
    absolute = _draft_to_target()
    given = absolute if form == "ids" else absolute - torch.arange(absolute.shape[0])
    steps, topk = 3, 2
    state = make_state(3, topk, seed=9, device=backend.device)
    state = DraftState(state.roots, state.positions, state.probs, absolute.to(backend.device)[state.ids], state.hidden)
    reverse = reverse_token_map(absolute, target_vocab=TARGET_VOCAB)
    model = ReducedVocabularyModel(EagleDraftModel(seed=4), reverse)
    result = _run(driver, backend, model, state, steps=steps, topk=topk, token_map=given.to(map_dtype).to(backend.device),
                  token_map_offsets=form == "offsets")
    oracle = ReducedVocabularyModel(EagleDraftModel(seed=4), reverse)
    _assert_records_match(result, reference_draft(oracle, state, steps=steps, topk=topk, token_map=absolute))
    assert bool(torch.isin(result.records[-1].tokens.cpu(), absolute).all()), "a drafted id is not a target id of the map"


@pytest.mark.parametrize("form", ("ids", "offsets"))
@pytest.mark.parametrize("map_dtype", (torch.int32, torch.int64))
def test_run_draft_token_map(backend, form, map_dtype):
    check_token_map(backend, form=form, map_dtype=map_dtype)


class LaneDependentModel:
    """Stateless, so a captured graph replays it: its logits depend on the parent lanes."""

    def __init__(self, model):
        self.model = model

    def __call__(self, input_ids, positions, hidden, step, *, parent_lanes):
        logits, hidden_out = self.model(input_ids, positions, hidden, step)
        return logits + 0.5 * parent_lanes.reshape(-1, 1).to(logits.dtype), hidden_out

    def to(self, device) -> "LaneDependentModel":
        self.model.to(device)
        return self


def test_run_draft_graph_with_options_equals_eager(backend):
    """Under graph=DraftGraphs the options (parent lanes, standalone positions, an offset token
    map read in place) give the eager loop's records, bit-identical."""
    absolute = _draft_to_target()
    d2t = (absolute - torch.arange(absolute.shape[0])).to(backend.device)
    model = ReducedVocabularyModel(LaneDependentModel(EagleDraftModel(seed=8)), reverse_token_map(absolute, target_vocab=TARGET_VOCAB)).to(backend.device)
    options = dict(steps=3, topk=2, pass_parent_lanes=True, eagle_shift=False, token_map=d2t, token_map_offsets=True)
    graphs = DraftGraphs((2,))
    for round_index, bs in enumerate((2, 1)):  # the bucket exactly, then a padded batch
        state = make_state(bs, 2, seed=50 + round_index, device=backend.device)
        state = DraftState(state.roots, state.positions, state.probs, absolute.to(backend.device)[state.ids], state.hidden)
        if round_index == 0:
            got = run_draft(model, state, backend=backend, graph=graphs, **options)
        else:
            got = _run(run_draft, backend, model, state, graph=graphs, **options)
        want = run_draft(model, _padded(state, 2), backend=backend, **options)
        _assert_same_result(got, want, bs, f"round {round_index} (bs={bs})")
    assert len(graphs.runners) == 1


def test_run_draft_rejects_bad_options(backend, monkeypatch):
    model = EagleDraftModel().to(backend.device)
    state = make_state(2, 2, seed=0, device=backend.device)
    device = backend.device
    cases = [
        ("pass_parent_lanes", dict(pass_parent_lanes=1)),
        ("eagle_shift", dict(eagle_shift=None)),
        ("token_map_offsets", dict(token_map=torch.arange(64, device=device), token_map_offsets="yes")),
        ("token_map", dict(token_map_offsets=True)),
        ("token_map", dict(token_map=torch.arange(64, device=device, dtype=torch.float32))),
        ("token_map", dict(token_map=torch.arange(64, device=device).view(8, 8))),
        ("token_map", dict(token_map=torch.arange(63, device=device))),  # not the draft's vocabulary (64 logits)
    ]
    for argument, kwargs in cases:
        with pytest.raises(InvalidInput) as error:
            run_draft(model, state, steps=2, topk=2, backend=backend, **kwargs)
        assert error.value.argument == argument, (argument, kwargs)
    monkeypatch.setenv("SPEC_HAL_CHECKS", "1")  # checked mode: mapped ids must be target ids (>= 0)
    for kwargs in (dict(token_map=torch.arange(64, device=device) - 1), dict(token_map=torch.full((64,), -5, device=device), token_map_offsets=True)):
        with pytest.raises(InvalidInput) as error:
            run_draft(model, state, steps=2, topk=2, backend=backend, **kwargs)
        assert error.value.argument == "token_map"
