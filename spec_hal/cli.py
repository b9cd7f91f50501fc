"""The ``spec-hal`` command: ``demo``, ``info``, ``conformance``, ``compile-matrix``, ``bench``."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .errors import BackendUnavailable


def _info(args: argparse.Namespace) -> int:
    from .explain import explain, explain_simulated

    try:
        if args.simulate:
            print(explain_simulated(args.simulate))
        else:
            print(explain(args.backend))
    except BackendUnavailable as exc:
        print(f"spec-hal info: {exc}", file=sys.stderr)
        return 3
    return 0


def _conformance(args: argparse.Namespace) -> int:
    from .conformance.runner import run_conformance

    return run_conformance(
        backend=args.backend,
        quick=args.quick,
        report=args.report,
        junitxml=args.junitxml,
        xfail=args.xfail,
        select=args.k,
        extra=args.pytest_args,
    )


def _compile_matrix(args: argparse.Namespace) -> int:
    from .compile_matrix import main

    targets = [target.strip() for target in args.targets.split(",") if target.strip()]
    modules = [module.strip() for module in args.modules.split(",")] if args.modules else None
    return main(targets, json_path=args.json, markdown_path=args.markdown, jobs=args.jobs, modules=modules,
                timeout_s=args.timeout, known_issues_path=args.known_issues)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def _bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    from .demo import add_arguments as add_demo_arguments

    parser = argparse.ArgumentParser(prog="spec-hal", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="speculative decoding end to end with a small model pair, on this machine's backend")
    add_demo_arguments(demo)
    demo.set_defaults(run=_demo)

    info = commands.add_parser("info", help="what backend this machine gets, and why")
    info.add_argument("--backend", help="explain this backend instead of the auto-selected one")
    info.add_argument("--simulate", metavar="MACHINE", help="probe a simulated machine (h100, mi250x, mi300x, mi355x, cpu, cpu-no-triton)")
    info.set_defaults(run=_info)

    conformance = commands.add_parser("conformance", help="run the conformance suite against a backend")
    conformance.add_argument("--backend", help="backend to test (default: the auto-selected one)")
    conformance.add_argument("--quick", action="store_true", help="a smaller grid of sizes (minutes, not tens)")
    conformance.add_argument("--report", metavar="FILE", help="write the JSON report here")
    conformance.add_argument("--junitxml", metavar="FILE", help="write a JUnit XML report here")
    conformance.add_argument("--xfail", metavar="FILE", help="TOML manifest of expected failures")
    conformance.add_argument("-k", metavar="EXPR", help="only cases matching this pytest -k expression")
    conformance.add_argument("pytest_args", nargs="*", help="extra arguments passed to pytest (after --)")
    conformance.set_defaults(run=_conformance)

    from .compile_matrix import DEFAULT_TARGETS

    matrix = commands.add_parser("compile-matrix", help="compile every Triton kernel for GPU targets, without a GPU")
    matrix.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help="comma-separated sm_XY / gfxNNN names")
    matrix.add_argument("--json", metavar="FILE", help="write the per-kernel report as JSON")
    matrix.add_argument("--markdown", metavar="FILE", help="write the per-kernel x target table as markdown")
    matrix.add_argument("--jobs", type=int, default=0, help="compile processes (default: one per core)")
    matrix.add_argument("--modules", help="comma-separated kernel modules (default: spec_hal.kernels.KERNEL_MODULES)")
    matrix.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="fail (and stop) a single compile that takes longer than S seconds")
    matrix.add_argument("--known-issues", metavar="FILE",
                        help="TOML manifest of expected failures (ci/xfail/compile-matrix.toml); stale entries exit 6")
    matrix.set_defaults(run=_compile_matrix)

    from .bench import add_arguments as add_bench_arguments

    bench = commands.add_parser("bench", help="benchmark the selected backend; tables, JSON and markdown for a vendor's CI")
    add_bench_arguments(bench)
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
