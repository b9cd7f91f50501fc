"""Small deterministic float64 models and the reference engine loop, for tests, conformance cases
and the demo.

* :class:`TargetModel`: one causal attention layer with RoPE and, optionally, a recurrent
  (Mamba-like) layer; plain greedy decoding and its sampling distribution as the references.
* :class:`EagleDraftModel`: an EAGLE-style draft that consumes the previous hidden state.
* :class:`ChainedMtpDraftModel`: one layer per draft step (chained multi-token prediction).
* :class:`NoisyDraftModel`: the target's head on the current token plus noise (high, imperfect
  acceptance); :class:`OracleDraftModel`: predicts a given continuation (or never agrees).
* :class:`SpeculativeEngine` / :class:`EngineConfig` (``spec_hal.testing.engine``): the
  speculative-decoding loop made of spec_hal ops, over a paged KV cache.
* :class:`~spec_hal.testing.tp_engine.TensorParallelEngine` (``spec_hal.testing.tp_engine``, not
  imported here): the same loop on tensor-parallel ranks (docs/distributed.md).

Draft models follow the ``run_draft`` interface (docs/architecture.md §4):
``model(input_ids, positions, hidden, step) -> (logits, hidden)``.
"""
from .engine import EngineConfig, Generation, SpeculativeEngine
from .models import ChainedMtpDraftModel, EagleDraftModel, NoisyDraftModel, OracleDraftModel, TargetModel, rope

__all__ = ["ChainedMtpDraftModel", "EagleDraftModel", "EngineConfig", "Generation", "NoisyDraftModel",
           "OracleDraftModel", "SpeculativeEngine", "TargetModel", "rope"]
