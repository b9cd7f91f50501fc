"""Family ``distributed``: keeping tensor-parallel ranks in agreement (issue 19, docs/distributed.md).

Tensor-parallel ranks run the same speculative-decoding round on the same batch. If they accept
different tokens, their sequence lengths and batch shapes drift apart and the next collective
whose size depends on them deadlocks (sglang#31071, sglang#28815, vllm#31307). Two helpers:

``broadcast_verdict(verdict, *, src=0, group=None, tokens=None, logprobs=None)``
    Every rank calls it with its own verification result (computed locally, or placeholders of
    the right shapes and dtypes: their values are never read on ranks other than ``src``). The
    Verdict's four tensors, and ``tokens`` / ``logprobs`` where given, are packed into one byte
    buffer, sent from ``src`` in **one** ``broadcast`` and unpacked as views of that buffer, so
    every rank holds ``src``'s values bit for bit. :func:`broadcast_tensors` is the same for any
    list of tensors (draft tokens of a host-side proposer, for example).

``check_consensus(tensors, *, group=None, reference=0)``
    Every rank hashes the named tensors on its device (two 31-bit polynomial hashes over their
    bytes, salted with dtype and shape: integer arithmetic only, so the fingerprint of equal
    tensors is the same on every backend and device), the fingerprints are all-gathered through
    one ``all_reduce(SUM)`` of a (world, T, 2) int64 table, and the table is read on the host
    once. If any rank's fingerprint differs from the ``reference`` rank's, **every** rank raises
    :class:`~spec_hal.errors.RankDivergence` naming the diverging ranks and tensors: a clean
    error on all ranks instead of a hang later. :func:`gather_fingerprints` (capturable) and
    :func:`raise_on_divergence` (the host read) are the two halves, for engines that gather inside
    a graph and look after the replay.

Rules both follow (why they are graph-capturable and cannot deadlock on their own):

* Exactly one collective per call, issued unconditionally, whose size depends only on shapes
  and dtypes (static per batch-size bucket) and, for the consensus table, on the number of
  tensors: never on values. A rank with bs = 0 (an idle data-parallel replica whose TP group
  still meets) issues the same collective; the broadcast buffer is never shorter than 16 bytes, so
  no process group sees a zero-length collective.
* No host sync, no data-dependent Python branch, no per-call host-to-device copy (the hash
  salts are Python scalars baked into the kernels): ``broadcast_verdict`` and
  ``gather_fingerprints`` can be captured in a CUDA/HIP graph with NCCL/RCCL. Only
  ``raise_on_divergence`` (and so ``check_consensus``) reads the device, once.
* Works over any ``torch.distributed`` process group whose backend supports ``broadcast`` of
  uint8 and ``all_reduce(SUM)`` of int64: NCCL, RCCL (the "nccl" backend of ROCm torch), gloo.
  Tensors live on the device the group's backend expects (GPU for NCCL, CPU or GPU for gloo).
  Every rank must pass the same shapes, dtypes and names in the same order (as for any
  collective); ``src`` and ``reference`` are ranks **within** ``group``.

Argument checks read metadata only and raise :class:`~spec_hal.errors.InvalidInput` naming the
argument, before any collective is issued.
"""
from __future__ import annotations

import zlib
from typing import Mapping, NamedTuple, Optional, Sequence

import torch

from . import checks
from .errors import InvalidInput, RankDivergence
from .types import Verdict

__all__ = ["VerificationBroadcast", "broadcast_tensors", "broadcast_verdict", "check_consensus", "fingerprint",
           "gather_fingerprints", "raise_on_divergence"]

# Every packed segment starts at a multiple of 16 bytes, so its view as any dtype (complex128
# included) is aligned; the same value is the smallest buffer, so no collective has zero length.
_ALIGN = 16
# Hash modulus (a prime below 2^31) and the (multiplier, offset) of each of the two hash lanes.
# Byte b at position i contributes (b + 1) * w_i with w_i in [1, P - 1]: a single changed byte
# always changes the lane (P is prime and |delta| < 256 < P), and every product and sum fits in
# int64 for tensors below 2^31 bytes.
_PRIME = 2**31 - 1
_LANES = ((48271, 11), (69621, 97))


class VerificationBroadcast(NamedTuple):
    """What :func:`broadcast_verdict` returns on every rank: ``src``'s values (views of one buffer)."""

    verdict: Verdict
    tokens: Optional[torch.Tensor]
    logprobs: Optional[torch.Tensor]


# ----------------------------------------------------------------------------------------------
# process group


def _group_rank_size(group) -> tuple[object, int, int]:
    """(group, this process's rank in it, its size); the default group when ``group`` is None."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise InvalidInput("group", "a member of an initialized torch.distributed process group",
                           "torch.distributed is not initialized")
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise InvalidInput("group", "a process group this process belongs to", f"one without global rank {dist.get_rank()}")
    return group, rank, dist.get_world_size(group)


# ----------------------------------------------------------------------------------------------
# broadcast


class _Segment(NamedTuple):
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple


def _layout(tensors: Sequence[torch.Tensor]) -> tuple[list[_Segment], int]:
    """Byte offsets of each tensor in the packed buffer (host arithmetic on shapes only)."""
    segments, offset = [], 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        segments.append(_Segment(offset, nbytes, tensor.dtype, tuple(tensor.shape)))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return segments, max(offset, _ALIGN)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements in row-major order as a flat uint8 tensor (copies if not contiguous)."""
    return tensor.detach().reshape(-1).view(torch.uint8)


def broadcast_tensors(tensors: Sequence[torch.Tensor], *, src: int = 0, group=None) -> list[torch.Tensor]:
    """Send ``tensors`` from rank ``src`` of ``group`` to every rank in one collective.

    tensors: any dtypes and shapes, all on one device, the same shapes and dtypes on every rank
             (values on ranks other than ``src`` are never read).
    Returns new tensors (views of one freshly allocated buffer) with ``src``'s values, on every
    rank including ``src``; the inputs are not modified.
    """
    if not isinstance(tensors, (list, tuple)):
        raise InvalidInput("tensors", "a list or tuple of tensors", type(tensors).__name__)
    device = None
    for index, tensor in enumerate(tensors):
        checks.tensor(f"tensors[{index}]", tensor, device=device)
        device = tensor.device
    if device is None:
        raise InvalidInput("tensors", "at least one tensor", "an empty sequence")
    return _broadcast_packed(list(tensors), device, src=src, group=group)


def _broadcast_packed(tensors: list[torch.Tensor], device: torch.device, *, src: int, group) -> list[torch.Tensor]:
    import torch.distributed as dist

    group, rank, world = _group_rank_size(group)
    checks.integer("src", src, low=0, high=world - 1)
    segments, total = _layout(tensors)
    if rank == src:  # a static per-process branch: the same on every call and in every replay
        buffer = torch.zeros(total, dtype=torch.uint8, device=device)  # zeroed padding: deterministic bytes
        for segment, tensor in zip(segments, tensors):
            buffer[segment.offset:segment.offset + segment.nbytes].copy_(_as_bytes(tensor))
    else:
        buffer = torch.empty(total, dtype=torch.uint8, device=device)
    dist.broadcast(buffer, src=dist.get_global_rank(group, src), group=group)
    return [buffer[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape) for s in segments]


def _check_verdict(verdict: object) -> tuple[int, torch.device]:
    if not isinstance(verdict, Verdict):
        raise InvalidInput("verdict", "a spec_hal.Verdict", type(verdict).__name__)
    index = checks.tensor("verdict.accept_index", verdict.accept_index, ndim=2, dtypes=checks.INDEX_DTYPES)
    bs, device = index.shape[0], index.device
    for name in ("num_correct", "accept_lens"):
        checks.tensor(f"verdict.{name}", getattr(verdict, name), dtypes=checks.INDEX_DTYPES, device=device, shape=(bs,))
    predict = checks.tensor("verdict.predict", verdict.predict, ndim=1, dtypes=checks.INDEX_DTYPES, device=device)
    if predict.shape[0] % max(bs, 1) or (bs == 0 and predict.shape[0]):
        raise InvalidInput("verdict.predict", f"shape (bs * N,) with bs = {bs}", f"shape {tuple(predict.shape)}")
    return bs, device


def _check_batch_first(name: str, value: object, bs: int, device: torch.device, dtypes) -> None:
    checks.tensor(name, value, dtypes=dtypes, device=device)
    if value.dim() == 0 or value.shape[0] != bs:
        raise InvalidInput(name, f"a tensor with the batch (bs = {bs}) as first dimension", f"shape {tuple(value.shape)}")


def broadcast_verdict(verdict: Verdict, *, src: int = 0, group=None, tokens: Optional[torch.Tensor] = None,
                      logprobs: Optional[torch.Tensor] = None) -> VerificationBroadcast:
    """Every rank of ``group`` ends with rank ``src``'s verification result, in one broadcast.

    verdict:  this rank's :class:`Verdict` (predict (bs*N,), accept_index (bs, S+1), num_correct
              and accept_lens (bs,); int32 or int64). Only its shapes and dtypes are used on ranks
              other than ``src``.
    tokens:   optional (bs, ...) int32/int64, e.g. the emitted tokens (bs, N) or the bonus (bs,).
    logprobs: optional (bs, ...) float16/bfloat16/float32/float64, e.g. the emitted tokens'
              log-probabilities.
    All on one device; the same shapes and dtypes on every rank; bs = 0 is allowed (the
    collective still runs, so idle ranks stay in step).

    Returns ``VerificationBroadcast(verdict, tokens, logprobs)`` with ``src``'s values (``None``
    where not given), new tensors on every rank (the inputs are not modified).
    """
    bs, device = _check_verdict(verdict)
    if tokens is not None:
        _check_batch_first("tokens", tokens, bs, device, checks.INDEX_DTYPES)
    if logprobs is not None:
        _check_batch_first("logprobs", logprobs, bs, device, checks.FLOAT_DTYPES)
    fields = [verdict.predict, verdict.accept_index, verdict.num_correct, verdict.accept_lens]
    extras = [tensor for tensor in (tokens, logprobs) if tensor is not None]
    received = _broadcast_packed(fields + extras, device, src=src, group=group)
    result = iter(received[4:])
    return VerificationBroadcast(
        verdict=Verdict(predict=received[0], accept_index=received[1], num_correct=received[2], accept_lens=received[3]),
        tokens=next(result) if tokens is not None else None,
        logprobs=next(result) if logprobs is not None else None,
    )


# ----------------------------------------------------------------------------------------------
# consensus


def _check_named(tensors: object) -> tuple[list[str], list[torch.Tensor], torch.device]:
    if not isinstance(tensors, Mapping):
        raise InvalidInput("tensors", "a mapping of names to tensors", type(tensors).__name__)
    if not tensors:
        raise InvalidInput("tensors", "at least one named tensor", "an empty mapping")
    names, values, device = [], [], None
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise InvalidInput("tensors", "string keys (the names an error reports)", f"key {name!r}")
        checks.tensor(f"tensors[{name!r}]", tensor, device=device)
        device = tensor.device
        names.append(name)
        values.append(tensor)
    return names, values, device


def _salt(tensor: torch.Tensor, lane: int) -> int:
    """A host constant from dtype and shape (crc32: the same in every process, unlike hash())."""
    return zlib.crc32(f"{lane}:{tensor.dtype}:{tuple(tensor.shape)}".encode()) % _PRIME


def _fingerprint_one(tensor: torch.Tensor) -> torch.Tensor:
    data = _as_bytes(tensor).to(torch.int64) + 1
    position = torch.arange(data.shape[0], dtype=torch.int64, device=tensor.device)
    lanes = []
    for lane, (multiplier, offset) in enumerate(_LANES):
        weights = (position * multiplier + offset) % (_PRIME - 1) + 1
        lanes.append(((data * weights) % _PRIME).sum() % _PRIME + _salt(tensor, lane))
    return torch.stack(lanes) % _PRIME


def fingerprint(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """(T, 2) int64 fingerprint of each named tensor's dtype, shape and bytes, on their device.

    Integer arithmetic only: equal tensors have equal fingerprints on every backend; any single
    changed byte changes both lanes. No host sync; capturable.
    """
    _, values, _ = _check_named(tensors)
    return torch.stack([_fingerprint_one(tensor) for tensor in values])


def gather_fingerprints(tensors: Mapping[str, torch.Tensor], *, group=None) -> torch.Tensor:
    """(world, T, 2) int64: row r is rank r's :func:`fingerprint` of ``tensors``, on every rank.

    One ``all_reduce(SUM)`` of a zero table in which each rank filled its own row (an all-gather
    that every backend, gloo included, supports for any shape). No host sync; capturable.
    """
    import torch.distributed as dist

    names, values, device = _check_named(tensors)
    group, rank, world = _group_rank_size(group)
    table = torch.zeros(world, len(names), 2, dtype=torch.int64, device=device)
    table[rank] = torch.stack([_fingerprint_one(tensor) for tensor in values])
    dist.all_reduce(table, op=dist.ReduceOp.SUM, group=group)
    return table


def raise_on_divergence(table: torch.Tensor, names: Sequence[str], *, reference: int = 0, what: str = "") -> None:
    """Read a :func:`gather_fingerprints` table on the host (one sync) and raise
    :class:`RankDivergence` if any rank's row differs from the ``reference`` rank's.

    Every rank holds the same table, so every rank raises the same error (or none).
    ``what`` says where the check ran (for the message, e.g. "round 17").
    """
    checks.tensor("table", table, ndim=3, dtypes=(torch.int64,), shape=(None, len(names), 2))
    checks.integer("reference", reference, low=0, high=table.shape[0] - 1)
    host = table.cpu()
    differing = {rank: tuple(name for index, name in enumerate(names) if not torch.equal(host[rank, index], host[reference, index]))
                 for rank in range(host.shape[0])}
    differing = {rank: found for rank, found in differing.items() if found}
    if not differing:
        return
    where = f" ({what})" if what else ""
    details = "; ".join(f"rank {rank} differs from rank {reference} on {', '.join(map(repr, found))}"
                        for rank, found in differing.items())
    raise RankDivergence(
        f"tensor-parallel ranks disagree{where}: {details}. Every rank of the group raises this error, so none "
        "waits in a collective the others skip. Usual causes: rank-local random numbers (coins drawn without a "
        "shared seed), logits that differ in the last bit before a greedy or sampling verify, or a kernel with a "
        "rank-dependent launch configuration; broadcast the verification result (spec_hal.distributed."
        "broadcast_verdict) instead of recomputing it per rank (docs/distributed.md).",
        ranks=tuple(differing), reference=reference, tensors=tuple(sorted({n for found in differing.values() for n in found})))


def check_consensus(tensors: Mapping[str, torch.Tensor], *, group=None, reference: int = 0, what: str = "") -> None:
    """Raise :class:`RankDivergence` on every rank of ``group`` if the named tensors differ
    between ranks (compared with rank ``reference``); otherwise return None.

    Costs one small ``all_reduce`` and one host read. Call it at the same point on every rank,
    with the same names (a static program point, not a data-dependent one).
    """
    names, _, _ = _check_named(tensors)
    _, _, world = _group_rank_size(group)
    checks.integer("reference", reference, low=0, high=world - 1)
    raise_on_divergence(gather_fingerprints(tensors, group=group), names, reference=reference, what=what)
