"""The demo's timing report: time per section of a speculative round (each spec_hal op, each
model forward), and the share of a round spent in spec_hal ops against the model forwards.

Sections come from :class:`spec_hal.testing.engine.Timer`: device time from CUDA events on a GPU
(no synchronisation inside a round), host wall time with the device synchronised per section
elsewhere. Kernels are compiled before the timed run (the demo runs the same generation once,
untimed, first), so first-call compilation is never reported as op time.

Under graphs the draft loop and tree building are one captured replay holding both the draft
model's S-1 forwards and the ops (draft_topk, expand_tree, organize_draft, build_tree); its
model part is estimated by timing those S-1 forwards alone (captured the same way) and the rest
is counted as spec_hal ops.
"""
from __future__ import annotations

from typing import Optional

import torch

from .testing.engine import MIXED_SECTIONS, MODEL_SECTIONS, PREFILL


def draft_forwards_seconds(engine, batch_size: int) -> float:
    """Time of the draft loop's S-1 model forwards on bs*K rows, measured apart (graph replay
    on CUDA where it captures, else eager): the model part of the mixed draft section."""
    from .bench.harness import device_time_s

    config, device = engine.config, engine.device
    if config.steps <= 1:
        return 0.0
    rows = batch_size * config.topk
    ids = torch.zeros(rows, dtype=torch.int64, device=device)
    positions = torch.full((rows,), 16, dtype=torch.int64, device=device)

    def forwards():
        for step in range(config.steps - 1):
            engine.draft(ids, positions, None, step)

    timing = {} if device.type == "cuda" else dict(warmup=1, repeat=3, trials=3)
    return device_time_s(forwards, device, **timing) or 0.0


def kind_of(section: str) -> str:
    if section in MODEL_SECTIONS:
        return "model forward"
    if section in MIXED_SECTIONS:
        return "draft model + spec_hal ops"
    return "spec_hal op"


def step_report(timings: dict, rounds: int, *, device_events: bool, draft_forwards_s: Optional[float],
                compiled_before: bool) -> list[str]:
    """Lines of the report: per section ms per round and share of the round, then the split.
    ``compiled_before``: an untimed first run compiled the kernels (said in the header)."""
    rounds = max(rounds, 1)
    per_round = {name: seconds / rounds for name, seconds in timings.items() if name != PREFILL}
    total = sum(per_round.values())
    clock = ("device time from CUDA events, no synchronisation inside a round" if device_events
             else "host wall time, device synchronised around each section")
    warm = "; kernels compiled by an untimed first run" if compiled_before else ""
    lines = [f"time per section, per round ({clock}{warm}):",
             f"  {'section':<52} {'ms/round':>9} {'share':>6}  kind"]
    ops = model = 0.0
    for name, seconds in per_round.items():
        kind = kind_of(name)
        lines.append(f"  {name:<52} {seconds * 1e3:9.3f} {100 * seconds / max(total, 1e-12):5.1f}%  {kind}")
        if kind == "model forward":
            model += seconds
        elif kind == "spec_hal op":
            ops += seconds
        else:  # mixed: the draft model's forwards measured apart, the rest are ops
            forwards = min(seconds, draft_forwards_s or 0.0)
            model, ops = model + forwards, ops + seconds - forwards
            lines.append(f"  {'  of which draft model forwards (measured apart)':<52} {forwards * 1e3:9.3f}")
    lines.append(f"speculative round: {total * 1e3:.3f} ms; spec_hal ops {ops * 1e3:.3f} ms "
                 f"({100 * ops / max(total, 1e-12):.1f}%), model forwards {model * 1e3:.3f} ms ({100 * model / max(total, 1e-12):.1f}%)")
    if PREFILL in timings:
        lines.append(f"prefill (once, not in the round): {timings[PREFILL] * 1e3:.3f} ms")
    return lines
