"""Run the whole conformance suite against every backend this machine has (one process each:
the interpreter and the compiled kernels cannot share a process)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spec_hal.selection import available_backends

REPORTS = Path(os.environ.get("SPEC_HAL_REPORT_DIR", "reports"))
BUILTINS = ("cpu", "triton-interpret", "cuda", "rocm")


@pytest.mark.parametrize("backend", BUILTINS)
def test_conformance_suite_passes(backend):
    reason = available_backends()[backend]
    if reason is not None:
        pytest.skip(f"{backend} is not available here: {reason}")
    REPORTS.mkdir(parents=True, exist_ok=True)
    report = REPORTS / f"conformance-{backend}.json"
    env = {key: value for key, value in os.environ.items() if key != "SPEC_HAL_BACKEND"}
    command = [sys.executable, "-m", "spec_hal.cli", "conformance", "--backend", backend, "--report", str(report),
               "--junitxml", str(REPORTS / f"conformance-{backend}.xml")]
    print("running:", " ".join(command), flush=True)
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    data = json.loads(report.read_text())
    assert data["backend"] == backend
    assert data["summary"].get("failed", 0) == 0 and data["summary"]["passed"] > 0
    ops = {case["op"] for case in data["cases"]}
    assert "draft_topk" in ops
