"""Seeded input generators shared by the conformance cases."""
from __future__ import annotations

import torch

# Row patterns for logits, cycled over the rows of a batch. The first rows carry the hardest
# cases so that even bs = 1 and bs = 3 see ties and NaN/-inf.
LOGIT_ROW_PATTERNS = (
    "ties",  # small integers: many exact ties, including at the top
    "nan_neginf",  # normal values with NaN and -inf sprinkled in
    "normal",
    "max_at_tail",  # the unique max sits in the last column (an unmasked tail misses it)
    "all_equal",
    "all_neginf",
    "posinf",  # two +inf entries (they tie; the lower id wins)
    "all_nan",
)


def logits_rows(rows: int, vocab: int, *, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(rows, vocab) CPU logits following ``LOGIT_ROW_PATTERNS``, then cast to ``dtype``."""
    generator = torch.Generator().manual_seed(seed)
    out = torch.empty(rows, vocab, dtype=torch.float32)
    for row in range(rows):
        pattern = LOGIT_ROW_PATTERNS[row % len(LOGIT_ROW_PATTERNS)]
        values = torch.randn(vocab, generator=generator) * 3
        if pattern == "ties":
            values = torch.randint(-3, 3, (vocab,), generator=generator).float()
        elif pattern == "nan_neginf":
            special = torch.rand(vocab, generator=generator)
            values[special < 0.1] = float("nan")
            values[(special >= 0.1) & (special < 0.2)] = float("-inf")
        elif pattern == "max_at_tail":
            values[-1] = values.max() + 1
        elif pattern == "all_equal":
            values.fill_(0.5)
        elif pattern == "all_neginf":
            values.fill_(float("-inf"))
        elif pattern == "posinf":
            positions = torch.randperm(vocab, generator=generator)[:2]
            values[positions] = float("inf")
        elif pattern == "all_nan":
            values.fill_(float("nan"))
        out[row] = values
    return out.to(dtype)
