"""The bounded cases of verify_tree_sampling and verify_chain_sampling_ragged fail on deliberately
wrong providers (a case that cannot fail proves nothing): each wraps the reference with one bug."""
import pytest
import torch

import spec_hal.ragged as ragged_reference
import spec_hal.verify as reference
from spec_hal.conformance.cases import test_masks as tree_cases
from spec_hal.conformance.cases import test_ragged as ragged_cases
from spec_hal.types import Verdict

from test_verify_catches_bugs import _write, backend_with


def tree_sampling_with_uniform_draft(tree, candidates, draft_probs, target_probs, coins, final_coins, *, token_bitmask=None,
                                     bitmask_index=None, out=None):
    """Assumes every draft row is uniform (the test and the residual update use the wrong q)."""
    uniform = torch.full_like(draft_probs, 1.0 / draft_probs.shape[-1])
    return _write(reference.verify_tree_sampling(tree, candidates, uniform, target_probs, coins, final_coins,
                                                 token_bitmask=token_bitmask, bitmask_index=bitmask_index), out)


def tree_sampling_writing_past_accept_index(tree, candidates, draft_probs, target_probs, coins, final_coins, *, token_bitmask=None,
                                            bitmask_index=None, out=None):
    """Right values, but one int32 written past the end of out.accept_index."""
    result = _write(reference.verify_tree_sampling(tree, candidates, draft_probs, target_probs, coins, final_coins), out)
    if out is not None:
        flat = out.accept_index.view(-1)
        torch.as_strided(flat, (1,), (1,), flat.storage_offset() + flat.numel()).fill_(0)
    return result


def ragged_sampling_without_count_clamp(draft_tokens, num_draft_tokens, draft_probs, target_probs, coins, final_coins, *, max_drafts,
                                        token_bitmask=None, bitmask_index=None, out=None):
    """Treats a negative count as 0 drafts but lets the row layout count it (r_b shifts)."""
    counts = num_draft_tokens.to(torch.int64)
    shifted = torch.where(counts < 0, torch.ones_like(counts), counts)
    return _write(ragged_reference.verify_chain_sampling_ragged(draft_tokens, shifted, draft_probs, target_probs, coins, final_coins,
                                                                max_drafts=max_drafts), out)


def test_tree_sampling_with_the_wrong_draft_rows_is_caught():
    broken = backend_with("verify_tree_sampling", tree_sampling_with_uniform_draft)
    with pytest.raises(AssertionError):
        tree_cases.test_verify_tree_sampling_bounded(broken)


def test_tree_sampling_writing_out_of_bounds_is_caught_by_canaries():
    with pytest.raises(AssertionError, match="canary"):
        tree_cases.test_verify_tree_sampling_bounded(backend_with("verify_tree_sampling", tree_sampling_writing_past_accept_index))


def test_ragged_sampling_with_unclamped_counts_is_caught():
    broken = backend_with("verify_chain_sampling_ragged", ragged_sampling_without_count_clamp)
    with pytest.raises(AssertionError):
        ragged_cases.test_verify_chain_sampling_ragged_bounded(broken, "negative_and_large", True)
