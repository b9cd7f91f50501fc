"""Family ``tree``: EAGLE beam expansion, candidate selection and the verify tree. P2, P4, P5.

Semantics (identical on every backend; integer outputs bit-exact):

* Ranking (``expand_tree``'s top-K of path scores, ``organize_draft``'s top-(N-1)) is a stable
  descending sort: equal scores go to the lower candidate index, NaN ranks as -inf. Never the
  tie order of ``torch.topk``, which differs between devices.
* ``expand_tree`` multiplies path scores in float32.
* ``organize_draft`` returns the selected candidate-list indices in ascending order, so nodes are
  grouped by depth and (for scores that are products of probabilities <= 1, ranked with ties to
  the lower index) every parent precedes its children.
* ``build_tree`` is total: every input gives a defined tree and nothing is read out of bounds.
  Node ``i >= 1`` is candidate ``c = selected[i-1]``. If ``0 <= c < K`` its parent is the root;
  if ``K <= c`` and ``c // K < parents.shape[1]`` its parent is the node whose selected index
  equals ``parents[c // K]`` (the first one, searching the N-1 selected entries); otherwise it has
  none. The ancestor walk is bounded by S steps. A node is *reachable* when the walk reaches the
  root. Unreachable nodes (their parent was not selected: NaN or tied scores upstream, or garbage
  input) are never linked: no ``next_token``/``next_sibling`` points to them and theirs are -1.
  Their mask row holds the root, the node and the ancestors found before the walk stopped, and
  their position is ``seq_len + (that count - 1)``, as in the bounded Triton port of SGLang.
* Mask row ``i`` of a reachable node holds exactly ``depth(i) + 1`` entries: the root, its
  ancestors and itself; ``positions[i] = seq_len + depth(i)``.
* ``num_steps`` (S) is derived from the width of ``parents``: 0 (or 1) columns is S = 1, else
  ``K (S-1) + 1`` columns. N <= 64 (``MAX_TREE_NODES``: the kernel's register tiles).
* Invalid values in the default mode (checked mode, ``SPEC_HAL_CHECKS=1``, raises instead): a
  negative ``seq_lens`` entry counts as 0 (positions and the full mask's layout); a
  ``seq_lens_sum`` that disagrees with ``sum(seq_lens)`` still sizes the full mask (N * seq_lens_sum
  + bs * N^2) and the entries that fall past its end are dropped. Both are recorded in the error
  flag (spec_hal/error_flag.py).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import checks
from .compaction import value_checks_enabled
from .errors import InvalidInput
from .error_flag import record as record_invalid
from .registry import register_op
from .types import MASK_MODES, DraftTree, Expansion, TreeRecord

MAX_TREE_TOPK = 64
MAX_BITPACKED_NODES = 32
# build_tree's kernel holds a request's tree as N_PAD x N_PAD register tiles: N <= 64.
MAX_TREE_NODES = 64


def bitpacked_dtype(num_nodes: int) -> torch.dtype:
    """Element type of a bit-packed mask row: uint8 for N <= 8, int16 for N <= 16, else int32."""
    if num_nodes <= 8:
        return torch.uint8
    return torch.int16 if num_nodes <= 16 else torch.int32


def stable_top_indices(values: torch.Tensor, count: int) -> torch.Tensor:
    """(rows, count) int64 column indices of the ``count`` largest values of each row.

    Descending; equal values in ascending index order; NaN ranks as -inf.
    """
    ranked = torch.nan_to_num(values.to(torch.float32), nan=float("-inf"))
    return torch.sort(ranked, dim=1, descending=True, stable=True).indices[:, :count]


# ---------------------------------------------------------------------------------------------
# expand_tree (P2)


def check_expand_tree(step, scores, probs, ids, *, hidden=None) -> None:
    checks.integer("step", step, low=0)
    if step == 0:
        if scores is not None:
            raise InvalidInput("scores", "None at step 0 (the first step starts the path scores)", type(scores).__name__)
        checks.tensor("probs", probs, ndim=2, dtypes=checks.FLOAT_DTYPES)
        bs, topk = probs.shape
        hidden_rows = bs
    else:
        checks.tensor("scores", scores, ndim=2, dtypes=checks.FLOAT_DTYPES)
        bs, topk = scores.shape
        checks.tensor("probs", probs, dtypes=checks.FLOAT_DTYPES, device=scores.device, shape=(bs * topk, topk))
        hidden_rows = bs * topk
    if not 1 <= topk <= MAX_TREE_TOPK:
        raise InvalidInput("probs", f"between 1 and {MAX_TREE_TOPK} columns (K)", f"shape {tuple(probs.shape)}")
    checks.tensor("ids", ids, dtypes=checks.INDEX_DTYPES, device=probs.device, shape=tuple(probs.shape))
    if hidden is not None:
        checks.tensor("hidden", hidden, ndim=2, dtypes=checks.FLOAT_DTYPES, device=probs.device, shape=(hidden_rows, None))


def fake_expand_tree(step, scores, probs, ids, *, hidden=None) -> Expansion:
    if step == 0:
        bs, topk = probs.shape
        width, parent_width = topk, topk + 1
    else:
        bs, topk = scores.shape
        width, parent_width = topk * topk, topk
    lanes = bs * topk
    record = TreeRecord(probs.new_empty((bs, width), dtype=torch.float32), ids.new_empty((bs, width), dtype=torch.int64),
                        ids.new_empty((bs, parent_width), dtype=torch.int64))
    gathered = None if hidden is None else hidden.new_empty((lanes, hidden.shape[1]))
    return Expansion(ids.new_empty((lanes,), dtype=torch.int64), probs.new_empty((bs, topk), dtype=torch.float32),
                     ids.new_empty((lanes,), dtype=torch.int64), gathered, record)


def expansion_fields(values: dict) -> dict:
    """Non-tensor facts of an Expansion for the custom op's wrapper: no hidden in, none out."""
    return {"hidden": None} if values["hidden"] is None else {}


@register_op("expand_tree", family="tree", check=check_expand_tree, fake=fake_expand_tree, result_fields=expansion_fields)
def expand_tree(
    step: int,
    scores: Optional[torch.Tensor],
    probs: torch.Tensor,
    ids: torch.Tensor,
    *,
    hidden: Optional[torch.Tensor] = None,
) -> Expansion:
    """One level of EAGLE beam expansion (P2), for the first step and the later ones.

    Step 0 (inputs from the draft extend):
        scores: None. probs: (bs, K) float; ids: (bs, K) int32/int64; hidden: (bs, H) or None.
        Lane ``b*K + j`` feeds ``ids[b, j]`` and continues hidden row ``b``.
    Step i >= 1 (inputs from draft forward i-1, one row per lane):
        scores: (bs, K) float32 path scores of the previous step; probs: (bs*K, K) float;
        ids: (bs*K, K) int32/int64; hidden: (bs*K, H) or None.
        The K best of the K*K path scores ``scores[b, r] * probs[b*K + r, c]`` (stable: ties to
        the lower flat index ``r*K + c``) become the new lanes; lane j continues parent lane
        ``b*K + choice // K``.

    Returns:
        :class:`~spec_hal.types.Expansion` (input_ids (bs*K,) int64, scores (bs, K) float32,
        hidden_rows (bs*K,) int64, hidden (bs*K, H) or None, record: the step's TreeRecord).
    """
    if step == 0:
        return _expand_first(probs, ids, hidden)
    return _expand_later(step, scores, probs, ids, hidden)


def _expand_first(probs, ids, hidden) -> Expansion:
    bs, topk = probs.shape
    device = probs.device
    hidden_rows = torch.arange(bs, device=device).repeat_interleave(topk)
    parents = torch.arange(-1, topk, device=device).repeat(bs, 1)
    record = TreeRecord(scores=probs.to(torch.float32), tokens=ids.to(torch.int64), parents=parents)
    gathered = None if hidden is None else hidden.index_select(0, hidden_rows)
    return Expansion(ids.reshape(-1).to(torch.int64), probs.to(torch.float32), hidden_rows, gathered, record)


def _expand_later(step, scores, probs, ids, hidden) -> Expansion:
    bs, topk = scores.shape
    device = scores.device
    path_scores = (scores.to(torch.float32)[:, :, None] * probs.to(torch.float32).view(bs, topk, topk)).reshape(bs, topk * topk)
    candidate_tokens = ids.to(torch.int64).reshape(bs, topk * topk)
    choice = stable_top_indices(path_scores, topk)  # (bs, K) flat indices r*K + c
    hidden_rows = (torch.arange(bs, device=device)[:, None] * topk + choice // topk).reshape(-1)
    parents = choice + (topk * topk * (step - 1) + topk)  # their candidate-list indices
    record = TreeRecord(scores=path_scores, tokens=candidate_tokens, parents=parents)
    gathered = None if hidden is None else hidden.index_select(0, hidden_rows)
    return Expansion(candidate_tokens.gather(1, choice).reshape(-1), path_scores.gather(1, choice), hidden_rows, gathered, record)


# ---------------------------------------------------------------------------------------------
# organize_draft (P4)


def _candidate_count(topk: int, num_steps: int) -> int:
    return topk + (num_steps - 1) * topk * topk


def check_organize_draft(records, num_draft_tokens) -> None:
    if not isinstance(records, (list, tuple)) or not records:
        raise InvalidInput("records", "a non-empty list of TreeRecord (one per draft step)", type(records).__name__)
    for index, record in enumerate(records):
        if not isinstance(record, TreeRecord):
            raise InvalidInput(f"records[{index}]", "a TreeRecord", type(record).__name__)
    first = records[0]
    checks.tensor("records[0].scores", first.scores, ndim=2, dtypes=checks.FLOAT_DTYPES)
    bs, topk = first.scores.shape
    device = first.scores.device
    for index, record in enumerate(records):
        width = topk if index == 0 else topk * topk
        parent_width = topk + 1 if index == 0 else topk
        checks.tensor(f"records[{index}].scores", record.scores, dtypes=checks.FLOAT_DTYPES, device=device, shape=(bs, width))
        checks.tensor(f"records[{index}].tokens", record.tokens, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs, width))
        checks.tensor(f"records[{index}].parents", record.parents, dtypes=(torch.int64,), device=device, shape=(bs, parent_width))
    checks.integer("num_draft_tokens", num_draft_tokens, low=1, high=1 + _candidate_count(topk, len(records)))


def fake_organize_draft(records, num_draft_tokens):
    bs, topk = records[0].scores.shape
    parent_columns = 0 if len(records) == 1 else topk * (len(records) - 1) + 1
    like = records[0].tokens
    return (like.new_empty((bs, parent_columns), dtype=torch.int64), like.new_empty((bs, num_draft_tokens - 1), dtype=torch.int64),
            like.new_empty((bs, num_draft_tokens - 1), dtype=torch.int64))


@register_op("organize_draft", family="tree", check=check_organize_draft, fake=fake_organize_draft)
def organize_draft(records: Sequence[TreeRecord], num_draft_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick the N-1 best candidates of the S draft steps, in ascending candidate order (P4).

    Args:
        records: the S TreeRecords of ``expand_tree`` (``DraftResult.records``).
        num_draft_tokens: N, tree nodes per request including the root; 1 <= N - 1 <= K + (S-1) K^2.

    Returns:
        parents (bs, K(S-1)+1) int64 (the step records' parents, the last step's left out;
        (bs, 0) when S == 1), selected (bs, N-1) int64 candidate-list indices ascending,
        draft_tokens (bs, N-1) int64 their tokens. Ranking: stable descending, ties to the lower
        candidate index, NaN as -inf.
    """
    scores, tokens = candidate_lists(records)
    selected = torch.sort(stable_top_indices(scores, num_draft_tokens - 1), dim=1).values
    return record_parents(records), selected, tokens.gather(1, selected)


def candidate_lists(records: Sequence[TreeRecord]) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores (bs, C) float32, tokens (bs, C) int64): the S records' candidates in candidate-list
    order, contiguous (organize_draft's input; its kernel reads these rows)."""
    return (torch.cat([record.scores.to(torch.float32) for record in records], dim=1),
            torch.cat([record.tokens.to(torch.int64) for record in records], dim=1))


def record_parents(records: Sequence[TreeRecord]) -> torch.Tensor:
    """organize_draft's ``parents``: the records' parents but the last step's, (bs, 0) for S == 1."""
    if len(records) == 1:
        first = records[0].parents
        return torch.empty((first.shape[0], 0), dtype=torch.int64, device=first.device)
    return torch.cat([record.parents for record in records[:-1]], dim=1)


# ---------------------------------------------------------------------------------------------
# build_tree (P5)


def tree_num_steps(parent_columns: int, topk: int) -> int:
    """S from the width of ``parents``: 0 or 1 column is S = 1, else K(S-1)+1 columns."""
    return 1 if parent_columns <= 1 else (parent_columns - 1) // topk + 1


def _index_tensor_ok(value, ndim: int, device) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in _INDEX_DTYPES and len(value.shape) == ndim and value.device == device


def _build_tree_ok(roots, parents, selected, draft_tokens, seq_lens, topk, mask_mode) -> bool:
    """``check_build_tree``'s common call (no seq_lens_sum) in a few comparisons; False sends the
    caller to the detailed checks, which name the argument."""
    if type(topk) is not int or not 1 <= topk <= MAX_TREE_TOPK or not isinstance(roots, torch.Tensor) or roots.is_meta:
        return False
    device = roots.device
    if not (roots.dtype in _INDEX_DTYPES and len(roots.shape) == 1 and _index_tensor_ok(parents, 2, device)
            and _index_tensor_ok(selected, 2, device) and _index_tensor_ok(draft_tokens, 2, device) and _index_tensor_ok(seq_lens, 1, device)):
        return False
    bs, drafts, parent_columns = roots.shape[0], selected.shape[1], parents.shape[1]
    if parents.shape[0] != bs or selected.shape[0] != bs or draft_tokens.shape != selected.shape or seq_lens.shape[0] != bs:
        return False
    if parent_columns > 1 and (parent_columns - 1) % topk != 0:
        return False
    if drafts > _candidate_count(topk, tree_num_steps(parent_columns, topk)) or drafts + 1 > MAX_TREE_NODES:
        return False
    return mask_mode in MASK_MODES and (mask_mode != "bitpacked" or drafts + 1 <= MAX_BITPACKED_NODES)


_INDEX_DTYPES = frozenset(checks.INDEX_DTYPES)


def check_build_tree(roots, parents, selected, draft_tokens, seq_lens, *, topk, mask_mode="qlen", seq_lens_sum=None) -> None:
    if seq_lens_sum is None and not value_checks_enabled() and _build_tree_ok(roots, parents, selected, draft_tokens, seq_lens, topk, mask_mode):
        return
    checks.tensor("roots", roots, ndim=1, dtypes=checks.INDEX_DTYPES)
    bs = roots.shape[0]
    device = roots.device
    checks.integer("topk", topk, low=1, high=MAX_TREE_TOPK)
    checks.tensor("parents", parents, ndim=2, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs, None))
    parent_columns = parents.shape[1]
    if parent_columns > 1 and (parent_columns - 1) % topk != 0:
        raise InvalidInput("parents", f"K(S-1)+1 columns for topk={topk}", f"shape {tuple(parents.shape)}")
    checks.tensor("selected", selected, ndim=2, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs, None))
    num_steps = tree_num_steps(parent_columns, topk)
    candidates = _candidate_count(topk, num_steps)
    if selected.shape[1] > candidates:
        raise InvalidInput("selected", f"at most K + (S-1) K^2 = {candidates} columns (N-1) for topk={topk}, S={num_steps}",
                           f"shape {tuple(selected.shape)}")
    if selected.shape[1] + 1 > MAX_TREE_NODES:
        raise InvalidInput("selected", f"at most {MAX_TREE_NODES - 1} columns (N <= {MAX_TREE_NODES} tree nodes)",
                           f"shape {tuple(selected.shape)}")
    checks.tensor("draft_tokens", draft_tokens, dtypes=checks.INDEX_DTYPES, device=device, shape=tuple(selected.shape))
    checks.tensor("seq_lens", seq_lens, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs,))
    if mask_mode not in MASK_MODES:
        raise InvalidInput("mask_mode", f"one of {MASK_MODES}", repr(mask_mode))
    num_nodes = selected.shape[1] + 1
    if mask_mode == "bitpacked" and num_nodes > MAX_BITPACKED_NODES:
        raise InvalidInput("mask_mode", f"'bitpacked' only for N <= {MAX_BITPACKED_NODES}", f"'bitpacked' with N = {num_nodes}")
    if seq_lens_sum is not None:
        if mask_mode != "full":
            raise InvalidInput("seq_lens_sum", "None unless mask_mode='full' (only the full mask is sized by it)", seq_lens_sum)
        checks.integer("seq_lens_sum", seq_lens_sum, low=0, high=2**31 - 1)
    if value_checks_enabled() and bs:
        _check_seq_lens_values(seq_lens, seq_lens_sum)


def _check_seq_lens_values(seq_lens: torch.Tensor, seq_lens_sum: Optional[int]) -> None:
    """Checked mode: lengths are non-negative and ``seq_lens_sum`` is their sum."""
    lengths = seq_lens.long().cpu()
    if (lengths < 0).any():
        raise InvalidInput("seq_lens", "non-negative lengths", lengths.tolist())
    if seq_lens_sum is not None and seq_lens_sum != int(lengths.sum()):
        raise InvalidInput("seq_lens_sum", f"sum(seq_lens) = {int(lengths.sum())}", seq_lens_sum)


def clamped_seq_lens(seq_lens: torch.Tensor) -> torch.Tensor:
    """(bs,) int64 lengths with negative entries as 0: the default mode's rule for them."""
    return seq_lens.to(torch.int64).clamp(min=0)


def full_mask_block_starts(seq_lens: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """(bs,) int64 start of each request's N x (seq_len + N) block in the flat full mask
    (negative lengths count as 0)."""
    lengths = clamped_seq_lens(seq_lens)
    before = torch.cumsum(lengths, 0) - lengths
    return num_nodes * before + torch.arange(lengths.shape[0], device=lengths.device) * (num_nodes * num_nodes)


def full_mask_numel(seq_lens: torch.Tensor, num_nodes: int, seq_lens_sum: Optional[int]) -> int:
    """N * sum(seq_lens) + bs * N^2. Without ``seq_lens_sum`` this reads seq_lens on the host
    (negative lengths count as 0). A ``seq_lens_sum`` that disagrees sizes the mask anyway: the
    entries that fall outside it are dropped (see the module docstring)."""
    total_seq = int(clamped_seq_lens(seq_lens).sum().item()) if seq_lens_sum is None else seq_lens_sum
    return num_nodes * total_seq + seq_lens.shape[0] * num_nodes * num_nodes


def parent_nodes(parents: torch.Tensor, selected: torch.Tensor, topk: int) -> torch.Tensor:
    """(bs, N) int64 parent node of every node: 0 for root children, -1 for none (and the root)."""
    bs, drafts = selected.shape
    parent_columns = parents.shape[1]
    slot = torch.div(selected, topk, rounding_mode="floor")
    root_child = (selected >= 0) & (selected < topk)
    has_slot = (selected >= topk) & (slot < parent_columns)
    if parent_columns > 0:
        parent_candidate = parents.gather(1, slot.clamp(0, parent_columns - 1))
    else:
        parent_candidate = torch.full_like(selected, -1)
    # First selected entry q equal to the parent's candidate index; the parent node is q + 1.
    match = (parent_candidate[:, :, None] == selected[:, None, :]) & has_slot[:, :, None]
    draft_numbers = torch.arange(drafts, device=selected.device)
    first = torch.where(match, draft_numbers, drafts).min(dim=2).values if drafts else torch.zeros_like(selected)
    node = torch.where(root_child, 0, torch.where(first < drafts, first + 1, -1))
    return torch.cat([torch.full((bs, 1), -1, dtype=torch.int64, device=selected.device), node], dim=1)


def ancestor_mask(parent: torch.Tensor, num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree mask (bs, N, N) bool and reachability (bs, N) bool from the parent nodes.

    Row i holds the root, i, and the ancestors met by a walk of at most ``num_steps`` steps.
    """
    bs, num_nodes = parent.shape
    device = parent.device
    nodes = torch.arange(num_nodes, device=device)
    mask = ((nodes[None, :] == 0) | (nodes[None, :] == nodes[:, None])).expand(bs, num_nodes, num_nodes).clone()
    current = nodes.expand(bs, num_nodes).clone()
    walking = current >= 1
    reachable = current == 0
    for _ in range(num_steps):
        up = parent.gather(1, current)
        reachable |= walking & (up == 0)
        walking = walking & (up > 0)
        mask |= (nodes[None, None, :] == up[:, :, None]) & walking[:, :, None]
        current = torch.where(walking, up, current)
    return mask, reachable


def child_links(parent: torch.Tensor, reachable: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(next_token, next_sibling), both (bs, N) int64, over reachable nodes only, ascending."""
    num_nodes = parent.shape[1]
    nodes = torch.arange(num_nodes, device=parent.device)
    linked_parent = torch.where(reachable & (nodes >= 1), parent, -2)
    is_child = linked_parent[:, None, :] == nodes[None, :, None]  # [b, p, j]: j is a child of p
    first_child = torch.where(is_child, nodes, num_nodes).min(dim=2).values
    later_sibling = (linked_parent[:, None, :] == linked_parent[:, :, None]) & (nodes[None, :] > nodes[:, None])
    later_sibling &= (linked_parent >= 0)[:, :, None]
    next_sibling = torch.where(later_sibling, nodes, num_nodes).min(dim=2).values
    return torch.where(first_child < num_nodes, first_child, -1), torch.where(next_sibling < num_nodes, next_sibling, -1)


def pack_mask_bits(mask: torch.Tensor) -> torch.Tensor:
    """(bs, N, N) bool to (bs, N) rows of bits (bit j: attends node j), in ``bitpacked_dtype(N)``."""
    num_nodes = mask.shape[-1]
    weights = torch.ones(num_nodes, dtype=torch.int64, device=mask.device) << torch.arange(num_nodes, device=mask.device)
    bits = (mask.to(torch.int64) * weights).sum(dim=-1)
    dtype = bitpacked_dtype(num_nodes)
    if dtype != torch.uint8:
        width = 16 if dtype == torch.int16 else 32
        bits = torch.where(bits >= 1 << (width - 1), bits - (1 << width), bits)  # two's complement
    return bits.to(dtype)


def scatter_full_mask(mask: torch.Tensor, seq_lens: torch.Tensor, numel: int) -> torch.Tensor:
    """Flat full mask: per request N rows of (seq_len + N) columns, prefix columns True; entries
    outside [0, numel) (a ``seq_lens_sum`` smaller than the lengths) are dropped."""
    bs, num_nodes, _ = mask.shape
    flat = torch.ones(numel, dtype=torch.bool, device=mask.device)
    lengths = clamped_seq_lens(seq_lens)
    nodes = torch.arange(num_nodes, device=mask.device)
    starts = full_mask_block_starts(seq_lens, num_nodes)
    block_ends = starts + num_nodes * (lengths + num_nodes)
    record_invalid("build_tree", "seq_lens_sum", block_ends > numel, rule="sum(seq_lens)")
    index = (starts[:, None, None] + nodes[None, :, None] * (lengths[:, None, None] + num_nodes)
             + lengths[:, None, None] + nodes[None, None, :])
    index, values = index.reshape(-1), mask.reshape(-1)
    inside = index < numel
    # Out-of-range entries are redirected to a scratch element past the end, then cut off.
    padded = torch.cat([flat, flat.new_ones(1)])
    padded[torch.where(inside, index, numel)] = values
    return padded[:numel]


def fake_build_tree(roots, parents, selected, draft_tokens, seq_lens, *, topk, mask_mode="qlen", seq_lens_sum=None) -> DraftTree:
    bs, drafts = selected.shape
    nodes = drafts + 1
    if mask_mode == "bitpacked":
        mask = selected.new_empty((bs, nodes), dtype=bitpacked_dtype(nodes))
    elif mask_mode == "full":
        if seq_lens_sum is None:  # sized from seq_lens' values: unknown until run time
            numel = torch.library.get_ctx().new_dynamic_size()
        else:
            numel = nodes * seq_lens_sum + bs * nodes * nodes
        mask = selected.new_empty((numel,), dtype=torch.bool)
    else:
        mask = selected.new_empty((bs, nodes, nodes), dtype=torch.bool)
    flat = selected.new_empty((bs * nodes,), dtype=torch.int64)
    links = [selected.new_empty((bs, nodes), dtype=torch.int64) for _ in range(5)]  # index, next token/sibling, parents, depth
    return DraftTree(flat, torch.empty_like(flat), *links[:3], mask, mask_mode, tree_num_steps(parents.shape[1], topk), *links[3:])


def build_tree_fields(values: dict) -> dict:
    """Non-tensor fields of the DraftTree for the custom op's wrapper."""
    return {"mask_mode": values["mask_mode"], "num_steps": tree_num_steps(values["parents"].shape[1], values["topk"])}


@register_op("build_tree", family="tree", check=check_build_tree, fake=fake_build_tree, result_fields=build_tree_fields)
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
) -> DraftTree:
    """The verify tree of every request (P5): tokens, positions, mask and retrieve links.

    Args:
        roots: (bs,) int32/int64 root token of each request (the last verify's bonus token).
        parents: (bs, K(S-1)+1) int32/int64, or (bs, 0) for S = 1 (``organize_draft`` returns int64).
        selected: (bs, N-1) int32/int64 candidate-list indices of the draft nodes, ascending.
        draft_tokens: (bs, N-1) int32/int64 their tokens.
        seq_lens: (bs,) int32/int64 committed lengths; the root sits at position seq_len.
        topk: K.
        mask_mode: "qlen" (default; (bs, N, N) bool, prefix columns never materialised),
            "full" (flat bool, per request N rows of seq_len + N columns, prefix True) or
            "bitpacked" ((bs, N) uint8/int16/int32 rows, bit j = attends node j; N <= 32).
        seq_lens_sum: "full" only: sum(seq_lens) as a host int, so that sizing the mask needs no
            device read (without it the op reads seq_lens on the host and is not capturable).

    Returns:
        :class:`~spec_hal.types.DraftTree`; S is derived from the width of ``parents``.
        Unreachable nodes (parent not selected) are skipped: see the module docstring.
    """
    parents, selected = parents.long(), selected.long()  # int32 accepted (docs/conventions.md)
    bs, drafts = selected.shape
    num_nodes = drafts + 1
    num_steps = tree_num_steps(parents.shape[1], topk)
    device = selected.device
    parent = parent_nodes(parents, selected, topk)
    mask, reachable = ancestor_mask(parent, num_steps)
    next_token, next_sibling = child_links(parent, reachable)
    depth = mask.sum(dim=2) - 1
    record_invalid("build_tree", "seq_lens", seq_lens < 0, rule="non-negative lengths")
    positions = (clamped_seq_lens(seq_lens)[:, None] + depth).reshape(-1)
    node_parents = torch.where(reachable, parent, torch.full_like(parent, -1))
    node_depth = torch.where(reachable, depth, torch.full_like(depth, -1))
    tokens = torch.cat([roots.to(torch.int64)[:, None], draft_tokens.to(torch.int64)], dim=1).reshape(-1)
    retrieve_index = torch.arange(bs * num_nodes, dtype=torch.int64, device=device).view(bs, num_nodes)
    if mask_mode == "bitpacked":
        out_mask = pack_mask_bits(mask)
    elif mask_mode == "full":
        out_mask = scatter_full_mask(mask, seq_lens, full_mask_numel(seq_lens, num_nodes, seq_lens_sum))
    else:
        out_mask = mask
    return DraftTree(tokens, positions, retrieve_index, next_token, next_sibling, out_mask, mask_mode, num_steps,
                     parents=node_parents, depth=node_depth)


# ---------------------------------------------------------------------------------------------
# tree structure helpers (plain torch on any device; not ops: no kernel, no value checks)


def tree_parents(tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
    """(parents, depth), both (bs, N) int64, as ``DraftTree.parents`` / ``.depth`` define them:
    the recorded fields when present, else derived from the retrieve links (nodes the walk from
    the root reaches through ``retrieve_next_token`` / ``retrieve_next_sibling``, at most S
    levels; every other node -1). No host sync."""
    if tree.parents is not None and tree.depth is not None:
        return tree.parents.to(torch.int64), tree.depth.to(torch.int64)
    next_token = tree.retrieve_next_token.to(torch.int64)
    next_sibling = tree.retrieve_next_sibling.to(torch.int64)
    bs, nodes = next_token.shape
    device = next_token.device
    parents = torch.full((bs, nodes), -1, dtype=torch.int64, device=device)
    depth = torch.full((bs, nodes), -1, dtype=torch.int64, device=device)
    depth[:, 0] = 0
    frontier = torch.zeros(bs, nodes, dtype=torch.bool, device=device)  # nodes of the current level
    frontier[:, 0] = True
    for level in range(1, tree.num_steps + 1):
        # Every frontier node's first child, then the sibling chains: each hop is one gather.
        children = torch.zeros(bs, nodes, dtype=torch.bool, device=device)
        child_parent = torch.full((bs, nodes), -1, dtype=torch.int64, device=device)
        cur = torch.where(frontier, next_token, torch.full_like(next_token, -1))
        owner = torch.arange(nodes, device=device).expand(bs, nodes)
        for _ in range(nodes):  # a sibling chain is at most N long
            valid = (cur >= 1) & (cur < nodes)
            fresh = valid & (depth.gather(1, cur.clamp(0, nodes - 1)) < 0)
            index = torch.where(fresh, cur, torch.zeros_like(cur))
            children.scatter_(1, index, fresh | children.gather(1, index))
            child_parent.scatter_(1, index, torch.where(fresh, owner, child_parent.gather(1, index)))
            cur = torch.where(valid, next_sibling.gather(1, cur.clamp(0, nodes - 1)), torch.full_like(cur, -1))
        children[:, 0] = False
        parents = torch.where(children, child_parent, parents)
        depth = torch.where(children, torch.full_like(depth, level), depth)
        frontier = children
    return parents, depth


def tree_paths(tree: DraftTree) -> torch.Tensor:
    """(bs, N, S+1) int64 root-to-node paths: ``paths[b, j, d]`` is the local id of node j's
    ancestor at depth d (``paths[b, j, 0] = 0``, ``paths[b, j, depth(j)] = j``), -1 after the
    node's depth and everywhere for unreachable / padded nodes. A grammar walks node j's path to
    know the prefix its mask row must be computed for."""
    parents, depth = tree_parents(tree)
    bs, nodes = parents.shape
    width = tree.num_steps + 1
    paths = torch.full((bs, nodes, width), -1, dtype=torch.int64, device=parents.device)
    current = torch.arange(nodes, device=parents.device).expand(bs, nodes).clone()
    level = depth.clone()
    for _ in range(width):  # climb one level per step, writing each ancestor at its depth
        ok = level >= 0
        paths.scatter_(2, level.clamp(min=0)[:, :, None], torch.where(ok, current, paths.gather(2, level.clamp(min=0)[:, :, None])[:, :, 0])[:, :, None])
        up = parents.gather(1, current.clamp(min=0))
        current = torch.where(ok & (up >= 0), up, current)
        level = torch.where(ok & (up >= 0), level - 1, torch.full_like(level, -1))
    return paths
