"""Helper of tests whose probe must run under the Triton interpreter in a fresh process
(TRITON_INTERPRET is read when kernels are defined, so it cannot be switched on inside pytest)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


# A hang guard, not a time limit: the slowest probes take about 550 s alone on CI's 2 cores, and
# `make test` runs the conformance lanes beside the tests.
PROBE_TIMEOUT_S = 1800


def run_interpreter_probe(source: str, *, timeout: int = PROBE_TIMEOUT_S) -> dict:
    """Run ``source`` with TRITON_INTERPRET=1 on the triton-interpret backend; return the JSON
    object it prints on its last line (fails the test with its stderr if it exits non-zero)."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", SPEC_HAL_BACKEND="triton-interpret")
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
