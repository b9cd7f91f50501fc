"""Triton kernels of family ``tree``: ``build_tree``, ``expand_tree`` and ``organize_draft``, one
launch each (plus torch's gathers and concatenations noted below). Semantics: spec_hal/tree.py.

build_tree: one program per request holds the whole tree in registers as N_PAD x N_PAD matrices (N <= 64, so
at most 4096 elements): row i is node i, column j is node j.

1. Parent search: node i's candidate ``c = selected[i-1]`` has a parent slot ``c // K``; its
   parent node is the first j with ``selected[j-1] == parents[c // K]``, found as a masked min
   over the row. The search covers exactly the N-1 selected entries and a slot outside
   ``[1, parents.shape[1])`` is never loaded, so a missing parent cannot cause a read past a row.
2. Ancestor walk, all nodes at once, at most S steps: ``up = parent[current]`` is a gather from a
   register vector, done as a one-hot masked sum over the row. Each step sets column ``up`` of
   the mask row; the walk stops at the root (reachable) or at a missing parent (unreachable).
3. Links over reachable nodes only: ``next_token[p]`` = the smallest child of p, ``next_sibling[i]``
   = the smallest later node with the same parent: two masked mins, no serial list building.
4. Stores: tokens, positions = seq_len + depth, retrieve_index, links and the mask in its mode
   (qlen bool rows, full bool rows at ``block_start + row * (seq_len + N) + seq_len``, or one
   packed integer per row).

``expand_tree`` in one launch (``_expand_kernel``, plus torch's ``index_select`` for the hidden
rows): one program per request computes the K*K path scores and makes the K picks of the stable
sort (largest first, ties to the lower candidate index, NaN as -inf) as K max/min reductions. The
reference runs about a dozen small torch ops per call (conversions, a product, a stable sort,
gathers, aranges): each is a launch even in a captured graph, and eagerly they cost more host
time than the op's own work (issue 15). ``organize_draft``: its S records arrive as a Python list,
so torch concatenates their scores and tokens (two launches), then ``_organize_kernel`` makes the
N-1 picks of the same stable rule per request and writes them in ascending order with their
tokens; over ORGANIZE_MAX_CANDIDATES candidates per request it runs the reference.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from spec_hal.tree import bitpacked_dtype, candidate_lists, full_mask_block_starts, full_mask_numel, record_parents, tree_num_steps
from spec_hal.tree import organize_draft as reference_organize_draft
from spec_hal.device_buffers import carve
from spec_hal.types import DraftTree, Expansion, TreeRecord

from spec_hal import error_flag

from .error_flag import ARGUMENT_STEP, record_invalid
from .launch import KernelTarget, next_power_of_2

MASK_QLEN, MASK_FULL, MASK_BITPACKED = 0, 1, 2
_MASK_CODES = {"qlen": MASK_QLEN, "full": MASK_FULL, "bitpacked": MASK_BITPACKED}


@triton.jit
def _build_tree_kernel(
    roots_ptr, roots_stride,
    parents_ptr, parents_stride,
    selected_ptr, selected_stride,
    draft_tokens_ptr, draft_tokens_stride,
    seq_lens_ptr, seq_lens_stride,
    block_starts_ptr, mask_numel, flag_ptr, flag_code,
    outputs_ptr, mask_ptr,
    parent_columns, topk, num_steps,
    N: tl.constexpr,
    N_PAD: tl.constexpr,
    MASK_MODE: tl.constexpr,
):
    request = tl.program_id(0).to(tl.int64)
    node = tl.arange(0, N_PAD)
    row = node[:, None]
    col = node[None, :]
    is_node = node < N
    is_draft = (node >= 1) & is_node

    # 1. Parent node of every node: 0 for root children, -1 for none (and the root itself).
    candidate = tl.load(selected_ptr + request * selected_stride + (node - 1), mask=is_draft, other=-1).to(tl.int64)
    root_child = (candidate >= 0) & (candidate < topk)
    slot = tl.where(candidate >= 0, candidate, 0) // topk
    has_slot = is_draft & (candidate >= topk) & (slot < parent_columns)
    parent_candidate = tl.load(parents_ptr + request * parents_stride + slot, mask=has_slot, other=-1)
    match = (parent_candidate[:, None] == candidate[None, :]) & has_slot[:, None] & (col >= 1) & (col < N)
    first_match = tl.min(tl.where(match, col, N_PAD), axis=1)
    parent = tl.where(root_child, 0, tl.where(first_match < N_PAD, first_match, -1))
    parent = tl.where(is_draft, parent, -1)

    # 2. Ancestor walk, bounded by S steps.
    in_mask = ((col == 0) | (col == row)) & (row < N)
    current = node
    walking = is_draft
    reachable = node == 0
    for _ in range(num_steps):
        up = tl.sum(tl.where(col == current[:, None], parent[None, :], 0), axis=1)
        reachable = reachable | (walking & (up == 0))
        walking = walking & (up > 0)
        in_mask = in_mask | ((col == up[:, None]) & walking[:, None])
        current = tl.where(walking, up, current)
    depth = tl.sum(in_mask.to(tl.int32), axis=1) - 1

    # 3. Links over reachable nodes, children and siblings in ascending node order.
    linked_parent = tl.where(reachable & is_draft, parent, -2)
    first_child = tl.min(tl.where(linked_parent[None, :] == row, col, N_PAD), axis=1)
    later_sibling = (linked_parent[None, :] == linked_parent[:, None]) & (col > row) & (linked_parent[:, None] >= 0)
    next_sibling = tl.min(tl.where(later_sibling, col, N_PAD), axis=1)

    # 4. Stores: the seven int64 outputs are planes of one (7, bs * N) buffer (one pointer, not
    # seven: kernel arguments live in scalar registers, and AMD's 100 SGPRs spilled).
    out = request * N + node
    plane = tl.num_programs(0).to(tl.int64) * N
    tokens_ptr = outputs_ptr
    positions_ptr = outputs_ptr + plane
    retrieve_index_ptr = outputs_ptr + 2 * plane
    next_token_ptr = outputs_ptr + 3 * plane
    next_sibling_ptr = outputs_ptr + 4 * plane
    node_parents_ptr = outputs_ptr + 5 * plane
    node_depth_ptr = outputs_ptr + 6 * plane
    root = tl.load(roots_ptr + request * roots_stride).to(tl.int64)
    draft = tl.load(draft_tokens_ptr + request * draft_tokens_stride + (node - 1), mask=is_draft, other=0).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + request * seq_lens_stride).to(tl.int64)
    record_invalid(flag_ptr, flag_code, seq_len < 0, request)  # rule: a negative length counts as 0
    seq_len = tl.maximum(seq_len, 0)
    tl.store(tokens_ptr + out, tl.where(node == 0, root, draft), mask=is_node)
    tl.store(positions_ptr + out, seq_len + depth, mask=is_node)
    tl.store(retrieve_index_ptr + out, out, mask=is_node)
    tl.store(node_parents_ptr + out, tl.where(reachable & is_draft, parent, -1).to(tl.int64), mask=is_node)
    tl.store(node_depth_ptr + out, tl.where(reachable, depth, -1).to(tl.int64), mask=is_node)
    tl.store(next_token_ptr + out, tl.where(first_child < N_PAD, first_child, -1).to(tl.int64), mask=is_node)
    tl.store(next_sibling_ptr + out, tl.where(next_sibling < N_PAD, next_sibling, -1).to(tl.int64), mask=is_node)
    in_tree = (row < N) & (col < N)
    if MASK_MODE == 0:
        tl.store(mask_ptr + request * (N * N) + row * N + col, in_mask.to(tl.uint8), mask=in_tree)
    elif MASK_MODE == 1:
        block_start = tl.load(block_starts_ptr + request)
        offset = block_start + row * (seq_len + N) + seq_len + col
        # A seq_lens_sum below sum(seq_lens) sizes the mask too small: drop what falls past it.
        inside = offset < mask_numel
        tl.store(mask_ptr + offset, in_mask.to(tl.uint8), mask=in_tree & inside)
        overflow = tl.max(tl.max((in_tree & (offset >= mask_numel)).to(tl.int32), axis=1), axis=0) > 0
        record_invalid(flag_ptr, flag_code + ARGUMENT_STEP, overflow, request)
    else:
        bits = tl.sum(tl.where(in_mask & (col < N), tl.full((1, N_PAD), 1, tl.int64) << col.to(tl.int64), 0), axis=1)
        tl.store(mask_ptr + out, bits, mask=is_node)


@triton.jit
def _stable_pick(ranked, remaining, lane, PAD: tl.constexpr):
    """The next pick of spec_hal.tree.stable_top_indices' rule among the ``remaining`` lanes: the
    largest ``ranked`` score (NaN already -inf), ties to the lower lane. Returns (the lane picked,
    ``remaining`` without it)."""
    best = tl.max(tl.where(remaining, ranked, float("-inf")), axis=0)
    choice = tl.min(tl.where(remaining & (ranked == best), lane, PAD), axis=0)
    return choice, remaining & (lane != choice)


@triton.jit
def _expand_kernel(
    scores_ptr, scores_stride_b, scores_stride_k,
    probs_ptr, probs_stride_row, probs_stride_col,
    ids_ptr, ids_stride_row, ids_stride_col,
    lane_ids_ptr, lane_scores_ptr, hidden_rows_ptr, path_scores_ptr, tokens_ptr, parents_ptr,
    first_candidate,
    K: tl.constexpr,
    PAD: tl.constexpr,
    FIRST: tl.constexpr,
):
    """One request per program. FIRST (step 0): lane j takes ids[b, j] and probs[b, j]; parents are
    [-1, 0, ..., K-1]. Later steps: the K*K path scores scores[b, r] * probs[b*K + r, c] (flat f =
    r*K + c, PAD >= K*K lanes), then K picks, each the largest remaining score with ties to the
    lower f and NaN ranked as -inf: exactly spec_hal.tree.stable_top_indices."""
    b = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, PAD)
    if FIRST:
        is_lane = lane < K
        token = tl.load(ids_ptr + b * ids_stride_row + lane * ids_stride_col, mask=is_lane, other=0).to(tl.int64)
        prob = tl.load(probs_ptr + b * probs_stride_row + lane * probs_stride_col, mask=is_lane, other=0).to(tl.float32)
        tl.store(lane_ids_ptr + b * K + lane, token, mask=is_lane)
        tl.store(lane_scores_ptr + b * K + lane, prob, mask=is_lane)
        tl.store(hidden_rows_ptr + b * K + lane, tl.zeros((PAD,), tl.int64) + b, mask=is_lane)
        tl.store(parents_ptr + b * (K + 1) + lane, lane.to(tl.int64) - 1, mask=lane < K + 1)
    else:
        is_candidate = lane < K * K
        parent_lane = lane // K
        child = lane % K
        row = b * K + parent_lane
        prior = tl.load(scores_ptr + b * scores_stride_b + parent_lane * scores_stride_k, mask=is_candidate, other=0).to(tl.float32)
        prob = tl.load(probs_ptr + row * probs_stride_row + child * probs_stride_col, mask=is_candidate, other=0).to(tl.float32)
        path = prior * prob
        token = tl.load(ids_ptr + row * ids_stride_row + child * ids_stride_col, mask=is_candidate, other=0).to(tl.int64)
        tl.store(path_scores_ptr + b * (K * K) + lane, path, mask=is_candidate)
        tl.store(tokens_ptr + b * (K * K) + lane, token, mask=is_candidate)
        ranked = tl.where(path != path, float("-inf"), path)
        remaining = is_candidate
        for pick in range(K):
            choice, remaining = _stable_pick(ranked, remaining, lane, PAD)
            # The chosen candidate's values are read again (scalar loads, the same product):
            # exact, where a reduction over the tile could turn -0.0 into 0.0.
            chosen_row = b * K + choice // K
            chosen_prior = tl.load(scores_ptr + b * scores_stride_b + (choice // K) * scores_stride_k).to(tl.float32)
            chosen_prob = tl.load(probs_ptr + chosen_row * probs_stride_row + (choice % K) * probs_stride_col).to(tl.float32)
            chosen_token = tl.load(ids_ptr + chosen_row * ids_stride_row + (choice % K) * ids_stride_col).to(tl.int64)
            tl.store(lane_ids_ptr + b * K + pick, chosen_token)
            tl.store(lane_scores_ptr + b * K + pick, chosen_prior * chosen_prob)
            tl.store(hidden_rows_ptr + b * K + pick, chosen_row)
            tl.store(parents_ptr + b * K + pick, first_candidate + choice)


@triton.jit
def _organize_kernel(
    scores_ptr, tokens_ptr, selected_ptr, draft_tokens_ptr, candidates, picks,
    C_PAD: tl.constexpr,
):
    """One request per program over its row of the concatenated candidate scores and tokens
    (bs, candidates), both contiguous: ``picks`` (N-1) picks, each the largest remaining score with
    ties to the lower index and NaN as -inf (spec_hal.tree.stable_top_indices), then the picked
    indices in ascending order (a prefix count gives each its output column) and their tokens."""
    b = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, C_PAD)
    is_candidate = lane < candidates
    score = tl.load(scores_ptr + b * candidates + lane, mask=is_candidate, other=0.0)
    ranked = tl.where(score != score, float("-inf"), score)
    remaining = is_candidate
    for _ in range(picks):
        _, remaining = _stable_pick(ranked, remaining, lane, C_PAD)
    picked = is_candidate & ~remaining
    column = tl.cumsum(picked.to(tl.int32), axis=0) - 1
    token = tl.load(tokens_ptr + b * candidates + lane, mask=picked, other=0)
    tl.store(selected_ptr + b * picks + column, lane.to(tl.int64), mask=picked)
    tl.store(draft_tokens_ptr + b * picks + column, token, mask=picked)


@dataclass(frozen=True)
class TreeLaunch:
    padded_nodes: int
    num_warps: int


@functools.lru_cache(maxsize=1024)  # a pure function of ints: computed once per shape
def launch_config(target: KernelTarget, num_nodes: int) -> TreeLaunch:
    """Warps per program from the N_PAD^2 matrix size; the interpreter runs one program at a time.

    NVIDIA: about 8 elements per lane, at most 4 warps. AMD: about 4 elements per lane, up to 16
    wavefronts (1024 lanes at N = 64): with 8 per lane and 2 wavefronts, as on NVIDIA, the N = 32
    and N = 64 tiles spilled (up to ~650 VGPR spills at N = 64), and 8 wavefronts at N = 64 still
    spilled SGPRs (the compile matrix's resource report)."""
    padded = max(next_power_of_2(num_nodes), 2)
    if target.vendor == "interpreter":
        return TreeLaunch(padded, 1)
    elements_per_lane, max_lanes = (4, 1024) if target.vendor == "amd" else (8, 128)
    lanes_wanted = max(padded * padded // elements_per_lane, target.warp_size)
    return TreeLaunch(padded, min(max(lanes_wanted // target.warp_size, 1), max_lanes // target.warp_size))


def _mask_buffer(mask_mode: str, bs: int, num_nodes: int, seq_lens: torch.Tensor, seq_lens_sum: Optional[int]) -> torch.Tensor:
    device = seq_lens.device
    if mask_mode == "qlen":
        return torch.empty((bs, num_nodes, num_nodes), dtype=torch.bool, device=device)
    if mask_mode == "full":  # prefix columns are True; the kernel writes the tree columns
        return torch.ones(full_mask_numel(seq_lens, num_nodes, seq_lens_sum), dtype=torch.bool, device=device)
    return torch.empty((bs, num_nodes), dtype=bitpacked_dtype(num_nodes), device=device)


def _dense_rows(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.shape[1] <= 1 or tensor.stride(1) == 1 else tensor.contiguous()


def build_tree(
    roots: torch.Tensor,
    parents: torch.Tensor,
    selected: torch.Tensor,
    draft_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    topk: int,
    mask_mode: str = "qlen",
    seq_lens_sum: Optional[int] = None,
    target: KernelTarget,
) -> DraftTree:
    """Triton provider of ``build_tree`` (arguments validated by the caller; see spec_hal.tree)."""
    # int32 accepted (docs/conventions.md). Tested first: even a no-op .long() costs a microsecond.
    parents = parents if parents.dtype == torch.int64 else parents.long()
    selected = selected if selected.dtype == torch.int64 else selected.long()
    bs, drafts = selected.shape
    num_nodes = drafts + 1
    num_steps = tree_num_steps(parents.shape[1], topk)
    device = selected.device
    # Planes: tokens, positions, then the links (index, next token, next sibling, parent, depth),
    # one allocation and one unbind (a Python index per plane costs more than the launch's share).
    outputs = torch.empty((7, bs, num_nodes), dtype=torch.int64, device=device)
    tokens, positions, index, next_token, next_sibling, parent_links, depth = outputs.unbind(0)
    mask = _mask_buffer(mask_mode, bs, num_nodes, seq_lens, seq_lens_sum)
    tree = DraftTree(tokens.view(-1), positions.view(-1), index, next_token, next_sibling, mask, mask_mode, num_steps,
                     parents=parent_links, depth=depth)
    if bs == 0:
        return tree
    block_starts = full_mask_block_starts(seq_lens, num_nodes) if mask_mode == "full" else tree.positions
    config = launch_config(target, num_nodes)
    # The kernel takes row strides only: rows of the 2-D inputs must be dense (small copies if not).
    parents, selected, draft_tokens = (_dense_rows(t) for t in (parents, selected, draft_tokens))
    parents_or_placeholder = parents if parents.shape[1] else selected  # an empty tensor may have no address
    _build_tree_kernel[(bs,)](
        roots, roots.stride(0), parents_or_placeholder, parents.stride(0), selected, selected.stride(0),
        draft_tokens, draft_tokens.stride(0), seq_lens, seq_lens.stride(0), block_starts, mask.numel(),
        error_flag.flag(device), error_flag.code("build_tree", "seq_lens"),
        outputs, mask.view(torch.uint8) if mask.dtype == torch.bool else mask, parents.shape[1], topk, num_steps,
        N=num_nodes, N_PAD=config.padded_nodes, MASK_MODE=_MASK_CODES[mask_mode], num_warps=config.num_warps,
    )
    return tree


@functools.lru_cache(maxsize=1024)  # a pure function of ints
def pick_launch(target: KernelTarget, lanes: int) -> tuple[int, int]:
    """(lanes padded to a power of two, warps) of the picking kernels: about 8 lanes a thread, at
    most 8 warps (4096 candidates: 16 a thread)."""
    padded = max(next_power_of_2(lanes), 2)
    if target.vendor == "interpreter":
        return padded, 1
    return padded, max(1, min(8, padded // (8 * target.warp_size)))


def expand_launch(target: KernelTarget, topk: int, first: bool) -> tuple[int, int]:
    """(PAD, warps) of ``_expand_kernel``: PAD lanes hold the K + 1 parents (step 0) or the K*K
    candidates."""
    return pick_launch(target, topk + 1 if first else topk * topk)


def expand_tree(step, scores, probs, ids, *, hidden=None, target: KernelTarget) -> Expansion:
    """Triton provider of ``expand_tree`` (arguments validated by the caller; see spec_hal.tree):
    one launch for the lanes, the record and the K picks, plus ``index_select`` for the hidden
    rows. Outputs come from two allocations (device_buffers.carve); at step 0 the lane scores and
    tokens are also the record's, as the reference's ``.to`` returns one tensor for both."""
    first = step == 0
    bs, topk = probs.shape if first else scores.shape
    width, parent_width = (topk, topk + 1) if first else (topk * topk, topk)
    lanes = bs * topk
    device = probs.device
    lane_ids, hidden_rows, parents, tokens = carve((lanes, lanes, bs * parent_width, 0 if first else bs * width), torch.int64, device)
    lane_scores, path_scores = carve((lanes, 0 if first else bs * width), torch.float32, device)
    if bs:
        padded, warps = expand_launch(target, topk, first)
        previous = probs if first else scores  # placeholder at step 0, never read
        _expand_kernel[(bs,)](
            previous, previous.stride(0), previous.stride(1), probs, probs.stride(0), probs.stride(1), ids, ids.stride(0), ids.stride(1),
            lane_ids, lane_scores, hidden_rows, path_scores if not first else lane_scores, tokens if not first else lane_ids, parents,
            0 if first else topk * topk * (step - 1) + topk, K=topk, PAD=padded, FIRST=first, num_warps=warps,
        )
    scores_out = lane_scores.view(bs, topk)
    record = TreeRecord(scores_out if first else path_scores.view(bs, width), lane_ids.view(bs, topk) if first else tokens.view(bs, width),
                        parents.view(bs, parent_width))
    gathered = None if hidden is None else hidden.index_select(0, hidden_rows)
    return Expansion(lane_ids, scores_out, hidden_rows, gathered, record)


# Candidates per request up to which organize_draft runs its kernel: C_PAD lanes in one program,
# at most 16 a thread at 8 warps (4096: K = 8 with 64 steps, or K = 64 with 1). Larger lists take
# the reference (a stable sort), which is exact at any size.
ORGANIZE_MAX_CANDIDATES = 4096


def organize_draft(records, num_draft_tokens, *, target: KernelTarget):
    """Triton provider of ``organize_draft`` (validated by the caller; see spec_hal.tree): the
    records' scores and tokens concatenated by torch (two launches; the parents as the reference
    does), then one program per request picks and orders the N-1 best. Over
    ORGANIZE_MAX_CANDIDATES candidates per request, the reference."""
    bs = records[0].scores.shape[0]
    candidates = sum(record.scores.shape[1] for record in records)
    if candidates > ORGANIZE_MAX_CANDIDATES:
        return reference_organize_draft(records, num_draft_tokens)
    scores, tokens = candidate_lists(records)
    picks = num_draft_tokens - 1
    selected, draft_tokens = carve((bs * picks, bs * picks), torch.int64, scores.device)
    if bs and picks:
        padded, warps = pick_launch(target, candidates)
        _organize_kernel[(bs,)](scores, tokens, selected, draft_tokens, candidates, picks, C_PAD=padded, num_warps=warps)
    return record_parents(records), selected.view(bs, picks), draft_tokens.view(bs, picks)


PROVIDERS = {
    "build_tree": (build_tree, "kernels/tree.py: one program per request, links and mask as N x N register tiles"),
    "expand_tree": (expand_tree, "kernels/tree.py: one program per request, K*K path scores and K stable picks, 1 launch (+ hidden gather)"),
    "organize_draft": (organize_draft, "kernels/tree.py: torch.cat of the records + one program per request picking and ordering the N-1 best"),
}

_MASK_POINTER = {"qlen": "*u8", "full": "*u8"}
_BITPACKED_POINTER = {torch.uint8: "*u8", torch.int16: "*i16", torch.int32: "*i32"}


def compile_specs(target: KernelTarget):
    """Every (kernel, signature, constexprs, num_warps) the host function launches on ``target``
    for N in {2, 4, 8, 16, 32, 64}, each mask mode and int32/int64 roots, draft tokens, seq_lens."""
    specs = []
    for num_nodes in (2, 4, 8, 16, 32, 64):
        config = launch_config(target, num_nodes)
        for mask_mode in ("qlen", "full", "bitpacked"):
            if mask_mode == "bitpacked" and num_nodes > 32:
                continue
            mask_pointer = _MASK_POINTER.get(mask_mode) or _BITPACKED_POINTER[bitpacked_dtype(num_nodes)]
            for index_type in ("i32", "i64"):
                signature = {
                    "roots_ptr": f"*{index_type}", "roots_stride": "i64", "parents_ptr": "*i64", "parents_stride": "i64",
                    "selected_ptr": "*i64", "selected_stride": "i64", "draft_tokens_ptr": f"*{index_type}",
                    "draft_tokens_stride": "i64", "seq_lens_ptr": f"*{index_type}", "seq_lens_stride": "i64",
                    "block_starts_ptr": "*i64", "mask_numel": "i64",
                    "flag_ptr": "*i64", "flag_code": "i64", "outputs_ptr": "*i64", "mask_ptr": mask_pointer,
                    "parent_columns": "i32", "topk": "i32", "num_steps": "i32",
                    "N": "constexpr", "N_PAD": "constexpr", "MASK_MODE": "constexpr",
                }
                constexprs = {"N": num_nodes, "N_PAD": config.padded_nodes, "MASK_MODE": _MASK_CODES[mask_mode]}
                specs.append((_build_tree_kernel, signature, constexprs, config.num_warps))
    specs += _expand_specs(target)
    for candidates in (2, 4, 68, 264, 1040, ORGANIZE_MAX_CANDIDATES):  # up to the kernel's limit
        padded, warps = pick_launch(target, candidates)
        signature = {"scores_ptr": "*fp32", "tokens_ptr": "*i64", "selected_ptr": "*i64", "draft_tokens_ptr": "*i64",
                     "candidates": "i32", "picks": "i32", "C_PAD": "constexpr"}
        specs.append((_organize_kernel, signature, {"C_PAD": padded}, warps))
    return specs


def _expand_specs(target: KernelTarget):
    """``_expand_kernel`` for K in {1, 2, 4, 8, 16, 64}, both kinds of step, fp32/bf16/fp64
    probabilities (scores fp32: the previous step's) and int32/int64 ids."""
    specs = []
    for topk in (1, 2, 4, 8, 16, 64):
        for first in (True, False):
            padded, warps = expand_launch(target, topk, first)
            for prob_type in ("fp32", "bf16", "fp64"):
                for id_type in ("i32", "i64"):
                    signature = {"scores_ptr": f"*{prob_type}" if first else "*fp32", "scores_stride_b": "i64", "scores_stride_k": "i64",
                                 "probs_ptr": f"*{prob_type}", "probs_stride_row": "i64", "probs_stride_col": "i64",
                                 "ids_ptr": f"*{id_type}", "ids_stride_row": "i64", "ids_stride_col": "i64",
                                 "lane_ids_ptr": "*i64", "lane_scores_ptr": "*fp32", "hidden_rows_ptr": "*i64", "path_scores_ptr": "*fp32",
                                 "tokens_ptr": "*i64", "parents_ptr": "*i64", "first_candidate": "i64",
                                 "K": "constexpr", "PAD": "constexpr", "FIRST": "constexpr"}
                    specs.append((_expand_kernel, signature, {"K": topk, "PAD": padded, "FIRST": first}, warps))
    return specs


def describe_launch(target: KernelTarget) -> list[str]:
    lines = []
    for num_nodes in (4, 8, 32, 64):
        config = launch_config(target, num_nodes)
        lines.append(f"build_tree N={num_nodes}: grid (bs,), N_PAD={config.padded_nodes}, "
                     f"{config.num_warps} warps x {target.warp_size} lanes")
    for topk in (4, 8, 64):
        padded, warps = expand_launch(target, topk, False)
        lines.append(f"expand_tree K={topk}: grid (bs,), {padded} candidate lanes, {warps} warps x {target.warp_size} lanes")
    for candidates in (68, 264, ORGANIZE_MAX_CANDIDATES):
        padded, warps = pick_launch(target, candidates)
        lines.append(f"organize_draft {candidates} candidates: grid (bs,), {padded} lanes, {warps} warps x {target.warp_size} lanes")
    return lines
