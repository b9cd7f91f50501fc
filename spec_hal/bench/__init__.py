"""``spec-hal bench``: the benchmarks of the selected backend, as tables, JSON and markdown.

    spec-hal bench [--backend NAME] [--sizes quick|full] [--only SUITE ...] [--json FILE] [--markdown FILE]

Suites (one module each, ``run(ctx) -> list[Table]``): ``topk``, ``verify``, ``sampling``, ``kv``, ``tree``,
``mamba`` (device time per op: CUDA-graph replay and eager, share of the copy bandwidth measured
in the same run, speed-ups over the torch reference and ``torch.compile`` of it), ``graphs`` and
``draft_step`` (draft loop eager vs replayed), ``host`` (host microseconds per eager call of
every op beside a bare Triton launch and the reference) and ``coldstart`` (first call vs warmed
call, with and without ``spec_hal.warmup``, and a second process reusing Triton's cache) and
``compat`` (the ``spec_hal.compat`` drop-ins against the native op each wraps).

``--sizes quick`` is a smoke test that runs on a CPU in CI in about a minute and asserts nothing
about time; ``--sizes full`` is the grid behind BENCHMARKS.md (GPU). The default is full on a GPU
and quick on a CPU. Progress goes to stderr,
tables to stdout as each suite finishes; ``--json`` and ``--markdown`` write the whole run with
its environment (device, versions, copy bandwidth), for a vendor's CI to attach.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time

SUITES = ("topk", "verify", "sampling", "kv", "tree", "mamba", "graphs", "draft_step", "host", "coldstart", "compat", "masks")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", help="backend to benchmark (default: the auto-selected one)")
    parser.add_argument("--sizes", choices=("quick", "full"), default=None,
                        help="quick: a smoke test (about a minute on a CPU); full: the BENCHMARKS.md grid "
                             "(default: full on a GPU, quick on a CPU)")
    parser.add_argument("--only", nargs="+", choices=SUITES, metavar="SUITE", help=f"run these suites only ({', '.join(SUITES)})")
    parser.add_argument("--no-compile", action="store_true", help="skip every torch.compile baseline")
    parser.add_argument("--compile-slow", action="store_true",
                        help="also compile the references that take tens of seconds per shape or fail (verify, tree, mamba, graphs)")
    parser.add_argument("--json", metavar="FILE", help="write environment + every table as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="write environment + every table as markdown")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run_bench(args: argparse.Namespace, out=sys.stdout) -> int:
    import torch

    from ..errors import BackendUnavailable
    from ..selection import get_backend
    from .harness import copy_bandwidth
    from .report import Context, Progress, environment, environment_markdown, listen_to_rows, write_reports

    try:
        backend = get_backend(args.backend)
    except BackendUnavailable as exc:
        print(f"spec-hal bench: {exc}", file=sys.stderr)
        return 3
    device = backend.device
    if args.sizes is None:
        args.sizes = "quick" if device.type == "cpu" else "full"
    if device.type == "cpu":
        torch.set_num_threads(1)  # small CPU work: OpenMP start-up and spinning cost more than it saves
    progress = Progress(enabled=not args.quiet)
    listen_to_rows(lambda table, row: progress(f"  {table.suite}: {table.row_text(row)}"))
    progress(f"backend {backend.name} on {device}, sizes {args.sizes}")
    bandwidth = copy_bandwidth(device) if device.type == "cuda" else None
    command = "spec-hal bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else f"spec-hal bench --sizes {args.sizes}"
    env = environment(backend, sizes=args.sizes, command=command, copy_bandwidth=bandwidth)
    timing = dict(warmup=1, repeat=2, trials=1) if device.type == "cpu" else {}
    ctx = Context(backend=backend, sizes=args.sizes, compile=not args.no_compile and device.type != "cpu",
                  copy_bandwidth=bandwidth, progress=progress, timing=timing, compile_slow=args.compile_slow)
    print(environment_markdown(env), file=out)
    if device.type == "cpu":
        print("torch.compile baselines are skipped on the CPU (a C++ toolchain compile per shape).\n", file=out)
    tables, suite_seconds = [], {}
    for suite in args.only or SUITES:
        progress(f"suite {suite}")
        begin = time.perf_counter()
        module = importlib.import_module(f"{__name__}.{suite}")
        for table in module.run(ctx):
            tables.append(table)
            print(table.markdown(), file=out, flush=True)
        suite_seconds[suite] = time.perf_counter() - begin
        # Rewritten after every suite: a run cut short by a time limit keeps what it measured.
        write_reports(env, tables, suite_seconds, json_path=args.json, markdown_path=args.markdown)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    progress("done: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in suite_seconds.items()))
    return 0
