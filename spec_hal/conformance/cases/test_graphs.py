"""Conformance of family ``graphs`` (:class:`spec_hal.GraphRunner`). Semantics: spec_hal/graphs.py.

The captured functions are draft steps of a small deterministic model whose arithmetic is exact
(small integers in float32, so every matmul order gives the same logits) and whose top-k runs
through the backend under test (``backend.draft_topk``), so its kernels run under capture. On cuda
and rocm the runner captures real graphs; on cpu and triton-interpret it runs the eager emulation
with the same static-buffer semantics. The baseline is the same step called eagerly on the
unpadded inputs with the reference ``draft_topk`` on CPU copies (plain fn call, no runner).
"""
from __future__ import annotations

import pytest
import torch

import spec_hal.graphs as graphs_module
from spec_hal.capabilities import GraphSupport, graph_support
from spec_hal.conformance.guards import no_host_sync
from spec_hal.conformance.tolerances import assert_close
from spec_hal.errors import GraphStateError, InvalidInput
from spec_hal.graphs import GraphCaptureWarning, GraphRunner
from spec_hal.selection import get_backend

pytestmark = pytest.mark.spec_hal_op("GraphRunner")

VOCAB, HIDDEN, TOPK = 96, 16, 4
BUCKETS = (1, 4, 8)
REAL_BATCHES = (1, 3, 4, 5, 8)  # every bucket exactly, and padded batches for buckets 4 and 8
CHAIN_STEPS = 3
ID_POISON = VOCAB + 1000  # out of range: a padding row that leaks into a gather fails loudly
POSITION_POISON = -(1 << 40)
EXPECTED_MODE = {"cuda": "cuda_graph", "rocm": "hip_graph", "cpu": "eager", "triton-interpret": "eager"}


class ToyDraftModel:
    """A draft forward with exact float32 arithmetic: small-integer weights and states.

    ``(input_ids (bs,) int64, positions (bs,) int64, hidden (bs, H) float32)`` ->
    ``(logits (bs, V) float32, new_hidden (bs, H) float32)``; rows are independent.
    """

    def __init__(self, device, *, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.embedding = torch.randint(-3, 4, (VOCAB, HIDDEN), generator=generator).float().to(device)
        self.w_hidden = torch.randint(-2, 3, (HIDDEN, HIDDEN), generator=generator).float().to(device)
        self.w_out = torch.randint(-2, 3, (HIDDEN, VOCAB), generator=generator).float().to(device)

    def __call__(self, input_ids, positions, hidden):
        rope_like = torch.remainder(positions, 5).to(torch.float32).unsqueeze(1)
        x = self.embedding[input_ids] + rope_like
        new_hidden = torch.remainder(x @ self.w_hidden + hidden, 17.0) - 8.0
        return new_hidden @ self.w_out, new_hidden


class ChainedDraftStep:
    """One chained-MTP draft step (P18): the new hidden state is written into ``hidden`` in place."""

    def __init__(self, backend, model):
        self.backend, self.model = backend, model

    def __call__(self, *, input_ids, positions, hidden):
        logits, new_hidden = self.model(input_ids, positions, hidden)
        hidden.copy_(new_hidden)
        probs, ids = self.backend.draft_topk(logits, TOPK)
        return {"probs": probs, "ids": ids}


# The draft step the replay cases capture; tests/test_graphs.py swaps in broken steps to prove
# that the cases fail for them.
DRAFT_STEP = ChainedDraftStep


def _example_inputs(device) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.empty(0, dtype=torch.int64, device=device),
        "positions": torch.empty(0, dtype=torch.int64, device=device),
        "hidden": torch.empty(0, HIDDEN, dtype=torch.float32, device=device),
    }


def _make_runner(backend, model, buckets=BUCKETS) -> GraphRunner:
    return GraphRunner(DRAFT_STEP(backend, model), inputs=_example_inputs(backend.device), batch_sizes=buckets, mutable=("hidden",))


def _batch(batch: int, *, seed: int) -> dict[str, torch.Tensor]:
    """Real rows on CPU: valid ids, positions and small-integer hidden states."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(0, VOCAB, (batch,), generator=generator),
        "positions": torch.randint(0, 4000, (batch,), generator=generator),
        "hidden": torch.randint(-8, 9, (batch, HIDDEN), generator=generator).float(),
    }


def _with_poisoned_tail(values: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """Views of the real rows inside larger tensors whose extra rows are poison (NaN, bad ids).

    A runner that reads past the real batch of the caller's tensors picks the poison up.
    """
    poison = {"input_ids": ID_POISON, "positions": POSITION_POISON, "hidden": float("nan")}
    views = {}
    for name, value in values.items():
        outer = torch.full((value.shape[0] + BUCKETS[-1], *value.shape[1:]), poison[name], dtype=value.dtype, device=device)
        outer[:value.shape[0]].copy_(value)
        views[name] = outer[:value.shape[0]]
    return views


def _poison_static_buffers(runner: GraphRunner) -> None:
    """Poison every static row: the runner must rewrite real rows and padding on each run."""
    runner.static_inputs["input_ids"].fill_(ID_POISON)
    runner.static_inputs["positions"].fill_(POSITION_POISON)
    runner.static_inputs["hidden"].fill_(float("nan"))


def _eager_chain(model_seed: int, values: dict[str, torch.Tensor], steps: int) -> list[dict[str, torch.Tensor]]:
    """The baseline: the draft step called eagerly on the unpadded inputs, reference top-k on CPU."""
    step = DRAFT_STEP(get_backend("cpu"), ToyDraftModel("cpu", seed=model_seed))
    state = _with_poisoned_tail(values, "cpu")
    return _chain(step, state, steps, device="cpu")


def _chain(call, state: dict[str, torch.Tensor], steps: int, *, device, before_step=None) -> list[dict[str, torch.Tensor]]:
    """``steps`` chained calls: ids of the top candidate feed the next step, positions advance
    out of place (driver-owned), ``hidden`` is carried in place by the step."""
    results = []
    for _ in range(steps):
        if before_step is not None:
            before_step()
        outputs = call(**state)
        results.append({"probs": outputs["probs"], "ids": outputs["ids"], "hidden": state["hidden"].clone()})
        advanced = {"input_ids": outputs["ids"][:, 0], "positions": state["positions"] + 1}
        state = {**_with_poisoned_tail(advanced, device), "hidden": state["hidden"]}
    return results


def _runner_chain(runner: GraphRunner, values: dict[str, torch.Tensor], steps: int) -> list[dict[str, torch.Tensor]]:
    state = _with_poisoned_tail(values, runner.device)
    batch = values["input_ids"].shape[0]

    def run(**inputs):
        with no_host_sync(runner.device):
            outputs = runner.run(**inputs)
        bucket = min(size for size in runner.batch_sizes if size >= batch)
        for name in ("input_ids", "positions"):  # non-mutable: padding holds the declared pad value
            padding = runner.static_inputs[name][batch:bucket]
            assert (padding == runner.pad_values[name]).all(), f"padding rows of {name} were not refilled with the pad value"
        return outputs

    return _chain(run, state, steps, device=runner.device, before_step=lambda: _poison_static_buffers(runner))


def _assert_chains_equal(actual: list[dict], expected: list[dict], what: str) -> None:
    assert len(actual) == len(expected)
    for step, (got, want) in enumerate(zip(actual, expected)):
        assert torch.equal(got["ids"].cpu(), want["ids"]), f"{what}, step {step}: ids differ from eager\n{got['ids'].cpu()}\n{want['ids']}"
        assert torch.equal(got["hidden"].cpu(), want["hidden"]), f"{what}, step {step}: carried hidden differs from eager"
        assert_close("draft_topk", "probs", got["probs"], want["probs"], input_dtype=torch.float32)


def test_graph_mode_matches_backend(backend):
    """Capability honesty: graphs on cuda/rocm, the emulation on CPU tensors, never a silent eager."""
    runner = _make_runner(backend, ToyDraftModel(backend.device, seed=1), buckets=(2,))
    expected = EXPECTED_MODE.get(backend.name, graph_support(backend.device).mode)
    assert runner.mode == expected, runner.explain()
    assert runner.fallback_reason is None, runner.explain()
    assert runner.mode in runner.explain()


def test_graph_replay_equals_eager(backend):
    """Every bucket, padded and exact batches, chained steps with carried hidden state."""
    runner = _make_runner(backend, ToyDraftModel(backend.device, seed=7))
    for batch in REAL_BATCHES:
        values = _batch(batch, seed=100 + batch)
        expected = _eager_chain(7, values, CHAIN_STEPS)
        _assert_chains_equal(_runner_chain(runner, values, CHAIN_STEPS), expected, f"bs {batch}")
    assert runner.replays == {1: CHAIN_STEPS, 4: 2 * CHAIN_STEPS, 8: 2 * CHAIN_STEPS}


def test_graph_new_inputs_give_new_results(backend):
    """No stale inputs: a second run sees its own inputs; the first run's outputs stay intact."""
    runner = _make_runner(backend, ToyDraftModel(backend.device, seed=11))
    first_values, second_values = _batch(3, seed=1), _batch(3, seed=2)
    first = _runner_chain(runner, first_values, 1)[0]
    kept = {name: tensor.clone() for name, tensor in first.items()}
    second = _runner_chain(runner, second_values, 1)[0]
    expected_first, expected_second = _eager_chain(11, first_values, 1), _eager_chain(11, second_values, 1)
    assert not torch.equal(expected_first[0]["ids"], expected_second[0]["ids"]), "the two inputs must differ in result"
    _assert_chains_equal([second], expected_second, "second run")
    _assert_chains_equal([first], expected_first, "first run's outputs after the second run")
    for name, tensor in kept.items():
        assert torch.equal(first[name], tensor), f"the first run's {name} changed: outputs must be cloned"


def test_graph_pool_isolation(backend):
    """Capture A, capture B, replay A: A is still correct (sglang#22930)."""
    runner_a = _make_runner(backend, ToyDraftModel(backend.device, seed=21))
    runner_b = _make_runner(backend, ToyDraftModel(backend.device, seed=22), buckets=(2, 8))
    values = _batch(5, seed=5)
    b_results = _runner_chain(runner_b, values, 2)
    a_results = _runner_chain(runner_a, values, 2)
    _assert_chains_equal(a_results, _eager_chain(21, values, 2), "runner A after B was captured and replayed")
    _assert_chains_equal(b_results, _eager_chain(22, values, 2), "runner B")


def test_graph_batch_size_zero_and_limits(backend):
    runner = _make_runner(backend, ToyDraftModel(backend.device, seed=31))
    empty = {name: example for name, example in _example_inputs(backend.device).items()}
    with no_host_sync(backend.device):
        outputs = runner.run(**empty)
    assert set(outputs) == {"probs", "ids"}
    assert outputs["probs"].shape == (0, TOPK) and outputs["probs"].dtype == torch.float32
    assert outputs["ids"].shape == (0, TOPK) and outputs["ids"].dtype == torch.int64
    assert outputs["ids"].device == backend.device
    assert sum(runner.replays.values()) == 0, "bs = 0 must not replay"
    largest = _batch(BUCKETS[-1], seed=9)
    _assert_chains_equal(_runner_chain(runner, largest, 1), _eager_chain(31, largest, 1), "largest bucket")
    too_big = {name: torch.cat([value, value[:1]]).to(backend.device) for name, value in largest.items()}
    with pytest.raises(InvalidInput) as error:
        runner.run(**too_big)
    assert error.value.argument == "batch size"


def test_graph_run_validates_inputs(backend):
    runner = _make_runner(backend, ToyDraftModel(backend.device, seed=41), buckets=(2,))
    good = {name: value.to(backend.device) for name, value in _batch(2, seed=3).items()}
    cases = [
        ("positions", {**good, "positions": good["positions"][:1]}),
        ("hidden", {**good, "hidden": good["hidden"].double()}),
        ("hidden", {**good, "hidden": good["hidden"][:, :3]}),
        ("input_ids", {key: value for key, value in good.items() if key != "input_ids"}),
        ("extra", {**good, "extra": good["positions"]}),
    ]
    for argument, inputs in cases:
        with pytest.raises(InvalidInput) as error:
            runner.run(**inputs)
        assert error.value.argument == argument


class DraftLoopAdvancingPositions:
    """Upstream bug 1 (PR #25015): the loop advances the shared positions buffer S-1 times.

    With ``restore`` it subtracts S-1 afterwards (the upstream fix); without, the buffer drifts.
    """

    def __init__(self, backend, model, *, steps: int, restore: bool):
        self.backend, self.model, self.steps, self.restore = backend, model, steps, restore

    def __call__(self, *, input_ids, positions, hidden):
        records = []
        for step in range(self.steps):
            logits, hidden_out = self.model(input_ids, positions, hidden)
            probs, ids = self.backend.draft_topk(logits, 1)
            records.append(ids)
            if step < self.steps - 1:
                input_ids, hidden = ids[:, 0], hidden_out
                positions.add_(1)  # after the forward (the bug-1 fix), mutating the shared buffer
        if self.restore:
            positions.sub_(self.steps - 1)
        return torch.cat(records, dim=1)


@pytest.mark.parametrize("restore", (False, True), ids=("drifting", "restored"))
def test_graph_state_guard_catches_drifting_positions(backend, restore):
    """Bug 1 regression: a positions buffer left advanced is a GraphStateError at capture."""
    fn = DraftLoopAdvancingPositions(backend, ToyDraftModel(backend.device, seed=51), steps=3, restore=restore)
    build = lambda: GraphRunner(fn, inputs=_example_inputs(backend.device), batch_sizes=(1, 4))  # noqa: E731
    if not restore:
        with pytest.raises(GraphStateError, match="'positions'"):
            build()
        return
    runner = build()
    values = _batch(3, seed=8)
    device_values = {name: value.to(backend.device) for name, value in values.items()}
    positions_before = device_values["positions"].clone()
    with no_host_sync(backend.device):
        ids = runner.run(**device_values)
    eager_fn = DraftLoopAdvancingPositions(get_backend("cpu"), ToyDraftModel("cpu", seed=51), steps=3, restore=True)
    assert torch.equal(ids.cpu(), eager_fn(**{name: value.clone() for name, value in values.items()}))
    assert torch.equal(device_values["positions"], positions_before), "a non-mutable caller input was written"


def _fails_while_capturing(model, backend):
    step = ChainedDraftStep(backend, model)

    def fn(**inputs):
        if inputs["input_ids"].is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("operation not permitted when stream is capturing (simulated)")
        return step(**inputs)

    return fn


def test_graph_capture_failure_falls_back_with_a_warning(backend, monkeypatch):
    """A failed capture gives mode "eager", a warning, a fallback reason and correct results.

    On a GPU the real capture path fails (fn raises while the stream is capturing); on CPU
    tensors capture is simulated as available and failing.
    """
    if graph_support(backend.device).mode == "eager":
        monkeypatch.setattr(graphs_module, "graph_support", lambda device: GraphSupport("cuda_graph", "simulated"))

        def failing_capture(runner):
            raise graphs_module._CaptureFailed(runner.batch_sizes[-1], RuntimeError("simulated capture failure"))

        monkeypatch.setattr(GraphRunner, "_capture_all", failing_capture)
    model = ToyDraftModel(backend.device, seed=61)
    with pytest.warns(GraphCaptureWarning, match="capture failed"):
        runner = GraphRunner(_fails_while_capturing(model, backend), inputs=_example_inputs(backend.device),
                             batch_sizes=BUCKETS, mutable=("hidden",))
    assert runner.mode == "eager"
    assert runner.fallback_reason is not None and "capture failed" in runner.fallback_reason
    assert "FALLBACK" in runner.explain()
    values = _batch(5, seed=6)
    _assert_chains_equal(_runner_chain(runner, values, 2), _eager_chain(61, values, 2), "eager fallback")
