"""The sampling conformance cases fail on deliberately wrong providers (a case that cannot fail
proves nothing). Each broken provider wraps the reference with one bug an engine shipped or could."""
import pytest
import torch

import spec_hal.sampling as reference
from spec_hal.backend import Backend, Provider
from spec_hal.conformance.cases import test_sampling as cases
from spec_hal.selection import get_backend


def backend_with(op, fn):
    cpu = get_backend("cpu")
    providers = dict(cpu.providers)
    providers[op] = Provider(fn, "deliberately broken")
    return Backend("broken", cpu.capabilities, providers)


def process_top_k_off_by_one(logits, *, temperature, top_k=0, top_p=1.0, min_p=0.0, out=None):
    probs = reference.process_logits(logits, temperature=temperature, top_k=top_k + 1 if isinstance(top_k, int) else top_k + (top_k > 0),
                                     top_p=top_p, min_p=min_p)
    return probs if out is None else out.copy_(probs)


def process_ignoring_min_p(logits, *, temperature, top_k=0, top_p=1.0, min_p=0.0, out=None):
    probs = reference.process_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return probs if out is None else out.copy_(probs)


def verify_greedily_at_any_temperature(tree, candidates, target_logits, *, temperature, **kwargs):
    """The ROCm engines' silent fallback: greedy verification whatever the temperature."""
    return reference.verify_sampling_from_logits(tree, candidates, target_logits, temperature=0.0,
                                                 **{k: v for k, v in kwargs.items() if k not in ("seed", "offset", "generator", "coins", "final_coins")})


def verify_without_min_p(tree, candidates, target_logits, *, min_p=0.0, **kwargs):
    """vllm#42744: min-p not applied to the verified tokens."""
    return reference.verify_sampling_from_logits(tree, candidates, target_logits, **kwargs)


def verify_with_row_dependent_coins(tree, candidates, target_logits, *, seed=None, offset=None, **kwargs):
    """Coins keyed by the request's row in the batch: not batch invariant."""
    rows = torch.arange(seed.shape[0], dtype=torch.int64, device=seed.device)
    return reference.verify_sampling_from_logits(tree, candidates, target_logits, seed=seed + rows, offset=offset, **kwargs)


def test_top_k_off_by_one_is_caught():
    with pytest.raises(AssertionError):
        cases.test_process_logits_bit_identical(backend_with("process_logits", process_top_k_off_by_one), torch.float32, 16, 37)


def test_min_p_ignored_in_processing_is_caught():
    with pytest.raises(AssertionError):
        cases.test_process_logits_bit_identical(backend_with("process_logits", process_ignoring_min_p), torch.float32, 16, 37)


def test_greedy_fallback_at_any_temperature_is_caught():
    with pytest.raises(AssertionError):
        cases.test_tree_from_logits_is_lossless(backend_with("verify_sampling_from_logits", verify_greedily_at_any_temperature), 0)


def test_min_p_ignored_in_verification_is_caught():
    with pytest.raises(AssertionError):
        cases.test_tree_from_logits_is_lossless(backend_with("verify_sampling_from_logits", verify_without_min_p), 3)


def test_batch_dependent_coins_are_caught():
    with pytest.raises(AssertionError):
        cases.test_batch_invariance_and_reproducibility(backend_with("verify_sampling_from_logits", verify_with_row_dependent_coins))
