"""Benchmark of family ``graphs``: one draft loop, eager versus replayed by ``spec_hal.GraphRunner``.

The captured function is a representative EAGLE-style draft loop (the lead swaps in the real
draft step when ``run_draft`` lands): S steps of a small "model" (embedding gather, one hidden
matmul, tanh, the LM-head matmul to V logits), ``draft_topk`` through the backend, the beam
expansion in torch ops (path scores, top-K of K*K candidates, parent lanes, hidden gather), and
the final choice of the N-1 best candidates. (S, K, N) in {(3, 1, 4), (5, 4, 8)}, bs in {1, 16, 64}.

Columns: median time per loop of the eager call, of ``runner.run`` (copy-in, padding, replay,
write-back and output clones included) and of ``torch.compile`` of the eager loop, all in the
same run; launches per loop counted with ``torch.profiler``:
* host launches: CPU-side runtime/driver calls that submit GPU work (cudaLaunchKernel,
  cuLaunchKernel(Ex), cudaGraphLaunch, cudaMemcpyAsync, cudaMemsetAsync and the hip* twins);
  eager pays each kernel's launch, a replay pays one graph launch plus the runner's copies;
* GPU kernels: kernels/memcpy/memset executed on the device per loop (the graph's nodes run
  there too, so this is the work, not the launch count).
Goal (issue 6): replay <= 1/3 of eager at bs = 1.

Run: ``python benchmarks/graphs.py [--quick] [--no-compile]``.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import common_arguments, fmt_ratio, fmt_us, header, maybe_compile, time_or_none  # noqa: E402

import spec_hal  # noqa: E402
from spec_hal.selection import backend_for_device  # noqa: E402

SHAPES = ((3, 1, 4), (5, 4, 8))
BATCHES = (1, 16, 64)
LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
               "cudaMemcpyAsync", "cudaMemsetAsync", "hipLaunchKernel", "hipModuleLaunchKernel",
               "hipExtModuleLaunchKernel", "hipGraphLaunch", "hipMemcpyAsync", "hipMemsetAsync", "hipMemcpyWithStream")


class DraftLoop:
    """S draft steps with K-wide beams; returns batch-first tree records.

    Inputs: input_ids (bs,) int64 roots, positions (bs,) int64, hidden (bs, H). Outputs:
    tokens, scores, parents (bs, S, K) and selected (bs, N-1) candidate indices.
    """

    def __init__(self, backend, *, steps, topk, num_draft_tokens, vocab, hidden_size, dtype, device, seed=0):
        generator = torch.Generator().manual_seed(seed)
        scale = hidden_size ** -0.5
        self.embedding = (torch.randn(vocab, hidden_size, generator=generator) * 0.1).to(device, dtype)
        self.w_hidden = (torch.randn(hidden_size, hidden_size, generator=generator) * scale).to(device, dtype)
        self.w_out = (torch.randn(hidden_size, vocab, generator=generator) * scale * 4).to(device, dtype)
        self.backend, self.steps, self.topk, self.num_draft_tokens = backend, steps, topk, num_draft_tokens

    def forward(self, ids, positions, hidden):
        rope_like = torch.sin(positions.to(hidden.dtype)).unsqueeze(1)
        new_hidden = torch.tanh((self.embedding[ids] + hidden + rope_like) @ self.w_hidden)
        return new_hidden @ self.w_out, new_hidden

    def __call__(self, *, input_ids, positions, hidden):
        bs, k = input_ids.shape[0], self.topk
        logits, hidden = self.forward(input_ids, positions, hidden)
        scores, ids = self.backend.draft_topk(logits, k)
        parents = torch.zeros_like(ids)
        records = [(ids, scores, parents)]
        lanes = hidden.repeat_interleave(k, dim=0)
        lane_positions = positions.repeat_interleave(k)
        for step in range(1, self.steps):
            logits, lane_hidden = self.forward(ids.reshape(-1), lane_positions + step, lanes)
            probs, candidates = self.backend.draft_topk(logits, k)
            path_scores = (scores.unsqueeze(2) * probs.view(bs, k, k)).view(bs, k * k)
            scores, best = path_scores.topk(k, dim=1)
            parents = torch.div(best, k, rounding_mode="floor")
            ids = candidates.view(bs, k * k).gather(1, best)
            lanes = lane_hidden.view(bs, k, -1).gather(1, parents.unsqueeze(2).expand(-1, -1, lane_hidden.shape[1]))
            lanes = lanes.reshape(bs * k, -1)
            records.append((ids, scores, parents))
        tokens, all_scores, all_parents = (torch.stack(parts, dim=1) for parts in zip(*records))
        selected = all_scores.view(bs, -1).topk(self.num_draft_tokens - 1, dim=1).indices.sort(dim=1).values
        return {"tokens": tokens, "scores": all_scores, "parents": all_parents, "selected": selected}


def count_launches(fn, device: torch.device) -> tuple[str, str]:
    """(host launches, GPU kernels) of one call, from torch.profiler; "-" where not measurable."""
    if device.type != "cuda":
        return "-", "-"
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    host = sum(1 for event in prof.events() if event.name in LAUNCH_APIS)
    gpu = sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)
    return str(host), str(gpu)


def main() -> None:
    parser = common_arguments(__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args()
    device = torch.device(args.device)
    backend = backend_for_device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes, batches = (SHAPES[:1], BATCHES[:2]) if args.quick else (SHAPES, BATCHES)
    timing = {"warmup": 1, "repeat": 3, "trials": 3} if args.quick else {}
    vocab, hidden_size = (min(args.vocab, 4096), min(args.hidden, 256)) if args.quick else (args.vocab, args.hidden)
    command = "python benchmarks/graphs.py" + (" --quick" if args.quick else "") + (" --no-compile" if args.no_compile else "")
    print(header(f"graphs: draft loop eager vs GraphRunner replay (V={vocab}, H={hidden_size}, {str(dtype)[6:]}, backend {backend.name})",
                 device, command))
    print("| (S, K, N) | bs | mode | eager us | replay us | replay/eager | torch.compile us | host launches eager | host launches replay | GPU kernels eager | GPU kernels replay |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for steps, topk, num_draft_tokens in shapes:
        loop = DraftLoop(backend, steps=steps, topk=topk, num_draft_tokens=num_draft_tokens, vocab=vocab,
                         hidden_size=hidden_size, dtype=dtype, device=device)
        examples = {"input_ids": torch.empty(0, dtype=torch.int64, device=device),
                    "positions": torch.empty(0, dtype=torch.int64, device=device),
                    "hidden": torch.empty(0, hidden_size, dtype=dtype, device=device)}
        runner = spec_hal.GraphRunner(loop, inputs=examples, batch_sizes=batches)
        compiled = None if args.no_compile else maybe_compile(loop.__call__, device)
        for bs in batches:
            generator = torch.Generator().manual_seed(bs)
            inputs = {"input_ids": torch.randint(0, vocab, (bs,), generator=generator).to(device),
                      "positions": torch.randint(0, 4000, (bs,), generator=generator).to(device),
                      "hidden": (torch.randn(bs, hidden_size, generator=generator) * 0.1).to(device, dtype)}
            eager_s = time_or_none(lambda: loop(**inputs), device, **timing)
            replay_s = time_or_none(lambda: runner.run(**inputs), device, **timing)
            compile_s = time_or_none(None if compiled is None else (lambda: compiled(**inputs)), device, **timing)
            host_eager, gpu_eager = count_launches(lambda: loop(**inputs), device)
            host_replay, gpu_replay = count_launches(lambda: runner.run(**inputs), device)
            print(f"| ({steps}, {topk}, {num_draft_tokens}) | {bs} | {runner.mode} | {fmt_us(eager_s)} | {fmt_us(replay_s)} | "
                  f"{fmt_ratio(replay_s, eager_s)} | {fmt_us(compile_s)} | {host_eager} | {host_replay} | {gpu_eager} | {gpu_replay} |")
        if runner.fallback_reason:
            print(f"\nnote: {runner.fallback_reason}")
    print("\nreplay/eager <= 0.33x at bs = 1 is the goal of issue 6; launches counted with torch.profiler (see module docstring).")


if __name__ == "__main__":
    main()
