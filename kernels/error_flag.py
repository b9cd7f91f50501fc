"""Device helper of the error flag (spec_hal/error_flag.py): record an invalid value from a kernel.

``record_invalid(flag_ptr, code, invalid, index)``: for every lane where ``invalid`` holds, keep
``code + index`` in the flag with an atomic min (any shape of ``invalid``/``index``; lanes that
are valid do no memory access, so a clean launch costs one predicated-off atomic). Host code
passes ``spec_hal.error_flag.flag(device)`` as ``flag_ptr`` and ``spec_hal.error_flag.code(op,
argument)`` as ``code``.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def record_invalid(flag_ptr, code, invalid, index):
    value = code + index.to(tl.int64)
    tl.atomic_min(flag_ptr + tl.zeros_like(index).to(tl.int64), value, mask=invalid != 0)


# code(op, FLAGGED[op][j]) == code(op, FLAGGED[op][0]) + j * ARGUMENT_STEP: kernels take the op's
# first code and add this for their other arguments.
ARGUMENT_STEP = tl.constexpr(2**40)
