"""Long run: the engine loop (spec_hal/testing/engine.py) for many rounds with flat memory.

Runs ``generate`` again and again (fresh prompts, the same engine and models) until ``--rounds``
rounds ran, sampling the process RSS and, on a GPU, ``torch.cuda.memory_allocated`` after each
generation. Memory is flat when the last samples do not exceed the samples after the warm-up
(the first 10 % of rounds: allocator pools, Triton caches and graphs fill there) by more than
``--slack-mb``. Prints one JSON object; exit status 1 when memory grew.

    PYTHONPATH=. python scripts/long_run.py --backend cpu --rounds 2000
    PYTHONPATH=. python scripts/long_run.py --backend cuda --rounds 2000 --graphs --json $OUT/long_run_cuda.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def long_run(backend_name: str, *, rounds: int, graphs: bool = False, slack_mb: float = 16.0, bs: int = 4) -> dict:
    import torch

    import spec_hal
    from spec_hal.testing.engine import EngineConfig, SpeculativeEngine
    from spec_hal.testing.models import NoisyDraftModel, TargetModel

    torch.set_num_threads(1)
    backend = spec_hal.get_backend(backend_name)
    device = backend.device
    target = TargetModel(vocab_size=32, hidden_size=16, recurrent=True, context_gain=0.5, seed=7).to(device)
    draft = NoisyDraftModel(target, noise=0.3, seed=8).to(device)
    config = EngineConfig(steps=3, topk=2, draft_tokens=6, page_size=16, graphs=graphs, max_tokens=24, temperature=0.0)
    engine = SpeculativeEngine(target, draft, ops=backend, config=config)
    generator = torch.Generator().manual_seed(0)
    samples, done, started = [], 0, time.time()
    while done < rounds:
        prompt = torch.randint(0, 32, (bs, 5), generator=generator)
        result = engine.generate(prompt, generator=generator)
        done += result.rounds
        spec_hal.raise_pending_errors(device)  # a clean loop records nothing in the error flag
        sample = {"rounds": done, "rss_mb": round(rss_mb(), 1)}
        if device.type == "cuda":
            torch.cuda.synchronize()
            sample["allocated_mb"] = round(torch.cuda.memory_allocated(device) / 2**20, 2)
        samples.append(sample)
    warm = [s for s in samples if s["rounds"] >= rounds // 10][:3] or samples[:1]
    tail = samples[-3:]
    report = {"backend": backend_name, "graphs": graphs, "rounds": done, "seconds": round(time.time() - started, 1),
              "slack_mb": slack_mb, "samples": samples}
    growth = {"rss_mb": max(s["rss_mb"] for s in tail) - max(s["rss_mb"] for s in warm)}
    if device.type == "cuda":
        growth["allocated_mb"] = max(s["allocated_mb"] for s in tail) - max(s["allocated_mb"] for s in warm)
    report["growth_mb"] = {key: round(value, 2) for key, value in growth.items()}
    report["flat"] = all(value <= slack_mb for value in growth.values())
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--graphs", action="store_true")
    parser.add_argument("--slack-mb", type=float, default=16.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    report = long_run(args.backend, rounds=args.rounds, graphs=args.graphs, slack_mb=args.slack_mb)
    text = json.dumps(report, indent=1)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text)
    summary = {key: value for key, value in report.items() if key != "samples"}
    print(json.dumps(summary))
    return 0 if report["flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
