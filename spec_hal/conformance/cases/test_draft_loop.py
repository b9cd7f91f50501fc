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
from spec_hal.topk import draft_topk as reference_draft_topk
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
    snapshot = {name: getattr(state, name).clone() for name in STATE_FIELDS}
    model.to(backend.device)  # weights on the device first: a host-to-device copy synchronises
    with no_host_sync(backend.device):
        result = driver(model, state, backend=backend, **kwargs)
    for name in STATE_FIELDS:
        assert torch.equal(getattr(state, name), snapshot[name]), f"run_draft changed the caller's state.{name}"
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


def reference_draft(model, state: DraftState, *, steps: int, topk: int):
    """The draft loop written out plainly with the reference ops on CPU (the oracle)."""
    cpu = {name: None if getattr(state, name) is None else getattr(state, name).cpu() for name in STATE_FIELDS}
    expansion = reference_expand_tree(0, None, cpu["probs"], cpu["ids"], hidden=cpu["hidden"])
    records = [expansion.record]
    for step in range(1, steps):
        positions = cpu["positions"].repeat_interleave(topk) + (step - 1)
        logits, hidden = model(expansion.input_ids, positions, expansion.hidden, step - 1)
        probs, ids = reference_draft_topk(logits, topk)
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


@pytest.mark.parametrize("bs, steps, topk, nodes", [(0, 3, 4, 8), (1, 1, 4, 5), (3, 3, 1, 4), (6, 5, 4, 8), (4, 5, 8, 32)])
def test_run_draft_matches_reference_loop(backend, bs, steps, topk, nodes):
    """The records equal the plain reference loop's, and feed organize_draft and build_tree."""
    model = EagleDraftModel(seed=bs + steps)
    state = make_state(bs, topk, seed=bs * 7 + steps, device=backend.device)
    result = _run(run_draft, backend, model, state, steps=steps, topk=topk)
    expected = reference_draft(model, state, steps=steps, topk=topk)
    assert result.num_steps == steps == len(expected)
    for index, (got, want) in enumerate(zip(result.records, expected)):
        assert torch.equal(got.tokens.cpu(), want.tokens), f"step {index}: candidate tokens differ from the reference loop"
        assert torch.equal(got.parents.cpu(), want.parents), f"step {index}: parents differ from the reference loop"
        torch.testing.assert_close(got.scores.cpu(), want.scores, atol=1e-6, rtol=1e-5)
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
