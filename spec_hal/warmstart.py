"""Warm start: compile the kernels for the shapes an engine will serve, before it serves them.

Triton compiles a kernel on its first launch for each specialisation (dtypes, constexpr block
sizes picked from the shapes, ints equal to 1 or divisible by 16, pointer alignment). An engine
that does not warm up pays that on its first requests: about 6 s on the H100 demo (7221 ms cold,
1311 ms with Triton's on-disk cache warm). :func:`warmup` runs every op once per batch size on
synthetic inputs of the given sizes and reports what each first call cost and how many kernels it
compiled; ``spec-hal warmup`` does the same from the command line.

Across processes, Triton's on-disk cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``) keeps
every compiled kernel: a second process that warms up the same shapes loads them from disk
instead of compiling (it still pays the per-process load and launcher set-up, the "warm" figure
above). Point ``TRITON_CACHE_DIR`` at a persistent volume in containers so that restarts reuse it.

The report separates compile time from op time: the first call of an op is compile (or cache
load) plus one run; a second call right after is the op's own time.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Callable, Optional, Sequence

import torch

DEFAULT_BATCH_SIZES = (1, 8, 64)


@dataclasses.dataclass(frozen=True)
class WarmupEntry:
    op: str
    batch_size: int
    first_call_ms: float  # compile (or on-disk cache load) + one run
    second_call_ms: float  # the op alone
    kernels_compiled: Optional[int]  # new Triton specialisations; None without Triton kernels


@dataclasses.dataclass(frozen=True)
class WarmupReport:
    backend: str
    device: str
    entries: tuple[WarmupEntry, ...]
    triton_cache_dir: Optional[str]

    @property
    def kernels_compiled(self) -> int:
        return sum(entry.kernels_compiled or 0 for entry in self.entries)

    @property
    def total_ms(self) -> float:
        return sum(entry.first_call_ms for entry in self.entries)

    def format(self) -> str:
        lines = [f"warmup on {self.backend} ({self.device}): {self.kernels_compiled} kernel specialisations compiled or "
                 f"loaded in {self.total_ms:.0f} ms; Triton cache: {self.triton_cache_dir or '-'}",
                 f"  {'op':<22} {'bs':>5} {'first call ms':>14} {'second ms':>10} {'kernels':>8}"]
        for e in self.entries:
            kernels = "-" if e.kernels_compiled is None else str(e.kernels_compiled)
            lines.append(f"  {e.op:<22} {e.batch_size:>5} {e.first_call_ms:>14.1f} {e.second_call_ms:>10.2f} {kernels:>8}")
        return "\n".join(lines)


def _jit_functions() -> list:
    """Every Triton JITFunction of spec_hal's kernel modules (empty when they are not loaded)."""
    if "spec_hal.kernels" not in sys.modules or sys.modules["spec_hal.kernels"].loaded_mode() is None:
        return []
    from triton.runtime.jit import JITFunction

    from .kernels import kernel_modules

    return [value for module in kernel_modules() for value in vars(module).values() if isinstance(value, JITFunction)]


def _compiled_count() -> Optional[int]:
    """Compiled specialisations held by the kernels' in-process caches (Triton 3.6 to 3.9 keep
    them as the first element of ``device_caches[device]``); None when unknown."""
    functions = _jit_functions()
    if not functions:
        return None
    try:
        return sum(len(entry[0]) for fn in functions for entry in fn.device_caches.values())
    except (AttributeError, TypeError, IndexError):
        return None


def _triton_cache_dir() -> Optional[str]:
    try:
        from triton import knobs

        return str(knobs.cache.dir)
    except (ImportError, AttributeError):
        import os

        return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The serving sizes to compile for."""

    vocab: int = 32000
    hidden: int = 256
    topk: int = 4
    num_steps: int = 3
    num_nodes: int = 8
    page_size: int = 16
    logits_dtype: torch.dtype = torch.bfloat16
    hidden_dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype = torch.bfloat16


def _calls(bs: int, shapes: Shapes, device: torch.device) -> list[tuple[str, Callable[[], object]]]:
    """(op, call) for every op at batch size ``bs``; later calls use earlier calls' results."""
    import spec_hal

    gen = torch.Generator().manual_seed(bs)
    K, S, N, V, H = shapes.topk, shapes.num_steps, shapes.num_nodes, shapes.vocab, shapes.hidden

    def rand(*size, dtype=torch.float32):
        return torch.rand(*size, generator=gen).to(device=device, dtype=dtype)

    state: dict = {}
    logits = rand(bs, V, dtype=shapes.logits_dtype)
    lane_logits = rand(bs * K, V, dtype=shapes.logits_dtype)
    hidden = rand(bs, H, dtype=shapes.hidden_dtype)
    seq_lens = torch.randint(1, 100, (bs,), generator=gen).to(device)
    slots_per_request = N + S * K * shapes.page_size * 2
    kv = torch.zeros(bs * slots_per_request + 1, 2, 64, dtype=shapes.kv_dtype, device=device)

    def draft():
        state["probs"], state["ids"] = spec_hal.draft_topk(logits, K)

    def expand():
        level = spec_hal.expand_tree(0, None, state["probs"], state["ids"], hidden=hidden)
        records = [level.record]
        for step in range(1, S):
            probs, ids = spec_hal.draft_topk(lane_logits, K)
            level = spec_hal.expand_tree(step, level.scores, probs, ids, hidden=level.hidden)
            records.append(level.record)
        state["records"] = records

    def organize():
        state["organized"] = spec_hal.organize_draft(state["records"], N)

    def build():
        parents, selected, draft_tokens = state["organized"]
        state["tree"] = spec_hal.build_tree(state["ids"][:, 0], parents, selected, draft_tokens, seq_lens, topk=K)

    def verify_greedy():
        tree = state["tree"]
        state["verdict"] = spec_hal.verify_greedy(tree, tree.tokens.view(bs, N), rand(bs * N, V, dtype=shapes.logits_dtype))

    def verify_sampling():
        tree = state["tree"]
        spec_hal.verify_sampling(tree, tree.tokens.view(bs, N), rand(bs, N, V), rand(bs, N), rand(bs))

    def verify_chain():
        spec_hal.verify_chain(state["tree"].tokens.view(bs, N), rand(bs * N, V, dtype=shapes.logits_dtype))

    def verify_chain_sampling():
        ids = state["tree"].tokens.view(bs, N)[:, 1:]
        spec_hal.verify_chain_sampling(ids, rand(bs, N - 1, V), rand(bs, N, V), rand(bs, N - 1), rand(bs))

    def compaction():
        spec_hal.bonus_tokens(state["verdict"])
        spec_hal.compact_accepted(rand(bs * N, H, dtype=shapes.hidden_dtype), state["verdict"])

    def kv_moves():
        node_slots = torch.arange(bs * N, device=device).view(bs, N) + 1
        src, dst = spec_hal.accepted_kv_moves(state["verdict"], node_slots)
        spec_hal.move_kv([kv], src, dst)
        table = torch.arange(bs * slots_per_request, device=device).view(bs, slots_per_request)
        spec_hal.assign_draft_slots(table, req_pool_indices=torch.arange(bs, device=device), seq_lens=seq_lens % 4,
                                    num_steps=S, topk=K, page_size=shapes.page_size)

    def mamba():
        layers, slots = 2, bs + 1
        ssm, conv = torch.zeros(layers, slots, 16, 16, device=device), torch.zeros(layers, slots, 4, 64, device=device,
                                                                                    dtype=shapes.hidden_dtype)
        spec_hal.commit_mamba_state(verdict=state["verdict"], seq_lens=seq_lens, slots=torch.arange(bs, device=device),
                                    ssm_state=ssm, ssm_intermediate=torch.zeros(layers, bs, N, 16, 16, device=device),
                                    conv_state=conv, conv_intermediate=torch.zeros(layers, bs, N, 4, 64, device=device,
                                                                                   dtype=shapes.hidden_dtype))

    return [("draft_topk", draft), ("expand_tree", expand), ("organize_draft", organize), ("build_tree", build),
            ("verify_greedy", verify_greedy), ("verify_sampling", verify_sampling), ("verify_chain", verify_chain),
            ("verify_chain_sampling", verify_chain_sampling), ("bonus+compact", compaction),
            ("kv moves+slots", kv_moves), ("commit_mamba_state", mamba)]


def _timed_ms(fn: Callable[[], object], device: torch.device) -> float:
    begin = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - begin) * 1e3


def warmup(
    ops: Optional[Sequence[str]] = None,
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    shapes: Optional[Shapes] = None,
    device: "torch.device | str | None" = None,
    verbose: bool = False,
) -> WarmupReport:
    """Compile (or load from Triton's on-disk cache) every kernel the ops launch at these sizes.

    ``ops``: names as in the report (``draft_topk``, ``verify_greedy``, ``kv moves+slots``...;
    default all; the steps that build the tree always run, since later ops need a tree).
    ``batch_sizes``: the batch sizes to serve (block sizes and int specialisations depend on them).
    ``shapes``: vocabulary, hidden size, K, S, N, page size and dtypes (:class:`Shapes`).
    ``device``: default the current GPU, else cpu. Returns a :class:`WarmupReport` (printed with
    ``verbose``).
    """
    from .selection import backend_for_device

    shapes = shapes or Shapes()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    backend = backend_for_device(device)
    required = {"draft_topk", "expand_tree", "organize_draft", "build_tree", "verify_greedy"}
    entries = []
    for bs in batch_sizes:
        for op, call in _calls(bs, shapes, device):
            if ops is not None and op not in ops and op not in required:
                continue
            before = _compiled_count()
            first = _timed_ms(call, device)
            after = _compiled_count()
            second = _timed_ms(call, device)
            compiled = None if before is None and after is None else (after or 0) - (before or 0)
            entries.append(WarmupEntry(op, bs, first, second, compiled))
    report = WarmupReport(backend.name, str(device), tuple(entries), _triton_cache_dir() if _jit_functions() else None)
    if verbose:
        print(report.format())
    return report


# ---------------------------------------------------------------------------------------------
# spec-hal warmup


def run_warmup(args: argparse.Namespace) -> int:
    """``spec-hal warmup`` (options: ``spec_hal.cli.add_warmup_arguments``)."""
    dtype = getattr(torch, args.dtype)
    shapes = Shapes(vocab=args.vocab, hidden=args.hidden, topk=args.topk, num_steps=args.steps, num_nodes=args.draft_tokens,
                    page_size=args.page_size, logits_dtype=dtype, hidden_dtype=dtype, kv_dtype=dtype)
    warmup(args.ops, batch_sizes=[int(size) for size in args.batch_sizes], shapes=shapes, device=args.device, verbose=True)
    return 0
