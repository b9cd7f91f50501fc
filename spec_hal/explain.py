"""The human-readable report behind ``spec_hal.explain()`` and ``spec-hal info``."""
from __future__ import annotations

import os
import platform
from typing import Optional

import torch

from .capabilities import SIMULATED_DEVICES, Capabilities, arch_info, capabilities_from, graph_support
from .errors import BackendUnavailable
from .selection import ENV_VAR, available_backends, choose, get_backend


def _capability_lines(caps: Capabilities) -> list[str]:
    return [
        f"  device:          {caps.device} ({caps.device_name})",
        f"  arch:            {caps.arch or '-'}   warp size {caps.warp_size}   multiprocessors {caps.multiprocessors}",
        f"  torch:           {caps.torch_version}   runtime {caps.runtime_version or '-'}",
        f"  triton:          {caps.triton_version or 'not installed'}   usable: {caps.triton_usable} ({caps.triton_reason})",
        f"  fp8:             {caps.fp8_dtype or 'none'}",
    ]


def explain(name: Optional[str] = None, device=None) -> str:
    """What was probed, which backend is chosen and why, and which provider runs each op."""
    from .capabilities import probe

    lines = [f"spec_hal on {platform.machine()} / Python {platform.python_version()} / torch {torch.__version__}"]
    env = os.environ.get(ENV_VAR)
    lines.append(f"{ENV_VAR}: {env if env else '(unset)'}")
    lines.append("backends:")
    for backend_name, reason in available_backends(device).items():
        lines.append(f"  {backend_name:<17} {'usable' if reason is None else 'unavailable: ' + reason}")
    try:
        choice = choose(name, device)
        backend = get_backend(name, device)
    except BackendUnavailable as exc:
        lines.append(f"selected: none ({exc})")
        raise BackendUnavailable("\n".join(lines)) from exc
    lines.append(f"selected: {backend.name} ({choice.why})")
    lines.extend(_capability_lines(backend.capabilities))
    graphs = graph_support(backend.device) if not backend.capabilities.interpreter else graph_support("cpu")
    lines.append(f"  graphs:          {graphs.mode} ({graphs.reason})")
    if backend.device.type == "cpu" and backend.name == "cpu":
        gpu = probe() if torch.cuda.is_available() else None
        if gpu is not None:
            lines.append(f"  (a GPU is visible: {gpu.device_name})")
    lines.append("providers:")
    for op, description in backend.describe_providers().items():
        lines.append(f"  {op:<22} {description}")
    return "\n".join(lines)


SIMULATED_TORCH = {"cuda": "simulated CUDA build", "rocm": "simulated ROCm (HIP) build", "cpu": "simulated CPU build"}


def _simulated_selection(caps: Capabilities, backend: Optional[str]) -> str:
    """Which backend the simulated machine would run, honouring an explicit ``backend`` name."""
    gpu_needs_triton = caps.backend != "cpu" and not caps.triton_usable
    if backend is None:
        if gpu_needs_triton:
            return f"cpu (the {caps.backend} backend needs Triton: {caps.triton_reason})"
        return caps.backend
    if backend == "cpu":
        return "cpu (asked for by name)"
    if backend == "triton-interpret":
        if caps.triton_version is None:
            raise ValueError(f"backend 'triton-interpret' is unavailable on the simulated machine: {caps.triton_reason}")
        return "triton-interpret (asked for by name; kernels interpreted on cpu tensors)"
    if backend != caps.backend:
        raise ValueError(f"backend {backend!r} is unavailable on the simulated machine: "
                         f"its device belongs to the {caps.backend!r} backend")
    if gpu_needs_triton:
        raise ValueError(f"backend {backend!r} is unavailable on the simulated machine: {caps.triton_reason}")
    return f"{backend} (asked for by name)"


def explain_simulated(machine: str, backend: Optional[str] = None) -> str:
    """The same report for a simulated machine (``spec-hal info --simulate mi300x [--backend NAME]``).

    Only simulated facts are shown (the host's torch build and devices are not); nothing runs.
    Raises ValueError for an unknown machine or a backend the simulated machine cannot run.
    """
    if machine not in SIMULATED_DEVICES:
        raise ValueError(f"unknown simulated machine {machine!r}; known: {', '.join(SIMULATED_DEVICES)}")
    facts, triton = SIMULATED_DEVICES[machine]
    caps = capabilities_from(facts, triton, torch_version=SIMULATED_TORCH[
        "cpu" if facts.device == "cpu" else ("rocm" if facts.is_hip else "cuda")])
    lines = [f"simulated machine: {machine} (probe facts as torch reports them on it; nothing executed)"]
    lines.append(f"selected: {_simulated_selection(caps, backend)}")
    lines.extend(_capability_lines(caps))
    info = arch_info(caps.arch)
    if info is not None:
        lines.append(f"  arch table:      {info.label}")
    if caps.backend in ("cuda", "rocm"):
        mode = "hip_graph" if caps.backend == "rocm" else "cuda_graph"
        lines.append(f"  graphs:          {mode} through the torch.cuda graph API (proven by a capture on first use; not run here)")
    if caps.backend in ("cuda", "rocm") and caps.triton_usable and backend in (None, caps.backend):
        from .kernels.launch import KernelTarget

        target = KernelTarget.for_capabilities(caps, vendor="amd" if caps.backend == "rocm" else "nvidia")
        lines.append(f"launch configs for {target.label} (warp size {target.warp_size}):")
        try:
            from .kernels import launch_summary

            lines.extend("  " + line for line in launch_summary(target))
        except ImportError as exc:
            lines.append(f"  (not shown: {exc})")
    return "\n".join(lines)
