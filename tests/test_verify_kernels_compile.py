"""Every kernel launch of family verify compiles offline for sm_90 and gfx942 (the interpreter
accepts code that the GPU compilers reject, e.g. loop-carried values that change type), generic
and with the runtime specialisations of contiguous inputs (unit strides as constexprs, multiples
of 16 as tt.divisibility): a (4, 8, 16) sampling launch once lowered only without them."""
import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import spec_hal.kernels.verify as verify_kernels  # noqa: E402
from spec_hal.kernels.launch import FP_FUSION, KernelTarget  # noqa: E402

TARGETS = {"sm_90": GPUTarget("cuda", 90, 32), "gfx942": GPUTarget("hip", "gfx942", 64)}


@pytest.mark.parametrize("arch", sorted(TARGETS))
def test_verify_kernels_compile(arch):
    specs = verify_kernels.compile_specs(KernelTarget.for_arch(arch))
    seen = set()
    for kernel, signature, constexprs, num_warps, *attrs in specs:
        attrs = attrs[0] if attrs else None
        key = (kernel.fn.__name__, tuple(sorted(signature.items())), tuple(sorted(constexprs.items())), num_warps, repr(attrs))
        if key in seen:
            continue
        seen.add(key)
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        triton.compile(source, target=TARGETS[arch], options={"num_warps": num_warps, "enable_fp_fusion": FP_FUSION})
    assert len(seen) >= 5
    assert any(key[-1] != 'None' for key in seen), "no runtime-specialised spec"


def test_runtime_specialization_of_the_conformance_sampling_launch():
    """The (bs 4, N 8, V 16, S 3) launch: the unit vocabulary stride is a constexpr, V and the row
    strides are multiples of 16, nodes = 8 is not."""
    specs = [spec for spec in verify_kernels.compile_specs(KernelTarget.for_arch("sm_90"))
             if spec[0] is verify_kernels._sampling_walk_kernel and len(spec) == 5 and spec[2]["N_PAD"] == 8
             and spec[2]["BLOCK_R"] == 1 and spec[2]["W_PAD"] == 4 and not spec[2]["WALK_ONLY"]]
    assert len(specs) == 1
    kernel, signature, constexprs, _, attrs = specs[0]
    index = {name: (kernel.arg_names.index(name),) for name in signature}
    assert signature["stride_pv"] == "constexpr" and constexprs["stride_pv"] == 1
    assert attrs[index["vocab"]] == attrs[index["stride_pn"]] == attrs[index["probs_ptr"]] == [["tt.divisibility", 16]]
    assert index["nodes"] not in attrs and signature["stride_pb"] == "i32"
