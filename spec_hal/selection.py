"""Backend selection: which backend runs, and why.

Order (docs/architecture.md §3): an explicit name; the ``SPEC_HAL_BACKEND`` environment variable; plugins
registered under the entry-point group ``spec_hal.backends`` (first usable one, in name order);
built-ins by priority (rocm, cuda, cpu). An explicit choice that cannot run raises
:class:`BackendUnavailable` with the reason; there is never a silent fallback.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Optional

import torch

from .backend import Backend
from .backends import AUTO_ORDER, BUILTIN_MODULES, builtin_factory
from .errors import BackendUnavailable

ENTRY_POINT_GROUP = "spec_hal.backends"
ENV_VAR = "SPEC_HAL_BACKEND"

_lock = threading.RLock()
_backends: dict[tuple[str, Optional[str]], Backend] = {}
_plugins: Optional[dict] = None
_plugin_errors: dict[str, str] = {}


@dataclass(frozen=True)
class Choice:
    name: str
    why: str


def _load_plugins() -> dict:
    """Plugin factories by backend name (entry points loaded once; broken ones are reported)."""
    global _plugins
    if _plugins is None:
        _plugins = {}
        for entry_point in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            try:
                factory = entry_point.load()
                factory = factory() if isinstance(factory, type) else factory
                _plugins[factory.name] = factory
            except Exception as exc:  # a broken plugin must not break selection of the others
                _plugin_errors[entry_point.name] = f"plugin failed to load: {type(exc).__name__}: {exc}"
    return _plugins


def _factory(name: str):
    if name in BUILTIN_MODULES:
        return builtin_factory(name)
    plugins = _load_plugins()
    if name in plugins:
        return plugins[name]
    raise BackendUnavailable(f"unknown backend {name!r}; valid backends: {', '.join(known_backends())}")


def known_backends() -> list[str]:
    return list(BUILTIN_MODULES) + sorted(set(_load_plugins()) - set(BUILTIN_MODULES)) + sorted(_plugin_errors)


def _unavailable_reason(name: str, device: Optional[torch.device]) -> Optional[str]:
    if name in _plugin_errors:
        return _plugin_errors[name]
    try:
        return _factory(name).unavailable_reason(device)
    except BackendUnavailable as exc:
        return str(exc)
    except Exception as exc:  # probing must report, never crash selection
        return f"probe failed: {type(exc).__name__}: {exc}"


def available_backends(device: "torch.device | str | None" = None) -> dict[str, Optional[str]]:
    """Every known backend mapped to None (usable here) or the reason it is not."""
    device = torch.device(device) if device is not None else None
    with _lock:
        return {name: _unavailable_reason(name, device) for name in known_backends()}


def choose(name: Optional[str] = None, device: "torch.device | str | None" = None) -> Choice:
    """Decide which backend :func:`get_backend` would return, and why, without building it."""
    device = torch.device(device) if device is not None else None
    if name is not None:
        return Choice(name, "asked for by name")
    env_name = os.environ.get(ENV_VAR, "").strip()
    if env_name:
        return Choice(env_name, f"{ENV_VAR}={env_name}")
    for plugin_name, factory in _load_plugins().items():
        if factory.unavailable_reason(device) is None:
            return Choice(plugin_name, f"plugin backend {plugin_name!r} is usable (plugins come before built-ins)")
    skipped = []
    for builtin in AUTO_ORDER:
        reason = _unavailable_reason(builtin, device)
        if reason is None:
            why = f"first usable built-in in priority order {', '.join(AUTO_ORDER)}"
            if skipped:
                why += " (" + "; ".join(skipped) + ")"
            return Choice(builtin, why)
        skipped.append(f"{builtin}: {reason}")
    raise BackendUnavailable("no backend is usable: " + "; ".join(skipped))


def get_backend(name: Optional[str] = None, device: "torch.device | str | None" = None) -> Backend:
    """Return the backend to use (cached).

    ``name``: a backend name ("cpu", "cuda", "rocm", "triton-interpret" or a plugin's); default:
    ``SPEC_HAL_BACKEND``, then plugins, then the best built-in for this machine.
    Raises :class:`BackendUnavailable` (with the reason) when the chosen backend cannot run.
    """
    with _lock:
        device = torch.device(device) if device is not None else None
        choice = choose(name, device)
        key = (choice.name, str(device) if device is not None else None)
        if key not in _backends:
            reason = _unavailable_reason(choice.name, device)
            if reason is not None:
                raise BackendUnavailable(f"backend {choice.name!r} ({choice.why}) is unavailable: {reason}")
            _backends[key] = _factory(choice.name).create(device)
        return _backends[key]


def backend_for_device(device: torch.device) -> Backend:
    """The backend that module-level ops use for tensors on ``device``.

    The selected backend if it works on that device type (so ``SPEC_HAL_BACKEND=triton-interpret``
    routes CPU tensors through the interpreter); otherwise ``cpu`` for CPU tensors and the best
    built-in for GPU tensors.
    """
    with _lock:
        try:
            active = get_backend()
        except BackendUnavailable:
            if os.environ.get(ENV_VAR, "").strip():
                raise  # an explicit choice that cannot run is an error, never a fallback
            active = None
        if active is not None and active.device.type == device.type:
            return active
        if device.type == "cpu":
            return get_backend("cpu")
        for builtin in AUTO_ORDER:
            if _unavailable_reason(builtin, device) is None:
                return get_backend(builtin, device)
        raise BackendUnavailable(f"no backend handles tensors on {device}")


def reset() -> None:
    """Forget built backends, the ops' per-device caches, plugin discovery and probe results
    (for tests, or after changing ``SPEC_HAL_BACKEND`` in a running process)."""
    global _plugins
    from .capabilities import reset_probe_cache
    from .ops import reset_caches

    with _lock:
        reset_caches()
        _backends.clear()
        _plugins = None
        _plugin_errors.clear()
        reset_probe_cache()
