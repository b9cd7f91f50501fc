"""Every kernel launch of family verify compiles offline for sm_90 and gfx942 (the interpreter
accepts code that the GPU compilers reject, e.g. loop-carried values that change type)."""
import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import spec_hal.kernels.verify as verify_kernels  # noqa: E402
from spec_hal.kernels.launch import KernelTarget  # noqa: E402

TARGETS = {"sm_90": GPUTarget("cuda", 90, 32), "gfx942": GPUTarget("hip", "gfx942", 64)}


@pytest.mark.parametrize("arch", sorted(TARGETS))
def test_verify_kernels_compile(arch):
    specs = verify_kernels.compile_specs(KernelTarget.for_arch(arch))
    seen = set()
    for kernel, signature, constexprs, num_warps in specs:
        key = (kernel.fn.__name__, tuple(sorted(signature.items())), tuple(sorted(constexprs.items())), num_warps)
        if key in seen:
            continue
        seen.add(key)
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        triton.compile(source, target=TARGETS[arch], options={"num_warps": num_warps})
    assert len(seen) >= 5
