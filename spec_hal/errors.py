"""Error types of spec_hal.

Every error raised on purpose by spec_hal derives from :class:`SpecHalError`, so an engine can
catch the library's errors without catching its own bugs.
"""
from __future__ import annotations


class SpecHalError(Exception):
    """Base class of every error spec_hal raises on purpose."""


class BackendUnavailable(SpecHalError, RuntimeError):
    """A backend was asked for by name but cannot run here; the message says why."""


class UnsupportedOnBackend(SpecHalError, NotImplementedError):
    """The backend has no implementation of an op with the reference semantics.

    Raised instead of silently downgrading (for example greedy instead of sampling).
    """

    def __init__(self, op: str, backend: str, missing: str):
        self.op, self.backend, self.missing = op, backend, missing
        super().__init__(f"op {op!r} is not supported on backend {backend!r}: {missing}")


class InvalidInput(SpecHalError, ValueError):
    """An argument has the wrong type, shape, dtype, device or value.

    The message names the argument, what was expected and what came.
    """

    def __init__(self, argument: str, expected: str, got: object):
        self.argument, self.expected, self.got = argument, expected, got
        super().__init__(f"{argument}: expected {expected}, got {got}")


class GraphStateError(SpecHalError, RuntimeError):
    """A captured function changed an input buffer that it did not declare mutable."""


class RankDivergence(SpecHalError, RuntimeError):
    """Ranks of one process group hold different values where they must agree (tensor-parallel
    ranks that accepted different tokens). Raised by :func:`spec_hal.distributed.check_consensus`
    on every rank at once, instead of the deadlock that the next shape-dependent collective would
    cause.

    ``ranks``: the group ranks whose fingerprint differs from the reference rank's;
    ``reference``: that rank; ``tensors``: the names of the tensors that differ.
    """

    def __init__(self, message: str, *, ranks: tuple, reference: int, tensors: tuple):
        self.ranks, self.reference, self.tensors = ranks, reference, tensors
        super().__init__(message)
