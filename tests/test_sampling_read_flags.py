"""Which sampling launches read a tile ahead, and under which register cap
(``SamplingLaunch.read_flags``), checked without a GPU: the launch configs of simulated targets,
and the keyword arguments the two sampling providers hand to their kernels (a recording stand-in
replaces each kernel, so nothing compiles).

On NVIDIA a launch whose probability rows have a non-unit vocabulary stride reads no tile ahead
and compiles under ``SAMPLING_STRIDED_MAXNREG``: with the read-ahead its generic specs kept local
frames on sm_80/sm_90/sm_100 (docs/compile-matrix.md, known findings), and the compile matrix
builds those specs with exactly these flags, so a launch that drifted from them would run a
configuration the matrix never checked.
"""
import pytest
import torch

import spec_hal.kernels.verify as kv
from spec_hal.bench.examples import tree_verify_inputs
from spec_hal.kernels.launch import KernelTarget

H100 = KernelTarget("nvidia", "sm_90", 32, 132)
MI300X = KernelTarget("amd", "gfx942", 64, 304)
INTERPRETER = KernelTarget("interpreter", None, 1, 1)


class RecordingKernel:
    """Stands in for a Triton kernel: ``kernel[grid](*args, **kwargs)`` records the kwargs."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(kwargs)


@pytest.mark.parametrize("unit_stride", [True, False])
def test_nvidia_reads_ahead_only_along_unit_strides(unit_stride):
    config = kv.sampling_launch(H100, 64, 8, 151936)
    flags, options = config.read_flags(unit_stride)
    if unit_stride:
        assert (flags, options) == ({"READ_AHEAD": True}, {})
    else:
        assert (flags, options) == ({"READ_AHEAD": False}, {"maxnreg": kv.SAMPLING_STRIDED_MAXNREG})


@pytest.mark.parametrize("target", [MI300X, INTERPRETER], ids=["amd", "interpreter"])
@pytest.mark.parametrize("unit_stride", [True, False])
def test_other_targets_never_take_the_cap(target, unit_stride):
    config = kv.sampling_launch(target, 64, 8, 4096)
    assert config.read_flags(unit_stride) == ({"READ_AHEAD": config.read_ahead}, {})
    assert config.read_ahead == (target.vendor == "interpreter")  # AMD never reads ahead


def _tree_inputs(vocab_stride):
    bs, nodes, steps, vocab = 3, 6, 4, 300
    tree, candidates, _, _, probs, coins, final_coins = tree_verify_inputs(bs, nodes, steps, vocab, "cpu")
    if vocab_stride > 1:
        wide = torch.zeros(bs, nodes, vocab * vocab_stride)
        wide[..., ::vocab_stride] = probs
        probs = wide[..., ::vocab_stride]
    return tree, candidates, probs, coins, final_coins


@pytest.mark.parametrize("vocab_stride", [1, 2])
def test_verify_sampling_launches_with_its_rows_flags(monkeypatch, vocab_stride):
    kernel = RecordingKernel()
    monkeypatch.setattr(kv, "_sampling_walk_kernel", kernel)
    tree, candidates, probs, coins, final_coins = _tree_inputs(vocab_stride)
    kv.verify_sampling(tree, candidates, probs, coins, final_coins, target=H100)
    (kwargs,) = kernel.calls
    strided = vocab_stride > 1
    assert kwargs["READ_AHEAD"] is not strided
    assert kwargs.get("maxnreg") == (kv.SAMPLING_STRIDED_MAXNREG if strided else None)


@pytest.mark.parametrize("strided_side", ["none", "target", "draft"])
def test_verify_chain_sampling_launches_with_its_rows_flags(monkeypatch, strided_side):
    kernel = RecordingKernel()
    monkeypatch.setattr(kv, "_chain_sampling_kernel", kernel)
    tree, candidates, probs, coins, final_coins = _tree_inputs(2 if strided_side == "target" else 1)
    draft_probs = torch.softmax(torch.randn(3, 5, 600), dim=-1)
    draft_probs = draft_probs[..., ::2] if strided_side == "draft" else draft_probs[..., :300].contiguous()
    kv.verify_chain_sampling(candidates[:, 1:].contiguous(), draft_probs, probs, coins[:, 1:].contiguous(), final_coins, target=H100)
    (kwargs,) = kernel.calls
    strided = strided_side != "none"
    assert kwargs["READ_AHEAD"] is not strided
    assert kwargs.get("maxnreg") == (kv.SAMPLING_STRIDED_MAXNREG if strided else None)
