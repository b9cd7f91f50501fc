"""spec_hal.compat.sgl_kernel pinned to sgl-kernel's behaviour, on cpu and triton-interpret.

Worked examples are sgl-kernel's own tests re-expressed:
- https://github.com/sgl-project/sglang/blob/main/sgl-kernel/tests/speculative/test_eagle_utils.py
- https://github.com/sgl-project/sglang/blob/main/sgl-kernel/tests/speculative/test_speculative_sampling.py
The build_tree case is worked by hand from sgl-kernel/csrc/speculative/eagle_utils.cu
(build_tree_efficient: child lists, positions, mask bits); renorm cases are FlashInfer's docstring
examples (sgl-kernel's renorm kernels are FlashInfer's). Differential cases compare with the
spec_hal reference ops (the oracle), never with the wrapper itself.
"""
import inspect

import pytest
import torch
import torch.nn.functional as F

from compat_lanes import lane, run_interpreter_lane  # noqa: F401
from spec_hal import tree as tree_reference
from spec_hal import verify as verify_reference
from spec_hal.compat import sgl_kernel
from spec_hal.conformance.trees import random_tree
from spec_hal.errors import InvalidInput
from spec_hal.types import DraftTree


def test_sgl_kernel_interpreter_lane():
    run_interpreter_lane(__file__)


def golden_inputs():
    """sgl-kernel's test tree: bs 2, N 6, S 3 (test_eagle_utils.py / test_speculative_sampling.py)."""
    candidates = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    retrieve_index = torch.arange(12).reshape(2, 6)
    next_token = torch.tensor([[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]])
    next_sibling = torch.tensor([[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]])
    logits = torch.full((2, 6, 20), 1.0)
    logits[0, 0, 3] = logits[0, 3, 4] = logits[0, 4, 5] = logits[1, 0, 11] = logits[1, 4, 12] = 10
    for i in range(2):
        for j in range(6):
            if logits[i, j].max() < 10:
                logits[i, j, 18] = 10
    return candidates, retrieve_index, next_token, next_sibling, logits


def output_buffers(bs=2, nodes=6, width=4):
    return (torch.full((bs * nodes,), -1, dtype=torch.int32), torch.full((bs, width), -1, dtype=torch.int32),
            torch.zeros(bs, dtype=torch.int32))


GOLDEN_PREDICTS = [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]
GOLDEN_ACCEPT_INDEX = [[0, 3, 4, 5], [6, 10, 11, -1]]


@pytest.mark.parametrize("spelling", ["retrieve", "retrive"])
def test_verify_tree_greedy_upstream_example(lane, spelling):
    candidates, retrieve_index, next_token, next_sibling, logits = golden_inputs()
    predicts, accept_index, accept_token_num = output_buffers()
    links = {f"{spelling}_index": retrieve_index, f"{spelling}_next_token": next_token, f"{spelling}_next_sibling": next_sibling}
    sgl_kernel.verify_tree_greedy(predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num,
                                  candidates=candidates, target_predict=logits.argmax(dim=-1), **links)
    assert predicts.tolist() == GOLDEN_PREDICTS
    assert accept_index.tolist() == GOLDEN_ACCEPT_INDEX
    assert accept_token_num.tolist() == [3, 2]


@pytest.mark.parametrize("thresholds, predicts_expected, accept_expected, num_expected", [
    ((1.0, 1.0), GOLDEN_PREDICTS, GOLDEN_ACCEPT_INDEX, [3, 2]),
    ((0.0, 0.0), [1, 2, 18, -1, -1, -1, 11, -1, -1, -1, 12, 18], [[0, 1, 2, -1], [6, 10, 11, -1]], [2, 2]),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_tree_speculative_sampling_upstream_example(lane, thresholds, predicts_expected, accept_expected, num_expected, seed):
    candidates, retrieve_index, next_token, next_sibling, logits = golden_inputs()
    target_probs = F.softmax(logits / 0.01, dim=-1)
    generator = torch.Generator().manual_seed(seed)
    predicts, accept_index, accept_token_num = output_buffers()
    draft_probs = torch.zeros_like(target_probs)
    sgl_kernel.tree_speculative_sampling_target_only(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num, candidates=candidates,
        retrieve_index=retrieve_index, retrieve_next_token=next_token, retrieve_next_sibling=next_sibling,
        uniform_samples=torch.rand(2, 6, generator=generator), uniform_samples_for_final_sampling=torch.rand(2, generator=generator),
        target_probs=target_probs, draft_probs=draft_probs, threshold_single=thresholds[0], threshold_acc=thresholds[1],
        deterministic=True)
    assert predicts.tolist() == predicts_expected
    assert accept_index.tolist() == accept_expected
    assert accept_token_num.tolist() == num_expected
    assert not draft_probs.any(), "draft_probs is neither read nor written"


def random_verify_inputs(bs, nodes, steps, vocab, seed):
    tree, candidates = random_tree(max(bs, 1), nodes, steps, seed=seed, vocab=vocab)
    if bs == 0:  # an idle rank: every tensor with zero requests
        tree = DraftTree(*(getattr(tree, name)[:0] for name in ("tokens", "positions", "retrieve_index", "retrieve_next_token",
                                                                  "retrieve_next_sibling", "mask")), tree.mask_mode, tree.num_steps)
        candidates = candidates[:0]
    generator = torch.Generator().manual_seed(seed)
    target_predict = torch.randint(0, vocab, (bs, nodes), generator=generator)
    first_child = candidates.gather(1, tree.retrieve_next_token.clamp(min=0))
    take = torch.rand(bs, nodes, generator=generator) < 0.6
    target_predict = torch.where(take, first_child, target_predict)
    return tree, candidates, target_predict, generator


@pytest.mark.parametrize("bs, nodes, steps", [(5, 4, 3), (3, 8, 4), (0, 4, 3)])
def test_verify_tree_greedy_matches_native_reference(lane, bs, nodes, steps):
    tree, candidates, target_predict, _ = random_verify_inputs(bs, nodes, steps, 16, seed=nodes)
    predicts, accept_index, accept_token_num = (torch.full((bs * nodes,), 77, dtype=torch.int32),
                                                torch.full((bs, steps + 1), 77, dtype=torch.int32), torch.full((bs,), 77, dtype=torch.int32))
    sgl_kernel.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, tree.retrieve_index,
                                  tree.retrieve_next_token, tree.retrieve_next_sibling, target_predict)
    expected = verify_reference.verify_greedy(tree, candidates, target_predict)
    assert predicts.tolist() == expected.predict.tolist()
    assert accept_index.tolist() == expected.accept_index.tolist()
    assert accept_token_num.tolist() == expected.num_correct.tolist()


@pytest.mark.parametrize("thresholds", [(1.0, 1.0), (0.5, 0.3)])
def test_tree_speculative_sampling_matches_native_reference(lane, thresholds):
    bs, nodes, steps, vocab = 6, 8, 4, 16
    tree, candidates, _, generator = random_verify_inputs(bs, nodes, steps, vocab, seed=3)
    target_probs = torch.softmax(torch.randn(bs, nodes, vocab, generator=generator) * 2, dim=-1)
    coins, final_coins = torch.rand(bs, nodes, generator=generator), torch.rand(bs, generator=generator)
    predicts, accept_index, accept_token_num = output_buffers(bs, nodes, steps + 1)
    inputs = [t.clone() for t in (candidates, target_probs, coins, final_coins)]
    sgl_kernel.tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, tree.retrieve_index,
                                                     tree.retrieve_next_token, tree.retrieve_next_sibling, coins, final_coins,
                                                     target_probs, *thresholds)
    assert all(torch.equal(a, b) for a, b in zip(inputs, (candidates, target_probs, coins, final_coins))), "inputs are not written"
    expected = verify_reference.verify_sampling(tree, candidates, target_probs, coins, final_coins,
                                                threshold_single=thresholds[0], threshold_acc=thresholds[1])
    assert predicts.tolist() == expected.predict.tolist()
    assert accept_index.tolist() == expected.accept_index.tolist()
    assert accept_token_num.tolist() == expected.num_correct.tolist()


def test_verify_rejects_upstream_dtype_errors_by_upstream_name(lane):
    candidates, retrieve_index, next_token, next_sibling, logits = golden_inputs()
    predicts, accept_index, accept_token_num = output_buffers()
    with pytest.raises(InvalidInput, match="^predicts"):
        sgl_kernel.verify_tree_greedy(predicts.long(), accept_index, accept_token_num, candidates, retrieve_index, next_token,
                                      next_sibling, logits.argmax(-1))
    with pytest.raises(InvalidInput, match="^retrive_next_sibling"):
        sgl_kernel.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrieve_index, next_token,
                                      next_sibling[:, :3], logits.argmax(-1))
    with pytest.raises(InvalidInput, match="^retrieve_index"):
        sgl_kernel.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrieve_index, next_token,
                                      next_sibling, logits.argmax(-1), retrieve_index=retrieve_index)


# ---------------------------------------------------------------------------------------------
# build_tree_kernel_efficient

# Hand-worked: topk 2, depth 2, N 4. Step 0 candidates 0, 1 (children of the root); step 1
# candidates 2..5 with parent_list [-1, 0, 1]: candidate 2 -> slot 2 // 2 = 1 -> parent
# candidate parent_list[1] = 0, which is node 1. selected [0, 1, 2]: nodes 1, 2 under the root,
# node 3 under node 1.
HAND_PARENTS = torch.tensor([[-1, 0, 1]])
HAND_SELECTED = torch.tensor([[0, 1, 2]])
HAND_SEQ_LEN = 2
HAND_QLEN_MASK = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


def tree_buffers(bs, nodes, mask):
    return dict(tree_mask=mask, positions=torch.full((bs * nodes,), 99, dtype=torch.int64),
                retrive_index=torch.full((bs, nodes), 99, dtype=torch.int64),
                retrive_next_token=torch.full((bs, nodes), -1, dtype=torch.int64),
                retrive_next_sibling=torch.full((bs, nodes), -1, dtype=torch.int64))


def hand_mask(mode):
    if mode == 1:
        return torch.zeros(16, dtype=torch.bool)
    if mode == 2:
        return torch.zeros(4, dtype=torch.uint8)
    return torch.zeros(4 * (HAND_SEQ_LEN + 4), dtype=torch.bool)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_build_tree_hand_worked_example(lane, mode):
    out = tree_buffers(1, 4, hand_mask(mode))
    sgl_kernel.build_tree_kernel_efficient(HAND_PARENTS, HAND_SELECTED, torch.tensor([HAND_SEQ_LEN]), out["tree_mask"], out["positions"],
                                           out["retrive_index"], out["retrive_next_token"], out["retrive_next_sibling"], 2, 2, 4, mode)
    assert out["positions"].tolist() == [2, 3, 3, 4]
    assert out["retrive_index"].tolist() == [[0, 1, 2, 3]]
    assert out["retrive_next_token"].tolist() == [[1, 3, -1, -1]]
    assert out["retrive_next_sibling"].tolist() == [[-1, 2, -1, -1]]
    if mode == 1:
        assert out["tree_mask"].view(4, 4).int().tolist() == HAND_QLEN_MASK
    elif mode == 2:
        assert out["tree_mask"].tolist() == [0b0001, 0b0011, 0b0101, 0b1011]  # bit j: attends node j
    else:
        rows = out["tree_mask"].view(4, HAND_SEQ_LEN + 4).int().tolist()
        assert rows == [[1, 1] + row for row in HAND_QLEN_MASK]


def random_draft(bs, topk, steps, seed):
    """parents / selected as EAGLE's draft loop makes them (spec_hal's reference expand + organize)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = 32
    probs = torch.rand(bs, topk, generator=generator)
    ids = torch.randint(0, vocab, (bs, topk), generator=generator)
    expansion = tree_reference.expand_tree(0, None, probs, ids)
    records = [expansion.record]
    for step in range(1, steps):
        probs = torch.rand(bs * topk, topk, generator=generator)
        ids = torch.randint(0, vocab, (bs * topk, topk), generator=generator)
        expansion = tree_reference.expand_tree(step, expansion.scores, probs, ids)
        records.append(expansion.record)
    return records


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("bs, topk, steps, nodes", [(3, 2, 3, 6), (2, 4, 2, 8), (0, 2, 2, 4)])
def test_build_tree_matches_native_reference(lane, mode, bs, topk, steps, nodes):
    parents, selected, draft_tokens = tree_reference.organize_draft(random_draft(bs, topk, steps, seed=nodes), nodes)
    seq_lens = torch.arange(3, 3 + bs, dtype=torch.int64)
    mask_mode = sgl_kernel.TREE_MASK_MODES[mode]
    expected = tree_reference.build_tree(seq_lens, parents, selected, draft_tokens, seq_lens, topk=topk, mask_mode=mask_mode)
    size = {0: nodes * int(seq_lens.sum()) + bs * nodes * nodes, 1: bs * nodes * nodes, 2: bs * nodes * (1 if nodes <= 8 else 2)}[mode]
    mask = torch.zeros(size, dtype=torch.uint8 if mode == 2 else torch.bool)
    out = tree_buffers(bs, nodes, mask)
    sgl_kernel.build_tree_kernel_efficient(parents, selected, seq_lens, topk=topk, depth=steps, draft_token_num=nodes,
                                           tree_mask_mode=mode, **out)
    assert out["positions"].tolist() == expected.positions.tolist()
    assert out["retrive_index"].tolist() == expected.retrieve_index.tolist()
    assert out["retrive_next_token"].tolist() == expected.retrieve_next_token.tolist()
    assert out["retrive_next_sibling"].tolist() == expected.retrieve_next_sibling.tolist()
    expected_mask = expected.mask.contiguous().view(torch.uint8) if mode == 2 else expected.mask
    assert out["tree_mask"].reshape(-1).tolist() == expected_mask.reshape(-1).tolist()


def test_build_tree_rejects_a_parent_list_of_the_wrong_depth(lane):
    out = tree_buffers(1, 4, hand_mask(1))
    with pytest.raises(InvalidInput, match="^parent_list"):
        sgl_kernel.build_tree_kernel_efficient(HAND_PARENTS, HAND_SELECTED, torch.tensor([2]), *out.values(), 2, 3, 4, 1)
    with pytest.raises(InvalidInput, match="^tree_mask_mode"):
        sgl_kernel.build_tree_kernel_efficient(HAND_PARENTS, HAND_SELECTED, torch.tensor([2]), *out.values(), 2, 2, 4, 3)


# ---------------------------------------------------------------------------------------------
# renormalisation (FlashInfer docstring examples; flashinfer/sampling.py top_k/top_p_renorm_probs)

DOC_PROBS = torch.tensor([[0.2499, 0.2592, 0.1085, 0.2718, 0.1106], [0.2205, 0.0942, 0.2912, 0.3452, 0.0489],
                          [0.2522, 0.1602, 0.2346, 0.1532, 0.2000], [0.1543, 0.3182, 0.2062, 0.0958, 0.2255]])


def test_top_k_renorm_prob_docstring_example(lane):
    expected = torch.tensor([[0.3201, 0.3319, 0.0000, 0.3480, 0.0000], [0.2573, 0.0000, 0.3398, 0.4028, 0.0000],
                             [0.3672, 0.0000, 0.3416, 0.0000, 0.2912], [0.0000, 0.4243, 0.2750, 0.0000, 0.3007]])
    torch.testing.assert_close(sgl_kernel.top_k_renorm_prob(DOC_PROBS, 3), expected, atol=2e-4, rtol=0)
    torch.testing.assert_close(sgl_kernel.top_k_renorm_probs(DOC_PROBS, torch.tensor([3, 3, 3, 3])), expected, atol=2e-4, rtol=0)
    torch.testing.assert_close(sgl_kernel.top_k_renorm_prob(DOC_PROBS, 1 << 30), DOC_PROBS / DOC_PROBS.sum(1, keepdim=True))


def test_top_p_renorm_prob_docstring_example(lane):
    expected = torch.tensor([[0.0000, 0.4882, 0.0000, 0.5118, 0.0000], [0.0000, 0.0000, 0.0000, 1.0000, 0.0000],
                             [0.5181, 0.0000, 0.4819, 0.0000, 0.0000], [0.0000, 1.0000, 0.0000, 0.0000, 0.0000]])
    torch.testing.assert_close(sgl_kernel.top_p_renorm_prob(DOC_PROBS, 0.3), expected, atol=2e-4, rtol=0)


def test_top_p_renorm_matches_sgl_kernel_benchmark_reference():
    """sgl-kernel/benchmark's torch_top_p_renorm_prob keeps ascending-sorted entries whose CDF is
    >= 1 - p; on rows without ties and away from the boundary the kept sets agree."""
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(64, 50, generator=generator) * 3, dim=-1)
    for top_p in (0.5, 0.9):
        ascending, order = torch.sort(probs, dim=-1)
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter(1, order, torch.cumsum(ascending, -1) >= 1 - top_p)
        kept = torch.where(keep, probs, 0)
        torch.testing.assert_close(sgl_kernel.top_p_renorm_prob(probs, top_p), kept / kept.sum(-1, keepdim=True), atol=1e-5, rtol=0)


def test_top_k_renorm_keeps_ties_and_handles_empty_batches(lane):
    probs = torch.tensor([[0.4, 0.2, 0.2, 0.2]])
    torch.testing.assert_close(sgl_kernel.top_k_renorm_prob(probs, 2), probs)
    assert sgl_kernel.top_k_renorm_prob(torch.zeros(0, 4), 2).shape == (0, 4)
    with pytest.raises(InvalidInput, match="^top_k"):
        sgl_kernel.top_k_renorm_prob(probs, torch.tensor([1, 2]))


# ---------------------------------------------------------------------------------------------
# Mamba state scatter (SGLang's fused_mamba_state_scatter_with_mask, documented in
# sglang/srt/layers/attention/mamba/mamba_state_scatter_triton.py: valid iff step >= 0)


# sgl-kernel's samplers (sgl-kernel/python/sgl_kernel/sampling.py at sgl-project/sglang 1c86442).
SAMPLER_PARAMETERS = {
    "top_p_sampling_from_probs": ["probs", "top_p", "indices", "deterministic", "generator", "check_nan"],
    "top_k_top_p_sampling_from_probs": ["probs", "top_k", "top_p", "indices", "filter_apply_order", "deterministic", "generator", "check_nan"],
    "min_p_sampling_from_probs": ["probs", "min_p", "indices", "deterministic", "generator", "check_nan"],
}


@pytest.mark.parametrize("name", sorted(SAMPLER_PARAMETERS))
def test_samplers_take_sgl_kernel_arguments_in_order(name):
    parameters = list(inspect.signature(getattr(sgl_kernel, name)).parameters)
    assert parameters[:len(SAMPLER_PARAMETERS[name])] == SAMPLER_PARAMETERS[name]


def _sampler_case():
    """sgl-kernel's test_sampling.py setup, smaller: softmax(randn) rows, per-row thresholds."""
    generator = torch.Generator().manual_seed(42)
    probs = torch.softmax(torch.randn(6, 40, generator=generator) * 2, dim=-1)
    return probs, torch.tensor([0.3, 0.5, 0.9, 0.1, 1.0, 0.7]), torch.tensor([1, 3, 5, 10, 40, 2])


def _expected_samples(filtered: torch.Tensor, seed: int) -> torch.Tensor:
    """The native reference's exact inverse-CDF sample of each filtered row with the coins the
    sampler draws from a generator seeded ``seed`` (one float32 uniform per row)."""
    coins = torch.rand(filtered.shape[0], generator=torch.Generator().manual_seed(seed))
    rows = filtered[:, None, :]
    return verify_reference.verify_chain_sampling(torch.zeros(rows.shape[0], 0, dtype=torch.int64), rows[:, :0], rows,
                                                  torch.zeros(rows.shape[0], 0), coins).predict


def test_min_p_sampling_stays_in_the_min_p_set_and_matches_native(lane):
    """sgl-kernel test_min_p_sampling: samples satisfy probs >= min_p * max(row); differential: the
    native reference sampling the renormalised kept set with the same coins."""
    probs, min_p, _ = _sampler_case()
    kept = probs >= min_p[:, None] * probs.amax(dim=1, keepdim=True)
    for seed in range(5):
        samples = sgl_kernel.min_p_sampling_from_probs(probs, min_p, generator=torch.Generator().manual_seed(seed))
        assert samples.dtype == torch.int32
        assert kept.gather(1, samples.long()[:, None]).all()
        filtered = torch.where(kept, probs, 0.0)
        assert samples.tolist() == _expected_samples(filtered / filtered.sum(1, keepdim=True), seed).tolist()


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_top_k_top_p_sampling_stays_in_the_filtered_set(lane, order):
    """sgl-kernel test_top_k_top_p_joint_sampling_from_probs: every sample is in the top-k set and
    in the top-p nucleus (of the original row for "joint", of the top-k renormalised row for
    "top_k_first"); differential: the native reference on the filtered row with the same coins."""
    probs, top_p, top_k = _sampler_case()
    by_k = sgl_kernel.top_k_renorm_probs(probs, top_k)
    nucleus = sgl_kernel.top_p_renorm_probs(by_k if order == "top_k_first" else probs, top_p) > 0
    kept = (by_k > 0) & nucleus
    for seed in range(5):
        samples = sgl_kernel.top_k_top_p_sampling_from_probs(probs, top_k, top_p, filter_apply_order=order,
                                                              generator=torch.Generator().manual_seed(seed))
        assert kept.gather(1, samples.long()[:, None]).all()
        filtered = torch.where(kept, probs, 0.0)
        assert samples.tolist() == _expected_samples(filtered / filtered.sum(1, keepdim=True), seed).tolist()
    with pytest.raises(InvalidInput, match="^filter_apply_order"):
        sgl_kernel.top_k_top_p_sampling_from_probs(probs, top_k, top_p, filter_apply_order="top_p_first")


def test_top_p_sampling_with_indices_maps_outputs_to_rows(lane):
    """indices[i] = j samples output i from row j (sgl-kernel's docstring); output dtype int32."""
    probs, top_p, _ = _sampler_case()
    one_hot = torch.eye(40)[[3, 17, 29]]
    samples = sgl_kernel.top_p_sampling_from_probs(one_hot, 0.9, torch.tensor([2, 0, 0, 1], dtype=torch.int32))
    assert samples.tolist() == [29, 3, 3, 17]
    nucleus = sgl_kernel.top_p_renorm_probs(probs, top_p) > 0
    samples = sgl_kernel.top_p_sampling_from_probs(probs, top_p, generator=torch.Generator().manual_seed(7))
    assert samples.dtype == torch.int32 and nucleus.gather(1, samples.long()[:, None]).all()


def test_fused_mamba_state_scatter_with_mask(lane):
    generator = torch.Generator().manual_seed(0)
    dst = torch.randn(2, 6, 3, 4, generator=generator)
    src = torch.randn(2, 4, 5, 3, 4, generator=generator)
    slots = torch.tensor([4, 0, 2, 5], dtype=torch.int32)
    steps = torch.tensor([2, -1, 0, 4], dtype=torch.int32)
    expected = dst.clone()
    for request in range(4):  # the docstring's loop: for each valid i, dst[:, slot[i]] = src[:, i, step[i]]
        if steps[request] >= 0:
            expected[:, slots[request]] = src[:, request, steps[request]]
    sgl_kernel.fused_mamba_state_scatter_with_mask(dst, src, slots, steps)
    assert torch.equal(dst, expected)


def test_compat_imports_no_upstream_library_and_no_device_work():
    import subprocess
    import sys

    probe = ("import sys, torch; import spec_hal.compat.sgl_kernel, spec_hal.compat.vllm, spec_hal.compat.flashinfer; "
             "print(sorted(m for m in ('sgl_kernel', 'vllm', 'flashinfer') if m in sys.modules), torch.cuda.is_initialized())")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["[]", "False"]
