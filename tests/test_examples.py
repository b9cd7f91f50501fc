"""The examples run end to end (quickly). examples/hf_transformers.py needs the optional
``transformers`` extra (``pip install spec-hal[examples]``)."""
from __future__ import annotations

import importlib.util
import os

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hf_transformers_example_greedy_equals_generate():
    """Tree and chain rounds from raw logits: greedy output equals generate()'s, and the sampled
    (top-k/top-p) runs complete; main() returns 1 on any greedy mismatch."""
    pytest.importorskip("transformers", reason="the optional 'examples' extra (transformers) is not installed")
    example = _load("hf_transformers")
    assert example.main(["--tokens", "12"]) == 0


def test_hf_transformers_example_compacts_the_tree_path():
    """A tree round whose accepted path skips nodes leaves exactly prefix + accept_lens entries
    in the model's cache, and the next round's logits equal a fresh forward over the tokens."""
    pytest.importorskip("transformers", reason="the optional 'examples' extra (transformers) is not installed")
    import torch
    from transformers import DynamicCache

    example = _load("hf_transformers")
    target, draft = example.build_models()
    tokens = [1, 17, 42, 99, 7]
    cache = DynamicCache()
    with torch.no_grad():
        target(torch.tensor([tokens[:-1]]), past_key_values=cache, use_cache=True)
    for round_index in range(4):
        tokens += example.tree_round(target, draft, cache, tokens, {"temperature": 0.7, "top_k": 30}, round_index)
        assert cache.get_seq_length() == len(tokens) - 1
    with torch.no_grad():
        cached = target(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True).logits[0, -1]
        fresh = target(torch.tensor([tokens])).logits[0, -1]
    torch.testing.assert_close(cached, fresh)
