"""Module-level ops: ``spec_hal.<op>(...)`` runs on the backend for its tensors' device.

CPU tensors go to ``cpu`` unless the selected backend also runs on CPU tensors
(``SPEC_HAL_BACKEND=triton-interpret``); GPU tensors go to the selected GPU backend. To call one
backend explicitly use ``spec_hal.get_backend(name).<op>(...)``.

The hot path. An eager call finds its tensors' device, looks the device up in the op's own cache
and calls what it finds: the op's metadata check and the provider, bound once per backend
(``Backend.bound``; ``dispatch`` runs that callable's two parts itself, one Python frame fewer
per call). Selection, probing and registry work happen on the first call per device
only; :func:`spec_hal.selection.reset` empties the caches (tests, or after changing
``SPEC_HAL_BACKEND`` in a running process).

Under ``torch.compile`` the same function takes the other branch: the call goes through the
registered custom op ``torch.ops.spec_hal.<op>`` (``spec_hal/torch_library.py``), which the
dispatcher routes by device type to the same cached callables at run time.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from .backend import reraise_as_signature_error
from .registry import op_spec
from .selection import backend_for_device

_DEVICE_CACHES: list[dict] = []


def _first_tensor_device(args, kwargs) -> torch.device:
    if args:  # the usual call: the first positional argument decides, without building a tuple of all
        first = args[0]
        if isinstance(first, torch.Tensor):
            return first.device
        device = getattr(first, "device", None) if not isinstance(first, (tuple, list)) else None
        if isinstance(device, torch.device):
            return device
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


def bound_for_device(name: str, device: torch.device) -> Callable:
    """The check-then-provider callable that runs op ``name`` for tensors on ``device`` (cached)."""
    return _device_cache(name)(device)


@functools.lru_cache(maxsize=None)
def _device_cache(name: str) -> Callable[[torch.device], Callable]:
    cache: dict = {}
    _DEVICE_CACHES.append(cache)

    def lookup(device: torch.device) -> Callable:
        try:
            return cache[device]
        except KeyError:
            call = cache[device] = backend_for_device(device).bound(name)
            return call

    lookup.cache = cache
    return lookup


def reset_caches() -> None:
    """Forget every per-device bound op (called by ``spec_hal.selection.reset``)."""
    for cache in _DEVICE_CACHES:
        cache.clear()


@functools.lru_cache(maxsize=None)
def dispatcher(name: str) -> Callable:
    """The public function for op ``name`` (docstring taken from its reference).

    Also defines the ``torch.ops.spec_hal`` custom ops (once): the compiled branch must find them
    defined, since dynamo cannot trace their registration."""
    from .torch_library import register

    spec = op_spec(name)
    register()
    lookup = _device_cache(name)
    parts: dict = {}  # device -> (check, provider) of the bound op: its body inlined, one frame fewer a call
    _DEVICE_CACHES.append(parts)
    is_compiling = torch.compiler.is_compiling

    def dispatch(*args, **kwargs):
        if is_compiling():
            from .torch_library import call_custom_op

            return call_custom_op(name, args, kwargs)
        device = _first_tensor_device(args, kwargs)
        found = parts.get(device)
        if found is None:
            found = parts[device] = lookup(device).parts
        check, provider = found
        try:
            check(*args, **kwargs)
        except TypeError:  # as Backend.bound's callable: a call that does not fit names spec_hal.<op>
            reraise_as_signature_error(spec, args, kwargs)
        return provider(*args, **kwargs)

    functools.update_wrapper(dispatch, spec.reference)
    dispatch.__module__ = "spec_hal"
    return dispatch
