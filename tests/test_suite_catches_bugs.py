"""The conformance cases must fail on wrong implementations (a suite that cannot fail proves
nothing). Each test builds a deliberately broken backend and runs a real case against it."""
import pytest
import torch

from spec_hal.backend import Backend, Provider
from spec_hal.conformance import guards
from spec_hal.conformance.cases import test_topk as topk_cases
from spec_hal.selection import get_backend
from spec_hal.topk import draft_topk as reference_draft_topk


def backend_with(op, fn):
    cpu = get_backend("cpu")
    providers = dict(cpu.providers)
    providers[op] = Provider(fn, "deliberately broken")
    return Backend("broken", cpu.capabilities, providers)


def hard_coded_top1(logits, k, *, token_map=None, out=None):
    """Upstream bug 3: argmax with probability 1.0."""
    probs, ids = reference_draft_topk(logits, k, token_map=token_map)
    probs = torch.ones_like(probs)
    if out is not None:
        out[0].copy_(probs), out[1].copy_(ids)
        return out
    return probs, ids


def ties_to_higher_id(logits, k, *, token_map=None, out=None):
    flipped = logits.flip(1)
    probs, ids = reference_draft_topk(flipped, k)
    ids = logits.shape[1] - 1 - ids
    if token_map is not None:
        ids = token_map.long()[ids]
    if out is not None:
        out[0].copy_(probs), out[1].copy_(ids)
        return out
    return probs, ids


def writes_past_the_end(logits, k, *, token_map=None, out=None):
    probs, ids = reference_draft_topk(logits, k, token_map=token_map)
    if out is not None:
        out[0].copy_(probs), out[1].copy_(ids)
        flat = out[1].view(-1)
        torch.as_strided(flat, (flat.numel() + 1,), (1,))[-1] = 0  # one element too far
        return out
    return probs, ids


def unmasked_tail(logits, k, *, token_map=None, out=None):
    """Upstream bug 3's AITER variant: the vector tail is read unmasked (past column V)."""
    wider = torch.as_strided(logits, (logits.shape[0], logits.shape[1] + 1), logits.stride())
    probs, ids = reference_draft_topk(wider, k, token_map=None)
    if out is not None:
        out[0].copy_(probs), out[1].copy_(ids)
        return out
    return probs, ids


def test_hard_coded_top1_probability_is_caught():
    with pytest.raises(AssertionError):
        topk_cases.test_draft_topk_top1_probability_is_exact(backend_with("draft_topk", hard_coded_top1))


def test_wrong_tie_rule_is_caught():
    broken = backend_with("draft_topk", ties_to_higher_id)
    with pytest.raises(AssertionError):
        topk_cases.test_draft_topk_golden(broken)
    with pytest.raises(AssertionError):
        topk_cases.test_draft_topk_matches_reference(broken, 127, 4, 3, torch.float32)


def test_out_of_bounds_write_is_caught_by_canaries():
    with pytest.raises(AssertionError, match="canary"):
        topk_cases.test_draft_topk_matches_reference(backend_with("draft_topk", writes_past_the_end), 127, 2, 3, torch.float32)


def test_unmasked_tail_read_is_caught_by_input_margins():
    with pytest.raises(AssertionError):
        topk_cases.test_draft_topk_matches_reference(backend_with("draft_topk", unmasked_tail), 8193, 1, 3, torch.float32)


def test_canary_detects_a_write_before_the_buffer():
    guarded = guards.guarded_output((4,), torch.float32, "cpu")
    guarded.buffer[guards.MARGIN - 1] = 0.0
    with pytest.raises(AssertionError, match="before"):
        guarded.assert_intact("x")


def test_poison_is_visible_in_unwritten_outputs():
    guarded = guards.guarded_output((2, 3), torch.int64, "cpu")
    assert (guarded.tensor == guards.INT_POISON).all()
    guarded.assert_intact("x")


def test_bad_input_cases_fail_without_validation_or_with_the_wrong_argument_named():
    from spec_hal.errors import InvalidInput

    def wrong_name(backend):
        raise InvalidInput("k", "something", "else")

    with pytest.raises(AssertionError, match="no InvalidInput"):
        guards.assert_rejects(None, "logits", lambda backend: None)
    with pytest.raises(AssertionError, match="expected 'logits'"):
        guards.assert_rejects(None, "logits", wrong_name)
