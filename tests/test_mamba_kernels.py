"""Kernels of family mamba: they compile for real GPU targets (the interpreter accepts code the
compiler rejects), and their offset arithmetic is int64 where int32 operands overflow."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGETS = {"sm_90": GPUTarget("cuda", 90, 32), "gfx942": GPUTarget("hip", "gfx942", 64)}


@pytest.mark.parametrize("arch", tuple(TARGETS))
def test_mamba_kernels_compile(arch):
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the offline compile needs compiled (not interpreted) kernels")
    from spec_hal.kernels import mamba
    from spec_hal.kernels.launch import FP_FUSION, KernelTarget

    specs = mamba.compile_specs(KernelTarget.for_arch(arch))
    assert {kernel for kernel, *_ in specs} == {mamba._scatter_state_kernel, mamba._commit_steps_kernel}
    for kernel, signature, constexprs, warps in specs:
        triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=TARGETS[arch],
                       options={"num_warps": warps, "enable_fp_fusion": FP_FUSION})


# Runs in a fresh interpreter process: TRITON_INTERPRET must be set before kernels are defined.
# ``index * stride`` with both operands int32 (as Triton types a small stride and a loaded int32
# slot) overflows; the kernels' _offset must give the exact product, and the unguarded product
# must not (or this probe could not tell them apart).
PROBE = textwrap.dedent("""
    import json, torch, triton, triton.language as tl
    from spec_hal.kernels.mamba import _offset

    @triton.jit
    def probe(index_ptr, out_ptr, stride, CAST: tl.constexpr):
        index = tl.load(index_ptr + tl.arange(0, 4))
        if CAST:
            offset = _offset(index, stride)
        else:
            offset = (index * stride).to(tl.int64)
        tl.store(out_ptr + tl.arange(0, 4), offset)

    index = torch.tensor([0, 1, 4, 2047], dtype=torch.int32)
    results = {}
    for cast in (True, False):
        out = torch.zeros(4, dtype=torch.int64)
        probe[(1,)](index, out, 2**29 + 16, CAST=cast)
        results[str(cast)] = out.tolist()
    print(json.dumps(results))
""")


def test_offset_arithmetic_is_int64():
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    offsets = json.loads(result.stdout.strip().splitlines()[-1])
    expected = [i * (2**29 + 16) for i in (0, 1, 4, 2047)]
    assert offsets["True"] == expected
    assert offsets["False"] != expected, "the probe cannot tell int32 from int64 arithmetic"
