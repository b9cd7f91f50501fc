"""Benchmark of family verify: verify_greedy over target logits (fused argmax) and
verify_sampling, against the torch reference and torch.compile of it, in the same run.

    python benchmarks/verify.py [--quick] [--no-compile] [--backend NAME] [--batches 1 64] [--nodes 4 8] [--vocabs 32000]

torch.compile of the reference unrolls its S * N walk steps and compiles each shape anew (about
a minute per shape); split the full grid with --batches / --nodes / --vocabs, or --no-compile.

Bytes counted: verify_greedy reads the bs*N*V logits once (everything else is < 0.1%);
verify_sampling reads one target row per request for the final token (plus N gathered
probabilities per level), so its bandwidth is that row traffic. The goal of the issue is
verify over logits >= 70% of the measured copy bandwidth at bs >= 64.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import spec_hal  # noqa: E402
import spec_hal.verify as reference  # noqa: E402
from spec_hal.conformance.trees import random_tree, tree_to  # noqa: E402

BATCHES = (1, 64, 256)
TREES = ((4, 3), (8, 5), (32, 5))  # (N, S): chain K = 1, K = 4, K = 8
VOCABS = (32000, 151936)
MEMORY_LIMIT = 40e9


def _inputs(bs: int, nodes: int, steps: int, vocab: int, device):
    tree, candidates = random_tree(bs, nodes, steps, seed=bs + nodes, vocab=vocab)
    generator = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(bs * nodes, vocab, device=device, generator=generator)
    # Half the nodes predict their first child's token: realistic acceptance lengths.
    first_child = candidates.gather(1, tree.retrieve_next_token.clamp(min=0)).reshape(-1).to(device)
    rows = torch.arange(0, bs * nodes, 2, device=device)
    logits[rows, first_child[rows]] = 20.0
    return tree_to(tree, device), candidates.to(device), logits


def _row(name, bs, nodes, vocab, seconds, nbytes, copy_bw, ref_s, compiled_s):
    bandwidth = nbytes / seconds
    share = f"{100 * bandwidth / copy_bw:.0f}%" if copy_bw else "-"
    return (f"| {name} | {bs} | {nodes} | {vocab} | {harness.fmt_us(seconds)} | {bandwidth / 1e9:.0f} | {share} | "
            f"{harness.fmt_us(ref_s)} | {harness.fmt_ratio(ref_s, seconds)} | {harness.fmt_us(compiled_s)} | {harness.fmt_ratio(compiled_s, seconds)} |")


def main() -> None:
    parser = harness.common_arguments(__doc__)
    parser.add_argument("--backend", default=None, help="backend to time (default: auto-selected for --device)")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), help="subset of batch sizes (split long runs)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[nodes for nodes, _ in TREES], help="subset of N in 4 8 32")
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS))
    args = parser.parse_args()
    # The reference unrolls S * N walk steps; every shape is its own compile. Without a higher
    # limit dynamo would silently fall back to eager after 8 shapes and the baseline would lie.
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    device = torch.device(args.device)
    backend = spec_hal.get_backend(args.backend, device=device)
    trees = tuple(tree for tree in TREES if tree[0] in args.nodes)
    batches, trees, vocabs = ((1, 4), TREES[:2], (32000,)) if args.quick else (tuple(args.batches), trees, tuple(args.vocabs))
    timing = {"warmup": 1, "repeat": 1, "trials": 1} if device.type == "cpu" else {}
    copy_bw = harness.copy_bandwidth(device) if device.type == "cuda" else 0.0
    print(harness.header("verify: verify_greedy (fused argmax over logits), verify_sampling", device,
                         "python benchmarks/verify.py" + (" --quick" if args.quick else "")))
    print(harness.DEVICE_TIME_NOTE)
    print(f"- backend: {backend.name}")
    print()
    print("| op | bs | N | V | time (us) | GB/s | % copy BW | torch ref (us) | speed-up | torch.compile (us) | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for vocab in vocabs:
        for bs in batches:
            for nodes, steps in trees:
                if 3 * bs * nodes * vocab * 4 > MEMORY_LIMIT:  # logits + probs + reference temporaries
                    continue
                tree, candidates, logits = _inputs(bs, nodes, steps, vocab, device)

                def greedy():
                    return backend.verify_greedy(tree, candidates, logits)

                seconds = harness.device_time_s(greedy, device, **timing)
                ref_s = harness.device_time_s(lambda: reference.verify_greedy(tree, candidates, logits), device, **timing)
                compiled = None if args.no_compile else harness.maybe_compile(reference.verify_greedy, device)
                compiled_s = harness.device_time_s(None if compiled is None else (lambda: compiled(tree, candidates, logits)), device, **timing)
                print(_row("verify_greedy(logits)", bs, nodes, vocab, seconds, logits.numel() * logits.element_size(), copy_bw, ref_s, compiled_s),
                      flush=True)

                probs = torch.softmax(logits, dim=1).view(bs, nodes, vocab)
                del logits
                generator = torch.Generator(device=device).manual_seed(1)
                coins = torch.rand(bs, nodes, device=device, generator=generator)
                final_coins = torch.rand(bs, device=device, generator=generator)
                sampling_args = (tree, candidates, probs, coins, final_coins)
                seconds = harness.device_time_s(lambda: backend.verify_sampling(*sampling_args), device, **timing)
                ref_s = harness.device_time_s(lambda: reference.verify_sampling(*sampling_args), device, **timing)
                compiled = None if args.no_compile else harness.maybe_compile(reference.verify_sampling, device)
                compiled_s = harness.device_time_s(None if compiled is None else (lambda: compiled(*sampling_args)), device, **timing)
                row_bytes = bs * (vocab + steps * nodes) * 4
                print(_row("verify_sampling", bs, nodes, vocab, seconds, row_bytes, copy_bw, ref_s, compiled_s), flush=True)
                del probs
                if device.type == "cuda":
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
