"""Benchmark of family ``tree``: build_tree, and one full draft step without the model forward
(expand_tree of the last step + organize_draft + build_tree), against the torch reference and
torch.compile of the reference, measured in the same run.

    python benchmarks/tree.py [--quick] [--device cuda] [--backend NAME] [--no-compile]

The ops are latency-bound (a few KB per request), so the table reports time and speed-ups, not
bandwidth.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

import spec_hal  # noqa: E402
from spec_hal.conformance.tree_inputs import random_draft_tree, random_step_probs  # noqa: E402
from spec_hal.tree import build_tree as reference_build_tree  # noqa: E402
from spec_hal.tree import expand_tree as reference_expand_tree  # noqa: E402
from spec_hal.tree import organize_draft as reference_organize_draft  # noqa: E402

CONFIGS = ((3, 1, 4), (5, 4, 8), (5, 8, 32))  # (S, K, N)
BATCHES = (1, 64, 256)


def _inputs(bs, steps, topk, nodes, device):
    """build_tree inputs, the records of steps 0..S-2 and the last step's (scores, probs, ids)."""
    tree = random_draft_tree(bs, topk=topk, num_steps=steps, num_draft_tokens=nodes, seed=bs + nodes)
    generator = torch.Generator().manual_seed(bs)
    move = lambda t: t.to(device)  # noqa: E731
    build_args = tuple(map(move, (tree.roots, tree.parents, tree.selected, tree.draft_tokens, tree.seq_lens)))
    records = [type(r)(move(r.scores), move(r.tokens), move(r.parents)) for r in tree.records[:-1]]
    scores = move(random_step_probs(bs, topk, generator, "random"))
    probs = move(random_step_probs(bs * topk, topk, generator, "random"))
    ids = move(torch.randint(0, 32000, (bs * topk, topk), generator=generator))
    return build_args, records, (scores, probs, ids)


def _draft_finish(expand, organize, build, *, records, step_inputs, build_args, steps, topk, nodes):
    """expand_tree of step S-1, organize_draft over the S records, build_tree."""
    scores, probs, ids = step_inputs
    expansion = expand(steps - 1, scores, probs, ids)
    parents, selected, draft_tokens = organize([*records, expansion.record], nodes)
    return build(build_args[0], parents, selected, draft_tokens, build_args[4], topk=topk)


def main() -> None:
    parser = harness.common_arguments(__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="backend under test (default: the one for --device)")
    args = parser.parse_args()
    device = torch.device(args.device)
    backend = spec_hal.get_backend(args.backend, device) if args.backend or device.type != "cpu" else spec_hal.get_backend("cpu")
    batches = (1, 64) if args.quick else BATCHES
    configs = CONFIGS[1:2] if args.quick else CONFIGS
    timing = dict(warmup=2, repeat=3, trials=3) if args.quick else {}
    print(harness.header("tree: build_tree and one draft step (expand + organize + build)", device,
                         "python benchmarks/tree.py" + (" --quick" if args.quick else "")))
    print(harness.DEVICE_TIME_NOTE)
    print(f"backend: {backend.name}; build_tree: {backend.provider('build_tree').description}; "
          f"expand_tree: {backend.provider('expand_tree').description}\n")
    compiled_build = None if args.no_compile else harness.maybe_compile(reference_build_tree, device)

    def reference_finish(**kw):
        return _draft_finish(reference_expand_tree, reference_organize_draft, reference_build_tree, **kw)

    compiled_finish = None if args.no_compile else harness.maybe_compile(reference_finish, device)
    print("| op | bs | S | K | N | spec_hal (us) | reference (us) | torch.compile (us) | vs reference | vs compile |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for steps, topk, nodes in configs:
        for bs in batches:
            build_args, records, step_inputs = _inputs(bs, steps, topk, nodes, device)
            cases = {
                "build_tree": (
                    lambda: backend.build_tree(*build_args, topk=topk),
                    lambda: reference_build_tree(*build_args, topk=topk),
                    None if compiled_build is None else (lambda: compiled_build(*build_args, topk=topk)),
                ),
                "draft step": (
                    lambda: _draft_finish(backend.expand_tree, backend.organize_draft, backend.build_tree, records=records,
                                          step_inputs=step_inputs, build_args=build_args, steps=steps, topk=topk, nodes=nodes),
                    lambda: reference_finish(records=records, step_inputs=step_inputs, build_args=build_args, steps=steps, topk=topk, nodes=nodes),
                    None if compiled_finish is None else (lambda: compiled_finish(records=records, step_inputs=step_inputs, build_args=build_args,
                                                                                  steps=steps, topk=topk, nodes=nodes)),
                ),
            }
            for name, (ours, reference, compiled) in cases.items():
                ours_s = harness.device_time_s(ours, device, **timing)
                reference_s = harness.device_time_s(reference, device, **timing)
                compiled_s = harness.device_time_s(compiled, device, **timing)
                print(f"| {name} | {bs} | {steps} | {topk} | {nodes} | {harness.fmt_us(ours_s)} | {harness.fmt_us(reference_s)} | "
                      f"{harness.fmt_us(compiled_s)} | {harness.fmt_ratio(reference_s, ours_s)} | {harness.fmt_ratio(compiled_s, ours_s)} |",
                      flush=True)


if __name__ == "__main__":
    main()
