"""Fast Triton launches: a known specialisation goes straight to its compiled kernel's launcher.

``JITFunction.run`` spends about 1 µs per kernel argument on every call (measured on the H100 with
Triton 3.6: 12.4 µs for a 2-argument launch, 27.5 µs for 17): it binds the arguments, specialises
each one natively, builds and hashes a string key of the options, checks the kernel's globals, and
builds launch metadata for the (empty) launch hooks. :func:`install` replaces a kernel's ``run``
(what ``kernel[grid](...)`` calls) with a function generated for its signature that

1. computes a key of everything Triton specialises on, cheaply (see :func:`arg_key`);
2. on the first call for a key, goes through Triton's own ``run`` (compile or cache load, launch)
   and keeps the ``CompiledKernel`` it returns;
3. afterwards launches that kernel directly, exactly as the last lines of ``JITFunction.run`` do:
   ``kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata,
   launch_metadata, enter_hook, exit_hook, *arguments)``, with the stream of the current device
   from Triton's driver (``torch.cuda.current_stream``'s handle, so CUDA graph capture records it);
   launch metadata and hooks are passed as None while Triton's launch-hook chains are empty (the
   launcher calls an empty chain for nothing). On NVIDIA, where ``kernel.run`` is a CudaLauncher
   whose ``__call__`` was read in source (``_DIRECT_CHECKED``) and the kernel has no scratch
   memory, the launcher's C ``launch`` is called with the arguments that ``__call__`` would pass,
   but device tensors as their ``data_ptr`` ints (read for the key already): for a tensor the C
   launcher calls ``data_ptr`` and ``cuPointerGetAttribute``, and it takes an int as it is (H200:
   a 16-tensor launch 7.6 -> 5.1 µs). A call with any tensor off the GPU passes the tensors, so
   the launcher still rejects host memory.

The key must separate every pair of calls that Triton would compile differently, or a call would
run code specialised for other arguments. Per argument Triton 3.6 to 3.9 (``native_specialize_impl``)
distinguish: a tensor by dtype and by ``data_ptr() % 16 == 0`` (and, on backends without the native
tensor rule, AMD, by ``backend.get_tensor_specialization``: buffer ops when the storage is under
2 GiB); an int by ``== 1`` (a constexpr), by range (i32, i64, u64) and by ``% 16 == 0``; a bool,
a float and None by type; a constexpr parameter by value. Options are the launch keywords
(``num_warps``, ``num_stages``, ``enable_fp_fusion``...) plus what ``run`` reads from Triton's knobs
each call (debug, instrumentation mode, and on 3.9 the fpsan casts); the device selects the cache.
The key here is at least as fine: two calls share it only if Triton's own key of both is equal
(values compared with ``==``, as Triton's ``kernel_key_cache`` does). Anything else (a tuple, a
tensor descriptor, a JIT function, an int subclass, a callable grid, a pre-run or launch hook,
a changed global) takes Triton's normal path on every call.

Enabled only where the launch path was read in source and fingerprinted (``_CHECKED``: Triton 3.6.0
and 3.9.0); under ``TRITON_INTERPRET`` the kernels are interpreted functions and keep Triton's
path. ``SPEC_HAL_FAST_LAUNCH``: ``1`` (default) on, ``0`` off, ``check`` on and every launch
verified against Triton's own key and cache (raises on a mismatch; slow, for tests and GPU checks).
:func:`configure` switches the mode at run time; :func:`status` says what is in force and why.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import os
import types
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

ENV_VAR = "SPEC_HAL_FAST_LAUNCH"
MODES = ("off", "on", "check")
_ENV_MODES = {"0": "off", "off": "off", "false": "off", "1": "on", "on": "on", "true": "on", "": "on", "check": "check"}

# Triton versions whose launch path was read in source: sha256 of the source of the functions this
# module mirrors (see launch_path_fingerprint), and the knobs ``run`` copies into the options on
# every call.
_CHECKED = {
    "3.6.0": ("48bb50708af5740f656ab583fca15d2a6ae517273462134cf475a620b4e43bc8", (("runtime", "debug"), ("compilation", "instrumentation_mode"))),
    "3.9.0": ("44d65219aebba69721d6219f8d253c0b43d854c3ee2f06472235e7298760b83e", (("runtime", "debug"), ("compilation", "instrumentation_mode"),
                              ("compilation", "fpsan_homomorphic_casts"))),
}

# Key of an int argument: 1 (Triton makes it a constexpr), else its type (i32, i64, u64) and
# whether it is a multiple of 16; seven distinct small ints (the generated key computes the i32
# ones inline: keep them 1, 0 and 16).
_ONE, _I32, _I32_D, _I64, _I64_D, _U64, _U64_D = 1, 0, 16, 2, 32, 3, 48


class _Unaligned(dict):
    """dtype -> the key of a tensor of that dtype whose address is not 16-byte aligned (an aligned
    tensor's key is its dtype: no tuple built per argument)."""

    def __missing__(self, dtype):
        key = self[dtype] = ("unaligned", dtype)
        return key


_UNALIGNED = _Unaligned()


# NVIDIA launcher bodies read in source (sha256 of ``CudaLauncher.__call__``), per Triton version:
# where one matches, a kernel without scratch memory is launched by calling the launcher's C
# ``launch`` with exactly the arguments that ``__call__`` passes it (scratch pointers None, as its
# ``allocate_scratch`` returns for size 0), a Python frame and two closures fewer per launch. The
# argument order differs between the versions: see _DIRECT_CALLS.
_DIRECT_CHECKED = {
    "3.6.0": "9412a64d532d5b5ce67ef236d2f377fe728f58c346b5ef399c4836793b79f436",
    "3.9.0": "7858736667eaebc162739e5004f19c43cdd1ffea8e30b86811abc6183a338e7e",
}
# The direct call of an entry (launch, function, packed metadata, compiled, True, cooperative,
# pdl, arg annotations, kernel signature), written with {grid}, {args} (the kernel's arguments) and
# {args_tuple} (the same as a tuple).
_DIRECT_CALLS = {
    "3.6.0": "_fl_entry[0]({grid}, _fl_stream(_fl_dev), _fl_entry[1], _fl_entry[5], _fl_entry[6], None, None, _fl_entry[2], None, None, None, {args})",
    "3.9.0": ("_fl_entry[0]({grid}, _fl_stream(_fl_dev), _fl_entry[1], _fl_entry[5], _fl_entry[6], _fl_entry[2], None, None, None, None, None, "
              "_fl_entry[7], _fl_entry[8], {args_tuple})"),
}


def direct_launch_version() -> Optional[str]:
    """The Triton version whose direct NVIDIA launch form applies here, or None (another version,
    no NVIDIA backend, or a launcher body that differs from the one read)."""
    try:
        import triton
        from triton.backends.nvidia.driver import CudaLauncher
    except ImportError:
        return None
    version = triton.__version__.split("+")[0]
    try:
        source = inspect.getsource(CudaLauncher.__call__)
    except (OSError, TypeError):
        return None
    return version if _DIRECT_CHECKED.get(version) == hashlib.sha256(source.encode()).hexdigest() else None


def direct_entry(compiled) -> Optional[tuple]:
    """The cache entry that launches ``compiled`` directly, or None where its launcher is not
    a plain CudaLauncher of a checked version without scratch memory (gsan off, no tensor
    descriptors: ``launch`` is the C function itself)."""
    if _direct_version() is None:
        return None
    from triton.backends.nvidia.driver import CudaLauncher

    launcher = compiled.run
    if (type(launcher) is not CudaLauncher or launcher.global_scratch_size or launcher.profile_scratch_size
            or getattr(launcher, "gsan_enabled", False) or isinstance(launcher.launch, types.FunctionType)):
        return None
    return (launcher.launch, compiled.function, compiled.packed_metadata, compiled, True, launcher.launch_cooperative_grid,
            launcher.launch_pdl, getattr(launcher, "arg_annotations", None), getattr(launcher, "kernel_signature", None))


_direct_version = functools.lru_cache(maxsize=None)(direct_launch_version)  # read the source once


class Unsupported(Exception):
    """An argument this module does not key; the call takes Triton's normal path."""


def int_key(value: int) -> int:
    """The part of an int argument Triton specialises on (see module docstring)."""
    if value == 1:
        return _ONE
    if -0x80000000 <= value <= 0x7FFFFFFF:
        return _I32 if value & 15 else _I32_D
    if -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
        return _I64 if value & 15 else _I64_D
    if 0 <= value <= 0xFFFFFFFFFFFFFFFF:
        return _U64 if value & 15 else _U64_D
    raise Unsupported  # Triton raises OverflowError on its path


def arg_key(value, tensor_spec: Optional[Callable] = None):
    """Key of one non-constexpr argument. ``tensor_spec``: the backend's
    ``get_tensor_specialization`` where Triton calls it (backends without the native rule), else
    None (dtype and 16-byte alignment). Raises :class:`Unsupported` for other types."""
    kind = value.__class__
    if kind is int:
        return int_key(value)
    if kind is bool or kind is float:
        return kind
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if tensor_spec is None:
            return value.dtype, not value.data_ptr() & 15
        return value.dtype, tensor_spec(value, align=True)
    raise Unsupported


@dataclass
class _Settings:
    mode: str = "on"


_settings = _Settings(_ENV_MODES.get(os.environ.get(ENV_VAR, "").strip().lower(), "off"))  # not understood: off


def _triton_state() -> tuple[bool, str, tuple]:
    """(supported, why, knob options) for the installed Triton."""
    try:
        import triton
        from triton import knobs  # noqa: F401
    except ImportError as exc:
        return False, f"Triton not importable ({exc})", ()
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False, "TRITON_INTERPRET=1 (interpreted kernels)", ()
    version = triton.__version__.split("+")[0]
    checked = _CHECKED.get(version)
    if checked is None:
        return False, f"Triton {triton.__version__} is not a checked version ({', '.join(_CHECKED)})", ()
    fingerprint = launch_path_fingerprint()
    if fingerprint != checked[0]:
        return False, f"Triton {triton.__version__}'s launch path differs from the checked source ({fingerprint[:12]})", ()
    return True, f"Triton {triton.__version__} (launch path checked)", checked[1]


def launch_path_fingerprint() -> str:
    """sha256 of the source of the Triton functions this module mirrors ("unavailable" when the
    source cannot be read)."""
    try:
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime import jit

        sources = [inspect.getsource(jit.JITFunction.run), inspect.getsource(jit.KernelInterface.__getitem__),
                   inspect.getsource(CompiledKernel.launch_metadata), inspect.getsource(jit.create_function_from_signature)]
    except (ImportError, AttributeError, OSError, TypeError):
        return "unavailable"
    return hashlib.sha256("\n".join(sources).encode()).hexdigest()


_support: Optional[tuple] = None


def _supported() -> tuple[bool, str, tuple]:
    global _support
    if _support is None:
        _support = _triton_state()
    return _support


def configure(mode: str) -> str:
    """Set the mode ("off", "on", "check") for every installed kernel; returns the previous one."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    previous, _settings.mode = _settings.mode, mode
    return previous


def status() -> str:
    """What is in force: "on (...)", "check (...)" or "off: why"."""
    supported, why, _ = _supported()
    if not supported:
        return f"off: {why}"
    if _settings.mode == "off":
        return f"off: {ENV_VAR}={os.environ.get(ENV_VAR, '')!r} or configure('off')"
    return f"{_settings.mode} ({why})"


@dataclass
class _DeviceState:
    """Per device: the CompiledKernel entries by key and how tensors are keyed there."""

    backend: object
    tensor_spec: Optional[Callable]
    cache: dict = field(default_factory=dict)


class FastRun:
    """The ``run`` installed on one JITFunction (see module docstring). Holds Triton's own
    ``run`` (``slow``) for misses and everything this module does not key."""

    def __init__(self, kernel, slow: Callable, defaults: dict, knob_options: tuple):
        self.kernel = kernel
        self.slow = slow
        self.defaults = dict(defaults)
        self.knob_options = knob_options
        self.states: dict = {}
        self.misses = self.fallbacks = 0  # counted for tests and the GPU check
        self.global_refs: tuple = ()  # (scope, name, object, its constexpr value or itself) per global at the last full check
        self.global_count = -1  # len(used_global_vals) then; -1: no snapshot (the full check runs)
        self.key: Callable = None  # the key of a call, as ``run`` computes it (for tests); set below
        self.run = _generate(self)

    # -- pieces the generated function calls off its fast path ----------------------------------

    def state(self, device) -> _DeviceState:
        state = self.states.get(device)
        if state is None:
            backend = self.kernel.device_caches[device][3]
            native = getattr(backend, "supports_native_tensor_specialization", None) is True
            state = _DeviceState(backend, None if native else backend.get_tensor_specialization)
            self.states[device] = state
        return state

    def miss(self, state: _DeviceState, key, args: tuple, grid, options: dict):
        """Triton's path for a new key; keep the CompiledKernel it launched."""
        self.misses += 1
        compiled = self.slow(*args, grid=grid, warmup=False, **options)
        if compiled is not None and not hasattr(compiled, "result") and getattr(compiled, "function", None) is not None:
            state.cache[key] = direct_entry(compiled) or (compiled.run, compiled.function, compiled.packed_metadata, compiled, False)
        return compiled

    def fallback(self, args: tuple, grid, warmup, options: dict):
        self.fallbacks += 1
        return self.slow(*args, grid=grid, warmup=warmup, **options)

    def triton_key(self, device, args: tuple, options: dict) -> tuple:
        """Triton's own key of a call, as ``JITFunction.run`` computes it before turning it into a
        string: ``(tuple(specialisation), str(options))``, the dict key of its kernel_key_cache."""
        from triton import knobs

        kwargs = dict(options)
        kwargs["debug"] = kwargs.get("debug", self.kernel.debug) or knobs.runtime.debug
        for group, name in self.knob_options:
            if name != "debug":
                kwargs[name] = getattr(getattr(knobs, group), name)
        binder = self.kernel.device_caches[device][4]
        _, specialization, triton_options = binder(*args, **kwargs)
        return tuple(specialization), str(triton_options)

    def check(self, device, entry, args: tuple, options: dict) -> None:
        """Raise unless Triton's own cache maps this call to the kernel the key picked."""
        from triton.runtime.jit import compute_cache_key

        kernel_cache, kernel_key_cache = self.kernel.device_caches[device][:2]
        specialization, triton_options = self.triton_key(device, args, options)
        key = compute_cache_key(kernel_key_cache, list(specialization), triton_options)
        if kernel_cache.get(key) is not entry[3]:
            raise RuntimeError(f"spec_hal fast launch: {self.kernel.__name__} would launch a kernel compiled for other arguments "
                               f"(Triton key {key[:300]!r}); set {ENV_VAR}=0 and report this")

    def globals_changed(self) -> bool:
        """Whether a global the kernel read when compiled now has another value (Triton's own
        check, with ``!=``: a Triton ``constexpr`` compares in Python code, microseconds a call)."""
        return any(scope.get(name, _MISSING) != value for (name, _), (value, scope) in self.kernel.used_global_vals.items())

    def globals_same(self) -> bool:
        """``not globals_changed()``, by identity on the fast path: the objects found in the
        kernel's scopes at the last full check are still there, each immutable (so equal to what
        Triton recorded then). Anything else (a new object, a mutable value, globals Triton added
        since) takes the full check, which renews the snapshot."""
        if len(self.kernel.used_global_vals) == self.global_count:
            for scope, name, seen, inner in self.global_refs:
                found = scope.get(name, _MISSING)
                if found is not seen or (inner is not seen and found.value is not inner):  # a constexpr's value too
                    break
            else:
                return True
        if self.globals_changed():
            return False
        used = self.kernel.used_global_vals
        refs = []
        for (name, _), (_, scope) in used.items():
            value = scope.get(name, _MISSING)
            inner = value.value if isinstance(value, _constexpr()) else value
            if not _immutable(inner):
                self.global_refs, self.global_count = (), -1
                return True
            refs.append((scope, name, value, inner))
        self.global_refs, self.global_count = tuple(refs), len(used)
        return True


_RESERVED = ("grid", "warmup", "options")
_MISSING = object()
_IMMUTABLE = (int, float, bool, str, bytes, complex, type(None))


def _immutable(value) -> bool:
    """A value whose identity fixes its value: a scalar, or a tuple of them."""
    if isinstance(value, tuple):
        return all(_immutable(item) for item in value)
    return value.__class__ in _IMMUTABLE


def _constexpr():
    from triton.language import constexpr

    return constexpr


def _key_lines(name: str) -> list[str]:
    """Generated statements for one non-constexpr argument ``name``: its key ``_fl_k_<name>`` and
    what the direct launch passes for it, ``_fl_a_<name>``. Inline for the common kinds (a call
    costs what the rest of the key does): an aligned tensor's key is its dtype, a misaligned one's
    _fl_unaligned[dtype], and it is passed as its data_ptr; an int32's key is int_key's value
    computed here. Other values go through arg_key and are passed as they are."""
    return [
        f"if {name}.__class__ is _fl_Tensor and _fl_native:",
        f"    _fl_a_{name} = {name}.data_ptr()",
        f"    _fl_k_{name} = {name}.dtype if not _fl_a_{name} & 15 else _fl_unaligned[{name}.dtype]",
        f"    if not {name}.is_cuda:",
        "        _fl_host = True",
        f"elif {name}.__class__ is int and -2147483648 <= {name} <= 2147483647:",
        f"    _fl_a_{name} = {name}",
        f"    _fl_k_{name} = 1 if {name} == 1 else 0 if {name} & 15 else 16",
        "else:",
        f"    _fl_a_{name} = {name}",
        f"    _fl_k_{name} = _fl_arg_key({name}, _fl_tensor_spec)",
    ]


def _tuple(items: list[str]) -> str:
    """Source of a tuple of ``items``."""
    return f"({', '.join(items)},)" if items else "()"


def _generate(fast: FastRun) -> Callable:
    """The ``run`` function for ``fast.kernel``'s signature, written out so that binding costs
    what a Python call costs (Triton generates its binder the same way)."""
    from triton import knobs
    from triton.runtime import driver

    kernel = fast.kernel
    params = list(kernel.signature.parameters.values())
    names = [p.name for p in params]
    parameters, has_star = [], False
    for param in params:
        if param.kind == inspect.Parameter.KEYWORD_ONLY and not has_star:
            parameters.append("*")
            has_star = True
        parameters.append(param.name if param.default is inspect.Parameter.empty else f"{param.name}=_fl_default_{param.name}")
    parameters += ([] if has_star else ["*"]) + [f"{name}=_fl_option_{name}" for name in fast.defaults]
    keyed, passed, key_lines = [], [], []
    for param, name in zip(kernel.params, names):
        if param.is_constexpr:
            keyed.append(name)
            passed.append(name)
        else:
            keyed.append(f"_fl_k_{name}")
            passed.append(f"_fl_a_{name}")
            key_lines += _key_lines(name)
    key_body = "\n".join(" " * 4 + line for line in key_lines)  # at a function's top level
    key_body_in_try = "\n".join(" " * 8 + line for line in key_lines)
    knob_values = ", ".join(f"_fl_knobs.{group}.{name}" for group, name in fast.knob_options)
    args = _tuple(names)
    default_options = ", ".join(f"{name}={name}" for name in fast.defaults)
    all_options = f"{default_options}, **options" if default_options else "**options"
    option_key = f"({', '.join(fast.defaults)},)" if fast.defaults else "()"
    key_expr = f"(_fl_kernel.debug, {knob_values}, {option_key}, tuple(options.items()), {', '.join(keyed)},)"
    grid_args = "grid[0], grid[1] if _fl_size > 1 else 1, grid[2] if _fl_size > 2 else 1"
    direct_form = _DIRECT_CALLS.get(_direct_version() or "")
    if direct_form:
        # Tensors go as their data_ptr ints (read for the key already), which the C launcher takes
        # as they are: no second data_ptr call and no cuPointerGetAttribute per tensor. That
        # driver call is the launcher's only test that a tensor is device memory, so a call with
        # a tensor elsewhere (_fl_host) passes the tensors and keeps it.
        direct_call = (f"if _fl_host:\n            {direct_form.format(grid=grid_args, args=', '.join(names), args_tuple=args)}\n"
                       f"        else:\n            {direct_form.format(grid=grid_args, args=', '.join(passed), args_tuple=_tuple(passed))}")
    else:
        direct_call = "raise AssertionError('no direct form')"  # never reached: entries are direct only with a form
    # Launch hooks idle: the HookChains Triton installs, still in place and empty (else Triton's path).
    hooks_idle = ("_fl_runtime.launch_enter_hook is _fl_enter and not _fl_enter.calls and _fl_runtime.launch_exit_hook is _fl_exit "
                  "and not _fl_exit.calls and _fl_runtime.add_stages_inspection_hook is None")
    source = f"""
def key({", ".join(parameters + ["_fl_tensor_spec=None", "**options"])}):
    _fl_native = _fl_tensor_spec is None
{key_body}
    return {key_expr}


def run({", ".join(parameters + ["grid", "warmup", "**options"])}):
    if warmup or _fl_settings.mode == "off" or grid.__class__ is not tuple or _fl_kernel.pre_run_hooks or not ({hooks_idle}):
        return _fl_fast.fallback({args}, grid, warmup, dict({all_options}))
    _fl_dev = _fl_device()
    _fl_state = _fl_states.get(_fl_dev) or _fl_fast.state(_fl_dev)
    _fl_tensor_spec = _fl_state.tensor_spec
    _fl_native = _fl_tensor_spec is None
    _fl_host = False
    try:
{key_body_in_try}
        _fl_key = {key_expr}
        _fl_entry = _fl_state.cache.get(_fl_key)
    except (_fl_Unsupported, TypeError):
        return _fl_fast.fallback({args}, grid, warmup, dict({all_options}))
    if _fl_entry is None:
        return _fl_fast.miss(_fl_state, _fl_key, {args}, grid, dict({all_options}))
    if _fl_kernel.used_global_vals and not _fl_fast.globals_same():
        return _fl_fast.fallback({args}, grid, warmup, dict({all_options}))
    if _fl_settings.mode == "check":
        _fl_fast.check(_fl_dev, _fl_entry, {args}, dict({all_options}))
    _fl_size = len(grid)
    if _fl_entry[4]:
        {direct_call}
    else:
        _fl_entry[0]({grid_args}, _fl_stream(_fl_dev), _fl_entry[1], _fl_entry[2], None, None, None, {', '.join(names)})
    return _fl_entry[3]
"""
    namespace = {f"_fl_default_{p.name}": p.default for p in params if p.default is not inspect.Parameter.empty}
    namespace.update({f"_fl_option_{name}": value for name, value in fast.defaults.items()})
    namespace.update(_fl_settings=_settings, _fl_kernel=kernel, _fl_fast=fast, _fl_states=fast.states, _fl_knobs=knobs,
                     _fl_runtime=knobs.runtime, _fl_enter=knobs.runtime.launch_enter_hook, _fl_exit=knobs.runtime.launch_exit_hook, _fl_Tensor=torch.Tensor, _fl_arg_key=arg_key, _fl_unaligned=_UNALIGNED,
                     _fl_Unsupported=Unsupported)

    # The driver is resolved on the first launch, not here: installing must not touch the device.
    def first_device():
        active = driver.active
        device = active.get_current_device()  # initialises CUDA where needed
        get_device = active.get_current_device
        if get_device is torch.cuda.current_device and torch.cuda.is_initialized():
            # What current_device returns once CUDA is initialised, without its lazy-init checks
            # (2 of its 2.3 µs a call on the H100 machine's host under cProfile).
            get_device = torch._C._cuda_getDevice
        namespace["_fl_device"], namespace["_fl_stream"] = get_device, active.get_current_stream
        return device

    namespace["_fl_device"] = first_device
    exec(source, namespace)  # noqa: S102 (generated from the kernel's own parameter names)
    fast.key = namespace["key"]
    return namespace["run"]


def installable(kernel) -> bool:
    """A compiled JITFunction whose signature the generated launcher can take."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    if not isinstance(kernel, JITFunction):
        return False
    params = kernel.signature.parameters.values()
    return all(p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
               and not p.name.startswith("_fl_") and p.name not in _RESERVED for p in params)


def install(kernel, defaults: dict) -> bool:
    """Replace ``kernel.run`` by a fast launcher that passes ``defaults`` (launch options such as
    ``enable_fp_fusion``; a launch that passes one explicitly wins). Returns False, installing
    nothing, where the fast path is not supported (see :func:`status`) or the kernel is not a
    plain JITFunction; the caller keeps Triton's ``run`` then."""
    supported, _, knob_options = _supported()
    if not supported or not installable(kernel):
        return False
    fast = FastRun(kernel, kernel.run, defaults, knob_options)
    kernel.run = fast.run
    kernel._spec_hal_fast_run = fast
    return True
