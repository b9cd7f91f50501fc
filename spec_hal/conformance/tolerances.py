"""Float tolerances of every op output, as data: (op, output) -> {input dtype: (atol, rtol)}.

Integer outputs have no entry: they must be bit-identical to the reference. A float output is
compared with ``|actual - expected| <= atol + rtol * |expected|`` elementwise.
"""
from __future__ import annotations

import torch

TOLERANCES: dict[tuple[str, str], dict[str, tuple[float, float]]] = {
    # Probabilities are accumulated in float32 from float32-converted logits whatever the input
    # dtype; kernels sum per tile then merge, the reference sums the row at once.
    ("draft_topk", "probs"): {"float32": (1e-6, 2e-5), "bfloat16": (1e-6, 2e-5), "float16": (1e-6, 2e-5), "float64": (1e-6, 2e-5)},
}


def assert_close(op: str, output: str, actual: torch.Tensor, expected: torch.Tensor, *, input_dtype: torch.dtype) -> None:
    """Compare a float output with the reference within the tolerance kept for it."""
    atol, rtol = TOLERANCES[(op, output)][str(input_dtype).replace("torch.", "")]
    torch.testing.assert_close(actual.cpu(), expected.cpu(), atol=atol, rtol=rtol, equal_nan=True,
                               msg=lambda m: f"{op}.{output} differs from the reference beyond atol={atol}, rtol={rtol}: {m}")
