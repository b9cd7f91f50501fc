"""Launch targets: what a kernel's host function needs to know about the hardware.

Per-kernel launch configs live beside each kernel (``kernels/<family>.py``) as small functions of a
:class:`KernelTarget`; the vendor decides the table (AMD runs wave64, so the same thread count is
half as many warps), the SM/CU count decides how far a small batch is split.

Write launch configs in threads per program and convert with :meth:`KernelTarget.warps`: 256
threads are 8 warps on NVIDIA and 4 wavefronts on CDNA. A config written in warps silently
doubles the threads on AMD (and can pass the 1024-thread workgroup limit there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from spec_hal.capabilities import ARCH_TABLE, Capabilities

VENDORS = ("nvidia", "amd", "interpreter")


@dataclass(frozen=True)
class KernelTarget:
    vendor: str  # "nvidia", "amd" or "interpreter"
    arch: Optional[str]
    warp_size: int
    multiprocessors: int

    def __post_init__(self):
        if self.vendor not in VENDORS:
            raise ValueError(f"vendor must be one of {VENDORS}, got {self.vendor!r}")

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
