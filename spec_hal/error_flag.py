"""The device-side error flag: what the default (unchecked) mode met, without a host sync.

In the default mode an op never reads values on the host (that would be a sync, and would break
graph capture), so an invalid value (an index out of range, a negative length, a size that
disagrees with its tensor) cannot raise. The op applies its rule for that value (skip, clamp:
docs/reliability.md lists them) and records what it met in a per-device flag:

* the flag is ONE int64 tensor per device (``flag(device)``), ``NO_ERROR`` (int64 max) when clean;
* a record is the code ``op_id << 48 | argument_id << 40 | index`` (index: the first offending
  element, < 2^40), kept with an atomic min, so the flag holds the smallest code recorded since
  the last read: deterministic on every backend whatever the order of the threads;
* kernels record with ``spec_hal.kernels.error_flag.record_invalid`` (a masked ``tl.atomic_min``
  in the kernel that met the value); the reference records with :func:`record` (torch ops on the
  device, no sync), so the two agree bit for bit;
* :func:`raise_pending_errors` reads the flag (a host sync: call it where the engine syncs
  anyway), clears it and raises :class:`~spec_hal.errors.InvalidInput` naming the argument, the
  op and the index. In checked mode (``SPEC_HAL_CHECKS=1``) :func:`record` raises at once.

Graph capture: the flag is allocated on first use, outside any graph pool
(:func:`spec_hal.device_buffers.allocate_persistent`: a first use inside torch.compile's
cudagraph-trees warm-up is fine). Inside a stream capture itself make the first use happen
before (an eager warm-up call, as ``GraphRunner`` does, or ``flag(device)``); captured kernels
then update the same buffer on every replay.
"""
from __future__ import annotations

import os
import threading
from typing import Optional

import torch

from .device_buffers import allocate_persistent
from .errors import InvalidInput

NO_ERROR = 2**63 - 1
_INDEX_BITS = 40
_ARGUMENT_BITS = 8

# Stable numbering (append only: codes must mean the same thing in every version of a report).
FLAGGED = {
    "build_tree": ("seq_lens", "seq_lens_sum"),
    "assign_draft_slots": ("req_pool_indices", "seq_lens"),
    "move_kv": ("src", "dst"),
    "bonus_tokens": ("verdict.accept_lens", "verdict.accept_index"),
    "compact_accepted": ("verdict.accept_lens", "verdict.accept_index"),
    "accepted_kv_moves": ("verdict.accept_lens", "verdict.accept_index"),
    "mamba_commit_steps": ("verdict.accept_lens", "verdict.accept_index", "seq_lens"),
    "scatter_mamba_state": ("dst_slots", "src_steps", "src_rows"),
    "commit_mamba_state": ("verdict.accept_lens", "verdict.accept_index", "seq_lens", "slots", "track_slots", "src_rows"),
    "verify_sampling": ("candidates", "tree.retrieve_next_token", "tree.retrieve_next_sibling"),
    "verify_chain_sampling": ("draft_ids",),
    "verify_greedy": ("candidates", "tree.retrieve_next_token", "tree.retrieve_next_sibling"),
    "verify_chain": ("candidates",),
    "verify_tree_sampling": ("candidates", "tree.retrieve_next_token", "tree.retrieve_next_sibling"),
    "verify_chain_ragged": ("draft_tokens",),
}
_OPS = tuple(FLAGGED)

_lock = threading.RLock()
_flags: dict[str, torch.Tensor] = {}
# The hot path of flag(): every launch that records passes its tensors' torch.device. Filled
# under _lock, read without it (a dict read is atomic, and an entry never changes once written).
# Only devices that name one device are keys ("cuda" without an index follows the current device).
_by_device: dict[torch.device, torch.Tensor] = {}


def code(op: str, argument: str) -> int:
    """The code of (op, argument) at index 0; add the index to it."""
    found = _CODES.get((op, argument))  # launches ask on every call: one dict read
    return found if found is not None else _code(op, argument)


def _code(op: str, argument: str) -> int:
    return ((_OPS.index(op) + 1) << (_INDEX_BITS + _ARGUMENT_BITS)) | (FLAGGED[op].index(argument) << _INDEX_BITS)


_CODES = {(op, argument): _code(op, argument) for op, arguments in FLAGGED.items() for argument in arguments}


def decode(value: int) -> Optional[tuple[str, str, int]]:
    """(op, argument, index) of a flag value, or None for ``NO_ERROR``."""
    if value == NO_ERROR:
        return None
    op = _OPS[(value >> (_INDEX_BITS + _ARGUMENT_BITS)) - 1]
    argument = FLAGGED[op][(value >> _INDEX_BITS) & ((1 << _ARGUMENT_BITS) - 1)]
    return op, argument, value & ((1 << _INDEX_BITS) - 1)


def flag(device: "torch.device | str") -> torch.Tensor:
    """The (1,) int64 flag of ``device`` (created on first use, then the same tensor)."""
    found = _by_device.get(device)
    if found is not None:
        return found
    return _create_flag(device)


def _create_flag(device: "torch.device | str") -> torch.Tensor:
    requested = device
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = str(device)
    with _lock:
        if key not in _flags:
            _flags[key] = allocate_persistent(device, lambda: torch.full((1,), NO_ERROR, dtype=torch.int64, device=device))
        if isinstance(requested, torch.device) and (requested.index is not None or requested.type == "cpu"):
            _by_device[requested] = _flags[key]
        return _flags[key]


def checked_mode() -> bool:
    return os.environ.get("SPEC_HAL_CHECKS") == "1"


def record(op: str, argument: str, invalid: torch.Tensor, *, rule: str = "a valid value", index: Optional[torch.Tensor] = None) -> None:
    """Record the smallest index of a True entry of ``invalid`` for (op, argument): its flattened
    position, or ``index`` (int64, the shape of ``invalid``) where the entries stand for elements
    of the argument at other positions (a gather of it).

    No host sync in the default mode; in checked mode raise :class:`InvalidInput` at once.
    """
    if invalid.numel() == 0:
        return
    invalid = invalid.reshape(-1)
    if index is None:
        index = torch.arange(invalid.numel(), device=invalid.device, dtype=torch.int64)
    index = index.reshape(-1).to(torch.int64).clamp(min=0, max=(1 << _INDEX_BITS) - 1)
    if checked_mode():
        if bool(invalid.any()):
            first = int(torch.where(invalid, index, NO_ERROR).min())
            raise InvalidInput(argument, rule, f"an invalid value at index {first} ({op})")
        return
    candidate = torch.where(invalid, index + code(op, argument), NO_ERROR).min()
    target = flag(invalid.device)
    torch.minimum(target, candidate, out=target)


def pending_errors(device: "torch.device | str | None" = None, *, clear: bool = True) -> list[tuple[str, str, int]]:
    """Decoded records of ``device`` (every device with a flag when None); a host sync."""
    with _lock:
        keys = list(_flags) if device is None else [str(flag(device).device)]
        found = []
        for key in keys:
            value = int(_flags[key].item())
            if value != NO_ERROR:
                found.append(decode(value))
                if clear:
                    _flags[key].fill_(NO_ERROR)
        return found


def raise_pending_errors(device: "torch.device | str | None" = None) -> None:
    """Raise InvalidInput for what the default mode recorded (and clear the flag); a host sync."""
    errors = pending_errors(device)
    if errors:
        op, argument, index = errors[0]
        raise InvalidInput(argument, f"valid values for {op} (the default mode applied its rule: docs/reliability.md)",
                           f"an invalid value at index {index}")
