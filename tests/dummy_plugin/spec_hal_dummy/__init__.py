"""A minimal out-of-tree spec_hal backend: proves the plugin contract end to end.

It registers under the entry-point group ``spec_hal.backends`` (see ``pyproject.toml`` here, or
the ``.dist-info`` folder beside this package, which makes the entry point visible when this
folder is on ``sys.path``). It serves every op with the reference, which the contract allows
because the semantics are identical, and it passes the conformance suite.
"""
from __future__ import annotations

import dataclasses
import os

from spec_hal.backend import Backend, Provider, reference_providers
from spec_hal.capabilities import probe


class DummyFactory:
    name = "dummy"
    device_type = "cpu"

    def unavailable_reason(self, device):
        if os.environ.get("SPEC_HAL_DUMMY_DISABLED") == "1":
            return "disabled by SPEC_HAL_DUMMY_DISABLED=1"
        if device is not None and device.type != "cpu":
            return "the dummy backend runs on cpu tensors only"
        return None

    def create(self, device):
        providers = {op: Provider(p.fn, "dummy plugin: reference (pure PyTorch)") for op, p in reference_providers().items()}
        if os.environ.get("SPEC_HAL_DUMMY_BREAK_TIES") == "1":
            # A deliberately wrong variant, so tests can show the suite fails it.
            providers["draft_topk"] = Provider(_ties_to_higher_id, "dummy plugin: BROKEN tie rule")
        return Backend("dummy", dataclasses.replace(probe("cpu"), backend="dummy"), providers)


def _ties_to_higher_id(logits, k, *, token_map=None, out=None):
    from spec_hal.topk import draft_topk

    probs, flipped_ids = draft_topk(logits.flip(1), k)
    ids = logits.shape[1] - 1 - flipped_ids
    if out is not None:
        out[0].copy_(probs)
        out[1].copy_(ids)
        return out[0], out[1]
    return probs, ids


FACTORY = DummyFactory()
