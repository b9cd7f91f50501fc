"""``spec-hal conformance``: run the suite's cases through pytest with the plugin loaded."""
from __future__ import annotations

import os
from typing import Optional, Sequence

CASES_PACKAGE = "spec_hal.conformance.cases"
PLUGIN = "spec_hal.conformance.plugin"
REWRITE_WARNING = "Module already imported so cannot be rewritten; spec_hal"


def pytest_arguments(
    *,
    backend: Optional[str],
    quick: bool = False,
    report: Optional[str] = None,
    junitxml: Optional[str] = None,
    xfail: Optional[str] = None,
    select: Optional[str] = None,
    extra: Sequence[str] = (),
) -> list[str]:
    arguments = ["--pyargs", CASES_PACKAGE, "-p", PLUGIN, "-p", "no:cacheprovider", "-q", "-rfE",
                 # Installed, the plugin's distribution is marked for assertion rewriting, but the
                 # spec_hal package is imported already (this CLI); the cases are still rewritten.
                 "-W", f"ignore:{REWRITE_WARNING}:pytest.PytestAssertRewriteWarning"]
    if backend:
        arguments += ["--spec-hal-backend", backend]
    if quick:
        arguments.append("--spec-hal-quick")
    if report:
        arguments += ["--spec-hal-report", os.path.abspath(report)]
    if junitxml:
        arguments += ["--junitxml", os.path.abspath(junitxml)]
    if xfail:
        arguments += ["--spec-hal-xfail", os.path.abspath(xfail)]
    if select:
        arguments += ["-k", select]
    return arguments + list(extra)


def run_conformance(**options) -> int:
    """Run the suite in this process; returns the exit code (the table in spec_hal/cli.py)."""
    import pytest

    return int(pytest.main(pytest_arguments(**options)))


def backend_unavailable_reason(name: Optional[str]) -> Optional[str]:
    """Why the backend the suite would test cannot load here (None when it can), found before
    pytest collects anything so that ``--backend nope`` fails in a second, not after collection."""
    from ..errors import BackendUnavailable
    from ..selection import available_backends, choose

    try:
        chosen = choose(name).name
    except BackendUnavailable as exc:
        return str(exc)
    reason = available_backends().get(chosen, f"unknown backend {chosen!r}")
    return None if reason is None else f"backend {chosen!r} could not load: {reason}"
