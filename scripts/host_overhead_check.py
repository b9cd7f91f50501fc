"""GPU check of the fast Triton launcher (spec_hal/kernels/fast_launch.py, issue 15).

    python scripts/host_overhead_check.py [--out DIR] [--calls 300] [--device cuda]

1. Outputs: every op's example calls (bs = 1 from spec_hal/bench/examples.py, the same with every
   contiguous tensor input moved to a 16-byte-misaligned address, and bs = 3 with every out= form
   from spec_hal/testing/step.op_examples) run with the fast launcher off (Triton's own path), on,
   and in ``check`` mode (every launch verified against Triton's own cache key: a wrong
   specialisation raises). Outputs and in-place-modified inputs must be bit-identical to the off
   run (NaN equal to NaN); an error must be the same error.
2. CUDA graphs: verify_chain and verify_greedy captured with the fast launcher on, replayed,
   compared with eager.
3. Host µs per public eager call (tiny inputs, back-to-back calls, device synchronised around each
   batch, median of trials) with the launcher off and on, beside a bare one-kernel Triton launch
   ``kernel[(1,)](tensor, 1)`` through Triton's path and through the fast launcher.

Prints everything; writes host_overhead_check.json and .md under --out (default $OUT, else .).
Exit status 1 when any output differs, any check-mode launch raised, or capture failed; timings
never fail it. Run from the repository root after `pip install --no-deps --no-build-isolation -e .`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import traceback

import torch

MODES = ("off", "on", "check")


# ----------------------------------------------------------------------------------------------
# inputs

def transform(value, tensor_fn):
    """``value`` with every tensor inside (lists, tuples, dicts, dataclasses) replaced by
    ``tensor_fn(tensor)``; generators re-seeded copies."""
    if isinstance(value, torch.Tensor):
        return tensor_fn(value)
    if isinstance(value, torch.Generator):
        return torch.Generator(device=value.device).manual_seed(value.initial_seed())
    if isinstance(value, dict):
        return {key: transform(item, tensor_fn) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value)(*(transform(getattr(value, f.name), tensor_fn) for f in dataclasses.fields(value)))
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(transform(item, tensor_fn) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(transform(item, tensor_fn) for item in value)
    return value


def flatten(value) -> list:
    """Every tensor and scalar inside ``value``, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [x for key in sorted(value, key=str) for x in flatten(value[key])]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [x for f in dataclasses.fields(value) for x in flatten(getattr(value, f.name))]
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in flatten(item)]
    if isinstance(value, torch.Generator):
        return []
    return [value]


def misaligned(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of a contiguous tensor at an address one element past a 16-byte boundary (Triton
    specialises pointers on 16-byte alignment); other tensors are cloned as they are."""
    if not tensor.is_contiguous() or tensor.numel() == 0 or tensor.element_size() >= 16 or tensor.dtype == torch.bool:
        return tensor.clone()
    buffer = torch.empty(tensor.numel() + 1, dtype=tensor.dtype, device=tensor.device)
    view = buffer[1:].view(tensor.shape)
    view.copy_(tensor)
    assert view.data_ptr() % 16 != 0
    return view


def cases(device) -> list[tuple[str, str, tuple, dict]]:
    """(case id, op, args, kwargs) of every variant checked."""
    from spec_hal.bench.examples import op_calls
    from spec_hal.testing.step import op_examples

    out = []
    for op, (args, kwargs) in sorted(op_calls(device).items()):
        out.append((f"{op}[bs1]", op, args, kwargs))
        out.append((f"{op}[bs1,misaligned]", op, transform(args, misaligned), transform(kwargs, misaligned)))
    for case, op, args, kwargs in op_examples(device):
        out.append((f"{case}[bs3]", op, args, kwargs))
    return out


# ----------------------------------------------------------------------------------------------
# 1. outputs, fast launch off / on / check

def run_once(op: str, args, kwargs):
    """(flattened outputs and inputs after the call, or the error) of one call on fresh copies."""
    import spec_hal

    args, kwargs = transform(args, torch.Tensor.clone), transform(kwargs, torch.Tensor.clone)
    torch.manual_seed(0)
    try:
        result = getattr(spec_hal, op)(*args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except Exception as exc:  # compared between modes, not judged here
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"
    return [x.cpu() if isinstance(x, torch.Tensor) else x for x in flatten(result) + flatten(args) + flatten(kwargs)], None


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.is_floating_point or a.dtype.is_complex:
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return torch.equal(a, b)
    return type(a) is type(b) and (a == b or (a != a and b != b))


def check_outputs(device) -> tuple[list[dict], int]:
    from spec_hal.kernels import fast_launch

    rows, failures = [], 0
    for case, op, args, kwargs in cases(device):
        results = {}
        for mode in MODES:
            fast_launch.configure(mode)
            run_once(op, args, kwargs)  # the first call of a key goes through Triton's path
            results[mode] = run_once(op, args, kwargs)
        fast_launch.configure("on")
        reference, reference_error = results["off"]
        problems = []
        for mode in ("on", "check"):
            values, error = results[mode]
            if error != reference_error:
                problems.append(f"{mode}: error {error!r} vs off {reference_error!r}")
            elif values is not None and (len(values) != len(reference) or not all(same(a, b) for a, b in zip(values, reference))):
                bad = [i for i, (a, b) in enumerate(zip(values, reference)) if not same(a, b)]
                problems.append(f"{mode}: outputs differ from off at positions {bad[:8]} of {len(reference)}")
        failures += bool(problems)
        status = "ok" if not problems else "MISMATCH"
        note = reference_error or ""
        rows.append({"case": case, "status": status, "problems": problems, "note": note})
        print(f"  {status:8} {case:60} {'; '.join(problems) or (('(same error: ' + note + ')') if note else '')}", flush=True)
    return rows, failures


# ----------------------------------------------------------------------------------------------
# 2. CUDA graph capture with the fast launcher on

def check_capture(device) -> tuple[list[dict], int]:
    import spec_hal
    from spec_hal.bench.examples import op_calls
    from spec_hal.kernels import fast_launch

    fast_launch.configure("on")
    calls = op_calls(device)
    rows, failures = [], 0
    for op in ("verify_chain", "verify_greedy"):
        args, kwargs = calls[op]
        try:
            fn = getattr(spec_hal, op)
            eager = flatten(fn(*args, **kwargs))
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn(*args, **kwargs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = flatten(fn(*args, **kwargs))
            for x in captured:
                if isinstance(x, torch.Tensor):
                    x.fill_(-7)
            graph.replay()
            torch.cuda.synchronize()
            ok = all(same(a.cpu(), b.cpu()) if isinstance(a, torch.Tensor) else a == b for a, b in zip(captured, eager))
            problem = "" if ok else "replay differs from eager"
        except Exception as exc:
            problem = f"{type(exc).__name__}: {str(exc)[:300]}"
        failures += bool(problem)
        rows.append({"op": op, "status": "ok" if not problem else "FAILED", "problem": problem})
        print(f"  {'ok' if not problem else 'FAILED':8} graph capture + replay of {op} {problem}", flush=True)
    return rows, failures


# ----------------------------------------------------------------------------------------------
# 3. host µs per call

def bare_launches(device):
    """(Triton-path launch, fast-path launch) of a one-store kernel ``kernel[(1,)](tensor, 1)``."""
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    from spec_hal.kernels import fast_launch

    @triton.jit
    def _store_one(x_ptr, value):
        tl.store(x_ptr, value)

    fast_kernel = JITFunction(_store_one.fn)
    installed = fast_launch.install(fast_kernel, {})
    target = torch.zeros(1, dtype=torch.int32, device=device)
    return (lambda: _store_one[(1,)](target, 1)), ((lambda: fast_kernel[(1,)](target, 1)) if installed else None)


def fast_runs() -> list:
    from spec_hal.kernels import kernel_modules

    return [value._spec_hal_fast_run for module in kernel_modules() for value in vars(module).values()
            if hasattr(value, "_spec_hal_fast_run")]


def time_ops(device, calls: int, trials: int) -> list[dict]:
    import spec_hal
    from spec_hal.bench import harness
    from spec_hal.bench.examples import op_calls
    from spec_hal.kernels import fast_launch

    timing = dict(calls=calls, trials=trials)
    rows = []
    fast_launch.configure("on")
    bare = {"triton": float("nan"), "fast": None}
    try:
        triton_bare, fast_bare = bare_launches(device)
        bare = {"triton": harness.host_time_s(triton_bare, device, **timing),
                "fast": harness.host_time_s(fast_bare, device, **timing) if fast_bare else None}
    except Exception as exc:
        print(f"  bare launch not measurable: {type(exc).__name__}: {str(exc)[:200]}")
    print(f"  bare one-kernel launch: Triton's path {bare['triton'] * 1e6:.1f} us, fast launcher "
          f"{(bare['fast'] or float('nan')) * 1e6:.1f} us", flush=True)
    for op, (args, kwargs) in sorted(op_calls(device).items()):
        fn = getattr(spec_hal, op)
        call = lambda: fn(*args, **kwargs)  # noqa: E731
        row = {"op": op}
        try:
            row["kernels"] = harness.count_kernels(call, device)
            for mode in ("off", "on", "off", "on"):  # interleaved against drift; the lower of two
                fast_launch.configure(mode)
                seconds = harness.host_time_s(call, device, **timing)
                row[f"{mode}_us"] = min(row.get(f"{mode}_us", float("inf")), seconds * 1e6)
            fallbacks_before = sum(run.fallbacks for run in fast_runs())
            harness.host_time_s(call, device, calls=20, trials=1)
            row["fallbacks_when_on"] = sum(run.fallbacks for run in fast_runs()) - fallbacks_before
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        fast_launch.configure("on")
        row["on_over_bare"] = row.get("on_us", float("nan")) / (bare["triton"] * 1e6)
        rows.append(row)
        print(f"  {op:36} kernels {row.get('kernels')!s:>4}  off {row.get('off_us', float('nan')):7.1f} us  on "
              f"{row.get('on_us', float('nan')):7.1f} us  on/bare {row['on_over_bare']:5.2f}x  fallbacks {row.get('fallbacks_when_on')}"
              f"{'  ' + row['error'] if 'error' in row else ''}", flush=True)
    return [{"bare_triton_us": bare["triton"] * 1e6, "bare_fast_us": bare["fast"] * 1e6 if bare["fast"] else None}] + rows


def markdown(report: dict) -> str:
    lines = [f"# fast launch check ({report['device']})", "", f"- {report['versions']}", f"- fast launch: {report['status']}",
             f"- outputs: {report['output_failures']} mismatching of {len(report['outputs'])} cases; graph capture failures: "
             f"{report['capture_failures']}", ""]
    bare = report["timing"][0]
    lines += [f"Bare one-kernel launch: Triton's path {bare['bare_triton_us']:.1f} us, fast launcher "
              f"{bare['bare_fast_us'] or float('nan'):.1f} us.", "",
              "| op | kernels | off us | on us | on / bare Triton launch | fallbacks when on |", "|---|---:|---:|---:|---:|---:|"]
    for row in report["timing"][1:]:
        lines.append(f"| {row['op']} | {row.get('kernels')} | {row.get('off_us', float('nan')):.1f} | {row.get('on_us', float('nan')):.1f} | "
                     f"{row['on_over_bare']:.2f}x | {row.get('fallbacks_when_on')} |")
    mismatches = [row for row in report["outputs"] if row["status"] != "ok"]
    if mismatches:
        lines += ["", "Mismatches:"] + [f"- {row['case']}: {'; '.join(row['problems'])}" for row in mismatches]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--skip-timing", action="store_true")
    options = parser.parse_args(argv)
    device = torch.device(options.device)
    if device.type == "cpu":  # a smoke run of this script's plumbing; the launcher is not used on the cpu backend
        pass
    elif not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU (the CPU tests are tests/test_fast_launch.py)")
        return 2
    else:
        torch.cuda.set_device(device)
    import triton

    import spec_hal
    from spec_hal.kernels import fast_launch, kernel_modules

    kernel_modules()
    versions = f"torch {torch.__version__}, Triton {triton.__version__}, Python {platform.python_version()}, spec_hal {spec_hal.__version__}"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}; {versions}")
    print(f"fast launch: {fast_launch.status()}; kernels with it installed: {len(fast_runs())}", flush=True)
    if fast_launch.status().startswith("off"):
        print(f"WARNING: the fast launcher is off here, so 'on' and 'off' below measure the same path. Launch-path "
              f"fingerprint of this Triton: {fast_launch.launch_path_fingerprint()}", flush=True)
    report = {"device": name, "versions": versions, "status": fast_launch.status()}
    try:
        print("1. outputs with the fast launcher off / on / check:", flush=True)
        report["outputs"], report["output_failures"] = check_outputs(device)
        print("2. CUDA graph capture with the fast launcher on:", flush=True)
        report["capture"], report["capture_failures"] = check_capture(device) if device.type == "cuda" else ([], 0)
        if not options.skip_timing:
            print(f"3. host us per public eager call ({options.calls} calls, lower of two medians of {options.trials}):", flush=True)
            report["timing"] = time_ops(device, options.calls, options.trials)
    except Exception:
        traceback.print_exc()
        report["crash"] = traceback.format_exc()
    os.makedirs(options.out, exist_ok=True)
    with open(os.path.join(options.out, "host_overhead_check.json"), "w") as handle:
        json.dump(report, handle, indent=1, default=str)
    if "timing" in report and "outputs" in report and "capture" in report:
        with open(os.path.join(options.out, "host_overhead_check.md"), "w") as handle:
            handle.write(markdown(report))
    failed = report.get("output_failures", 1) + report.get("capture_failures", 1) + ("crash" in report)
    print(f"\n{'FAILED' if failed else 'PASSED'}: {report.get('output_failures')} output mismatches, "
          f"{report.get('capture_failures')} capture failures{', crashed' if 'crash' in report else ''}; "
          f"results in {options.out}/host_overhead_check.json")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
