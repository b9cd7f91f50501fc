"""spec_hal.device_buffers.carve: several fresh outputs from one allocation (host time per eager
call), each 16-byte aligned so that kernels see the alignment separate allocations give."""
from __future__ import annotations

import pytest
import torch

from spec_hal.device_buffers import ALIGNMENT_BYTES, carve
from spec_hal.verify import verdict_buffers, verdict_with_scratch


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.uint8, torch.bfloat16])
@pytest.mark.parametrize("sizes", [(3, 5, 1, 1), (4, 8, 4), (0, 0), (7,), (), (5, 0, 3), (1, 17, 2, 33)])
def test_parts_have_their_sizes_and_start_aligned_without_overlapping(sizes, dtype):
    parts = carve(sizes, dtype, "cpu")
    assert [part.shape for part in parts] == [torch.Size([size]) for size in sizes]
    assert all(part.dtype == dtype and part.is_contiguous() for part in parts)
    spans = []
    for part in parts:
        if part.numel():
            assert part.data_ptr() % ALIGNMENT_BYTES == 0
            spans.append((part.data_ptr(), part.data_ptr() + part.numel() * part.element_size()))
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # disjoint
    for index, part in enumerate(parts):  # each writable on its own
        part.fill_(index + 1)
    assert all(bool((part == index + 1).all()) for index, part in enumerate(parts))


def test_verdict_buffers_shapes_and_scratch():
    verdict = verdict_buffers(3, 5, 4, "cpu")
    assert (verdict.predict.shape, verdict.accept_index.shape, verdict.num_correct.shape, verdict.accept_lens.shape) == (
        (15,), (3, 4), (3,), (3,))
    assert all(t.dtype == torch.int32 and t.is_contiguous() for t in (verdict.predict, verdict.accept_index, verdict.num_correct,
                                                                      verdict.accept_lens))
    verdict, scratch = verdict_with_scratch(2, 3, 2, "cpu", (6, 9))
    assert [part.numel() for part in scratch] == [6, 9] and all(part.data_ptr() % ALIGNMENT_BYTES == 0 for part in scratch)
    empty = verdict_buffers(0, 5, 4, "cpu")
    assert empty.accept_index.shape == (0, 4) and empty.predict.numel() == 0


def test_separate_parts_gives_each_part_its_own_storage():
    """The torch.ops kernels run providers inside separate_parts: no output shares memory, so
    torch_library._fresh_outputs has nothing to copy."""
    from spec_hal.device_buffers import separate_parts

    def storages(parts):
        return {part.untyped_storage().data_ptr() for part in parts}

    assert len(storages(carve((3, 5, 2), torch.int32, "cpu"))) == 1
    with separate_parts():
        assert len(storages(carve((3, 5, 2), torch.int32, "cpu"))) == 3
        with separate_parts():
            pass
        assert len(storages(carve((3, 5), torch.int32, "cpu"))) == 2  # still inside after a nested exit
    assert len(storages(carve((3, 5), torch.int32, "cpu"))) == 1
