"""Cold start: the first call of every op against a warmed call, with and without
``spec_hal.warmup``, and in a second process that reuses Triton's on-disk kernel cache.

Each measurement runs in a fresh Python process (``python -m spec_hal.bench.coldstart --child``)
so that nothing compiled by the benchmark itself is reused:

A. empty Triton cache (``TRITON_CACHE_DIR`` a new folder), no warm-up: every op's first call
   (compile + load + run) and its second call (warmed);
B. another empty cache, ``spec_hal.warmup()`` first (timed), then every op's first call;
C. the cache that A filled, no warm-up: every op's first call in a second process.

Before the first op, the child builds the backend (probe; timed separately), so an op's first
call measures that op's compile and first launch only. Calls use the small inputs of
``examples.py``; the device is synchronised around every call.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from .report import Column, Context, Table

COLUMNS = [Column("op", "op"), Column("first_ms", "first call, empty cache (ms)", "ms"), Column("warmed_ms", "warmed call (ms)", "ms"),
           Column("after_warmup_ms", "first call after warmup() (ms)", "ms"),
           Column("second_process_ms", "first call, 2nd process, disk cache (ms)", "ms")]
WARMUP_MISSING = "spec_hal.warmup is not in this build: the 'after warmup()' column is empty."


def _timed(fn) -> float:
    import torch

    device_sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    device_sync()
    begin = time.perf_counter()
    fn()
    device_sync()
    return time.perf_counter() - begin


def _run_warmup(spec_hal, backend) -> tuple[float | None, str]:
    """Call ``spec_hal.warmup`` if this build has it: (seconds, note)."""
    warmup = getattr(spec_hal, "warmup", None)
    if warmup is None:
        return None, WARMUP_MISSING
    try:
        begin = time.perf_counter()
        report = warmup()
        return time.perf_counter() - begin, f"spec_hal.warmup() returned {str(report)[:160]!r}"
    except Exception as exc:  # a signature this suite does not know yet: say so, do not guess
        return None, f"spec_hal.warmup() failed: {type(exc).__name__}: {str(exc)[:160]}"


def child(backend_name: str, *, warmup: bool) -> dict:
    """One fresh process's measurements (printed as one JSON line by ``main``)."""
    import torch

    import spec_hal
    from ..registry import all_ops
    from .examples import op_calls

    begin = time.perf_counter()
    backend = spec_hal.get_backend(backend_name)
    calls = op_calls(backend.device)
    if backend.device.type == "cuda":
        torch.cuda.synchronize(backend.device)
    setup = time.perf_counter() - begin
    result = {"backend_s": setup, "warmup_s": None, "warmup_note": None, "ops": {}}
    if warmup:
        result["warmup_s"], result["warmup_note"] = _run_warmup(spec_hal, backend)
    for name in all_ops():
        if name not in calls:
            continue  # the host table shows it as "no example"
        args, kwargs = calls[name]
        op = getattr(spec_hal, name)
        first = _timed(lambda: op(*args, **kwargs))
        second = _timed(lambda: op(*args, **kwargs))
        result["ops"][name] = [first, second]
    return result


def _spawn(backend_name: str, cache_dir: str, *, warmup: bool) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir, SPEC_HAL_BACKEND=backend_name)  # public ops go to it
    command = [sys.executable, "-m", "spec_hal.bench.coldstart", "--child", "--backend", backend_name] + (["--warmup"] if warmup else [])
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if completed.returncode != 0:
        raise RuntimeError(f"cold-start child failed ({completed.returncode}): {completed.stderr[-800:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def run(ctx: Context) -> list[Table]:
    name = ctx.backend.name
    with tempfile.TemporaryDirectory(prefix="spec-hal-coldstart-") as root:
        first_cache, warmup_cache = os.path.join(root, "a"), os.path.join(root, "b")
        ctx.progress("coldstart A: fresh process, empty Triton cache")
        cold = _spawn(name, first_cache, warmup=False)
        ctx.progress("coldstart B: fresh process, empty Triton cache, spec_hal.warmup() first")
        warmed = _spawn(name, warmup_cache, warmup=True)
        ctx.progress("coldstart C: second process reusing A's Triton cache")
        second = _spawn(name, first_cache, warmup=False)
    warmup_note = warmed["warmup_note"] or WARMUP_MISSING
    warmup_ran = warmed["warmup_s"] is not None
    table = Table("coldstart", f"cold start per op on backend {name} (fresh processes, small inputs)", COLUMNS, notes=[
        "Each column is a fresh Python process; device synchronised around every call. A: empty Triton cache; "
        "B: empty cache, spec_hal.warmup() first; C: A's cache reused (on-disk Triton cache).",
        f"get_backend (probe) + building the inputs: {1e3 * cold['backend_s']:.0f} ms (process A).",
        (f"spec_hal.warmup(): {1e3 * warmed['warmup_s']:.0f} ms. " if warmup_ran else "") + warmup_note])
    for op, (first, warm) in sorted(cold["ops"].items()):
        table.add(op=op, first_ms=1e3 * first, warmed_ms=1e3 * warm,
                  after_warmup_ms=1e3 * warmed["ops"][op][0] if warmup_ran else None, second_process_ms=1e3 * second["ops"][op][0])
    return [table]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="cold-start child process (used by `spec-hal bench`)")
    parser.add_argument("--child", action="store_true", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--warmup", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(child(args.backend, warmup=args.warmup)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
