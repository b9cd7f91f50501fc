"""Host µs per public eager call with the kernel launches stubbed out, on the CPU (issue 15).

    TRITON_INTERPRET=1 SPEC_HAL_BACKEND=triton-interpret PYTHONPATH=$PWD \
        python scripts/host_profile.py [--calls 2000] [--ops verify_greedy,verify_chain] [--profile OP]

Runs every op's tiny example call (spec_hal/bench/examples.py) through the public function
``spec_hal.<op>`` on the triton-interpret backend with each Triton kernel's ``run`` (what
``kernel[grid](...)`` calls) replaced by a no-op. What is timed is everything a GPU call does on
the host except the launch itself: dispatch, argument checks, launch configs, output allocation,
result construction and the provider's argument marshalling. Not the same as the GPU figure:
``torch.empty`` on the CPU costs less than on a GPU, and the launch (bare: ~12 µs on the H100 with
the fast launcher) comes on top. Outputs are garbage (nothing runs), so nothing is compared.

``--profile OP`` prints a cProfile of 2000 calls of that op (sorted by internal time).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("SPEC_HAL_BACKEND", "triton-interpret")


def stub_launches() -> int:
    """Replace every kernel's ``run`` by a no-op; returns how many kernels were stubbed."""
    from spec_hal.kernels import kernel_modules

    count = 0
    for module in kernel_modules():
        for kernel in vars(module).values():
            if hasattr(kernel, "arg_names") and callable(getattr(kernel, "run", None)):
                kernel.run = _no_launch
                count += 1
    return count


def _no_launch(*args, **kwargs):
    return None


def time_op(fn, args, kwargs, calls: int, trials: int = 7) -> float:
    """Least over ``trials`` of µs per call over ``calls`` back-to-back calls (the least: on a
    shared machine other processes only ever add time)."""
    for _ in range(50):
        fn(*args, **kwargs)
    samples = []
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args, **kwargs)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return min(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--ops", default="", help="comma-separated ops (default: all)")
    parser.add_argument("--profile", default="", help="print a cProfile of this op")
    args = parser.parse_args(argv)

    import torch

    import spec_hal
    from spec_hal.bench.examples import op_calls

    torch.set_num_threads(1)
    stubbed = stub_launches()
    calls = op_calls(torch.device("cpu"))
    wanted = [op for op in args.ops.split(",") if op] or sorted(calls)
    print(f"# host µs per call, launches stubbed ({stubbed} kernels), backend {spec_hal.get_backend().name}, "
          f"torch {torch.__version__}, {args.calls} calls x 7 trials, least")
    for op in wanted:
        op_args, op_kwargs = calls[op]
        fn = getattr(spec_hal, op)
        print(f"{op:28s} {time_op(fn, op_args, op_kwargs, args.calls):8.1f}")
    if args.profile:
        op_args, op_kwargs = calls[args.profile]
        fn = getattr(spec_hal, args.profile)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(2000):
            fn(*op_args, **op_kwargs)
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
