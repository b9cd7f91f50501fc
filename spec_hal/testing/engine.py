"""A reference speculative-decoding engine loop built only from spec_hal ops (issue 7).

One round, for bs requests with S draft steps, top-k K and N tree nodes::

    draft        run_draft (draft_topk, expand_tree), optionally inside a GraphRunner
    tree         organize_draft, build_tree (qlen mask)
    target       the target forward over the N tree nodes; K/V written to the paged cache at
                 slots[b, j] = req_to_token[req_b, seq_len_b + j], the recurrent state after every
                 node kept as scratch (the model, not an op)
    verify       verify_greedy (fused argmax over the target logits) or verify_sampling
    compaction   bonus_tokens, compact_accepted (the emitted tokens, root-first order)
    kv           accepted_kv_moves, move_kv (the accepted path becomes contiguous in the cache)
    mamba        commit_mamba_state (the last accepted node's recurrent state becomes live)
    draft extend the draft's first top-k for the new root (model + draft_topk)

Conventions: ``seq_lens[b]`` tokens of request b have K/V (and recurrent state) committed; the
root of the next tree is the token at position ``seq_lens[b]`` (the last bonus token, or the last
prompt token after prefill). The prefill commits the prompt without its last token, so the very
first generated token is produced by a verify too. A round emits ``accept_lens[b]`` tokens per
request (accepted drafts and the bonus).

Everything inside a round runs on the backend's device without a host read; the only host read is
the end-of-round check "every request has max_tokens tokens". Random coins (sampling) are drawn
from a seeded ``torch.Generator`` on the host before the round and copied to the device, outside
the sync guard. Timing (``timing=True``) times every op call and model forward of a round as a
named section (``Generation.timings``): host wall time with the device synchronised around each
section (only then), or with ``device_timing=True`` on CUDA device time from CUDA events and no
synchronisation inside a round. Under ``graphs=True`` the captured draft + tree is one section.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..graphs import GraphRunner
from ..types import DraftState, DraftTree
from .models import DTYPE


@dataclass(frozen=True)
class EngineConfig:
    """S draft steps, top-k K, N tree nodes (root included); temperature 0 is greedy."""

    steps: int
    topk: int
    draft_tokens: int
    page_size: int = 1
    temperature: float = 0.0
    graphs: bool = False
    max_tokens: int = 16
    grammar: Optional[object] = None  # e.g. testing.grammar.ModularSumGrammar: constrains the output
    max_rounds: Optional[int] = None  # stop after this many rounds even if tokens are missing (fixed-length runs)


@dataclass
class Generation:
    """What ``SpeculativeEngine.generate`` returns (host tensors).

    tokens:       (bs, max_tokens) int64 generated tokens.
    accept_lens:  (rounds, bs) int64 tokens emitted per request per round.
    active:       (rounds, bs) bool: the request still needed tokens in that round.
    timings:      section (op name or model forward) -> seconds (empty unless timing was enabled).
    """

    tokens: torch.Tensor
    accept_lens: torch.Tensor
    active: torch.Tensor
    timings: dict = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return self.accept_lens.shape[0]

    @property
    def mean_acceptance_length(self) -> float:
        """Mean tokens emitted per verify per request (accepted drafts + 1), over active rounds."""
        return float(self.accept_lens[self.active].double().mean()) if self.active.any() else 0.0

    @property
    def tokens_per_target_step(self) -> float:
        """Generated tokens per request per target verify forward (plain decoding: 1.0)."""
        return self.tokens.shape[1] / max(self.rounds, 1)


# Timing sections that are not one op: model forwards, and the draft loop (model forwards and ops).
TARGET, PREFILL, DRAFT_EXTEND_MODEL = "target forward", "prefill (target)", "draft extend: model"
DRAFT_LOOP = "run_draft (draft model + draft_topk + expand_tree)"
DRAFT_TREE_GRAPH = "draft + tree (GraphRunner: draft model + ops)"
MODEL_SECTIONS = (TARGET, PREFILL, DRAFT_EXTEND_MODEL)
MIXED_SECTIONS = (DRAFT_LOOP, DRAFT_TREE_GRAPH)


class Timer:
    """Time per section (an op, or a model forward), only when enabled.

    Off CUDA, or without ``device_events``: host wall time, the device synchronised around each
    section. With ``device_events`` on CUDA: device time between two CUDA events recorded around
    the section, no synchronisation inside a round (the events are read once, by ``totals()``).
    """

    def __init__(self, device: torch.device, *, enabled: bool, device_events: bool = False):
        self.device, self.enabled = device, enabled
        self.device_events = device_events and device.type == "cuda"
        self.seconds: "OrderedDict[str, float]" = OrderedDict()
        self._events: list = []

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def section(self, family: str):
        if not self.enabled:
            yield
            return
        if self.device_events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.seconds.setdefault(family, 0.0)  # first-use order
            self._events.append((family, start, end))
            return
        self._sync()
        start = time.perf_counter()
        yield
        self._sync()
        self.seconds[family] = self.seconds.get(family, 0.0) + time.perf_counter() - start

    def totals(self) -> "OrderedDict[str, float]":
        """Seconds per section so far (reads the recorded events: one device synchronisation)."""
        if self._events:
            self._sync()
            for family, start, end in self._events:
                self.seconds[family] += start.elapsed_time(end) / 1e3
            self._events.clear()
        return OrderedDict(self.seconds)


class PagedKVCache:
    """Target K/V in pages of ``page_size`` slots, addressed through ``req_to_token``.

    keys, values: (num_slots, H) in ``dtype``; slot 0..page_size-1 (page 0) is never handed out.
    req_to_token: (R, width) int64, position -> slot, built from a shuffled page table so that
    consecutive pages of a request are not adjacent in the pool.
    """

    def __init__(self, *, rows: int, width: int, page_size: int, hidden_size: int, device, seed: int = 0,
                 dtype: torch.dtype = DTYPE):
        pages_per_row = math.ceil(width / page_size)
        generator = torch.Generator().manual_seed(seed)
        page_table = (torch.randperm(rows * pages_per_row, generator=generator) + 1).view(rows, pages_per_row)
        slots = page_table[:, :, None] * page_size + torch.arange(page_size)
        self.page_size = page_size
        self.req_to_token = slots.reshape(rows, -1)[:, :width].contiguous().to(device)
        num_slots = (rows * pages_per_row + 1) * page_size
        self.keys = torch.zeros(num_slots, hidden_size, dtype=dtype, device=device)
        self.values = torch.zeros(num_slots, hidden_size, dtype=dtype, device=device)


def tree_parents(mask: torch.Tensor) -> torch.Tensor:
    """(bs, N) int64 local parent node of every node (-1 for the root) from a qlen mask (bs, N, N):
    the deepest ancestor other than the node itself."""
    nodes = mask.shape[-1]
    depth = mask.sum(dim=-1) - 1
    ancestors = mask & ~torch.eye(nodes, dtype=torch.bool, device=mask.device)
    ranked = torch.where(ancestors, depth[:, None, :], torch.full_like(depth[:, None, :], -1))
    parents = ranked.argmax(dim=-1)
    parents[:, 0] = -1
    return parents


class SpeculativeEngine:
    """Speculative decoding of a :class:`~spec_hal.testing.TargetModel` with a draft model.

    ``ops`` runs every spec_hal op (the backend under test; tests pass a deliberately broken one).
    ``draft`` follows the run_draft interface. ``guard`` is a context-manager factory wrapped
    around the device work of each round (the conformance suite passes ``no_host_sync``).
    """

    def __init__(self, target, draft, *, ops, config: EngineConfig, timing: bool = False, device_timing: bool = False,
                 guard: Optional[Callable] = None, run_draft: Optional[Callable] = None):
        from ..draft_loop import run_draft as default_run_draft

        self.target, self.draft, self.ops, self.config = target, draft, ops, config
        self.device = ops.device
        self.target.to(self.device)  # weights on the device once: copies inside a round would sync
        self.draft.to(self.device)
        self.timer = Timer(self.device, enabled=timing, device_events=device_timing)
        self.guard = guard or (lambda device: contextlib.nullcontext())
        self.run_draft = run_draft or default_run_draft
        self._graph: Optional[GraphRunner] = None

    # -- target forward over a tree (or a chain: the prefill) ---------------------------------

    def _target_forward(self, tokens, positions, parents, tree_allowed, slots, seq_lens, live):
        """Forward of M nodes per request: tokens/positions/parents/slots (bs, M), tree_allowed
        (bs, M, M), seq_lens (bs,) committed prefix, live (ssm (bs, H), conv (bs, W, H)) or None.

        Writes the nodes' K/V to ``slots``, attends prefix + allowed nodes through the cache.
        Returns logits (bs, M, V) and the recurrent state after every node (ssm (bs, M, H),
        conv (bs, M, W, H)) or None.
        """
        target, cache = self.target, self.cache
        bs, nodes = tokens.shape
        hidden = target.embed(tokens)
        states = None
        if target.recurrent:
            ssm = torch.empty(bs, nodes + 1, *live[0].shape[1:], dtype=live[0].dtype, device=self.device)
            conv = torch.empty(bs, nodes + 1, *live[1].shape[1:], dtype=live[1].dtype, device=self.device)
            ssm[:, 0], conv[:, 0] = live
            rows = torch.arange(bs, device=self.device)
            for j in range(nodes):  # parents precede children: node j's parent state is ready
                parent = parents[:, j] + 1
                ssm[:, j + 1], conv[:, j + 1] = target.recurrent_step(hidden[:, j], ssm[rows, parent], conv[rows, parent])
            states = (ssm[:, 1:], conv[:, 1:])
            hidden = hidden + target.recurrent_gain * states[0]
        keys, values = target.keys_values(hidden, positions)
        cache.keys[slots] = keys
        cache.values[slots] = values
        prefix = cache.req_to_token[self.req_pool_indices]  # (bs, width): every position's slot
        in_prefix = torch.arange(prefix.shape[1], device=self.device) < seq_lens[:, None]
        all_keys = torch.cat([cache.keys[prefix], cache.keys[slots]], dim=1)
        all_values = torch.cat([cache.values[prefix], cache.values[slots]], dim=1)
        allowed = torch.cat([in_prefix[:, None, :].expand(bs, nodes, -1), tree_allowed], dim=2)
        logits = target.head(target.attention(hidden, positions, all_keys, all_values, allowed))
        return logits, states

    # -- set-up --------------------------------------------------------------------------------

    def _allocate(self, prompt: torch.Tensor) -> None:
        cfg = self.config
        bs, prompt_len = prompt.shape
        width = prompt_len + cfg.max_tokens * (cfg.steps + 1) + cfg.draft_tokens + 1
        self.req_pool_indices = torch.arange(bs, device=self.device).flip(0)  # pool row != batch row
        self.cache = PagedKVCache(rows=bs, width=width, page_size=cfg.page_size, hidden_size=self.target.hidden_size,
                                  device=self.device, dtype=getattr(self.target, "dtype", DTYPE))
        if self.target.recurrent:
            ssm, conv = self.target.initial_recurrent_state(bs + 2, self.device)
            self.ssm_pool, self.conv_pool = ssm[None], conv[None]  # (L=1, slots, ...); slot 0 unused
            self.mamba_slots = torch.arange(bs, device=self.device) + 2

    def live_recurrent_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed (ssm (bs, H), conv (bs, W, H)) of every request."""
        return self.ssm_pool[0, self.mamba_slots], self.conv_pool[0, self.mamba_slots]

    def _prefill(self, prompt: torch.Tensor) -> None:
        """Commit the prompt without its last token (K/V and recurrent state)."""
        bs, length = prompt.shape[0], prompt.shape[1] - 1
        columns = torch.arange(length, device=self.device)
        positions = columns.expand(bs, length)
        causal = torch.ones(length, length, dtype=torch.bool, device=self.device).tril().expand(bs, -1, -1)
        slots = self.cache.req_to_token[self.req_pool_indices, :length]
        live = self.target.initial_recurrent_state(bs, self.device) if self.target.recurrent else None
        _, states = self._target_forward(prompt[:, :-1], positions, (columns - 1).expand(bs, length), causal, slots,
                                         torch.zeros(bs, dtype=torch.int64, device=self.device), live)
        if states is not None:
            last = torch.full((bs,), length - 1, dtype=torch.int64, device=self.device)
            self.ops.scatter_mamba_state(dst=self.ssm_pool, src=states[0][None], dst_slots=self.mamba_slots, src_steps=last)
            self.ops.scatter_mamba_state(dst=self.conv_pool, src=states[1][None], dst_slots=self.mamba_slots, src_steps=last)

    # -- draft -------------------------------------------------------------------------------

    def _draft_extend(self, roots: torch.Tensor, seq_lens: torch.Tensor) -> DraftState:
        """The draft's first top-k for each root (by the EAGLE shift it runs at position seq_len - 1)."""
        with self.timer.section(DRAFT_EXTEND_MODEL):
            logits, _ = self.draft(roots, seq_lens - 1, None, 0)
        with self.timer.section("draft_topk (extend)"):
            probs, ids = self.ops.draft_topk(logits, self.config.topk)
        return DraftState(roots=roots, positions=seq_lens, probs=probs, ids=ids)

    def _draft_tree_tensors(self, *, roots, positions, probs, ids) -> dict:
        """Draft loop + tree building as batch-first tensors (the function a GraphRunner captures)."""
        cfg = self.config
        state = DraftState(roots=roots, positions=positions, probs=probs, ids=ids)
        # Inside a captured graph nothing may synchronise: the runner's call is timed as a whole.
        section = self.timer.section if not cfg.graphs else (lambda family: contextlib.nullcontext())
        with section(DRAFT_LOOP):
            result = self.run_draft(self.draft, state, steps=cfg.steps, topk=cfg.topk, backend=self.ops)
        with section("organize_draft"):
            parents, selected, draft_tokens = self.ops.organize_draft(result.records, cfg.draft_tokens)
        with section("build_tree"):
            tree = self.ops.build_tree(roots, parents, selected, draft_tokens, positions, topk=cfg.topk)
        bs = roots.shape[0]
        return {"tokens": tree.tokens.view(bs, -1), "positions": tree.positions.view(bs, -1),
                "retrieve_index": tree.retrieve_index, "retrieve_next_token": tree.retrieve_next_token,
                "retrieve_next_sibling": tree.retrieve_next_sibling, "mask": tree.mask, "parents": tree.parents, "depth": tree.depth}

    def _build_graph(self, batch_size: int) -> None:
        """Capture draft + tree for this batch size (capture synchronises: never inside the guard)."""
        index = torch.empty(0, dtype=torch.int64, device=self.device)
        top = torch.empty(0, self.config.topk, device=self.device)
        examples = {"roots": index, "positions": index, "probs": top.float(), "ids": top.long()}
        self._graph = GraphRunner(self._draft_tree_tensors, inputs=examples, batch_sizes=(batch_size,))

    def _draft_tree(self, state: DraftState) -> DraftTree:
        inputs = {"roots": state.roots, "positions": state.positions, "probs": state.probs, "ids": state.ids}
        if self.config.graphs:
            with self.timer.section(DRAFT_TREE_GRAPH):
                out = self._graph.run(**inputs)
        else:
            out = self._draft_tree_tensors(**inputs)
        return DraftTree(tokens=out["tokens"].reshape(-1), positions=out["positions"].reshape(-1),
                         retrieve_index=out["retrieve_index"], retrieve_next_token=out["retrieve_next_token"],
                         retrieve_next_sibling=out["retrieve_next_sibling"], mask=out["mask"], mask_mode="qlen",
                         num_steps=self.config.steps, parents=out["parents"], depth=out["depth"])

    # -- one round -----------------------------------------------------------------------------

    def _verify(self, tree: DraftTree, logits: torch.Tensor, coins, bitmask=None):
        bs, nodes = tree.batch_size, tree.num_nodes
        candidates = tree.tokens.view(bs, nodes)
        masks = {} if bitmask is None else {"token_bitmask": bitmask}
        logits = logits.reshape(bs * nodes, -1)
        if self.config.temperature == 0:
            return self.ops.verify_greedy(tree, candidates, logits, **masks)
        if bitmask is not None:  # the constrained distribution: mask the logits, then softmax
            logits = self.ops.apply_token_bitmask_(logits.clone(), bitmask)
        probs = torch.softmax(logits / self.config.temperature, dim=-1).float()
        return self.ops.verify_sampling(tree, candidates, probs, coins[0], coins[1], **masks)

    def _round(self, state: DraftState, seq_lens: torch.Tensor, coins, grammar_states=None):
        """One draft-verify-commit round. Returns (emitted (bs, N), verdict, new roots, grammar
        states after the emitted tokens (or None))."""
        ops, timer, bs = self.ops, self.timer, seq_lens.shape[0]
        tree = self._draft_tree(state)
        bitmask = states_at_nodes = None
        if grammar_states is not None:  # each node's mask row: the grammar after its path
            from .grammar import node_states

            states_at_nodes = node_states(self.config.grammar, tree, grammar_states)
            bitmask = self.config.grammar.bitmask(states_at_nodes)
        with timer.section(TARGET):
            nodes = tree.num_nodes
            slots = self.cache.req_to_token[self.req_pool_indices[:, None], seq_lens[:, None] + torch.arange(nodes, device=self.device)]
            live = self.live_recurrent_state() if self.target.recurrent else None
            logits, states = self._target_forward(tree.tokens.view(bs, nodes), tree.positions.view(bs, nodes),
                                                  tree_parents(tree.mask), tree.mask, slots, seq_lens, live)
        with timer.section("verify_greedy" if self.config.temperature == 0 else "verify_sampling"):
            verdict = self._verify(tree, logits, coins, bitmask)
        with timer.section("bonus_tokens"):
            roots = ops.bonus_tokens(verdict).long()
        with timer.section("compact_accepted"):
            emitted = ops.compact_accepted(verdict.predict, verdict).view(bs, nodes)
        with timer.section("accepted_kv_moves"):
            src, dst = ops.accepted_kv_moves(verdict, slots)
        with timer.section("move_kv"):
            ops.move_kv([self.cache.keys, self.cache.values], src, dst)
        if states is not None:
            with timer.section("commit_mamba_state"):
                ops.commit_mamba_state(verdict=verdict, seq_lens=seq_lens, slots=self.mamba_slots,
                                       ssm_state=self.ssm_pool, ssm_intermediate=states[0][None],
                                       conv_state=self.conv_pool, conv_intermediate=states[1][None])
        if states_at_nodes is not None:
            last = verdict.accept_index.long().gather(1, verdict.accept_lens.long()[:, None] - 1)[:, 0] % tree.num_nodes
            grammar_states = self.config.grammar.advance(states_at_nodes.gather(1, last[:, None])[:, 0], roots)
        return emitted, verdict, roots, grammar_states

    def _draw_coins(self, generator: Optional[torch.Generator], bs: int):
        if self.config.temperature == 0:
            return None
        coins = torch.rand(bs, self.config.draft_tokens, generator=generator)
        final = torch.rand(bs, generator=generator)
        return coins.to(self.device), final.to(self.device)

    def generate(self, prompt: torch.Tensor, *, generator: Optional[torch.Generator] = None,
                 progress: Optional[Callable[[int, int], None]] = None, first_round_hook=None) -> Generation:
        """Decode ``max_tokens`` tokens for each row of ``prompt`` (bs, L >= 2) int64.

        ``generator`` draws the sampling coins (temperature > 0). ``progress(done, total)`` is
        called after every round with the slowest request's token count. ``first_round_hook(
        engine, emitted, verdict)`` is called after the first round (tests inspect the state).
        """
        cfg, device = self.config, self.device
        prompt = prompt.to(device).long()
        bs = prompt.shape[0]
        self._allocate(prompt)
        width = cfg.max_tokens + cfg.steps + 2  # the last column is a sink for writes past the end
        out = torch.zeros(bs, width, dtype=torch.int64, device=device)
        out_lens = torch.zeros(bs, dtype=torch.int64, device=device)
        node_columns = torch.arange(cfg.draft_tokens, device=device)
        seq_lens = torch.full((bs,), prompt.shape[1] - 1, dtype=torch.int64, device=device)
        roots = prompt[:, -1].contiguous()
        if cfg.graphs:
            self._build_graph(bs)
        grammar_states = cfg.grammar.initial_state(bs, device) if cfg.grammar is not None else None
        with self.guard(device):
            with self.timer.section(PREFILL):
                self._prefill(prompt)
            state = self._draft_extend(roots, seq_lens)
        accept_history, active_history = [], []
        while True:
            coins = self._draw_coins(generator, bs)
            with self.guard(device):
                active_history.append(out_lens < cfg.max_tokens)
                emitted, verdict, roots, grammar_states = self._round(state, seq_lens, coins, grammar_states)
                accept_lens = verdict.accept_lens.long()
                columns = out_lens[:, None] + node_columns
                columns = torch.where((node_columns < accept_lens[:, None]) & (columns < width - 1), columns, width - 1)
                out.scatter_(1, columns, emitted.long())
                out_lens = out_lens + accept_lens
                seq_lens = seq_lens + accept_lens
                accept_history.append(accept_lens)
                state = self._draft_extend(roots, seq_lens)
            if first_round_hook is not None and len(accept_history) == 1:
                first_round_hook(self, emitted, verdict)
            slowest = int(out_lens.min())  # the one host read per round
            if progress is not None:
                progress(min(slowest, cfg.max_tokens), cfg.max_tokens)
            if slowest >= cfg.max_tokens or len(accept_history) == cfg.max_rounds:
                break
        return Generation(tokens=out[:, :cfg.max_tokens].cpu(), accept_lens=torch.stack(accept_history).cpu(),
                          active=torch.stack(active_history).cpu(), timings=dict(self.timer.totals()))
