"""Family ``verify``: greedy and sampling verification of tree and chain drafts. P6, P7, P8, P20.

Semantics (identical on every backend; every output is an integer and bit-identical):

Tree walk (``verify_greedy``, ``verify_sampling``). Request ``b`` walks its tree from the root
(local node 0). At each of the ``S = tree.num_steps`` levels it scans the children of the last
accepted node (first child ``retrieve_next_token``, then ``retrieve_next_sibling``, ascending
node order) and accepts at most one; if none is accepted the walk stops. Global node ids are
``b * N + j`` (derived from shapes; ``retrieve_index`` is shape-checked only). A link outside
[1, N) ends the list, a level scans at most N nodes, and the walk stops after min(S, N - 1)
levels (a tree of N nodes has at most N - 1 drafts to accept, whatever ``num_steps`` says;
``num_steps`` <= 1024), so a malformed tree can never make any backend read out of bounds or
loop for long. Such a link (any entry of either tensor that is neither -1, "no link", nor in
[1, N)) is recorded in the error flag (``record_tree_links``), as are candidates < -1 or >= V
(``record_token_ids``; -1 is padding): docs/reliability.md.

``Verdict.predict`` (bs*N,) int32: for every node on the accepted path, the token that follows it
(the next accepted draft, or the bonus token for the last accepted node); **-1 on every other
row**. (Upstream leaves those rows uninitialised or zero; -1 makes a wrong-stride read, upstream
bug 4a, produce an invalid id instead of a plausible token.)

Greedy: a child is accepted iff its candidate equals the target's token at the last accepted node
(``target_predict``, or the argmax of ``target_logits`` with NaN as -inf, +inf as FLT_MAX, ties to
the lower id: the ranking of ``draft_topk``). The bonus is the target's token at the last node.

Sampling (target-only, P7). Probabilities are sanitised as ``p -> 0 if not p > 0, min(p, 1)``
(NaN and negatives count as 0). Coins are sanitised to ``[0, 1 - 2^-24]`` (NaN -> 0). At a level
with coin ``u`` (the coin of the last accepted node, ``coins[b, last]``) the scan adds the target
probability ``p`` of each child's token at the last accepted node's row to ``acc`` (float32,
scan order) and accepts the first child with ``u * threshold_acc < acc`` or
``p >= threshold_single`` (float32 arithmetic). The test is strict (``<``) so that it is exact
inverse-CDF sampling of ``u`` in [0, 1) and a zero-probability token is never accepted (upstream
uses ``u <= acc / threshold_acc``, which accepts a masked token at ``u = 0``). A token already
rejected at the same row (duplicate siblings) counts with p = 0, so its mass is never counted
twice. A candidate outside [0, V) has p = 0.

Final (bonus) token, exact integer sampling. The residual row is the target row of the last
accepted node with the tokens rejected there removed (P7's ``relu(p - draft)``; no input is
mutated). Each entry is quantised to ``floor(p * 2^40)`` (int64), so its sum is exact and
order-free on every backend. With total ``T > 0``, ``t = min(floor(float64(u_final) * float64(T)),
T - 1)`` and the id is the first index whose inclusive running sum exceeds ``t`` (equivalently,
the number of indices whose running sum is ``<= t``). Fallback, defined exactly: if the residual
has no mass (T = 0) the unmodified target row is sampled the same way with the same coin; if
that has no mass either (an all-zero or NaN row) the id is 0.

Chain sampling (``verify_chain_sampling``, P8): classic rejection sampling with the true draft
distribution q: step s accepts ``x_s`` iff ``u_s * q(x_s) < p(x_s)`` (float32, sanitised as above)
and the first rejection stops. ``draft_probs=None`` (n-gram / prompt-lookup drafts) means q_s is
one-hot at x_s: accept iff ``u_s < p(x_s)``, residual = p with x_s removed.

Vocabulary masks (``token_bitmask``, every verify op; semantics in spec_hal/masks.py): masked
target probabilities count as 0, the greedy argmax runs over allowed tokens, and a child is
accepted only if its token is allowed at its parent's row. The final token samples ``max(0, p - q)`` of the rejected row
(float32 subtraction, then quantised as above), or target row S when all S are accepted; the
same fallback applies (unmodified target row, then id 0).
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from . import checks
from .device_buffers import int32_parts
from .error_flag import record as record_invalid
from .masks import allowed_matrix, check_bitmask, token_allowed
from .registry import register_op
from .types import DraftTree, Verdict

# Residual entries are quantised to multiples of 2^-40: sums are exact int64 (< 2^63 for V < 2^23).
QUANT_SCALE = float(2**40)
MAX_VOCAB = 2**23
# The accept width S + 1 is held per request in registers by the walk kernels.
MAX_TREE_STEPS = 1024
# The largest float32 below 1: coins are clamped to [0, COIN_MAX] so that u * T < T.
COIN_MAX = 1.0 - 2.0**-24


# ----------------------------------------------------------------------------------------------
# checks (metadata only: shapes, dtypes, devices; never values)


def _check_tree(tree) -> tuple[int, int, torch.device]:
    if not isinstance(tree, DraftTree):
        raise checks.InvalidInput("tree", "a spec_hal.DraftTree", type(tree).__name__)
    checks.integer("tree.num_steps", tree.num_steps, low=0, high=MAX_TREE_STEPS)
    first = checks.tensor("tree.retrieve_index", tree.retrieve_index, ndim=2, dtypes=checks.INDEX_DTYPES)
    bs, nodes = first.shape
    if nodes == 0:
        raise checks.InvalidInput("tree.retrieve_index", "at least one node per request (N >= 1)", f"shape {tuple(first.shape)}")
    for name in ("retrieve_next_token", "retrieve_next_sibling"):
        checks.tensor(f"tree.{name}", getattr(tree, name), dtypes=checks.INDEX_DTYPES, device=first.device, shape=(bs, nodes))
    return bs, nodes, first.device


def _check_verdict_out(out, bs: int, nodes: int, width: int, device) -> None:
    if out is None:
        return
    if not isinstance(out, Verdict):
        raise checks.InvalidInput("out", "a spec_hal.Verdict of preallocated buffers", type(out).__name__)
    checks.out_tensors("out", (out.predict, out.accept_index, out.num_correct, out.accept_lens),
                       [((bs * nodes,), torch.int32), ((bs, width), torch.int32), ((bs,), torch.int32), ((bs,), torch.int32)], device)


def _check_target_predict(name: str, value, bs: int, nodes: int, device) -> None:
    """Token ids (bs*N,) or (bs, N) int32/int64, or logits (bs*N, V) or (bs, N, V) float."""
    checks.tensor(name, value, device=device)
    if value.dtype in checks.INDEX_DTYPES:
        if tuple(value.shape) not in ((bs * nodes,), (bs, nodes)):
            raise checks.InvalidInput(name, f"token ids of shape ({bs * nodes},) or ({bs}, {nodes})", f"shape {tuple(value.shape)}")
        return
    checks.tensor(name, value, dtypes=checks.FLOAT_DTYPES + checks.INDEX_DTYPES)
    rows_ok = (value.dim() == 2 and value.shape[0] == bs * nodes) or (value.dim() == 3 and tuple(value.shape[:2]) == (bs, nodes))
    if not rows_ok or value.shape[-1] == 0:
        raise checks.InvalidInput(name, f"logits of shape ({bs * nodes}, V) or ({bs}, {nodes}, V) with V >= 1",
                                  f"shape {tuple(value.shape)}")


def _check_probs(name: str, value, bs: int, rows: int, device) -> int:
    """(bs, rows, V) or (bs*rows, V) float32; returns V."""
    checks.tensor(name, value, dtypes=(torch.float32,), device=device)
    if value.dim() == 3 and tuple(value.shape[:2]) == (bs, rows) or value.dim() == 2 and value.shape[0] == bs * rows:
        vocab = value.shape[-1]
        if 1 <= vocab <= MAX_VOCAB:
            return vocab
    raise checks.InvalidInput(name, f"probabilities of shape ({bs}, {rows}, V) or ({bs * rows}, V) with 1 <= V <= {MAX_VOCAB}",
                              f"shape {tuple(value.shape)}")


def _check_threshold(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise checks.InvalidInput(name, "a float in [0, 1]", value)


def _check_masked_logits(target_predict, token_bitmask, bitmask_index, rows: int, device) -> None:
    """A mask needs logits (the masked argmax is computed here: a given id could be masked)."""
    if token_bitmask is None:
        check_bitmask(None, bitmask_index, rows=rows, vocab=None, device=device)
        return
    if not target_predict.dtype.is_floating_point:
        raise checks.InvalidInput("target_predict", "logits (rows, V) when token_bitmask is given (ids may be masked tokens)",
                                  f"{str(target_predict.dtype).replace('torch.', '')} ids")
    check_bitmask(token_bitmask, bitmask_index, rows=rows, vocab=target_predict.shape[-1], device=device)


def _index_like(value, shape, device) -> bool:
    """True when ``value`` is an int32/int64 tensor of ``shape`` on ``device`` (the fast paths'
    test: anything else goes to the detailed checks, which name the argument)."""
    return isinstance(value, torch.Tensor) and value.shape == shape and value.dtype in _INDEX_DTYPES and value.device == device


def _tree_ok(tree):
    """(bs, nodes, device) of a valid tree with a non-meta device, else None (the common case in
    a few comparisons; ``_check_tree`` says what is wrong)."""
    if type(tree) is not DraftTree:
        return None
    first, steps = tree.retrieve_index, tree.num_steps
    if not (type(steps) is int and 0 <= steps <= MAX_TREE_STEPS and isinstance(first, torch.Tensor) and first.dim() == 2
            and not first.is_meta and first.dtype in _INDEX_DTYPES):
        return None
    shape, device = first.shape, first.device
    if shape[1] == 0 or not (_index_like(tree.retrieve_next_token, shape, device) and _index_like(tree.retrieve_next_sibling, shape, device)):
        return None
    return shape, device


def _target_predict_ok(value, shape, device) -> bool:
    """``_check_target_predict``'s common cases: (bs, N) ids or (bs*N, V) / (bs, N, V) float logits."""
    if not isinstance(value, torch.Tensor) or value.device != device:
        return False
    dtype = value.dtype
    if dtype in _INDEX_DTYPES:
        return value.shape == shape or value.shape == (shape[0] * shape[1],)
    if dtype not in _FLOAT_DTYPES:
        return False
    got = value.shape
    if len(got) == 3:
        return got[0] == shape[0] and got[1] == shape[1] and got[2] > 0
    return len(got) == 2 and got[0] == shape[0] * shape[1] and got[1] > 0


def _probs_ok(value, bs: int, rows: int, device):
    """``_check_probs``'s accepted cases: V of (bs, rows, V) or (bs*rows, V) float32 probabilities
    on ``device`` with 1 <= V <= MAX_VOCAB, else None."""
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 or value.device != device:
        return None
    got = value.shape
    if len(got) == 3 and got[0] == bs and got[1] == rows or len(got) == 2 and got[0] == bs * rows:
        vocab = got[-1]
        if 1 <= vocab <= MAX_VOCAB:
            return vocab
    return None


def _float32_like(value, shape, device) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.shape == shape and value.device == device


def _verdict_out_ok(out, bs: int, nodes: int, width: int, device) -> bool:
    """``_check_verdict_out``'s accepted case (None, or a Verdict of contiguous int32 buffers of the
    right shapes on ``device``) in a few comparisons: an engine's preallocated out= call."""
    if out is None:
        return True
    if type(out) is not Verdict:
        return False
    for buffer, shape in ((out.predict, (bs * nodes,)), (out.accept_index, (bs, width)), (out.num_correct, (bs,)), (out.accept_lens, (bs,))):
        if not (isinstance(buffer, torch.Tensor) and buffer.dtype == torch.int32 and buffer.shape == shape and buffer.device == device
                and buffer.is_contiguous()):
            return False
    return True


def _threshold_ok(value) -> bool:
    return type(value) is float and 0.0 <= value <= 1.0  # else _check_threshold decides (ints, NaN, errors)


_INDEX_DTYPES = frozenset(checks.INDEX_DTYPES)
_FLOAT_DTYPES = frozenset(checks.FLOAT_DTYPES)


def check_verify_greedy(tree, candidates, target_predict, *, token_bitmask=None, bitmask_index=None, out=None) -> None:
    if token_bitmask is None and bitmask_index is None and not checks.value_checks_enabled():  # the common call
        found = _tree_ok(tree)
        if (found is not None and _index_like(candidates, found[0], found[1]) and _target_predict_ok(target_predict, *found)
                and _verdict_out_ok(out, *found[0], tree.num_steps + 1, found[1])):
            return
    bs, nodes, device = _check_tree(tree)
    checks.tensor("candidates", candidates, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs, nodes))
    _check_target_predict("target_predict", target_predict, bs, nodes, device)
    _check_masked_logits(target_predict, token_bitmask, bitmask_index, bs * nodes, device)
    _check_verdict_out(out, bs, nodes, tree.num_steps + 1, device)
    if checks.value_checks_enabled():
        record_walk_values("verify_greedy", tree, candidates, _vocab_of(target_predict))


def check_verify_sampling(tree, candidates, target_probs, coins, final_coins, *, threshold_single=1.0, threshold_acc=1.0,
                          token_bitmask=None, bitmask_index=None, out=None) -> None:
    if token_bitmask is None and bitmask_index is None and not checks.value_checks_enabled():  # the common call
        found = _tree_ok(tree)
        if found is not None:
            shape, device = found
            if (_index_like(candidates, shape, device) and _probs_ok(target_probs, shape[0], shape[1], device) is not None
                    and _float32_like(coins, shape, device) and _float32_like(final_coins, shape[:1], device)
                    and _threshold_ok(threshold_single) and _threshold_ok(threshold_acc)
                    and _verdict_out_ok(out, *shape, tree.num_steps + 1, device)):
                return
    bs, nodes, device = _check_tree(tree)
    checks.tensor("candidates", candidates, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs, nodes))
    vocab = _check_probs("target_probs", target_probs, bs, nodes, device)
    check_bitmask(token_bitmask, bitmask_index, rows=bs * nodes, vocab=vocab, device=device)
    checks.tensor("coins", coins, dtypes=(torch.float32,), device=device, shape=(bs, nodes))
    checks.tensor("final_coins", final_coins, dtypes=(torch.float32,), device=device, shape=(bs,))
    _check_threshold("threshold_single", threshold_single)
    _check_threshold("threshold_acc", threshold_acc)
    _check_verdict_out(out, bs, nodes, tree.num_steps + 1, device)
    if checks.value_checks_enabled():
        record_walk_values("verify_sampling", tree, candidates, vocab)


def check_verify_chain(candidates, target_predict, *, token_bitmask=None, bitmask_index=None, out=None) -> None:
    if (token_bitmask is None and bitmask_index is None and out is None and not checks.value_checks_enabled()
            and isinstance(candidates, torch.Tensor) and candidates.dim() == 2 and not candidates.is_meta and candidates.dtype in _INDEX_DTYPES and candidates.shape[1] > 0
            and _target_predict_ok(target_predict, candidates.shape, candidates.device)):
        return  # the common call, checked in a few comparisons
    checks.tensor("candidates", candidates, ndim=2, dtypes=checks.INDEX_DTYPES)
    bs, width = candidates.shape
    if width == 0:
        raise checks.InvalidInput("candidates", "at least one column (the root)", f"shape {tuple(candidates.shape)}")
    _check_target_predict("target_predict", target_predict, bs, width, candidates.device)
    _check_masked_logits(target_predict, token_bitmask, bitmask_index, bs * width, candidates.device)
    checks.out_tensors("out", out, [((bs,), torch.int32), ((bs,), torch.int64)], candidates.device)
    if checks.value_checks_enabled():
        record_token_ids("verify_chain", "candidates", candidates, _vocab_of(target_predict))


def check_verify_chain_sampling(draft_ids, draft_probs, target_probs, coins, final_coins, *, token_bitmask=None, bitmask_index=None,
                                passed_counts=None, out=None) -> None:
    if (token_bitmask is None and bitmask_index is None and passed_counts is None and not checks.value_checks_enabled()
            and isinstance(draft_ids, torch.Tensor) and draft_ids.dim() == 2 and not draft_ids.is_meta
            and draft_ids.dtype in _INDEX_DTYPES):  # the common call: checked in a few comparisons (checked mode: below)
        shape, device = draft_ids.shape, draft_ids.device
        vocab = _probs_ok(target_probs, shape[0], shape[1] + 1, device)
        if (vocab is not None and (draft_probs is None or _probs_ok(draft_probs, shape[0], shape[1], device) == vocab)
                and _float32_like(coins, shape, device) and _float32_like(final_coins, shape[:1], device)
                and _verdict_out_ok(out, shape[0], shape[1] + 1, shape[1] + 1, device)):
            return
    checks.tensor("draft_ids", draft_ids, ndim=2, dtypes=checks.INDEX_DTYPES)
    bs, steps = draft_ids.shape
    device = draft_ids.device
    vocab = _check_probs("target_probs", target_probs, bs, steps + 1, device)
    if draft_probs is not None and _check_probs("draft_probs", draft_probs, bs, steps, device) != vocab:
        raise checks.InvalidInput("target_probs", f"the vocabulary of draft_probs (V = {draft_probs.shape[-1]})",
                                  f"shape {tuple(target_probs.shape)}")
    check_bitmask(token_bitmask, bitmask_index, rows=bs * (steps + 1), vocab=vocab, device=device)
    checks.tensor("coins", coins, dtypes=(torch.float32,), device=device, shape=(bs, steps))
    checks.tensor("final_coins", final_coins, dtypes=(torch.float32,), device=device, shape=(bs,))
    if passed_counts is not None:
        checks.tensor("passed_counts", passed_counts, dtypes=(torch.int32,), device=device, shape=(bs,))
        if not passed_counts.is_contiguous():
            raise checks.InvalidInput("passed_counts", "a contiguous tensor", f"strides {passed_counts.stride()}")
    _check_verdict_out(out, bs, steps + 1, steps + 1, device)
    if checks.value_checks_enabled():
        record_token_ids("verify_chain_sampling", "draft_ids", draft_ids, vocab)


def record_token_ids(op: str, name: str, ids: torch.Tensor, vocab: Optional[int], *, index: Optional[torch.Tensor] = None) -> None:
    """The rule for a token id outside [0, V): probability 0 in the sampling tests, no match in the
    greedy ones (never dereferenced), so never accepted. Ids < -1 or >= V are recorded in the
    error flag (first flat index; -1 is padding, as in the ragged layout, and is not), or raise
    InvalidInput naming ``name`` in checked mode. ``vocab`` None (greedy ops given the target's
    token ids, not logits): V is unknown, only ids < -1 are recorded. ``index``: ``ids`` were
    gathered from the argument at these flat positions (-1: a slot that read nothing)."""
    invalid = ids < -1 if vocab is None else (ids < -1) | (ids >= vocab)
    if index is not None:
        invalid = invalid & (index >= 0)
    rule = "token ids >= 0 (or -1 padding)" if vocab is None else f"token ids in [0, {vocab}) (or -1 padding)"
    record_invalid(op, name, invalid, rule=rule, index=index)


def record_tree_links(op: str, tree: DraftTree) -> None:
    """The walks' rule for a link outside [1, N): it ends the child/sibling list. Every entry
    of ``tree.retrieve_next_token`` / ``tree.retrieve_next_sibling`` other than -1 (no link) and
    outside [1, N) is recorded (first flat index b*N + j), or raises in checked mode."""
    nodes = tree.retrieve_next_token.shape[1]
    for name in ("retrieve_next_token", "retrieve_next_sibling"):
        links = getattr(tree, name)
        record_invalid(op, f"tree.{name}", (links != -1) & ((links < 1) | (links >= nodes)), rule=f"links in [1, {nodes}) or -1 (none)")


def record_walk_values(op: str, tree: DraftTree, candidates: torch.Tensor, vocab: Optional[int]) -> None:
    """What every tree walk records: ``candidates`` (record_token_ids), then the tree's links
    (record_tree_links); checked mode raises for the first of them, the order of their codes."""
    record_token_ids(op, "candidates", candidates, vocab)
    record_tree_links(op, tree)


def _vocab_of(target_predict: torch.Tensor) -> Optional[int]:
    """V of target logits; None for token ids (the greedy ops then know no vocabulary)."""
    return target_predict.shape[-1] if target_predict.dtype.is_floating_point else None


# ----------------------------------------------------------------------------------------------
# shared semantics (vectorised over requests)


def sanitize_probs(probs: torch.Tensor) -> torch.Tensor:
    """float32 probabilities with NaN and negatives as 0 and values above 1 as 1."""
    return torch.where(probs > 0, torch.where(probs < 1, probs, torch.ones_like(probs)), torch.zeros_like(probs))


def sanitize_coins(coins: torch.Tensor) -> torch.Tensor:
    """float32 coins clamped to [0, 1 - 2^-24], NaN as 0."""
    top = torch.full_like(coins, COIN_MAX)
    return torch.where(coins > 0, torch.where(coins < COIN_MAX, coins, top), torch.zeros_like(coins))


def quantize(probs: torch.Tensor) -> torch.Tensor:
    """floor(p * 2^40) as int64 of sanitised float32 probabilities (exact: a power-of-two scale)."""
    return (probs * QUANT_SCALE).to(torch.int64)


def inverse_cdf(weights: torch.Tensor, coins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: (first index whose inclusive running sum of ``weights`` exceeds
    ``min(floor(u * T), T - 1)``, T > 0). ``weights`` (R, V) int64, ``coins`` (R,) sanitised float32."""
    totals = weights.sum(dim=1)
    threshold = (coins.to(torch.float64) * totals.to(torch.float64)).to(torch.int64)
    threshold = torch.minimum(threshold, totals - 1)
    ids = (weights.cumsum(dim=1) <= threshold[:, None]).sum(dim=1)
    return ids, totals > 0


def sample_final(residual: torch.Tensor, target: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """The final token: sample the quantised residual, else the target row, else id 0. (R,) int64."""
    ids, has_mass = inverse_cdf(quantize(residual), coins)
    fallback_ids, target_has_mass = inverse_cdf(quantize(target), coins)
    fallback_ids = torch.where(target_has_mass, fallback_ids, torch.zeros_like(fallback_ids))
    return torch.where(has_mass, ids, fallback_ids)


def _link(links: torch.Tensor, nodes_at: torch.Tensor) -> torch.Tensor:
    """links[b, nodes_at[b]] with values outside [1, N) as -1 (ends the list). (bs,) int64."""
    nodes = links.shape[1]
    value = links.gather(1, nodes_at.clamp(0, nodes - 1)[:, None])[:, 0]
    return torch.where((value >= 1) & (value < nodes) & (nodes_at >= 0), value, torch.full_like(value, -1))


def _walk(tree: DraftTree, accept_child):
    """The shared tree walk. ``accept_child(level_state)`` decides per scanned child.

    ``accept_child(last, child, state) -> accepted (bs,) bool`` is called for every scan step with
    ``child`` = -1 where a request is not scanning; ``state`` is a dict the callback may keep.
    Returns (path (bs, S+1) local ids -1 padded, num_correct (bs,), last (bs,)).
    """
    next_token = tree.retrieve_next_token.to(torch.int64)
    next_sibling = tree.retrieve_next_sibling.to(torch.int64)
    bs, nodes = next_token.shape
    device = next_token.device
    path = torch.full((bs, tree.num_steps + 1), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    last = torch.zeros(bs, dtype=torch.int64, device=device)
    alive = torch.ones(bs, dtype=torch.bool, device=device)
    num_correct = torch.zeros(bs, dtype=torch.int64, device=device)
    for level in range(1, min(tree.num_steps, nodes - 1) + 1):  # never more than N - 1 accepts
        cur = torch.where(alive, _link(next_token, last), torch.full_like(last, -1))
        chosen = torch.full_like(last, -1)
        accept_child("level", last, cur)
        for _ in range(nodes):  # a level scans at most N nodes
            scanning = cur >= 0
            accepted = scanning & accept_child("child", last, cur)
            chosen = torch.where(accepted, cur, chosen)
            cur = torch.where(scanning & ~accepted, _link(next_sibling, cur), torch.full_like(cur, -1))
        alive = chosen >= 0
        last = torch.where(alive, chosen, last)
        num_correct += alive.to(torch.int64)
        path[:, level] = chosen
        accept_child("accepted", last, chosen)
    return path, num_correct, last


def _verdict(path, num_correct, next_tokens, nodes: int, out: Optional[Verdict]) -> Verdict:
    """predict = next_tokens on the path nodes (bs, N), -1 elsewhere; global accept ids."""
    bs = path.shape[0]
    on_path = torch.zeros(bs, nodes, dtype=torch.bool, device=path.device)
    on_path.scatter_(1, path.clamp(min=0), path >= 0)
    on_path[:, 0] = True
    predict = torch.where(on_path, next_tokens, torch.full_like(next_tokens, -1)).reshape(-1).to(torch.int32)
    base = torch.arange(bs, dtype=torch.int64, device=path.device)[:, None] * nodes
    accept_index = torch.where(path >= 0, path + base, torch.full_like(path, -1)).to(torch.int32)
    num_correct = num_correct.to(torch.int32)
    result = Verdict(predict, accept_index, num_correct, num_correct + 1)
    if out is None:
        return result
    for buffer, value in zip((out.predict, out.accept_index, out.num_correct, out.accept_lens), (result.predict, result.accept_index, result.num_correct, result.accept_lens)):
        buffer.copy_(value)
    return out


def target_tokens(target_predict: torch.Tensor, bs: int, nodes: int, token_bitmask: Optional[torch.Tensor] = None,
                  bitmask_index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The target's token per node (bs, N) int64: ids as given, or the argmax of logits; with a
    mask the argmax over allowed tokens only (they rank above every masked one, NaN and -inf
    included; a row allowing nothing gives id 0)."""
    if target_predict.dtype.is_floating_point:
        # Imported here: importing spec_hal.topk at module level is circular when topk is
        # imported first (its `from . import checks` runs spec_hal.__getattr__, which imports
        # every family module).
        from .topk import sanitize_logits

        values = sanitize_logits(target_predict)
        if token_bitmask is None:
            return values.argmax(dim=-1).reshape(bs, nodes)
        values = values.reshape(bs * nodes, values.shape[-1])  # (bs*N, V) or (bs, N, V) logits
        allowed = allowed_matrix(token_bitmask, bitmask_index, values.shape[0], values.shape[1])
        values = torch.where(allowed, values, torch.full_like(values, float("-inf")))
        best = allowed & (values == values.max(dim=1, keepdim=True).values)
        return best.to(torch.int8).argmax(dim=1).reshape(bs, nodes)  # first allowed max; 0 if none
    return target_predict.reshape(bs, nodes).to(torch.int64)


def _allowed_at(token_bitmask, bitmask_index, rows: int, row_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Whether ``tokens`` are allowed at flat rows ``row_ids`` (all True without a mask)."""
    return token_allowed(token_bitmask, bitmask_index, row_ids, tokens, rows=rows)


# ----------------------------------------------------------------------------------------------
# ops


def verdict_buffers(bs: int, nodes: int, width: int, device) -> Verdict:
    """A Verdict of empty int32 buffers for bs requests of N nodes and accept width S+1, carved from
    one allocation (device_buffers.carve)."""
    return verdict_with_scratch(bs, nodes, width, device, ())[0]


def verdict_with_scratch(bs: int, nodes: int, width: int, device, scratch: Sequence[int]) -> tuple[Verdict, list]:
    """(verdict_buffers' Verdict, int32 scratch tensors of ``scratch`` elements each), all from one
    allocation."""
    predict, accept_index, num_correct, accept_lens, *parts = int32_parts((bs * nodes, bs * width, bs, bs, *scratch), device)
    return Verdict(predict, accept_index.view(bs, width), num_correct, accept_lens), parts


def verdict_into(predict: torch.Tensor, accept_index: torch.Tensor, num_correct: torch.Tensor) -> Verdict:
    """An ``out=`` Verdict over a caller's three int32 buffers (sgl-kernel's predicts, accept_index,
    accept_token_num), with a scratch accept_lens."""
    return Verdict(predict, accept_index, num_correct, torch.empty_like(num_correct))


def fake_verdict(like: torch.Tensor, bs, nodes, width) -> Verdict:
    """A Verdict of empty int32 tensors shaped for bs requests of N nodes and accept width S+1
    (four allocations: what a custom op's schema describes, unaliased outputs)."""
    return Verdict(*(torch.empty(shape, dtype=torch.int32, device=like.device) for shape in ((bs * nodes,), (bs, width), (bs,), (bs,))))


def fake_verify_greedy(tree, candidates, target_predict, *, token_bitmask=None, bitmask_index=None, out=None) -> Verdict:
    bs, nodes = candidates.shape
    return fake_verdict(candidates, bs, nodes, tree.num_steps + 1)


def fake_verify_sampling(tree, candidates, target_probs, coins, final_coins, *, threshold_single=1.0, threshold_acc=1.0, token_bitmask=None,
                         bitmask_index=None, out=None) -> Verdict:
    bs, nodes = candidates.shape
    return fake_verdict(candidates, bs, nodes, tree.num_steps + 1)


def fake_verify_chain(candidates, target_predict, *, token_bitmask=None, bitmask_index=None, out=None):
    bs = candidates.shape[0]
    return candidates.new_empty((bs,), dtype=torch.int32), candidates.new_empty((bs,), dtype=torch.int64)


def fake_verify_chain_sampling(draft_ids, draft_probs, target_probs, coins, final_coins, *, token_bitmask=None, bitmask_index=None,
                               passed_counts=None, out=None) -> Verdict:
    bs, steps = draft_ids.shape
    return fake_verdict(draft_ids, bs, steps + 1, steps + 1)


@register_op("verify_greedy", family="verify", check=check_verify_greedy, fake=fake_verify_greedy)
def verify_greedy(tree: DraftTree, candidates: torch.Tensor, target_predict: torch.Tensor, *, token_bitmask: Optional[torch.Tensor] = None,
                  bitmask_index: Optional[torch.Tensor] = None, out: Optional[Verdict] = None) -> Verdict:
    """Greedy tree verification (P6): accept the longest path whose tokens equal the target's.

    Args:
        tree: a DraftTree (retrieve_next_token / retrieve_next_sibling (bs, N), num_steps S).
        candidates: (bs, N) int32/int64 node tokens (``tree.tokens.view(bs, N)``).
        target_predict: the target's token per node, (bs*N,) or (bs, N) int32/int64; or the
            target logits (bs*N, V) or (bs, N, V) float32/bfloat16/float16/float64 (argmax fused: NaN as -inf,
            ties to the lower id, ids in [0, V)).
        token_bitmask: optional (M, ceil(V/32)) int32 vocabulary mask (spec_hal/masks.py); needs
            logits. A masked token is never accepted nor emitted; the argmax runs over allowed tokens.
        bitmask_index: optional (bs*N,) int32/int64 mask row per node (-1: unconstrained); None:
            node b*N+j uses mask row b*N+j.
        out: optional Verdict of contiguous int32 buffers to write.

    Returns:
        Verdict: predict (bs*N,) int32 (the target's token at path nodes, -1 elsewhere),
        accept_index (bs, S+1) int32, num_correct (bs,) int32, accept_lens (bs,) int32.
    """
    bs, nodes = candidates.shape
    record_walk_values("verify_greedy", tree, candidates, _vocab_of(target_predict))
    predicted = target_tokens(target_predict, bs, nodes, token_bitmask, bitmask_index)
    cand = candidates.to(torch.int64)
    block_base = torch.arange(bs, dtype=torch.int64, device=cand.device) * nodes

    def accept_child(kind, last, child):
        if kind != "child":
            return None
        token = cand.gather(1, child.clamp(min=0)[:, None])[:, 0]
        allowed = _allowed_at(token_bitmask, bitmask_index, bs * nodes, block_base + last, token)
        return (token == predicted.gather(1, last[:, None])[:, 0]) & allowed

    path, num_correct, _ = _walk(tree, accept_child)
    return _verdict(path, num_correct, predicted, nodes, out)


@register_op("verify_sampling", family="verify", check=check_verify_sampling, fake=fake_verify_sampling)
def verify_sampling(
    tree: DraftTree,
    candidates: torch.Tensor,
    target_probs: torch.Tensor,
    coins: torch.Tensor,
    final_coins: torch.Tensor,
    *,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    token_bitmask: Optional[torch.Tensor] = None,
    bitmask_index: Optional[torch.Tensor] = None,
    out: Optional[Verdict] = None,
) -> Verdict:
    """Target-only tree speculative sampling (P7); lossless at thresholds 1.0; inputs unchanged.

    Args:
        tree: a DraftTree (retrieve_next_token / retrieve_next_sibling (bs, N), num_steps S).
        candidates: (bs, N) int32/int64 node tokens.
        target_probs: (bs, N, V) or (bs*N, V) float32 target distribution at every node; any strides.
        coins: (bs, N) float32 in [0, 1): the coin of the level after each node.
        final_coins: (bs,) float32 in [0, 1): the coin of the final (bonus) token.
        threshold_single, threshold_acc: floats in [0, 1] (1.0 = exact; lower accepts more).
        token_bitmask, bitmask_index: optional vocabulary mask per node, as in verify_greedy:
            masked probabilities count as 0 (not renormalised) and a masked token is never
            accepted (whatever the thresholds) nor emitted. Lossless for the constrained
            distribution when target_probs is the softmax of already masked logits.
        out: optional Verdict of contiguous int32 buffers to write.

    Returns:
        Verdict (see verify_greedy); predict holds the accepted drafts and the sampled final
        token on the path nodes, -1 elsewhere. The module docstring defines every rounding.
    """
    bs, nodes = candidates.shape
    vocab = target_probs.shape[-1]
    record_walk_values("verify_sampling", tree, candidates, vocab)
    probs = sanitize_probs(target_probs.reshape(bs, nodes, vocab))
    cand = candidates.to(torch.int64)
    if token_bitmask is not None:
        allowed = allowed_matrix(token_bitmask, bitmask_index, bs * nodes, vocab).view(bs, nodes, vocab)
        probs = torch.where(allowed, probs, torch.zeros_like(probs))
    coin_table = sanitize_coins(coins)
    in_vocab = (cand >= 0) & (cand < vocab)
    block_base = torch.arange(bs, dtype=torch.int64, device=cand.device) * nodes
    single = torch.tensor(threshold_single, dtype=torch.float32, device=cand.device)
    acc_scale = torch.tensor(threshold_acc, dtype=torch.float32, device=cand.device)
    rows = torch.arange(bs, device=cand.device)
    state = {"coin": coin_table[:, 0], "rejected": torch.zeros(bs, nodes, dtype=torch.bool, device=cand.device)}

    def accept_child(kind, last, child):
        if kind == "level":
            state["acc"] = torch.zeros(bs, dtype=torch.float32, device=cand.device)
            return None
        if kind == "accepted":  # a new row: its coin, and nothing rejected there yet
            moved = child >= 0
            state["coin"] = torch.where(moved, coin_table.gather(1, child.clamp(min=0)[:, None])[:, 0], state["coin"])
            state["rejected"] = state["rejected"] & ~moved[:, None]
            return None
        scanning = child >= 0
        node = child.clamp(min=0)
        token = cand.gather(1, node[:, None])[:, 0]
        duplicate = (state["rejected"] & (cand == token[:, None])).any(dim=1)
        p = probs[rows, last, token.clamp(0, vocab - 1)]
        p = torch.where(in_vocab.gather(1, node[:, None])[:, 0] & ~duplicate, p, torch.zeros_like(p))
        state["acc"] = torch.where(scanning, state["acc"] + p, state["acc"])
        allowed = _allowed_at(token_bitmask, bitmask_index, bs * nodes, block_base + last, token)
        accepted = scanning & allowed & ((state["coin"] * acc_scale < state["acc"]) | (p >= single))
        state["rejected"][rows, node] |= scanning & ~accepted
        return accepted

    path, num_correct, last = _walk(tree, accept_child)
    final_row = probs[rows, last]
    # scatter_add, not scatter: a token may sit on a rejected and on an unscanned node.
    removed = torch.zeros(bs, vocab, dtype=torch.int64, device=cand.device)
    removed.scatter_add_(1, cand.clamp(0, vocab - 1), (state["rejected"] & in_vocab).to(torch.int64))
    residual = torch.where(removed > 0, torch.zeros_like(final_row), final_row)
    final = sample_final(residual, final_row, sanitize_coins(final_coins))
    next_tokens = _next_tokens(path, cand, last, final, nodes)
    return _verdict(path, num_correct, next_tokens, nodes, out)


def _next_tokens(path: torch.Tensor, cand: torch.Tensor, last: torch.Tensor, final: torch.Tensor, nodes: int) -> torch.Tensor:
    """(bs, N): at path node k the candidate of path node k+1, at the last node ``final``."""
    bs, width = path.shape
    next_tokens = torch.full((bs, nodes), -1, dtype=torch.int64, device=path.device)
    for k in range(width - 1):
        parent, child = path[:, k], path[:, k + 1]
        has_child = child >= 0
        token = cand.gather(1, child.clamp(min=0)[:, None])[:, 0]
        next_tokens.scatter_(1, parent.clamp(min=0)[:, None], torch.where(has_child, token, next_tokens.gather(1, parent.clamp(min=0)[:, None])[:, 0])[:, None])
    next_tokens.scatter_(1, last[:, None], final[:, None])
    return next_tokens


@register_op("verify_chain", family="verify", check=check_verify_chain, fake=fake_verify_chain)
def verify_chain(candidates: torch.Tensor, target_predict: torch.Tensor, *, token_bitmask: Optional[torch.Tensor] = None,
                 bitmask_index: Optional[torch.Tensor] = None, out: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """DFlash greedy chain verify (P20): longest prefix with ``candidates[:, 1:] == target[:, :-1]``.

    Args:
        candidates: (bs, B) int32/int64; column 0 is the root, columns 1.. the drafts.
        target_predict: the target's token per position, (bs*B,) or (bs, B) int32/int64, or
            logits (bs*B, V) float (argmax fused as in verify_greedy).
        token_bitmask, bitmask_index: optional vocabulary mask per position (rows b*B + j; as in
            verify_greedy; needs logits): draft j+1 is accepted only if allowed at row j.
        out: optional (num_correct (bs,) int32, bonus (bs,) int64) contiguous buffers.

    Returns:
        num_correct (bs,) int32 in [0, B-1] and bonus (bs,) int64 = target token at num_correct.
    """
    bs, width = candidates.shape
    record_token_ids("verify_chain", "candidates", candidates, _vocab_of(target_predict))
    predicted = target_tokens(target_predict, bs, width, token_bitmask, bitmask_index)
    drafts = candidates[:, 1:].to(torch.int64)
    rows = torch.arange(bs * width, dtype=torch.int64, device=drafts.device).view(bs, width)[:, :-1]
    allowed = _allowed_at(token_bitmask, bitmask_index, bs * width, rows, drafts)
    matches = ((drafts == predicted[:, :-1]) & allowed).to(torch.int64)
    num_correct = matches.cumprod(dim=1).sum(dim=1)
    bonus = predicted.gather(1, num_correct[:, None])[:, 0]
    if out is None:
        return num_correct.to(torch.int32), bonus
    out[0].copy_(num_correct)
    out[1].copy_(bonus)
    return out[0], out[1]


@register_op("verify_chain_sampling", family="verify", check=check_verify_chain_sampling, fake=fake_verify_chain_sampling,
             mutates=("passed_counts",))
def verify_chain_sampling(
    draft_ids: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    target_probs: torch.Tensor,
    coins: torch.Tensor,
    final_coins: torch.Tensor,
    *,
    token_bitmask: Optional[torch.Tensor] = None,
    bitmask_index: Optional[torch.Tensor] = None,
    passed_counts: Optional[torch.Tensor] = None,
    out: Optional[Verdict] = None,
) -> Verdict:
    """Chain rejection sampling with the true draft distribution q (P8).

    Args:
        draft_ids: (bs, S) int32/int64 drafted tokens x_1..x_S (x_s ~ q_s).
        draft_probs: (bs, S, V) or (bs*S, V) float32: q_s, the distribution x_s was drawn from;
            or None for a deterministic draft (n-gram, prompt lookup): q_s is one-hot at x_s, so
            step s accepts iff u_s < p(x_s) and the residual is p with x_s removed.
        target_probs: (bs, S+1, V) or (bs*(S+1), V) float32: the target at the root and each draft.
        coins: (bs, S) float32 in [0, 1): step s accepts iff coins[:, s-1] * q(x_s) < p(x_s).
        final_coins: (bs,) float32 in [0, 1): coin of the final token.
        token_bitmask, bitmask_index: optional vocabulary mask per target row (rows b*(S+1) + s;
            spec_hal/masks.py): masked target probabilities count as 0, so a masked draft is
            never accepted and a masked token never emitted.
        passed_counts: optional contiguous (bs,) int32 buffer, overwritten with the number of
            steps whose test passes on its own, those after the first rejection included (an
            acceptance-rate statistic: FlashInfer's ``output_accepted_token_num``).
        out: optional Verdict of contiguous int32 buffers (N = S+1 nodes per request).

    Returns:
        Verdict over a chain of N = S+1 nodes (root, x_1..x_S): predict (bs*(S+1),) int32,
        accept_index (bs, S+1), num_correct, accept_lens.
    """
    bs, steps = draft_ids.shape
    vocab = target_probs.shape[-1]
    record_token_ids("verify_chain_sampling", "draft_ids", draft_ids, vocab)
    ids = draft_ids.to(torch.int64)
    in_vocab = (ids >= 0) & (ids < vocab)
    safe_ids = ids.clamp(0, vocab - 1)[:, :, None]
    if draft_probs is None:  # a deterministic draft: q_s is one-hot at x_s
        q = torch.zeros(bs, steps, vocab, dtype=torch.float32, device=ids.device)
        q.scatter_(2, safe_ids, in_vocab[:, :, None].to(torch.float32))
    else:
        q = sanitize_probs(draft_probs.reshape(bs, steps, vocab))
    p = sanitize_probs(target_probs.reshape(bs, steps + 1, vocab))
    if token_bitmask is not None:
        allowed = allowed_matrix(token_bitmask, bitmask_index, bs * (steps + 1), vocab).view(bs, steps + 1, vocab)
        p = torch.where(allowed, p, torch.zeros_like(p))
    p_draft = torch.where(in_vocab, p[:, :steps].gather(2, safe_ids)[:, :, 0], torch.zeros(ids.shape, device=ids.device))
    q_draft = torch.where(in_vocab, q.gather(2, safe_ids)[:, :, 0], torch.zeros(ids.shape, device=ids.device))
    accepted = sanitize_coins(coins) * q_draft < p_draft
    num_correct = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    if passed_counts is not None:
        passed_counts.copy_(accepted.sum(dim=1))
    rows = torch.arange(bs, device=ids.device)
    final_row = p[rows, num_correct]
    draft_row = q[rows, num_correct.clamp(max=max(steps - 1, 0))] if steps else torch.zeros_like(final_row)
    all_accepted = (num_correct == steps)[:, None]
    residual = torch.where(all_accepted, final_row, torch.clamp_min(final_row - draft_row, 0.0))
    final = sample_final(residual, final_row, sanitize_coins(final_coins))
    nodes = steps + 1
    chain = torch.arange(nodes, device=ids.device)[None, :].expand(bs, nodes)
    path = torch.where(chain <= num_correct[:, None], chain, torch.full_like(chain, -1))
    cand = torch.cat([torch.zeros(bs, 1, dtype=torch.int64, device=ids.device), ids], dim=1)
    next_tokens = _next_tokens(path, cand, num_correct, final, nodes)
    return _verdict(path, num_correct, next_tokens, nodes, out)


# ----------------------------------------------------------------------------------------------
# tree verification with the draft distribution (multi-draft recursive rejection sampling)


def check_verify_tree_sampling(tree, candidates, draft_probs, target_probs, coins, final_coins, *, token_bitmask=None, bitmask_index=None,
                               out=None) -> None:
    bs, nodes, device = _check_tree(tree)
    checks.tensor("candidates", candidates, dtypes=checks.INDEX_DTYPES, device=device, shape=(bs, nodes))
    vocab = _check_probs("target_probs", target_probs, bs, nodes, device)
    if _check_probs("draft_probs", draft_probs, bs, nodes, device) != vocab:
        raise checks.InvalidInput("draft_probs", f"the vocabulary of target_probs (V = {vocab})", f"shape {tuple(draft_probs.shape)}")
    checks.tensor("coins", coins, dtypes=(torch.float32,), device=device, shape=(bs, nodes))
    checks.tensor("final_coins", final_coins, dtypes=(torch.float32,), device=device, shape=(bs,))
    check_bitmask(token_bitmask, bitmask_index, rows=bs * nodes, vocab=vocab, device=device)
    _check_verdict_out(out, bs, nodes, tree.num_steps + 1, device)
    if checks.value_checks_enabled():
        record_walk_values("verify_tree_sampling", tree, candidates, vocab)


def fake_verify_tree_sampling(tree, candidates, draft_probs, target_probs, coins, final_coins, *, token_bitmask=None, bitmask_index=None,
                              out=None) -> Verdict:
    bs, nodes = candidates.shape
    return fake_verdict(candidates, bs, nodes, tree.num_steps + 1)


@register_op("verify_tree_sampling", family="verify", check=check_verify_tree_sampling, fake=fake_verify_tree_sampling)
def verify_tree_sampling(
    tree: DraftTree,
    candidates: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    coins: torch.Tensor,
    final_coins: torch.Tensor,
    *,
    token_bitmask: Optional[torch.Tensor] = None,
    bitmask_index: Optional[torch.Tensor] = None,
    out: Optional[Verdict] = None,
) -> Verdict:
    """Tree speculative sampling with the true draft distribution (multi-draft recursive rejection
    sampling, SpecInfer): lossless when the children of every node j were drawn independently
    from ``q_j = draft_probs[b, j]`` (with replacement; duplicates allowed).

    At the last accepted node j the residual starts as ``r = p_j`` (the target row). Children are
    scanned in link order; child c with token x and coin ``u = coins[b, c]`` is accepted iff
    ``u * q_j(x) < r(x) / sum(r)`` (i.e. with probability min(1, r_norm(x) / q_j(x))); a rejection
    sets ``r = max(0, r / sum(r) - q_j)``. The first accepted child becomes the next node; if none is, or
    at depth S, the final token samples r (the target row p of the last node if nothing was
    rejected there). Exact arithmetic: p and q are sanitised then quantised to ``floor(. * 2^40)``
    int64 (sums are exact), the test is evaluated as ``float64(u) * float64(q(x)) * float64(sum r)
    < float64(r(x)) * 2^40`` and the update as ``floor(max(0, float64(r) / float64(sum r) -
    float64(q) / 2^40) * 2^40)``: elementwise IEEE float64, so every device decides the same. The final token is drawn from the integer r as in
    ``verify_sampling`` (fallback: the quantised target row, then id 0). Masks: masked target
    probabilities are 0, so a masked child is never accepted nor a masked token emitted.

    Args:
        tree: a DraftTree; candidates: (bs, N) int32/int64 node tokens.
        draft_probs: (bs, N, V) or (bs*N, V) float32: q_j, the distribution node j's children
            were sampled from.
        target_probs: (bs, N, V) or (bs*N, V) float32 target distribution at every node.
        coins: (bs, N) float32 in [0, 1): the acceptance coin of each node (as a child).
        final_coins: (bs,) float32 in [0, 1).
        token_bitmask, bitmask_index: optional vocabulary mask per node (spec_hal/masks.py).
        out: optional Verdict of contiguous int32 buffers.

    Returns:
        Verdict (see verify_greedy). Integer arithmetic and elementwise float64, identical on
        every backend (the Triton kernel: kernels/tree_sampling.py).
    """
    bs, nodes = candidates.shape
    vocab = target_probs.shape[-1]
    device = candidates.device
    record_walk_values("verify_tree_sampling", tree, candidates, vocab)
    p = sanitize_probs(target_probs.reshape(bs, nodes, vocab))
    if token_bitmask is not None:
        p = torch.where(allowed_matrix(token_bitmask, bitmask_index, bs * nodes, vocab).view(bs, nodes, vocab), p, torch.zeros_like(p))
    p_int = quantize(p)
    q_int = quantize(sanitize_probs(draft_probs.reshape(bs, nodes, vocab)))
    u = sanitize_coins(coins).to(torch.float64)
    cand = candidates.to(torch.int64)
    rows = torch.arange(bs, device=device)
    state = {"r": p_int[:, 0].clone()}

    def accept_child(kind, last, child):
        if kind == "level":
            return None
        if kind == "accepted":  # a new node: its residual starts as its target row
            moved = child >= 0
            state["r"] = torch.where(moved[:, None], p_int[rows, child.clamp(min=0)], state["r"])
            return None
        scanning = child >= 0
        node = child.clamp(min=0)
        token = cand.gather(1, node[:, None])[:, 0]
        in_vocab = (token >= 0) & (token < vocab)
        x = token.clamp(0, vocab - 1)
        r = state["r"]
        q_row = q_int[rows, last]
        mass = r.sum(dim=1).to(torch.float64)
        r_x = r.gather(1, x[:, None])[:, 0].to(torch.float64)
        q_x = q_row.gather(1, x[:, None])[:, 0].to(torch.float64)
        accepted = scanning & in_vocab & (u[rows, node] * q_x * mass < r_x * QUANT_SCALE)
        rejected = scanning & ~accepted
        # r <- max(0, r / sum(r) - q), requantised: elementwise float64 (the same on every device).
        normalised = r.to(torch.float64) / mass.clamp(min=1.0)[:, None]
        update = (torch.clamp_min(normalised - q_row.to(torch.float64) / QUANT_SCALE, 0.0) * QUANT_SCALE).to(torch.int64)
        state["r"] = torch.where(rejected[:, None], update, r)
        return accepted

    path, num_correct, last = _walk(tree, accept_child)
    residual = state["r"]
    ids, has_mass = inverse_cdf(residual, sanitize_coins(final_coins))
    target_ids, target_mass = inverse_cdf(p_int[rows, last], sanitize_coins(final_coins))
    final = torch.where(has_mass, ids, torch.where(target_mass, target_ids, torch.zeros_like(target_ids)))
    next_tokens = _next_tokens(path, cand, last, final, nodes)
    return _verdict(path, num_correct, next_tokens, nodes, out)
