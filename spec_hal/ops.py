"""Module-level ops: ``spec_hal.<op>(...)`` runs on the backend for its tensors' device.

CPU tensors go to ``cpu`` unless the selected backend also runs on CPU tensors
(``SPEC_HAL_BACKEND=triton-interpret``); GPU tensors go to the selected GPU backend. To call one
backend explicitly use ``spec_hal.get_backend(name).<op>(...)``.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from .registry import op_spec
from .selection import backend_for_device


def _first_tensor_device(args, kwargs) -> torch.device:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
        if isinstance(value, (tuple, list)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    return item.device
                if isinstance(getattr(item, "device", None), torch.device):  # e.g. a list of TreeRecord
                    return item.device
        device = getattr(value, "device", None)  # result objects (DraftTree, Verdict, ...)
        if isinstance(device, torch.device):
            return device
    return torch.device("cpu")


@functools.lru_cache(maxsize=None)
def dispatcher(name: str) -> Callable:
    """The public function for op ``name`` (docstring taken from its reference)."""
    spec = op_spec(name)

    def dispatch(*args, **kwargs):
        backend = backend_for_device(_first_tensor_device(args, kwargs))
        return getattr(backend, name)(*args, **kwargs)

    functools.update_wrapper(dispatch, spec.reference)
    dispatch.__module__ = "spec_hal"
    return dispatch
