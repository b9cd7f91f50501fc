"""Speculative decoding of a Hugging Face transformers model pair driven through spec_hal.

Two small Llama models initialised at random (nothing is downloaded): the target (2 layers) and
a draft (1 layer sharing the target's embeddings, first layer and head, so that it often agrees).
Each round drafts, runs the target once over the draft with its own KV cache, verifies with
``spec_hal.verify_sampling_from_logits`` (tree) or ``spec_hal.verify_chain_sampling_from_logits``
(chain) straight from the target logits and per-request sampling parameters, and compacts the
accepted path in the model's cache with ``spec_hal.accepted_kv_moves`` + ``spec_hal.move_kv``.

Greedy (temperature 0) output is checked against ``model.generate()``'s greedy output token for
token; sampled runs (top-k / top-p) use the counter-based RNG (seed, offset = tokens generated).

    pip install spec-hal[examples]      # transformers
    python examples/hf_transformers.py [--tokens 24]
"""
from __future__ import annotations

import argparse

import torch

import spec_hal
from spec_hal.conformance.trees import tree_from_parents

VOCAB = 128
TOPK_ROOT, TREE_DEPTH = 2, 3  # the tree: 2 root children, each with a greedy chain below (N = 7)
CHAIN_STEPS = 3


def build_models(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False, attn_implementation="eager",
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)  # no EOS: generate() must not stop or suppress one
    target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **common)).to(torch.float64).eval()
    draft = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, **common)).to(torch.float64).eval()
    draft.load_state_dict(target.state_dict(), strict=False)  # layer 0, embeddings, norm and head
    return target, draft


def _layers(cache):
    """(keys, values) tensors (1, heads, length, dim) of every layer of a DynamicCache."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def compact_cache(cache, verdict, prefix: int, nodes: int) -> None:
    """Move the accepted nodes' KV (written at prefix + j for node j) to prefix, prefix + 1, ...
    with spec_hal's KV ops, then drop everything after the accepted path."""
    slots = (prefix + torch.arange(nodes)).view(1, nodes)
    src, dst = spec_hal.accepted_kv_moves(verdict, slots)
    rows = []
    for keys, values in _layers(cache):
        rows += [keys[0].transpose(0, 1).contiguous(), values[0].transpose(0, 1).contiguous()]  # (length, heads, dim)
    spec_hal.move_kv(rows, src, dst)
    for (keys, values), (key_rows, value_rows) in zip(_layers(cache), zip(rows[0::2], rows[1::2])):
        keys[0].copy_(key_rows.transpose(0, 1))
        values[0].copy_(value_rows.transpose(0, 1))
    remove = nodes - int(verdict.accept_lens[0])
    if remove:
        cache.crop(-remove)  # a negative count removes that many tokens (transformers 4 and 5)


def draft_greedy_next(draft, tokens: list[int], count: int = 1) -> list[int]:
    """The draft's top-``count`` next tokens after ``tokens`` (full recompute: the draft is tiny)."""
    with torch.no_grad():
        logits = draft(torch.tensor([tokens])).logits[0, -1]
    return spec_hal.draft_topk(logits[None], count)[1][0].tolist()


def draft_tree(draft, tokens: list[int]):
    """Root -> TOPK_ROOT children, each followed by a greedy chain: (parents, node tokens)."""
    parents, node_tokens = [-1], [tokens[-1]]
    frontier = []
    for token in draft_greedy_next(draft, tokens, TOPK_ROOT):
        parents.append(0)
        node_tokens.append(token)
        frontier.append((len(node_tokens) - 1, [token]))
    for _ in range(TREE_DEPTH - 1):
        grown = []
        for node, path in frontier:
            token = draft_greedy_next(draft, tokens + path)[0]
            parents.append(node)
            node_tokens.append(token)
            grown.append((len(node_tokens) - 1, path + [token]))
        frontier = grown
    return parents, node_tokens


def tree_round(target, draft, cache, tokens: list[int], params: dict, round_index: int) -> list[int]:
    """One tree round; returns the emitted tokens (accepted drafts and the final token)."""
    prefix = len(tokens) - 1  # the cache holds every token but the last (the root)
    parents, node_tokens = draft_tree(draft, tokens)
    nodes = len(node_tokens)
    tree = tree_from_parents([parents], num_steps=TREE_DEPTH, seq_lens=[prefix], tokens=torch.tensor(node_tokens))
    # Node j attends to the whole prefix and to its ancestors (tree.mask); positions are prefix + depth.
    allowed = torch.cat([torch.ones(nodes, prefix, dtype=torch.bool), tree.mask[0]], dim=1)
    mask = torch.zeros(1, 1, nodes, prefix + nodes, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    with torch.no_grad():
        logits = target(torch.tensor([node_tokens]), position_ids=tree.positions.view(1, nodes), attention_mask=mask,
                        past_key_values=cache, use_cache=True).logits[0]
    candidates = torch.tensor([node_tokens])
    result = spec_hal.verify_sampling_from_logits(tree, candidates, logits, **params, **_randomness(params, len(tokens), round_index))
    compact_cache(cache, result.verdict, prefix, nodes)
    return _emitted(result.verdict)


def chain_round(target, draft, cache, tokens: list[int], params: dict, round_index: int) -> list[int]:
    prefix = len(tokens) - 1
    drafts = []
    for _ in range(CHAIN_STEPS):
        drafts += draft_greedy_next(draft, tokens + drafts)
    with torch.no_grad():
        logits = target(torch.tensor([[tokens[-1]] + drafts]), past_key_values=cache, use_cache=True).logits[0]
    result = spec_hal.verify_chain_sampling_from_logits(torch.tensor([drafts]), None, logits, **params,
                                                        **_randomness(params, len(tokens), round_index))
    compact_cache(cache, result.verdict, prefix, CHAIN_STEPS + 1)  # a chain's path is already in place: only a crop
    return _emitted(result.verdict)


def _randomness(params: dict, generated: int, round_index: int) -> dict:
    if params["temperature"] == 0:
        return {}
    return {"seed": torch.tensor([1234]), "offset": torch.tensor([generated])}


def _emitted(verdict) -> list[int]:
    count = int(verdict.accept_lens[0])
    return verdict.predict.long()[verdict.accept_index[0, :count].long()].tolist()


def speculative_generate(target, draft, prompt: list[int], new_tokens: int, *, mode: str, params: dict) -> tuple[list[int], int]:
    """(generated tokens, rounds) of speculative decoding in ``mode`` "tree" or "chain"."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        target(torch.tensor([prompt[:-1]]), past_key_values=cache, use_cache=True)
    tokens, rounds = list(prompt), 0
    step = tree_round if mode == "tree" else chain_round
    while len(tokens) - len(prompt) < new_tokens:
        tokens += step(target, draft, cache, tokens, params, rounds)
        rounds += 1
    return tokens[len(prompt):len(prompt) + new_tokens], rounds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args(argv)
    target, draft = build_models()
    prompt = [1, 17, 42, 99, 7]
    with torch.no_grad():
        reference = target.generate(torch.tensor([prompt]), max_new_tokens=args.tokens, do_sample=False)[0, len(prompt):].tolist()
    failures = 0
    for mode in ("tree", "chain"):
        greedy, rounds = speculative_generate(target, draft, prompt, args.tokens, mode=mode, params={"temperature": 0.0})
        same = greedy == reference
        failures += not same
        print(f"{mode} greedy: {args.tokens} tokens in {rounds} rounds; equals generate(): {same}")
        sampled, rounds = speculative_generate(target, draft, prompt, args.tokens, mode=mode,
                                               params={"temperature": 0.8, "top_k": 20, "top_p": 0.9})
        print(f"{mode} sampled (T 0.8, top-k 20, top-p 0.9): {sampled[:12]}... in {rounds} rounds")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
