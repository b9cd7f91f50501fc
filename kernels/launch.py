"""Launch targets: what a kernel's host function needs to know about the hardware.

Per-kernel launch configs live beside each kernel (``kernels/<family>.py``) as small functions of a
:class:`KernelTarget`; the vendor decides the table (AMD runs wave64, so the same thread count is
half as many warps), the SM/CU count decides how far a small batch is split.

Also here: :func:`install_launchers`, which every kernel module goes through once (FP fusion
pinned, the fast launcher of ``fast_launch.py`` installed), and host-code ``cdiv`` and
``next_power_of_2`` (Triton's are ConstexprFunctions, costly per call).

Write launch configs in threads per program and convert with :meth:`KernelTarget.warps`: 256
threads are 8 warps on NVIDIA and 4 wavefronts on CDNA. A config written in warps silently
doubles the threads on AMD (and can pass the 1024-thread workgroup limit there).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

from spec_hal.capabilities import ARCH_TABLE, Capabilities

VENDORS = ("nvidia", "amd", "interpreter")

# Floating-point fusion (a*b+c as one FMA) is set explicitly for every launch and every offline
# compile, so that results do not follow Triton's default (enabled up to 3.9 with a warning on
# every compile, disabled from 3.10). Off: each operation rounds separately, as the float32
# reference does; the conformance tolerances and the integer results derived from float compares
# are judged against that.
FP_FUSION = False


def install_launchers(module) -> None:
    """Launch every Triton kernel defined in ``module`` with ``enable_fp_fusion=FP_FUSION`` (a
    launch that passes it explicitly still wins), through the fast launcher of
    ``spec_hal.kernels.fast_launch`` where the installed Triton's launch path was checked (else
    Triton's own ``run``). Called once per kernel module by ``spec_hal.kernels.kernel_modules``, so
    the ``kernel[grid](...)`` call sites stay as they are; idempotent."""
    from .fast_launch import install

    for kernel in vars(module).values():
        if hasattr(kernel, "arg_names") and callable(getattr(kernel, "run", None)) and not getattr(kernel, "_fp_fusion_pinned", False):
            if not install(kernel, {"enable_fp_fusion": FP_FUSION}):
                kernel.run = functools.partial(kernel.run, enable_fp_fusion=FP_FUSION)
            kernel._fp_fusion_pinned = True


# 32-bit registers of an NVIDIA SM (sm_80 to sm_100); ptxas allows at most 255 a thread. A launch's
# register cap (``maxnreg``) is at most SM_REGISTERS // threads, so that one program still fits.
SM_REGISTERS, MAX_THREAD_REGISTERS = 65536, 255


def cdiv(numerator: int, denominator: int) -> int:
    """``triton.cdiv`` for host code. Triton's (3.5 on) is a ConstexprFunction whose every call
    unwraps its arguments, about 1 µs a call; a launch config calls it several times per op."""
    return (numerator + denominator - 1) // denominator


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for host code (see :func:`cdiv`): the least power of two >= n,
    0 for n <= 0 as Triton's."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@dataclass(frozen=True)
class KernelTarget:
    vendor: str  # "nvidia", "amd" or "interpreter"
    arch: Optional[str]
    warp_size: int
    multiprocessors: int

    def __post_init__(self):
        if self.vendor not in VENDORS:
            raise ValueError(f"vendor must be one of {VENDORS}, got {self.vendor!r}")
        # Every launch config is an lru_cache keyed by (target, sizes...): hash once, not per call.
        object.__setattr__(self, "_hash", hash((self.vendor, self.arch, self.warp_size, self.multiprocessors)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):  # rebuilt (and hashed) in the receiving process: str hashes differ between processes
        return type(self), (self.vendor, self.arch, self.warp_size, self.multiprocessors)

    @property
    def ampere_or_ada(self) -> bool:
        """NVIDIA sm_80-sm_89: ptxas kept local frames there in launches that compile clean at
        the same width on sm_90 and sm_100, so some kernels launch narrower on it."""
        return self.vendor == "nvidia" and (self.arch or "").startswith("sm_8")

    @property
    def blackwell(self) -> bool:
        """NVIDIA sm_100 and newer Blackwell parts (sm_10x): a few launches keep a narrower loop
        there, where the offline compile matrix found local frames only on sm_100."""
        return self.vendor == "nvidia" and (self.arch or "").startswith("sm_10")

    @property
    def label(self) -> str:
        return f"{self.vendor}:{self.arch or 'cpu'}"

    @classmethod
    def for_capabilities(cls, capabilities: Capabilities, *, vendor: str) -> "KernelTarget":
        return cls(vendor, capabilities.arch, capabilities.warp_size, max(capabilities.multiprocessors, 1))

    def warps(self, threads: int) -> int:
        """Warps (wavefronts on AMD) for ``threads`` threads per program; at least 1."""
        return max(1, threads // self.warp_size)

    @classmethod
    def for_arch(cls, arch: str, *, multiprocessors: Optional[int] = None) -> "KernelTarget":
        """A target for offline compilation: "sm_90" is NVIDIA, "gfx942" is AMD (wave64).

        Tabulated arches (``spec_hal.capabilities.ARCH_TABLE``) take their flagship's SM/CU count
        unless ``multiprocessors`` is given; others default to 132 SMs / 304 CUs.
        """
        info = ARCH_TABLE.get(arch)
        amd = arch.startswith("gfx")
        if multiprocessors is None:
            multiprocessors = info.multiprocessors if info else (304 if amd else 132)
        return cls("amd" if amd else "nvidia", arch, 64 if amd else 32, multiprocessors)


def runtime_specialized(target: KernelTarget, kernel, signature: dict, constexprs: dict, num_warps: int, *, values: dict):
    """A compile spec ``(kernel, signature, constexprs, num_warps, attrs)`` of a launch as Triton's
    JIT (3.6 to 3.9) specialises it at run time, for the int arguments' ``values`` (name to int;
    every int argument of ``signature``) and pointers from the torch allocator (16-byte aligned,
    under 2 GiB):

    * an int equal to 1 becomes a constexpr (a unit stride makes a load contiguous, so vectorised);
    * an int that fits in 32 bits is ``i32`` (else ``i64``); a multiple of 16 and every pointer get
      ``tt.divisibility`` 16;
    * on AMD, pointers also get ``tt.pointer_range`` 32 (buffer ops, on by default);
    * an argument the kernel lists in ``do_not_specialize`` gets none of this: an int only its
      type, a pointer no attribute (as the JIT leaves it: neither alignment nor range).

    ``attrs`` is ASTSource's: ``{(argument index,): [[attribute, value], ...]}``. The generic specs
    (no attrs) are what a launch with misaligned pointers compiles, so both kinds belong in
    ``compile_specs``.
    """
    signature, constexprs, attrs = dict(signature), dict(constexprs), {}
    ints = [name for name, kind in signature.items() if kind in ("i32", "i64")]
    if sorted(ints) != sorted(values):
        raise ValueError(f"values must give exactly the int arguments {ints}, got {sorted(values)}")
    unspecialized = {kernel.arg_names[i] if isinstance(i, int) else i for i in getattr(kernel, "do_not_specialize", ())}
    for name, kind in signature.items():
        index = (kernel.arg_names.index(name),)
        if kind.startswith("*"):
            if name not in unspecialized:
                attrs[index] = [["tt.divisibility", 16]] + ([["tt.pointer_range", 32]] if target.vendor == "amd" else [])
        elif name in unspecialized:
            signature[name] = "i32" if -2**31 <= values[name] < 2**31 else "i64"
        elif name in values and values[name] == 1:
            signature[name] = "constexpr"
            constexprs[name] = 1
        elif name in values:
            signature[name] = "i32" if -2**31 <= values[name] < 2**31 else "i64"
            if values[name] % 16 == 0:
                attrs[index] = [["tt.divisibility", 16]]
    return kernel, signature, constexprs, num_warps, attrs
