"""EAGLE-3 token maps: offsets to absolute ids and the reverse (target-to-draft) map, with bad
maps rejected by name (spec_hal/topk.py; issue #14). Expected values are written by hand."""
from __future__ import annotations

import pytest
import torch

from spec_hal.errors import InvalidInput
from spec_hal.topk import reverse_token_map, token_map_from_offsets


@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
def test_offsets_become_absolute_ids(dtype):
    d2t = torch.tensor([0, 4, 1, 7], dtype=dtype)  # draft i -> target i + d2t[i]
    ids = token_map_from_offsets(d2t, target_vocab=11)
    assert ids.dtype == torch.int64 and ids.tolist() == [0, 5, 3, 10]


@pytest.mark.parametrize("offsets", (False, True))
def test_reverse_map_marks_absent_targets(offsets):
    absolute = torch.tensor([6, 0, 3])
    given = absolute - torch.arange(3) if offsets else absolute
    reverse = reverse_token_map(given, target_vocab=8, offsets=offsets)
    assert reverse.dtype == torch.int64
    assert reverse.tolist() == [1, -1, -1, 2, -1, -1, 0, -1]


def test_empty_map():
    assert reverse_token_map(torch.zeros(0, dtype=torch.int64), target_vocab=3).tolist() == [-1, -1, -1]
    assert token_map_from_offsets(torch.zeros(0, dtype=torch.int32)).shape == (0,)


@pytest.mark.parametrize("call, argument", [
    (lambda: token_map_from_offsets(torch.tensor([0, 4, 1, 8]), target_vocab=11), "d2t"),   # 3 + 8 = 11
    (lambda: token_map_from_offsets(torch.tensor([0, -2])), "d2t"),                          # 1 - 2 < 0
    (lambda: token_map_from_offsets(torch.tensor([0.0, 1.0])), "d2t"),
    (lambda: token_map_from_offsets(torch.zeros(2, 2, dtype=torch.int64)), "d2t"),
    (lambda: token_map_from_offsets(torch.tensor([0, 1]), target_vocab=0), "target_vocab"),
    (lambda: reverse_token_map(torch.tensor([0, 8]), target_vocab=8), "token_map"),
    (lambda: reverse_token_map(torch.tensor([0, -1]), target_vocab=8), "token_map"),
    (lambda: reverse_token_map(torch.tensor([2, 2]), target_vocab=8), "token_map"),          # not one-to-one
    (lambda: reverse_token_map(torch.tensor([5, 4]), target_vocab=6, offsets=True), "token_map"),  # 1 + 4 = 5 twice
    (lambda: reverse_token_map(torch.tensor([[0]]), target_vocab=8), "token_map"),
    (lambda: reverse_token_map(torch.tensor([0]), target_vocab=None), "target_vocab"),
])
def test_bad_maps_name_the_argument(call, argument):
    with pytest.raises(InvalidInput) as error:
        call()
    assert error.value.argument == argument
