"""The ``spec-hal`` command line: ``demo``, ``warmup``, ``info``, ``conformance``, ``compile-matrix``, ``bench``.

Subcommands are rows of :data:`COMMANDS`: a name, one line of help, the function that adds the
subcommand's options and the function that runs it, both named as ``"module:function"`` and
imported only when that subcommand is used. To add a subcommand, write those two functions in
your module and add one row (``tests/test_cli_options.py`` then feeds every option bad values):

* ``add_arguments(parser)`` must import nothing heavy (no torch, no Triton): ``spec-hal --help``
  builds every subcommand's parser and must stay fast. Use the option helpers below
  (:func:`add_backend_option`, :func:`add_report_options`, :func:`bounded_int`,
  :func:`bounded_float`) so that every subcommand spells the same thing the same way and rejects
  a bad value in one line naming the option and the bound.
* ``run(args) -> int`` returns the exit code. It checks what needs torch (the backend can load,
  a needed package is installed) before any slow work, printing one line through :func:`fail`.

One flag vocabulary: ``--backend NAME``, ``--json FILE``, ``--junit FILE``, ``--markdown FILE``,
``--known-issues FILE``. Older spellings (``--report``, ``--junitxml``, ``--xfail``) still work and
print a one-line deprecation note.

Exit codes (every subcommand):

==== =====================================================================================
0    success
1    failures (a conformance case, a kernel over its limits, the demo's self-check)
2    the command line is wrong: an unknown option, or a value outside its documented bound
3    the backend is unknown or could not load here
4    a package the command needs is not installed (the message names the pip extra)
5    nothing was selected (``conformance -k`` matched no case)
6    an expected-failure entry is stale (it matches nothing, or the case now passes)
==== =====================================================================================
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import re
import sys
from dataclasses import dataclass
from typing import Callable, NoReturn, Optional, Sequence

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_BACKEND_UNAVAILABLE = 3
EXIT_MISSING_PACKAGE = 4
EXIT_NOTHING_SELECTED = 5
EXIT_STALE = 6


class CommandFailed(Exception):
    """Raised by a subcommand's checks: one line for stderr and the exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Stop the running subcommand: ``main`` prints ``spec-hal <command>: message`` and exits ``code``."""
    raise CommandFailed(message, code)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage stays available through ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


# -- option helpers shared by the subcommands -----------------------------------------------------

def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: an int in [low, high]; the error names the bound and the value."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int in [{low}, {high}], got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an int in [{low}, {high}], got {value}")
        return value

    parse.__name__ = "int"
    return parse


def bounded_float(low: float, high: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite float in [low, high]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in [{low:g}, {high:g}], got {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a number in [{low:g}, {high:g}], got {text}")
        return value

    parse.__name__ = "float"
    return parse


def comma_list(pattern: str, what: str) -> Callable[[str], list]:
    """An argparse ``type``: a non-empty comma-separated list whose items match ``pattern``."""
    compiled = re.compile(pattern)

    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, got {text!r}")
        bad = [item for item in items if not compiled.fullmatch(item)]
        if bad:
            raise argparse.ArgumentTypeError(f"expected {what}, got {', '.join(map(repr, bad))}")
        return items

    parse.__name__ = "list"
    return parse


class _DeprecatedAlias(argparse.Action):
    """An old spelling of an option: stores into the new one's dest and says so on stderr."""

    def __init__(self, option_strings, dest, new_option: str, **kwargs):
        self.new_option = new_option
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: {option_string} is deprecated, use {self.new_option}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, dest: str) -> None:
    parser.add_argument(old, action=_DeprecatedAlias, new_option=new, dest=dest, metavar="FILE")


def add_backend_option(parser: argparse.ArgumentParser, what: str = "run on") -> None:
    parser.add_argument("--backend", metavar="NAME",
                        help=f"backend to {what} (default: SPEC_HAL_BACKEND, then the auto-selected one)")


def add_report_options(parser: argparse.ArgumentParser, *, json: str = "", junit: str = "", markdown: str = "") -> None:
    """``--json`` / ``--junit`` / ``--markdown FILE``, each added when its help text is given."""
    for flag, text in (("--json", json), ("--junit", junit), ("--markdown", markdown)):
        if text:
            parser.add_argument(flag, metavar="FILE", help=text)


def check_backend_name(name: Optional[str]) -> None:
    """Fail (exit 3, as DESIGN's "backend could not load") on a backend name that is neither built in nor registered by a plugin.

    Reads entry-point metadata only (no torch): an unknown ``--backend`` fails at once.
    """
    if name is None:
        return
    from importlib import metadata

    from .backends import BUILTIN_MODULES

    plugins = {entry.name for entry in metadata.entry_points(group="spec_hal.backends")}
    if name not in BUILTIN_MODULES and name not in plugins:
        known = ", ".join(list(BUILTIN_MODULES) + sorted(plugins - set(BUILTIN_MODULES)))
        fail(f"argument --backend: unknown backend {name!r}; valid backends: {known}", EXIT_BACKEND_UNAVAILABLE)


def require_backend(name: Optional[str]):
    """The backend to run on (``get_backend(name)``), or fail with exit 3 and the probe's reason."""
    from .errors import BackendUnavailable
    from .selection import get_backend

    check_backend_name(name)
    try:
        return get_backend(name)
    except BackendUnavailable as exc:
        fail(str(exc).replace("\n", "; "), EXIT_BACKEND_UNAVAILABLE)


def require_module(module: str, extra: str, why: str) -> None:
    """Fail with exit 4 and the pip command when ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        fail(f"{why} needs {module}, which is not installed: pip install 'spec-hal[{extra}]'", EXIT_MISSING_PACKAGE)


# -- the built-in subcommands' options (their run functions live in their modules) ----------------

SIMULATED_MACHINES = ("h100", "mi250x", "mi300x", "mi355x", "cpu", "cpu-no-triton")
GPU_TARGET = r"sm_[0-9]{2,3}a?|gfx[0-9a-f]{3,4}"


def add_info_arguments(parser: argparse.ArgumentParser) -> None:
    add_backend_option(parser, "explain")
    parser.add_argument("--simulate", metavar="MACHINE", choices=SIMULATED_MACHINES,
                        help=f"explain a simulated machine instead of this one ({', '.join(SIMULATED_MACHINES)})")


def run_info(args: argparse.Namespace) -> int:
    if args.simulate:
        from .explain import explain_simulated

        if args.backend is not None:
            check_backend_name(args.backend)
        try:
            print(explain_simulated(args.simulate, backend=args.backend))
        except ValueError as exc:
            fail(str(exc), EXIT_BACKEND_UNAVAILABLE)
        return EXIT_OK
    from .errors import BackendUnavailable
    from .explain import explain

    check_backend_name(args.backend)
    try:
        print(explain(args.backend))
    except BackendUnavailable as exc:
        fail(str(exc).splitlines()[-1], EXIT_BACKEND_UNAVAILABLE)
    return EXIT_OK


def add_conformance_arguments(parser: argparse.ArgumentParser) -> None:
    add_backend_option(parser, "test")
    parser.add_argument("--quick", action="store_true", help="a smaller grid of sizes (minutes, not tens)")
    add_report_options(parser, json="write the JSON conformance report here", junit="write a JUnit XML report here")
    parser.add_argument("--known-issues", metavar="FILE", help="TOML manifest of expected failures (ci/xfail/<backend>.toml)")
    add_deprecated_alias(parser, "--report", "--json", "json")
    add_deprecated_alias(parser, "--junitxml", "--junit", "junit")
    add_deprecated_alias(parser, "--xfail", "--known-issues", "known_issues")
    parser.add_argument("-k", metavar="EXPR", help="only cases matching this pytest -k expression")
    parser.epilog = ("Any other argument goes to pytest unchanged (spec-hal conformance -q -x); "
                     "arguments after -- always do.")


def run_conformance(args: argparse.Namespace) -> int:
    require_module("pytest", "test", "spec-hal conformance")  # a core dependency; a broken install says so
    if args.backend is None:
        import os

        args.backend = os.environ.get("SPEC_HAL_BACKEND", "").strip() or None
    check_backend_name(args.backend)
    from .conformance.runner import backend_unavailable_reason, run_conformance as run

    reason = backend_unavailable_reason(args.backend)
    if reason is not None:
        fail(reason, EXIT_BACKEND_UNAVAILABLE)
    code = run(backend=args.backend, quick=args.quick, report=args.json, junitxml=args.junit, xfail=args.known_issues,
               select=args.k, extra=args.passthrough)
    return EXIT_USAGE if code == 4 else code  # pytest's own usage error (4) is ours (2)


def add_compile_matrix_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--targets", type=comma_list(GPU_TARGET, "GPU targets like sm_90 or gfx942"),
                        default="sm_80,sm_90,sm_100,gfx90a,gfx942,gfx950", help="comma-separated sm_XY / gfxNNN names")
    parser.add_argument("--smoke-targets", type=comma_list(GPU_TARGET, "GPU targets like sm_90 or gfx942"), default=[],
                        help="those of --targets compiled at one launch configuration per kernel (the first its module "
                             "lists): a build check where every configuration would not fit a CI budget")
    add_report_options(parser, json="write the per-kernel report (every failure in full) as JSON",
                       markdown="write the kernel x target table as markdown")
    parser.add_argument("--jobs", type=bounded_int(0, 256), default=0, help="compile processes (default 0: one per core)")
    parser.add_argument("--modules", type=comma_list(r"[A-Za-z_][\w.]*", "Python module names"),
                        help="comma-separated kernel modules (default: spec_hal.kernels.KERNEL_MODULES)")
    parser.add_argument("--timeout", type=bounded_float(1, 86400), default=120.0, metavar="S",
                        help="fail (and stop) a single compile that takes longer than S seconds (default 120)")
    parser.add_argument("--known-issues", metavar="FILE",
                        help="TOML manifest of expected failures (default: the one shipped with spec_hal, "
                             "ci/xfail/compile-matrix.toml); stale entries exit 6")
    parser.add_argument("--strict", action="store_true", help="ignore the known-issues manifest: every finding fails")


def run_compile_matrix(args: argparse.Namespace) -> int:
    require_module("triton", "triton", "spec-hal compile-matrix")
    if args.strict and args.known_issues:
        fail("argument --strict: cannot be combined with --known-issues (strict ignores every manifest)")
    if args.known_issues:
        import os

        if not os.path.isfile(args.known_issues):
            fail(f"argument --known-issues: no such file {args.known_issues!r}")
    from .compile_matrix import default_known_issues, main

    outside = [target for target in args.smoke_targets if target not in args.targets]
    if outside:
        fail(f"argument --smoke-targets: {', '.join(outside)} not among --targets ({','.join(args.targets)})")
    known_issues = None if args.strict else (args.known_issues or default_known_issues())
    return main(args.targets, json_path=args.json, markdown_path=args.markdown, jobs=args.jobs, modules=args.modules,
                timeout_s=args.timeout, known_issues_path=known_issues, smoke_targets=args.smoke_targets)


def add_warmup_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``spec-hal warmup`` (defaults: ``spec_hal.warmstart.Shapes``; kept here so --help imports no torch)."""
    parser.add_argument("--batch-sizes", type=comma_list(r"[1-9][0-9]{0,4}", "batch sizes in [1, 99999]"), default="1,8,64",
                        help="comma-separated batch sizes to compile for (default 1,8,64)")
    parser.add_argument("--vocab", type=bounded_int(1, 2**23), default=32000, help="vocabulary size (default 32000)")
    parser.add_argument("--hidden", type=bounded_int(1, 65536), default=256, help="hidden size (default 256)")
    parser.add_argument("--topk", "-K", type=bounded_int(1, 16), default=4, help="draft top-k (default 4)")
    parser.add_argument("--steps", "-S", type=bounded_int(1, 64), default=3, help="draft steps (default 3)")
    parser.add_argument("--draft-tokens", "-N", type=bounded_int(2, 64), default=8, help="tree nodes incl. the root (default 8)")
    parser.add_argument("--page-size", type=bounded_int(1, 4096), default=16, help="KV page size (default 16)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                        help="logits, hidden and KV dtype (default bfloat16)")
    parser.add_argument("--device", help="default: the current GPU, else cpu")
    parser.add_argument("--ops", type=comma_list(r"[A-Za-z_][\w +]*", "op report names"), help="comma-separated report names (default: all)")


@dataclass(frozen=True)
class Command:
    """One subcommand: ``arguments`` and ``run`` are ``"module:function"`` names, imported lazily.

    ``passthrough``: unknown arguments are handed to ``run`` as ``args.passthrough`` (pytest's)
    instead of failing.
    """

    name: str
    help: str
    arguments: str
    run: str
    passthrough: bool = False


COMMANDS = (
    Command("demo", "speculative decoding end to end with a small model pair, on this machine's backend",
            "spec_hal.demo:add_arguments", "spec_hal.demo:run_demo"),
    Command("warmup", "compile the kernels for the given serving sizes ahead of time, and report them",
            "spec_hal.cli:add_warmup_arguments", "spec_hal.warmstart:run_warmup"),
    Command("info", "what backend this machine gets, and why", "spec_hal.cli:add_info_arguments",
            "spec_hal.cli:run_info"),
    Command("conformance", "run the conformance suite against a backend", "spec_hal.cli:add_conformance_arguments",
            "spec_hal.cli:run_conformance", passthrough=True),
    Command("compile-matrix", "compile every Triton kernel for GPU targets, without a GPU",
            "spec_hal.cli:add_compile_matrix_arguments", "spec_hal.cli:run_compile_matrix"),
    Command("bench", "benchmark the selected backend; tables, JSON and markdown for a vendor's CI",
            "spec_hal.bench:add_arguments", "spec_hal.bench:run_bench"),
)


def _resolve(target: str) -> Callable:
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)


def build_parser() -> Parser:
    from . import __version__

    parser = Parser(prog="spec-hal", description="Portable speculative-decoding primitives: demo, backend report, "
                    "conformance suite and offline compile matrix.", epilog="Exit codes: 0 ok, 1 failures, 2 bad "
                    "command line, 3 backend unavailable, 4 missing package, 5 nothing selected, 6 stale expected failure.")
    parser.add_argument("--version", action="version", version=f"spec-hal {__version__}")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = subcommands.add_parser(command.name, help=command.help, description=command.help,
                                     allow_abbrev=not command.passthrough)
        _resolve(command.arguments)(sub)
        sub.set_defaults(command_row=command)
    return parser


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse a command line (exits 2 with one line on a bad one)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    after_dashes: list = []
    if "--" in argv:
        split = argv.index("--")
        argv, after_dashes = argv[:split], argv[split + 1:]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    row: Command = args.command_row
    if (unknown or after_dashes) and not row.passthrough:
        parser.exit(EXIT_USAGE, f"spec-hal {row.name}: unrecognized arguments: {' '.join(unknown + after_dashes)} "
                                f"(see spec-hal {row.name} --help)\n")
    args.passthrough = unknown + after_dashes
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(argv)
    row: Command = args.command_row
    try:
        return _resolve(row.run)(args)
    except CommandFailed as exc:
        print(f"spec-hal {row.name}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f"spec-hal {row.name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `spec-hal info | head`: the reader left; nothing more to say
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    # ``python -m spec_hal.cli``: run the imported module's main, so that the subcommands (which
    # import ``spec_hal.cli``) and this entry share one CommandFailed class.
    from spec_hal.cli import main as cli_main

    sys.exit(cli_main())
