"""The from-logits verifies' route on a GPU (kernels/sampling.py: ``_every_row_in_parallel``):
every row processed then walked, or the fused walk over each request's path rows. Pure host
logic; both routes give the same verdicts (the conformance suite compares each with the
reference, spec_hal/conformance/cases/test_sampling.py, route hint cases), only time differs
(BENCHMARKS.md, "Forty-seventh session")."""
import pytest
import torch

from spec_hal.conformance.trees import random_tree
from spec_hal.kernels import sampling
from spec_hal.kernels.launch import KernelTarget

H200 = KernelTarget.for_arch("sm_90", multiprocessors=132)
MI300X = KernelTarget.for_arch("gfx942", multiprocessors=304)
INTERPRETER = KernelTarget("interpreter", "interpreter", 32, 1)
VOCAB = 151936


@pytest.mark.parametrize("top_k, max_top_k, listed", [
    (50, None, True),                       # a number is known on the host
    (sampling.LIST_TOP_K_MAX, None, True),
    (sampling.LIST_TOP_K_MAX + 1, None, False),
    (0, None, False),                       # off: a row with top-p searches levels in the fused walk
    (VOCAB, None, False),                   # off too (k >= V)
    (50, 1000, True),                       # the number wins over a looser hint
    ("tensor", None, False),                # a tensor's values are on the device: unknown
    ("tensor", 50, True),
    ("tensor", sampling.LIST_TOP_K_MAX + 1, False),
    ("tensor", VOCAB, False),               # some request may have top-k off
])
def test_listed_top_k_from_the_host(top_k, max_top_k, listed):
    value = torch.full((4,), 50) if top_k == "tensor" else top_k
    assert sampling._top_k_listed(value, max_top_k, VOCAB, H200) is listed


def test_listed_needs_k_below_the_vocabulary():
    assert sampling._top_k_listed(torch.full((2,), 8), 8, 8, H200) is False  # k = V: top-k is off
    assert sampling._top_k_listed(7, None, 8, H200) is True


def test_listed_top_k_moves_the_crossover_to_fewer_rows():
    """Listed: the fused walk's cut is cheap and wins from 0.6 rows per SM on trees (1 on chains);
    otherwise from 2 rows per SM. Chains cross later than trees."""
    def last_every_row(**route):
        return max(rows for rows in range(1, 1000) if sampling._every_row_in_parallel(H200, rows, **route))

    tree_listed, chain_listed, unlisted = last_every_row(listed=True), last_every_row(listed=True, chain=True), last_every_row(listed=False)
    assert (tree_listed, chain_listed, unlisted) == (79, 132, 264)
    assert last_every_row(listed=False, chain=True) == unlisted


def test_amd_and_interpreter_routes_do_not_depend_on_the_hint():
    for listed in (False, True):
        assert sampling._every_row_in_parallel(MI300X, 10_000, listed=listed)  # the fused walk is not compiled for AMD
        assert not sampling._every_row_in_parallel(INTERPRETER, 1, listed=listed)


class _Chosen(Exception):
    pass


def _verify_four_rows_a_request(op, bs, vocab, params):
    """The provider's from-logits verify of ``op`` ("tree": 4 nodes, 3 steps; "chain": 3 drafts) on
    (bs * 4, vocab) zero logits with ``params``."""
    logits = torch.zeros(bs * 4, vocab)
    if op == "tree":
        tree, candidates = random_tree(bs, 4, 3, seed=1, vocab=vocab)
        sampling.verify_sampling_from_logits(tree, candidates, logits, **params)
    else:
        sampling.verify_chain_sampling_from_logits(torch.zeros(bs, 3, dtype=torch.int64), None, logits, **params)


@pytest.mark.parametrize("op", ["tree", "chain"])
@pytest.mark.parametrize("max_top_k, listed", [(None, False), (64, True), (VOCAB, False)])
def test_providers_route_by_the_hint(monkeypatch, op, max_top_k, listed):
    """The providers pass the hint's verdict to the route choice (and stop there: nothing launches)."""
    seen = {}

    def choose(target, rows, **route):
        seen.update(rows=rows, **route)
        raise _Chosen

    monkeypatch.setattr(sampling, "_every_row_in_parallel", choose)
    bs = 3
    params = dict(temperature=torch.full((bs,), 0.7), top_k=torch.full((bs,), 20), top_p=torch.full((bs,), 0.9),
                  seed=torch.zeros(bs, dtype=torch.int64), offset=torch.zeros(bs, dtype=torch.int64), max_top_k=max_top_k, target=H200)
    with pytest.raises(_Chosen):
        _verify_four_rows_a_request(op, bs, VOCAB, params)
    assert seen == dict(rows=bs * 4, listed=listed, **({"chain": True} if op == "chain" else {}))


class _Launch:
    """Stands in for the fused walk kernel: records a launch's keyword arguments and stops there."""

    def __init__(self, seen):
        self.seen = seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.update(kwargs)
            raise _Chosen
        return launch


@pytest.mark.parametrize("masks, cuts", [
    (dict(), False),                                    # temperature alone
    (dict(min_p=0.1), False),
    (dict(top_k=0, top_p=1.0), False),                  # both off, as numbers
    (dict(top_k=20), True),
    (dict(top_p=0.9), True),
    (dict(top_p=torch.ones(3)), True),                  # a tensor's values are on the device: a row may cut
    (dict(top_k=torch.zeros(3, dtype=torch.int64)), True),
])
@pytest.mark.parametrize("op", ["tree", "chain"])
def test_fused_walk_compiles_the_cut_search_only_where_a_row_may_cut(monkeypatch, op, masks, cuts):
    """The fused walk's CUTS (kernels/sampling.py): a launch whose top_k and top_p are numbers that
    are off compiles neither the listed top-k nor the level search (BENCHMARKS.md, "Forty-eighth
    session"); any other launch compiles both."""
    seen = {}
    monkeypatch.setattr(sampling, "_fused_walk_kernel", _Launch(seen))
    bs, vocab = 3, 100
    params = dict(temperature=torch.full((bs,), 0.7), seed=torch.zeros(bs, dtype=torch.int64), offset=torch.zeros(bs, dtype=torch.int64),
                  target=INTERPRETER, **masks)
    with pytest.raises(_Chosen):
        _verify_four_rows_a_request(op, bs, vocab, params)
    assert seen["CUTS"] is cuts
