"""Launch targets: what a kernel's host function needs to know about the hardware.

Per-kernel launch configs live beside each kernel (``kernels/<family>.py``) as small functions of a
:class:`KernelTarget`; the vendor decides the table (AMD runs wave64, so the same thread count is
half as many warps), the SM/CU count decides how far a small batch is split.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from spec_hal.capabilities import Capabilities

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

    @classmethod
    def for_arch(cls, arch: str, *, multiprocessors: int = 132) -> "KernelTarget":
        """A target for offline compilation: "sm_90" is NVIDIA, "gfx942" is AMD (wave64)."""
        if arch.startswith("gfx"):
            return cls("amd", arch, 64, multiprocessors)
        return cls("nvidia", arch, 32, multiprocessors)
