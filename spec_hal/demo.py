"""``spec-hal demo``: speculative decoding end to end on the selected backend.

Runs :class:`spec_hal.testing.engine.SpeculativeEngine` (every step a spec_hal op) with an
embedded float64 model pair: a target with one attention layer over a paged KV cache (and, with
``--hybrid``, a recurrent layer whose state is committed with ``commit_mamba_state``) and a draft
derived from the target plus fixed noise, so that it agrees with the target most of the time but
not always. Prints the backend and the providers of the ops used, the generated tokens, the
acceptance statistics and the time per op and model forward (demo_timing.py); at temperature 0
it checks the output against plain greedy decoding of the target.

Presets (``--preset``): ``tiny`` (default: V = 64, H = 16, float64, exact self-check on any
backend) and ``8b`` (an 8B-class shape: V = 128256, H = 4096, bfloat16, random weights, the same
draft = target head + noise construction with low-rank noise). ``8b`` needs a GPU backend: on a
CPU it stops with one line (2 GB of bfloat16 weights; a round takes seconds there). On a GPU the
demo first runs the same generation untimed (kernel compilation, graph capture, first calls) and
reports that time apart, so that compilation is never counted as op time.

The greedy self-check is one incremental greedy run of the target (linear in the tokens). With
more than ``SUMMARY_ABOVE`` requests (or ``--summary``) the per-request token lists are replaced
by a one-line digest per request. Every option is checked before any work, with one line naming
the option and the bound it broke (:func:`check_arguments`); the module imports torch only when
the demo runs, so that ``spec-hal --help`` stays fast.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

DEFAULT_PROMPT = (12, 7, 33, 5, 48, 21, 9, 60, 17, 2)
OPS_USED = ("draft_topk", "expand_tree", "organize_draft", "build_tree", "verify_greedy", "verify_sampling",
            "bonus_tokens", "compact_accepted", "accepted_kv_moves", "move_kv", "scatter_mamba_state",
            "commit_mamba_state")
VOCAB, HIDDEN, CONTEXT_GAIN, DRAFT_NOISE = 64, 16, 0.3, 0.3
MAX_TOPK = 16  # spec_hal.topk.MAX_TOPK (kept equal by tests/test_cli_options.py; importing it needs torch)
MAX_STEPS = 16
MAX_BATCH, MAX_TOKENS, MAX_PAGE_SIZE = 4096, 100_000, 4096
MAX_CACHE_BYTES = 4 << 30  # the demo's KV cache grows with batch x tokens x (S + 1)
DEFAULT_DRAFT_TOKENS = 12
SUMMARY_ABOVE = 8  # requests: more are summarised (one line each) unless --no-summary
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Preset:
    """Model shape of a demo preset. ``noise_rank``: low-rank draft noise (None: a full V x V
    table). ``gpu_only``: refuse on a CPU backend. ``exact``: the greedy self-check decides the
    exit code (float64); in bfloat16 the tree forward and plain decoding round differently, so a
    near-tie may flip and the check only reports where the outputs first differ."""

    vocab: int
    hidden: int
    dtype: str
    noise_rank: "int | None" = None
    gpu_only: bool = False
    exact: bool = True


PRESETS = {
    "tiny": Preset(VOCAB, HIDDEN, "float64"),
    "8b": Preset(128256, 4096, "bfloat16", noise_rank=64, gpu_only=True, exact=False),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .cli import add_backend_option, bounded_float, bounded_int

    add_backend_option(parser)
    parser.add_argument("--steps", "-S", type=bounded_int(1, MAX_STEPS), default=4, help="draft steps S (default 4)")
    parser.add_argument("--topk", "-K", type=bounded_int(1, MAX_TOPK), default=4,
                        help=f"top-k per draft step K, 1..{MAX_TOPK} (draft_topk's limit; default 4)")
    parser.add_argument("--draft-tokens", "-N", type=bounded_int(1, 1 + MAX_TOPK + (MAX_STEPS - 1) * MAX_TOPK ** 2),
                        default=None, help=f"tree nodes N incl. the root, at most 1 + K + (S-1)K^2 "
                                           f"(default {DEFAULT_DRAFT_TOKENS}, or that bound when smaller)")
    parser.add_argument("--temperature", type=bounded_float(0.0, 1000.0), default=0.0,
                        help="0 = greedy (default), > 0 = sampling")
    parser.add_argument("--page-size", type=bounded_int(1, MAX_PAGE_SIZE), default=16, help="KV cache page size (default 16)")
    parser.add_argument("--hybrid", action=argparse.BooleanOptionalAction, default=True,
                        help="target with a recurrent (Mamba-like) layer (default: on)")
    parser.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="run the draft loop through a GraphRunner (default: on)")
    parser.add_argument("--max-tokens", type=bounded_int(1, MAX_TOKENS), default=32,
                        help="tokens to generate per request (default 32)")
    parser.add_argument("--batch-size", type=bounded_int(1, MAX_BATCH), default=2,
                        help="requests (default 2; prompts are rotations of one)")
    parser.add_argument("--seed", type=bounded_int(0, 2**63 - 1), default=0, help="seed of the sampling coins (default 0)")
    parser.add_argument("--grammar", action="store_true",
                        help="constrain the output with a small regular language (running token sum mod 3 never 0) "
                             "through vocabulary bitmasks; greedy output is checked against constrained greedy decoding")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                        help="model shape: tiny (V=64, H=16, float64; default) or 8b (V=128256, H=4096, bfloat16; GPU only)")
    parser.add_argument("--summary", action=argparse.BooleanOptionalAction, default=None,
                        help=f"one digest line per request instead of its tokens (default: on above {SUMMARY_ABOVE} requests)")


def check_arguments(args: argparse.Namespace) -> None:
    """The checks that involve several options (each option's own bound is its argparse type)."""
    from .cli import fail

    most_nodes = 1 + args.topk + (args.steps - 1) * args.topk ** 2
    if args.draft_tokens is None:  # not given: the default, shrunk to what S and K can fill
        args.draft_tokens = min(DEFAULT_DRAFT_TOKENS, most_nodes)
    if args.draft_tokens > most_nodes:
        fail(f"argument --draft-tokens/-N: expected at most 1 + K + (S-1)K^2 = {most_nodes} tree nodes for "
             f"--steps {args.steps} --topk {args.topk}, got {args.draft_tokens}")
    preset = PRESETS[args.preset]
    width = len(DEFAULT_PROMPT) + args.max_tokens * (args.steps + 1) + args.draft_tokens + 1
    cache_bytes = 2 * args.batch_size * (width + args.page_size) * preset.hidden * DTYPE_BYTES[preset.dtype]
    if cache_bytes > MAX_CACHE_BYTES:
        fail(f"arguments --batch-size x --max-tokens: the demo's KV cache would need {cache_bytes / 2**30:.1f} GiB "
             f"(at most {MAX_CACHE_BYTES >> 30} GiB); lower one of them")


class ProgressBar:
    """A plain-text progress bar on stderr (carriage return, no dependency)."""

    def __init__(self, width: int = 32, stream=sys.stderr):
        self.width, self.stream = width, stream

    def __call__(self, done: int, total: int) -> None:
        filled = self.width * done // max(total, 1)
        self.stream.write(f"\rgenerating [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} tokens")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def prompts(batch_size: int) -> "torch.Tensor":
    import torch

    base = torch.tensor(DEFAULT_PROMPT, dtype=torch.int64)
    return torch.stack([base.roll(shift) for shift in range(batch_size)]) if batch_size else base[None, :0]


def run_demo(args: argparse.Namespace, out=None) -> int:
    """The ``spec-hal demo`` command (exit codes of :mod:`spec_hal.cli`)."""
    from .cli import EXIT_FAILED, EXIT_OK, fail, require_backend

    out = out or sys.stdout
    check_arguments(args)
    backend = require_backend(args.backend)
    preset = PRESETS[args.preset]
    if preset.gpu_only and backend.device.type == "cpu":
        fail(f"argument --preset: {args.preset} needs a GPU backend (V={preset.vocab} H={preset.hidden} {preset.dtype}: "
             f"2 GB of weights, seconds per round on a CPU); on {backend.name} use --preset tiny")

    import torch

    from .errors import InvalidInput
    from .testing.engine import EngineConfig, SpeculativeEngine
    from .testing.grammar import ModularSumGrammar
    from .testing.models import NoisyDraftModel, TargetModel

    if backend.device.type == "cpu":
        # The models are tiny (16 x 64 matmuls): one thread avoids OpenMP start-up and spinning,
        # which costs far more than the work on a loaded 2-core machine.
        torch.set_num_threads(1)
    config = EngineConfig(steps=args.steps, topk=args.topk, draft_tokens=args.draft_tokens, page_size=args.page_size,
                          temperature=args.temperature, graphs=args.graphs, max_tokens=args.max_tokens,
                          grammar=ModularSumGrammar(vocab_size=preset.vocab, modulus=3) if args.grammar else None)
    target = TargetModel(vocab_size=preset.vocab, hidden_size=preset.hidden, recurrent=args.hybrid, context_gain=CONTEXT_GAIN,
                         dtype=getattr(torch, preset.dtype), device=backend.device if preset.gpu_only else None)
    draft = NoisyDraftModel(target, noise=DRAFT_NOISE, noise_rank=preset.noise_rank)
    prompt = prompts(args.batch_size)
    try:
        warmup_s = _untimed_first_run(target, draft, backend, config, prompt, args.seed, out)
        engine = SpeculativeEngine(target, draft, ops=backend, config=config, timing=True, device_timing=True)
        start = time.perf_counter()
        result = engine.generate(prompt, generator=torch.Generator().manual_seed(args.seed), progress=ProgressBar())
    except InvalidInput as exc:  # the checks above should make this unreachable: say which op objected
        fail(f"an op rejected the configuration: {exc}")
    elapsed = time.perf_counter() - start
    _print_report(out, backend, config, args, prompt, result, elapsed, engine, compiled_before=warmup_s is not None)
    if warmup_s is not None:
        print(f"first run, untimed (kernel compilation, graph capture, first calls): {warmup_s * 1e3:.0f} ms; "
              f"timed run: {elapsed * 1e3:.0f} ms", file=out)
    if config.grammar is not None:
        in_language = config.grammar.accepts(result.tokens)
        print(f"output in the grammar's language: {'yes' if in_language else 'NO'}", file=out)
        if not in_language:
            return EXIT_FAILED
    if config.temperature == 0:
        return _greedy_check(target, prompt.to(backend.device), result.tokens, preset, out, grammar=config.grammar)
    return EXIT_OK


def _untimed_first_run(target, draft, backend, config, prompt, seed, out):
    """Run the generation once untimed where kernels compile on first use (GPU backends): the
    timed run then measures ops, not compilation. Returns its wall time, or None (no run)."""
    import torch

    from .testing.engine import SpeculativeEngine

    if backend.device.type == "cpu":
        return None
    print("first run (compiles kernels, captures graphs; untimed) ...", file=sys.stderr)
    start = time.perf_counter()
    SpeculativeEngine(target, draft, ops=backend, config=config).generate(prompt, generator=torch.Generator().manual_seed(seed))
    if backend.device.type == "cuda":
        torch.cuda.synchronize(backend.device)
    return time.perf_counter() - start


def _greedy_check(target, prompt, tokens, preset: Preset, out, *, grammar=None) -> int:
    """Compare with plain (with ``grammar``: constrained) greedy decoding of the target; exit code
    1 on a difference (exact presets), else report where the outputs first differ."""
    import torch

    expected = (grammar.greedy(target, prompt, tokens.shape[1]) if grammar is not None else target.greedy(prompt, tokens.shape[1])).cpu()
    same = torch.equal(tokens, expected)
    kind = "constrained greedy" if grammar is not None else "greedy"
    print(f"speculative output == {kind} target output: {'yes' if same else 'NO'}", file=out)
    if same or preset.exact:
        return 0 if same else 1
    differs = (tokens != expected).any(dim=0).nonzero()
    print(f"  ({preset.dtype}: first difference at token {int(differs[0])} of {tokens.shape[1]}; the tree forward and "
          f"plain decoding round differently, so near-ties can flip; the exact check is --preset tiny)", file=out)
    return 0


def _print_report(out, backend, config, args, prompt, result, elapsed, engine, *, compiled_before: bool = False) -> None:
    providers = backend.describe_providers()
    used = [op for op in OPS_USED if not (op == "verify_sampling" and config.temperature == 0)
            and not (op == "verify_greedy" and config.temperature > 0)
            and not ("mamba" in op and not args.hybrid)]
    print(f"backend: {backend.name} (device {backend.device})", file=out)
    for op in used:
        print(f"  {op:<20} {providers[op]}", file=out)
    model = "hybrid (attention + recurrent layer)" if args.hybrid else "attention only"
    graph = engine._graph.mode if engine._graph is not None else "off"
    preset = PRESETS[args.preset]
    noise = "noise" if preset.noise_rank is None else f"rank-{preset.noise_rank} noise"
    print(f"model: target {model}, V={preset.vocab} H={preset.hidden} {preset.dtype} (preset {args.preset}); "
          f"draft = target head + {noise}", file=out)
    print(f"config: S={config.steps} K={config.topk} N={config.draft_tokens} page_size={config.page_size} "
          f"temperature={config.temperature} graphs={graph} batch={prompt.shape[0]} seed={args.seed}", file=out)
    summary = args.summary if args.summary is not None else prompt.shape[0] > SUMMARY_ABOVE
    accepted = (result.accept_lens * result.active).sum(dim=0).tolist()
    active_rounds = result.active.sum(dim=0).tolist()
    for row, tokens in enumerate(result.tokens.tolist()):
        if summary:
            print(f"request {row}: {len(tokens)} tokens, first {tokens[:4]}, "
                  f"mean acceptance {accepted[row] / max(active_rounds[row], 1):.2f}", file=out)
        else:
            print(f"request {row}: prompt {prompt[row].tolist()}", file=out)
            print(f"  generated {tokens}", file=out)
    print(f"rounds (target verify steps): {result.rounds}", file=out)
    print(f"mean acceptance length: {result.mean_acceptance_length:.2f} (accepted drafts + 1 per verify)", file=out)
    print(f"tokens per target step: {result.tokens_per_target_step:.2f} (plain decoding: 1.00)", file=out)
    from .demo_timing import draft_forwards_seconds, step_report

    forwards = draft_forwards_seconds(engine, prompt.shape[0]) if engine._graph is not None else None
    for line in step_report(result.timings, result.rounds, device_events=engine.timer.device_events, draft_forwards_s=forwards,
                            compiled_before=compiled_before):
        print(line, file=out)
    print(f"wall time of the timed run: {elapsed * 1e3:.0f} ms", file=out)
