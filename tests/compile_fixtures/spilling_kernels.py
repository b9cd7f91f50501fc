"""A kernel module (same shape as kernels/<family>.py) whose kernel spills on every target.

Two 4096-element fp32 vectors stay live across a reduction in one warp/wavefront, and the
register budget is capped (``maxnreg`` on NVIDIA, ``waves_per_eu`` on AMD), so ptxas and the
AMDGPU backend must spill. tests/test_compile_matrix.py uses it to prove the matrix fails then.
"""
import triton
import triton.language as tl


@triton.jit
def register_hog(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    a = tl.load(x_ptr + offsets)
    b = tl.load(x_ptr + BLOCK + offsets)
    total = tl.sum(a * b, axis=0)
    tl.store(y_ptr + offsets, a * total + b)


@triton.jit
def small_copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


def compile_specs(target):
    capped = {"waves_per_eu": 8} if target.vendor == "amd" else {"maxnreg": 32}
    return [
        (register_hog, {"x_ptr": "*fp32", "y_ptr": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 4096}, 1, {}, capped),
        (small_copy, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 1024},
         target.warps(128)),
    ]
