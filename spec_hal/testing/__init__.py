"""Small deterministic float64 models for tests, conformance cases and the demo.

* :class:`TargetModel`: one causal attention layer with RoPE; logits for every position of a
  sequence (the end-to-end issue extends it with a paged KV cache and a recurrent layer).
* :class:`EagleDraftModel`: an EAGLE-style draft that consumes the previous hidden state.
* :class:`ChainedMtpDraftModel`: one layer per draft step (chained multi-token prediction).

Draft models follow the ``run_draft`` interface (DESIGN.md §4):
``model(input_ids, positions, hidden, step) -> (logits, hidden)``.
"""
from .models import ChainedMtpDraftModel, EagleDraftModel, TargetModel, rope

__all__ = ["ChainedMtpDraftModel", "EagleDraftModel", "TargetModel", "rope"]
