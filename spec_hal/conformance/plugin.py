"""The conformance suite's pytest plugin (registered under ``pytest11``).

It adds the ``--spec-hal-*`` options, the ``backend`` fixture (the backend under test; exit code 3
when it cannot load), the JSON report, the xfail manifest and the exit codes of docs/architecture.md §5:
0 passed, 1 failures, 3 backend could not load, 5 nothing selected, 6 an xfail entry is stale
(the case now passes, or the entry matches no case).

Loading the plugin has no side effects: nothing is probed until a case asks for ``backend``.
"""
from __future__ import annotations

import fnmatch
import json
import platform
import time
from pathlib import Path

import pytest

EXIT_BACKEND_UNAVAILABLE = 3
EXIT_STALE_XFAIL = 6
_STATE = pytest.StashKey[dict]()


def pytest_addoption(parser):
    group = parser.getgroup("spec_hal", "spec_hal conformance")
    group.addoption("--spec-hal-backend", default=None, help="backend under test (default: auto-selected)")
    group.addoption("--spec-hal-quick", action="store_true", default=False, help="skip the cases marked full-grid only")
    group.addoption("--spec-hal-report", default=None, metavar="FILE", help="write a JSON conformance report")
    group.addoption("--spec-hal-xfail", default=None, metavar="FILE", help="TOML manifest of expected failures")


def pytest_configure(config):
    config.addinivalue_line("markers", "spec_hal_op(name): the op a conformance case exercises")
    config.addinivalue_line("markers", "spec_hal_full: part of the full grid only (skipped by --spec-hal-quick)")
    config.stash[_STATE] = {"results": {}, "xfail_entries": [], "stale": [], "started": time.time(), "backend": None}


def _load_manifest(path: str) -> list[dict]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(path, "rb") as handle:
        entries = tomllib.load(handle).get("xfail", [])
    for number, entry in enumerate(entries):
        missing = [key for key in ("case", "reason", "link") if not entry.get(key)]
        if missing:
            raise pytest.UsageError(f"{path}: xfail entry {number} lacks {', '.join(missing)} (each entry needs case, reason and link)")
    return entries


def pytest_collection_modifyitems(session, config, items):
    state = config.stash[_STATE]
    if config.getoption("--spec-hal-quick"):
        full_only = [item for item in items if item.get_closest_marker("spec_hal_full") is not None]
        if full_only:
            config.hook.pytest_deselected(items=full_only)
            items[:] = [item for item in items if item.get_closest_marker("spec_hal_full") is None]
    manifest = config.getoption("--spec-hal-xfail")
    if manifest:
        entries = _load_manifest(manifest)
        for entry in entries:
            entry["matched"] = []
            for item in items:
                if fnmatch.fnmatch(item.nodeid, "*" + entry["case"]):
                    item.add_marker(pytest.mark.xfail(reason=f"{entry['reason']} ({entry['link']})", strict=True))
                    entry["matched"].append(item.nodeid)
        state["xfail_entries"] = entries


@pytest.fixture(scope="session")
def backend(request):
    """The backend under test (``--spec-hal-backend``, default auto-selected)."""
    import spec_hal
    from spec_hal.errors import BackendUnavailable

    name = request.config.getoption("--spec-hal-backend")
    try:
        selected = spec_hal.get_backend(name)
    except BackendUnavailable as exc:
        pytest.exit(f"spec_hal backend could not load: {exc}", returncode=EXIT_BACKEND_UNAVAILABLE)
    request.config.stash[_STATE]["backend"] = selected
    return selected


@pytest.fixture(scope="session")
def device(backend):
    """The torch device the backend under test computes on."""
    return backend.device


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    state = item.config.stash[_STATE]
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        marker = item.get_closest_marker("spec_hal_op")
        params = getattr(getattr(item, "callspec", None), "params", {})
        if report.outcome == "passed" and hasattr(report, "wasxfail"):
            result = "xpassed"
        elif report.outcome == "skipped" and hasattr(report, "wasxfail"):
            result = "xfailed"
        else:
            result = report.outcome
        if result == "failed" and "XPASS(strict)" in str(report.longrepr):
            result = "xpassed"
        state["results"][item.nodeid] = {
            "case": item.nodeid,
            "op": marker.args[0] if marker else None,
            "params": {key: str(value) for key, value in params.items()},
            "outcome": result,
            "duration_s": round(report.duration, 4),
            "message": "" if report.outcome == "passed" else str(report.longrepr)[-2000:],
        }


def _stale_entries(state) -> list[str]:
    stale = []
    for entry in state["xfail_entries"]:
        if not entry["matched"]:
            stale.append(f"xfail entry {entry['case']!r} matches no case")
        for nodeid in entry["matched"]:
            if state["results"].get(nodeid, {}).get("outcome") == "xpassed":
                stale.append(f"xfail entry {entry['case']!r}: {nodeid} now passes")
    return stale


def _report(state, exitstatus: int) -> dict:
    import torch

    import spec_hal
    from spec_hal.conformance import SUITE_VERSION

    backend = state["backend"]
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    results = list(state["results"].values())
    counts = {}
    for result in results:
        counts[result["outcome"]] = counts.get(result["outcome"], 0) + 1
    return {
        "suite_version": SUITE_VERSION,
        "spec_hal_version": spec_hal.__version__,
        "backend": backend.name if backend else None,
        "capabilities": backend.capabilities.as_dict() if backend else None,
        "providers": backend.describe_providers() if backend else {},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "triton": triton_version},
        "exit_status": exitstatus,
        "summary": counts,
        "stale_xfail": state["stale"],
        "duration_s": round(time.time() - state["started"], 2),
        "cases": results,
    }


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    state["stale"] = _stale_entries(state)
    failures = [r for r in state["results"].values() if r["outcome"] == "failed"]
    if state["stale"] and not failures and exitstatus in (0, 1):
        session.exitstatus = EXIT_STALE_XFAIL
    path = config.getoption("--spec-hal-report")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(_report(state, int(session.exitstatus)), indent=1) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = config.stash.get(_STATE, None)
    if not state:
        return
    for line in state["stale"]:
        terminalreporter.write_line(f"STALE {line}", red=True)
    backend = state["backend"]
    if backend is not None:
        terminalreporter.write_line(f"spec_hal backend under test: {backend.name} on {backend.capabilities.device_name}")
