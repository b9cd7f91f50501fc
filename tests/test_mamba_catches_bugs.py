"""The mamba conformance cases fail on wrong implementations (upstream bug 5 and its neighbours).
Each test builds a deliberately broken backend and runs a real case against it."""
import dataclasses

import pytest
import torch

from spec_hal import mamba as reference
from spec_hal.backend import Backend, Provider
from spec_hal.conformance.cases import test_mamba as cases
from spec_hal.selection import get_backend


def backend_with(**broken):
    cpu = get_backend("cpu")
    providers = dict(cpu.providers)
    for op, fn in broken.items():
        providers[op] = Provider(fn, "deliberately broken")
    return Backend("broken", cpu.capabilities, providers)


def chain_steps(verdict, seq_lens, *, track_interval=None):
    """Upstream bug 5 (pre PR #27463): last step = accept_lens - 1, right only for chains."""
    last_step, track_step = reference.mamba_commit_steps(verdict, seq_lens, track_interval=track_interval)
    return (verdict.accept_lens - 1).to(torch.int32), track_step


def commit_with_chain_steps(*, verdict, seq_lens, slots, ssm_state, ssm_intermediate, conv_state, conv_intermediate,
                            track_slots=None, track_interval=None, src_rows=None):
    """commit_mamba_state (commit set only) that copies the node at path length - 1."""
    last_step, track_step = chain_steps(verdict, seq_lens, track_interval=track_interval)
    for state, scratch in ((ssm_state, ssm_intermediate), (conv_state, conv_intermediate)):
        reference.scatter_mamba_state(dst=state, src=scratch, dst_slots=slots, src_steps=last_step, src_rows=src_rows)
    copied = ((last_step >= 0) & (slots >= 0)).sum()
    return reference.MambaCommit(last_step, track_step, copied * reference.commit_bytes_per_request(ssm_state, conv_state))


def track_off_by_one(verdict, seq_lens, *, track_interval=None):
    """Snapshot the state covering boundary + 1 tokens (path position boundary - pre)."""
    last_step, _ = reference.mamba_commit_steps(verdict, seq_lens, track_interval=track_interval)
    _, track_step = reference.mamba_commit_steps(verdict, seq_lens - 1, track_interval=track_interval)
    return last_step, track_step


def scatter_without_skipping(*, dst, src, dst_slots, src_steps, src_rows=None):
    """Treats step -1 as an index: Python's negative indexing copies the LAST node's state."""
    rows = torch.arange(dst_slots.shape[0]) if src_rows is None else src_rows.long()
    keep = dst_slots >= 0
    dst[:, dst_slots.long()[keep]] = src[:, rows[keep], src_steps.long()[keep]]
    return dst


def scatter_ignoring_rows(*, dst, src, dst_slots, src_steps, src_rows=None):
    return reference.scatter_mamba_state(dst=dst, src=src, dst_slots=dst_slots, src_steps=src_steps)


def scatter_assuming_contiguous_dst(*, dst, src, dst_slots, src_steps, src_rows=None):
    """Ignores dst's layer/slot strides (computes them from the shape, as if dst were dense)."""
    dense = torch.as_strided(dst, dst.shape, torch.empty(dst.shape).stride(), dst.storage_offset())
    reference.scatter_mamba_state(dst=dense, src=src, dst_slots=dst_slots, src_steps=src_steps, src_rows=src_rows)
    return dst


def commit_counting_commit_set_only(**kwargs):
    result = reference.commit_mamba_state(**kwargs)
    if kwargs.get("track_slots") is None:
        return result
    copied = ((result.last_step >= 0) & (kwargs["slots"] >= 0)).sum()
    return dataclasses.replace(result, bytes_moved=copied * reference.commit_bytes_per_request(kwargs["ssm_state"], kwargs["conv_state"]))


def test_chain_formula_for_trees_is_caught():
    """Bug 5: a variant using accept_lens - 1 fails the tree cases (and passes chains, which is
    why it shipped)."""
    broken = backend_with(mamba_commit_steps=chain_steps, commit_mamba_state=commit_with_chain_steps)
    with pytest.raises(AssertionError, match="node 3"):
        cases.test_commit_tree_commits_last_accepted_node(broken)
    with pytest.raises(AssertionError):
        cases.test_commit_steps_golden(broken)
    with pytest.raises(AssertionError):
        cases.test_commit_steps_match_reference(broken, 33, 5, 4, 8, None)
    with pytest.raises(AssertionError, match="last_step"):
        cases.test_commit_matches_reference(broken, 4, False, False)
    cases.test_commit_matches_reference(broken, 1, False, False)  # chains cannot tell


def test_wrong_track_step_is_caught():
    broken = backend_with(mamba_commit_steps=track_off_by_one)
    with pytest.raises(AssertionError):
        cases.test_commit_steps_golden(broken)
    with pytest.raises(AssertionError):
        cases.test_commit_steps_match_reference(broken, 64, 5, 8, 32, 3)


def test_minus_one_step_used_as_an_index_is_caught():
    broken = backend_with(scatter_mamba_state=scatter_without_skipping)
    with pytest.raises(AssertionError, match="differs from the reference"):
        cases.test_scatter_matches_reference(broken, "ssm-fp32", "track", False)


def test_ignored_source_rows_are_caught():
    broken = backend_with(scatter_mamba_state=scatter_ignoring_rows)
    with pytest.raises(AssertionError):
        cases.test_scatter_matches_reference(broken, "conv-bf16", "commit", True)


def test_ignored_destination_strides_are_caught():
    broken = backend_with(scatter_mamba_state=scatter_assuming_contiguous_dst)
    with pytest.raises(AssertionError):
        cases.test_scatter_matches_reference(broken, "ssm-fp32", "commit", False)


def test_wrong_bytes_moved_is_caught():
    broken = backend_with(commit_mamba_state=commit_counting_commit_set_only)
    with pytest.raises(AssertionError):
        cases.test_commit_matches_reference(broken, 4, True, False)


class PositionalBackend:
    """A backend object whose scatter accepts positional arguments (bug 5's call pattern)."""

    device = torch.device("cpu")

    def scatter_mamba_state(self, dst, src, dst_slots, src_steps, src_rows=None):
        return reference.scatter_mamba_state(dst=dst, src=src, dst_slots=dst_slots, src_steps=src_steps, src_rows=src_rows)


def test_positional_signature_is_caught():
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        cases.test_scatter_positional_call_raises_type_error(PositionalBackend())


def test_the_real_backends_reject_positional_calls():
    cases.test_scatter_positional_call_raises_type_error(get_backend("cpu"))
