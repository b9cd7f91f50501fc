"""The bad-input sweep: every argument of every op, in turn, gets a hostile value.

A *baseline* is a small valid call of an op (``BASELINES``); a *mutation* replaces one argument
(or one field of a Verdict/DraftTree argument, named ``verdict.accept_index``) with a wrong dtype,
rank, shape, strides (same values), device (meta), NaN/Inf, -1, negative, out-of-range or huge
indices, an empty tensor, a Python scalar or None (``mutations``). :func:`outcome` runs the
mutated call on a backend and on the reference (cpu clones) and classifies it. Allowed:

* ``InvalidInput(<argument>)``: both raise InvalidInput naming the same argument;
* ``reference answer``: both return, with identical integers (floats within 1e-5, NaN equal),
  identical in-place effects and identical error-flag records; outputs written through ``out=``
  into canary buffers keep their canaries; the inputs equal their clones afterwards.

Anything else raises :class:`SweepFailure` with its category (``CATEGORIES``: crash, out-of-range
access, silent cross-request write, backend disagreement); the conformance case fails, and the
sweep script ``scripts/reliability_sweep.py`` counts it per category. A crash of the process is a
failure by itself (the script runs the cases in a worker process and counts a death as a crash).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from spec_hal import error_flag, mamba
from spec_hal.conformance.guards import guarded_output
from spec_hal.conformance.tree_inputs import random_draft_tree
from spec_hal.conformance.trees import random_tree
from spec_hal.conformance.verdicts import random_round
from spec_hal.errors import InvalidInput
from spec_hal.registry import op_spec
from spec_hal.types import DraftTree, TreeRecord, Verdict


# What a failure is, in the categories of issue #21's sweep (scripts/reliability_sweep.py counts
# them; a process that dies is a crash too, counted by the script that ran it).
CRASH = "crash"  # an exception other than InvalidInput, on the reference or the backend
OUT_OF_RANGE = "out-of-range access"  # an out= canary overwritten
CROSS_REQUEST_WRITE = "silent cross-request write"  # in-place state or an input differs from the reference's
DISAGREEMENT = "backend disagreement"  # another outcome, answer, InvalidInput argument or error-flag record
CATEGORIES = (CRASH, OUT_OF_RANGE, CROSS_REQUEST_WRITE, DISAGREEMENT)


class SweepFailure(AssertionError):
    """A forbidden outcome: crash of the op, wrong answer, mutated input, broken canary;
    ``category`` is one of :data:`CATEGORIES`."""

    def __init__(self, message: str, category: str = DISAGREEMENT):
        super().__init__(message)
        self.category = category


@dataclass
class Call:
    """One op call: ``positional`` names go first, in order; the rest are keywords."""

    op: str
    args: dict
    positional: tuple = ()
    in_place: tuple = ()  # arguments the op writes (compared with the reference's, not with clones)
    has_out: bool = False


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _verdict(bs: int = 3, steps: int = 3, nodes: int = 5, seed: int = 1, dtype=torch.int64) -> Verdict:
    return random_round(bs, num_steps=steps, num_nodes=nodes, generator=_generator(seed), index_dtype=dtype).verdict


def _draft_topk() -> Call:
    logits = torch.randn(3, 40, generator=_generator(2))
    return Call("draft_topk", {"logits": logits, "k": 4, "token_map": torch.arange(40) * 3}, ("logits", "k"), has_out=True)


def _verify_greedy() -> Call:
    tree, candidates = random_tree(2, 6, 3, seed=3, vocab=50)
    target = torch.randint(0, 50, (12,), generator=_generator(3))
    return Call("verify_greedy", {"tree": tree, "candidates": candidates, "target_predict": target},
                ("tree", "candidates", "target_predict"), has_out=True)


def _verify_sampling() -> Call:
    tree, candidates = random_tree(2, 6, 3, seed=4, vocab=20)
    generator = _generator(4)
    probs = torch.softmax(torch.randn(2, 6, 20, generator=generator), dim=-1)
    return Call("verify_sampling", {"tree": tree, "candidates": candidates, "target_probs": probs,
                                    "coins": torch.rand(2, 6, generator=generator), "final_coins": torch.rand(2, generator=generator)},
                ("tree", "candidates", "target_probs", "coins", "final_coins"), has_out=True)


def _verify_chain() -> Call:
    generator = _generator(5)
    target = torch.randint(0, 4, (10,), generator=generator)
    candidates = torch.cat([torch.zeros(2, 1, dtype=torch.int64), target.view(2, 5)[:, :4]], dim=1)
    candidates[1, 3] = 9
    return Call("verify_chain", {"candidates": candidates, "target_predict": target}, ("candidates", "target_predict"), has_out=True)


def _verify_chain_sampling() -> Call:
    generator = _generator(6)
    return Call("verify_chain_sampling", {
        "draft_ids": torch.randint(0, 20, (2, 3), generator=generator),
        "draft_probs": torch.softmax(torch.randn(2, 3, 20, generator=generator), dim=-1),
        "target_probs": torch.softmax(torch.randn(2, 4, 20, generator=generator), dim=-1),
        "coins": torch.rand(2, 3, generator=generator), "final_coins": torch.rand(2, generator=generator)},
        ("draft_ids", "draft_probs", "target_probs", "coins", "final_coins"), has_out=True)


def _bonus_tokens() -> Call:
    return Call("bonus_tokens", {"verdict": _verdict(seed=7)}, ("verdict",), has_out=True)


def _compact_accepted() -> Call:
    return Call("compact_accepted", {"x": torch.randn(15, 4, generator=_generator(8)), "verdict": _verdict(seed=8)},
                ("x", "verdict"), has_out=True)


def _accepted_kv_moves() -> Call:
    slots = (torch.randperm(60, generator=_generator(9))[:15] + 5).view(3, 5)
    return Call("accepted_kv_moves", {"verdict": _verdict(seed=9), "slots": slots}, ("verdict", "slots"), has_out=True)


def _move_kv() -> Call:
    generator = _generator(10)
    caches = [torch.randn(40, 4, generator=generator), torch.randn(40, 2, 3, generator=generator).to(torch.bfloat16)]
    return Call("move_kv", {"caches": caches, "src": torch.tensor([3, 7, -1, 12, 30, 1]),
                            "dst": torch.tensor([4, 8, 9, -1, 31, 2])}, ("caches", "src", "dst"), in_place=("caches",))


def _assign_draft_slots() -> Call:
    table = (torch.arange(4 * 64, dtype=torch.int32).view(4, 64) * 7 + 1)
    return Call("assign_draft_slots", {"req_to_token": table, "req_pool_indices": torch.tensor([2, 0, 3]),
                                       "seq_lens": torch.tensor([5, 17, 0]), "num_steps": 3, "topk": 2, "page_size": 4},
                ("req_to_token",), has_out=True)


def _build_tree() -> Call:
    inputs = random_draft_tree(2, topk=2, num_steps=3, num_draft_tokens=6, seed=11)
    return Call("build_tree", {"roots": inputs.roots, "parents": inputs.parents, "selected": inputs.selected,
                               "draft_tokens": inputs.draft_tokens, "seq_lens": inputs.seq_lens, "topk": inputs.topk,
                               "mask_mode": "full", "seq_lens_sum": int(inputs.seq_lens.sum())},
                ("roots", "parents", "selected", "draft_tokens", "seq_lens"))


def _expand_tree() -> Call:
    generator = _generator(12)
    return Call("expand_tree", {"step": 1, "scores": torch.rand(2, 3, generator=generator),
                                "probs": torch.rand(6, 3, generator=generator), "ids": torch.randint(0, 99, (6, 3), generator=generator)},
                ("step", "scores", "probs", "ids"))


def _mamba_commit_steps() -> Call:
    return Call("mamba_commit_steps", {"verdict": _verdict(seed=13), "seq_lens": torch.tensor([3, 14, 7]), "track_interval": 4},
                ("verdict", "seq_lens"))


def _scatter_mamba_state() -> Call:
    generator = _generator(14)
    return Call("scatter_mamba_state", {"dst": torch.randn(2, 5, 3, generator=generator), "src": torch.randn(2, 3, 4, 3, generator=generator),
                                        "dst_slots": torch.tensor([1, -1, 4]), "src_steps": torch.tensor([0, 2, 3])},
                in_place=("dst",))


def _commit_mamba_state() -> Call:
    generator = _generator(15)
    return Call("commit_mamba_state", {
        "verdict": _verdict(seed=15), "seq_lens": torch.tensor([3, 14, 7]), "slots": torch.tensor([1, 4, 0]),
        "ssm_state": torch.randn(2, 6, 3, generator=generator), "ssm_intermediate": torch.randn(2, 3, 5, 3, generator=generator),
        "conv_state": torch.randn(1, 6, 2, generator=generator), "conv_intermediate": torch.randn(1, 3, 5, 2, generator=generator),
        "track_slots": torch.tensor([2, -1, 5]), "track_interval": 4}, in_place=("ssm_state", "conv_state"))


def _apply_token_bitmask_() -> Call:
    generator = _generator(16)
    bits = torch.randint(-2**31, 2**31, (2, 2), generator=generator, dtype=torch.int64).to(torch.int32)
    return Call("apply_token_bitmask_", {"logits": torch.randn(3, 40, generator=generator), "token_bitmask": bits,
                                         "bitmask_index": torch.tensor([1, -1, 0])}, ("logits", "token_bitmask"), in_place=("logits",))


def _ragged_drafts(generator: torch.Generator, vocab: int) -> dict:
    """Counts [2, 0, 3] (T = 5 drafts, T + bs = 8 target rows), max_drafts 3."""
    return {"draft_tokens": torch.randint(0, vocab, (5,), generator=generator), "num_draft_tokens": torch.tensor([2, 0, 3])}


def _verify_chain_ragged() -> Call:
    generator = _generator(17)
    drafts = _ragged_drafts(generator, 4)
    target = torch.randint(0, 4, (8,), generator=generator)
    target[0] = drafts["draft_tokens"][0]  # request 0 accepts its first draft
    return Call("verify_chain_ragged", {**drafts, "target_predict": target, "max_drafts": 3},
                ("draft_tokens", "num_draft_tokens", "target_predict"), has_out=True)


def _verify_chain_sampling_ragged() -> Call:
    generator = _generator(18)
    return Call("verify_chain_sampling_ragged", {
        **_ragged_drafts(generator, 20), "draft_probs": torch.softmax(torch.randn(5, 20, generator=generator), dim=-1),
        "target_probs": torch.softmax(torch.randn(8, 20, generator=generator), dim=-1), "coins": torch.rand(5, generator=generator),
        "final_coins": torch.rand(3, generator=generator), "max_drafts": 3},
        ("draft_tokens", "num_draft_tokens", "draft_probs", "target_probs", "coins", "final_coins"), has_out=True)


def _organize_draft() -> Call:
    """Three steps of K = 2 (10 candidates), N = 6."""
    generator = _generator(19)
    widths = (2, 4, 4)
    parents = (torch.tensor([[-1, 0, 1]] * 2), torch.tensor([[0, 1], [1, 0]]), torch.tensor([[2, 4], [3, 5]]))
    records = [TreeRecord(torch.rand(2, width, generator=generator), torch.randint(0, 99, (2, width), generator=generator), parent)
               for width, parent in zip(widths, parents)]
    return Call("organize_draft", {"records": records, "num_draft_tokens": 6}, ("records", "num_draft_tokens"))


def _sampling_params() -> dict:
    """Per-request processing parameters of 3 requests: sampled with every filter, greedy, sampled
    with other values (a kernel that reads a strided or expanded parameter as contiguous gives
    the last request another request's or the buffer's value)."""
    return {"temperature": torch.tensor([0.7, 0.0, 1.3]), "top_k": torch.tensor([5, 0, 3]), "top_p": torch.tensor([0.9, 1.0, 0.6]),
            "min_p": torch.tensor([0.05, 0.0, 0.1])}


def _process_logits() -> Call:
    logits = torch.randn(3, 30, generator=_generator(20)) * 3
    return Call("process_logits", {"logits": logits, **_sampling_params()}, ("logits",), has_out=True)


def _verify_tree_sampling() -> Call:
    """A masked walk: each of the 12 target rows under bitmask row 0 or 1, or unconstrained (-1)."""
    tree, candidates = random_tree(2, 6, 3, seed=21, vocab=20)
    generator = _generator(21)
    bits = torch.randint(-2**31, 2**31, (2, 1), generator=generator, dtype=torch.int64).to(torch.int32)
    return Call("verify_tree_sampling", {
        "tree": tree, "candidates": candidates, "draft_probs": torch.softmax(torch.randn(2, 6, 20, generator=generator), dim=-1),
        "target_probs": torch.softmax(torch.randn(2, 6, 20, generator=generator), dim=-1), "coins": torch.rand(2, 6, generator=generator),
        "final_coins": torch.rand(2, generator=generator), "token_bitmask": bits,
        "bitmask_index": torch.tensor([1, 1, 0, -1, 1, 0, -1, -1, 1, 0, -1, 1])},
        ("tree", "candidates", "draft_probs", "target_probs", "coins", "final_coins"), has_out=True)


def _verify_sampling_from_logits() -> Call:
    tree, candidates = random_tree(3, 6, 3, seed=22, vocab=30)
    generator = _generator(22)
    return Call("verify_sampling_from_logits", {
        "tree": tree, "candidates": candidates, "target_logits": torch.randn(18, 30, generator=generator) * 3, **_sampling_params(),
        "seed": torch.tensor([11, -2**62, 5]), "offset": torch.tensor([0, 2**40, 7]), "logprobs": "processed", "top_logprobs": 2},
        ("tree", "candidates", "target_logits"))


def _verify_chain_sampling_from_logits() -> Call:
    generator = _generator(23)
    return Call("verify_chain_sampling_from_logits", {
        "draft_ids": torch.randint(0, 30, (3, 3), generator=generator),
        "draft_probs": torch.softmax(torch.randn(3, 3, 30, generator=generator), dim=-1),
        "target_logits": torch.randn(12, 30, generator=generator) * 3, **_sampling_params(),
        "coins": torch.rand(3, 3, generator=generator), "final_coins": torch.rand(3, generator=generator), "logprobs": "raw"},
        ("draft_ids", "draft_probs", "target_logits"))


BASELINES: dict[str, Callable[[], Call]] = {
    "draft_topk": _draft_topk, "verify_greedy": _verify_greedy, "verify_sampling": _verify_sampling,
    "verify_chain": _verify_chain, "verify_chain_sampling": _verify_chain_sampling, "bonus_tokens": _bonus_tokens,
    "compact_accepted": _compact_accepted, "accepted_kv_moves": _accepted_kv_moves, "move_kv": _move_kv,
    "assign_draft_slots": _assign_draft_slots, "build_tree": _build_tree, "expand_tree": _expand_tree,
    "mamba_commit_steps": _mamba_commit_steps, "scatter_mamba_state": _scatter_mamba_state,
    "commit_mamba_state": _commit_mamba_state, "apply_token_bitmask_": _apply_token_bitmask_,
    "verify_chain_ragged": _verify_chain_ragged, "verify_chain_sampling_ragged": _verify_chain_sampling_ragged,
    "organize_draft": _organize_draft, "process_logits": _process_logits, "verify_tree_sampling": _verify_tree_sampling,
    "verify_sampling_from_logits": _verify_sampling_from_logits, "verify_chain_sampling_from_logits": _verify_chain_sampling_from_logits,
}


# ---------------------------------------------------------------------------------------------
# mutations


def _strided(value: torch.Tensor) -> torch.Tensor:
    """The same values with every stride doubled in the last dimension (a sliced view)."""
    buffer = torch.zeros(*value.shape[:-1], value.shape[-1] * 2, dtype=value.dtype)
    buffer[..., ::2] = value
    return buffer[..., ::2]


def _transposed(value: torch.Tensor) -> torch.Tensor:
    """The same values in column-major order (2-D and up: last two dims swapped in memory)."""
    return value.transpose(-1, -2).contiguous().transpose(-1, -2)


def _set_first(value: torch.Tensor, number) -> torch.Tensor:
    changed = value.clone()
    if changed.numel():
        changed.view(-1)[0] = number
    return changed


def tensor_mutations(value: torch.Tensor) -> dict[str, Callable[[], object]]:
    """Name -> builder of each hostile variant of ``value``."""
    out = {
        "None": lambda: None,
        "python scalar": lambda: 3,
        "meta device": lambda: value.to("meta"),
        "rank + 1": lambda: value.unsqueeze(0),
        "shape - 1": lambda: value[..., :-1] if value.dim() and value.shape[-1] else value.unsqueeze(-1),
        "empty": lambda: value[:0] if value.dim() else value.reshape(1)[:0],
        "sliced": lambda: _strided(value) if value.dim() else value,
    }
    if value.dim() >= 2:
        out["transposed"] = lambda: _transposed(value)
    if value.dim() >= 1 and value.shape[0] >= 1:
        out["expanded"] = lambda: value[:1].expand(value.shape)
    if value.dtype.is_floating_point:
        out["dtype int64"] = lambda: value.to(torch.int64)
        out["NaN"] = lambda: _set_first(value, float("nan"))
        out["+Inf"] = lambda: _set_first(value, float("inf"))
        out["-Inf"] = lambda: _set_first(value, float("-inf"))
        out["negative"] = lambda: _set_first(value, -0.5)
    elif value.dtype != torch.bool:
        out["dtype float32"] = lambda: value.to(torch.float32)
        out["dtype int16"] = lambda: value.to(torch.int16)
        out["-1"] = lambda: _set_first(value, -1)
        out["-7"] = lambda: _set_first(value, -7)
        limit = torch.iinfo(value.dtype).max
        out["int32 max"] = lambda: _set_first(value, min(2**31 - 1, limit))
        if value.dtype == torch.int64:
            out["2^40"] = lambda: _set_first(value, 2**40)
            out["2^32 + 1"] = lambda: _set_first(value, 2**32 + 1)
        out["out of range (+numel)"] = lambda: _set_first(value, max(value.numel(), 64) + 1)
    return out


def scalar_mutations(value) -> dict[str, Callable[[], object]]:
    out = {"None": lambda: None, "-1": lambda: -1, "0": lambda: 0, "2^40": lambda: 2**40, "float": lambda: 2.5, "True": lambda: True,
           "tensor": lambda: torch.tensor(3)}
    if isinstance(value, float):
        out.update({"NaN": lambda: float("nan"), "2.0": lambda: 2.0})
    if isinstance(value, str):
        out = {"None": lambda: None, "unknown": lambda: "nonsense", "int": lambda: 1}
    return out


def _fields(value) -> list[str]:
    return [field.name for field in dataclasses.fields(value) if isinstance(getattr(value, field.name), torch.Tensor)]


def _is_record(value) -> bool:
    """A Verdict, DraftTree or TreeRecord: an argument whose tensor fields are mutated too."""
    return isinstance(value, (Verdict, DraftTree, TreeRecord))


def arguments(call: Call) -> list[str]:
    """Mutable argument names of a call: Verdict/DraftTree fields as ``name.field``, list items
    as ``name[i]`` and the fields of a TreeRecord item as ``name[i].field``."""
    names = []
    for name, value in call.args.items():
        names.append(name)
        if _is_record(value):
            names.extend(f"{name}.{field}" for field in _fields(value))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                names.append(f"{name}[{index}]")
                if _is_record(item):
                    names.extend(f"{name}[{index}].{field}" for field in _fields(item))
    return names


def _parse(argument: str) -> tuple[str, Optional[int], Optional[str]]:
    """``name``, ``name.field``, ``name[i]`` or ``name[i].field`` -> (name, i, field)."""
    path, _, field = argument.partition(".")
    name, _, index = path.partition("[")
    return name, int(index[:-1]) if index else None, field or None


def _get(call: Call, argument: str):
    name, index, field = _parse(argument)
    value = call.args[name] if index is None else call.args[name][index]
    return value if field is None else getattr(value, field)


def _replaced(args: dict, argument: str, new_value) -> dict:
    """A copy of a call's ``args`` with ``argument`` (any form of :func:`_parse`) replaced."""
    name, index, field = _parse(argument)
    args = dict(args)
    item = args[name] if index is None else args[name][index]
    item = new_value if field is None else dataclasses.replace(item, **{field: new_value})
    if index is None:
        args[name] = item
    else:
        args[name] = list(args[name])
        args[name][index] = item
    return args


def mutations(call: Call, argument: str) -> dict[str, Callable[[], object]]:
    value = _get(call, argument)
    if isinstance(value, torch.Tensor):
        return tensor_mutations(value)
    if _is_record(value):
        return {"None": lambda: None, "python scalar": lambda: 3}
    if isinstance(value, list):
        return {"None": lambda: None, "empty list": lambda: [], "tensor": lambda: value[0]}
    if value is None:
        return {"python scalar": lambda: 3}
    return scalar_mutations(value)


def mutated(call: Call, argument: str, mutation: str) -> Call:
    new_value = mutations(call, argument)[mutation]()
    return dataclasses.replace(call, args=_replaced(call.args, argument, new_value))


def matrix(ops: Optional[list[str]] = None) -> list[tuple[str, str, str]]:
    """Every (op, argument, mutation) of the sweep."""
    rows = []
    for op in ops or BASELINES:
        call = BASELINES[op]()
        for argument in arguments(call):
            rows.extend((op, argument, mutation) for mutation in mutations(call, argument))
    return rows


# ---------------------------------------------------------------------------------------------
# running a call


def _map(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):  # a call's arguments
        return {name: _map(item, fn) for name, item in value.items()}
    if isinstance(value, (Verdict, DraftTree)):
        return dataclasses.replace(value, **{f: fn(getattr(value, f)) for f in _fields(value)})
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map(item, fn) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map(item, fn) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _map(getattr(value, f.name), fn) for f in dataclasses.fields(value)})
    return value


def _to_exact(tensor: torch.Tensor, device) -> torch.Tensor:
    """``tensor`` on ``device`` with the same sizes, strides and storage offset.

    ``Tensor.to`` makes a non-dense view (sliced, expanded) contiguous when it changes device, so
    a GPU backend would have been handed a different layout than the reference (the cuda lane
    then accepted a sliced state that the reference rejects); the storage is moved instead."""
    device = torch.device(device)
    if tensor.device.type == "meta" or tensor.device == device:
        return tensor
    if tensor.is_contiguous():
        return tensor.to(device)
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
    moved = raw.to(device, copy=True).untyped_storage()
    return torch.empty(0, dtype=tensor.dtype, device=device).set_(moved, tensor.storage_offset(), tensor.size(), tensor.stride())


def _to(value, device):
    return _map(value, lambda t: _to_exact(t, device))


def _clone_exact(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides and storage offset (a sliced or expanded view stays
    one, so the reference and the backend see the same layout)."""
    if tensor.device.type == "meta":
        return tensor
    copy = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return copy.set_(tensor.untyped_storage().clone(), tensor.storage_offset(), tensor.size(), tensor.stride())


def _clone(value):
    return _map(value, _clone_exact)


def _invoke(fn, call: Call, args: dict, out=None):
    kwargs = {name: value for name, value in args.items() if name not in call.positional}
    if out is not None:
        kwargs["out"] = out
    return fn(*(args[name] for name in call.positional), **kwargs)


def _flatten(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (Verdict, DraftTree)):
        return [getattr(value, f) for f in _fields(value)] + ([value.num_steps] if isinstance(value, DraftTree) else [])
    if isinstance(value, (list, tuple)):
        return [item for entry in value for item in _flatten(entry)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [item for f in dataclasses.fields(value) for item in _flatten(getattr(value, f.name))]
    return [value]


def _same(a, b, *, meta_equal: bool = False) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if "meta" in (a.device.type, b.device.type):
            # No data to compare: a meta result is never an answer; an input field the op
            # ignored may stay on meta.
            return meta_equal and a.device == b.device and a.shape == b.shape
        a, b = a.cpu(), b.cpu()
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.is_floating_point:
            return torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6, equal_nan=True)
        return torch.equal(a, b)
    return a == b


def _results_equal(got, expected, *, meta_equal: bool = False) -> bool:
    got, expected = _flatten(got), _flatten(expected)
    return len(got) == len(expected) and all(_same(a, b, meta_equal=meta_equal) for a, b in zip(got, expected))


def _run(fn, call: Call, args: dict, device, out=None):
    """(kind, value, flag): kind "ok" with the result, "InvalidInput" with the argument, or
    "error" with the exception; flag: the error-flag record the call left on ``device``."""
    error_flag.pending_errors(device)
    try:
        result = _invoke(fn, call, args, out)
        kind, value = "ok", result
    except InvalidInput as exc:
        kind, value = "InvalidInput", exc.argument
    except Exception as exc:  # noqa: BLE001 - classified: any other exception is a failure
        kind, value = "error", exc
    return kind, value, error_flag.pending_errors(device)


def _reference(call: Call):
    spec = op_spec(call.op)

    def checked_reference(*args, **kwargs):
        spec.check(*args, **kwargs)
        return spec.reference(*args, **kwargs)

    return checked_reference


def _guarded_like(result):
    """Canary-guarded output buffers shaped like ``result`` (tensor, tuple or Verdict)."""
    if isinstance(result, torch.Tensor):
        guard = guarded_output(tuple(result.shape), result.dtype, result.device)
        return guard.tensor, [guard]
    if isinstance(result, Verdict):
        guards = [guarded_output(tuple(getattr(result, f).shape), getattr(result, f).dtype, result.device) for f in _fields(result)]
        return Verdict(*(g.tensor for g in guards)), guards
    if isinstance(result, tuple):
        guards = [guarded_output(tuple(t.shape), t.dtype, t.device) for t in result]
        return tuple(g.tensor for g in guards), guards
    return None, []


def outcome(backend, call: Call, label: str = "", observed: Optional[dict] = None) -> str:
    """Run ``call`` on ``backend`` and on the reference; return the allowed outcome's name or
    raise SweepFailure. ``observed``, when given, receives the backend's ``flag`` records and,
    when it returned, its ``result`` (contested slots removed) and in-place ``state``, so that
    two backends' runs can be compared with each other (scripts/reliability_sweep.py)."""
    device = backend.device
    reference_args = _clone(call.args)
    kind, value, ref_flag = _run(_reference(call), call, reference_args, torch.device("cpu"))
    if kind == "error":
        raise SweepFailure(f"{label}: the reference raised {type(value).__name__}: {value}", CRASH)
    backend_args = _to(call.args, device)
    originals = _clone(backend_args)
    got_kind, got, got_flag = _run(getattr(backend, call.op), call, backend_args, device)
    if got_kind == "error":
        raise SweepFailure(f"{label}: {backend.name} raised {type(got).__name__}: {got}", CRASH)
    if observed is not None:
        observed["flag"] = got_flag
    if kind != got_kind:
        raise SweepFailure(f"{label}: reference {kind} {value!r}, {backend.name} {got_kind} {got!r}")
    # A broken precondition: checked mode rejects it, and in the default mode which write wins
    # is unspecified (docs/reliability.md; a race on a GPU, the last request on the reference and
    # the interpreter), so the contested slots have no one answer; everything else has.
    contested = contested_slots(call.op, reference_args) if kind == "ok" else []
    if kind == "InvalidInput":
        if value != got:
            raise SweepFailure(f"{label}: InvalidInput names {got!r} on {backend.name}, {value!r} on the reference")
        return f"InvalidInput({value})"
    if contested and call.op == "scatter_mamba_state":  # it returns its (in-place) dst
        got_returned, expected_returned = (_without_slots(got, contested, SLOT_DIMENSION[call.op]),
                                           _without_slots(value, contested, SLOT_DIMENSION[call.op]))
    else:
        got_returned, expected_returned = got, value
    if observed is not None:
        observed["result"] = got_returned
        observed["state"] = [_without_slots(backend_args[name], contested, SLOT_DIMENSION[call.op]) if contested else backend_args[name]
                             for name in call.in_place]
    if not _results_equal(got_returned, expected_returned):
        raise SweepFailure(f"{label}: {backend.name} returned a different answer from the reference")
    for name in call.args:
        if name in call.in_place:
            got_state, expected_state = backend_args[name], reference_args[name]
            if contested:
                dim = SLOT_DIMENSION[call.op]
                got_state, expected_state = _without_slots(got_state, contested, dim), _without_slots(expected_state, contested, dim)
            if not _results_equal(got_state, expected_state):
                raise SweepFailure(f"{label}: in-place argument {name} differs from the reference's", CROSS_REQUEST_WRITE)
        elif not _results_equal(backend_args[name], originals[name], meta_equal=True):
            raise SweepFailure(f"{label}: {backend.name} modified its input {name}", CROSS_REQUEST_WRITE)
    if got_flag != ref_flag:
        raise SweepFailure(f"{label}: error flag {got_flag} on {backend.name}, {ref_flag} on the reference")
    if call.has_out:
        out, guards = _guarded_like(_to(value, device))
        if out is not None:
            kind_out, with_out, _ = _run(getattr(backend, call.op), call, _to(call.args, device), device, out=out)
            if kind_out != "ok" or not _results_equal(with_out, value):
                raise SweepFailure(f"{label}: with out= buffers {backend.name} gave {kind_out} / a different answer")
            for guard in guards:
                try:
                    guard.assert_intact(f"{label} out")
                except AssertionError as exc:
                    raise SweepFailure(str(exc), OUT_OF_RANGE) from None
    if contested:
        return "reference answer, contested slots unspecified (duplicate destination)"
    return "reference answer" + (" (flagged)" if ref_flag else "")


def run_case(backend, op: str, argument: str, mutation: str, observed: Optional[dict] = None) -> str:
    call = mutated(BASELINES[op](), argument, mutation)
    return outcome(backend, call, f"{op}({argument} = {mutation})", observed)


def integer_arguments(op: str) -> list[str]:
    """Integer tensor arguments of an op's baseline (indices, lengths, slots, token ids)."""
    call = BASELINES[op]()
    return [name for name in arguments(call)
            if isinstance(_get(call, name), torch.Tensor) and _get(call, name).dtype in (torch.int32, torch.int64)]


def run_value_case(backend, op: str, argument: str, position: int, number: int) -> str:
    """Set element ``position`` (modulo its numel) of an integer argument to ``number`` (clamped
    to the dtype) and compare the backend with the reference."""
    call = BASELINES[op]()
    value = _get(call, argument).clone()
    info = torch.iinfo(value.dtype)
    element = max(info.min, min(info.max, number))
    value.view(-1)[position % value.numel()] = element
    args = _replaced(call.args, argument, value)
    label = f"{op}({argument}[{position}] = {number})"
    return outcome(backend, dataclasses.replace(call, args=args), label)


# The dimension of the slots in the in-place arguments of the ops with distinct destinations.
SLOT_DIMENSION = {"move_kv": 0, "scatter_mamba_state": 1, "commit_mamba_state": 1}


def contested_slots(op: str, args: dict) -> list[int]:
    """The slots that a call writes more than once: the distinct-destinations precondition
    (docs/reliability.md), broken. Only copies actually made (every index in range) count.
    ``commit_mamba_state`` scatters its commit set (slots, last_step) and its track set
    (track_slots, track_step) together, so a track slot equal to another request's committed
    slot is contested too."""
    if op == "move_kv":
        src, dst = args["src"].long(), args["dst"].long()
        num_slots = min(cache.shape[0] for cache in args["caches"])
        written = dst[(src >= 0) & (src < num_slots) & (dst >= 0) & (dst < num_slots)]
    elif op in ("scatter_mamba_state", "commit_mamba_state"):
        if op == "scatter_mamba_state":
            steps, slots, rows, pool, scratch = args["src_steps"], args["dst_slots"], args.get("src_rows"), args["dst"], args["src"]
        else:
            last_step, track_step = mamba.mamba_commit_steps(args["verdict"], args["seq_lens"], track_interval=args.get("track_interval"))
            steps, slots, rows = mamba._commit_index_sets(args["slots"], args.get("track_slots"), args.get("src_rows"), last_step, track_step)
            pool, scratch = args["ssm_state"], args["ssm_intermediate"]
        active = mamba.active_requests(num_slots=pool.shape[1], num_steps=scratch.shape[2], num_rows=scratch.shape[1],
                                       dst_slots=slots, src_steps=steps, src_rows=rows)
        written = slots.long()[active]
    else:
        return []
    found, counts = torch.unique(written, return_counts=True)
    return found[counts > 1].tolist()


def _without_slots(value, slots: list[int], dim: int):
    """``value`` (a tensor or a list of them) without the given indices of dimension ``dim``."""
    if isinstance(value, (list, tuple)):
        return [_without_slots(item, slots, dim) for item in value]
    keep = [index for index in range(value.shape[dim]) if index not in slots]
    return value.index_select(dim, torch.tensor(keep, dtype=torch.long, device=value.device))


def huge_sizes() -> list[tuple[str, Call]]:
    """Size arguments far past what any buffer holds (must be rejected, never allocated)."""
    calls = []
    for name, value in (("num_steps", 10**6), ("page_size", 2**40), ("topk", 10**6)):
        call = BASELINES["assign_draft_slots"]()
        calls.append((f"assign_draft_slots({name} = {value})", dataclasses.replace(call, args={**call.args, name: value})))
    call = BASELINES["build_tree"]()
    calls.append(("build_tree(seq_lens_sum = 2^62)", dataclasses.replace(call, args={**call.args, "seq_lens_sum": 2**62})))
    call = BASELINES["verify_greedy"]()
    calls.append(("verify_greedy(tree.num_steps = 2^40)",
                  dataclasses.replace(call, args={**call.args, "tree": dataclasses.replace(call.args["tree"], num_steps=2**40)})))
    return calls


__all__ = ["BASELINES", "CATEGORIES", "CRASH", "CROSS_REQUEST_WRITE", "Call", "DISAGREEMENT", "OUT_OF_RANGE", "SweepFailure", "arguments", "contested_slots", "huge_sizes", "integer_arguments", "matrix", "mutated", "mutations",
           "outcome", "run_case", "run_value_case"]
