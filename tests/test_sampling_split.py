"""The row processing split along the vocabulary (kernels/sampling_rows.py): many chunks a row.

The interpreter's own launch config gives every row one chunk, so the conformance suite never
combines partials from several chunks there. This test launches the kernels through the
interpreter with 16-id tiles and chunks of 1, 2, 3 and 10 tiles, on rows chosen to make the
combination matter: heavy ties whose top-k cut falls in a middle chunk, logits about 5 levels apart (so that the
top-p and top-k cuts depend on every 4-bit digit of the level search), every token tied, NaN and
+inf, an all -inf row, the finite values only in the last chunk, a greedy row, per-request
temperature/top-k/top-p/min-p tensors and each mask alone, and tensors whose masks are off in
every row or in all but one (programs without a searching row skip the search passes' reads).
Rows with both masks also check the
searches that stop once one cut lies wholly above the other (``_binding``): either stop made too
early changes the kept set and fails here (checked by mutation, 2026-11-27). It compares the probabilities bit for
bit (and the raw log-sum-exp within 1e-5) with the cpu reference, and a tree verified from logits
through the every-row path (the GPUs' path for small batches) verdict for verdict, with every row's
probabilities and with only the candidates' and each request's final row (``process_path_rows``),
as is a greedy drafter's chain; and rows
processed in slabs of whole requests (more row blocks than a CUDA grid axis takes, or more window
counts than a slab holds). The first search pass's packed token counts are unpacked every 3 tiles
(PACKED_TILES; 255 on a GPU). The window counts (16-id tiles here: groups of 16 ids, so that the
constant row's ids share a level in every group and the others mostly do not) fail here with the
grouped add counting 1 instead of the group's count, with the cut tile taken one tile early, or with
the count above the top-k cut taken at its tile's start (checked by mutation, 2026-11-28,
twenty-eighth session). Every row greedy takes each row's argmax from the max pass's per-lane
maxima (ties across lanes, tiles and chunks, an all -inf row); temperature alone takes the kept
pass without its tests (``_pass_weights``): the argmax reduced as the highest id of the max, a lane
taking equal maxima, and a level one off in the plain weights each fail here (checked by mutation,
2026-11-28, twenty-ninth session). The final rows' probabilities of ``process_path_rows`` run
in 3 parts a chunk (``final_row_parts``; 1 on the interpreter otherwise); on flat rows a part
that skips a tile fails here (checked by mutation, the same session). Runs in a fresh process: TRITON_INTERPRET must be set before kernels are
defined.
"""
import textwrap

from interpreter_probe import run_interpreter_probe

PROBE = textwrap.dedent("""
    import json, torch
    import spec_hal
    import spec_hal.kernels.sampling as sampling_kernels
    import spec_hal.kernels.sampling_rows as rows_kernels
    import triton.language as tl
    from spec_hal.conformance.trees import random_tree

    # The bin passes' packed token counts are unpacked every 3 tiles here (255 on a GPU), so that
    # a 10-tile chunk unpacks them 4 times, the last after a partial group.
    rows_kernels.PACKED_TILES = tl.constexpr(3)

    def launch_with(chunk_len):
        def launch(target, rows, vocab):
            return rows_kernels.SplitLaunch(rows=4, chunks=-(-vocab // chunk_len), chunk_len=chunk_len, block_v=16, bins_block=16,
                                            kept_block=16, warps=1)
        return launch

    reference, kernels = spec_hal.get_backend("cpu"), spec_hal.get_backend("triton-interpret")
    provider_path_choice = sampling_kernels._every_row_in_parallel
    path_rows_choice = rows_kernels.path_rows_pay
    # the final rows' probabilities in 3 parts a chunk (a GPU's launch; the interpreter keeps 1):
    # 10 tiles as 4 + 4 + 2, 3 as 1 + 1 + 1, 1 as 1 + none + none
    rows_kernels.final_row_parts = lambda target, config, requests: 3
    generator = torch.Generator().manual_seed(3)
    rows, vocab = 10, 150
    x = torch.randn(rows, vocab, generator=generator) * 3
    x[1] = torch.randint(0, 3, (vocab,), generator=generator).float()   # heavy ties at every level
    x[2, ::7] = float("nan")
    x[2, 100] = float("inf")
    x[3] = float("-inf")
    x[4] = (torch.arange(vocab) % 2).float()                            # 75 tied at the top: top-k 100 cuts 25 of the rest
    x[5] = 0.0                                                          # every token tied
    x[6, :140] = float("-inf")                                          # the finite values in the last chunk
    x[8] = torch.arange(vocab).float() * 0.01
    x[9] = -torch.arange(vocab).float() * (5 / 1477.3)                  # ~5 levels apart: the cuts need every digit of the search
    temperature = torch.tensor([0.8, 1.0, 0.5, 1.0, 2.0, 1.0, 0.7, 0.0, 1.3, 0.9])
    top_k = torch.tensor([5, 7, 0, 3, 100, 60, 4, 3, 149, 0])
    top_p = torch.tensor([0.9, 1.0, 0.5, 0.9, 1.0, 0.3, 1.0, 0.9, 0.99, 0.7])
    min_p = torch.tensor([0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.05, 0.0, 0.0, 0.0])
    cases = {
        "per-request tensors": dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p),
        "top-k only": dict(temperature=0.9, top_k=6),
        "top-k deep": dict(temperature=1.0, top_k=97),
        # at T 20 row 4's two levels (0 and 73) share the window's first tile: the top-k cut splits
        # the lower one's tie, and what lies above it is counted inside the cut's tile
        "top-k tie in the cut's tile": dict(temperature=20.0, top_k=100),
        "top-p only": dict(temperature=0.9, top_p=0.8),
        "temperature only": dict(temperature=1.1),
        "min-p only": dict(temperature=1.0, min_p=0.2),
        "every row greedy": dict(temperature=torch.zeros(rows)),
        # tensors with every mask off: the host launches the bin passes and every program skips them
        "tensor parameters, masks off": dict(temperature=temperature, top_k=torch.zeros(rows, dtype=torch.int64),
                                             top_p=torch.ones(rows)),
        # programs of 4 rows (launch_with): the first and the last without a searching row, the
        # middle one with one (row 5)
        "tensor parameters, one row searching": dict(temperature=temperature, top_k=torch.tensor([0, 0, 0, 0, 0, 9, 0, 0, 0, 0]),
                                                     top_p=torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.8, 1.0, 1.0, 1.0, 1.0])),
    }
    results = {}
    for chunk_len in (16, 32, 48, 160):
        rows_kernels.split_launch = launch_with(chunk_len)
        for name, params in cases.items():
            for dtype in (torch.float32, torch.bfloat16):
                logits = x.to(dtype)
                want, got = reference.process_logits(logits, **params), kernels.process_logits(logits, **params)
                results[f"chunk_len={chunk_len} {name} {dtype}"] = torch.equal(want, got)
        # raw logprobs: the log-sum-exp combined from the chunks' online sums
        logits = x.reshape(2, 5, vocab)
        ids = torch.randint(0, vocab, (2, 4), generator=generator)
        seed, offset = torch.tensor([1, 2]), torch.tensor([0, 5])
        args = dict(temperature=0.7, top_k=20, seed=seed, offset=offset, logprobs="raw")
        draft_probs = torch.softmax(torch.randn(2, 4, vocab, generator=generator), dim=-1)  # with draft probs: every row processed
        want = reference.verify_chain_sampling_from_logits(ids, draft_probs, logits, **args)
        got = kernels.verify_chain_sampling_from_logits(ids, draft_probs, logits, **args)
        same_tokens = torch.equal(want.verdict.predict, got.verdict.predict)
        results[f"chunk_len={chunk_len} raw logprobs"] = bool(same_tokens and torch.allclose(want.logprobs, got.logprobs, atol=1e-5,
                                                                                               equal_nan=True))
        # a tree verified from logits through the every-row path (the GPUs' path for small batches;
        # the interpreter's provider otherwise runs the fused walk), with every row's probabilities
        # (process_rows) and with the candidates' and the final rows' alone (process_path_rows)
        sampling_kernels._every_row_in_parallel = lambda target, rows, **route: True
        tree, candidates = random_tree(2, 5, 3, seed=4, vocab=vocab)
        tree_logits = x.reshape(2, 5, vocab).clone()
        tree_logits[:, :, 7] = 30.0  # candidates 7 are accepted where they appear
        candidates[:, 1:3] = 7
        chain_logits = x[:8].reshape(2, 4, vocab).clone()
        chain_logits[:, :, 7] = 2.0
        chain_drafts = torch.tensor([[7, 7, 3], [7, 0, 7]])
        for path_rows in (False, True):
            rows_kernels.path_rows_pay = lambda target, rows, vocab, path_rows=path_rows: path_rows
            args = dict(temperature=torch.tensor([0.0, 0.9]), top_k=8, top_p=0.9, seed=seed, offset=offset, logprobs="processed")
            want = reference.verify_sampling_from_logits(tree, candidates, tree_logits, **args)
            got = kernels.verify_sampling_from_logits(tree, candidates, tree_logits, **args)
            same = all(torch.equal(getattr(want.verdict, f), getattr(got.verdict, f)) for f in ("predict", "accept_index", "accept_lens"))
            results[f"chunk_len={chunk_len} tree every row, path rows {path_rows}"] = bool(
                same and torch.allclose(want.logprobs, got.logprobs, atol=1e-5, equal_nan=True))
            # flat rows, temperature alone: the final rows' mass spread over every tile, so that a
            # tile the final rows' launch leaves unwritten changes the final token
            args = dict(temperature=torch.tensor([1.5, 1.5]), seed=seed, offset=offset, logprobs="processed")
            flat_logits = torch.randn(2, 5, vocab, generator=torch.Generator().manual_seed(5)) * 0.5
            want = reference.verify_sampling_from_logits(tree, candidates, flat_logits, **args)
            got = kernels.verify_sampling_from_logits(tree, candidates, flat_logits, **args)
            same = all(torch.equal(getattr(want.verdict, f), getattr(got.verdict, f)) for f in ("predict", "accept_index", "accept_lens"))
            results[f"chunk_len={chunk_len} flat tree every row, path rows {path_rows}"] = bool(
                same and torch.allclose(want.logprobs, got.logprobs, atol=1e-5, equal_nan=True))
            args = dict(temperature=torch.tensor([0.7, 1.1]), top_p=torch.tensor([0.95, 0.6]), seed=seed, offset=offset, logprobs="raw")
            want = reference.verify_chain_sampling_from_logits(chain_drafts, None, chain_logits, **args)
            got = kernels.verify_chain_sampling_from_logits(chain_drafts, None, chain_logits, **args)
            results[f"chunk_len={chunk_len} one-hot chain every row, path rows {path_rows}"] = bool(
                torch.equal(want.verdict.predict, got.verdict.predict) and torch.allclose(want.logprobs, got.logprobs, atol=1e-5, equal_nan=True))
        rows_kernels.path_rows_pay = path_rows_choice
        sampling_kernels._every_row_in_parallel = provider_path_choice
    # more rows than the grid's row axis takes: slabs of whole requests (CUDA's 65535 programs,
    # here 2 programs of 4 rows), each request's parameters taken from its own slab's offset
    rows_kernels.split_launch = launch_with(32)
    rows_kernels.MAX_ROW_BLOCKS = 2
    params = cases["per-request tensors"]
    results["slabs process_logits"] = torch.equal(reference.process_logits(x, **params), kernels.process_logits(x, **params))
    logits = x.reshape(2, 5, vocab)
    args = dict(temperature=torch.tensor([0.7, 1.2]), top_k=torch.tensor([20, 3]), top_p=0.9, seed=seed, offset=offset, logprobs="raw")
    want = reference.verify_chain_sampling_from_logits(ids, draft_probs, logits, **args)
    got = kernels.verify_chain_sampling_from_logits(ids, draft_probs, logits, **args)
    results["slabs chain with draft probs"] = bool(torch.equal(want.verdict.predict, got.verdict.predict)
                                                   and torch.allclose(want.logprobs, got.logprobs, atol=1e-5, equal_nan=True))
    # slabs set by the window counts' budget (small vocabularies): 3 rows of 5 chunks a slab
    rows_kernels.MAX_ROW_BLOCKS = 65535
    rows_kernels.WINDOW_COUNTS_BYTES = 3 * 5 * 2 * rows_kernels.WINDOW_LEVELS * 4
    results["window-count slabs process_logits"] = torch.equal(reference.process_logits(x, **params), kernels.process_logits(x, **params))
    print(json.dumps(results))
""")


def test_split_row_processing_matches_the_reference():
    results = run_interpreter_probe(PROBE)
    assert len(results) == 4 * (10 * 2 + 7) + 3
    assert all(results.values()), {case: same for case, same in results.items() if not same}
