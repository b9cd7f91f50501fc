"""Reliability outside single op calls (issue #20): backends in any order in one process, 8
threads at once (first use and steady state), two processes sharing an empty Triton cache, the
error flag, and a short version of the long engine run (scripts/long_run.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spec_hal import error_flag

ROOT = Path(__file__).resolve().parents[1]
TRITON_BACKENDS = ("triton-interpret", "cuda", "rocm")


def run_python(code: str, *, env_extra: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter on this checkout, without backend/interpreter variables."""
    env = {key: value for key, value in os.environ.items() if key not in ("SPEC_HAL_BACKEND", "TRITON_INTERPRET", "SPEC_HAL_CHECKS")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]


def test_triton_interpret_after_cpu_in_one_process():
    assert_ok(run_python("""
        import torch, spec_hal
        logits = torch.randn(3, 50)
        expected = spec_hal.get_backend("cpu").draft_topk(logits, 4)
        got = spec_hal.get_backend("triton-interpret").draft_topk(logits, 4)
        assert torch.equal(got[1], expected[1]) and torch.allclose(got[0], expected[0])
    """))


def test_triton_interpret_after_a_compiled_triton_import_says_why():
    assert_ok(run_python("""
        import triton, spec_hal
        reason = spec_hal.available_backends()["triton-interpret"]
        assert reason is not None and "TRITON_INTERPRET" in reason, reason
        try:
            spec_hal.get_backend("triton-interpret")
        except spec_hal.BackendUnavailable as error:
            assert "TRITON_INTERPRET" in str(error)
        else:
            raise AssertionError("no BackendUnavailable")
    """))


THREADS_CODE = """
    import sys, threading, torch, spec_hal
    from spec_hal.conformance import fuzz
    from spec_hal.registry import op_spec
    name = sys.argv[1] if len(sys.argv) > 1 else "{backend}"
    ops = ("draft_topk", "build_tree", "assign_draft_slots", "verify_greedy", "compact_accepted", "move_kv")
    calls = {{op: fuzz.BASELINES[op]() for op in ops}}
    expected = {{}}
    for op, call in calls.items():  # the reference, straight from the registry: no backend is built yet
        args = fuzz._clone(call.args)
        result = fuzz._invoke(op_spec(op).reference, call, args)
        expected[op] = args["caches"] if op == "move_kv" else result
    barrier, failures = threading.Barrier(8), []

    def worker(index):
        try:
            barrier.wait()
            backend = spec_hal.get_backend(name)  # concurrent first use
            for round_ in range(3):  # then steady state
                for op in ops[index % len(ops):] + ops[:index % len(ops)]:
                    call = calls[op]
                    args = fuzz._clone(call.args)
                    result = fuzz._invoke(getattr(backend, op), call, args)
                    got = args["caches"] if op == "move_kv" else result
                    if not fuzz._results_equal(got, expected[op]):
                        failures.append(f"thread {{index}} round {{round_}}: {{op}} differs from the reference")
        except Exception as error:
            failures.append(f"thread {{index}}: {{type(error).__name__}}: {{error}}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not failures, failures
"""


@pytest.mark.parametrize("backend", ("cpu", "triton-interpret"))
def test_eight_threads_first_use_and_steady_state(backend):
    assert_ok(run_python(THREADS_CODE.format(backend=backend)))


def _usable(name: str) -> bool:
    from spec_hal.selection import available_backends

    return available_backends().get(name) is None


@pytest.mark.parametrize("backend", [name for name in TRITON_BACKENDS if name == "triton-interpret" or _usable(name)])
def test_two_processes_share_an_empty_triton_cache(backend, tmp_path):
    cache = tmp_path / "triton-cache"
    cache.mkdir()
    code = f"""
        import torch, spec_hal
        from spec_hal.conformance import fuzz
        from spec_hal.registry import op_spec
        backend = spec_hal.get_backend("{backend}")
        for op in ("draft_topk", "build_tree", "verify_greedy"):
            call = fuzz.BASELINES[op]()
            expected = fuzz._invoke(op_spec(op).reference, call, fuzz._clone(call.args))
            got = fuzz._invoke(getattr(backend, op), call, fuzz._to(call.args, backend.device))
            assert fuzz._results_equal(got, expected), op
    """
    env = {key: value for key, value in os.environ.items() if key not in ("SPEC_HAL_BACKEND", "TRITON_INTERPRET")}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), TRITON_CACHE_DIR=str(cache))
    processes = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env, cwd=ROOT) for _ in range(2)]
    for process in processes:
        stdout, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, stdout[-3000:] + stderr[-5000:]


def test_error_flag_codes_round_trip():
    for op, names in error_flag.FLAGGED.items():
        for argument in names:
            for index in (0, 1, 12345, 2**40 - 1):
                assert error_flag.decode(error_flag.code(op, argument) + index) == (op, argument, index)
    assert error_flag.decode(error_flag.NO_ERROR) is None


def test_error_flag_keeps_the_smallest_record_and_clears(monkeypatch):
    import torch

    monkeypatch.delenv("SPEC_HAL_CHECKS", raising=False)
    error_flag.pending_errors("cpu")
    error_flag.record("move_kv", "dst", torch.tensor([False, False, True, True]))
    error_flag.record("move_kv", "src", torch.tensor([False, False, False, True]))
    assert error_flag.pending_errors("cpu") == [("move_kv", "src", 3)]
    assert error_flag.pending_errors("cpu") == []
    monkeypatch.setenv("SPEC_HAL_CHECKS", "1")
    with pytest.raises(ValueError, match="index 1"):
        error_flag.record("move_kv", "src", torch.tensor([False, True]))


def test_default_mode_checks_issue_no_torch_op(monkeypatch):
    """#15: an op's shared check validates metadata only; in the default mode the value records
    happen in the provider (a kernel records itself: one launch per call), so the check issues
    no torch op, not even on calls with invalid values."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from spec_hal.conformance import fuzz
    from spec_hal.conformance.cases.test_invalid_values import TWO_INVALID
    from spec_hal.registry import op_spec

    class CountOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    monkeypatch.delenv("SPEC_HAL_CHECKS", raising=False)
    calls = [make() for make in fuzz.BASELINES.values()] + [case()[0] for case in TWO_INVALID.values()]
    for call in calls:
        check = op_spec(call.op).check
        kwargs = {name: value for name, value in call.args.items() if name not in call.positional}
        positional = [call.args[name] for name in call.positional]
        check(*positional, **kwargs)  # first call: lazy imports may build module constants
        with CountOps() as counted:
            check(*positional, **kwargs)
        assert counted.ops == [], (call.op, counted.ops)


def test_short_long_run_has_flat_memory():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from long_run import long_run
    finally:
        sys.path.pop(0)
    report = long_run("cpu", rounds=60, slack_mb=32.0)
    assert report["rounds"] >= 60 and report["flat"], report["growth_mb"]


def test_validation_gaps_name_the_callers_argument():
    """#21: GraphRunner(fn=3) and run_draft with a vocabulary smaller than topk raise InvalidInput
    naming the caller's argument (not TypeError, not draft_topk's inner ``k``)."""
    import torch

    import spec_hal
    from spec_hal.types import DraftState

    with pytest.raises(spec_hal.InvalidInput) as raised:
        spec_hal.GraphRunner(3, inputs={"x": torch.zeros(2)}, batch_sizes=[2])
    assert raised.value.argument == "fn"
    state = DraftState(probs=torch.rand(2, 4), ids=torch.randint(0, 3, (2, 4)), roots=torch.zeros(2, dtype=torch.int64),
                       positions=torch.zeros(2, dtype=torch.int64), hidden=None)
    with pytest.raises(spec_hal.InvalidInput) as raised:
        spec_hal.run_draft(lambda ids, positions, hidden, step: (torch.randn(ids.shape[0], 3), None), state, steps=3, topk=4,
                           backend=spec_hal.get_backend("cpu"))
    assert raised.value.argument == "topk"
