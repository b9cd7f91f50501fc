"""Run the bad-input sweep (spec_hal/conformance/fuzz.py) exhaustively on one backend and write
its table: op x argument x mutation -> outcome. Used to produce docs/reliability.md's table.

    PYTHONPATH=. python scripts/reliability_sweep.py --backend cpu --json reports/sweep-cpu.json
    PYTHONPATH=. TRITON_INTERPRET=1 python scripts/reliability_sweep.py --backend triton-interpret --json reports/sweep-triton-interpret.json
    PYTHONPATH=. python scripts/reliability_sweep.py --markdown reports/sweep-cpu.json reports/sweep-triton-interpret.json

The cases run in a worker process; when it dies (a segfault, an abort), the case it was running
is recorded as a crash and a new worker goes on with the next case. ``--ops`` shards the sweep
by op (the huge-size cases belong to their op); ``--progress N`` prints a line every N cases.

Each row keeps the outcome (``InvalidInput(<argument>)`` or the reference's answer), the error-flag
records the backend left and a digest of the integers it returned or wrote in place, so that
``--markdown`` compares two backends row by row as well as each with the reference. The summary
counts the categories of issue #21 (``fuzz.CATEGORIES``: crashes, out-of-range accesses, silent
cross-request writes, backend disagreements); every count must be 0.

Exit status 1 when any case failed.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

PROCESS_DIED = "crash"  # == fuzz.CRASH; the parent does not import spec_hal


def cases(ops=None) -> list[tuple[str, str, str]]:
    """(op, argument, mutation) of every case, the huge sizes last (mutation "huge: <value>")."""
    from spec_hal.conformance import fuzz

    rows = list(fuzz.matrix(ops))
    for label, _ in fuzz.huge_sizes():
        op = label.split("(")[0]
        if not ops or op in ops:
            rows.append((op, label[len(op) + 1:-1].split(" = ")[0], "huge: " + label.split(" = ")[1][:-1]))
    return rows


def _huge_call(op: str, argument: str, mutation: str):
    from spec_hal.conformance import fuzz

    return dict(fuzz.huge_sizes())[f"{op}({argument} = {mutation[len('huge: '):]})"]


def digest(observed: dict) -> str:
    """The integers a backend returned and wrote in place (exact), the shapes and dtypes of its
    floats (compared with the reference within tolerance by the fuzz), its error-flag records."""
    import torch
    from spec_hal.conformance import fuzz

    hasher = hashlib.sha256(repr(observed.get("flag")).encode())
    for item in fuzz._flatten(observed.get("result")) + fuzz._flatten(observed.get("state", [])):
        if isinstance(item, torch.Tensor):
            hasher.update(f"{tuple(item.shape)} {item.dtype} {item.device.type == 'meta'}".encode())
            if not item.dtype.is_floating_point and item.device.type != "meta":
                hasher.update(item.detach().cpu().contiguous().numpy().tobytes())
        else:
            hasher.update(repr(item).encode())
    return hasher.hexdigest()[:16]


def run_one(backend, op: str, argument: str, mutation: str) -> dict:
    from spec_hal.conformance import fuzz

    observed: dict = {}
    row = {"op": op, "argument": argument, "mutation": mutation}
    try:
        if mutation.startswith("huge: "):
            row["outcome"] = fuzz.outcome(backend, _huge_call(op, argument, mutation), f"{op}({argument} = {mutation})", observed)
        else:
            row["outcome"] = fuzz.run_case(backend, op, argument, mutation, observed)
        row["ok"] = True
    except fuzz.SweepFailure as exc:
        row.update(outcome=f"FAIL: {exc}", ok=False, category=exc.category)
    row["flag"] = [list(record) for record in observed.get("flag", [])]
    row["digest"] = digest(observed)
    return row


def worker(backend_name: str, ops, start: int, rows_path: str, progress: int) -> None:
    """Run cases[start:], appending one JSON line per finished case to ``rows_path``."""
    import spec_hal

    backend = spec_hal.get_backend(backend_name)
    todo = cases(ops)
    started = time.time()
    with open(rows_path, "a") as handle:
        for index in range(start, len(todo)):
            row = run_one(backend, *todo[index])
            handle.write(json.dumps(row) + "\n")
            handle.flush()
            done = index + 1
            if progress and (done % progress == 0 or done == len(todo)):
                print(f"[{backend_name}] {done}/{len(todo)} cases, {time.time() - started:.0f} s in this worker, now {todo[index][0]}",
                      flush=True)


def sweep(backend_name: str, ops=None, progress: int = 50) -> dict:
    """Every case on ``backend_name`` through worker processes; a worker's death is the crash
    of the case it was running."""
    total = len(cases(ops))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        rows_path = os.path.join(scratch, "rows.jsonl")
        while len(rows) < total:
            open(rows_path, "w").close()
            command = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", backend_name, "--start", str(len(rows)),
                       "--rows", rows_path, "--progress", str(progress)] + (["--ops", *ops] if ops else [])
            returncode = subprocess.call(command)
            with open(rows_path) as handle:
                rows.extend(json.loads(line) for line in handle if line.strip())
            if len(rows) < total:  # the worker died in case len(rows)
                op, argument, mutation = cases(ops)[len(rows)]
                print(f"[{backend_name}] worker died (status {returncode}) in {op}({argument} = {mutation})", flush=True)
                rows.append({"op": op, "argument": argument, "mutation": mutation, "outcome": f"FAIL: {op}({argument} = {mutation}): process died (status {returncode})",
                             "ok": False, "category": PROCESS_DIED, "flag": [], "digest": ""})
    return {"backend": backend_name, "rows": rows}


def _key(row: dict) -> tuple:
    return row["op"], row["argument"], row["mutation"]


def disagreements(reports: list[dict]) -> list[str]:
    """Rows (by op, argument, mutation) that passed on both backends but whose outcome,
    error-flag records or integer digest differ, and rows present in one report only (a row
    that failed is counted in its own backend's column already)."""
    found = []
    by_key = [{_key(row): row for row in report["rows"]} for report in reports]
    first, first_name = by_key[0], reports[0]["backend"]
    for rows, report in zip(by_key[1:], reports[1:]):
        for key in sorted(set(first) | set(rows)):
            label = f"{key[0]}({key[1]} = {key[2]})"
            if key not in first or key not in rows:
                found.append(f"{label}: only on {first_name if key in first else report['backend']}")
                continue
            a, b = first[key], rows[key]
            if not (a["ok"] and b["ok"]):
                continue
            for field in ("outcome", "flag", "digest"):
                if a.get(field) != b.get(field):
                    found.append(f"{label}: {field} {a.get(field)!r} on {first_name}, {b.get(field)!r} on {report['backend']}")
                    break
    return found


def summary(reports: list[dict]) -> tuple[list[str], int]:
    """The zero counts of issue #21 per backend and across backends, then every failure."""
    from spec_hal.conformance import fuzz

    lines, bad = [], 0
    header = "| category | " + " | ".join(report["backend"] for report in reports) + (" | across backends |" if len(reports) > 1 else " |")
    lines += [header, "|---|" + "---|" * (len(reports) + (len(reports) > 1))]
    across = disagreements(reports) if len(reports) > 1 else []
    for category in fuzz.CATEGORIES:
        counts = [sum(1 for row in report["rows"] if not row["ok"] and row.get("category") == category) for report in reports]
        extra = [len(across)] if category == fuzz.DISAGREEMENT and len(reports) > 1 else ([0] if len(reports) > 1 else [])
        bad += sum(counts) + sum(extra)
        lines.append(f"| {category} | " + " | ".join(map(str, counts + extra)) + " |")
    lines.append("| cases | " + " | ".join(str(len(report["rows"])) for report in reports) + (" | |" if len(reports) > 1 else " |"))
    lines.append("")
    for report in reports:
        failed = [row for row in report["rows"] if not row["ok"]]
        lines.append(f"- {report['backend']}: {len(report['rows'])} cases, {len(failed)} failures"
                     + (f", {report['seconds']} s" if "seconds" in report else ""))
        lines.extend(f"  - [{row.get('category')}] {row['outcome']}" for row in failed)
    if len(reports) > 1:
        lines.append(f"- across backends (outcome, error-flag records, integer digest of the rows that passed on both): {len(across)} disagreements")
        lines.extend(f"  - {item}" for item in across)
    return lines, bad


def markdown(reports: list[dict]) -> tuple[str, int]:
    """The summary, then per op and argument the outcomes of its mutations on each backend."""
    lines, bad = summary(reports)
    backends = [report["backend"] for report in reports]
    lines += ["", "| op | argument | " + " | ".join(backends) + " |", "|---|---|" + "---|" * len(backends)]
    cells = collections.defaultdict(dict)
    for report in reports:
        grouped = collections.defaultdict(collections.Counter)
        for row in report["rows"]:
            if not row["ok"]:
                kind = "FAIL"
            elif row["outcome"].startswith("InvalidInput"):
                kind = "InvalidInput" + ("" if row["outcome"].endswith(f"({row['argument']})") else " (other argument)")
            else:
                kind = row["outcome"]
            grouped[(row["op"], row["argument"])][kind] += 1
        for key, counter in grouped.items():
            cells[key][report["backend"]] = ", ".join(f"{kind} x{count}" for kind, count in sorted(counter.items()))
    for (op, argument), by_backend in sorted(cells.items()):
        lines.append(f"| {op} | {argument} | " + " | ".join(by_backend.get(b, "-") for b in backends) + " |")
    return "\n".join(lines) + "\n", bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend")
    parser.add_argument("--ops", nargs="*", help="only these ops (a shard); every op when absent")
    parser.add_argument("--json", help="write the sweep's rows here")
    parser.add_argument("--progress", type=int, default=50, help="print a progress line every N cases (0: none)")
    parser.add_argument("--markdown", nargs="*", help="print the summary and table of these JSON reports (shards of one backend are merged)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.backend, args.ops, args.start, args.rows, args.progress)
        return 0
    if args.markdown:
        merged: dict[str, dict] = {}
        for path in args.markdown:
            report = json.load(open(path))
            into = merged.setdefault(report["backend"], {"backend": report["backend"], "rows": [], "seconds": 0.0})
            into["rows"] += report["rows"]
            into["seconds"] = round(into["seconds"] + report.get("seconds", 0.0), 1)
        text, bad = markdown(list(merged.values()))
        print(text, end="")
        return 1 if bad else 0
    started = time.time()
    report = sweep(args.backend, args.ops, args.progress)
    report["seconds"] = round(time.time() - started, 1)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    lines, bad = summary([report])
    print("\n".join(lines))
    print(f"{args.backend}: {len(report['rows'])} cases, {bad} failures, {report['seconds']} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
