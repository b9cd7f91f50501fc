"""run_draft(graph=DraftGraphs(...)): the conformance cases fail for a draft model that breaks
under capture (upstream bug 2) and without the capture-time argument guard (upstream bug 1)."""
import pytest

import spec_hal.draft_loop as draft_loop
from spec_hal.conformance.cases import test_draft_loop as cases
from spec_hal.draft_loop import DraftGraphs, run_draft
from spec_hal.errors import InvalidInput
from spec_hal.selection import get_backend
from spec_hal.testing import ChainedMtpDraftModel


@pytest.fixture
def cpu():
    return get_backend("cpu")


class AttributeFedChainedMtp(ChainedMtpDraftModel):
    """Upstream bug 2b: the engine writes each round's hidden states into ``model.hidden_states``
    (a fresh tensor, an attribute) instead of handing them through the captured state buffer,
    and the first layer reads the attribute. Called eagerly this is right every round; a captured
    graph keeps reading the tensor bound at capture."""

    hidden_states = None

    def __call__(self, input_ids, positions, hidden, step):
        return super().__call__(input_ids, positions, self.hidden_states if step == 0 else hidden, step)


def engine_feeding_the_attribute(model, state, **kwargs):
    model.hidden_states = state.hidden.clone()  # the bug: a new tensor, not the captured buffer
    return run_draft(model, state, **kwargs)


def test_bug2_attribute_fed_model_is_right_eagerly(cpu):
    """Without a graph the broken engine gives the correct chain (the bug hides until replay)."""
    broken, correct = AttributeFedChainedMtp(num_layers=3, seed=5), ChainedMtpDraftModel(num_layers=3, seed=5)
    for bs in (4, 3):
        state = cases.make_state(bs, 1, seed=bs, device="cpu")
        got = engine_feeding_the_attribute(broken, state, steps=4, topk=1, chain_hidden=True, backend=cpu)
        want = run_draft(correct, state, steps=4, topk=1, chain_hidden=True, backend=cpu)
        cases._assert_same_result(got, want, bs, "eager")


def test_bug2_attribute_fed_model_fails_the_graph_case(cpu):
    """The case fails for it: the loop captured for bucket 1 reads the 4-row attribute of round 0
    (InvalidInput at capture, on every backend). Limitation: a shape-compatible attribute (say
    max-bs rows) would only fail on a GPU, where the replay keeps reading round 0's tensor; the
    CPU emulation re-runs the model and re-reads the attribute (spec_hal/graphs.py, State guard)."""
    with pytest.raises((AssertionError, RuntimeError, InvalidInput)):
        cases.check_graph_rounds(cpu, AttributeFedChainedMtp(num_layers=3, seed=5), steps=4, topk=1, chain_hidden=True,
                                 nodes=5, driver=engine_feeding_the_attribute)


def test_bug1_case_fails_without_the_argument_guard(cpu, monkeypatch):
    monkeypatch.setattr(draft_loop._ArgumentGuard, "__call__", lambda self, *args: self.model(*args))
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        cases.test_run_draft_graph_rejects_drifting_positions(cpu)


def test_bug1_model_is_harmless_eagerly_but_rejected_at_capture(cpu):
    """The driver recomputes positions, so the eager records are right; capture still refuses it."""
    model = cases.PositionAdvancingModel(cases.EagleDraftModel(seed=3))
    state = cases.make_state(3, 4, seed=1, device="cpu")
    got = run_draft(model, state, steps=3, topk=4, backend=cpu)
    cases._assert_same_result(got, run_draft(model.model, state, steps=3, topk=4, backend=cpu), 3, "eager")


def test_graph_case_catches_a_wrong_repack(cpu, monkeypatch):
    """A driver that repacks the captured records into the wrong steps fails the case."""
    original = draft_loop._record_widths
    monkeypatch.setattr(draft_loop, "_record_widths", lambda steps, topk: list(reversed(original(steps, topk))))
    with pytest.raises(AssertionError):
        cases.test_run_draft_graph_equals_eager(cpu, 3, 4, 8)


def test_draft_graphs_capture_once_per_key(cpu):
    graphs = DraftGraphs((2, 1, 2))
    assert graphs.batch_sizes == [1, 2]
    model = cases.EagleDraftModel(seed=1)
    for bs in (1, 2, 2):
        run_draft(model, cases.make_state(bs, 4, seed=bs, device="cpu"), steps=3, topk=4, backend=cpu, graph=graphs)
    run_draft(model, cases.make_state(2, 4, seed=0, device="cpu"), steps=2, topk=4, backend=cpu, graph=graphs)
    assert len(graphs.runners) == 2 and graphs.modes == ["eager", "eager"]
    assert "replays per bucket: 1: 1, 2: 2" in graphs.explain()
