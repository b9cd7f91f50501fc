"""The reference engine loop under tensor parallelism (issue 19, docs/distributed.md).

:class:`TensorParallelEngine` is :class:`~spec_hal.testing.engine.SpeculativeEngine` with

* the target's head **vocabulary-parallel**: rank r of W holds columns [r V/W, (r+1) V/W) of
  ``w_head`` and the full logits are all-gathered every target forward (the rest of the tiny
  target, and the draft, are replicated: every rank computes them on identical inputs);
* the verification result **broadcast** from rank ``src`` (``broadcast_verdict``: one collective)
  when ``broadcast=True``; with ``config.graphs`` verify + broadcast run inside a
  :class:`~spec_hal.graphs.GraphRunner` (a CUDA/HIP graph holding the NCCL/RCCL broadcast on a
  GPU; the eager emulation, with the same single collective, over gloo on CPU);
* a **consensus check** (``check_consensus`` on the emitted tokens, accept lengths and bonus
  tokens) every ``consensus_every`` rounds (0: never), which turns a divergence into a
  :class:`~spec_hal.errors.RankDivergence` on every rank in the round it happens, before the
  ranks' loops can fall out of step (a rank that stops while another waits in the next
  all-gather is the deadlock of sglang#31071).

``spawn_ranks`` starts W processes (spawn) over a file-store rendezvous with a hard deadline and
collects each rank's return value; ``python -m spec_hal.testing.tp_engine`` runs the scenarios of
:func:`default_scenarios` with it and checks that every rank emitted the same tokens (and, at
temperature 0, the target's greedy tokens), that a run with rank-local seeds and no broadcast is
caught by the consensus check, and reports the graph modes. The two-GPU NCCL run of issue 19::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        python -m spec_hal.testing.tp_engine --dist-backend nccl --nproc 2 --rounds 1000 --graphs \\
        --out $OUT/tp_nccl_2.json

(``scripts/tp_nccl.sh`` sets the multicast switches; ``--nproc 1`` runs the same NCCL code path
on one GPU.)
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Callable, Optional

import torch

from ..distributed import broadcast_verdict, check_consensus, gather_fingerprints, raise_on_divergence
from ..errors import InvalidInput, RankDivergence
from ..graphs import GraphRunner
from ..types import DraftTree, Verdict
from .engine import EngineConfig, SpeculativeEngine
from .models import DTYPE, NoisyDraftModel, TargetModel

GREEDY_PREFIX = 48  # tokens compared with plain greedy decoding (the reference is quadratic in length)


class VocabParallelTarget:
    """A :class:`TargetModel` whose head is split by vocabulary over the ranks of ``group``.

    Everything but ``head`` is delegated to the wrapped (replicated) model. ``head(hidden)``
    multiplies by this rank's column block of ``w_head`` and all-gathers the blocks in rank
    order: (..., H) -> (..., V). The all-gather only moves bytes, so every rank holds the same
    logits bit for bit (what a reduction cannot promise, see docs/distributed.md).
    """

    def __init__(self, target: TargetModel, *, group=None):
        import torch.distributed as dist

        self.full, self.group = target, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        if target.vocab_size % self.world_size:
            raise InvalidInput("target.vocab_size", f"a multiple of the tensor-parallel size {self.world_size}",
                               target.vocab_size)
        self.shard = target.vocab_size // self.world_size
        self.w_head_shard = self._slice()

    def _slice(self) -> torch.Tensor:
        start = self.rank * self.shard
        return self.full.w_head[:, start:start + self.shard].contiguous()

    def __getattr__(self, name: str):  # only called for attributes this wrapper does not have
        return getattr(self.full, name)

    def to(self, device) -> "VocabParallelTarget":
        self.full.to(device)
        self.w_head_shard = self._slice()
        return self

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        local = (hidden @ self.w_head_shard).contiguous()
        blocks = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(blocks, local, group=self.group)
        return torch.cat(blocks, dim=-1)


class TensorParallelEngine(SpeculativeEngine):
    """:class:`SpeculativeEngine` on one tensor-parallel rank of ``group`` (see the module docstring).

    ``target`` is the full model (each rank slices its head block); ``draft`` is replicated.
    ``broadcast``: every rank uses rank ``src``'s verdict. ``consensus_every``: rounds between
    consensus checks (0: none; each costs one small all-reduce and one host read).
    """

    def __init__(self, target: TargetModel, draft, *, ops, config: EngineConfig, group=None, broadcast: bool = True,
                 consensus_every: int = 1, src: int = 0, timing: bool = False, run_draft: Optional[Callable] = None):
        super().__init__(VocabParallelTarget(target, group=group), draft, ops=ops, config=config, timing=timing,
                         run_draft=run_draft)
        self.group, self.broadcast, self.src = group, broadcast, src
        self.consensus_every = consensus_every
        self.rounds_done = 0
        self._verify_graph: Optional[GraphRunner] = None

    # -- verify (+ broadcast), optionally as one graph -------------------------------------------

    def _verify_tensors(self, *, tokens, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling,
                        logits, coins=None, final_coins=None) -> dict:
        """Verify + broadcast over batch-first tensors (what the verify GraphRunner captures)."""
        bs = tokens.shape[0]
        tree = DraftTree(tokens=tokens.reshape(-1), positions=positions.reshape(-1), retrieve_index=retrieve_index,
                         retrieve_next_token=retrieve_next_token, retrieve_next_sibling=retrieve_next_sibling,
                         mask=None, mask_mode="qlen", num_steps=self.config.steps)
        verdict = super()._verify(tree, logits, None if coins is None else (coins, final_coins))
        if self.broadcast:
            verdict = broadcast_verdict(verdict, src=self.src, group=self.group).verdict
        return {"predict": verdict.predict.view(bs, -1), "accept_index": verdict.accept_index,
                "num_correct": verdict.num_correct, "accept_lens": verdict.accept_lens}

    def _verify_inputs(self, tree: DraftTree, logits: torch.Tensor, coins) -> dict:
        bs, nodes = tree.batch_size, tree.num_nodes
        inputs = {"tokens": tree.tokens.view(bs, nodes), "positions": tree.positions.view(bs, nodes),
                  "retrieve_index": tree.retrieve_index, "retrieve_next_token": tree.retrieve_next_token,
                  "retrieve_next_sibling": tree.retrieve_next_sibling, "logits": logits}
        if coins is not None:
            inputs["coins"], inputs["final_coins"] = coins
        return inputs

    def _build_graph(self, batch_size: int) -> None:
        super()._build_graph(batch_size)
        cfg, device = self.config, self.device
        index = torch.empty(0, cfg.draft_tokens, dtype=torch.int64, device=device)
        examples = {"tokens": index, "positions": index, "retrieve_index": index, "retrieve_next_token": index,
                    "retrieve_next_sibling": index,
                    "logits": torch.empty(0, cfg.draft_tokens, self.target.vocab_size, dtype=DTYPE, device=device)}
        if cfg.temperature > 0:
            examples["coins"] = torch.empty(0, cfg.draft_tokens, device=device)
            examples["final_coins"] = torch.empty(0, device=device)
        self._verify_graph = GraphRunner(self._verify_tensors, inputs=examples, batch_sizes=(batch_size,))

    def _verify(self, tree: DraftTree, logits: torch.Tensor, coins, bitmask=None) -> Verdict:
        if bitmask is not None:
            raise ValueError("the tensor-parallel loop does not support EngineConfig.grammar yet")
        inputs = self._verify_inputs(tree, logits, coins)
        out = self._verify_graph.run(**inputs) if self._verify_graph is not None else self._verify_tensors(**inputs)
        return Verdict(predict=out["predict"].reshape(-1), accept_index=out["accept_index"],
                       num_correct=out["num_correct"], accept_lens=out["accept_lens"])

    # -- consensus after every round ----------------------------------------------------------

    def _round(self, state, seq_lens, coins, grammar_states=None):
        emitted, verdict, roots, grammar_states = super()._round(state, seq_lens, coins, grammar_states)
        self.rounds_done += 1
        if self.consensus_every and self.rounds_done % self.consensus_every == 0:
            with self.timer.section("consensus"):
                check_consensus({"emitted tokens": emitted, "accept_lens": verdict.accept_lens, "bonus tokens": roots},
                                group=self.group, reference=self.src, what=f"round {self.rounds_done}")
        return emitted, verdict, roots, grammar_states

    @property
    def graph_modes(self) -> dict:
        runners = {"draft + tree": self._graph, "verify + broadcast": self._verify_graph}
        return {name: runner.mode if runner is not None else "off" for name, runner in runners.items()}


# ----------------------------------------------------------------------------------------------
# scenarios


@dataclass(frozen=True)
class Scenario:
    """One generate() on every rank for exactly ``rounds`` rounds (``max_rounds``; ``max_tokens`` is
    rounds * (S + 1), which no request can reach earlier since a round emits at most S + 1)."""

    name: str
    temperature: float = 0.0
    rounds: int = 500
    rank_local_seed: bool = False
    broadcast: bool = True
    consensus_every: int = 1
    seed: int = 0
    expect_divergence: bool = False


@dataclass(frozen=True)
class LoopShape:
    steps: int = 3
    topk: int = 2
    draft_tokens: int = 6
    page_size: int = 4
    batch_size: int = 2
    graphs: bool = True


def default_scenarios(rounds: int, temperatures=(0.0, 0.8), *, world_size: int = 2) -> list[Scenario]:
    """Greedy and sampling runs that must agree (with the verdict broadcast, and a shorter one
    without it but with shared seeds), and (W >= 2) one that must be caught: rank-local seeds
    without the broadcast, which diverges within a few rounds."""
    runs = [Scenario(name=f"temperature {t:g}", temperature=t, rounds=rounds) for t in temperatures]
    # The contract without the safety net: identical inputs and coins, all-gathered (exact) logits.
    runs.append(Scenario(name="shared seeds, no broadcast", temperature=0.8, rounds=min(rounds, 100), broadcast=False))
    if world_size >= 2:
        runs.append(Scenario(name="rank-local seeds, no broadcast", temperature=0.8, rounds=min(rounds, 50),
                             rank_local_seed=True, broadcast=False, expect_divergence=True))
    return runs


def prompts(batch_size: int) -> torch.Tensor:
    from ..demo import prompts as demo_prompts

    return demo_prompts(batch_size)


def run_scenario(scenario: Scenario, shape: LoopShape, *, ops, group=None) -> dict:
    """Run one scenario on this rank; returns a JSON-able report (tokens, rounds, or the error)."""
    import torch.distributed as dist

    rank = dist.get_rank(group)
    config = EngineConfig(steps=shape.steps, topk=shape.topk, draft_tokens=shape.draft_tokens, page_size=shape.page_size,
                          temperature=scenario.temperature, graphs=shape.graphs,
                          max_tokens=scenario.rounds * (shape.steps + 1), max_rounds=scenario.rounds)
    target = TargetModel(vocab_size=64, hidden_size=16, recurrent=True, context_gain=0.3)
    draft = NoisyDraftModel(target, noise=0.3)
    engine = TensorParallelEngine(target, draft, ops=ops, config=config, group=group, broadcast=scenario.broadcast,
                                  consensus_every=scenario.consensus_every)
    generator = torch.Generator().manual_seed(scenario.seed + (rank if scenario.rank_local_seed else 0))
    prompt = prompts(shape.batch_size)
    report = {"scenario": scenario.name, "rank": rank}
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        result = engine.generate(prompt, generator=generator)
    except RankDivergence as exc:
        report.update(error=str(exc), diverging_ranks=list(exc.ranks), rounds=engine.rounds_done)
        return report
    report.update(seconds=time.perf_counter() - start, cpu_seconds=time.process_time() - cpu_start,
                  rounds=result.rounds, tokens=result.tokens.tolist(), graph_modes=engine.graph_modes,
                  mean_acceptance_length=result.mean_acceptance_length)
    if scenario.temperature == 0:  # the tokens every request has (a max_rounds run stops before max_tokens)
        length = min(GREEDY_PREFIX, int(result.accept_lens.sum(dim=0).min()), config.max_tokens)
        expected = TargetModel(vocab_size=64, hidden_size=16, recurrent=True, context_gain=0.3).greedy(prompt, length)
        report["matches_greedy_prefix"] = torch.equal(result.tokens[:, :length], expected)
        report["greedy_prefix_length"] = length
    return report


def _quarters(bs: int, nodes: int, device) -> torch.Tensor:
    """(bs, nodes) float32 multiples of 1/4: exact on every device (linspace is not)."""
    return (torch.arange(bs * nodes, dtype=torch.float32, device=device) / 4 - 3).view(bs, nodes)


def capture_self_test(device: torch.device, *, group=None) -> dict:
    """broadcast_verdict + gather_fingerprints captured in one CUDA/HIP graph (eagerly on CPU):
    change every rank's inputs after the capture, replay, and check that every rank received
    rank 0's new values and that the in-graph consensus table agrees."""
    import torch.distributed as dist

    rank = dist.get_rank(group)
    bs, nodes, width = 3, 4, 3
    static = Verdict(predict=torch.zeros(bs * nodes, dtype=torch.int32, device=device),
                     accept_index=torch.zeros(bs, width, dtype=torch.int32, device=device),
                     num_correct=torch.zeros(bs, dtype=torch.int32, device=device),
                     accept_lens=torch.zeros(bs, dtype=torch.int32, device=device))
    logprobs = torch.zeros(bs, nodes, dtype=torch.float32, device=device)

    def step():
        received = broadcast_verdict(static, logprobs=logprobs, group=group)
        table = gather_fingerprints({"predict": received.verdict.predict, "logprobs": received.logprobs}, group=group)
        return received, table

    def new_values():  # only rank 0's count: the broadcast overwrites the others'
        static.predict.copy_(torch.arange(bs * nodes, dtype=torch.int32, device=device) * (1 if rank == 0 else -7))
        logprobs.copy_(_quarters(bs, nodes, device) + (0 if rank == 0 else 1))

    if device.type == "cuda":
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm-up outside the capture (allocator, NCCL kernels)
            step()
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            received, table = step()
        new_values()
        graph.replay()
        torch.cuda.synchronize(device)
    else:
        new_values()
        received, table = step()
    raise_on_divergence(table, ["predict", "logprobs"], what="captured graph")
    ok = torch.equal(received.verdict.predict.cpu(), torch.arange(bs * nodes, dtype=torch.int32)) and torch.equal(
        received.logprobs.cpu(), _quarters(bs, nodes, "cpu"))
    return {"scenario": "capture self-test", "rank": rank, "received_source_values": ok,
            "captured": device.type == "cuda"}


# ----------------------------------------------------------------------------------------------
# processes


def _rank_entry(rank: int, world_size: int, init_method: str, dist_backend: str, timeout_s: float,
                fn: Callable, args: tuple, results) -> None:
    import torch.distributed as dist

    try:
        if dist_backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
            torch.set_num_threads(1)  # tiny models: OpenMP start-up and spinning cost more than the work
        dist.init_process_group(dist_backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        try:
            dist.all_reduce(torch.zeros(1, device=device))  # communicators up before any graph capture
            results.put((rank, "ok", fn(device, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # report every failure to the parent instead of dying silently
        results.put((rank, "failed", traceback.format_exc()))


def spawn_ranks(fn: Callable, args: tuple = (), *, world_size: int, dist_backend: str = "gloo",
                timeout_s: float = 120.0) -> list:
    """Run ``fn(device, *args)`` on ``world_size`` spawned ranks of one process group; return the
    per-rank results in rank order. ``fn`` must be importable (module level).

    Hard deadline: after ``timeout_s`` every rank still running is killed and ``TimeoutError``
    names the ranks that did not finish (collectives also time out after ``timeout_s``, so a
    deadlocked rank errors out on its own). A rank that raised makes this raise ``RuntimeError``
    with its traceback.
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory(prefix="spec_hal_tp_") as rendezvous:
        init_method = f"file://{os.path.join(rendezvous, 'store')}"
        processes = [context.Process(target=_rank_entry, daemon=True,
                                     args=(rank, world_size, init_method, dist_backend, timeout_s, fn, args, results))
                     for rank in range(world_size)]
        for process in processes:
            process.start()
        collected, deadline = {}, time.monotonic() + timeout_s
        try:
            while len(collected) < world_size and time.monotonic() < deadline:
                try:
                    rank, status, payload = results.get(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
                except queue.Empty:
                    if all(not p.is_alive() for p in processes) and results.empty():
                        break
                    continue
                collected[rank] = (status, payload)
        finally:
            for process in processes:
                process.join(timeout=5)
                if process.is_alive():
                    process.kill()
                    process.join(timeout=5)
    failed = {rank: payload for rank, (status, payload) in collected.items() if status != "ok"}
    if failed:
        raise RuntimeError("".join(f"rank {rank} failed:\n{text}" for rank, text in sorted(failed.items())))
    missing = [rank for rank in range(world_size) if rank not in collected]
    if missing:
        raise TimeoutError(f"ranks {missing} did not finish within {timeout_s:.0f} s (exit codes "
                           f"{[p.exitcode for p in processes]}); they were killed")
    return [collected[rank][1] for rank in range(world_size)]


def run_rank_scenarios(device: torch.device, scenarios: list, shape: LoopShape, backend: Optional[str]) -> list:
    """What each rank runs (a :func:`spawn_ranks` target): every scenario, then the capture
    self-test (a real capture on a GPU)."""
    from ..selection import get_backend

    ops = get_backend(backend, device=device) if device.type != "cpu" else get_backend(backend or "cpu")
    reports = [run_scenario(scenario, shape, ops=ops) for scenario in scenarios]
    reports.append(capture_self_test(device))
    return reports


def summarise(per_rank: list, scenarios: list, *, expect_device_graphs: bool = False) -> tuple[bool, list]:
    """Compare the ranks' reports; returns (all good, one line per check). With
    ``expect_device_graphs`` every runner must have captured a CUDA/HIP graph (no fallback)."""
    good, lines = True, []
    by_name: dict = {}
    for reports in per_rank:
        for report in reports:
            by_name.setdefault(report["scenario"], []).append(report)
    for scenario in scenarios:
        reports = by_name[scenario.name]
        if scenario.expect_divergence:
            caught = len(reports) < 2 or all("error" in r for r in reports)
            detail = reports[0].get("error", "not caught")[:160] if reports else ""
            lines.append(f"{scenario.name}: {'caught by the consensus check' if caught else 'NOT CAUGHT'} "
                         f"(round {reports[0].get('rounds')}): {detail}")
            good &= caught
            continue
        errors = [r.get("error") for r in reports if "error" in r]
        same = not errors and all(r["tokens"] == reports[0]["tokens"] for r in reports)
        greedy = all(r.get("matches_greedy_prefix", True) for r in reports)
        rounds = [r.get("rounds") for r in reports]
        captured = not expect_device_graphs or all(
            mode in ("cuda_graph", "hip_graph") for r in reports for mode in r.get("graph_modes", {"-": "none"}).values())
        good &= same and greedy and captured and min(rounds) == scenario.rounds
        lines.append(f"{scenario.name}: rounds {rounds}, same tokens on every rank: {'yes' if same else 'NO'}"
                     + ("" if scenario.temperature else f", greedy prefix matches: {'yes' if greedy else 'NO'}")
                     + (f", graphs {reports[0].get('graph_modes')}" if not errors else f", errors {errors}"))
    if "capture self-test" in by_name:
        reports = by_name["capture self-test"]
        ok = all(r["received_source_values"] for r in reports)
        good &= ok
        where = "in a CUDA graph" if reports[0]["captured"] else "eager (CPU)"
        lines.append(f"capture self-test (broadcast_verdict + gather_fingerprints {where}): {'ok' if ok else 'FAILED'}")
    return good, lines


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spec_hal.testing.tp_engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist-backend", default="gloo", choices=("gloo", "nccl"),
                        help="torch.distributed backend (nccl also means RCCL on ROCm torch); default gloo on CPU")
    parser.add_argument("--nproc", type=int, default=2, help="tensor-parallel ranks (one GPU each with nccl)")
    parser.add_argument("--rounds", type=int, default=500, help="rounds of each consistent run (default 500)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    parser.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--backend", default=None, help="spec_hal backend (default: cpu for gloo, auto for nccl)")
    parser.add_argument("--timeout", type=float, default=540.0, help="hard deadline in seconds (default 540)")
    parser.add_argument("--out", help="write the per-rank reports and the summary as JSON here")
    args = parser.parse_args(argv)
    scenarios = default_scenarios(args.rounds, tuple(args.temperatures), world_size=args.nproc)
    shape = LoopShape(graphs=args.graphs)
    start = time.perf_counter()
    per_rank = spawn_ranks(run_rank_scenarios, (scenarios, shape, args.backend), world_size=args.nproc,
                           dist_backend=args.dist_backend, timeout_s=args.timeout)
    good, lines = summarise(per_rank, scenarios, expect_device_graphs=args.graphs and args.dist_backend == "nccl")
    header = (f"tensor-parallel engine loop: {args.nproc} rank{'s' if args.nproc != 1 else ''} over {args.dist_backend}, "
              f"S={shape.steps} K={shape.topk} N={shape.draft_tokens} bs={shape.batch_size}, "
              f"{time.perf_counter() - start:.1f} s; NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', 'unset')}")
    print(header)
    for line in lines:
        print("  " + line)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"summary": [header, *lines], "ok": good, "scenarios": [asdict(s) for s in scenarios],
                       "shape": asdict(shape), "reports": per_rank}, handle, indent=1)
    print("OK" if good else "FAILED")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
