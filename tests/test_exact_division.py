"""``kernels/tree_sampling.py``'s division-free float64 arithmetic must give exactly the correctly
rounded results of dividing, over the kernel's domain: a an integer in [0, 2^40] (a quantised
residual), b = max(float64(mass), 1) for an int64 mass (any float64 in [1, 2^63], rounded above
2^53).

* ``_reciprocal(b)``: a bit-level guess, four Newton steps, then the nearer of y and its
  neighbour by exact remainders: must be ``1 / b``;
* ``_divide(a, b, 1 / b)``: q = a y, then q + (a - b q) y (Markstein's correction): must be ``a / b``.

Two independent checks of each:
* the arithmetic itself, in exact rationals (Python's float(Fraction) rounds correctly, so an fma
  is emulated exactly), against Python's correctly rounded ``/``, on random and adversarial
  operands (b a power of two or next to one, all-ones significands, a a multiple of b...);
* the Triton helpers under the interpreter (its fma rounds once from Triton 3.9; older
  interpreters take the helpers' division branches, which are then what is checked) against
  torch's float64 division, on a million random operands and the adversarial ones.
"""
from __future__ import annotations

import random
import struct
import textwrap
from fractions import Fraction

import pytest

from interpreter_probe import run_interpreter_probe


def _fma(x: float, y: float, z: float) -> float:
    """x * y + z rounded once (exact rational arithmetic, then one correct rounding)."""
    return float(Fraction(x) * Fraction(y) + Fraction(z))


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def _reciprocal(b: float) -> float:
    """kernels/tree_sampling.py's ``_reciprocal``, step by step in exact arithmetic."""
    from spec_hal.kernels.tree_sampling import RECIPROCAL_SEED

    y = _float(RECIPROCAL_SEED.value - _bits(b))
    for _ in range(4):
        y = _fma(_fma(-b, y, 1.0), y, y)
    for _ in range(2):
        remainder = _fma(-b, y, 1.0)
        neighbour = _float(_bits(y) + (1 if remainder > 0 else -1))
        y = neighbour if abs(_fma(-b, neighbour, 1.0)) < abs(remainder) else y
    return y


def _markstein(a: float, b: float) -> float:
    """kernels/tree_sampling.py's ``_divide`` in exact arithmetic: q = a y, then q + (a - b q) y."""
    reciprocal = 1.0 / b
    q = a * reciprocal
    return _fma(_fma(-b, q, a), reciprocal, q)


def _adversarial_operands():
    """(a, b) pairs at the edges of the domain and of binary rounding."""
    dividends = [0.0, 1.0, 2.0, 3.0, 2.0**40, 2.0**40 - 1, 2.0**39 + 1, 1099511627775.0, 12345678901.0]
    divisors = [1.0, 2.0, 3.0, 7.0, 2.0**53, 2.0**53 + 2, 2.0**63, 2.0**40, 2.0**40 + 1, 2.0**41 - 1, 1.0 + 2.0**-52]
    for k in range(1, 63):
        divisors += [2.0**k - 1 if k <= 53 else 2.0**k - 2.0**(k - 53), 2.0**k + 1 if k <= 52 else 2.0**k + 2.0**(k - 52)]
        divisors += [float(int("1" * min(k, 53), 2) << max(k - 53, 0))]  # all-ones significands
    pairs = [(a, b) for a in dividends for b in divisors if a <= 2.0**40]
    pairs += [(b * m, b) for b in (3.0, 7.0, 1023.0, 2.0**20 + 1) for m in (1.0, 5.0, 2.0**10) if b * m <= 2.0**40]
    return pairs


def _random_operands(count: int, seed: int):
    generator = random.Random(seed)
    pairs = []
    for _ in range(count):
        a = float(generator.randrange(0, 2**40 + 1)) if generator.random() < 0.8 else float(generator.randrange(0, 2**12))
        b = max(float(generator.randrange(0, 2 ** generator.randrange(1, 64))), 1.0)
        pairs.append((a, b))
    return pairs


def test_reciprocal_is_the_correctly_rounded_reciprocal():
    pytest.importorskip("triton")  # the seed constant lives in the Triton kernel module
    divisors = sorted({b for _, b in _adversarial_operands()}) + [b for _, b in _random_operands(20000, seed=2)]
    divisors += [float(random.Random(4).randrange(2**52, 2**53)) * 2.0 ** k for k in range(-52, 11)]  # not integers too
    wrong = [b for b in divisors if _reciprocal(b) != 1.0 / b]
    assert not wrong, f"{len(wrong)} of {len(divisors)} reciprocals differ, e.g. {wrong[:3]}"


def test_markstein_correction_is_the_correctly_rounded_quotient():
    pairs = _adversarial_operands() + _random_operands(30000, seed=1)
    wrong = [(a, b) for a, b in pairs if _markstein(a, b) != a / b]
    assert not wrong, f"{len(wrong)} of {len(pairs)} quotients differ, e.g. {wrong[:3]}"


PROBE = textwrap.dedent("""
    import json, random, torch
    import triton
    import triton.language as tl
    from spec_hal.kernels.launch import KernelTarget
    from spec_hal.kernels.tree_sampling import _divide, _reciprocal, fma_rounds_once

    @triton.jit
    def divide_kernel(a_ptr, b_ptr, out_ptr, reciprocal_ptr, n, BLOCK: tl.constexpr, FMA_DIVIDE: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offsets < n
        a = tl.load(a_ptr + offsets, mask=ok, other=0.0)
        b = tl.load(b_ptr + offsets, mask=ok, other=1.0)
        reciprocal = _reciprocal(b, FMA_DIVIDE)
        tl.store(reciprocal_ptr + offsets, reciprocal, mask=ok)
        tl.store(out_ptr + offsets, _divide(a, b, reciprocal, FMA_DIVIDE), mask=ok)

    ADVERSARIAL
    generator = torch.Generator().manual_seed(7)
    count = 1 << 20
    a = torch.randint(0, 2**40 + 1, (count,), generator=generator).double()
    exponents = torch.randint(1, 64, (count,), generator=generator)
    b = torch.clamp((torch.rand(count, generator=generator, dtype=torch.float64) * 2.0 ** exponents.double()).floor(), min=1.0)
    pairs = adversarial()
    a = torch.cat([a, torch.tensor([p[0] for p in pairs], dtype=torch.float64)])
    b = torch.cat([b, torch.tensor([p[1] for p in pairs], dtype=torch.float64)])
    out, reciprocal = torch.empty_like(a), torch.empty_like(a)
    fma_divide = fma_rounds_once(KernelTarget("interpreter", None, 1, 1))
    divide_kernel[(triton.cdiv(a.numel(), 65536),)](a, b, out, reciprocal, a.numel(), BLOCK=65536, FMA_DIVIDE=fma_divide)
    print(json.dumps({"fma_divide": fma_divide, "count": a.numel(), "differ": int((out != a / b).sum()),
                      "reciprocals_differ": int((reciprocal != 1.0 / b).sum())}))
""")


def test_divide_helper_under_the_interpreter():
    import inspect

    source = PROBE.replace("ADVERSARIAL", textwrap.dedent(inspect.getsource(_adversarial_operands)).replace(
        "def _adversarial_operands", "def adversarial"))
    result = run_interpreter_probe(source)
    assert result["count"] > 1 << 20
    assert result["differ"] == 0 and result["reciprocals_differ"] == 0, result
