"""spec_hal.compat.vllm.rejection_sample beside vLLM's own rejection-sampler kernels (GPU only).

    python scripts/compat_vs_vllm.py --peers PATH/TO/peers [--markdown FILE]

``--peers`` is a folder with ``vllm_rejection.py``: vLLM's v1 rejection-sampler Triton kernels and
the host steps of its all-greedy / all-random paths (the measurement folder ../shared/peers; not
part of spec_hal). Per size, both run on the same flat inputs (every request at S drafts, or S and
S/2 alternating):

* greedy: vLLM's path is ``target_logits.argmax(-1)`` then its greedy kernel; the outputs must be
  equal (bit for bit);
* random: vLLM's unseeded path (float64 uniforms over the drafts, V exponentials per request, the
  recovered-token kernel, the rejection kernel) beside the compat call (one float32 draw). For
  agreement both take the same per-request generators (the compat wrapper draws a seeded
  request's step coins as vLLM does): the number of accepted drafts per request is compared; the
  recovered token is drawn differently by design (docs/compat.md).

Times are device times (graph replay where the call captures, else eager medians;
spec_hal.bench.harness), RNG draws included on both sides.
"""
from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace

import torch


def _accepted(output: torch.Tensor) -> torch.Tensor:
    """Accepted drafts per request of a (bs, S+1) output: its tokens before the -1 placeholders, minus the final one."""
    return (output != -1).sum(dim=1) - 1


def _flat_inputs(bs: int, steps: int, vocab: int, ragged: bool, device):
    generator = torch.Generator(device=device).manual_seed(bs * 7 + steps)
    counts = [steps if b % 2 == 0 or not ragged else max(steps // 2, 1) for b in range(bs)]
    total = sum(counts)
    draft_probs = torch.softmax(torch.randn(total, vocab, device=device, generator=generator) * 3, dim=-1)
    # targets near the drafts' distribution, so that chains run long
    target_probs = torch.softmax(draft_probs.log() + torch.randn(total, vocab, device=device, generator=generator), dim=-1)
    draft_ids = torch.multinomial(draft_probs, 1, generator=generator)[:, 0].to(torch.int32)
    bonus = torch.randint(0, vocab, (bs, 1), device=device, dtype=torch.int32, generator=generator)
    cu = torch.tensor(counts, device=device).cumsum(0).to(torch.int32)
    return counts, cu, draft_ids, draft_probs, target_probs, bonus


def _rows(vr, bs: int, steps: int, vocab: int, ragged: bool, device) -> list[str]:
    from spec_hal.bench import harness
    from spec_hal.compat import vllm

    counts, cu, draft_ids, draft_probs, target_probs, bonus = _flat_inputs(bs, steps, vocab, ragged, device)
    shape = "S, S/2" if ragged else "S each"
    out = torch.empty((bs, steps + 1), dtype=torch.int32, device=device)
    recovered = torch.empty_like(draft_ids)
    is_greedy = torch.zeros(bs, dtype=torch.bool, device=device)
    logits = target_probs.log()
    flat_bonus = bonus.view(bs)
    greedy = SimpleNamespace(all_greedy=True, all_random=False, temperature=torch.zeros(bs, device=device), generators={})

    def compat_greedy():
        return vllm.rejection_sample(draft_ids, counts, steps, cu, None, logits, bonus, greedy)

    def upstream_greedy():
        return vr.greedy_from_argmax(out, cu, draft_ids, logits.argmax(dim=-1), flat_bonus, steps)

    same = int((compat_greedy() == upstream_greedy()).all(dim=1).sum())
    lines = [f"| rejection_sample, greedy | {bs} | {steps} ({shape}) | {vocab} | {same}/{bs} equal | "
             f"{harness.device_time_s(compat_greedy, device) * 1e6:.1f} | {harness.device_time_s(upstream_greedy, device) * 1e6:.1f} |"]

    # agreement: the same per-request generators on both sides (vLLM's generate_uniform_probs)
    seeds = [1000 + b for b in range(bs)]
    generators = {b: torch.Generator(device=device).manual_seed(s) for b, s in enumerate(seeds)}
    seeded = SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(bs, device=device), generators=generators)
    ours = vllm.rejection_sample(draft_ids, counts, steps, cu, draft_probs, target_probs, bonus, seeded)
    uniform = torch.cat([torch.empty(count, dtype=torch.float64, device=device).uniform_(generator=torch.Generator(device=device).manual_seed(s))
                         for count, s in zip(counts, seeds)])
    inv_q = torch.empty(bs, vocab, device=device).exponential_().reciprocal_()
    theirs = vr.random_sample(out, recovered, cu, draft_ids, draft_probs, target_probs, flat_bonus, uniform, inv_q, is_greedy, steps)
    same = int((_accepted(ours) == _accepted(theirs)).sum())
    random = SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(bs, device=device), generators={})

    def compat_random():
        return vllm.rejection_sample(draft_ids, counts, steps, cu, draft_probs, target_probs, bonus, random)

    def upstream_random():  # vLLM's unseeded draws: float64 uniforms over the drafts, V exponentials per request
        uniform = torch.rand(draft_ids.shape[0], dtype=torch.float64, device=device)
        inv_q = torch.empty(bs, vocab, device=device).exponential_().reciprocal_()
        return vr.random_sample(out, recovered, cu, draft_ids, draft_probs, target_probs, flat_bonus, uniform, inv_q, is_greedy, steps)

    lines.append(f"| rejection_sample, random | {bs} | {steps} ({shape}) | {vocab} | {same}/{bs} same accepted count | "
                 f"{harness.device_time_s(compat_random, device) * 1e6:.1f} | {harness.device_time_s(upstream_random, device) * 1e6:.1f} |")
    return lines


def main(argv=None) -> int:
    from spec_hal.bench.report import print_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", required=True, help="folder with vllm_rejection.py (vLLM's rejection-sampler kernels)")
    parser.add_argument("--markdown", help="write the table here as well")
    args = parser.parse_args(argv)
    sys.path.insert(0, args.peers)
    import vllm_rejection as vr  # noqa: E402  (the peer folder's copy of vLLM's kernels)

    device = torch.device("cuda")
    lines = ["| function | bs | S | V | agree | compat (us) | vLLM (us) |", "|---|---:|---|---:|---|---:|---:|"]
    for vocab in (32000, 128256):
        for bs in (1, 64, 256):
            for steps, ragged in ((3, False), (5, False), (5, True)):
                rows = _rows(vr, bs, steps, vocab, ragged, device)
                print(*rows, sep="\n", flush=True)
                lines += rows
    print_table(lines, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
