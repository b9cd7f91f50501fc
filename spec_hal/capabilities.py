"""Capability probing: what this machine can run, found lazily and cached.

Probing is split in two so that it can be tested without the hardware:

* :func:`read_device_facts` / :func:`read_triton_facts` gather raw facts from torch and Triton
  (this is the only place that touches a device, and only when :func:`probe` is first called);
* :func:`capabilities_from` is a pure function from those facts to a frozen
  :class:`Capabilities`. Tests feed it simulated facts (``SIMULATED_DEVICES``: an H100, an MI300X,
  an MI355X, a CPU-only machine, a machine without Triton).

Importing spec_hal never calls any of this; ``torch.cuda.is_initialized()`` stays false until an
op or :func:`probe` is used on a GPU.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
import threading
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = [
    "ARCH_TABLE",
    "ArchInfo",
    "Capabilities",
    "GraphSupport",
    "arch_info",
    "graph_support",
    "DeviceFacts",
    "TritonFacts",
    "SIMULATED_DEVICES",
    "capabilities_from",
    "normalize_arch",
    "probe",
    "reset_probe_cache",
]


@dataclass(frozen=True)
class DeviceFacts:
    """Raw facts about one device, as torch reports them (or as a test simulates them)."""

    device: str  # "cpu", "cuda:0", ...
    is_hip: bool = False  # torch build is ROCm (torch.version.hip set)
    name: str = "cpu"
    raw_arch: Optional[str] = None  # "9.0" for NVIDIA, "gfx942:sramecc+:xnack-" for AMD
    multiprocessors: int = 0  # SMs on NVIDIA, CUs on AMD, cores on CPU
    warp_size: Optional[int] = None  # from device properties when torch reports it
    runtime_version: Optional[str] = None  # CUDA or HIP runtime version of the torch build


@dataclass(frozen=True)
class TritonFacts:
    """What the installed Triton is, without compiling anything."""

    version: Optional[str]  # None: not importable
    import_error: Optional[str] = None
    active_backend: Optional[str] = None  # "cuda" or "hip" for the active driver, if probed


@dataclass(frozen=True)
class Capabilities:
    """What a device and the installed software can do. Frozen; one per device, cached.

    ``backend`` is the built-in backend family the device belongs to ("cuda", "rocm" or "cpu");
    selection (:mod:`spec_hal.selection`) decides which backend actually runs.
    """

    backend: str
    device: str
    device_name: str
    arch: Optional[str]
    warp_size: int
    multiprocessors: int
    torch_version: str
    runtime_version: Optional[str]
    triton_version: Optional[str]
    triton_usable: bool
    triton_reason: str
    fp8_dtype: Optional[str]
    interpreter: bool = False

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


_GFX_SUFFIX = re.compile(r":.*$")


def normalize_arch(raw_arch: Optional[str], *, is_hip: bool) -> Optional[str]:
    """Return the arch name used everywhere in spec_hal.

    NVIDIA "9.0" / (9, 0) becomes "sm_90", "10.0" becomes "sm_100"; AMD "gfx942:sramecc+:xnack-"
    becomes "gfx942" (the feature suffixes do not change which kernels we build).
    """
    if raw_arch is None:
        return None
    raw_arch = raw_arch.strip()
    if is_hip or raw_arch.startswith("gfx"):
        return _GFX_SUFFIX.sub("", raw_arch)
    if raw_arch.startswith("sm_"):
        return raw_arch
    major, _, minor = raw_arch.partition(".")
    return f"sm_{int(major)}{int(minor or 0)}"


@dataclass(frozen=True)
class ArchInfo:
    """Published facts about one GPU architecture that kernels and the compile matrix depend on.

    ``multiprocessors`` is the SM/CU count torch reports for the first product listed (one
    device; an MI250X is two gfx90a devices of 110 CUs each). ``shared_bytes`` is the most
    shared memory (NVIDIA, with the opt-in carve-out) or LDS (AMD) one program (block /
    workgroup) may use: the compile matrix fails a kernel that needs more.
    """

    arch: str
    vendor: str  # "nvidia" or "amd"
    products: tuple[str, ...]
    multiprocessors: int
    warp_size: int
    shared_bytes: int
    fp8_dtype: Optional[str]
    max_threads_per_program: int = 1024

    @property
    def label(self) -> str:
        return f"{self.arch} ({' / '.join(self.products)}): {self.multiprocessors} {'CUs' if self.vendor == 'amd' else 'SMs'}, " \
            f"{self.shared_bytes // 1024} KiB {'LDS' if self.vendor == 'amd' else 'shared memory'} per program, " \
            f"{'wave' if self.vendor == 'amd' else 'warp '}{self.warp_size}, fp8 {self.fp8_dtype or 'none'}"


# NOTE: sources are the vendors' data sheets and tuning guides (CUDA C Programming Guide
# "Compute capabilities" table; AMD CDNA2/CDNA3/CDNA4 ISA guides and Instinct data sheets).
# gfx942 is MI300X, MI300A and MI325X; gfx950 is MI350X and MI355X (160 KiB LDS, OCP fp8).
ARCH_TABLE: dict[str, ArchInfo] = {
    info.arch: info
    for info in (
        ArchInfo("sm_80", "nvidia", ("A100",), 108, 32, 163 * 1024, None),
        ArchInfo("sm_90", "nvidia", ("H100 SXM", "H200"), 132, 32, 227 * 1024, "float8_e4m3fn"),
        ArchInfo("sm_100", "nvidia", ("B200",), 148, 32, 227 * 1024, "float8_e4m3fn"),
        ArchInfo("gfx90a", "amd", ("MI250X", "MI250", "MI210"), 110, 64, 64 * 1024, None),
        ArchInfo("gfx942", "amd", ("MI300X", "MI325X", "MI300A"), 304, 64, 64 * 1024, "float8_e4m3fnuz"),
        ArchInfo("gfx950", "amd", ("MI355X", "MI350X"), 256, 64, 160 * 1024, "float8_e4m3fn"),
    )
}


def arch_info(arch: Optional[str]) -> Optional[ArchInfo]:
    """The :data:`ARCH_TABLE` entry for a normalised arch name, or None if not tabulated."""
    return ARCH_TABLE.get(arch) if arch else None


def _fp8_dtype_for(arch: Optional[str]) -> Optional[str]:
    """The fp8 e4m3 flavour the hardware computes in natively, or None.

    MI300 (gfx940/941/942) uses the "fnuz" encoding (no negative zero, bias 8); MI350 (gfx950)
    and NVIDIA Ada/Hopper/Blackwell use OCP e4m3fn. Ampere and MI200 have no fp8 units.
    Tabulated arches answer from :data:`ARCH_TABLE`; the rules cover the rest.
    """
    if arch is None:
        return None
    if arch in ARCH_TABLE:
        return ARCH_TABLE[arch].fp8_dtype
    if arch in ("gfx940", "gfx941"):
        return "float8_e4m3fnuz"
    if arch.startswith("gfx95") or arch.startswith("gfx12"):
        return "float8_e4m3fn"
    if arch.startswith("sm_"):
        return "float8_e4m3fn" if int(arch[3:]) >= 89 else None
    return None


def _warp_size_for(facts: DeviceFacts, arch: Optional[str]) -> int:
    if facts.warp_size:
        return facts.warp_size
    if facts.is_hip and arch is not None and arch.startswith("gfx9"):
        return 64  # CDNA (MI200/MI300/MI350) runs wave64
    return 32


def _triton_usability(facts: DeviceFacts, triton: TritonFacts) -> tuple[bool, str]:
    if triton.version is None:
        return False, f"triton is not importable ({triton.import_error or 'not installed'})"
    if facts.device == "cpu":
        return False, "no GPU: Triton kernels run here only through the interpreter (TRITON_INTERPRET=1)"
    wanted = "hip" if facts.is_hip else "cuda"
    if triton.active_backend is not None and triton.active_backend != wanted:
        return False, (
            f"the installed Triton drives {triton.active_backend!r} but the device needs {wanted!r} "
            "(on ROCm use the pytorch-triton-rocm build that comes with the ROCm torch wheel)"
        )
    return True, f"triton {triton.version} targets {wanted}"


def capabilities_from(facts: DeviceFacts, triton: TritonFacts, *, torch_version: Optional[str] = None) -> Capabilities:
    """Pure function from raw facts to :class:`Capabilities` (tested with simulated devices)."""
    arch = normalize_arch(facts.raw_arch, is_hip=facts.is_hip)
    backend = "cpu" if facts.device == "cpu" else ("rocm" if facts.is_hip else "cuda")
    usable, reason = _triton_usability(facts, triton)
    return Capabilities(
        backend=backend,
        device=facts.device,
        device_name=facts.name,
        arch=arch,
        warp_size=_warp_size_for(facts, arch),
        multiprocessors=facts.multiprocessors,
        torch_version=torch_version or torch.__version__,
        runtime_version=facts.runtime_version,
        triton_version=triton.version,
        triton_usable=usable,
        triton_reason=reason,
        fp8_dtype=_fp8_dtype_for(arch),
    )


# Simulated machines for tests and `spec-hal info --simulate NAME`. Numbers are the published
# device properties (SM/CU counts) as torch reports them on those machines.
SIMULATED_DEVICES: dict[str, tuple[DeviceFacts, TritonFacts]] = {
    "h100": (
        DeviceFacts("cuda:0", False, "NVIDIA H100 80GB HBM3", "9.0", 132, 32, "12.8"),
        TritonFacts("3.6.0", active_backend="cuda"),
    ),
    "mi300x": (
        DeviceFacts("cuda:0", True, "AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 304, 64, "6.4"),
        TritonFacts("3.6.0", active_backend="hip"),
    ),
    "mi250x": (
        DeviceFacts("cuda:0", True, "AMD Instinct MI250X", "gfx90a:sramecc+:xnack-", 110, 64, "6.4"),
        TritonFacts("3.6.0", active_backend="hip"),
    ),
    "mi355x": (
        DeviceFacts("cuda:0", True, "AMD Instinct MI355X", "gfx950:sramecc+:xnack-", 256, 64, "7.0"),
        TritonFacts("3.6.0", active_backend="hip"),
    ),
    "cpu": (DeviceFacts("cpu", False, "cpu", None, 16), TritonFacts("3.9.0")),
    "cpu-no-triton": (
        DeviceFacts("cpu", False, "cpu", None, 16),
        TritonFacts(None, import_error="No module named 'triton'"),
    ),
}


def _installed_version(*distributions: str) -> Optional[str]:
    """The version of the first installed distribution among ``distributions`` (no import)."""
    from importlib import metadata

    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def read_triton_facts(*, query_driver: bool) -> TritonFacts:
    """Find the installed Triton. Only with ``query_driver`` is the active GPU driver asked, and
    only then is Triton imported (about 200 ms): a CPU probe reads the version from the package
    metadata, so the cpu backend never imports Triton."""
    if importlib.util.find_spec("triton") is None:
        return TritonFacts(None, import_error="No module named 'triton'")
    if not query_driver:
        version = _installed_version("triton", "pytorch-triton-rocm", "pytorch-triton", "triton-nightly")
        if version is not None:
            return TritonFacts(version)
    try:
        import triton
    except Exception as exc:  # a broken install must not break spec_hal's import or probe
        return TritonFacts(None, import_error=f"{type(exc).__name__}: {exc}")
    active = None
    if query_driver:
        try:
            active = triton.runtime.driver.active.get_current_target().backend
        except Exception as exc:
            return TritonFacts(triton.__version__, import_error=None, active_backend=f"unusable ({exc})")
    return TritonFacts(triton.__version__, active_backend=active)


def read_device_facts(device: torch.device) -> DeviceFacts:
    """Ask torch about ``device``. For a GPU this initialises torch's CUDA/HIP state."""
    if device.type == "cpu":
        return DeviceFacts("cpu", False, "cpu", None, torch.get_num_threads())
    if device.type != "cuda":
        raise ValueError(f"built-in probing covers cpu and cuda/hip devices, not {device.type!r}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    is_hip = torch.version.hip is not None
    raw_arch = getattr(props, "gcnArchName", None) if is_hip else f"{props.major}.{props.minor}"
    return DeviceFacts(
        device=f"cuda:{index}",
        is_hip=is_hip,
        name=props.name,
        raw_arch=raw_arch,
        multiprocessors=props.multi_processor_count,
        warp_size=getattr(props, "warp_size", None),
        runtime_version=torch.version.hip if is_hip else torch.version.cuda,
    )


def default_device() -> torch.device:
    """The device spec_hal works on when none is given: the current GPU if one is visible."""
    # torch.cuda.is_available() asks the driver for a device count but does not initialise
    # torch's CUDA state (torch.cuda.is_initialized() stays false).
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


_probe_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _probe_cached(device_key: str) -> Capabilities:
    device = torch.device(device_key)
    facts = read_device_facts(device)
    triton = read_triton_facts(query_driver=device.type != "cpu")
    return capabilities_from(facts, triton)


def probe(device: "torch.device | str | None" = None) -> Capabilities:
    """Return the (cached) :class:`Capabilities` of ``device`` (default: the current GPU, else CPU).

    The first call for a GPU initialises torch's CUDA/HIP state; nothing runs at import.
    """
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _probe_lock:
        return _probe_cached(str(device))


def reset_probe_cache() -> None:
    """Forget every probe result (for tests that simulate machines)."""
    _probe_cached.cache_clear()
    _graph_support_cached.cache_clear()


@dataclass(frozen=True)
class GraphSupport:
    """Whether graph capture works on a device, proven by capturing and replaying a tiny graph."""

    mode: str  # "cuda_graph", "hip_graph" or "eager"
    reason: str


@functools.lru_cache(maxsize=None)
def _graph_support_cached(device_key: str) -> GraphSupport:
    device = torch.device(device_key)
    if device.type != "cuda":
        return GraphSupport("eager", f"{device.type} has no graph capture; the eager emulation runs")
    mode = "hip_graph" if torch.version.hip is not None else "cuda_graph"
    try:
        with torch.cuda.device(device):
            static_in = torch.arange(8, dtype=torch.float32, device=device)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                static_out = static_in * 2 + 1  # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = static_in * 2 + 1
            static_in.fill_(3.0)
            graph.replay()
            torch.cuda.synchronize(device)
            if not bool((static_out == 7.0).all()):
                return GraphSupport("eager", f"{mode} replay gave wrong results; the eager emulation runs")
    except Exception as exc:  # capture failures are reported, never raised from a probe
        return GraphSupport("eager", f"{mode} capture failed ({type(exc).__name__}: {exc}); the eager emulation runs")
    return GraphSupport(mode, f"captured and replayed a test graph on {device_key}")


def graph_support(device: "torch.device | str | None" = None) -> GraphSupport:
    """Prove graph capture on ``device`` the first time it is asked (cached afterwards)."""
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _probe_lock:
        return _graph_support_cached(str(device))
