"""The window counts' tile loop compiles without a barrier for sm_90 with the installed Triton
(offline SASS). Its 32-id groups lie along ``GROUP_AXIS``, the axis that Triton's coalescing tie
(the atomic adds' addresses have no contiguity) gives a warp's lanes first; along the other axis
every tile went through shared memory and 18-24 ``BAR.SYNC`` (Triton 3.6-3.9; BENCHMARKS.md,
forty-sixth session). A Triton that breaks the tie another way fails here, where a timing run
would only show a slower pass."""
import os
import re
import subprocess

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import spec_hal.kernels.sampling_rows as sampling_rows  # noqa: E402
from spec_hal.kernels.launch import FP_FUSION, KernelTarget  # noqa: E402

NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH_TARGET = re.compile(r"BRA[^`]*`\((\.L_x_\d+)\)")


def _production_spec():
    """The runtime-specialised bf16 launch of ``_window_counts_kernel`` (contiguous logits)."""
    for kernel, signature, constexprs, num_warps, attrs, options in sampling_rows.compile_specs(KernelTarget.for_arch("sm_90")):
        if kernel is sampling_rows._window_counts_kernel and signature["logits_ptr"] == "*bf16" and attrs:
            return kernel, signature, constexprs, num_warps, attrs, options
    raise AssertionError("no runtime-specialised bf16 spec of _window_counts_kernel")


def _loops(sass: str) -> list[list[str]]:
    """The instructions between each label and a later branch back to it."""
    items = []
    for line in sass.splitlines():
        line = line.strip()
        label = LABEL.match(line)
        if label:
            items.append(("label", label.group(1)))
        elif re.search(r"/\*[0-9a-f]{4,}\*/", line):
            items.append(("instruction", re.sub(r"/\*[0-9a-f]+\*/", "", line).strip()))  # without its address
    at = {value: index for index, (kind, value) in enumerate(items) if kind == "label"}
    loops = []
    for index, (kind, value) in enumerate(items):
        target = BRANCH_TARGET.search(value) if kind == "instruction" else None
        if target and target.group(1) in at and at[target.group(1)] < index:
            loops.append([text for kind, text in items[at[target.group(1)]:index] if kind == "instruction"])
    return loops


@pytest.mark.skipif(not os.path.exists(NVDISASM), reason="this Triton ships no nvdisasm")
def test_window_counts_tile_loop_has_no_barrier(tmp_path):
    kernel, signature, constexprs, num_warps, attrs, options = _production_spec()
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "enable_fp_fusion": FP_FUSION, **options})
    cubin = tmp_path / "window_counts.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([NVDISASM, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    loops = _loops(sass)
    # the tile loop: two windows' levels, group sums and masked adds (about 300 instructions)
    tile_loops = [body for body in loops if len(body) >= 150]
    assert tile_loops, f"no tile loop found (loop sizes {[len(body) for body in loops]})"
    for body in tile_loops:
        barriers = sum("BAR.SYNC" in text for text in body)
        shared = sum(bool(re.match(r"(@!?P\d+ )?(STS|LDS)", text)) for text in body)
        assert barriers == 0 and shared == 0, (f"GROUP_AXIS {sampling_rows.GROUP_AXIS} with Triton {triton.__version__}: the tile loop "
                                               f"({len(body)} instructions) has {barriers} barriers and {shared} shared-memory operations")
