"""Benchmark of family sampling: verify_sampling_from_logits (tree) against the unfused torch path
it replaces, and against reading the logits once at the copy bandwidth measured in the same run.

    python benchmarks/sampling.py [--quick] [--backend NAME] [--batches 1 8 64 256] [--nodes 4 8 16]
                                  [--vocabs 32000 128256 151936] [--out DIR]

Unfused path (what an engine does without this op): bf16 logits to float32, divide by the
per-request temperature, softmax, top-k renormalisation (torch.topk threshold), top-p
renormalisation (sort + cumsum), then today's ``verify_sampling`` on the backend with coins from
torch.rand. Fused path: one ``verify_sampling_from_logits`` call with seed/offset tensors.
Parameters: temperature 0.8, top_k 50, top_p 0.95 for every request (the masks always run).

"read once" is the bf16 logits' bytes divided by the measured copy bandwidth (read + write
counted, as harness.copy_bandwidth): the floor a single pass over the logits costs. The issue's
goal: fused >= 3x faster than unfused at every size; fused <= 1.3x "read once" at bs >= 64.
With --out DIR the table is also written to DIR/sampling.md and the rows to DIR/sampling.json.
"""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import spec_hal  # noqa: E402
from spec_hal.conformance.trees import random_tree, tree_to  # noqa: E402

BATCHES = (1, 8, 64, 256)
TREES = ((4, 3), (8, 4), (16, 5))  # (N, S)
VOCABS = (32000, 128256, 151936)
MEMORY_LIMIT = 60e9
TEMPERATURE, TOP_K, TOP_P = 0.8, 50, 0.95


def _inputs(bs: int, nodes: int, steps: int, vocab: int, device):
    tree, candidates = random_tree(bs, nodes, steps, seed=bs + nodes, vocab=vocab)
    generator = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(bs * nodes, vocab, device=device, generator=generator) * 3
    first_child = candidates.gather(1, tree.retrieve_next_token.clamp(min=0)).reshape(-1).to(device)
    rows = torch.arange(0, bs * nodes, 2, device=device)
    logits[rows, first_child[rows]] = 25.0  # half the nodes predict their first child: real acceptance
    return tree_to(tree, device), candidates.to(device), logits.to(torch.bfloat16)


def unfused_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The torch processing an engine runs before today's verify (per-row parameters)."""
    scaled = logits.float() / temperature[:, None]
    probs = torch.softmax(scaled, dim=1)
    kth = torch.topk(probs, int(TOP_K), dim=1).values[:, -1:]  # every row has top_k = TOP_K here
    probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    probs = probs / probs.sum(dim=1, keepdim=True)
    sorted_probs, order = probs.sort(dim=1, descending=True)
    before = sorted_probs.cumsum(dim=1) - sorted_probs
    sorted_probs = torch.where(before < top_p[:, None], sorted_probs, torch.zeros_like(sorted_probs))
    probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    return probs / probs.sum(dim=1, keepdim=True)


def main() -> None:
    parser = harness.common_arguments(__doc__)
    parser.add_argument("--backend", default=None, help="backend to time (default: auto-selected for --device)")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--nodes", type=int, nargs="+", default=[nodes for nodes, _ in TREES])
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS))
    parser.add_argument("--out", default=None, help="directory for sampling.md and sampling.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    backend = spec_hal.get_backend(args.backend, device=device)
    trees = tuple(tree for tree in TREES if tree[0] in args.nodes)
    batches, trees, vocabs = ((1, 8), TREES[:1], (32000,)) if args.quick else (tuple(args.batches), trees, tuple(args.vocabs))
    timing = {"warmup": 1, "repeat": 1, "trials": 1} if device.type == "cpu" else {}
    copy_bw = harness.copy_bandwidth(device) if device.type == "cuda" else 0.0
    lines = [harness.header("sampling: verify_sampling_from_logits vs torch processing + verify_sampling", device,
                            "python benchmarks/sampling.py " + " ".join(sys.argv[1:])),
             harness.DEVICE_TIME_NOTE, f"- backend: {backend.name}; temperature {TEMPERATURE}, top_k {TOP_K}, top_p {TOP_P}; bf16 logits", "",
             "| bs | N | V | fused (us) | unfused torch + verify (us) | speed-up | read once (us) | fused / read once |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    records = []
    for vocab in vocabs:
        for bs in batches:
            for nodes, steps in trees:
                if 8 * bs * nodes * vocab * 4 > MEMORY_LIMIT:  # logits + float32 temporaries of the sort
                    continue
                tree, candidates, logits = _inputs(bs, nodes, steps, vocab, device)
                temperature = torch.full((bs,), TEMPERATURE, device=device)
                top_k = torch.full((bs,), TOP_K, dtype=torch.int64, device=device)
                top_p = torch.full((bs,), TOP_P, device=device)
                seed = torch.arange(bs, dtype=torch.int64, device=device)
                offset = torch.zeros(bs, dtype=torch.int64, device=device)
                generator = torch.Generator(device=device).manual_seed(1)
                coins = torch.rand(bs, nodes, device=device, generator=generator)
                final_coins = torch.rand(bs, device=device, generator=generator)

                def fused():
                    return backend.verify_sampling_from_logits(tree, candidates, logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                                               seed=seed, offset=offset)

                def unfused():
                    rows = lambda t: t.repeat_interleave(nodes)  # noqa: E731
                    probs = unfused_probs(logits, rows(temperature), rows(top_k), rows(top_p))
                    return backend.verify_sampling(tree, candidates, probs, coins, final_coins)

                fused_s = harness.device_time_s(fused, device, **timing)
                unfused_s = harness.device_time_s(unfused, device, **timing)
                read_s = logits.numel() * logits.element_size() / copy_bw if copy_bw else None
                row = (f"| {bs} | {nodes} | {vocab} | {harness.fmt_us(fused_s)} | {harness.fmt_us(unfused_s)} | "
                       f"{harness.fmt_ratio(unfused_s, fused_s)} | {harness.fmt_us(read_s)} | {harness.fmt_ratio(fused_s, read_s)} |")
                print(row, flush=True)
                lines.append(row)
                records.append({"bs": bs, "nodes": nodes, "steps": steps, "vocab": vocab, "fused_s": fused_s, "unfused_s": unfused_s,
                                "read_once_s": read_s, "copy_bandwidth_Bps": copy_bw})
                del logits
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "sampling.md"), "w") as handle:
            handle.write("\n".join(lines) + "\n")
        with open(os.path.join(args.out, "sampling.json"), "w") as handle:
            json.dump({"device": str(device), "backend": backend.name, "rows": records}, handle, indent=1)


if __name__ == "__main__":
    main()
