"""The compaction and kv cases fail on the upstream bug 4 variants and other wrong providers."""
import pytest
import torch

from spec_hal.compaction import bonus_tokens as reference_bonus_tokens
from spec_hal.compaction import compact_accepted as reference_compact_accepted
from spec_hal.conformance.cases import test_compaction as compaction_cases
from spec_hal.conformance.cases import test_kv as kv_cases
from spec_hal.kv import accepted_kv_moves as reference_accepted_kv_moves
from spec_hal.kv import assign_draft_slots as reference_assign_draft_slots

from test_suite_catches_bugs import backend_with


def bonus_with_node_stride(verdict, *, out=None):
    """Bug 4a: bonus read at b*N + accept_lens - 1 of predict[accept_index] (stride N, not S+1)."""
    rows, width = verdict.accept_index.shape
    nodes = verdict.predict.shape[0] // rows
    accept_tokens = verdict.predict[verdict.accept_index.long().clamp(min=0)].reshape(-1)
    flat = torch.arange(rows, device=verdict.device) * nodes + verdict.accept_lens.long() - 1
    # Past the end, the real kernel reads whatever memory follows; model it as a garbage -1.
    inside = flat < accept_tokens.numel()
    result = torch.where(inside, accept_tokens[flat.clamp(max=accept_tokens.numel() - 1)], -1).to(verdict.predict.dtype)
    return result if out is None else out.copy_(result)


def moves_sized_by_nodes(verdict, slots, *, out=None):
    """Bug 4b: the move list is built with bs*N entries (writes past the bs*(S+1) outputs)."""
    src, dst = reference_accepted_kv_moves(verdict, slots)
    rows, nodes = slots.shape
    if out is None:
        return src, dst
    for buffer, value in zip(out, (src, dst)):
        # As many of the bs*N entries as the allocation holds (a GPU would write on regardless).
        room = buffer.untyped_storage().nbytes() // buffer.element_size() - buffer.storage_offset()
        wide = torch.as_strided(buffer, (min(rows * nodes, room),), (1,))
        wide.fill_(-1)
        wide[:value.numel()] = value  # the real entries, then -1 padding past bs*(S+1)
    return out


def never_compacted(x, verdict, *, out=None):
    """Bug 4c: the accepted path is left where the tree put it."""
    return x.clone() if out is None else out.copy_(x)


def move_in_reverse_order(caches, src, dst):
    """Writes before reading: moves applied one by one from the last, so a slot is overwritten
    before the earlier move that reads it."""
    for i in reversed(range(src.shape[0])):
        if src[i] >= 0 and dst[i] >= 0:
            for cache in caches:
                cache[dst[i]] = cache[src[i]]


def contiguous_slots_for_every_page_size(req_to_token, *, req_pool_indices, seq_lens, num_steps, topk, page_size, out=None):
    """Ignores P9's per-lane page regions: the page-size-1 layout at every page size."""
    result = reference_assign_draft_slots(req_to_token, req_pool_indices=req_pool_indices, seq_lens=seq_lens,
                                          num_steps=num_steps, topk=topk, page_size=1)
    holes = (topk - 1) * (page_size - 1)
    empty = torch.full((req_pool_indices.shape[0] * holes,), -1, dtype=req_to_token.dtype, device=req_to_token.device)
    values = (result.out_cache_loc, empty, empty.clone())
    if out is None:
        return type(result)(*values)
    for buffer, value in zip(out, values):
        buffer.copy_(value)
    return type(result)(*out)


def test_bonus_stride_n_is_caught():
    broken = backend_with("bonus_tokens", bonus_with_node_stride)
    with pytest.raises(AssertionError):
        compaction_cases.test_bonus_tokens_golden(broken)
    with pytest.raises(AssertionError):
        compaction_cases.test_bug4_tree_regression(broken)


def test_moves_sized_bs_times_n_are_caught():
    broken = backend_with("accepted_kv_moves", moves_sized_by_nodes)
    with pytest.raises(AssertionError, match="canary"):
        kv_cases.test_bug4_kv_moves_touch_only_accept_width(broken)
    with pytest.raises(AssertionError, match="canary"):
        kv_cases.test_accepted_kv_moves_golden(broken)


def test_missing_compaction_is_caught():
    broken = backend_with("compact_accepted", never_compacted)
    with pytest.raises(AssertionError):
        compaction_cases.test_bug4_tree_regression(broken)
    with pytest.raises(AssertionError):
        compaction_cases.test_compact_accepted_golden(broken)


def test_move_without_gather_first_is_caught():
    broken = backend_with("move_kv", move_in_reverse_order)
    with pytest.raises(AssertionError):
        kv_cases.test_move_kv_is_gather_then_scatter(broken)
    with pytest.raises(AssertionError):
        kv_cases.test_move_kv_matches_reference(broken, "chain_600", torch.int64)


def test_page_unaware_draft_slots_are_caught():
    broken = backend_with("assign_draft_slots", contiguous_slots_for_every_page_size)
    with pytest.raises(AssertionError):
        kv_cases.test_assign_draft_slots_golden(broken)


def test_ledger_catches_a_missing_kv_move(monkeypatch):
    """The ledger itself fails when the accepted KV is never moved (a no-op move_kv)."""
    monkeypatch.setattr(kv_cases, "_ledger_rounds", lambda backend: 30)
    broken = backend_with("move_kv", lambda caches, src, dst: None)
    with pytest.raises(AssertionError):
        kv_cases.test_kv_ledger(broken, 16)


def test_reference_bonus_and_compaction_agree_on_golden():
    """The reference itself satisfies P14's invariant on the golden tree (the oracle is sane)."""
    round_ = compaction_cases.golden_tree_round()
    compacted = reference_compact_accepted(round_.verdict.predict, round_.verdict)
    assert reference_bonus_tokens(round_.verdict).tolist() == [190, 290]
    compaction_cases.check_compaction_invariant(compacted, round_)
