"""Backend lanes of the compat tests: every test takes the ``lane`` fixture and runs once on
``cpu`` and once on ``triton-interpret``.

Triton picks interpreted or compiled kernels when they are first defined, so the interpreter lane
runs in a child pytest process with ``TRITON_INTERPRET=1`` (``run_interpreter_lane``); inside that
child the ``cpu`` lane is skipped and the ``triton-interpret`` lane routes every spec_hal op on CPU
tensors through the Triton kernels (``SPEC_HAL_BACKEND``).
"""
import os
import subprocess
import sys

import pytest

import spec_hal.selection

LANES = ("cpu", "triton-interpret")
IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(params=LANES)
def lane(request, monkeypatch):
    name = request.param
    if name == "triton-interpret" and not IN_INTERPRETER:
        pytest.skip("runs in the interpreter child process (test_*_interpreter_lane)")
    if name == "cpu" and IN_INTERPRETER:
        pytest.skip("the cpu lane runs in the parent process")
    monkeypatch.setenv("SPEC_HAL_BACKEND", name)
    spec_hal.selection.reset()
    return name


def run_interpreter_lane(test_file: str) -> None:
    """Run ``test_file``'s triton-interpret lane in a child process; fail with its output."""
    if IN_INTERPRETER:
        pytest.skip("already in the interpreter lane")
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("SPEC_HAL_BACKEND", None)
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test_file, "-k", "triton-interpret"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert " passed" in result.stdout, result.stdout[-2000:]
