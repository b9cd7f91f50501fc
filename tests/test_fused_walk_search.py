"""The fused walk's cut searches (kernels/sampling.py: ``_row_statistics``: the two digit passes
(``_digit_pass``), each search's window counts and cut (``_count_window``, ``_window_cut``), the
tie pass and ``_tied_id``), under the interpreter with rows of several tiles.

The interpreter's own launch reads a row of up to 4096 ids as one tile, so the conformance suite
never carries the tie pass's running count of tied ids from one tile to the next, nor finds a
split tie in a tile other than the first. This test launches the fused walk with 16-, 32- and
64-id tiles (3-10 a row) on rows chosen to make the searches matter: heavy ties whose top-k cut
falls in a middle tile, logits about 5 levels apart (every digit and every window level decides
the cut), every token tied (one window level holds the whole row), NaN and +inf, an all -inf row,
the finite values only in the last tile, a greedy row, a row whose top-p window holds 10 ids of
one lane, per-request parameter tensors, each mask alone and both together (the searches that
stop once one cut lies wholly above the other), and the launches where no row can have a cut
(min-p alone: CUTS False, no search compiled). A row of 1025 tiles carries a lane's digit counts
over a thousand tiles. Top-k up to 128 takes its cuts from a list of the row's heaviest ids
(``_listed_cuts``; ``fused_list_top_k`` 128) in two of the five configurations, and searches in
the other three (0): with 16 or 32 lanes a top-k above the lanes and the rows of heavy ties
overflow the list and search there too. The second test takes rows chosen for the list at 16- and
512-id tiles.

Each request is one row with no drafts, so its verdict is the final token sampled from the
processed distribution by its coin; 64 coins spread over [0, 1) per row make the emitted tokens
trace the whole kept set and its cumulative sums. Tokens must equal the cpu reference's bit for
bit and the processed logprobs (log of the kept weight over the kept total) agree within 1e-5, so
a kept set off by even a light token fails. A chain of 3 drafts per row, seeded, checks the
accept tests on the same rows. A crossing-tile test off by one (``need < tied + in_tile``) fails
here, and so do a digit pass that never takes its third candidate, a window cut that drops the sum
below the window, and a window cut one level too deep (checked by mutation with one float32
configuration at 16- and 64-id tiles, forty-eighth session; 4-26 of its 38 cases fail each, and
the unmutated code passes them all). The final token's inverse CDF sums a row in blocks of 4 tiles
(``FUSED_BLOCK_TILES``; here rows of 3-10 tiles: full blocks and a short last one) and finds the
crossing tile inside the crossing block before reading it in pieces: a search that always takes
the block's first tile fails the final-token and chain cases, and one that forgets to take the
rejected tokens out of a tile's residual sum fails the chain cases (checked by mutation,
forty-second session). Runs in a fresh process: TRITON_INTERPRET must be set before kernels are
defined.
"""
import textwrap

from interpreter_probe import run_interpreter_probe

PROBE = textwrap.dedent("""
    import json, torch
    import spec_hal
    import spec_hal.kernels.sampling as sampling_kernels

    reference, kernels = spec_hal.get_backend("cpu"), spec_hal.get_backend("triton-interpret")
    generator = torch.Generator().manual_seed(5)
    rows, vocab, coins_per_row = 11, 150, 64
    x = torch.randn(rows, vocab, generator=generator) * 3
    x[1] = torch.randint(0, 3, (vocab,), generator=generator).float()   # heavy ties at every level
    x[2, ::7] = float("nan")
    x[2, 100] = float("inf")
    x[3] = float("-inf")
    x[4] = (torch.arange(vocab) % 2).float()                            # 75 tied at the top
    x[5] = 0.0                                                          # every token tied
    x[6, :140] = float("-inf")                                          # the finite values in the last tile
    x[8] = torch.arange(vocab).float() * 0.01
    x[9] = -torch.arange(vocab).float() * (5 / 1477.3)                  # ~5 levels apart: every digit decides
    x[10] = -20.0                                                       # top-p's window: 10 ids in one lane of 16 tiles
    x[10, 0] = 4.0
    x[10, 3::16] = 2.0 + 0.002 * torch.arange(10).float()
    def per_row(values):
        return torch.tensor(values).repeat_interleave(coins_per_row)
    cases = {
        "per-request tensors": dict(temperature=per_row([0.8, 1.0, 0.5, 1.0, 2.0, 1.0, 0.7, 0.0, 1.3, 0.9, 0.9]),
                                    top_k=per_row([5, 7, 0, 3, 100, 60, 4, 3, 149, 0, 0]),
                                    top_p=per_row([0.9, 1.0, 0.5, 0.9, 1.0, 0.3, 1.0, 0.9, 0.99, 0.7, 0.8]),
                                    min_p=per_row([0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.05, 0.0, 0.0, 0.0, 0.0])),
        "top-k only": dict(temperature=0.9, top_k=6),
        "top-k splitting the 75 ties": dict(temperature=1.0, top_k=40),
        "top-k deep": dict(temperature=1.0, top_k=97),
        "top-p only": dict(temperature=0.9, top_p=0.8),
        "top-p tight": dict(temperature=1.5, top_p=0.05),
        "both masks": dict(temperature=0.8, top_k=8, top_p=0.9),
        "both masks, top-p binding": dict(temperature=1.2, top_k=120, top_p=0.4),
        "min-p only": dict(temperature=1.0, min_p=0.2),
    }
    bs = rows * coins_per_row
    logits = x.repeat_interleave(coins_per_row, dim=0)
    final_coins = ((torch.arange(coins_per_row) + 0.5) / coins_per_row).repeat(rows)
    no_drafts = torch.zeros(bs, 0, dtype=torch.int64)
    drafts = torch.randint(0, vocab, (rows, 3), generator=generator)
    drafts[:, 0] = torch.nan_to_num(x, nan=-1e30).argmax(dim=1)        # a draft that is usually kept
    chain_logits = x.repeat_interleave(4, dim=0).reshape(rows, 4, vocab).reshape(rows * 4, vocab)
    seed, offset = torch.arange(rows) + 11, torch.zeros(rows, dtype=torch.int64)
    results = {}
    original_launch = sampling_kernels.fused_launch
    def tiles_of(block_v):
        def launch(target, bs, nodes, vocab):
            config = original_launch(target, bs, nodes, vocab)
            return sampling_kernels.FusedLaunch(config.requests, block_v, 16, config.warps)
        return launch
    # LIST_TOP_K 128: top-k up to 128 from the list of the heaviest ids (_listed_cuts; with 16 or
    # 32 lanes, k above the lanes and rows whose list overflows search); 0: every top-k searched.
    # 64-id tiles: groups of 32 ids in the window counts, two a tile.
    for block_v, list_top_k in ((16, 128), (32, 128), (16, 0), (32, 0), (64, 0)):
        sampling_kernels.fused_launch = tiles_of(block_v)
        sampling_kernels.fused_list_top_k = lambda target, list_top_k=list_top_k: list_top_k
        for name, params in cases.items():
            for dtype in (torch.float32, torch.bfloat16):
                args = dict(params, coins=torch.zeros(bs, 0), final_coins=final_coins, logprobs="processed")
                want = reference.verify_chain_sampling_from_logits(no_drafts, None, logits.to(dtype), **args)
                got = kernels.verify_chain_sampling_from_logits(no_drafts, None, logits.to(dtype), **args)
                results[f"block_v={block_v} list={list_top_k} {name} {dtype} final"] = bool(
                    torch.equal(want.verdict.predict, got.verdict.predict)
                    and torch.allclose(want.logprobs, got.logprobs, atol=1e-5, equal_nan=True))
            chain_params = {key: (value[::coins_per_row] if torch.is_tensor(value) else value) for key, value in params.items()}
            args = dict(chain_params, seed=seed, offset=offset, logprobs="processed")
            want = reference.verify_chain_sampling_from_logits(drafts, None, chain_logits, **args)
            got = kernels.verify_chain_sampling_from_logits(drafts, None, chain_logits, **args)
            same = all(torch.equal(getattr(want.verdict, f), getattr(got.verdict, f)) for f in ("predict", "accept_index", "accept_lens"))
            results[f"block_v={block_v} list={list_top_k} {name} chain"] = bool(
                same and torch.allclose(want.logprobs, got.logprobs, atol=1e-5, equal_nan=True))
    # 1025 tiles a row: a lane's digit counts carried over a thousand tiles; top-p 0.9 there: a
    # window of thousands of ids
    sampling_kernels.fused_launch = tiles_of(16)
    wide = torch.randn(8, 16400, generator=generator).to(torch.bfloat16)
    for name, params in (("top-k 3000", dict(top_k=3000)), ("top-p 0.9", dict(top_p=0.9))):
        args = dict(params, temperature=1.0, coins=torch.zeros(8, 0), final_coins=(torch.arange(8) + 0.5) / 8, logprobs="processed")
        want = reference.verify_chain_sampling_from_logits(torch.zeros(8, 0, dtype=torch.int64), None, wide, **args)
        got = kernels.verify_chain_sampling_from_logits(torch.zeros(8, 0, dtype=torch.int64), None, wide, **args)
        results[f"1025 tiles a row, {name}"] = bool(torch.equal(want.verdict.predict, got.verdict.predict)
                                                 and torch.allclose(want.logprobs, got.logprobs, atol=1e-5, equal_nan=True))
    print(json.dumps(results))
""")


def test_fused_walk_searches_match_the_reference():
    results = run_interpreter_probe(PROBE)
    assert len(results) == 5 * 9 * 3 + 2
    assert all(results.values()), {case: same for case, same in results.items() if not same}


# The listed top-k (``_listed_cuts``) on rows chosen for it, at 16- and 512-id tiles: plain, heavy
# ties, a top-10 of ten tied logits, NaN, every token tied (its list overflows: the search), a lane
# of 19 ids near the top at 16-id tiles (more than LIST_DEPTH a lane: the search there); top-p
# 0.3 beside top-k 60 cuts inside the list (a running weight that counts its own entry fails it);
# top-k 100 and 128 list more than the 16-id tiles' lanes (the search there), up to LIST_CAP at 512.
LIST_PROBE = textwrap.dedent("""
    import json, torch
    import spec_hal
    import spec_hal.kernels.sampling as sampling_kernels

    reference, kernels = spec_hal.get_backend("cpu"), spec_hal.get_backend("triton-interpret")
    generator = torch.Generator().manual_seed(7)
    rows, vocab, coins_per_row = 6, 300, 3
    x = torch.randn(rows, vocab, generator=generator) * 2
    x[1] = torch.randint(0, 4, (vocab,), generator=generator).float()
    x[2, 100:110] = 9.0
    x[3, ::5] = float("nan")
    x[4] = 0.0
    x[5] = -10.0
    x[5, 3::16] = 3.0 + 0.01 * torch.arange(19).float()
    bs = rows * coins_per_row
    logits = x.repeat_interleave(coins_per_row, dim=0)
    final_coins = ((torch.arange(coins_per_row) + 0.5) / coins_per_row).repeat(rows)
    original_launch = sampling_kernels.fused_launch
    results = {}
    for block_v in (16, 512):
        def launch(target, bs, nodes, vocab, block_v=block_v):
            config = original_launch(target, bs, nodes, vocab)
            return sampling_kernels.FusedLaunch(config.requests, block_v, 16, config.warps)
        sampling_kernels.fused_launch = launch
        for name, params in {"top-k 5": dict(temperature=0.9, top_k=5), "top-k 12 + top-p 0.7": dict(temperature=1.1, top_k=12, top_p=0.7),
                             "top-k 40 + top-p 0.9 + min-p": dict(temperature=0.7, top_k=40, top_p=0.9, min_p=0.02),
                             "top-k 60 + top-p 0.3": dict(temperature=1.3, top_k=60, top_p=0.3),
                             "top-k 100 + top-p 0.95": dict(temperature=1.0, top_k=100, top_p=0.95),
                             "top-k 128": dict(temperature=0.8, top_k=128)}.items():
            args = dict(params, coins=torch.zeros(bs, 0), final_coins=final_coins, logprobs="processed")
            no_drafts = torch.zeros(bs, 0, dtype=torch.int64)
            want = reference.verify_chain_sampling_from_logits(no_drafts, None, logits.to(torch.bfloat16), **args)
            got = kernels.verify_chain_sampling_from_logits(no_drafts, None, logits.to(torch.bfloat16), **args)
            results[f"block_v={block_v} {name}"] = bool(torch.equal(want.verdict.predict, got.verdict.predict)
                                                        and torch.allclose(want.logprobs, got.logprobs, atol=1e-5, equal_nan=True))
    print(json.dumps(results))
""")


def test_fused_walk_list_matches_the_reference():
    results = run_interpreter_probe(LIST_PROBE)
    assert len(results) == 2 * 6
    assert all(results.values()), {case: same for case, same in results.items() if not same}
