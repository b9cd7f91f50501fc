"""Benchmark of family ``graphs``: one draft loop, eager versus replayed by ``spec_hal.GraphRunner``.

The captured function is a representative EAGLE-style draft loop (``draft_step`` times the real
``run_draft``): S steps of a small "model" (embedding gather, one hidden
matmul, tanh, the LM-head matmul to V logits), ``draft_topk`` through the backend, the beam
expansion in torch ops (path scores, top-K of K*K candidates, parent lanes, hidden gather), and
the final choice of the N-1 best candidates. (S, K, N) in {(3, 1, 4), (5, 4, 8)}, bs in {1, 16, 64}.

Columns: median time per loop of the eager call, of ``runner.run`` (copy-in, padding, replay,
write-back and output clones included) and of ``torch.compile`` of the eager loop (with
``--compile-slow``), all in the same run; launches per loop counted with ``torch.profiler``:
* host launches: CPU-side runtime/driver calls that submit GPU work (cudaLaunchKernel,
  cuLaunchKernel(Ex), cudaGraphLaunch, cudaMemcpyAsync, cudaMemsetAsync and the hip* twins);
  eager pays each kernel's launch, a replay pays one graph launch plus the runner's copies;
* GPU kernels: kernels/memcpy/memset executed on the device per loop (the graph's nodes run
  there too, so this is the work, not the launch count).
Goal (issue 6): replay <= 1/3 of eager at bs = 1.

Run: ``spec-hal bench --only graphs``.
"""
from __future__ import annotations

import torch

from . import harness
from .report import Column, Context, Table, ratio, us

SIZES = {
    "quick": dict(shapes=((3, 1, 4),), batches=(1, 16), vocab=4096, hidden=256),
    "full": dict(shapes=((3, 1, 4), (5, 4, 8)), batches=(1, 16, 64), vocab=32000, hidden=1024),
}
COLUMNS = [Column("shape", "(S, K, N)"), Column("bs", "bs", "int"), Column("mode", "mode"), Column("eager_us", "eager us", "us"),
           Column("replay_us", "replay us", "us"), Column("replay_over_eager", "replay/eager", "ratio"),
           Column("compile_us", "torch.compile us", "us"), Column("host_launches_eager", "host launches eager", "int"),
           Column("host_launches_replay", "host launches replay", "int"), Column("kernels_eager", "GPU kernels eager", "int"),
           Column("kernels_replay", "GPU kernels replay", "int")]


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


def run(ctx: Context) -> list[Table]:
    import spec_hal

    device, backend, sizes = ctx.device, ctx.backend, SIZES[ctx.sizes]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    vocab, hidden_size = sizes["vocab"], sizes["hidden"]
    compile_slow = ctx.compile and ctx.compile_slow
    table = Table("graphs", f"draft loop eager vs GraphRunner replay (V={vocab}, H={hidden_size}, {str(dtype)[6:]}, backend {backend.name})",
                  COLUMNS, notes=["replay/eager <= 0.33x at bs = 1 is the goal of issue 6; launches counted with torch.profiler.",
                                  *([] if compile_slow else ["torch.compile of the loop: only with --compile-slow."])])
    for steps, topk, num_draft_tokens in sizes["shapes"]:
        loop = DraftLoop(backend, steps=steps, topk=topk, num_draft_tokens=num_draft_tokens, vocab=vocab,
                         hidden_size=hidden_size, dtype=dtype, device=device)
        examples = {"input_ids": torch.empty(0, dtype=torch.int64, device=device),
                    "positions": torch.empty(0, dtype=torch.int64, device=device),
                    "hidden": torch.empty(0, hidden_size, dtype=dtype, device=device)}
        runner = spec_hal.GraphRunner(loop, inputs=examples, batch_sizes=sizes["batches"])
        compiled = harness.maybe_compile(loop.__call__) if compile_slow else None
        for bs in sizes["batches"]:
            ctx.progress(f"graphs bs={bs} (S, K, N)=({steps}, {topk}, {num_draft_tokens})")
            generator = torch.Generator().manual_seed(bs)
            inputs = {"input_ids": torch.randint(0, vocab, (bs,), generator=generator).to(device),
                      "positions": torch.randint(0, 4000, (bs,), generator=generator).to(device),
                      "hidden": (torch.randn(bs, hidden_size, generator=generator) * 0.1).to(device, dtype)}
            eager_s = harness.time_or_none(lambda: loop(**inputs), device, **ctx.timing)
            replay_s = harness.time_or_none(lambda: runner.run(**inputs), device, **ctx.timing)
            compile_s = harness.time_or_none(None if compiled is None else (lambda: compiled(**inputs)), device, **ctx.timing)
            host_eager, gpu_eager = harness.count_launches(lambda: loop(**inputs), device)
            host_replay, gpu_replay = harness.count_launches(lambda: runner.run(**inputs), device)
            table.add(shape=f"({steps}, {topk}, {num_draft_tokens})", bs=bs, mode=runner.mode, eager_us=us(eager_s), replay_us=us(replay_s),
                      replay_over_eager=ratio(replay_s, eager_s), compile_us=us(compile_s), host_launches_eager=host_eager,
                      host_launches_replay=host_replay, kernels_eager=gpu_eager, kernels_replay=gpu_replay)
        if runner.fallback_reason:
            table.notes.append(f"note: {runner.fallback_reason}")
    return [table]
