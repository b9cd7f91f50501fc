"""Benchmark of ``commit_mamba_state`` (P19): Qwen3-Next-80B- and Nemotron-H-shaped states.

Per model and batch size: the median time of one commit (last accepted node's SSM and conv
states of every layer into the pool, plus the prefix-cache snapshots that this round's verdict
asks for), the bytes it moved (read + written, as reported by the op), the achieved bandwidth as a
share of the measured device copy bandwidth (goal >= 80%) for eager calls and for CUDA-graph
replay (an eager call is three Triton launches plus argument checks on the host, which bs = 1
cannot hide), and the speed-up over the reference (advanced indexing with boolean masks, which
syncs the host), all measured in the same run. The pool holds ``2 * max(bs) + 8`` slots; the
speculative scratch holds ``max(bs)`` rows of N = 4 states (MTP S = 3): the dominant memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import harness
from .report import Column, Context, Table, ratio, us


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    ssm_shape: tuple[int, ...]
    conv_shape: tuple[int, ...]


# docs/semantics.md §3 (TP = 1)
SIZES = {
    "quick": dict(models=(Model("tiny (quick)", 2, (2, 16, 16), (64, 3)),), batches=(1, 4)),
    "full": dict(models=(Model("Qwen3-Next-80B-A3B", 36, (32, 128, 128), (8192, 3)), Model("Nemotron-H", 24, (128, 64, 128), (10240, 3))),
                 batches=(1, 16, 64)),
}
NODES = 4  # N = S + 1 for MTP with S = 3
TRACK_INTERVAL = 16
COLUMNS = [Column("model", "model"), Column("bs", "bs", "int"), Column("copies", "state copies", "int"), Column("mb_moved", "MB moved", "mb"),
           Column("eager_us", "eager (us)", "us"), Column("eager_share_of_copy", "eager % of copy BW", "share"),
           Column("replay_us", "graph replay (us)", "us"), Column("replay_share_of_copy", "replay % of copy BW", "share"),
           Column("reference_us", "reference (us)", "us"), Column("vs_reference", "speed-up (eager)", "ratio"),
           Column("compile_us", "torch.compile (us)", "us"), Column("vs_compile", "vs compile (eager)", "ratio")]
COMPILE_NOTE = "torch.compile of the boolean-mask reference failed on the H100: measured only with --compile-slow."


def _states(model: Model, max_bs: int, device):
    num_slots = 2 * max_bs + 8
    states = {
        "ssm_state": torch.zeros((model.layers, num_slots, *model.ssm_shape), dtype=torch.float32, device=device),
        "ssm_intermediate": torch.randn((model.layers, max_bs, NODES, *model.ssm_shape), dtype=torch.float32, device=device),
        "conv_state": torch.zeros((model.layers, num_slots, *model.conv_shape), dtype=torch.bfloat16, device=device),
        "conv_intermediate": torch.randn((model.layers, max_bs, NODES, *model.conv_shape), device=device).to(torch.bfloat16),
    }
    total = sum(t.numel() * t.element_size() for t in states.values())
    note = (f"{model.name}: {model.layers} layers, SSM {model.ssm_shape} fp32, conv {model.conv_shape} bf16; "
            f"pool {num_slots} slots, scratch {max_bs} rows x N={NODES}: {total / 1e9:.1f} GB allocated")
    return states, num_slots, note


def _commit_arguments(model_states, num_slots, bs, device):
    from ..conformance.mamba_inputs import random_verdict
    from ..types import Verdict

    verdict = random_verdict(bs, num_steps=NODES - 1, topk=1, num_nodes=NODES, seed=bs)
    verdict = Verdict(*(t.to(device) for t in (verdict.predict, verdict.accept_index, verdict.num_correct, verdict.accept_lens)))
    generator = torch.Generator().manual_seed(bs)
    permutation = torch.randperm(num_slots, generator=generator)
    return dict(
        verdict=verdict,
        seq_lens=torch.randint(0, 4096, (bs,), generator=generator).to(device),
        slots=permutation[:bs].to(device),
        track_slots=permutation[bs:2 * bs].to(device),
        track_interval=TRACK_INTERVAL,
        **{name: (tensor[:, :bs] if "intermediate" in name else tensor) for name, tensor in model_states.items()},
    )


def run(ctx: Context) -> list[Table]:
    from ..mamba import commit_mamba_state as reference_commit

    device, backend, sizes = ctx.device, ctx.backend, SIZES[ctx.sizes]
    compile_slow = ctx.compile and ctx.compile_slow
    table = Table("mamba", f"commit_mamba_state on backend {backend.name}", COLUMNS, notes=[
        f"{backend.provider('commit_mamba_state').description}",
        f"N = {NODES} (MTP S = 3, K = 1), track interval {TRACK_INTERVAL}; bytes = read + written per the op's report",
        *([] if compile_slow else [COMPILE_NOTE])])
    compiled = harness.maybe_compile(reference_commit) if compile_slow else None
    for model in sizes["models"]:
        states, num_slots, note = _states(model, max(sizes["batches"]), device)
        table.notes.append(note)
        for bs in sizes["batches"]:
            ctx.progress(f"mamba {model.name} bs={bs}")
            kwargs = _commit_arguments(states, num_slots, bs, device)
            result = backend.commit_mamba_state(**kwargs)
            moved = int(result.bytes_moved)
            copies = int((result.last_step >= 0).sum()) + int((result.track_step >= 0).sum())
            call = lambda: backend.commit_mamba_state(**kwargs)  # noqa: E731
            eager_s = harness.median_time_s(call, device, **ctx.timing)
            replay_s = harness.graph_replay_time_s(call, device, calls=1)
            reference_s = harness.time_or_none(lambda: reference_commit(**kwargs), device, **ctx.timing)
            compiled_s = harness.time_or_none(None if compiled is None else (lambda: compiled(**kwargs)), device, **ctx.timing)
            table.add(model=model.name, bs=bs, copies=copies, mb_moved=moved / 1e6, eager_us=us(eager_s),
                      eager_share_of_copy=ctx.share_of_copy(moved, eager_s), replay_us=us(replay_s),
                      replay_share_of_copy=ctx.share_of_copy(moved, replay_s), reference_us=us(reference_s),
                      vs_reference=ratio(reference_s, eager_s), compile_us=us(compiled_s), vs_compile=ratio(compiled_s, eager_s))
        del states, kwargs, result
        if device.type == "cuda":
            torch._dynamo.reset()  # compiled baselines may hold this model's tensors
            torch.cuda.empty_cache()
    return [table]
