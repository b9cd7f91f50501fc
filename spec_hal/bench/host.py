"""Host overhead: microseconds per eager call of every op on tiny inputs (examples.py), beside a
bare one-kernel Triton launch and the torch reference, measured in the same process.

On tiny inputs the device work is a few microseconds, so an eager call costs what the host spends
on it: dispatch, argument checks, output allocation, the launch itself. Engines pay this wherever
a step is not captured in a graph (prefill, the first step, dynamic shapes, machines where
capture fails). Columns: the public module function ``spec_hal.<op>`` (what engines call), the
same op through the backend object, the torch reference called directly (no checks), a bare
two-argument Triton launch of an empty kernel (the floor of any Triton op), and the ratios
(issue 15's goals: a single-launch op at most 1.5x the bare launch, no op slower than its
reference).
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional

import torch

from . import harness
from .examples import op_calls
from .report import Column, Context, Table, ratio, us

COLUMNS = [Column("op", "op"), Column("kernels", "kernels per call", "int"), Column("public_us", "spec_hal.op us", "us"),
           Column("backend_us", "backend.op us", "us"), Column("reference_us", "torch reference us", "us"),
           Column("bare_launch_us", "bare Triton launch us", "us"), Column("public_over_bare", "public / bare launch", "ratio"),
           Column("public_over_reference", "public / reference", "ratio")]


def bare_triton_launch(device: torch.device) -> tuple[Optional[Callable[[], object]], str]:
    """A launch of an empty two-argument Triton kernel on ``device`` and a note, or (None, why)."""
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def _store_one(x_ptr, value):
            tl.store(x_ptr, value)

        target = torch.zeros(1, dtype=torch.int32, device=device)
        launch = lambda: _store_one[(1,)](target, 1)  # noqa: E731
        launch()
        harness.synchronize(device)
        return launch, "bare launch: `kernel[(1,)](tensor, 1)` of a one-store @triton.jit kernel"
    except Exception as exc:  # no Triton, or no driver for this device (CPU without the interpreter)
        return None, f"bare Triton launch not measurable here ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})"


# A measurement spends about this much wall time at most: the torch references of the sampling
# ops cost tens of milliseconds a call, and 200 calls x 5 trials of them took most of a bench run.
_SECONDS_PER_MEASUREMENT = 0.5


def _time(fn, device, timing) -> Optional[float]:
    try:
        fn()  # the first call may compile: calibrate on the second
        harness.synchronize(device)
        begin = time.perf_counter()
        fn()
        harness.synchronize(device)
        one_s = time.perf_counter() - begin
        affordable = int(_SECONDS_PER_MEASUREMENT / (timing["trials"] * max(one_s, 1e-9)))
        calls = max(min(20, timing["calls"]), min(timing["calls"], affordable))
        return harness.host_time_s(fn, device, calls=calls, trials=timing["trials"])
    except Exception as exc:
        print(f"  (host timing failed: {type(exc).__name__}: {str(exc)[:120]})", file=sys.stderr)
        return None


def run(ctx: Context) -> list[Table]:
    import spec_hal
    from ..registry import all_ops

    device, backend = ctx.device, ctx.backend
    timing = dict(calls=20, trials=3) if ctx.quick or device.type == "cpu" else dict(calls=200, trials=5)
    from ..kernels.fast_launch import status as fast_launch_status

    launch, launch_note = bare_triton_launch(device)
    bare_s = _time(launch, device, timing) if launch is not None else None
    table = Table("host", f"host overhead per eager call on backend {backend.name} (tiny inputs, bs = 1)", COLUMNS, notes=[
        f"Wall time per call over {timing['calls']} back-to-back eager calls (fewer, at least 20, where one call is slow; "
        f"median of {timing['trials']}), device "
        "synchronised around each batch of calls; inputs from spec_hal/bench/examples.py (S = 3, K = 4, N = 8).", launch_note,
        "Goals (issue 15): single-launch ops at most 1.5x the bare launch; no op slower than its torch reference.",
        f"spec_hal's fast Triton launcher (SPEC_HAL_FAST_LAUNCH): {fast_launch_status()}; the bare launch goes through "
        "Triton's own path."])
    calls = op_calls(device)
    for name, spec in sorted(all_ops().items()):
        if name not in calls:
            table.add(op=f"{name} (no example)")
            continue
        ctx.progress(f"host {name}")
        args, kwargs = calls[name]
        public = getattr(spec_hal, name)
        public_call = lambda: public(*args, **kwargs)  # noqa: E731
        public_s = _time(public_call, device, timing)
        backend_s = _time(lambda: getattr(backend, name)(*args, **kwargs), device, timing)
        reference_s = _time(lambda: spec.reference(*args, **kwargs), device, timing)
        table.add(op=name, kernels=harness.count_kernels(public_call, device), public_us=us(public_s), backend_us=us(backend_s),
                  reference_us=us(reference_s), bare_launch_us=us(bare_s), public_over_bare=ratio(public_s, bare_s),
                  public_over_reference=ratio(public_s, reference_s))
    return [table]
