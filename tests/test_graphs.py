"""GraphRunner: the conformance cases fail for broken draft steps (upstream bug 2) and broken
runners, and the runner's own contract (validation, output structures, guard, fallback)."""
import warnings

import pytest
import torch

import spec_hal
from spec_hal.conformance.cases import test_graphs as graph_cases
from spec_hal.errors import GraphStateError, InvalidInput
from spec_hal.graphs import GraphCaptureWarning, GraphRunner
from spec_hal.selection import get_backend


@pytest.fixture
def cpu():
    return get_backend("cpu")


# ------------------------------------------------------------------ broken draft steps (bug 2)
class RebindsCarriedState(graph_cases.ChainedDraftStep):
    """Upstream bug 2: the new hidden states go to a new tensor (``hidden`` is rebound to fresh
    storage) instead of being written into the buffer the step was given. A plain call looks
    right (the caller's tensor object follows the rebinding); under the runner the static buffer
    (the captured one) never changes."""

    def __call__(self, *, input_ids, positions, hidden):
        logits, new_hidden = self.model(input_ids, positions, hidden)
        hidden.set_(new_hidden)
        probs, ids = self.backend.draft_topk(logits, graph_cases.TOPK)
        return {"probs": probs, "ids": ids}


def test_bug2_rebinding_carried_state_is_caught(cpu, monkeypatch):
    monkeypatch.setattr(graph_cases, "DRAFT_STEP", RebindsCarriedState)
    with pytest.raises(AssertionError, match="carried hidden differs"):
        graph_cases.test_graph_replay_equals_eager(cpu)


def test_bug2_eager_call_of_the_broken_step_chains_correctly(cpu):
    """The broken step is only wrong under the runner: called plainly it carries its state."""
    values = graph_cases._batch(3, seed=4)
    correct = graph_cases._chain(graph_cases.ChainedDraftStep(cpu, graph_cases.ToyDraftModel("cpu", seed=7)),
                                 graph_cases._with_poisoned_tail(values, "cpu"), 3, device="cpu")
    broken = graph_cases._chain(RebindsCarriedState(cpu, graph_cases.ToyDraftModel("cpu", seed=7)),
                                graph_cases._with_poisoned_tail(values, "cpu"), 3, device="cpu")
    graph_cases._assert_chains_equal(broken, correct, "plain calls")


# ------------------------------------------------------------------------- broken runners
def test_runner_losing_carried_state_is_caught(cpu, monkeypatch):
    """The runner-side bug 2: mutated state never reaches the caller."""
    monkeypatch.setattr(GraphRunner, "_write_back", lambda self, inputs, *, batch: None)
    with pytest.raises(AssertionError, match="carried hidden differs"):
        graph_cases.test_graph_replay_equals_eager(cpu)


def test_runner_returning_uncloned_outputs_is_caught(cpu, monkeypatch):
    def run_without_clone(self, **inputs):
        batch = self._check_run_inputs(inputs)
        bucket = min(size for size in self.batch_sizes if size >= batch)
        self._load(inputs, batch=batch, bucket=bucket)
        self._launch(bucket)
        self._write_back(inputs, batch=batch)
        return graph_cases.graphs_module._unflatten_outputs(self._output_spec, [o[:batch] for o in self._static_outputs[bucket]])

    monkeypatch.setattr(GraphRunner, "run", run_without_clone)
    with pytest.raises(AssertionError, match="must be cloned|differ"):
        graph_cases.test_graph_new_inputs_give_new_results(cpu)


def test_runner_with_stale_inputs_is_caught(cpu, monkeypatch):
    original_load = GraphRunner._load

    def load_once(self, inputs, *, batch, bucket):
        if not getattr(self, "_loaded", False):
            original_load(self, inputs, batch=batch, bucket=bucket)
            self._loaded = True

    monkeypatch.setattr(GraphRunner, "_load", load_once)
    with pytest.raises((AssertionError, IndexError)):  # stale real rows, or poison left in the buffers
        graph_cases.test_graph_new_inputs_give_new_results(cpu)


def test_runner_not_refilling_padding_is_caught(cpu, monkeypatch):
    def load_without_padding(self, inputs, *, batch, bucket):
        for name, buffer in self.static_inputs.items():
            buffer[:batch].copy_(inputs[name])

    monkeypatch.setattr(GraphRunner, "_load", load_without_padding)
    # The poisoned padding ids reach the embedding gather (IndexError) or the padding check.
    with pytest.raises((AssertionError, IndexError)):
        graph_cases.test_graph_replay_equals_eager(cpu)


def test_state_guard_case_fails_without_the_guard(cpu, monkeypatch):
    monkeypatch.setattr(graph_cases.graphs_module, "_first_difference", lambda before, after: None)
    with pytest.raises(pytest.fail.Exception):
        graph_cases.test_graph_state_guard_catches_drifting_positions(cpu, False)


# ------------------------------------------------------------------------ runner contract
def _double(*, x):
    return x * 2


def test_graph_runner_is_exported_lazily():
    assert spec_hal.GraphRunner is GraphRunner
    assert "GraphRunner" in spec_hal.__all__


@pytest.mark.parametrize("kind", ("tensor", "tuple", "list", "dict"))
def test_output_structures_round_trip(kind):
    def fn(*, x):
        doubled, summed = x * 2, x.sum(dim=1, keepdim=True)
        return {"tensor": doubled, "tuple": (doubled, summed), "list": [doubled, summed],
                "dict": {"doubled": doubled, "summed": summed}}[kind]

    runner = GraphRunner(fn, inputs={"x": torch.empty(0, 3)}, batch_sizes=(2, 4))
    x = torch.arange(9.0).view(3, 3)
    result = runner.run(x=x)
    assert type(result).__name__ == {"tensor": "Tensor", "tuple": "tuple", "list": "list", "dict": "dict"}[kind]
    first = result if kind == "tensor" else (result["doubled"] if kind == "dict" else result[0])
    assert torch.equal(first, x * 2)
    empty = runner.run(x=torch.empty(0, 3))
    first_empty = empty if kind == "tensor" else (empty["doubled"] if kind == "dict" else empty[0])
    assert first_empty.shape == (0, 3)
    assert runner.replays == {2: 0, 4: 1}


def test_padding_uses_declared_pad_values():
    seen = {}

    def fn(*, ids, mask):
        seen["ids"], seen["mask"] = ids.clone(), mask.clone()
        return ids + 0

    runner = GraphRunner(fn, inputs={"ids": torch.empty(0, dtype=torch.int32), "mask": torch.empty(0, 2, dtype=torch.bool)},
                         batch_sizes=(4,), pad_values={"ids": 7, "mask": True})
    out = runner.run(ids=torch.tensor([1, 2], dtype=torch.int32), mask=torch.zeros(2, 2, dtype=torch.bool))
    assert out.tolist() == [1, 2]
    assert seen["ids"].tolist() == [1, 2, 7, 7]
    assert seen["mask"].tolist() == [[False, False], [False, False], [True, True], [True, True]]


def test_state_guard_names_the_buffer_and_compares_bits():
    def nudges_scale(*, x, scale):
        scale.mul_(1.0)  # a NaN stays NaN bit for bit: not a change
        x.add_(1)
        return x + scale

    with pytest.raises(GraphStateError, match="'x'"):
        GraphRunner(nudges_scale, inputs={"x": torch.empty(0), "scale": torch.empty(0)}, batch_sizes=(2,),
                    pad_values={"scale": float("nan")})
    runner = GraphRunner(nudges_scale, inputs={"x": torch.empty(0), "scale": torch.empty(0)}, batch_sizes=(2,),
                         mutable=("x",), pad_values={"scale": float("nan")})
    x = torch.tensor([1.0, 2.0])
    runner.run(x=x, scale=torch.tensor([0.5, 0.5]))
    assert x.tolist() == [2.0, 3.0], "mutable inputs are written back into the caller's tensor"


def test_state_guard_catches_writes_beyond_the_batch_of_a_mutable_input():
    def writes_past_batch(*, state):
        if state.shape[0] == 2:  # the smaller bucket's view: one row too far is still in the buffer
            state.as_strided((3,), (1,)).add_(1)
        return state + 0

    with pytest.raises(GraphStateError, match="beyond its batch"):
        GraphRunner(writes_past_batch, inputs={"state": torch.empty(0)}, batch_sizes=(2, 4), mutable=("state",))


@pytest.mark.parametrize("argument, kwargs", [
    ("inputs", {"inputs": {}}),
    ("inputs['x']", {"inputs": {"x": torch.tensor(1.0)}}),
    ("inputs['y']", {"inputs": {"x": torch.empty(0), "y": torch.empty(0, device="meta")}}),
    ("batch_sizes", {"batch_sizes": ()}),
    ("batch_sizes", {"batch_sizes": (0, 2)}),
    ("batch_sizes", {"batch_sizes": 4}),
    ("mutable", {"mutable": ("y",)}),
    ("pad_values", {"pad_values": {"y": 0}}),
    ("pad_values['x']", {"inputs": {"x": torch.empty(0, dtype=torch.int64)}, "pad_values": {"x": 0.5}}),
    ("pad_values['x']", {"pad_values": {"x": "zero"}}),
])
def test_construction_rejects_bad_arguments(argument, kwargs):
    arguments = {"inputs": {"x": torch.empty(0)}, "batch_sizes": (2,), **kwargs}
    with pytest.raises(InvalidInput) as error:
        GraphRunner(_double, **arguments)
    assert error.value.argument == argument


def test_outputs_must_be_batch_first():
    with pytest.raises(InvalidInput, match="fn output"):
        GraphRunner(lambda *, x: x.sum(), inputs={"x": torch.empty(0)}, batch_sizes=(2,))


def test_explain_reports_mode_buckets_and_replays():
    runner = GraphRunner(_double, inputs={"x": torch.empty(0)}, batch_sizes=(4, 1))
    runner.run(x=torch.ones(3))
    report = runner.explain()
    assert "mode eager" in report and "[1, 4]" in report and "4: 1" in report and "FALLBACK" not in report
    assert runner.fallback_reason is None


def test_simulated_capture_failure_warns_and_emulates(monkeypatch):
    graph_cases.test_graph_capture_failure_falls_back_with_a_warning(get_backend("cpu"), monkeypatch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: a real host sync during capture")
def test_host_sync_during_capture_falls_back():
    def syncs(*, x):
        if bool((x > 1e9).any()):  # a device-to-host read: forbidden while capturing
            return x * 0
        return x * 2

    with pytest.warns(GraphCaptureWarning, match="capture failed"):
        runner = GraphRunner(syncs, inputs={"x": torch.empty(0, device="cuda")}, batch_sizes=(2, 8))
    assert runner.mode == "eager" and "capture failed" in runner.fallback_reason
    x = torch.arange(5.0, device="cuda")
    assert torch.equal(runner.run(x=x), x * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        healthy = GraphRunner(_double, inputs={"x": torch.empty(0, device="cuda")}, batch_sizes=(8,))
    assert healthy.mode in ("cuda_graph", "hip_graph")
    assert torch.equal(healthy.run(x=x), x * 2)
