"""Every option of every ``spec-hal`` subcommand, fed bad values, fails in one line on stderr
with the documented exit code, before any slow work; ``--help``/``--version`` import no torch.

The table below is checked against the parsers: a new option (or subcommand) without rows fails
``test_every_option_has_bad_values``, so whoever adds one also says what must be rejected.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from spec_hal import cli

HUGE = str(10**30)

# (subcommand, option) -> bad values; each must exit 2 with one line naming the option.
BAD_VALUES = {
    ("demo", "--backend"): [],  # names are checked against the backends: see BACKEND_FAILURES
    ("demo", "--steps"): ["0", "-1", HUGE, "x", "1.5"],
    ("demo", "--topk"): ["0", "-2", "17", HUGE],
    ("demo", "--draft-tokens"): ["0", "-3", HUGE],
    ("demo", "--temperature"): ["-1", "nan", "inf", "1e9", "hot"],
    ("demo", "--page-size"): ["0", "-3", HUGE],
    ("demo", "--max-tokens"): ["0", "-5", HUGE],
    ("demo", "--batch-size"): ["0", "-1", HUGE],
    ("demo", "--seed"): ["-1", str(2**63), "seed"],
    ("demo", "--hybrid"): [],  # flags take no value
    ("demo", "--graphs"): [],
    ("demo", "--summary"): [],
    ("demo", "--grammar"): [],
    ("info", "--backend"): [],
    ("info", "--simulate"): ["mi999", "", "0"],
    ("conformance", "--backend"): [],
    ("conformance", "--quick"): [],
    ("conformance", "--json"): [],  # any path is a valid path
    ("conformance", "--junit"): [],
    ("conformance", "--known-issues"): [],
    ("conformance", "-k"): [],
    ("compile-matrix", "--targets"): ["", ",", "sm_9x", "rdna9", "sm_90,cpu"],
    ("compile-matrix", "--smoke-targets"): ["", "sm_9x", "sm_90,cpu"],
    ("compile-matrix", "--json"): [],
    ("compile-matrix", "--markdown"): [],
    ("compile-matrix", "--jobs"): ["-1", HUGE, "many"],
    ("compile-matrix", "--modules"): ["", "1bad", "a b"],
    ("compile-matrix", "--timeout"): ["0", "-1", "nan", HUGE],
    ("compile-matrix", "--known-issues"): [],
    ("compile-matrix", "--strict"): [],
    ("warmup", "--batch-sizes"): ["", "0", "-1", "x", "1,,0", HUGE],
    ("warmup", "--vocab"): ["0", "-1", HUGE, "v"],
    ("warmup", "--hidden"): ["0", "-1", HUGE],
    ("warmup", "--topk"): ["0", "17", HUGE],
    ("warmup", "--steps"): ["0", "-1", HUGE],
    ("warmup", "--draft-tokens"): ["0", "1", "65", HUGE],
    ("warmup", "--page-size"): ["0", "-3", HUGE],
    ("warmup", "--dtype"): ["int8", "", "bf16"],
    ("warmup", "--device"): [],  # resolved by torch when the command runs
    ("warmup", "--ops"): ["", "1bad"],
    ("bench", "--backend"): [],
    ("bench", "--sizes"): ["", "huge", "0"],
    ("bench", "--only"): ["nosuchsuite", ""],
    ("bench", "--no-compile"): [],
    ("bench", "--compile-slow"): [],
    ("bench", "--json"): [],
    ("bench", "--markdown"): [],
    ("bench", "--quiet"): [],
    ("demo", "--preset"): ["70b", "", "0"],
}

# Failures found after parsing (cross-option bounds, backends): (argv, exit code, text in the line).
LATER_FAILURES = [
    (["demo", "--steps", "1", "--draft-tokens", "12"], 2, "--draft-tokens"),
    (["demo", "--topk", "1", "--steps", "3", "--draft-tokens", "5"], 2, "--draft-tokens"),
    (["demo", "--batch-size", "4096", "--max-tokens", "100000"], 2, "--batch-size"),
    (["demo", "--bogus"], 2, "--bogus"),
    (["demo", "--backend", "nope"], 3, "nope"),
    (["info", "--backend", "nope"], 3, "nope"),
    (["info", "--simulate", "mi300x", "--backend", "cuda"], 3, "cuda"),
    (["conformance", "--backend", "nope"], 3, "nope"),
    (["bench", "--backend", "nope"], 3, "nope"),
    (["demo", "--preset", "8b", "--backend", "cpu"], 2, "--preset"),
    (["compile-matrix", "--strict", "--known-issues", "x.toml"], 2, "--strict"),
    (["compile-matrix", "--known-issues", "no/such/file.toml"], 2, "--known-issues"),
    (["compile-matrix", "extra"], 2, "extra"),
    (["compile-matrix", "--targets", "sm_90", "--smoke-targets", "gfx942"], 2, "--smoke-targets"),
    ([], 2, "COMMAND"),
    (["nosuchcommand"], 2, "nosuchcommand"),
]


def _run(*argv: str, env_extra=None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "SPEC_HAL_BACKEND"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "spec_hal.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=120)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """The primary spelling of every visible option (deprecated aliases are hidden)."""
    names = set()
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings or "-h" in action.option_strings:
            continue
        long = [name for name in action.option_strings if name.startswith("--") and not name.startswith("--no-")]
        names.add(long[0] if long else action.option_strings[0])
    return names


def test_every_option_has_bad_values():
    listed = {}
    for command, option in BAD_VALUES:
        listed.setdefault(command, set()).add(option)
    actual = {name: _options(parser) for name, parser in _subparsers().items()}
    assert actual == listed, "add rows to BAD_VALUES for new options or subcommands"


@pytest.mark.parametrize("command, option, value",
                         [(command, option, value) for (command, option), values in BAD_VALUES.items()
                          for value in values])
def test_bad_value_is_one_line_with_exit_2(command, option, value):
    # In-process: argparse stops at the bad value (SystemExit 2) before any subcommand runs.
    import contextlib
    import io

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as stop:
        cli.parse([command, f"{option}={value}"])
    assert stop.value.code == cli.EXIT_USAGE
    lines = stderr.getvalue().strip().splitlines()
    assert len(lines) == 1, lines
    assert option in lines[0] and f"spec-hal {command}" in lines[0]


@pytest.mark.parametrize("argv, code, text", LATER_FAILURES, ids=[" ".join(row[0]) or "no-command" for row in LATER_FAILURES])
def test_later_failures_are_one_line_with_their_exit_code(argv, code, text):
    result = _run(*argv)
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_help_and_version_import_no_torch():
    for argv in (["--help"], ["--version"], *[[name, "--help"] for name in _subparsers()]):
        code = ("import sys, runpy; sys.argv = ['spec-hal', *%r]\n"
                "try:\n    runpy.run_module('spec_hal.cli', run_name='__main__')\n"
                "except SystemExit as stop:\n    assert stop.code == 0, stop.code\n"
                "assert 'torch' not in sys.modules and 'triton' not in sys.modules, argv\n") % (argv,)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, (argv, result.stderr)


def test_version_names_the_package_version():
    import spec_hal

    result = _run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"spec-hal {spec_hal.__version__}"


def test_pytest_arguments_pass_through_without_dashes():
    args = cli.parse(["conformance", "--backend", "cpu", "-q", "-x", "--maxfail=2", "-k", "topk", "--", "--tb=short"])
    assert args.backend == "cpu" and args.k == "topk"
    assert args.passthrough == ["-q", "-x", "--maxfail=2", "--tb=short"]


def test_old_flag_spellings_still_work_with_a_note(capsys):
    args = cli.parse(["conformance", "--report", "r.json", "--junitxml", "r.xml", "--xfail", "x.toml"])
    assert (args.json, args.junit, args.known_issues) == ("r.json", "r.xml", "x.toml")
    assert capsys.readouterr().err.count("deprecated") == 3


def test_demo_topk_bound_is_the_op_limit():
    from spec_hal import demo, topk

    assert demo.MAX_TOPK == topk.MAX_TOPK == 16
