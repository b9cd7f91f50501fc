"""Every op as ``torch.ops.spec_hal.<op>``: opcheck, the schema's coverage, the wrapper's results
equal to the eager op's, and a full speculative step under torch.compile(fullgraph=True) with zero
graph breaks (dynamo's own counters), equal to eager, static and dynamic shapes.

CI runs it on cpu. ``SPEC_HAL_TEST_DEVICE=cuda`` runs the same tests on the GPU, plus the step
under ``mode="reduce-overhead"`` (CUDA graphs through inductor's cudagraph trees)."""
from __future__ import annotations

import dataclasses
import functools
import os
import shutil

import pytest
import torch

import spec_hal
from spec_hal import torch_library
from spec_hal.registry import all_ops

from spec_hal.testing.step import MUTATED, op_examples, speculative_step, step_inputs


DEVICE = torch.device(os.environ.get("SPEC_HAL_TEST_DEVICE", "cpu"))
EXAMPLES = op_examples(DEVICE)


def test_every_op_is_a_custom_op_with_an_example():
    ops = torch_library.register()
    assert torch_library._UNREGISTERED == {}
    assert set(ops) == set(all_ops())
    assert {op for _, op, _, _ in EXAMPLES} == set(ops)
    with_out = {op for case, op, _, kwargs in EXAMPLES if "out" in kwargs}
    assert with_out == {name for name, op in ops.items() if op.has_out}


@pytest.mark.parametrize("case,op,args,kwargs", EXAMPLES, ids=[case for case, *_ in EXAMPLES])
def test_opcheck(case, op, args, kwargs):
    if "generator" in kwargs:
        # opcheck runs the op several times and compares: a generator draws new coins each time.
        pytest.skip("a torch.Generator draws different coins on every run; the seeded and coins cases cover the op")
    overload, flat = torch_library.flat_call(op, *args, **kwargs)
    if kwargs.get("logprobs") is None:
        torch.library.opcheck(overload, flat)
        return
    # Logprobs are NaN past accept_lens, and opcheck's test_aot_dispatch_dynamic compares with
    # assert_close, where NaN != NaN: the other utils, then that check with equal_nan.
    torch.library.opcheck(overload, flat, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    from torch.testing._internal.optests.aot_autograd import aot_autograd_check

    def fresh_inputs_call(*flat_args):
        return overload(*(a.clone() if isinstance(a, torch.Tensor) else a for a in flat_args))

    aot_autograd_check(fresh_inputs_call, flat, {}, dynamic=True, check_gradients="auto",
                       assert_equals_fn=functools.partial(torch.testing.assert_close, equal_nan=True))


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, torch.Generator):
        return torch.Generator(device=value.device).set_state(value.get_state())
    if isinstance(value, dict):
        return {key: _clone(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_clone(v) for v in value)
    if dataclasses.is_dataclass(value) or hasattr(value, "_fields"):
        fields = [getattr(value, f.name) for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value) else list(value)
        return type(value)(*[_clone(v) for v in fields])
    return value


def _identical(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Same dtype, shape and values, NaN equal to NaN (logprobs are NaN past accept_lens)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if not want.is_floating_point():
        return torch.equal(got, want)
    return bool(((got == want) | (got.isnan() & want.isnan())).all())


def _assert_same(got, want, where=""):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and _identical(got, want), where
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            _assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, torch.Generator):  # both drew the same numbers
        assert torch.equal(got.get_state(), want.get_state()), where
    elif dataclasses.is_dataclass(want) or isinstance(want, (list, tuple)):
        assert type(got) is type(want), where
        items = [(getattr(got, f.name), getattr(want, f.name)) for f in dataclasses.fields(want)] if dataclasses.is_dataclass(want) else zip(got, want)
        for index, (g, w) in enumerate(items):
            _assert_same(g, w, f"{where}[{index}]")
    else:
        assert got == want, where


@pytest.mark.parametrize("case,op,args,kwargs", EXAMPLES, ids=[case for case, *_ in EXAMPLES])
def test_custom_op_path_equals_the_eager_op(case, op, args, kwargs):
    """The wrapper rebuilds the same result types and values, and mutates the same buffers."""
    eager_args, eager_kwargs = _clone(args), _clone(kwargs)
    want = getattr(spec_hal, op)(*eager_args, **eager_kwargs)
    got_args, got_kwargs = _clone(args), _clone(kwargs)
    got = torch_library.call_custom_op(op, got_args, got_kwargs)
    _assert_same(got, want, op)
    _assert_same(got_args, eager_args, "args")
    _assert_same(got_kwargs, eager_kwargs, "kwargs")


def test_wrong_signature_names_the_public_op():
    with pytest.raises(TypeError, match=r"spec_hal\.build_tree\(\)"):
        spec_hal.build_tree(torch.zeros(1, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"spec_hal\.draft_topk\(\)"):
        spec_hal.draft_topk(torch.zeros(1, 4), 1, bogus=1)
    with pytest.raises(TypeError, match=r"spec_hal\.verify_chain\(\)"):
        spec_hal.get_backend("cpu").verify_chain(torch.zeros(1, 2, dtype=torch.int64))


def test_invalid_input_through_the_dispatcher_keeps_its_type():
    overload, flat = torch_library.flat_call("draft_topk", torch.zeros(2, 4, device=DEVICE), 1)
    with pytest.raises(spec_hal.InvalidInput, match="k"):
        overload(flat[0], 9, *flat[2:])  # the optional tensors (token_map, masks) as flat_call passes them


needs_compiler = pytest.mark.skipif(DEVICE.type == "cpu" and shutil.which("g++") is None and shutil.which("c++") is None,
                                    reason="torch.compile (inductor) on cpu needs a C++ compiler")
MODES = [("static", False, None), ("dynamic", True, None)]
if DEVICE.type == "cuda":
    MODES.append(("reduce-overhead", False, "reduce-overhead"))


@needs_compiler
@pytest.mark.parametrize("dynamic,mode", [m[1:] for m in MODES], ids=[m[0] for m in MODES])
def test_compiled_step_has_no_graph_break_and_equals_eager(dynamic, mode):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(speculative_step, fullgraph=True, dynamic=dynamic, mode=mode)
    sizes = (3, 5) if dynamic else (3, 3, 3) if mode else (3,)  # cudagraph trees record on a later call
    static = {}
    for seed, bs in enumerate(sizes):
        inputs = step_inputs(bs, seed=seed, device=DEVICE)
        if mode == "reduce-overhead":
            # An engine's KV caches and state pools are long-lived buffers at fixed addresses;
            # cudagraph trees skip graphs that mutate inputs unless they are marked so.
            for name in MUTATED:
                if name not in static:
                    static[name] = torch._dynamo.mark_static_address(inputs[name]) or inputs[name]
                inputs[name] = static[name].copy_(inputs[name])
        eager_inputs = {name: value.clone() for name, value in inputs.items()}
        got = compiled(**inputs)
        want = speculative_step(**eager_inputs)
        assert len(got) == len(want)
        for index, (g, w) in enumerate(zip(got, want)):
            assert _identical(g, w), f"output {index} at bs={bs}"
        for name in MUTATED:
            assert torch.equal(inputs[name], eager_inputs[name]), name
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1  # dynamic: the second batch size reused the graph
    if mode == "reduce-overhead":
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
