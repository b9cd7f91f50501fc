"""Every launch of kernels/tree.py compiles offline for sm_90 and gfx942 (the interpreter accepts
code that the GPU compilers reject, e.g. loop-carried variables that change type)."""
import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from spec_hal.kernels import tree as tree_kernels  # noqa: E402
from spec_hal.kernels.launch import FP_FUSION, KernelTarget  # noqa: E402

GPU_TARGETS = {"sm_90": GPUTarget("cuda", 90, 32), "gfx942": GPUTarget("hip", "gfx942", 64)}


@pytest.mark.parametrize("arch", sorted(GPU_TARGETS))
def test_tree_kernels_compile(arch):
    specs = tree_kernels.compile_specs(KernelTarget.for_arch(arch))
    # build_tree: N in {2..64} x mask modes (no bitpacked at N = 64) x {int32, int64} ids;
    # expand_tree: K in {1, 2, 4, 8, 16, 64} x {step 0, later} x 3 probability dtypes x 2 id dtypes
    assert sum(kernel is tree_kernels._build_tree_kernel for kernel, *_ in specs) == 34
    assert sum(kernel is tree_kernels._expand_kernel for kernel, *_ in specs) == 72
    assert sum(kernel is tree_kernels._organize_kernel for kernel, *_ in specs) == 6  # candidates 2 .. 4096
    for kernel, signature, constexprs, num_warps in specs:
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(source, target=GPU_TARGETS[arch], options={"num_warps": num_warps, "enable_fp_fusion": FP_FUSION})
        assert compiled.asm, f"{arch}: no code for {constexprs}"
