"""The compat drop-ins on a GPU backend (cuda or rocm) equal the same calls on cpu tensors (the
reference backend), outputs bit for bit. Skipped without a GPU; the cpu and triton-interpret lanes
are in test_compat_{sgl_kernel,vllm,flashinfer}.py."""
from types import SimpleNamespace

import pytest
import torch

from spec_hal.bench.examples import draft_tree_records
from spec_hal.compat import flashinfer, sgl_kernel, vllm
from spec_hal.conformance.trees import random_tree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm device")
GPU = "cuda"


def on_both(fn, *tensors):
    """fn(*tensors) on cpu and on the GPU (fresh copies, so in-place outputs are separate)."""
    cpu = [t.clone() for t in tensors]
    gpu = [t.to(GPU) for t in tensors]
    return fn(*cpu), cpu, fn(*gpu), gpu


def assert_same(cpu, gpu):
    for a, b in zip(cpu, gpu):
        assert a.dtype == b.dtype and torch.equal(a, b.cpu())


@pytest.mark.parametrize("bs, nodes, steps", [(7, 8, 4), (64, 4, 3)])
def test_verify_drop_ins_equal_cpu(bs, nodes, steps):
    tree, candidates = random_tree(bs, nodes, steps, seed=nodes, vocab=64)
    generator = torch.Generator().manual_seed(0)
    target_predict = torch.where(torch.rand(bs, nodes, generator=generator) < 0.6,
                                 candidates.gather(1, tree.retrieve_next_token.clamp(min=0)), torch.randint(0, 64, (bs, nodes), generator=generator))
    target_probs = torch.softmax(torch.randn(bs, nodes, 64, generator=generator) * 2, -1)
    buffers = (torch.full((bs * nodes,), 5, dtype=torch.int32), torch.full((bs, steps + 1), 5, dtype=torch.int32), torch.zeros(bs, dtype=torch.int32))
    links = (tree.retrieve_index, tree.retrieve_next_token, tree.retrieve_next_sibling)
    _, cpu, _, gpu = on_both(lambda *t: sgl_kernel.verify_tree_greedy(*t), *buffers, candidates, *links, target_predict)
    assert_same(cpu[:3], gpu[:3])
    coins = (torch.rand(bs, nodes, generator=generator), torch.rand(bs, generator=generator))
    _, cpu, _, gpu = on_both(lambda *t: sgl_kernel.tree_speculative_sampling_target_only(*t, 0.9, 0.6), *buffers, candidates, *links, *coins, target_probs)
    assert_same(cpu[:3], gpu[:3])


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_build_tree_drop_in_equals_cpu(mode):
    bs, topk, steps, nodes = 5, 4, 3, 16
    parents, selected, _ = draft_tree_records(bs, topk, steps, nodes, seed=1, vocab=9)
    seq_lens = torch.arange(10, 10 + bs)
    size = {0: nodes * int(seq_lens.sum()) + bs * nodes * nodes, 1: bs * nodes * nodes, 2: bs * nodes * 2}[mode]
    mask = torch.zeros(size, dtype=torch.uint8 if mode == 2 else torch.bool)
    outputs = (mask, torch.zeros(bs * nodes, dtype=torch.int64), *(torch.full((bs, nodes), -1, dtype=torch.int64) for _ in range(3)))
    _, cpu, _, gpu = on_both(lambda *t: sgl_kernel.build_tree_kernel_efficient(*t, topk, steps, nodes, mode), parents, selected, seq_lens, *outputs)
    assert_same(cpu[3:], gpu[3:])


def test_flashinfer_drop_ins_equal_cpu():
    bs, steps, vocab = 32, 4, 1000
    generator = torch.Generator().manual_seed(2)
    draft_probs = torch.softmax(torch.randn(bs, steps, vocab, generator=generator), -1)
    target_probs = torch.softmax(torch.randn(bs, steps + 1, vocab, generator=generator), -1)
    draft_ids = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=generator).view(bs, steps)
    uniform = torch.rand(bs, steps + 1, generator=generator)
    cpu, _, gpu, _ = on_both(lambda *t: flashinfer.chain_speculative_sampling(*t[:3], uniform_samples=t[3]), draft_probs, draft_ids, target_probs, uniform)
    assert_same(cpu, gpu)
    cpu, _, gpu, _ = on_both(lambda p, u: flashinfer.sampling_from_probs(p, uniform_samples=u), target_probs[:, 0], uniform[:, 0].contiguous())
    assert_same([cpu], [gpu])


@pytest.mark.parametrize("counts", [[3, 0, 2, 1], [3, 3, 3, 3]])  # equal counts: vLLM's rows read in place
def test_vllm_greedy_and_fully_accepted_random_equal_cpu(counts):
    generator = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(sum(counts), 50, generator=generator) * 3, -1)
    ids = torch.multinomial(probs, 1, generator=generator)[:, 0]
    cu = torch.tensor(counts).cumsum(0)
    bonus = torch.randint(0, 50, (4, 1), generator=generator)
    greedy = SimpleNamespace(all_greedy=True, all_random=False, temperature=None, generators={})
    cpu, _, gpu, _ = on_both(lambda *t: vllm.rejection_sample(t[0], counts, 3, t[1], None, t[2], t[3], greedy), ids, cu, probs, bonus)
    assert_same([cpu], [gpu])
    random = SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(4, device=GPU), generators={})
    gpu_out = vllm.rejection_sample(ids.to(GPU), counts, 3, cu.to(GPU), probs.to(GPU), probs.to(GPU), bonus.to(GPU), random)
    random.temperature = torch.ones(4)
    assert_same([vllm.rejection_sample(ids, counts, 3, cu, probs, probs, bonus, random)], [gpu_out])  # p == q: all accepted


@pytest.mark.parametrize("counts", [[3, 0, 2, 1], [3, 3, 3, 3]])
def test_vllm_random_from_the_same_coin_stream_equal_cpu(counts):
    """Unseeded random requests draw from the device's coin stream: with both devices' streams at
    the same state, the GPU output equals the cpu one bit for bit, and both counters advance."""
    generator = torch.Generator().manual_seed(5)
    draft_probs = torch.softmax(torch.randn(sum(counts), 50, generator=generator), -1)
    target_probs = torch.softmax(torch.randn(sum(counts), 50, generator=generator) * 2, -1)
    ids = torch.multinomial(draft_probs, 1, generator=generator)[:, 0]
    cu, bonus = torch.tensor(counts).cumsum(0), torch.randint(0, 50, (4, 1), generator=generator)
    states = [vllm._stream_state(torch.device(device)) for device in ("cpu", GPU)]
    for state in states:
        state.copy_(torch.tensor([2**33 + 9, 40]))
    random = SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(4), generators={})
    cpu, _, gpu, _ = on_both(lambda *t: vllm.rejection_sample(t[0], counts, 3, t[1], t[2], t[3], t[4], random), ids, cu, draft_probs,
                             target_probs, bonus)
    assert_same([cpu], [gpu])
    assert [state.tolist() for state in states] == [[2**33 + 9, 41]] * 2
