"""The fast Triton launcher (spec_hal/kernels/fast_launch.py), on the CPU.

* Its key against Triton's own: over many calls of a probe kernel, two calls share a fast-launch
  key only if Triton's binder gives them the same specialisation and options (for an NVIDIA and an
  AMD backend, built offline); calls Triton specialises alike do share one.
* The launch itself with a stand-in device and CompiledKernel: the first call of a key goes through
  Triton's ``run``, later ones call the kernel's launcher with exactly the arguments
  ``JITFunction.run`` passes; everything unkeyed falls back; ``check`` mode catches a wrong key.
* Selection: off under TRITON_INTERPRET (the interpreter lane keeps Triton's path and its results)
  and for Triton versions whose launch path was not checked.
The GPU side (outputs and µs per call with the fast path on and off) is
scripts/host_overhead_check.py.
"""
from __future__ import annotations

import copy
import itertools
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

from spec_hal.kernels import fast_launch  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="needs compiled (not interpreted) JIT functions")
TARGETS = {"nvidia": GPUTarget("cuda", 90, 32), "amd": GPUTarget("hip", "gfx942", 64)}


@triton.jit
def _probe(x_ptr, y_ptr, n, stride, scale, maybe, BLOCK: tl.constexpr, MODE: tl.constexpr = 0):
    tl.store(y_ptr + tl.arange(0, BLOCK), tl.load(x_ptr + tl.arange(0, BLOCK)))


class FakeCompiled:
    """Stands in for a CompiledKernel: records the launcher calls."""

    def __init__(self):
        self.function, self.packed_metadata, self.calls = 0xF00, (4, 1, 0), []

    def run(self, *args):
        self.calls.append(args)


def fresh_kernel():
    """A new JITFunction of _probe (own caches) with device 0 set up offline for NVIDIA."""
    return JITFunction(_probe.fn)


def fast_for(kernel, vendor="nvidia", defaults=None):
    """The FastRun of ``kernel`` on a stand-in device 0 of ``vendor``; Triton's ``run`` is
    replaced by one that records its calls and returns a FakeCompiled."""
    backend = make_backend(TARGETS[vendor])
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kernel.device_caches[0] = ({}, {}, TARGETS[vendor], backend, binder)
    slow_calls = []

    def slow(*args, grid, warmup, **options):
        slow_calls.append((args, grid, warmup, options))
        return FakeCompiled()

    supported, why, knob_options = fast_launch._supported()
    if not supported:
        pytest.skip(why)
    fast = fast_launch.FastRun(kernel, slow, defaults or {"enable_fp_fusion": False}, knob_options)
    fast.run.__globals__["_fl_device"] = lambda: 0
    fast.run.__globals__["_fl_stream"] = lambda device: 0x5EED
    kernel.run = fast.run
    fast.slow_calls = slow_calls
    return fast


# ----------------------------------------------------------------------------------------------
# the key against Triton's specialisation

def tensors():
    """Tensors of several dtypes at 16-byte aligned and misaligned addresses (two storages each), and
    with storages over 2 GiB."""
    out = []
    for dtype in (torch.float32, torch.float16, torch.int32, torch.int64, torch.uint8, torch.bool):
        for _ in range(2):
            base = torch.zeros(64, dtype=dtype)
            assert base.data_ptr() % 16 == 0
            out += [base, base[1:], base[16:], base[3:]]
    # over 2 GiB of storage (AMD's buffer-op specialisation), without memory: meta tensors
    for dtype in (torch.float32, torch.uint8):
        huge = torch.empty(2**31 + 64, dtype=torch.uint8, device="meta").view(dtype)
        out += [huge, huge[1:], huge[:16]]
    return out


INTS = [0, 1, 2, 15, 16, 17, 48, -1, -16, -17, 2**31 - 1, 2**31 - 16, 2**31, 2**31 + 1, -2**31, -2**31 - 1, -2**31 - 16, 2**32,
        2**40 + 16, 2**63 - 1, 2**63 - 16, 2**63, 2**63 + 16, 2**64 - 1, 2**64 - 16]
SCALARS = INTS + [True, False, 1.0, 0.5, 16.0, None]
CONSTEXPRS = [16, 32, 1, True, False, 0, None, 2]
OPTIONS = [{}, {"num_warps": 4}, {"num_warps": 8}, {"num_warps": 4, "num_stages": 2}, {"enable_fp_fusion": True}, {"debug": True}]


def varied_calls(bases=12, seed=0):
    """Random base calls, each varied one argument (or the options) at a time over every value
    of its domain, so that calls differing in one specialisation meet."""
    rng = random.Random(seed)
    pool = tensors()
    domains = [pool, pool + SCALARS, SCALARS, SCALARS, SCALARS, SCALARS]
    for _ in range(bases):
        args = [rng.choice(domain) for domain in domains]
        constexprs = {"BLOCK": rng.choice(CONSTEXPRS), "MODE": rng.choice(CONSTEXPRS)}
        options = rng.choice(OPTIONS)
        for slot, domain in enumerate(domains):
            for value in domain:
                yield tuple(args[:slot] + [value] + args[slot + 1:]), {**constexprs, **options}
        for name, value in itertools.product(constexprs, CONSTEXPRS):
            yield tuple(args), {**constexprs, name: value, **options}
        for other in OPTIONS:
            yield tuple(args), {**constexprs, **other}


def keys(fast, args, kwargs):
    options = dict(kwargs)
    options.setdefault("enable_fp_fusion", False)
    state = fast.state(0)
    mine = fast.key(*args, _fl_tensor_spec=state.tensor_spec, **kwargs)
    theirs = fast.triton_key(0, args, options)
    return mine, theirs


@pytest.mark.parametrize("vendor", sorted(TARGETS))
def test_calls_share_a_key_only_when_triton_specialises_them_alike(vendor):
    fast = fast_for(fresh_kernel(), vendor)
    seen: dict = {}
    calls = list(varied_calls())
    for args, kwargs in calls:
        mine, theirs = keys(fast, args, kwargs)
        hash(mine)
        assert seen.setdefault(mine, theirs) == theirs, f"one fast key for two Triton specialisations: {seen[mine]} vs {theirs}"
    assert len(seen) > 1000  # the calls were varied


@pytest.mark.parametrize("vendor", sorted(TARGETS))
def test_calls_triton_specialises_alike_share_a_key(vendor):
    fast = fast_for(fresh_kernel(), vendor)
    a, b = torch.zeros(64), torch.zeros(64)

    def key(x, n, scale=0.5, **kwargs):
        return keys(fast, (x, b, n, 3, scale, None), {"BLOCK": 16, **kwargs})[0]

    assert key(a, 5) == key(b, 7) == key(a[4:], 9)  # aligned fp32 pointers, odd i32
    assert key(a, 32) == key(a, 48) == key(a, -16)
    assert key(a, 2**40 + 16) == key(a, 2**40 + 32) and key(a, 2**63 + 16) == key(a, 2**64 - 16)
    assert key(a, 5, 1.0) == key(a, 5, 2.5)
    assert key(a, 5, num_warps=4) == key(a, 5, num_warps=4)
    for first, second in [((a, 5), (a[1:], 5)), ((a, 5), (a, 16)), ((a, 5), (a, 1)), ((a, 5), (a.int(), 5)), ((a, 2**31 - 1), (a, 2**31)),
                          ((a, 2**63 - 1), (a, 2**63)), ((a, 5), (a, True)), ((a, 5), (a, 5.0))]:
        assert key(*first) != key(*second), (first, second)
    assert key(a, 5, num_warps=4) != key(a, 5, num_warps=8)
    assert key(a, 5, enable_fp_fusion=True) != key(a, 5)


def test_int_key_classes():
    assert fast_launch.int_key(1) == 1
    assert {fast_launch.int_key(v) for v in (2, 17, -1, 2**31 - 1, -2**31 + 1)} == {0}
    assert {fast_launch.int_key(v) for v in (0, 16, -16, 2**31 - 16)} == {16}
    assert len({fast_launch.int_key(v) for v in (3, 16, 1, 2**31 + 1, 2**31, 2**63 + 1, 2**63)}) == 7
    for out_of_range in (2**64, -2**63 - 1):
        with pytest.raises(fast_launch.Unsupported):
            fast_launch.int_key(out_of_range)


# ----------------------------------------------------------------------------------------------
# the launch with a stand-in device

def launch(kernel, x, y, n=5, **kwargs):
    return kernel[(3, 2)](x, y, n, 7, 0.5, None, BLOCK=16, num_warps=4, **kwargs)


def test_first_call_goes_through_triton_then_the_launcher_is_called_as_triton_calls_it():
    kernel = fresh_kernel()
    fast = fast_for(kernel)
    x, y = torch.zeros(16), torch.zeros(16)
    compiled = launch(kernel, x, y)
    assert len(fast.slow_calls) == 1 and fast.misses == 1 and compiled.calls == []
    args, grid, warmup, options = fast.slow_calls[0]
    assert args == (x, y, 5, 7, 0.5, None, 16, 0) and grid == (3, 2) and not warmup
    assert options == {"enable_fp_fusion": False, "num_warps": 4}
    again = launch(kernel, y, x, n=9)  # same specialisation: no new Triton call
    assert again is compiled and len(fast.slow_calls) == 1
    # grid, stream, function, packed metadata, launch metadata and hooks (idle), every argument
    assert compiled.calls == [(3, 2, 1, 0x5EED, 0xF00, (4, 1, 0), None, None, None, y, x, 9, 7, 0.5, None, 16, 0)]
    kernel[(4,)](x, y, 5, 7, 0.5, None, BLOCK=16, num_warps=4)
    assert compiled.calls[-1][:3] == (4, 1, 1)


def test_a_new_specialisation_or_option_goes_through_triton_again():
    kernel = fresh_kernel()
    fast = fast_for(kernel)
    x, y = torch.zeros(16), torch.zeros(16)
    launch(kernel, x, y)
    launch(kernel, x[1:], y)
    launch(kernel, x, y, n=16)
    launch(kernel, x, y, enable_fp_fusion=True)
    kernel[(1,)](x, y, 5, 7, 0.5, None, BLOCK=16, num_warps=8)
    assert fast.misses == 5 and fast.fallbacks == 0
    assert fast.slow_calls[3][3]["enable_fp_fusion"] is True


def test_unkeyed_calls_fall_back_to_triton():
    from triton import knobs

    kernel = fresh_kernel()
    fast = fast_for(kernel)
    x, y = torch.zeros(16), torch.zeros(16)
    launch(kernel, x, y)
    kernel[lambda meta: (1,)](x, y, 5, 7, 0.5, None, BLOCK=16, num_warps=4)  # callable grid
    kernel[(1,)](x, y, (5, 6), 7, 0.5, None, BLOCK=16, num_warps=4)  # tuple argument
    kernel[(1,)](x, y, 2**64, 7, 0.5, None, BLOCK=16, num_warps=4)  # Triton raises on it
    kernel[(1,)](x, y, 5, 7, 0.5, None, BLOCK=[16], num_warps=4)  # unhashable constexpr
    kernel.run(x, y, 5, 7, 0.5, None, BLOCK=16, grid=(1,), warmup=True)
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        launch(kernel, x, y)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    kernel.add_pre_run_hook(lambda *args, **kwargs: None)
    launch(kernel, x, y)
    assert fast.fallbacks == 7 and fast.misses == 1


def test_off_mode_always_takes_triton_path():
    kernel = fresh_kernel()
    fast = fast_for(kernel)
    previous = fast_launch.configure("off")
    try:
        x, y = torch.zeros(16), torch.zeros(16)
        launch(kernel, x, y)
        launch(kernel, x, y)
    finally:
        fast_launch.configure(previous)
    assert fast.fallbacks == 2 and fast.misses == 0
    with pytest.raises(ValueError):
        fast_launch.configure("fast")


def test_check_mode_raises_when_triton_would_pick_another_kernel():
    from triton.runtime.jit import compute_cache_key

    kernel = fresh_kernel()
    fast = fast_for(kernel)
    x, y = torch.zeros(16), torch.zeros(16)
    compiled = launch(kernel, x, y)
    kernel_cache, kernel_key_cache = kernel.device_caches[0][:2]
    specialization, options = fast.triton_key(0, (x, y, 5, 7, 0.5, None, 16, 0), {"enable_fp_fusion": False, "num_warps": 4})
    kernel_cache[compute_cache_key(kernel_key_cache, list(specialization), options)] = compiled  # what Triton's run stores
    previous = fast_launch.configure("check")
    try:
        launch(kernel, y, x, n=9)  # Triton agrees
        assert len(compiled.calls) == 1
        kernel_cache.clear()
        kernel_cache[compute_cache_key(kernel_key_cache, list(specialization), options)] = FakeCompiled()
        with pytest.raises(RuntimeError, match="compiled for other arguments"):
            launch(kernel, y, x, n=9)
    finally:
        fast_launch.configure(previous)


def test_a_changed_global_falls_back():
    kernel = fresh_kernel()
    fast = fast_for(kernel)
    scope = {"LIMIT": 1}
    kernel.used_global_vals = {("LIMIT", id(scope)): (1, scope)}
    x, y = torch.zeros(16), torch.zeros(16)
    launch(kernel, x, y)
    launch(kernel, x, y)
    assert fast.fallbacks == 0
    scope["LIMIT"] = 2
    launch(kernel, x, y)
    assert fast.fallbacks == 1


@pytest.mark.parametrize("kind", ["int", "constexpr", "list"])
def test_a_changed_global_falls_back_after_fast_checks(kind):
    """globals_same decides by identity after a full check; a replaced object, a constexpr whose
    value was reassigned and an in-place change of a mutable global (never taken by identity)
    each fall back, as Triton's equality check would."""
    kernel = fresh_kernel()
    fast = fast_for(kernel)
    value = {"int": 1000, "constexpr": tl.constexpr(1000), "list": [1000]}[kind]
    scope = {"LIMIT": value}
    kernel.used_global_vals = {("LIMIT", id(scope)): (copy.deepcopy(value), scope)}
    x, y = torch.zeros(16), torch.zeros(16)
    for _ in range(3):
        launch(kernel, x, y)
    assert fast.fallbacks == 0
    assert (fast.global_count == 1) == (kind != "list")  # the identity snapshot: immutable values only
    if kind == "int":
        scope["LIMIT"] = 1001
    elif kind == "constexpr":
        value.value = 1001
    else:
        value.append(1)
    launch(kernel, x, y)
    assert fast.fallbacks == 1
    scope["LIMIT"] = copy.deepcopy(kernel.used_global_vals[("LIMIT", id(scope))][0])  # an equal new object: fast again
    launch(kernel, x, y)
    launch(kernel, x, y)
    assert fast.fallbacks == 1


def test_direct_nvidia_launch_passes_what_the_launchers_call_would(monkeypatch):
    """On a checked Triton, an entry without scratch memory calls CudaLauncher's C ``launch``
    itself: with the same arguments as Triton's own ``CudaLauncher.__call__`` passes it."""
    if fast_launch.direct_launch_version() is None:
        pytest.skip("no checked NVIDIA launcher body in this Triton")
    from triton.backends.nvidia.driver import CudaLauncher
    from triton.runtime import driver

    calls = []

    class Launch:  # stands in for the C launch function (not a Python function: no wrapper)
        def __call__(self, *args):
            calls.append(args)

    launcher = object.__new__(CudaLauncher)
    launcher.__dict__.update(launch=Launch(), num_ctas=1, global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                             profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=True, gsan_enabled=False,
                             arg_annotations=("annotations",), kernel_signature=("signature",))
    compiled = FakeCompiled()
    compiled.run = launcher
    kernel = fresh_kernel()
    fast = fast_for(kernel)
    fast.slow = lambda *args, grid, warmup, **options: compiled
    x, y = torch.zeros(16), torch.zeros(16)
    launch(kernel, x, y)  # the miss: Triton's path (here the stand-in), then the entry is kept
    assert fast.states[0].cache and next(iter(fast.states[0].cache.values()))[4]  # a direct entry
    launch(kernel, y, x, n=9)
    assert len(calls) == 1
    previous = driver._active
    driver._active = object()  # Triton 3.9's __call__ reads the active driver first (no GPU here)
    try:
        CudaLauncher.__call__(launcher, 3, 2, 1, 0x5EED, 0xF00, (4, 1, 0), None, None, None, y, x, 9, 7, 0.5, None, 16, 0)
    finally:
        driver._active = previous
    assert calls[0] == calls[1]  # host tensors: passed as tensors, so the C launcher rejects them as it would
    # Device tensors go as their addresses: every argument else as __call__ passes it.
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    launch(kernel, y, x, n=9)
    assert len(calls) == 3 and calls[2] == as_addresses(calls[1])
    assert tensors_in(calls[1]) == 2 and tensors_in(calls[2]) == 0
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: self is not x))  # one host tensor: all passed as tensors
    launch(kernel, y, x, n=9)
    assert calls[3] == calls[1]
    launcher.global_scratch_size = 8  # scratch memory: Triton's own __call__ allocates it
    assert fast_launch.direct_entry(compiled) is None


def tensors_in(value) -> int:
    """How many tensors ``value`` holds (inside tuples too)."""
    if isinstance(value, tuple):
        return sum(tensors_in(item) for item in value)
    return int(isinstance(value, torch.Tensor))


def as_addresses(value):
    """``value`` with every tensor (inside tuples too) replaced by its data_ptr."""
    if isinstance(value, torch.Tensor):
        return value.data_ptr()
    if isinstance(value, tuple):
        return tuple(as_addresses(item) for item in value)
    return value


# ----------------------------------------------------------------------------------------------
# selection

def test_only_checked_triton_versions_are_enabled(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    supported, why, _ = fast_launch._triton_state()
    assert not supported and "3.7.0" in why
    monkeypatch.setattr(fast_launch, "_support", (False, why, ()))
    assert not fast_launch.install(fresh_kernel(), {})
    assert fast_launch.status().startswith("off")


def test_a_different_launch_path_source_disables_it(monkeypatch):
    version = triton.__version__.split("+")[0]
    if version not in fast_launch._CHECKED:
        pytest.skip(f"Triton {triton.__version__} is not checked")
    assert fast_launch._triton_state()[0], "the installed Triton's launch path no longer matches its recorded fingerprint"
    monkeypatch.setattr(fast_launch, "launch_path_fingerprint", lambda: "0" * 64)
    supported, why, _ = fast_launch._triton_state()
    assert not supported and "differs" in why


def test_install_replaces_run_and_keeps_the_fp_fusion_default():
    kernel = fresh_kernel()
    assert fast_launch.install(kernel, {"enable_fp_fusion": False}) == fast_launch._supported()[0]
    if fast_launch._supported()[0]:
        assert kernel.run is kernel._spec_hal_fast_run.run
        assert not fast_launch.install(lambda: None, {})


INTERPRETER_PROBE = textwrap.dedent("""
    import torch
    import spec_hal
    from spec_hal.kernels import fast_launch, kernel_modules
    from spec_hal.verify import verify_chain as reference

    modules = kernel_modules()
    installed = [name for module in modules for name, value in vars(module).items() if hasattr(value, "_spec_hal_fast_run")]
    assert installed == [], installed
    assert fast_launch.status().startswith("off: TRITON_INTERPRET"), fast_launch.status()
    backend = spec_hal.get_backend("triton-interpret")
    candidates = torch.tensor([[5, 7, 9, 2], [5, 1, 9, 2]])
    predict = torch.tensor([7, 9, 4, 3, 1, 9, 9, 9])
    got, expected = backend.verify_chain(candidates, predict), reference(candidates, predict)
    assert all(torch.equal(a, b) for a, b in zip(got, expected)), (got, expected)
    print("ok", fast_launch.status())
""")


def test_interpreter_lane_keeps_tritons_path_and_results():
    env = dict(os.environ, TRITON_INTERPRET="1", SPEC_HAL_FAST_LAUNCH="1", SPEC_HAL_BACKEND="triton-interpret")
    result = subprocess.run([sys.executable, "-c", INTERPRETER_PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "ok off" in result.stdout


# ----------------------------------------------------------------------------------------------
# host helpers of kernels/launch.py (the launch configs call them instead of Triton's
# ConstexprFunctions, which cost about 1 µs a call)

def test_host_cdiv_and_next_power_of_2_match_tritons():
    from spec_hal.kernels.launch import cdiv, next_power_of_2

    triton_cdiv = getattr(triton.cdiv, "fn", triton.cdiv)
    triton_pow2 = getattr(triton.next_power_of_2, "fn", triton.next_power_of_2)
    values = list(range(-40, 5000)) + [2**k + d for k in range(13, 63) for d in (-1, 0, 1)]
    assert [next_power_of_2(v) for v in values] == [triton_pow2(v) for v in values]
    for denominator in (1, 2, 3, 16, 4096, 65535):
        assert [cdiv(v, denominator) for v in values] == [triton_cdiv(v, denominator) for v in values]
