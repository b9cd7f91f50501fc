"""The end-to-end conformance cases can fail: an engine step done wrong breaks them.

Each broken "backend" is the cpu backend with one op replaced by a plausible upstream mistake;
the e2e checks run every op through it (``ops=``), so the mistake reaches the whole loop.
"""
from __future__ import annotations

import pytest
import torch

from spec_hal.conformance.cases import test_e2e as e2e
from spec_hal.selection import get_backend


class BrokenOps:
    """Delegates every op to ``backend`` except those given as keyword overrides."""

    def __init__(self, backend, **overrides):
        self._backend, self._overrides = backend, overrides
        self.name, self.device = backend.name, backend.device

    def __getattr__(self, op):
        return self._overrides.get(op) or getattr(self._backend, op)


@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: OpenMP threads only add overhead
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cpu():
    return get_backend("cpu")


def skipped_kv_move(cpu):
    """The accepted path is never moved: the next round reads node r's KV at rank r (bug 4b's effect)."""
    return BrokenOps(cpu, move_kv=lambda caches, src, dst: None)


def chain_mamba_commit(cpu):
    """Commits node ``accept_lens - 1`` (right only for chains; upstream bug 5)."""

    def commit(*, verdict, seq_lens, slots, ssm_state, ssm_intermediate, conv_state, conv_intermediate, **_):
        steps = verdict.accept_lens.long() - 1
        cpu.scatter_mamba_state(dst=ssm_state, src=ssm_intermediate, dst_slots=slots, src_steps=steps)
        cpu.scatter_mamba_state(dst=conv_state, src=conv_intermediate, dst_slots=slots, src_steps=steps)

    return BrokenOps(cpu, commit_mamba_state=commit)


def wrong_bonus_stride(cpu):
    """Reads the bonus at ``b * (S+1) + accept_lens - 1`` of predict instead of through accept_index
    (upstream bug 4a: a stride that is not the tree's)."""

    def bonus(verdict, *, out=None):
        width = verdict.accept_index.shape[1]
        rows = torch.arange(verdict.batch_size, device=verdict.device) * width + verdict.accept_lens.long() - 1
        return verdict.predict[rows]

    return BrokenOps(cpu, bonus_tokens=bonus)


TREE_RUN = dict(steps=5, topk=4, draft_tokens=8, page_size=16, recurrent=True, graphs=False, bs=4)


@pytest.mark.parametrize("broken", [skipped_kv_move, chain_mamba_commit, wrong_bonus_stride])
def test_broken_engine_steps_break_greedy_losslessness(cpu, broken):
    with pytest.raises(AssertionError, match="speculative output"):
        e2e.check_greedy_lossless(cpu, ops=broken(cpu), **TREE_RUN)


@pytest.mark.parametrize("page_size", [1, 16])
def test_skipped_kv_move_is_caught_at_every_page_size(cpu, page_size):
    with pytest.raises(AssertionError, match="speculative output"):
        e2e.check_greedy_lossless(cpu, ops=skipped_kv_move(cpu), **{**TREE_RUN, "page_size": page_size, "recurrent": False})


def test_chain_mamba_commit_breaks_the_live_state_case(cpu):
    with pytest.raises(AssertionError, match="live SSM state|live conv"):
        e2e.check_mamba_live_state(cpu, ops=chain_mamba_commit(cpu))


def test_the_correct_engine_passes_the_same_runs(cpu):
    """The runs above fail because of the broken op, not because the case cannot pass."""
    e2e.check_greedy_lossless(cpu, **TREE_RUN)
    e2e.check_greedy_lossless(cpu, **{**TREE_RUN, "page_size": 1, "recurrent": False})
    e2e.check_mamba_live_state(cpu)


def test_acceptance_floor_catches_an_engine_that_rejects_everything(cpu):
    """A verify that accepts no draft keeps greedy output but fails the identical-draft floor."""

    def reject_all(tree, candidates, target_predict, *, out=None):
        drafts_hidden = torch.where(torch.arange(candidates.shape[1]) == 0, candidates, -1)  # no id matches -1
        return cpu.verify_greedy(tree, drafts_hidden, target_predict)

    with pytest.raises(AssertionError, match="acceptance lengths"):
        e2e.check_acceptance_floor(cpu, steps=3, topk=1, draft_tokens=4, agree=True, ops=BrokenOps(cpu, verify_greedy=reject_all))


def test_sampling_case_catches_biased_coins(cpu):
    """A verify_sampling that ignores its coins (always 0: accepts the first draft with mass)
    draws from the wrong distribution."""

    def zero_coins(tree, candidates, target_probs, coins, final_coins, **kwargs):
        return cpu.verify_sampling(tree, candidates, target_probs, torch.zeros_like(coins), final_coins, **kwargs)

    with pytest.raises(AssertionError, match="do not follow the target"):
        e2e.check_sampling_distribution(cpu, ops=BrokenOps(cpu, verify_sampling=zero_coins))


def test_chi_square_p_value_is_calibrated():
    """Sanity of the statistic: a sample from the distribution passes, a shifted one fails."""
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(64, generator=generator, dtype=torch.float64), 0)
    good = torch.bincount(torch.multinomial(probs, 4096, replacement=True, generator=generator), minlength=64)
    bad = torch.bincount(torch.multinomial(probs.roll(1), 4096, replacement=True, generator=generator), minlength=64)
    assert e2e.chi_square_p_value(good, probs)[1] > 1e-3
    assert e2e.chi_square_p_value(bad, probs)[1] < 1e-6
