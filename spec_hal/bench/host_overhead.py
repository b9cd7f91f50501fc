"""Host overhead per op: µs per eager call on tiny inputs, by call path, in one process.

    python -m spec_hal.bench.host_overhead [--device cuda] [--calls 2000] [--output host.md]

Paths, per op example of ``spec_hal.testing.step.op_examples`` (bs = 3, every op and its out=):

* ``public``:    ``spec_hal.<op>(...)``, what an engine calls;
* ``backend``:   ``get_backend().<op>(...)`` (check + provider, bound once);
* ``provider``:  the provider alone (no check);
* ``torch.ops``: ``torch.ops.spec_hal.<op>`` called with the flattened arguments (the dispatcher,
  the custom-op kernel's unflatten/flatten, check and provider): what a compiled graph calls;
* ``wrapper``:   the same through the Python wrapper that rebuilds DraftTree/Verdict (what
  ``spec_hal.<op>`` does under ``torch.compile`` when dynamo falls back to eager);
* ``reference``: the pure-PyTorch reference on the same device (the torch code spec_hal replaces);
* ``bare launch`` (GPU only): one two-argument Triton kernel launch, the floor of any Triton op.

Wall-clock time of ``--calls`` back-to-back calls, synchronised once at the end, the least of
``--trials`` (``--timer cpu``: this process's CPU time instead, steadier on a shared machine): on
tiny inputs this is host time. No assertion on time anywhere.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

import torch

import spec_hal
import spec_hal.ops
from spec_hal import torch_library
from spec_hal.registry import op_spec
from spec_hal.testing.step import op_examples

PATHS = ("public", "backend", "provider", "torch.ops", "wrapper", "reference")


TIMERS = {"wall": time.perf_counter, "cpu": time.process_time}
_timer = time.perf_counter


def per_call_us(fn, device: torch.device, calls: int, trials: int) -> float:
    for _ in range(20):
        fn()
    samples = []
    for _ in range(trials):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        begin = _timer()
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append((_timer() - begin) / calls * 1e6)
    return min(samples)  # the least-disturbed trial: host time on a shared machine is noisy upward


def bare_launch(device: torch.device):
    """A call that launches one trivial two-argument Triton kernel, or None off the GPU."""
    if device.type != "cuda":
        return None
    import triton
    import triton.language as tl

    @triton.jit
    def _store_index(x_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(x_ptr + offsets, offsets, mask=offsets < n)

    buffer = torch.empty(16, dtype=torch.int32, device=device)
    return lambda: _store_index[(1,)](buffer, 4, BLOCK=16)


def paths(op: str, args: tuple, kwargs: dict, device: torch.device) -> dict:
    public = getattr(spec_hal, op)
    bound = spec_hal.ops.bound_for_device(op, device)
    backend = spec_hal.selection.backend_for_device(device)
    provider = backend.providers[op].fn
    overload, flat = torch_library.flat_call(op, *args, **kwargs)
    reference = op_spec(op).reference
    return {
        "public": lambda: public(*args, **kwargs),
        "backend": lambda: bound(*args, **kwargs),
        "provider": lambda: provider(*args, **kwargs),
        "torch.ops": lambda: overload(*flat),
        "wrapper": lambda: torch_library.call_custom_op(op, args, kwargs),
        "reference": lambda: reference(*args, **kwargs),
    }


def measure(device: torch.device, calls: int, trials: int, cases: Optional[list[str]] = None) -> tuple[list[tuple[str, dict]], Optional[float], str]:
    backend = spec_hal.selection.backend_for_device(device)
    launch = bare_launch(device)
    bare = per_call_us(launch, device, calls, trials) if launch else None
    rows = []
    for case, op, args, kwargs in op_examples(device):
        if cases and case not in cases and op not in cases:
            continue
        timings = {name: per_call_us(fn, device, calls, trials) for name, fn in paths(op, args, kwargs, device).items()}
        rows.append((case, timings))
        print(f"{case}: " + ", ".join(f"{name} {us:.1f}" for name, us in timings.items()), file=sys.stderr, flush=True)
    return rows, bare, backend.name


def markdown(rows, bare, backend: str, device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    lines = [f"Host overhead, µs per eager call (bs = 3, tiny inputs), backend `{backend}` on {name}, "
             f"torch {torch.__version__}" + (f"; bare two-argument Triton launch: {bare:.1f} µs" if bare else ""), ""]
    header = ["op (example)", *PATHS] + (["public / bare"] if bare else []) + ["public / reference"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for case, timings in rows:
        cells = [case, *(f"{timings[p]:.1f}" for p in PATHS)]
        if bare:
            cells.append(f"{timings['public'] / bare:.2f}x")
        cells.append(f"{timings['public'] / timings['reference']:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--output", help="also write the markdown table here")
    parser.add_argument("--timer", choices=TIMERS, default="wall",
                        help="wall (default; what BENCHMARKS.md reports) or cpu: this process's CPU time, steadier on a shared machine")
    parser.add_argument("--ops", help="comma-separated ops or example ids (default: all)")
    args = parser.parse_args(argv)
    global _timer
    _timer = TIMERS[args.timer]
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    cases = [case.strip() for case in args.ops.split(",")] if args.ops else None
    rows, bare, backend = measure(device, args.calls, args.trials, cases)
    table = markdown(rows, bare, backend, device)
    print(table)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(table)


if __name__ == "__main__":
    main()
