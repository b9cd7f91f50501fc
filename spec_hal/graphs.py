"""Family ``graphs``: :class:`GraphRunner`, one graph runner for CUDA graphs, HIP graphs and an
eager emulation with the same static-buffer semantics. docs/architecture.md §4 (Graph capture), docs/semantics.md P17/P18.

Upstream bugs 1 and 2 both lived in hand-written graph runners: a static positions buffer that
drifted across the warm-up and capture runs, and new hidden states written to an attribute that
was not the captured buffer. This runner owns the static buffers so engines stop writing them.

Contract
========
``GraphRunner(fn, *, inputs, batch_sizes, mutable=(), pad_values=None)``

* ``inputs`` maps each argument name of ``fn`` to an **example tensor** whose first dimension is
  the batch. Only its trailing shape, dtype and device are used (its values and its batch size
  are ignored; ``torch.empty(0, H)`` is a fine example). The runner allocates one contiguous
  static buffer per input of shape ``(max(batch_sizes), *trailing)``. Tensors that do not depend
  on the batch (weights, token maps, KV caches addressed by slot) are not inputs: ``fn`` closes
  over them, and they must keep their address for the runner's lifetime (a graph replays fixed
  addresses).
* ``fn(**views)`` is called with keyword arguments, each the first ``bucket`` rows of its static
  buffer. It returns a tensor, a tuple/list of tensors or a dict of tensors; every output must
  have the batch as its first dimension (size ``bucket``). It must not sync the host (graph
  capture would fail; see the fallback below), and random numbers must be inputs.
* ``batch_sizes``: the buckets (positive ints). One graph per bucket, all buckets of one runner
  in one memory pool (``torch.cuda.graph_pool_handle()``), captured largest first so smaller
  buckets reuse the larger one's intermediate memory. Each runner has its own pool: two runners
  (a draft and a target) never share one (sglang#22930, CG2).
* ``pad_values``: per-input scalar written into the padding rows ``[bs, bucket)`` before every
  replay. Default 0 for every dtype (0 is a valid token id, position and slot; engines reserve
  slot 0 as the padding sink). Padding is refilled on every run, not once: stale real rows of an
  earlier, larger batch would otherwise write KV or state into live requests' slots.
* ``mutable``: names of inputs ``fn`` updates in place (carried state such as chained-MTP hidden
  states). Every other input must be bit-identical after ``fn`` ran (the state guard below).

``run(**inputs)``: every input by name, batch first, same trailing shape/dtype/device as its
example; all with the same batch size ``bs``. It picks the smallest bucket >= bs (``bs`` above the
largest bucket raises :class:`InvalidInput`), copies the ``bs`` real rows into the static
buffers (only rows ``[0, bs)`` of the caller's tensors are read), fills the padding rows, replays,
and then:

* **outputs** are returned in ``fn``'s structure, each sliced to ``bs`` rows and **always cloned**:
  the next replay of the same bucket overwrites every captured output, and outputs that alias a
  static input are overwritten by the next ``run``. A returned tensor never aliases runner memory.
  The eager emulation clones too, so an engine that works in one mode works in the other.
* **mutable inputs** are written back: rows ``[0, bs)`` of the caller's tensor receive the
  updated rows of the static buffer (``caller.copy_(static[:bs])``), so ``runner.run(**x)`` has
  the same observable effects as ``fn(**x)``. Non-mutable caller tensors are never written.
* ``bs = 0`` (an idle data-parallel rank) replays nothing and returns empty outputs whose trailing
  shapes and dtypes were recorded at capture.

No host sync happens in ``run`` (metadata checks only), so it can itself sit in a larger graph's
surroundings without stalling the CPU. ``replays[bucket]`` counts the runs per bucket (CG8:
captured graphs that are never dispatched show up as zeros).

Modes and fallback
==================
``mode`` is "cuda_graph", "hip_graph" or "eager", from :func:`spec_hal.capabilities.graph_support`
(which proves capture on the device with a tiny graph). CPU tensors (the ``cpu`` and
``triton-interpret`` backends) always run the eager emulation. The emulation has exactly the
graph semantics: ``fn`` always runs on the padded static buffers of the bucket, its outputs are
copied into per-bucket static outputs that the next run overwrites (as a replay would), then
sliced and cloned, and mutable inputs are written back, so a test of a graph bug fails in CI too.
If capture fails on a device that supports it (``fn`` syncs the host, allocates in a way the
runtime forbids, HIP capture defects), the runner warns (:class:`GraphCaptureWarning`), drops
every captured graph, and runs the emulation; ``mode`` says "eager", ``fallback_reason`` says
why, and ``explain()`` reports both. It never crashes the engine and never hides the fallback.
Errors raised by ``fn`` itself during warm-up, and :class:`GraphStateError`, are not capture
failures: they propagate.

State guard
===========
Before each capture (and each emulation warm-up), ``fn`` runs once on the bucket's views of the
static buffers (pad values). Afterwards every non-mutable input buffer, all ``max(batch_sizes)``
rows of it, must be bit-identical (NaN compared by bits), and the rows of mutable buffers beyond
the bucket must be untouched; otherwise :class:`GraphStateError` names the buffer. Upstream bug 1
(``positions.add_(1)`` S-1 times without the restore) becomes an error at capture on every
backend instead of a drifted buffer. Limitation: state that ``fn`` keeps in Python objects (an
attribute rebound to a fresh tensor and read on the next call) is re-read on every emulated run
but frozen in a real graph; the emulation cannot reproduce that, except that the warm-up runs'
side effects leak into the first real run. Keep carried state in declared mutable inputs.

Integration with ``run_draft(..., graph=DraftGraphs(batch_sizes))``
==================================================================
Built in :mod:`spec_hal.draft_loop` (docs/drafting.md): ``DraftGraphs`` holds one runner per
(model, steps, topk, chain_hidden, backend, input signature); the whole loop is ``fn`` over the
state tensors (no mutable input: positions are computed out of place and the last hidden is an
output), records come back concatenated batch first and are repacked into the DraftResult.
"""
from __future__ import annotations

import bisect
import contextlib
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, Union

import torch

from .capabilities import graph_support
from .errors import GraphStateError, InvalidInput

__all__ = ["GraphRunner", "GraphCaptureWarning"]

PadValue = Union[bool, int, float]
_BIT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class GraphCaptureWarning(RuntimeWarning):
    """Graph capture failed on a device that supports it; the eager emulation runs instead."""


@dataclass(frozen=True)
class _OutputSpec:
    """How to rebuild ``fn``'s output structure: kind ("tensor", "tuple", "list", "dict"), keys,
    and each output's trailing shape and dtype (for bs = 0)."""

    kind: str
    keys: tuple
    trailing: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]


def _flatten_outputs(outputs: object, bucket: int, device: torch.device) -> tuple[_OutputSpec, list[torch.Tensor]]:
    if isinstance(outputs, torch.Tensor):
        kind, keys, tensors = "tensor", (), [outputs]
    elif isinstance(outputs, (tuple, list)):
        kind, keys, tensors = type(outputs).__name__, tuple(range(len(outputs))), list(outputs)
    elif isinstance(outputs, dict):
        kind, keys, tensors = "dict", tuple(outputs), list(outputs.values())
    else:
        raise InvalidInput("fn", "to return a tensor, a tuple/list of tensors or a dict of tensors", type(outputs).__name__)
    for key, tensor in zip(keys or (0,), tensors):
        name = f"fn output {key!r}"
        if not isinstance(tensor, torch.Tensor):
            raise InvalidInput(name, "a torch.Tensor", type(tensor).__name__)
        if tensor.dim() == 0 or tensor.shape[0] != bucket or tensor.device != device:
            raise InvalidInput(name, f"a tensor on {device} with the batch ({bucket} rows) as first dimension",
                               f"shape {tuple(tensor.shape)} on {tensor.device}")
    spec = _OutputSpec(kind, keys, tuple(tuple(t.shape[1:]) for t in tensors), tuple(t.dtype for t in tensors))
    return spec, tensors


def _unflatten_outputs(spec: _OutputSpec, tensors: list[torch.Tensor]) -> object:
    if spec.kind == "tensor":
        return tensors[0]
    if spec.kind == "dict":
        return dict(zip(spec.keys, tensors))
    return tuple(tensors) if spec.kind == "tuple" else list(tensors)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """An integer view for bitwise comparison (NaN equals NaN, -0.0 differs from 0.0)."""
    if tensor.dtype.is_floating_point:
        return tensor.contiguous().view(_BIT_VIEW[tensor.element_size()])
    return tensor


def _first_difference(before: torch.Tensor, after: torch.Tensor) -> Optional[str]:
    differs = _bits(before) != _bits(after)
    if not bool(differs.any()):
        return None
    rows = differs.reshape(differs.shape[0], -1).any(dim=1).nonzero().flatten()
    return f"{int(differs.sum())} element(s) changed, in row(s) {rows[:8].tolist()}"


class GraphRunner:
    """Capture ``fn`` over static input buffers, one graph per batch-size bucket.

    See the module docstring for the full contract. Attributes: ``mode`` ("cuda_graph",
    "hip_graph" or "eager"), ``mode_reason``, ``fallback_reason`` (None unless capture was
    expected on this device and failed or was unavailable), ``batch_sizes`` (sorted buckets),
    ``replays`` (bucket -> number of runs), ``static_inputs`` (name -> the full static buffer,
    ``(max bucket, *trailing)``; for inspection and tests, not for writing).
    """

    def __init__(
        self,
        fn: Callable[..., object],
        *,
        inputs: Mapping[str, torch.Tensor],
        batch_sizes: Sequence[int],
        mutable: Sequence[str] = (),
        pad_values: Optional[Mapping[str, PadValue]] = None,
    ):
        if not callable(fn):
            raise InvalidInput("fn", "a callable fn(**inputs)", type(fn).__name__)
        self._fn = fn
        self.device = self._check_inputs(inputs)
        self.batch_sizes = self._check_batch_sizes(batch_sizes)
        self.mutable = self._check_names("mutable", tuple(mutable), inputs)
        self.pad_values = self._check_pad_values(pad_values or {}, inputs)
        max_bs = self.batch_sizes[-1]
        self.static_inputs = {
            name: torch.empty((max_bs, *example.shape[1:]), dtype=example.dtype, device=self.device)
            for name, example in inputs.items()
        }
        self.replays = {bucket: 0 for bucket in self.batch_sizes}
        self._graphs: dict[int, object] = {}
        self._static_outputs: dict[int, list[torch.Tensor]] = {}
        self._output_spec: Optional[_OutputSpec] = None
        self.pool = None
        self.fallback_reason: Optional[str] = None
        support = graph_support(self.device)
        self.mode, self.mode_reason = support.mode, support.reason
        if self.device.type != "cpu" and support.mode == "eager":
            self.fallback_reason = support.reason
        if self.mode == "eager":
            self._prepare_eager()
        else:
            self._capture_or_fall_back()

    # ----------------------------------------------------------------------------- validation
    @staticmethod
    def _check_inputs(inputs: Mapping[str, torch.Tensor]) -> torch.device:
        if not isinstance(inputs, Mapping) or not inputs:
            raise InvalidInput("inputs", "a non-empty mapping from argument names to example tensors", type(inputs).__name__)
        device = None
        for name, example in inputs.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise InvalidInput("inputs", "argument names (identifiers) as keys", repr(name))
            if not isinstance(example, torch.Tensor) or example.dim() == 0:
                got = f"shape {tuple(example.shape)}" if isinstance(example, torch.Tensor) else type(example).__name__
                raise InvalidInput(f"inputs[{name!r}]", "an example tensor with the batch as first dimension", got)
            device = example.device if device is None else device
            if example.device != device:
                raise InvalidInput(f"inputs[{name!r}]", f"a tensor on {device} like the other inputs", f"one on {example.device}")
        return device

    @staticmethod
    def _check_batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
        if isinstance(batch_sizes, (int, torch.Tensor)) or not batch_sizes:
            raise InvalidInput("batch_sizes", "a non-empty sequence of positive ints", repr(batch_sizes))
        for size in batch_sizes:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise InvalidInput("batch_sizes", "positive ints (bs = 0 needs no bucket)", repr(size))
        return sorted(set(batch_sizes))

    @staticmethod
    def _check_names(argument: str, names: Sequence[str], inputs: Mapping[str, torch.Tensor]) -> tuple[str, ...]:
        for name in names:
            if name not in inputs:
                raise InvalidInput(argument, f"names of inputs ({', '.join(inputs)})", repr(name))
        return tuple(names)

    def _check_pad_values(self, pad_values: Mapping[str, PadValue], inputs: Mapping[str, torch.Tensor]) -> dict[str, PadValue]:
        self._check_names("pad_values", tuple(pad_values), inputs)
        resolved = {}
        for name, example in inputs.items():
            value = pad_values.get(name, 0)
            if example.dtype == torch.bool:
                allowed = isinstance(value, bool) or value in (0, 1)
            elif example.dtype.is_floating_point:
                allowed = isinstance(value, (int, float)) and not isinstance(value, bool)
            else:
                allowed = isinstance(value, int) and not isinstance(value, bool)
            if not allowed:
                raise InvalidInput(f"pad_values[{name!r}]", f"a Python scalar valid for the {example.dtype} input", repr(value))
            resolved[name] = value
        return resolved

    def _check_run_inputs(self, inputs: Mapping[str, torch.Tensor]) -> int:
        missing = [name for name in self.static_inputs if name not in inputs]
        unknown = [name for name in inputs if name not in self.static_inputs]
        if missing or unknown:
            name = (missing or unknown)[0]
            expected = f"exactly the inputs {', '.join(self.static_inputs)}"
            raise InvalidInput(name, expected, "missing" if missing else "an unknown input")
        batch = None
        for name, static in self.static_inputs.items():
            value = inputs[name]
            if not isinstance(value, torch.Tensor):
                raise InvalidInput(name, "a torch.Tensor", type(value).__name__)
            wanted = ("*", *static.shape[1:])
            if value.dim() != static.dim() or value.shape[1:] != static.shape[1:] or value.dtype != static.dtype or value.device != static.device:
                raise InvalidInput(name, f"shape {wanted} {static.dtype} on {static.device}",
                                   f"shape {tuple(value.shape)} {value.dtype} on {value.device}")
            batch = value.shape[0] if batch is None else batch
            if value.shape[0] != batch:
                raise InvalidInput(name, f"the same batch size as the other inputs ({batch})", value.shape[0])
        if batch > self.batch_sizes[-1]:
            raise InvalidInput("batch size", f"at most the largest captured bucket {self.batch_sizes[-1]}", batch)
        return batch

    # ------------------------------------------------------------------------------- capture
    def _views(self, bucket: int) -> dict[str, torch.Tensor]:
        return {name: buffer[:bucket] for name, buffer in self.static_inputs.items()}

    def _fill_padding(self, start: int, stop: int) -> None:
        if start < stop:
            for name, buffer in self.static_inputs.items():
                buffer[start:stop].fill_(self.pad_values[name])

    def _warm_up(self, bucket: int, run: Callable[[], object]) -> object:
        """Run ``fn`` once on the padded static buffers and enforce the state guard."""
        self._fill_padding(0, self.batch_sizes[-1])
        before = {name: buffer.clone() for name, buffer in self.static_inputs.items()}
        outputs = run()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for name, buffer in self.static_inputs.items():
            rows = slice(bucket, None) if name in self.mutable else slice(None)
            change = _first_difference(before[name][rows], buffer[rows])
            if change is None:
                continue
            if name in self.mutable:
                raise GraphStateError(f"input {name!r}: fn wrote rows beyond its batch of {bucket} ({change}, counted from row {bucket})")
            raise GraphStateError(
                f"input {name!r}: fn changed it during the warm-up for batch size {bucket} ({change}) but it is "
                f"not declared mutable; every replay would start from the drifted buffer (upstream bug 1: "
                f"positions advanced and never restored). Compute it out of place, restore it, or list it in mutable=.")
        spec, _ = _flatten_outputs(outputs, bucket, self.device)
        if self._output_spec is not None and spec != self._output_spec:
            raise InvalidInput("fn", "the same output structure, trailing shapes and dtypes for every batch size", f"{spec} for {bucket}")
        self._output_spec = spec
        return outputs

    def _prepare_eager(self) -> None:
        """The emulation's "capture": a guarded warm-up per bucket, whose outputs (cloned, as
        they may alias a static input) become the bucket's static outputs."""
        for bucket in reversed(self.batch_sizes):
            outputs = self._warm_up(bucket, lambda: self._fn(**self._views(bucket)))
            self._static_outputs[bucket] = [tensor.clone() for tensor in _flatten_outputs(outputs, bucket, self.device)[1]]

    def _capture_or_fall_back(self) -> None:
        try:
            self._capture_all()
        except GraphStateError:
            raise
        except _CaptureFailed as failure:
            self._graphs.clear()
            self._static_outputs.clear()
            self.pool = None
            captured_mode = self.mode
            self.mode = "eager"
            self.fallback_reason = f"{captured_mode} capture failed for batch size {failure.bucket}: {failure.cause}"
            self.mode_reason = self.fallback_reason + "; the eager emulation runs (same results, no launch savings)"
            warnings.warn(f"GraphRunner: {self.mode_reason}", GraphCaptureWarning, stacklevel=3)
            self._prepare_eager()

    def _capture_all(self) -> None:
        with torch.cuda.device(self.device):
            self.pool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream(self.device)
            for bucket in reversed(self.batch_sizes):  # largest first: smaller graphs reuse its memory
                views = self._views(bucket)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    self._warm_up(bucket, lambda: self._fn(**views))
                torch.cuda.current_stream(self.device).wait_stream(stream)
                self._fill_padding(0, self.batch_sizes[-1])
                torch.cuda.synchronize(self.device)
                graph, outputs = _capture_graph(self._fn, views, pool=self.pool, stream=stream, bucket=bucket)
                self._graphs[bucket] = graph
                self._static_outputs[bucket] = _flatten_outputs(outputs, bucket, self.device)[1]

    # ----------------------------------------------------------------------------------- run
    def run(self, **inputs: torch.Tensor) -> object:
        """Run ``fn`` on the real batch through the bucket's graph (or the emulation).

        Returns ``fn``'s output structure with every tensor cloned and sliced to ``bs`` rows, and
        writes the updated rows of mutable inputs back into the caller's tensors.
        """
        batch = self._check_run_inputs(inputs)
        if batch == 0:
            return self._empty_outputs()
        bucket = self.batch_sizes[bisect.bisect_left(self.batch_sizes, batch)]
        self._load(inputs, batch=batch, bucket=bucket)
        self._launch(bucket)
        self.replays[bucket] += 1
        self._write_back(inputs, batch=batch)
        return _unflatten_outputs(self._output_spec, [output[:batch].clone() for output in self._static_outputs[bucket]])

    def _load(self, inputs: Mapping[str, torch.Tensor], *, batch: int, bucket: int) -> None:
        """Copy the real rows into the static buffers and refill the padding rows."""
        for name, buffer in self.static_inputs.items():
            buffer[:batch].copy_(inputs[name])
        self._fill_padding(batch, bucket)

    def _launch(self, bucket: int) -> None:
        """Replay the bucket's graph, or emulate it: run fn on the static views and copy its
        outputs into the bucket's static outputs, which the next run overwrites as a replay would."""
        if self.mode != "eager":
            self._graphs[bucket].replay()
            return
        spec, outputs = _flatten_outputs(self._fn(**self._views(bucket)), bucket, self.device)
        if spec != self._output_spec:
            raise InvalidInput("fn", f"the output structure recorded at warm-up ({self._output_spec})", spec)
        for static, fresh in zip(self._static_outputs[bucket], outputs):
            static.copy_(fresh)

    def _write_back(self, inputs: Mapping[str, torch.Tensor], *, batch: int) -> None:
        """Mutable inputs: the caller's rows receive the state fn wrote into the static buffer."""
        for name in self.mutable:
            inputs[name].copy_(self.static_inputs[name][:batch])

    def _empty_outputs(self) -> object:
        spec = self._output_spec
        empties = [torch.empty((0, *trailing), dtype=dtype, device=self.device) for trailing, dtype in zip(spec.trailing, spec.dtypes)]
        return _unflatten_outputs(spec, empties)

    def explain(self) -> str:
        """A human-readable report: mode and why, buckets, replays per bucket, fallback."""
        lines = [f"GraphRunner on {self.device}: mode {self.mode} ({self.mode_reason})",
                 f"  buckets: {self.batch_sizes}; one memory pool: {self.pool is not None}",
                 f"  mutable inputs: {', '.join(self.mutable) or 'none'}; pad values: {self.pad_values}",
                 "  replays per bucket: " + ", ".join(f"{bucket}: {count}" for bucket, count in self.replays.items())]
        if self.fallback_reason is not None:
            lines.append(f"  FALLBACK to the eager emulation: {self.fallback_reason}")
        return "\n".join(lines)


class _CaptureFailed(Exception):
    def __init__(self, bucket: int, cause: BaseException):
        super().__init__(bucket, cause)
        self.bucket, self.cause = bucket, f"{type(cause).__name__}: {cause}"


def _capture_graph(fn: Callable[..., object], views: dict[str, torch.Tensor], *, pool, stream, bucket: int):
    """Capture one call of ``fn`` on ``views``; any failure becomes :class:`_CaptureFailed`.

    Tests replace this function to simulate a capture failure on machines without a GPU.
    """
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            outputs = fn(**views)
        return graph, outputs
    except Exception as exc:  # a capture failure is reported and emulated, never raised
        with contextlib.suppress(Exception):  # a broken context makes the emulation fail loudly anyway
            torch.cuda.synchronize()
        raise _CaptureFailed(bucket, exc) from exc
