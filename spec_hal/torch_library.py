"""Every op as a PyTorch custom op, ``torch.ops.spec_hal.<op>``: what makes spec_hal usable inside
``torch.compile(fullgraph=True)``, CUDA graphs under compile, and ``torch.library.opcheck``.

Design (docs/torch-compile.md has the engine's view, docs/adding-an-op.md the op author's):

* **Derived, not hand-written.** Each op's schema comes from its reference's signature and type
  hints (``spec_hal/<family>.py``); the op's ``fake`` (declared beside its ``register_op``) gives
  the output shapes and dtypes. ``Tensor`` is ``Tensor``, ``Optional[Tensor]`` ``Tensor?``,
  ``int`` ``SymInt``, ``float``/``str``/``bool`` themselves, ``Sequence[Tensor]`` ``Tensor[]``,
  ``Optional[torch.Generator]`` ``Generator?`` (eager only: dynamo cannot trace a generator), and
  a per-request parameter ``Union[float, Tensor]``/``Union[int, Tensor]`` (a number or a tensor)
  the pair ``Scalar? <name>_number, Tensor? <name>_tensor`` with exactly one set.
* **Structured values cross as tensors.** A result type (``DraftTree``, ``Verdict``,
  ``DraftSlots``, ``MambaCommit``, ``Expansion``...: a dataclass or NamedTuple of tensors,
  optional tensors, scalars and nested such types) is flattened to its fields: as an input, one
  schema argument per field (``tree_retrieve_index``, ``tree_num_steps``...); as a result, one
  returned tensor per tensor field (an absent optional tensor comes back empty), and its scalar
  fields and absent tensors come from the op's ``result_fields(values)``. ``Sequence[TreeRecord]``
  becomes one ``Tensor[]`` per field. The Python wrapper (:func:`call_custom_op`) flattens the
  arguments, calls the op and rebuilds the result, so ``spec_hal.<op>`` keeps its signature and
  result types inside a compiled region.
* **Mutation is declared.** ``out=`` becomes a second overload ``<op>.into`` whose out buffers are
  ``Tensor(x!)`` and which returns nothing; arguments in the op's ``mutates`` (``move_kv``'s
  caches, the mamba state pools) are ``Tensor(x!)``/``Tensor(x!)[]``. An op that mutates and is
  annotated to return a ``Tensor`` returns its (first) mutated argument, rebuilt by the wrapper.
  When ``out`` is one struct field of the result (a Verdict inside a SampledVerdict), ``.into``
  writes that field's buffers and returns the result's other tensors (the fresh logprobs).
* **Per device type.** The ``CPU`` and ``CUDA`` (HIP tensors are ``CUDA`` to torch) kernels both
  call :func:`spec_hal.ops.bound_for_device`: the op's check and the provider of the backend that
  ``spec_hal.<op>`` would use for that device. So on CPU tensors the dispatcher runs the
  reference, unless ``SPEC_HAL_BACKEND=triton-interpret`` selected the interpreter (which also
  runs on CPU tensors: the environment choice is honoured inside compiled graphs too); on GPU
  tensors it runs the GPU backend's kernels. ``get_backend(name).<op>`` is an explicit, eager
  call to one backend and does not go through the dispatcher.
* **Outputs are fresh and contiguous.** A provider may return a view of an input (a ``.to`` that
  is a no-op); custom ops must not alias their inputs, so such outputs are copied.

The eager public path (``spec_hal.<op>``) does not go through ``torch.ops``: the dispatcher
costs microseconds per call that the host-overhead goal cannot spare
(``spec_hal/bench/host_overhead.py`` measures both). Under ``torch.compile`` the public functions
route here (``torch.compiler.is_compiling()``), so the traced graph holds the custom ops.

Registration is lazy (``import spec_hal`` defines nothing): :func:`register` runs on the first
compiled call or explicitly (``spec_hal.register_torch_ops()``).
"""
from __future__ import annotations

import collections.abc
import dataclasses
import threading
import typing
from typing import Any, Callable, Optional, Sequence, Union

import torch

from .device_buffers import separate_parts
from .registry import OpSpec, all_ops

LIBRARY = "spec_hal"
DISPATCH_KEYS = ("CPU", "CUDA")
OUT_OVERLOAD = "into"

_SCALARS = {int: "SymInt", float: "float", str: "str", bool: "bool"}


def _strip_optional(hint) -> tuple[Any, bool]:
    if typing.get_origin(hint) is Union:
        members = [m for m in typing.get_args(hint) if m is not type(None)]
        if len(members) == 1 and len(typing.get_args(hint)) == 2:
            return members[0], True
    return hint, False


def _is_number_or_tensor(hint) -> bool:
    """``Union[float, Tensor]`` / ``Union[int, Tensor]``: a per-request parameter given as one
    number or a tensor (spec_hal/sampling.py); two schema arguments, ``Scalar?`` and ``Tensor?``."""
    members = typing.get_args(hint) if typing.get_origin(hint) is Union else ()
    return torch.Tensor in members and all(m in (int, float, torch.Tensor) for m in members)


def _is_struct(hint) -> bool:
    return isinstance(hint, type) and (dataclasses.is_dataclass(hint) or (issubclass(hint, tuple) and hasattr(hint, "_fields")))


# ---------------------------------------------------------------------------------------------
# structured values (dataclasses and NamedTuples of tensors and scalars)


@dataclasses.dataclass
class Leaf:
    path: str  # "mask", "record.scores"
    kind: str  # "tensor", "opt_tensor" or a scalar schema type ("SymInt", "str", ...)
    optional: bool = False  # scalar that may be None (schema "SymInt?")


class StructCodec:
    """Flattens one structured type to its leaves and rebuilds it."""

    def __init__(self, cls):
        self.cls = cls
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(cls._fields)
        self.fields: list[tuple[str, Any]] = []
        for name in names:
            hint, optional = _strip_optional(hints[name])
            if hint is torch.Tensor:
                self.fields.append((name, "opt_tensor" if optional else "tensor"))
            elif _is_struct(hint) and not optional:
                self.fields.append((name, codec_for(hint)))
            elif hint in _SCALARS:
                self.fields.append((name, (_SCALARS[hint], optional)))
            else:
                raise TypeError(f"{cls.__name__}.{name}: a {hint!r} field cannot cross a custom-op boundary")

    def leaves(self, prefix: str = "") -> list[Leaf]:
        out = []
        for name, kind in self.fields:
            if isinstance(kind, StructCodec):
                out.extend(kind.leaves(f"{prefix}{name}."))
            elif isinstance(kind, tuple):
                out.append(Leaf(prefix + name, kind[0], kind[1]))
            else:
                out.append(Leaf(prefix + name, kind))
        return out

    def tensor_leaves(self) -> list[Leaf]:
        return [leaf for leaf in self.leaves() if leaf.kind in ("tensor", "opt_tensor")]

    def flatten(self, value, *, tensors_only: bool = False, like: Optional[torch.Tensor] = None) -> list:
        """Leaf values in order; with ``tensors_only`` an absent optional tensor is an empty one."""
        out = []
        for name, kind in self.fields:
            item = getattr(value, name)
            if isinstance(kind, StructCodec):
                out.extend(kind.flatten(item, tensors_only=tensors_only, like=like))
            elif isinstance(kind, tuple):
                if not tensors_only:
                    out.append(item)
            elif item is None and tensors_only:
                out.append(like.new_empty((0,)))
            else:
                out.append(item)
        return out

    def rebuild(self, flat: Sequence, start: int, *, statics: Optional[dict] = None, prefix: str = ""):
        """(value, next index) from ``flat``; with ``statics`` the scalar fields (and optional
        tensors to drop, given as None) come from it and ``flat`` holds tensors only."""
        values = []
        for name, kind in self.fields:
            path = prefix + name
            if isinstance(kind, StructCodec):
                value, start = kind.rebuild(flat, start, statics=statics, prefix=path + ".")
            elif isinstance(kind, tuple) and statics is not None:
                value = statics[path]
            else:
                value = flat[start]
                start += 1
                if statics is not None and path in statics and statics[path] is None:
                    value = None
            values.append(value)
        return self.cls(*values), start


_CODECS: dict = {}


def codec_for(cls) -> StructCodec:
    codec = _CODECS.get(cls)
    if codec is None:
        codec = _CODECS[cls] = StructCodec(cls)
    return codec


# ---------------------------------------------------------------------------------------------
# arguments


@dataclasses.dataclass
class Param:
    """One argument of the public op and the schema arguments it becomes."""

    name: str
    kind: str  # "tensor", "opt_tensor", "tensor_list", "scalar", "number_or_tensor", "generator", "struct", "struct_list"
    schema_type: str = ""  # for "scalar"
    codec: Optional[StructCodec] = None
    mutable: bool = False
    keyword_only: bool = False
    default: Any = None  # dataclasses.MISSING when required

    def schema_args(self, alias: Callable[[], str]) -> list[str]:
        if self.kind in ("tensor", "opt_tensor", "tensor_list"):
            mark = f"({alias()}!)" if self.mutable else ""
            base = {"tensor": f"Tensor{mark}", "opt_tensor": f"Tensor{mark}?", "tensor_list": f"Tensor{mark}[]"}[self.kind]
            return [f"{base} {self.name}"]
        if self.kind == "scalar":
            return [f"{self.schema_type} {self.name}"]
        if self.kind == "number_or_tensor":
            return [f"Scalar? {self.name}_number", f"Tensor? {self.name}_tensor"]
        if self.kind == "generator":
            return [f"Generator? {self.name}"]
        if self.kind == "struct_list":
            return [f"Tensor[] {self.name}_{leaf.path.replace('.', '_')}" for leaf in self.codec.leaves()]
        args = []
        for leaf in self.codec.leaves():
            kind = {"tensor": "Tensor", "opt_tensor": "Tensor?"}.get(leaf.kind, leaf.kind + ("?" if leaf.optional else ""))
            args.append(f"{kind} {self.name}_{leaf.path.replace('.', '_')}")
        return args

    def flatten(self, value) -> list:
        if self.kind == "struct":
            return self.codec.flatten(value)
        if self.kind == "struct_list":
            rows = [self.codec.flatten(item) for item in value]
            return [[row[i] for row in rows] for i in range(len(self.codec.leaves()))]
        if self.kind == "tensor_list":
            return [list(value)]
        if self.kind == "number_or_tensor":
            return [None, value] if isinstance(value, torch.Tensor) else [value, None]
        return [value]

    def rebuild(self, flat: Sequence, start: int):
        if self.kind == "struct":
            return self.codec.rebuild(flat, start)
        if self.kind == "struct_list":
            count = len(self.codec.leaves())
            columns = flat[start:start + count]
            items = [self.codec.rebuild(row, 0)[0] for row in zip(*columns)]
            return items, start + count
        if self.kind == "number_or_tensor":
            number, tensor = flat[start:start + 2]
            return (number if tensor is None else tensor), start + 2
        return flat[start], start + 1


def _param(name: str, hint, parameter, mutable: bool) -> Param:
    hint, optional = _strip_optional(hint)
    keyword_only = parameter.kind == parameter.KEYWORD_ONLY
    default = parameter.default if parameter.default is not parameter.empty else dataclasses.MISSING
    common = dict(mutable=mutable, keyword_only=keyword_only, default=default)
    if hint is torch.Tensor:
        return Param(name, "opt_tensor" if optional else "tensor", **common)
    if hint in _SCALARS:
        return Param(name, "scalar", _SCALARS[hint] + ("?" if optional else ""), **common)
    if _is_number_or_tensor(hint) and not optional:
        return Param(name, "number_or_tensor", **common)
    if hint is torch.Generator and optional:
        return Param(name, "generator", **common)
    if _is_struct(hint) and not optional:
        return Param(name, "struct", codec=codec_for(hint), **common)
    if typing.get_origin(hint) in (list, tuple, collections.abc.Sequence):
        item = next((a for a in typing.get_args(hint) if a is not Ellipsis), None)
        if item is torch.Tensor and not optional:
            return Param(name, "tensor_list", **common)
        if _is_struct(item) and not optional:
            return Param(name, "struct_list", codec=codec_for(item), **common)
    raise TypeError(f"argument {name!r} of type {hint!r} cannot cross a custom-op boundary")


# ---------------------------------------------------------------------------------------------
# results


@dataclasses.dataclass
class Result:
    kind: str  # "none", "tensor", "tuple", "struct", "mutated"
    count: int = 0
    codec: Optional[StructCodec] = None
    mutated: str = ""

    def schema(self) -> str:
        if self.kind in ("none", "mutated"):
            return "()"
        if self.kind == "tensor":
            return "Tensor"
        return "(" + ", ".join(["Tensor"] * self.count) + ")"

    def to_tensors(self, value, like: torch.Tensor) -> list:
        if self.kind == "tensor":
            return [value]
        if self.kind == "tuple":
            return list(value)
        return self.codec.flatten(value, tensors_only=True, like=like)

    def from_tensors(self, flat, statics: dict):
        if self.kind == "tensor":
            return flat
        if self.kind == "tuple":
            return tuple(flat)
        return self.codec.rebuild(flat, 0, statics=statics)[0]

    def out_tensors(self, out) -> list:
        if self.kind == "tensor":
            return [out]
        if self.kind == "struct" and not isinstance(out, tuple):
            return self.codec.flatten(out, tensors_only=True)
        return list(out)

    def from_out(self, out):
        if self.kind == "tensor":
            return out
        if self.kind == "tuple":
            return (*out,)
        return out if isinstance(out, self.codec.cls) else self.codec.cls(*out)


def _result(hint, spec: OpSpec, params: list[Param]) -> Result:
    if hint is None or hint is type(None):
        return Result("none")
    mutated = [p.name for p in params if p.mutable]
    if hint is torch.Tensor and mutated:
        return Result("mutated", mutated=mutated[0])
    if hint is torch.Tensor:
        return Result("tensor", 1)
    if _is_struct(hint):
        codec = codec_for(hint)
        return Result("struct", len(codec.tensor_leaves()), codec)
    if typing.get_origin(hint) is tuple and all(a is torch.Tensor for a in typing.get_args(hint)):
        return Result("tuple", len(typing.get_args(hint)))
    raise TypeError(f"op {spec.name!r}: result type {hint!r} cannot cross a custom-op boundary")


# ---------------------------------------------------------------------------------------------
# one custom op


class CustomOp:
    """The schema, the flattening and the registrations of one op."""

    def __init__(self, spec: OpSpec):
        import inspect

        self.spec = spec
        self.name = spec.name
        hints = typing.get_type_hints(spec.reference)
        signature = inspect.signature(spec.reference)
        unknown = set(spec.mutates) - set(signature.parameters)
        if unknown:
            raise TypeError(f"op {spec.name!r}: mutates names no argument: {sorted(unknown)}")
        self.params: list[Param] = []
        self.has_out = False
        for name, parameter in signature.parameters.items():
            if name == "out":
                self.has_out = True
                continue
            if name not in hints:
                raise TypeError(f"op {spec.name!r}: argument {name!r} has no type hint (the schema is derived from them)")
            self.params.append(_param(name, hints[name], parameter, name in spec.mutates))
        self.result = _result(hints.get("return"), spec, self.params)
        self.out_field, self.out_slots, self.rest_slots = _partial_out(self.result, hints.get("out")) if self.has_out else (None, [], [])
        self.positional = [p.name for p in self.params if not p.keyword_only]
        self.names = [p.name for p in self.params] + (["out"] if self.has_out else [])
        self.defaults = {p.name: p.default for p in self.params if p.default is not dataclasses.MISSING}
        if self.has_out:
            self.defaults["out"] = None
        if self.result.kind in ("tensor", "tuple", "struct") and spec.fake is None:
            raise TypeError(f"op {spec.name!r} returns tensors but declares no fake= beside its register_op")

    # schema --------------------------------------------------------------------------------

    def _alias_letters(self):
        letters = iter("abcdefghijklmnopqrstuvwxyz")
        return lambda: next(letters)

    def schema(self) -> str:
        alias = self._alias_letters()
        args = [arg for p in self.params for arg in p.schema_args(alias)]
        return f"{self.name}({', '.join(args)}) -> {self.result.schema()}"

    def out_schema(self) -> str:
        alias = self._alias_letters()
        args = [arg for p in self.params for arg in p.schema_args(alias)]
        count = self.result.count if self.result.kind != "struct" else len(self.result.codec.tensor_leaves())
        if self.out_field is not None:
            count = len(self.out_slots)
        args += [f"Tensor({alias()}!) out{i}" for i in range(count)]
        returns = "(" + ", ".join(["Tensor"] * len(self.rest_slots)) + ")"
        return f"{self.name}.{OUT_OVERLOAD}({', '.join(args)}) -> {returns}"

    def out_buffers(self, out) -> list:
        """The ``.into`` overload's out tensors of an ``out=`` value."""
        if self.out_field is not None:
            return self.out_codec.flatten(out, tensors_only=True)
        return self.result.out_tensors(out)

    @property
    def out_codec(self) -> StructCodec:
        return dict(self.result.codec.fields)[self.out_field]

    # the Python side (traced by dynamo under torch.compile) --------------------------------

    def bind(self, args: tuple, kwargs: dict) -> dict:
        """Argument values by name, like ``inspect.Signature.bind`` but traceable by dynamo."""
        if len(args) > len(self.positional):
            raise TypeError(f"spec_hal.{self.name}() takes {len(self.positional)} positional arguments but {len(args)} were given")
        values = dict(self.defaults)
        for name, value in zip(self.positional, args):
            values[name] = value
        for name, value in kwargs.items():
            if name not in self.names or name in self.positional[:len(args)]:
                raise TypeError(f"spec_hal.{self.name}() got an unexpected or repeated argument {name!r}")
            values[name] = value
        for name in self.names:
            if name not in values:
                raise TypeError(f"spec_hal.{self.name}() missing a required argument: {name!r}")
        return values

    def flat_inputs(self, values: dict) -> list:
        flat = []
        for param in self.params:
            flat.extend(param.flatten(values[param.name]))
        return flat

    def call(self, args: tuple, kwargs: dict):
        """``spec_hal.<op>(*args, **kwargs)`` through ``torch.ops.spec_hal.<op>``."""
        values = self.bind(args, kwargs)
        flat = self.flat_inputs(values)
        namespace = getattr(torch.ops, LIBRARY)
        packet = getattr(namespace, self.name)
        out = values.get("out")
        if out is not None:
            buffers = self.out_buffers(out)
            returned = getattr(packet, OUT_OVERLOAD)(*flat, *buffers)
            if self.out_field is None:
                return self.result.from_out(out)
            result = [None] * (len(self.out_slots) + len(self.rest_slots))
            for slot, tensor in zip(self.out_slots, buffers):
                result[slot] = tensor
            for slot, tensor in zip(self.rest_slots, returned):
                result[slot] = tensor
        else:
            result = packet.default(*flat)
        if self.result.kind == "none":
            return None
        if self.result.kind == "mutated":
            return values[self.result.mutated]
        statics = self.spec.result_fields(values) if self.spec.result_fields is not None else {}
        return self.result.from_tensors(result, statics)

    # the kernel side (called by torch's dispatcher) ----------------------------------------

    def unflatten(self, flat: Sequence) -> tuple[list, dict]:
        args, kwargs, index = [], {}, 0
        for param in self.params:
            value, index = param.rebuild(flat, index)
            if param.keyword_only:
                kwargs[param.name] = value
            else:
                args.append(value)
        return args, kwargs, index

    def kernel(self, *flat):
        from .ops import _first_tensor_device, bound_for_device

        args, kwargs, _ = self.unflatten(flat)
        with separate_parts():  # outputs of their own: no copies in _fresh_outputs
            result = bound_for_device(self.name, _first_tensor_device(args, kwargs))(*args, **kwargs)
        if self.result.kind in ("none", "mutated"):
            return None
        return _fresh_outputs(self.result.to_tensors(result, _first_tensor(flat)), flat, self.result.kind == "tensor")

    def out_kernel(self, *flat):
        from .ops import _first_tensor_device, bound_for_device

        args, kwargs, index = self.unflatten(flat)
        buffers = list(flat[index:])
        if self.out_field is not None:
            with separate_parts():
                result = bound_for_device(self.name, _first_tensor_device(args, kwargs))(*args, out=self.out_codec.cls(*buffers), **kwargs)
            tensors = self.result.to_tensors(result, _first_tensor(flat))
            return _fresh_outputs([tensors[slot] for slot in self.rest_slots], flat, False)
        if self.result.kind == "tensor":
            out = buffers[0]
        elif self.result.kind == "struct":
            out = self.result.codec.cls(*buffers)
        else:
            out = tuple(buffers)
        bound_for_device(self.name, _first_tensor_device(args, kwargs))(*args, out=out, **kwargs)

    def fake(self, *flat):
        args, kwargs, _ = self.unflatten(flat)
        result = self.spec.fake(*args, **kwargs)
        tensors = self.result.to_tensors(result, _first_tensor(flat))
        return tensors[0] if self.result.kind == "tensor" else tuple(tensors)

    def out_fake(self, *flat):
        """Fake of the ``.into`` overload: the result's tensors that ``out=`` does not hold."""
        args, kwargs, _ = self.unflatten(flat)
        tensors = self.result.to_tensors(self.spec.fake(*args, **kwargs), _first_tensor(flat))
        return tuple(tensors[slot] for slot in self.rest_slots)


def _partial_out(result: Result, out_hint) -> tuple[Optional[str], list[int], list[int]]:
    """(field, out slots, other slots) when ``out=`` holds one struct field of the result (the
    from-logits verify ops: ``out`` is a Verdict, the result a SampledVerdict whose logprobs are
    fresh): the ``.into`` overload writes that field's tensors and returns the others. (None, [],
    []) when ``out`` holds the whole result."""
    out_cls, _ = _strip_optional(out_hint)
    if result.kind != "struct" or not _is_struct(out_cls) or out_cls is result.codec.cls:
        return None, [], []
    field = next((name for name, kind in result.codec.fields if isinstance(kind, StructCodec) and kind.cls is out_cls), None)
    if field is None:
        raise TypeError(f"out= of type {out_cls.__name__} is neither the result type nor one of its fields")
    paths = [leaf.path for leaf in result.codec.tensor_leaves()]
    inside = [index for index, path in enumerate(paths) if path.startswith(field + ".")]
    return field, inside, [index for index in range(len(paths)) if index not in inside]


def _first_tensor(flat: Sequence) -> torch.Tensor:
    for value in flat:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return value[0]
    raise TypeError("a spec_hal op without tensor arguments")


def _fresh_outputs(tensors: list, inputs: Sequence, single: bool):
    """Contiguous outputs that share memory with no input and no other output.

    A provider's output can share memory with an input by being that input (a no-op ``.to``), a
    view of it (a reshape), or a tensor built on the same storage some other way; the schema
    promises fresh outputs, so each is copied. Compared by storage pointer: identity and
    ``_is_view`` missed an alias that opcheck found on CUDA (expand_tree's tokens)."""
    taken = set()
    for value in inputs:
        for item in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(item, torch.Tensor) and item.numel():
                taken.add(item.untyped_storage().data_ptr())
    fresh = []
    for tensor in tensors:
        storage = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        if storage in taken:
            tensor = tensor.clone(memory_format=torch.contiguous_format)
            storage = tensor.untyped_storage().data_ptr()
        else:
            tensor = tensor.contiguous()
        if storage is not None:
            taken.add(storage)
        fresh.append(tensor)
    return fresh[0] if single else tuple(fresh)


# ---------------------------------------------------------------------------------------------
# registration


_lock = threading.Lock()
_library: Optional[torch.library.Library] = None
_CUSTOM_OPS: dict[str, CustomOp] = {}
_UNREGISTERED: dict[str, str] = {}


def register() -> dict[str, CustomOp]:
    """Define ``torch.ops.spec_hal.<op>`` for every registered op (once per process; ops
    registered later are added on the next call). Returns the custom ops by op name."""
    global _library
    with _lock:
        ops = all_ops()
        if _library is None:
            _library = torch.library.Library(LIBRARY, "DEF")
        for name, spec in sorted(ops.items()):
            if name in _CUSTOM_OPS or name in _UNREGISTERED:
                continue
            try:
                op = CustomOp(spec)
                _define(op)
            except Exception as exc:  # reported by custom_op(name); the eager op must keep working
                _UNREGISTERED[name] = f"{type(exc).__name__}: {exc}"
                continue
            _CUSTOM_OPS[name] = op
        return dict(_CUSTOM_OPS)


def _define(op: CustomOp) -> None:
    _library.define(op.schema())
    for key in DISPATCH_KEYS:
        _library.impl(op.name, op.kernel, key)
    if op.result.kind in ("none", "mutated"):
        torch.library.register_fake(f"{LIBRARY}::{op.name}", _no_result, lib=_library)
    else:
        torch.library.register_fake(f"{LIBRARY}::{op.name}", op.fake, lib=_library)
    if op.has_out:
        _library.define(op.out_schema())
        for key in DISPATCH_KEYS:
            _library.impl(f"{op.name}.{OUT_OVERLOAD}", op.out_kernel, key)
        out_fake = op.out_fake if op.out_field is not None else _no_result
        torch.library.register_fake(f"{LIBRARY}::{op.name}.{OUT_OVERLOAD}", out_fake, lib=_library)


def _no_result(*args, **kwargs) -> None:
    return None


def custom_op(name: str) -> CustomOp:
    """The registered custom op of ``name`` (registers every op on first use)."""
    op = _CUSTOM_OPS.get(name)
    if op is None:
        register()
        op = _CUSTOM_OPS.get(name)
        if op is None:
            reason = _UNREGISTERED.get(name, "no such op")
            raise RuntimeError(f"spec_hal.{name} has no torch custom op, so it cannot run under torch.compile: {reason}")
    return op


def call_custom_op(name: str, args: tuple, kwargs: dict):
    """``spec_hal.<name>(*args, **kwargs)`` through ``torch.ops.spec_hal.<name>``: what the public
    functions do under ``torch.compile``, and callable eagerly too (same results)."""
    return custom_op(name).call(args, kwargs)


def flat_call(name: str, *args, **kwargs) -> tuple:
    """(overload, flat arguments) of ``spec_hal.<name>(*args, **kwargs)`` as a torch op call: for
    ``torch.library.opcheck`` and for engines that call ``torch.ops.spec_hal`` directly."""
    op = custom_op(name)
    values = op.bind(args, kwargs)
    flat = op.flat_inputs(values)
    packet = getattr(getattr(torch.ops, LIBRARY), name)
    if values.get("out") is not None:
        return getattr(packet, OUT_OVERLOAD), (*flat, *op.out_buffers(values["out"]))
    return packet.default, tuple(flat)
