"""Every kernel the compaction and kv families launch compiles offline for sm_90 and gfx942
(the interpreter accepts code the GPU compilers reject)."""
import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from spec_hal.compile_matrix import _spec_parts  # noqa: E402
from spec_hal.kernels import compaction, kv  # noqa: E402
from spec_hal.kernels.launch import FP_FUSION, KernelTarget  # noqa: E402

TARGETS = {"sm_90": GPUTarget("cuda", 90, 32), "gfx942": GPUTarget("hip", "gfx942", 64)}


@pytest.mark.parametrize("module", (compaction, kv), ids=("compaction", "kv"))
@pytest.mark.parametrize("arch", TARGETS)
def test_kernels_compile_offline(module, arch):
    specs = module.compile_specs(KernelTarget.for_arch(arch))
    assert specs
    seen = set()
    for spec in specs:
        kernel, signature, constexprs, num_warps, attrs, _ = _spec_parts(spec)
        key = (kernel.fn.__name__, tuple(signature.values()), tuple(constexprs.items()), num_warps, repr(sorted(attrs.items())))
        if key in seen:
            continue
        seen.add(key)
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs or None)
        compiled = triton.compile(source, target=TARGETS[arch], options={"num_warps": num_warps, "enable_fp_fusion": FP_FUSION})
        assert compiled.asm, f"{kernel.fn.__name__} produced no code for {arch}"
