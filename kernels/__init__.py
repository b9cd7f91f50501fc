"""Triton kernels shared by the cuda, rocm and triton-interpret backends (``spec_hal.kernels``).

One module per op family (``kernels/topk.py``, ...). Each defines ``PROVIDERS``: op name to
``(host_function, description)``; a host function takes the op's arguments plus ``target=`` (a
:class:`~spec_hal.kernels.launch.KernelTarget`) and picks its launch config from the target.
Each also defines ``compile_specs(target)`` listing every (kernel, signature, constexprs,
num_warps[, attrs]) the backends launch, which the offline compile matrix builds for every GPU
target as ``ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)``. The
optional fifth element is ASTSource's ``attrs`` (``{(argument index,): [["tt.divisibility", 16]]}``):
the runtime specialisation Triton's JIT applies (see ``launch.runtime_specialized``); a 4-tuple is
a generic launch (attrs None). An optional sixth element adds compile options (``maxnreg``...).

Nothing here is imported by ``import spec_hal``; Triton is imported when a Triton backend is built.
"""
from __future__ import annotations

import importlib
import os
from typing import Optional

KERNEL_MODULES = (
    "spec_hal.kernels.masks",
    "spec_hal.kernels.topk",
    "spec_hal.kernels.mamba",
    "spec_hal.kernels.verify",
    "spec_hal.kernels.compaction",
    "spec_hal.kernels.kv",
    "spec_hal.kernels.tree",
    "spec_hal.kernels.ragged",
    "spec_hal.kernels.tree_sampling",
    "spec_hal.kernels.sampling_rows",
    "spec_hal.kernels.sampling",
)

_loaded_mode: Optional[str] = None


def loaded_mode() -> Optional[str]:
    """None before the kernels were imported, else "interpreter" or "compiled"."""
    return _loaded_mode


def kernel_modules() -> list:
    global _loaded_mode
    mode = "interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled"
    from .launch import install_launchers

    modules = [importlib.import_module(name) for name in KERNEL_MODULES]
    for module in modules:
        install_launchers(module)
    _loaded_mode = _loaded_mode or mode
    return modules


def kernel_providers() -> dict:
    """Op name to (host function, description) over every kernel module."""
    providers = {}
    for module in kernel_modules():
        providers.update(module.PROVIDERS)
    return providers


def launch_summary(target) -> list[str]:
    """One line per kernel family: the launch configs it would use on ``target``."""
    lines = []
    for module in kernel_modules():
        lines.extend(f"{module.__name__.rsplit('.', 1)[1]}: {line}" for line in module.describe_launch(target))
    return lines
