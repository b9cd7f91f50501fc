"""sgl-kernel's speculative-decoding entry points over spec_hal's native ops.

    from spec_hal.compat import sgl_kernel   # where SGLang does: import sgl_kernel / from sgl_kernel import ...

Names, argument order, dtypes and in-place outputs follow sgl-kernel
(sgl-project/sglang ``sgl-kernel/python/sgl_kernel/speculative.py`` and ``sampling.py``; kernels in
``sgl-kernel/csrc/speculative/eagle_utils.cu`` and ``speculative_sampling.cuh``). The work runs on
the spec_hal backend for the tensors' device, so SGLang gets the tree sampler on ROCm and on any
backend plugin. What differs from upstream (each also in ``docs/compat.md``):

* ``predicts``: rows off the accepted path are written ``-1`` (upstream leaves them untouched),
  and ``accept_index`` past ``accept_token_num`` is written ``-1`` (upstream leaves it; SGLang
  allocates it filled with -1, so it reads the same).
* Sampling: the accept test is ``coin * threshold_acc < acc`` (upstream ``coin <= acc /
  threshold_acc``), and the final token is sampled with exact integer running sums and ``<``
  (upstream: a float block scan and ``<=``). Same coins give the same result except at measure-zero
  boundaries and, for the final token, when float rounding moves a boundary past the coin.
* ``deterministic`` is accepted and ignored: spec_hal is always deterministic.
* ``retrive_index`` is checked for shape only: node ``j`` of request ``b`` is global row
  ``b * N + j``, which is what ``build_tree_kernel_efficient`` writes.
* The tree links may be passed as ``retrive_*`` (older releases, positional or keyword) or
  ``retrieve_*`` (keywords of newer releases and of sgl-kernel's tests).
* Wider dtypes are accepted (int32 or int64 indices) where upstream insists on int64.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from .. import checks
from ..errors import InvalidInput
from ..types import DraftTree
from ..verify import verdict_into
from . import _probs
from . import flashinfer as _flashinfer

# sgl-kernel's TreeMaskMode (eagle_utils.cu): FULL_MASK = 0, QLEN_ONLY = 1, QLEN_ONLY_BITPACKING = 2.
TREE_MASK_MODES = {0: "full", 1: "qlen", 2: "bitpacked"}


# ----------------------------------------------------------------------------------------------
# argument checks under the upstream argument names (metadata only)


def _check_verify_outputs(predicts, accept_index, accept_token_num, candidates) -> tuple[int, int]:
    checks.tensor("candidates", candidates, ndim=2, dtypes=checks.INDEX_DTYPES)
    bs, nodes = candidates.shape
    device = candidates.device
    checks.tensor("predicts", predicts, dtypes=(torch.int32,), device=device, shape=(bs * nodes,))
    checks.tensor("accept_index", accept_index, ndim=2, dtypes=(torch.int32,), device=device, shape=(bs, None))
    if accept_index.shape[1] == 0:
        raise InvalidInput("accept_index", "at least one column (num_spec_step >= 1)", f"shape {tuple(accept_index.shape)}")
    checks.tensor("accept_token_num", accept_token_num, dtypes=(torch.int32,), device=device, shape=(bs,))
    for name, value in (("predicts", predicts), ("accept_index", accept_index), ("accept_token_num", accept_token_num)):
        if not value.is_contiguous():
            raise InvalidInput(name, "a contiguous tensor (written in place)", f"strides {value.stride()}")
    return bs, nodes


def _verify_tree(candidates, retrive_index, retrive_next_token, retrive_next_sibling, num_steps: int) -> DraftTree:
    """The DraftTree that verification reads (links and S); tokens, positions and mask are not read
    by verification, so the candidates stand in for tokens and positions without a copy."""
    bs, nodes = candidates.shape
    for name, value in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                        ("retrive_next_sibling", retrive_next_sibling)):
        checks.tensor(name, value, dtypes=checks.INDEX_DTYPES, device=candidates.device, shape=(bs, nodes))
    flat = candidates.reshape(-1)
    return DraftTree(flat, flat, retrive_index, retrive_next_token, retrive_next_sibling, None, "qlen", num_steps)


def _required(name: str, value: object) -> None:
    if value is None:
        raise InvalidInput(name, "a tensor (a required argument)", "None")


LINK_NAMES = ("index", "next_token", "next_sibling")


def _links(older: tuple, newer: tuple) -> list:
    """The three tree links, given under sgl-kernel's older spelling (``retrive_*``, positional or
    keyword) or its newer one (``retrieve_*`` keywords); exactly one spelling per link."""
    links = []
    for name, old, new in zip(LINK_NAMES, older, newer):
        if (old is None) == (new is None):
            raise InvalidInput(f"retrieve_{name}", f"exactly one of retrive_{name} and retrieve_{name}", "both" if old is not None else "neither")
        links.append(old if old is not None else new)
    return links


def _verify_call(predicts, accept_index, accept_token_num, candidates, older_links: tuple, newer_links: tuple):
    """What both verify functions unpack: (bs, N, the DraftTree verification reads, the caller's
    buffers as the native op's ``out=``)."""
    bs, nodes = _check_verify_outputs(predicts, accept_index, accept_token_num, candidates)
    tree = _verify_tree(candidates, *_links(older_links, newer_links), accept_index.shape[1] - 1)
    return bs, nodes, tree, verdict_into(predicts, accept_index, accept_token_num)


# ----------------------------------------------------------------------------------------------
# verification


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: Optional[torch.Tensor] = None,
    retrive_next_token: Optional[torch.Tensor] = None,
    retrive_next_sibling: Optional[torch.Tensor] = None,
    target_predict: Optional[torch.Tensor] = None,
    *,
    retrieve_index: Optional[torch.Tensor] = None,
    retrieve_next_token: Optional[torch.Tensor] = None,
    retrieve_next_sibling: Optional[torch.Tensor] = None,
) -> None:
    """Greedy tree verification, in place (native: ``spec_hal.verify_greedy``).

    Args (sgl-kernel layout):
        predicts: (bs*N,) int32, written: the target's token at every accepted node, -1 elsewhere.
        accept_index: (bs, S+1) int32, written: global node ids of the accepted path, -1 padded.
        accept_token_num: (bs,) int32, written: accepted draft tokens (the bonus not counted).
        candidates: (bs, N) int64 node tokens (node 0 the root).
        retrive_index, retrive_next_token, retrive_next_sibling: (bs, N) int64 from
            ``build_tree_kernel_efficient`` (-1: none).
        target_predict: (bs, N) int64 target argmax at every node.
    """
    import spec_hal

    _, _, tree, out = _verify_call(predicts, accept_index, accept_token_num, candidates, (retrive_index, retrive_next_token, retrive_next_sibling),
                                   (retrieve_index, retrieve_next_token, retrieve_next_sibling))
    _required("target_predict", target_predict)
    checks.tensor("target_predict", target_predict, dtypes=checks.INDEX_DTYPES, device=candidates.device, shape=tuple(candidates.shape))
    spec_hal.verify_greedy(tree, candidates, target_predict, out=out)


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: Optional[torch.Tensor] = None,
    retrive_next_token: Optional[torch.Tensor] = None,
    retrive_next_sibling: Optional[torch.Tensor] = None,
    uniform_samples: Optional[torch.Tensor] = None,
    uniform_samples_for_final_sampling: Optional[torch.Tensor] = None,
    target_probs: Optional[torch.Tensor] = None,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
    *,
    draft_probs: Optional[torch.Tensor] = None,
    retrieve_index: Optional[torch.Tensor] = None,
    retrieve_next_token: Optional[torch.Tensor] = None,
    retrieve_next_sibling: Optional[torch.Tensor] = None,
) -> None:
    """Target-only tree speculative sampling, in place (native: ``spec_hal.verify_sampling``).

    Args (sgl-kernel layout):
        predicts, accept_index, accept_token_num: written as in :func:`verify_tree_greedy`;
            predicts holds the accepted drafts and the sampled final token on the path.
        candidates, retrive_*: as in :func:`verify_tree_greedy`.
        uniform_samples: (bs, N) float32 coins; the coin used after accepting node j is [b, j].
        uniform_samples_for_final_sampling: (bs,) float32 coin of the final token.
        target_probs: (bs, N, V) float32 target distribution at every node.
        threshold_single, threshold_acc: floats in [0, 1] (1.0: lossless).
        deterministic: ignored (spec_hal is always deterministic).
        draft_probs: older sgl-kernel releases took a (bs, N, V) zero tensor here and wrote the
            rejected tokens' target probabilities into it. spec_hal neither reads nor writes it
            (the residual removes rejected tokens without mutating any input); a caller that
            reads it back after the call gets its own values.
    """
    import spec_hal

    del deterministic, draft_probs
    bs, nodes, tree, out = _verify_call(predicts, accept_index, accept_token_num, candidates,
                                        (retrive_index, retrive_next_token, retrive_next_sibling),
                                        (retrieve_index, retrieve_next_token, retrieve_next_sibling))
    for name, value in (("uniform_samples", uniform_samples), ("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling),
                        ("target_probs", target_probs)):
        _required(name, value)
    checks.tensor("target_probs", target_probs, ndim=3, dtypes=(torch.float32,), device=candidates.device, shape=(bs, nodes, None))
    checks.tensor("uniform_samples", uniform_samples, dtypes=(torch.float32,), device=candidates.device, shape=(bs, nodes))
    checks.tensor("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, dtypes=(torch.float32,),
                  device=candidates.device, shape=(bs,))
    spec_hal.verify_sampling(tree, candidates, target_probs, uniform_samples, uniform_samples_for_final_sampling,
                             threshold_single=threshold_single, threshold_acc=threshold_acc, out=out)


# ----------------------------------------------------------------------------------------------
# tree building


def _check_build_tree(parent_list, selected_index, verified_seq_len, topk, depth, draft_token_num, tree_mask_mode) -> str:
    checks.tensor("parent_list", parent_list, ndim=2, dtypes=(torch.int64,))
    bs = parent_list.shape[0]
    device = parent_list.device
    checks.integer("topk", topk, low=1)
    checks.integer("depth", depth, low=1)
    checks.integer("draft_token_num", draft_token_num, low=1)
    widths = (topk * (depth - 1) + 1,) + ((0,) if depth == 1 else ())
    if parent_list.shape[1] not in widths:
        raise InvalidInput("parent_list", f"topk * (depth - 1) + 1 = {widths[0]} columns", f"shape {tuple(parent_list.shape)}")
    checks.tensor("selected_index", selected_index, dtypes=(torch.int64,), device=device, shape=(bs, draft_token_num - 1))
    checks.tensor("verified_seq_len", verified_seq_len, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs,))
    if tree_mask_mode not in TREE_MASK_MODES:
        raise InvalidInput("tree_mask_mode", "0 (FULL_MASK), 1 (QLEN_ONLY) or 2 (QLEN_ONLY_BITPACKING)", repr(tree_mask_mode))
    return TREE_MASK_MODES[tree_mask_mode]


def _bitpacked_bytes(draft_token_num: int) -> int:
    return 1 if draft_token_num <= 8 else 2 if draft_token_num <= 16 else 4


def _check_tree_outputs(tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling, bs, nodes, mode, device) -> None:
    checks.tensor("positions", positions, dtypes=(torch.int64,), device=device, shape=(bs * nodes,))
    for name, value in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                        ("retrive_next_sibling", retrive_next_sibling)):
        checks.tensor(name, value, dtypes=(torch.int64,), device=device, shape=(bs, nodes))
    if mode == "bitpacked":
        checks.tensor("tree_mask", tree_mask, dtypes=(torch.uint8,), device=device)
        if tree_mask.numel() != bs * nodes * _bitpacked_bytes(nodes):
            raise InvalidInput("tree_mask", f"{bs * nodes * _bitpacked_bytes(nodes)} uint8 elements (bs * N * bytes per row)", f"{tree_mask.numel()}")
    else:
        checks.tensor("tree_mask", tree_mask, dtypes=(torch.bool,), device=device)
        if mode == "qlen" and tree_mask.numel() != bs * nodes * nodes:
            raise InvalidInput("tree_mask", f"{bs * nodes * nodes} elements (bs * N * N)", f"{tree_mask.numel()}")
        if mode == "full" and (tree_mask.numel() < bs * nodes * nodes or (tree_mask.numel() - bs * nodes * nodes) % nodes):
            raise InvalidInput("tree_mask", "N * sum(verified_seq_len) + bs * N * N elements", f"{tree_mask.numel()}")
    for name, value in (("tree_mask", tree_mask), ("positions", positions)):
        if not value.is_contiguous():
            raise InvalidInput(name, "a contiguous tensor (written in place)", f"strides {value.stride()}")


def build_tree_kernel_efficient(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """The EAGLE verify tree, written in place (native: ``spec_hal.build_tree``).

    Args (sgl-kernel layout):
        parent_list: (bs, topk*(depth-1)+1) int64 (or (bs, 0) for depth 1).
        selected_index: (bs, draft_token_num-1) int64 candidate indices, ascending.
        verified_seq_len: (bs,) int64 committed lengths.
        tree_mask: written. tree_mask_mode 0 (FULL_MASK): flat bool of
            ``N * sum(seq_len) + bs * N * N``, per request N rows of seq_len + N columns (prefix
            columns written True); 1 (QLEN_ONLY): bool (bs*N*N,); 2 (QLEN_ONLY_BITPACKING): uint8,
            ``bs*N`` rows of 1, 2 or 4 bytes (N <= 8, 16, 32), little-endian bit j = attends node j.
        positions: (bs*N,) int64, written: seq_len + depth.
        retrive_index, retrive_next_token, retrive_next_sibling: (bs, N) int64, written
            (b*N + j; first child; next sibling; -1 none).
        topk, depth, draft_token_num (N), tree_mask_mode: as upstream.

    Unreachable nodes (parent not selected) are skipped as upstream skips them; their mask row and
    position follow spec_hal's bounded walk (spec_hal/tree.py) where upstream reads past the
    selected list.
    """
    import spec_hal

    mode = _check_build_tree(parent_list, selected_index, verified_seq_len, topk, depth, draft_token_num, tree_mask_mode)
    bs, nodes = parent_list.shape[0], draft_token_num
    _check_tree_outputs(tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling, bs, nodes, mode, parent_list.device)
    seq_lens_sum = (tree_mask.numel() - bs * nodes * nodes) // nodes if mode == "full" else None
    # Tokens are not outputs of the upstream op: selected_index and verified_seq_len stand in for
    # the draft and root tokens (their values only reach DraftTree.tokens, which is discarded).
    tree = spec_hal.build_tree(verified_seq_len, parent_list, selected_index, selected_index, verified_seq_len,
                               topk=topk, mask_mode=mode, seq_lens_sum=seq_lens_sum)
    # One multi-tensor copy for the four int64 outputs (a single launch on a GPU where torch's
    # foreach fast path applies, four copies elsewhere), then the mask.
    torch._foreach_copy_([positions, retrive_index, retrive_next_token, retrive_next_sibling],
                         [tree.positions, tree.retrieve_index, tree.retrieve_next_token, tree.retrieve_next_sibling])
    mask = tree.mask.contiguous().view(torch.uint8) if mode == "bitpacked" else tree.mask
    tree_mask.view(-1).copy_(mask.reshape(-1))


# ----------------------------------------------------------------------------------------------
# probability renormalisation (sgl_kernel/sampling.py names; compat-owned, see _probs.py)


def top_k_renorm_probs(probs: torch.Tensor, top_k: Union[torch.Tensor, int]) -> torch.Tensor:
    """(bs, V) float32: keep the top-k probabilities of each row, zero the rest, renormalise.

    ``top_k``: an int or a (bs,) int tensor; ``k >= V`` (SGLang's ``1 << 30``) keeps the row.
    Ties at the k-th value are all kept (upstream's pivot search also keeps them).
    """
    return _probs.top_k_renorm(_probs.check_probs("probs", probs), top_k)


def top_p_renorm_probs(probs: torch.Tensor, top_p: Union[torch.Tensor, float]) -> torch.Tensor:
    """(bs, V) float32: keep the smallest top set of each row whose mass reaches ``top_p``
    (ties at the boundary kept), zero the rest, renormalise. ``top_p``: a float or (bs,) tensor."""
    return _probs.top_p_renorm(_probs.check_probs("probs", probs), top_p)


top_k_renorm_prob = top_k_renorm_probs
top_p_renorm_prob = top_p_renorm_probs


# sgl_kernel/sampling.py's samplers (SGLang's sampler and speculative paths call them) take
# FlashInfer's arguments in FlashInfer's order: (probs, top_p | min_p | top_k, top_p, indices,
# [filter_apply_order,] deterministic, generator, check_nan) -> (bs,) int32 (read at
# sgl-project/sglang 1c86442). spec_hal.compat.flashinfer's functions are those, with two trailing
# FlashInfer arguments (seed, offset) that sgl-kernel lacks. Older sgl-kernel releases took
# ``uniform_samples`` second and returned (samples, success); that form is not provided.
top_p_sampling_from_probs = _flashinfer.top_p_sampling_from_probs
top_k_top_p_sampling_from_probs = _flashinfer.top_k_top_p_sampling_from_probs
min_p_sampling_from_probs = _flashinfer.min_p_sampling_from_probs


# ----------------------------------------------------------------------------------------------
# Mamba state (SGLang's Python helper, sglang/srt/layers/attention/mamba/mamba_state_scatter_triton.py)


def fused_mamba_state_scatter_with_mask(dst: torch.Tensor, src: torch.Tensor, dst_indices_raw: torch.Tensor,
                                        step_indices_raw: torch.Tensor) -> None:
    """``dst[:, dst_indices_raw[i]] = src[:, i, step_indices_raw[i]]`` for every layer, in place
    (native: ``spec_hal.scatter_mamba_state``).

    Args (SGLang layout):
        dst: (L, slots, *state) pool, written in place.
        src: (L, requests, N, *state) per-step scratch of the verify forward.
        dst_indices_raw: (requests,) int32/int64 pool slot of each request.
        step_indices_raw: (requests,) int32/int64 step to commit; a negative step skips the request.

    As upstream, a request whose slot or step is out of range is skipped (checked mode,
    ``SPEC_HAL_CHECKS=1``, raises instead). Differs: any backend (upstream is CUDA-only), and the
    state dimensions must be contiguous while layer/slot/row/step strides may be anything
    (upstream requires fully contiguous tensors).
    """
    import spec_hal

    spec_hal.scatter_mamba_state(dst=dst, src=src, dst_slots=dst_indices_raw, src_steps=step_indices_raw)
