"""``draft_topk``'s two kernels with several tiles per row and several sub-tiles per tile
(kernels/topk.py): the tile statistics, the sub-tile maxima and the selection that reads the k
best sub-tiles again.

The interpreter's own launch config gives every row one tile of at most 256-id sub-tiles, so the
conformance suite never merges tiles or ranks small sub-tiles there. This test launches the kernels
through the interpreter with 32- and 64-id tiles and 32-, 8- and 16-id sub-tiles, on logits chosen
to make the sub-tile order matter (ascending and descending rows, heavy ties between sub-tile
maxima, NaN/inf, all -inf and all-NaN rows, masks with fewer allowed tokens than k, a row
allowing nothing and one allowing three ids (fewer than k, so that fully masked sub-tiles must
outrank the sub-tiles wholly past the vocabulary), a token map; the first 128 ids alone, every
tile whole, so the statistics' path without bound tests ends a row; bfloat16 masks with an index,
whose unconstrained rows take the launches' row branch), and compares ids bit for bit and probabilities within the suite's
tolerance with the cpu reference. Reversing the sub-tiles' tie order (index descending) fails it.
Runs in a fresh process: TRITON_INTERPRET must be set before kernels are defined.
"""
import textwrap

from interpreter_probe import run_interpreter_probe

PROBE = textwrap.dedent("""
    import json, torch
    import spec_hal
    from spec_hal.masks import pack_bitmask
    import spec_hal.kernels.topk as kt

    def launch_with(block, sub):
        def launch(target, rows, vocab, masked=False, element_size=4, mapped=False):
            return kt.TopkLaunch(block=block, tile_warps=1, sub=sub, row_branch=masked and element_size == 2)
        return launch

    reference, kernels = spec_hal.get_backend("cpu"), spec_hal.get_backend("triton-interpret")
    generator = torch.Generator().manual_seed(5)
    rows, vocab = 8, 150  # 5 tiles of 32 ids or 3 of 64, the last one partial (the first 128 ids: whole tiles)
    logits = torch.randn(rows, vocab, generator=generator)
    logits[1] = torch.arange(vocab, dtype=torch.float32)            # every tile beats the floor
    logits[2] = -torch.arange(vocab, dtype=torch.float32)           # only the first tile enters
    logits[3] = torch.randint(0, 3, (vocab,), generator=generator).float()  # ties on the floor's value
    logits[4, ::7] = float("nan")
    logits[4, 100] = float("inf")
    logits[4, 140] = float("inf")
    logits[5] = float("-inf")
    logits[6] = float("nan")
    logits[7, :120] = float("-inf")                                   # the last tiles hold every finite value

    allowed = torch.rand(rows, vocab, generator=generator) < 0.6
    allowed[2] = False
    allowed[2, [3, 97]] = True                                        # fewer allowed tokens than k
    allowed[3] = False                                                # nothing allowed
    # Three allowed ids (one at -inf), fewer than k = 5, whose sub-tiles (64-id tiles of 16) and the
    # last tile's two wholly past the vocabulary would take all five picks if those two ranked
    # above the fully masked sub-tiles that hold the two masked ids the reference fills in (0, 1).
    allowed[7] = False
    allowed[7, [100, 130, 145]] = True
    mask = pack_bitmask(allowed)
    index = torch.arange(rows, dtype=torch.int32)
    index[1::3] = -1
    token_map = torch.randperm(vocab, generator=generator)
    cases = {
        "plain": {},
        "bf16": {"dtype": torch.bfloat16},
        "masked": {"token_bitmask": mask},
        "masked with index": {"token_bitmask": mask, "bitmask_index": index},
        # 2-byte logits take the row branch: unconstrained rows (index -1) skip the mask
        "bf16 masked with index": {"dtype": torch.bfloat16, "token_bitmask": mask, "bitmask_index": index},
        "bf16 masked token map": {"dtype": torch.bfloat16, "token_map": token_map,
                                  "token_bitmask": pack_bitmask(allowed[:, token_map.argsort()]), "bitmask_index": index},
        "token map": {"token_map": token_map},
        "masked token map": {"token_map": token_map, "token_bitmask": pack_bitmask(allowed[:, token_map.argsort()])},
        "whole tiles": {"columns": 128},  # every tile full: the statistics' unbounded path only
    }
    results = {}
    for block, sub in ((32, 32), (32, 8), (64, 16)):
        kt.launch_config = launch_with(block, sub)
        for name, args in cases.items():
            args = dict(args)
            x = logits[:, :args.pop("columns", vocab)].to(args.pop("dtype", torch.float32))
            for k in (1, 3, 5, 16):
                want, got = reference.draft_topk(x, k, **args), kernels.draft_topk(x, k, **args)
                same_ids = torch.equal(want[1], got[1])
                close = torch.allclose(want[0], got[0], rtol=1e-5, atol=1e-7)
                results[f"block={block} sub={sub} {name} k={k}"] = bool(same_ids and close)
    # Rows of more sub-tiles than the selection ranks take the reference (20 sub-tiles of 8 ids
    # here) and launch no kernel: the kernels would rank them correctly too, so equal ids alone
    # would not show that the fallback ran.
    class NotLaunched:
        def __getitem__(self, grid):
            raise AssertionError("a kernel was launched for a row over MAX_SUBS sub-tiles")
    kt.launch_config = launch_with(32, 8)
    kt.MAX_SUBS = 4
    kt._tile_stats_kernel = kt._select_kernel = NotLaunched()
    want, got = reference.draft_topk(logits, 5), kernels.draft_topk(logits, 5)
    results["over MAX_SUBS"] = bool(torch.equal(want[1], got[1]) and torch.allclose(want[0], got[0], rtol=1e-5, atol=1e-7))
    print(json.dumps(results))
""")


def test_tiles_and_sub_tiles_match_the_reference():
    results = run_interpreter_probe(PROBE)
    assert len(results) == 3 * 9 * 4 + 1
    assert all(results.values()), {case: same for case, same in results.items() if not same}
