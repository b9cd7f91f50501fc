"""`spec-hal conformance`: exit codes, JSON report, xfail manifests (docs/architecture.md §5)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Each case runs the CLI end to end (a suite collection each): minutes; `make test-quick` runs the
# conformance lanes through the same CLI instead.
pytestmark = pytest.mark.slow


def conformance(*args, env_extra=None, cwd=None):
    env = dict(os.environ)
    env.pop("SPEC_HAL_BACKEND", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "spec_hal.cli", "conformance", *args],
                          capture_output=True, text=True, env=env, timeout=600, cwd=cwd)


def test_report_lists_cases_capabilities_and_providers(tmp_path):
    report = tmp_path / "cpu.json"
    junit = tmp_path / "cpu.xml"
    result = conformance("--backend", "cpu", "-k", "draft_topk and (golden or rejects)", "--report", str(report), "--junitxml", str(junit))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(report.read_text())
    assert data["backend"] == "cpu" and data["capabilities"]["backend"] == "cpu"
    assert data["providers"]["draft_topk"].startswith("reference")
    assert data["versions"]["torch"]
    ops = {case["op"] for case in data["cases"]}
    assert "draft_topk" in ops  # every family has golden and rejects cases
    assert all(case["outcome"] == "passed" for case in data["cases"])
    assert data["summary"]["passed"] == len(data["cases"]) > 10
    assert "<testsuite" in junit.read_text()


def test_unknown_backend_exits_3():
    result = conformance("--backend", "nonexistent", "-k", "golden")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "nonexistent" in result.stdout + result.stderr


def test_nothing_selected_exits_5():
    result = conformance("--backend", "cpu", "-k", "no_case_has_this_name")
    assert result.returncode == 5, result.stdout + result.stderr


def test_failing_case_exits_1_and_is_reported(tmp_path):
    # The dummy plugin can be told to break draft_topk's tie rule; the suite must notice.
    report = tmp_path / "broken.json"
    plugin = str(Path(__file__).parent / "dummy_plugin")
    result = conformance("--backend", "dummy", "-k", "golden", "--report", str(report),
                         env_extra={"PYTHONPATH": plugin, "SPEC_HAL_DUMMY_BREAK_TIES": "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    outcomes = {case["case"].split("::")[-1]: case["outcome"] for case in json.loads(report.read_text())["cases"]}
    assert outcomes["test_draft_topk_golden"] == "failed"


def _manifest(tmp_path, case):
    path = tmp_path / "xfail.toml"
    path.write_text(f'[[xfail]]\ncase = "{case}"\nreason = "test"\nlink = "https://example.invalid/issue/1"\n')
    return str(path)


def test_xfail_entry_that_matches_nothing_exits_6(tmp_path):
    result = conformance("--backend", "cpu", "-k", "golden", "--xfail", _manifest(tmp_path, "test_not_a_case"))
    assert result.returncode == 6, result.stdout + result.stderr
    assert "matches no case" in result.stdout


def test_xfail_entry_for_a_passing_case_exits_6(tmp_path):
    result = conformance("--backend", "cpu", "-k", "golden", "--xfail", _manifest(tmp_path, "test_draft_topk_golden"))
    assert result.returncode == 6, result.stdout + result.stderr
    assert "now passes" in result.stdout


def test_xfail_entry_for_a_failing_case_passes(tmp_path):
    plugin = str(Path(__file__).parent / "dummy_plugin")
    result = conformance("--backend", "dummy", "-k", "golden", "--xfail", _manifest(tmp_path, "test_draft_topk_golden"),
                         env_extra={"PYTHONPATH": plugin, "SPEC_HAL_DUMMY_BREAK_TIES": "1"})
    assert result.returncode == 0, result.stdout + result.stderr


def test_xfail_entry_without_link_is_a_usage_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[xfail]]\ncase = "test_draft_topk_golden"\nreason = "no link"\n')
    result = conformance("--backend", "cpu", "-k", "golden", "--known-issues", str(path))
    assert result.returncode == 2, result.stdout + result.stderr  # pytest's usage error (4) is the CLI's 2
    assert "lacks link" in result.stdout + result.stderr
