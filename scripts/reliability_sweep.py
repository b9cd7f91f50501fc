"""Run the bad-input sweep (spec_hal/conformance/fuzz.py) exhaustively on one backend and write
its table: op x argument x mutation -> outcome. Used to produce docs/reliability.md's table.

    PYTHONPATH=. python scripts/reliability_sweep.py --backend cpu --json reports/sweep-cpu.json
    TRITON_INTERPRET=1 PYTHONPATH=. python scripts/reliability_sweep.py --backend triton-interpret --json reports/sweep-ti.json
    PYTHONPATH=. python scripts/reliability_sweep.py --markdown reports/sweep-cpu.json reports/sweep-ti.json

Exit status 1 when any case failed (a crash kills the process: also a failure).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time


def sweep(backend_name: str, ops=None) -> dict:
    import spec_hal
    from spec_hal.conformance import fuzz

    backend = spec_hal.get_backend(backend_name)
    rows = []
    for op, argument, mutation in fuzz.matrix(ops):
        try:
            result, ok = fuzz.run_case(backend, op, argument, mutation), True
        except fuzz.SweepFailure as exc:
            result, ok = f"FAIL: {exc}", False
        rows.append({"op": op, "argument": argument, "mutation": mutation, "outcome": result, "ok": ok})
    for label, call in fuzz.huge_sizes():
        try:
            result, ok = fuzz.outcome(backend, call, label), True
        except fuzz.SweepFailure as exc:
            result, ok = f"FAIL: {exc}", False
        op = label.split("(")[0]
        rows.append({"op": op, "argument": label[len(op) + 1:-1].split(" = ")[0], "mutation": "huge: " + label.split(" = ")[1][:-1],
                     "outcome": result, "ok": ok})
    return {"backend": backend_name, "rows": rows}


def markdown(reports: list[dict]) -> str:
    """Per op and argument: the outcomes of its mutations on each backend, then the failures."""
    lines = []
    backends = [report["backend"] for report in reports]
    lines.append("| op | argument | " + " | ".join(backends) + " |")
    lines.append("|---|---|" + "---|" * len(backends))
    cells = collections.defaultdict(dict)
    for report in reports:
        grouped = collections.defaultdict(collections.Counter)
        for row in report["rows"]:
            kind = row["outcome"] if not row["ok"] else ("InvalidInput" + ("" if row["outcome"].endswith(f"({row['argument']})") else
                                                                          " (other argument)") if row["outcome"].startswith("InvalidInput")
                                                        else row["outcome"])
            grouped[(row["op"], row["argument"])]["FAIL" if not row["ok"] else kind] += 1
        for key, counter in grouped.items():
            cells[key][report["backend"]] = ", ".join(f"{kind} x{count}" for kind, count in sorted(counter.items()))
    for (op, argument), by_backend in sorted(cells.items()):
        lines.append(f"| {op} | {argument} | " + " | ".join(by_backend.get(b, "-") for b in backends) + " |")
    totals = []
    for report in reports:
        failed = [row for row in report["rows"] if not row["ok"]]
        totals.append(f"- {report['backend']}: {len(report['rows'])} cases, {len(failed)} failures")
        totals.extend(f"  - {row['op']}({row['argument']} = {row['mutation']}): {row['outcome']}" for row in failed)
    return "\n".join(totals + [""] + lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend")
    parser.add_argument("--ops", nargs="*")
    parser.add_argument("--json", help="write the sweep's rows here")
    parser.add_argument("--markdown", nargs="*", help="print the table of these JSON reports")
    args = parser.parse_args()
    if args.markdown:
        print(markdown([json.load(open(path)) for path in args.markdown]), end="")
        return 0
    started = time.time()
    report = sweep(args.backend, args.ops)
    report["seconds"] = round(time.time() - started, 1)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    failed = [row for row in report["rows"] if not row["ok"]]
    for row in failed:
        print(f"{row['op']}({row['argument']} = {row['mutation']}): {row['outcome']}")
    print(f"{args.backend}: {len(report['rows'])} cases, {len(failed)} failures, {report['seconds']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
