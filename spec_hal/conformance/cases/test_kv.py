"""Conformance of family ``kv`` (``accepted_kv_moves``, ``move_kv``, ``assign_draft_slots``)
against the reference, docs/semantics.md §1.4's golden moves, the regression for upstream bug 4b and a KV ledger
over 1,000 simulated rounds of a paged KV pool. Semantics: spec_hal/kv.py."""
from __future__ import annotations

import pytest
import torch

from spec_hal.conformance.cases.test_compaction import embedded_verdict, run_compact, check_compaction_invariant
from spec_hal.conformance.guards import assert_rejects, embedded_input, guarded_output, no_host_sync
from spec_hal.conformance.verdicts import golden_tree_round, random_round, verdict_to
from spec_hal.kv import accepted_kv_moves as reference_accepted_kv_moves
from spec_hal.kv import assign_draft_slots as reference_assign_draft_slots
from spec_hal.kv import move_kv as reference_move_kv

SHAPES = ((0, 3, 4), (1, 3, 4), (3, 5, 8), (5, 3, 16), (64, 5, 32), (7, 1, 3))


def run_moves(backend, verdict, slots):
    width = verdict.accept_index.shape[1]
    size = verdict.batch_size * width
    src = guarded_output((size,), slots.dtype, backend.device)
    dst = guarded_output((size,), slots.dtype, backend.device)
    with no_host_sync(backend.device):
        backend.accepted_kv_moves(verdict, slots, out=(src.tensor, dst.tensor))
    src.assert_intact("src")
    dst.assert_intact("dst")
    return src.tensor.cpu(), dst.tensor.cpu()


def random_slots(bs, nodes, seed, dtype=torch.int64):
    """(bs, N) distinct slots, as a pool hands them out (shuffled, large ids for int64 offsets)."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randperm(bs * nodes * 3, generator=generator)[:bs * nodes] + 5).view(bs, nodes).to(dtype)


@pytest.mark.spec_hal_op("accepted_kv_moves")
def test_accepted_kv_moves_golden(backend):
    """docs/semantics.md §1.4: request 1 (path [0,2,3]) moves slot(seq+2) -> slot(seq+1), slot(seq+3) -> slot(seq+2);
    identities (every root, request 0's path [0,1]) are skipped; 2*(S+1) = 6 entries, not 2*N = 8."""
    round_ = golden_tree_round()
    slots = torch.tensor([[40, 41, 42, 43], [70, 71, 72, 73]])
    src, dst = run_moves(backend, verdict_to(round_.verdict, backend.device), slots.to(backend.device))
    assert src.tolist() == [-1, -1, -1, -1, 72, 73]
    assert dst.tolist() == [-1, -1, -1, -1, 71, 72]


@pytest.mark.spec_hal_op("accepted_kv_moves")
@pytest.mark.parametrize("bs, steps, nodes", SHAPES)
@pytest.mark.parametrize("slot_dtype", (torch.int32, torch.int64))
def test_accepted_kv_moves_matches_reference(backend, bs, steps, nodes, slot_dtype):
    round_ = random_round(bs, num_steps=steps, num_nodes=nodes, generator=torch.Generator().manual_seed(bs + 3 * nodes))
    slots_cpu = random_slots(bs, nodes, seed=nodes, dtype=slot_dtype)
    slots = embedded_input(slots_cpu, backend.device, margin_value=3) if bs else slots_cpu.to(backend.device)
    src, dst = run_moves(backend, embedded_verdict(round_.verdict, backend.device), slots)
    expected_src, expected_dst = reference_accepted_kv_moves(round_.verdict, slots_cpu)
    assert torch.equal(src, expected_src) and torch.equal(dst, expected_dst)


@pytest.mark.spec_hal_op("accepted_kv_moves")
def test_accepted_kv_moves_chain_is_identity(backend):
    """K = 1 (a chain, N = S+1): every accepted node already sits at its position; no move."""
    round_ = random_round(9, num_steps=4, num_nodes=5, generator=torch.Generator().manual_seed(2), chain=True)
    assert max(len(path) for path in round_.paths) > 2
    src, dst = run_moves(backend, verdict_to(round_.verdict, backend.device), random_slots(9, 5, seed=1).to(backend.device))
    assert (src == -1).all() and (dst == -1).all()


@pytest.mark.spec_hal_op("accepted_kv_moves")
def test_bug4_kv_moves_touch_only_accept_width(backend):
    """Upstream bug 4b: K > 1, N = 32 >> S+1 = 4, bs = 6. The moves have bs*(S+1) = 24 entries
    (canaries around both outputs, attractive margins around every input), and applying them
    makes positions seq_len + r hold the KV of the r-th accepted node."""
    bs, steps, nodes = 6, 3, 32
    round_ = random_round(bs, num_steps=steps, num_nodes=nodes, generator=torch.Generator().manual_seed(15360), stop_probability=0.05)
    slots_cpu = random_slots(bs, nodes, seed=7)
    src, dst = run_moves(backend, embedded_verdict(round_.verdict, backend.device), embedded_input(slots_cpu, backend.device, margin_value=3))
    assert src.shape == (bs * (steps + 1),)
    num_slots = bs * nodes * 3 + 5
    cache = guarded_output((num_slots, 2), torch.float32, backend.device)
    cache.tensor.copy_(torch.arange(num_slots * 2, dtype=torch.float32).view(num_slots, 2))
    before = cache.tensor.cpu().clone()
    src, dst = src.to(backend.device), dst.to(backend.device)
    with no_host_sync(backend.device):
        backend.move_kv([cache.tensor], src, dst)
    cache.assert_intact("cache")
    after = cache.tensor.cpu()
    for b, path in enumerate(round_.paths):
        for rank, node in enumerate(path):
            assert torch.equal(after[slots_cpu[b, rank]], before[slots_cpu[b, node]]), f"request {b} position seq+{rank}"
    compacted = run_compact(backend, embedded_verdict(round_.verdict, backend.device).predict, embedded_verdict(round_.verdict, backend.device))
    check_compaction_invariant(compacted, round_)


# ------------------------------------------------------------------------------------------
# move_kv


def _caches(num_slots, seed):
    """Caches of several dtypes and row shapes, one a strided view of a wider buffer, each
    inside a canary-guarded buffer."""
    generator = torch.Generator().manual_seed(seed)
    specs = [((num_slots, 4, 8), torch.bfloat16), ((num_slots, 4, 8), torch.bfloat16), ((num_slots, 33), torch.float32),
             ((num_slots, 1, 3), torch.int32), ((num_slots, 5), torch.float16)]
    return [(torch.randn(shape, generator=generator) * 100).to(dtype) for shape, dtype in specs]


def _guarded_caches(values, device):
    guarded = []
    for value in values:
        holder = guarded_output(tuple(value.shape), value.dtype, device)
        holder.tensor.copy_(value)
        guarded.append(holder)
    # One cache whose slot stride exceeds its row (a view of every other row of a wider buffer).
    wide = torch.zeros((values[0].shape[0] * 2,) + tuple(values[0].shape[1:]), dtype=values[0].dtype, device=device)
    strided = wide[::2]
    strided.copy_(values[0])
    return guarded, strided, wide


def _chain_moves(count, offset):
    """A shift by one (slot i+1 -> slot i) over ``count`` slots: each slot read before it is written."""
    src = torch.arange(offset + 1, offset + count + 1)
    dst = torch.arange(offset, offset + count)
    return src, dst


MOVE_LISTS = ("accepted", "accepted_600", "chain_600", "disjoint_skips", "empty", "prefix_tail", "sparse_runs")


def _move_list(kind, num_slots, seed):
    generator = torch.Generator().manual_seed(seed)
    if kind == "accepted":
        round_ = random_round(40, num_steps=5, num_nodes=8, generator=generator)
        slots = (torch.randperm(num_slots, generator=generator)[:320]).view(40, 8)
        return reference_accepted_kv_moves(round_.verdict, slots)
    if kind == "accepted_600":  # long enough for the GPU kernels to pack the used moves first; about half are -1
        round_ = random_round(150, num_steps=3, num_nodes=4, generator=generator)
        slots = (torch.randperm(num_slots, generator=generator)[:600]).view(150, 4)
        return reference_accepted_kv_moves(round_.verdict, slots)
    if kind == "chain_600":  # three or more kernel chunks: order across chunks and reading ahead matter
        return _chain_moves(600, 7)
    if kind == "disjoint_skips":
        perm = torch.randperm(num_slots, generator=generator)
        src, dst = perm[:200].clone(), perm[200:400].clone()
        skip = torch.rand(200, generator=generator) < 0.3
        src[skip & (torch.rand(200, generator=generator) < 0.5)] = -1
        dst[skip] = -1
        return src, dst
    if kind == "sparse_runs":  # runs of -1 longer than a kernel chunk between moves
        perm = torch.randperm(num_slots, generator=generator)
        src, dst = torch.full((1300,), -1), torch.full((1300,), -1)
        for first, count in ((3, 40), (700, 60), (1290, 10)):
            taken = perm[:2 * count]
            perm = perm[2 * count:]
            src[first:first + count], dst[first:first + count] = taken[:count], taken[count:]
        return src, dst
    if kind == "empty":
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    if kind != "prefix_tail":
        raise ValueError(f"unknown move list {kind!r}; known: {MOVE_LISTS}")
    table = torch.randperm(num_slots, generator=generator)[:6 * 60].view(6, 60)
    slots = reference_assign_draft_slots(table, req_pool_indices=torch.arange(6), seq_lens=torch.tensor([0, 1, 7, 9, 15, 17]),
                                         num_steps=3, topk=3, page_size=8)
    return slots.prefix_src, slots.prefix_dst


@pytest.mark.spec_hal_op("move_kv")
@pytest.mark.parametrize("kind", MOVE_LISTS)
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64))
def test_move_kv_matches_reference(backend, kind, index_dtype):
    num_slots = 701
    values = _caches(num_slots, seed=len(kind))
    src, dst = _move_list(kind, num_slots, seed=11)
    guarded, strided, wide = _guarded_caches(values, backend.device)
    caches = [holder.tensor for holder in guarded] + [strided]
    src_device, dst_device = src.to(index_dtype).to(backend.device), dst.to(index_dtype).to(backend.device)
    with no_host_sync(backend.device):
        result = backend.move_kv(caches, src_device, dst_device)
    assert result is None
    expected = [value.clone() for value in values] + [values[0].clone()]
    reference_move_kv(expected, src, dst)
    for index, (cache, want) in enumerate(zip(caches, expected)):
        assert torch.equal(cache.cpu(), want), f"cache {index} ({want.dtype}, row {tuple(want.shape[1:])}) differs from the reference"
    for index, holder in enumerate(guarded):
        holder.assert_intact(f"caches[{index}]")
    assert (wide[1::2].cpu() == 0).all(), "a write landed between the slots of a strided cache"


@pytest.mark.spec_hal_op("move_kv")
def test_move_kv_is_gather_then_scatter(backend):
    """A shift by one: slot 1 <- 2, 2 <- 3, 3 <- 4 reads every source before overwriting it."""
    cache = torch.arange(10, dtype=torch.float32).view(10, 1).repeat(1, 3).to(backend.device)
    backend.move_kv([cache], torch.tensor([2, 3, 4], device=backend.device), torch.tensor([1, 2, 3], device=backend.device))
    assert cache[:, 0].cpu().tolist() == [0, 2, 3, 4, 4, 5, 6, 7, 8, 9]


# ------------------------------------------------------------------------------------------
# assign_draft_slots


@pytest.mark.spec_hal_op("assign_draft_slots")
def test_assign_draft_slots_golden(backend):
    """P9 by hand: P = 4, K = 2, S = 3. seq_len 5: last_page 1, prefix_base 4, one page per
    lane; lane 0 at positions 5..7, lane 1 at 9..11, hole 8 <- prefix tail 4. seq_len 16:
    page-aligned, lanes at 16..18 and 20..22, no holes."""
    table = (torch.arange(100).view(2, 50) + 1000).to(backend.device)
    slots = backend.assign_draft_slots(table, req_pool_indices=torch.tensor([1, 0], device=backend.device),
                                       seq_lens=torch.tensor([5, 16], device=backend.device), num_steps=3, topk=2, page_size=4)
    assert slots.out_cache_loc.cpu().tolist() == [1055, 1056, 1057, 1059, 1060, 1061, 1016, 1017, 1018, 1020, 1021, 1022]
    assert slots.prefix_src.cpu().tolist() == [1054, -1, -1, -1, -1, -1]
    assert slots.prefix_dst.cpu().tolist() == [1058, -1, -1, -1, -1, -1]


ASSIGN_GRID = [(bs, steps, topk, page) for bs in (0, 1, 5, 64) for steps, topk in ((3, 1), (5, 4), (3, 8), (1, 2)) for page in (1, 16, 64)]


@pytest.mark.spec_hal_op("assign_draft_slots")
@pytest.mark.parametrize("bs, steps, topk, page", ASSIGN_GRID)
def test_assign_draft_slots_matches_reference(backend, bs, steps, topk, page):
    generator = torch.Generator().manual_seed(bs * 7 + steps * 3 + topk + page)
    width = 160 + 8 * 2 * 64  # room for 8 lanes of 2 pages of 64
    rows = max(bs, 1) + 2
    table_cpu = torch.randperm(rows * width * 2, generator=generator)[:rows * width].view(rows, width).to(torch.int32)
    pool_cpu = torch.randperm(rows, generator=generator)[:bs].to(torch.int64)
    seq_cpu = torch.randint(0, 160, (bs,), generator=generator).to(torch.int32)
    if bs:
        seq_cpu[0] = 0
    table = embedded_input(table_cpu, backend.device, margin_value=-3)
    holes = (topk - 1) * (page - 1)
    outs = [guarded_output((bs * topk * steps,), torch.int32, backend.device)] + [guarded_output((bs * holes,), torch.int32, backend.device) for _ in range(2)]
    pool_device, seq_device = pool_cpu.to(backend.device), seq_cpu.to(backend.device)
    with no_host_sync(backend.device):
        backend.assign_draft_slots(table, req_pool_indices=pool_device, seq_lens=seq_device,
                                   num_steps=steps, topk=topk, page_size=page, out=tuple(o.tensor for o in outs))
    for name, holder in zip(("out_cache_loc", "prefix_src", "prefix_dst"), outs):
        holder.assert_intact(name)
    expected = reference_assign_draft_slots(table_cpu, req_pool_indices=pool_cpu, seq_lens=seq_cpu, num_steps=steps, topk=topk, page_size=page)
    for name, holder, want in zip(("out_cache_loc", "prefix_src", "prefix_dst"), outs, expected):
        assert torch.equal(holder.tensor.cpu(), want), f"{name} differs from the reference"
    # P9 invariants: the K*S slots of a request are distinct and none holds committed KV.
    loc = expected.out_cache_loc.view(bs, topk * steps)
    for b in range(bs):
        assert len(set(loc[b].tolist())) == topk * steps
        committed = set(table_cpu[pool_cpu[b], :seq_cpu[b]].tolist())
        assert not committed & set(loc[b].tolist())
    if page == 1 or topk == 1:  # the contiguous closed form
        for b in range(bs):
            assert loc[b].tolist() == table_cpu[pool_cpu[b], seq_cpu[b]:seq_cpu[b] + topk * steps].tolist()


def _invalid_calls(device):
    verdict = verdict_to(random_round(2, num_steps=2, num_nodes=4, generator=torch.Generator().manual_seed(1)).verdict, device)
    slots = torch.zeros(2, 4, dtype=torch.int64, device=device)
    cache = torch.zeros(10, 4, device=device)
    index = torch.tensor([1, 2], device=device)
    table = torch.zeros(2, 40, dtype=torch.int32, device=device)
    pool, seq = torch.tensor([0, 1], device=device), torch.tensor([3, 4], device=device)
    assign = dict(req_pool_indices=pool, seq_lens=seq, num_steps=2, topk=2, page_size=4)
    return [
        ("slots", lambda b: b.accepted_kv_moves(verdict, slots[:, :3])),
        ("slots", lambda b: b.accepted_kv_moves(verdict, slots.float())),
        ("out[0]", lambda b: b.accepted_kv_moves(verdict, slots, out=(torch.zeros(8, dtype=torch.int64, device=device),) * 2)),
        ("caches", lambda b: b.move_kv(cache, index, index)),
        ("caches", lambda b: b.move_kv([], index, index)),
        ("caches[1]", lambda b: b.move_kv([cache, cache.t()], index, index)),
        ("caches[0]", lambda b: b.move_kv([torch.zeros(10, 2, dtype=torch.complex64, device=device)], index, index)),
        ("dst", lambda b: b.move_kv([cache], index, index[:1])),
        ("src", lambda b: b.move_kv([cache], index.float(), index)),
        ("num_steps", lambda b: b.assign_draft_slots(table, **{**assign, "num_steps": 0})),
        ("topk", lambda b: b.assign_draft_slots(table, **{**assign, "topk": 2.0})),
        ("page_size", lambda b: b.assign_draft_slots(table, **{**assign, "page_size": 0})),
        ("seq_lens", lambda b: b.assign_draft_slots(table, **{**assign, "seq_lens": seq[:1]})),
        ("req_to_token", lambda b: b.assign_draft_slots(table[0], **assign)),
    ]


@pytest.mark.spec_hal_op("move_kv")
@pytest.mark.parametrize("case", range(14))
def test_kv_rejects_bad_input(backend, case):
    assert_rejects(backend, *_invalid_calls(backend.device)[case])


@pytest.mark.spec_hal_op("assign_draft_slots")
def test_assign_draft_slots_keyword_only(backend):
    """Two index tensors and three ints that could be swapped are keyword-only."""
    table = torch.zeros(2, 40, dtype=torch.int32, device=backend.device)
    with pytest.raises(TypeError):
        backend.assign_draft_slots(table, torch.tensor([0], device=backend.device), torch.tensor([3], device=backend.device), 2, 2, 4)


# ------------------------------------------------------------------------------------------
# KV ledger: a paged KV pool driven through many rounds by the ops under test.


class PagedPool:
    """A paged KV pool as an engine keeps it: a page free list, a req_to_token table, target
    caches (K: (slots, 2) fp32 [token, position]; V: (slots, 1, 3) int32 [uid, token, position])
    and a draft cache sharing the slot ids. Pages are handed out in shuffled order."""

    def __init__(self, *, page_size, rows, row_width, device, generator):
        self.page_size, self.rows, self.row_width, self.device = page_size, rows, row_width, device
        self.pages_per_row = row_width // page_size
        num_pages = rows * self.pages_per_row + 3
        self.num_slots = num_pages * page_size
        self.free = torch.randperm(num_pages, generator=generator).tolist()
        self.row_pages = [[] for _ in range(rows)]
        self.req_to_token = torch.full((rows, row_width), -1, dtype=torch.int32)
        self.key = torch.full((self.num_slots, 2), -1.0, device=device)
        self.value = torch.full((self.num_slots, 1, 3), -1, dtype=torch.int32, device=device)
        self.draft = torch.full((self.num_slots, 2), -1.0, device=device)

    def reserve(self, row, positions):
        """Give ``row`` whole pages until positions [0, positions) have slots."""
        needed = -(-positions // self.page_size)
        while len(self.row_pages[row]) < needed:
            page = self.free.pop()
            start = len(self.row_pages[row]) * self.page_size
            self.req_to_token[row, start:start + self.page_size] = torch.arange(page * self.page_size, (page + 1) * self.page_size)
            self.row_pages[row].append(page)

    def release(self, row, keep_positions):
        """Free the whole pages of ``row`` past the ones holding positions [0, keep_positions)."""
        keep = -(-keep_positions // self.page_size)
        for page in self.row_pages[row][keep:]:
            self.free.append(page)
        self.req_to_token[row, keep * self.page_size:] = -1
        self.row_pages[row] = self.row_pages[row][:keep]

    def assert_no_slot_lost_or_duplicated(self):
        owned = sorted(self.free + [page for pages in self.row_pages for page in pages])
        assert owned == list(range(self.num_slots // self.page_size)), "a page was lost or handed out twice"


def _write_kv(pool, slots, tokens, positions, uids, *, draft):
    """Target KV (and, for a prefill, the draft model's KV) of tokens at positions."""
    slots = slots.long()
    pool.key[slots] = torch.stack([tokens, positions], dim=1).float().to(pool.device)
    pool.value[slots] = torch.stack([uids, tokens, positions], dim=1).view(-1, 1, 3).int().to(pool.device)
    if draft:
        pool.draft[slots] = pool.key[slots]


def _assert_committed_kv(pool, active, seq_lens, history, uids):
    """Position p < seq_len of every request reads (token p, p) through req_to_token: what
    attention at that position would read."""
    for row in active:
        length = seq_lens[row]
        slots = pool.req_to_token[row, :length].long()
        assert (slots >= 0).all()
        want = torch.stack([history[row, :length], torch.arange(length)], dim=1)
        assert torch.equal(pool.key[slots].cpu(), want.float()), f"request row {row}: K cache does not read its tokens in order"
        assert torch.equal(pool.value[slots].cpu().view(length, 3),
                           torch.cat([torch.full((length, 1), uids[row]), want], dim=1).int()), f"request row {row}: V cache differs"


LEDGER_STEPS, LEDGER_TOPK, LEDGER_NODES, LEDGER_ROWS, LEDGER_MAX_LEN = 3, 3, 10, 6, 96


def _ledger_rounds(backend) -> int:
    # The interpreter runs every Triton program as Python: a round's 6 launches cost ~0.15 s
    # there, so 200 rounds (~30 s per page size) keep CI's interpreter lane within budget. The
    # kernels' code paths do not depend on the round count; every other backend runs 1,000.
    return 200 if backend.capabilities.interpreter else 1000


@pytest.mark.spec_hal_op("move_kv")
@pytest.mark.parametrize("page_size", (1, 16, 64))
def test_kv_ledger(backend, page_size):
    """Random rounds of admission, draft slot assignment (with prefix-tail copies), tree verify,
    bonus, accepted-KV moves, compaction, commit, page release and request completion. After
    every round: no page lost or duplicated, every request's KV reads its tokens in order, and
    every draft lane reads the prefix's partial page from its own page region."""
    generator = torch.Generator().manual_seed(page_size)
    steps, topk, nodes, rows = LEDGER_STEPS, LEDGER_TOPK, LEDGER_NODES, LEDGER_ROWS
    lane_pages = -(-(page_size - 1 + steps) // page_size)
    row_width = -(-(LEDGER_MAX_LEN + nodes + topk * lane_pages * page_size) // page_size) * page_size
    pool = PagedPool(page_size=page_size, rows=rows, row_width=row_width, device=backend.device, generator=generator)
    history = torch.full((rows, row_width), -1, dtype=torch.int64)
    seq_lens, uids, active, next_uid = [0] * rows, [0] * rows, [], 1
    for round_number in range(_ledger_rounds(backend)):
        for row in range(rows):  # admission: a prompt of 1..40 tokens
            if row not in active and torch.rand(1, generator=generator).item() < 0.5:
                length = int(torch.randint(1, 41, (1,), generator=generator))
                pool.reserve(row, length)
                history[row, :length] = torch.randint(0, 1000, (length,), generator=generator)
                seq_lens[row], uids[row], next_uid = length, next_uid, next_uid + 1
                _write_kv(pool, pool.req_to_token[row, :length], history[row, :length], torch.arange(length), torch.full((length,), uids[row]), draft=True)
                active.append(row)
        active.sort()
        bs = len(active)
        seq = torch.tensor([seq_lens[row] for row in active], dtype=torch.int64)
        for row in active:
            last_page = seq_lens[row] % page_size
            draft_width = seq_lens[row] - last_page + (topk - 1) * (-(-(last_page + steps) // page_size)) * page_size + last_page + steps
            pool.reserve(row, max(seq_lens[row] + nodes, draft_width))

        # Draft: page-aware slots and the prefix's partial page copied into every lane region.
        table = pool.req_to_token.to(backend.device)
        draft = backend.assign_draft_slots(table, req_pool_indices=torch.tensor(active, dtype=torch.int64, device=backend.device),
                                           seq_lens=seq.to(backend.device), num_steps=steps, topk=topk, page_size=page_size)
        backend.move_kv([pool.draft], draft.prefix_src, draft.prefix_dst)
        _assert_draft_lanes(pool, active, seq_lens, history, draft, steps=steps, topk=topk)

        # Verify: node j's target KV lands at req_to_token[row, seq_len + j], position seq_len + depth.
        round_ = random_round(bs, num_steps=steps, num_nodes=nodes, generator=generator)
        rows_index = torch.tensor(active, dtype=torch.int64)
        slots = pool.req_to_token[rows_index[:, None], seq[:, None] + torch.arange(nodes)[None, :]]
        node_positions = seq.repeat_interleave(nodes) + round_.depths
        _write_kv(pool, slots.view(-1), round_.tokens, node_positions, torch.tensor([uids[row] for row in active]).repeat_interleave(nodes), draft=False)
        verdict = verdict_to(round_.verdict, backend.device)
        bonus = backend.bonus_tokens(verdict).cpu()
        assert bonus.tolist() == [emitted[-1] for emitted in round_.emitted]
        src, dst = backend.accepted_kv_moves(verdict, slots.to(backend.device))
        backend.move_kv([pool.key, pool.value], src, dst)
        check_compaction_invariant(backend.compact_accepted(verdict.predict, verdict).cpu(), round_)

        # Commit the accepted path, free rejected whole pages, finish some requests.
        for b, row in enumerate(active):
            path = round_.paths[b]
            history[row, seq_lens[row]:seq_lens[row] + len(path)] = round_.tokens[b * nodes + torch.tensor(path)]
            # The draft extend writes the draft KV of the committed tokens at their slots.
            committed = pool.req_to_token[row, seq_lens[row]:seq_lens[row] + len(path)].long()
            pool.draft[committed] = pool.key[committed]
            seq_lens[row] += len(path)
            pool.release(row, seq_lens[row])
        _assert_committed_kv(pool, active, seq_lens, history, uids)
        for row in list(active):
            if seq_lens[row] > LEDGER_MAX_LEN - nodes or torch.rand(1, generator=generator).item() < 0.05:
                pool.release(row, 0)
                history[row] = -1
                active.remove(row)
        pool.assert_no_slot_lost_or_duplicated()


def _assert_draft_lanes(pool, active, seq_lens, history, draft, *, steps, topk):
    """Lane t's attention reads the prefix's full pages through req_to_token and its partial
    page from the lane's own region (P9); its draft slots are distinct and hold no committed KV."""
    page_size = pool.page_size
    out_cache_loc = draft.out_cache_loc.cpu().view(len(active), topk, steps)
    for b, row in enumerate(active):
        length = seq_lens[row]
        last_page = length % page_size
        prefix_base = length - last_page
        pages_per_lane = -(-(last_page + steps) // page_size)
        committed = set(pool.req_to_token[row, :length].tolist())
        assert len(set(out_cache_loc[b].reshape(-1).tolist())) == topk * steps
        assert not committed & set(out_cache_loc[b].reshape(-1).tolist())
        want = torch.stack([history[row, prefix_base:length], torch.arange(prefix_base, length)], dim=1).float()
        for lane in range(topk):
            start = prefix_base + lane * pages_per_lane * page_size
            lane_slots = pool.req_to_token[row, start:start + last_page].long()
            assert torch.equal(pool.draft[lane_slots].cpu(), want), f"row {row} lane {lane}: partial prefix page not in the lane region"
            assert pool.req_to_token[row, start + last_page:start + last_page + steps].tolist() == out_cache_loc[b, lane].tolist()
