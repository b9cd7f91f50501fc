"""``spec-hal conformance``: run the suite's cases through pytest with the plugin loaded."""
from __future__ import annotations

import os
from typing import Optional, Sequence

CASES_PACKAGE = "spec_hal.conformance.cases"
PLUGIN = "spec_hal.conformance.plugin"


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
    arguments = ["--pyargs", CASES_PACKAGE, "-p", PLUGIN, "-p", "no:cacheprovider", "-q", "-rfE"]
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
    """Run the suite in this process; returns the exit code of DESIGN.md §5."""
    import pytest

    return int(pytest.main(pytest_arguments(**options)))
