"""Benchmark of vocabulary masks and ragged chains (docs/structured-output.md).

    python benchmarks/masks.py [--quick] [--backend NAME] [--batches 64 256] [--vocabs 151936] [--out FILE]

1. Masked vs unmasked verification at the same shapes: verify_greedy over logits, verify_sampling,
   verify_chain (logits), draft_topk; every row constrained (dense ``token_bitmask``, the
   worst case) and half the rows through ``bitmask_index`` (-1 for the rest). Goal: masked costs
   at most 10% more than unmasked at bs >= 64. Also ``apply_token_bitmask_`` alone.
2. Ragged chains vs the same work padded: ``verify_chain_ragged`` over T + bs flat logit rows
   against ``verify_chain`` over bs * (S + 1) rows (the padded batch an engine without ragged
   support runs), at a draft-count mix of 0..S (a quarter of the requests with speculation off).

Timing: ``harness.device_time_s`` (CUDA events, median); not a test. The markdown table goes to
stdout and, with ``--out``, to a file (e.g. ``$OUT/masks.md``).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import spec_hal  # noqa: E402
from spec_hal.conformance.trees import random_tree, tree_to  # noqa: E402
from spec_hal.masks import pack_bitmask  # noqa: E402

BATCHES = (64, 256)
TREES = ((8, 5), (4, 3))  # (N, S)
VOCABS = (151936, 32000)


def _tree_inputs(bs, nodes, steps, vocab, device):
    tree, candidates = random_tree(bs, nodes, steps, seed=bs + nodes, vocab=vocab)
    generator = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(bs * nodes, vocab, device=device, generator=generator)
    first_child = candidates.gather(1, tree.retrieve_next_token.clamp(min=0)).reshape(-1).to(device)
    rows = torch.arange(0, bs * nodes, 2, device=device)
    logits[rows, first_child[rows]] = 20.0
    return tree_to(tree, device), candidates.to(device), logits


def _masks(rows, vocab, device):
    """(dense mask (rows, W), half-indexed (mask, index)): 70% of tokens allowed."""
    generator = torch.Generator().manual_seed(rows)
    allowed = torch.rand(rows, vocab, generator=generator) < 0.7
    dense = pack_bitmask(allowed).to(device)
    index = torch.arange(rows, dtype=torch.int32)
    index[1::2] = -1
    return dense, (dense, index.to(device))


def _row(out, *cells):
    line = "| " + " | ".join(str(cell) for cell in cells) + " |"
    out.append(line)
    print(line, flush=True)


def masked_vs_unmasked(backend, device, batches, vocabs, timing, out):
    _row(out, "op", "bs", "N", "V", "unmasked (us)", "all rows masked (us)", "overhead", "half rows masked (us)", "overhead")
    out.append("|---|---|---|---|---|---|---|---|---|")
    print(out[-1])
    for vocab in vocabs:
        for bs in batches:
            for nodes, steps in TREES:
                tree, candidates, logits = _tree_inputs(bs, nodes, steps, vocab, device)
                rows = bs * nodes
                dense, (half, index) = _masks(rows, vocab, device)
                probs = torch.softmax(logits, dim=1).view(bs, nodes, vocab)
                generator = torch.Generator(device=device).manual_seed(1)
                coins = torch.rand(bs, nodes, device=device, generator=generator)
                final_coins = torch.rand(bs, device=device, generator=generator)
                chain = candidates.clone()
                cases = {
                    "verify_greedy(logits)": lambda **m: backend.verify_greedy(tree, candidates, logits, **m),
                    "verify_sampling": lambda **m: backend.verify_sampling(tree, candidates, probs, coins, final_coins, **m),
                    "verify_chain(logits)": lambda **m: backend.verify_chain(chain, logits, **m),
                    "draft_topk(k=4)": lambda **m: backend.draft_topk(logits, 4, **m),
                    "apply_token_bitmask_": None,
                }
                for name, call in cases.items():
                    if call is None:
                        scratch = logits.clone()
                        masked_s = harness.device_time_s(lambda: backend.apply_token_bitmask_(scratch, dense), device, **timing)
                        half_s = harness.device_time_s(lambda: backend.apply_token_bitmask_(scratch, half, bitmask_index=index), device, **timing)
                        copy_s = harness.device_time_s(lambda: scratch.copy_(logits), device, **timing)
                        _row(out, name + " (vs a logits copy)", bs, nodes, vocab, harness.fmt_us(copy_s), harness.fmt_us(masked_s),
                             harness.fmt_ratio(masked_s, copy_s), harness.fmt_us(half_s), harness.fmt_ratio(half_s, copy_s))
                        del scratch
                        continue
                    plain_s = harness.device_time_s(lambda: call(), device, **timing)
                    masked_s = harness.device_time_s(lambda: call(token_bitmask=dense), device, **timing)
                    half_s = harness.device_time_s(lambda: call(token_bitmask=half, bitmask_index=index), device, **timing)
                    _row(out, name, bs, nodes, vocab, harness.fmt_us(plain_s), harness.fmt_us(masked_s), harness.fmt_ratio(masked_s, plain_s),
                         harness.fmt_us(half_s), harness.fmt_ratio(half_s, plain_s))
                del logits, probs
                if device.type == "cuda":
                    torch.cuda.empty_cache()


def ragged_vs_padded(backend, device, batches, vocabs, timing, out):
    out.append("")
    _row(out, "bs", "S", "V", "drafts T (padded bs*S)", "ragged verify_chain_ragged (us)", "padded verify_chain (us)", "ragged / padded")
    out.append("|---|---|---|---|---|---|---|")
    print(out[-1])
    for vocab in vocabs:
        for bs in batches:
            for steps in (3, 5):
                generator = torch.Generator().manual_seed(bs + steps)
                counts = torch.randint(0, steps + 1, (bs,), generator=generator)
                counts[::4] = 0  # speculation switched off for a quarter of the requests
                total = int(counts.sum())
                drafts = torch.randint(0, vocab, (total,), generator=generator).to(device)
                flat_logits = torch.randn(total + bs, vocab, device=device)
                padded_logits = torch.randn(bs * (steps + 1), vocab, device=device)
                candidates = torch.randint(0, vocab, (bs, steps + 1), device=device)
                counts = counts.to(device)
                ragged_s = harness.device_time_s(lambda: backend.verify_chain_ragged(drafts, counts, flat_logits, max_drafts=steps), device, **timing)
                padded_s = harness.device_time_s(lambda: backend.verify_chain(candidates, padded_logits), device, **timing)
                _row(out, bs, steps, vocab, f"{total} ({bs * steps})", harness.fmt_us(ragged_s), harness.fmt_us(padded_s),
                     harness.fmt_ratio(ragged_s, padded_s))
                del flat_logits, padded_logits


def main() -> None:
    parser = harness.common_arguments(__doc__)
    parser.add_argument("--backend", default=None)
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS))
    parser.add_argument("--out", default=None, help="also write the markdown to this file")
    args = parser.parse_args()
    device = torch.device(args.device)
    backend = spec_hal.get_backend(args.backend, device=device)
    batches, vocabs = ((4,), (1000,)) if args.quick else (tuple(args.batches), tuple(args.vocabs))
    timing = {"warmup": 1, "repeat": 1, "trials": 1} if device.type == "cpu" else {}
    out = [harness.header("masks: masked vs unmasked verification; ragged vs padded chains", device,
                          "python benchmarks/masks.py" + (" --quick" if args.quick else "")), harness.DEVICE_TIME_NOTE,
           f"- backend: {backend.name}", ""]
    print("\n".join(out))
    masked_vs_unmasked(backend, device, batches, vocabs, timing, out)
    ragged_vs_padded(backend, device, batches, vocabs, timing, out)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
