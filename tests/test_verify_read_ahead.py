"""The sampling walks' vocabulary pass with and without its one-tile read-ahead
(``SamplingLaunch.read_ahead``: NVIDIA reads ahead, AMD does not), over several tiles per program;
the tree walk's residual sums stored per tile and derived at the end (``SamplingLaunch.
derive_residual``: GPUs derive them from 4 tiles a program, the interpreter always); and
verify_tree_sampling's row passes both ways (``TreeSamplingLaunch.read_ahead``: sm_90 and the
interpreter read ahead, other targets do not).

The interpreter's own launch config gives every program one tile (two chunks of one tile each),
so the conformance suite never carries a tile from one loop iteration to the next there. This test
launches the kernels through the interpreter with 32-id tiles in one chunk (several iterations per
program), both read-ahead settings and both residual forms, and compares every integer output with
the cpu reference.
Runs in a fresh process: TRITON_INTERPRET must be set before kernels are defined.
"""
import textwrap

from interpreter_probe import run_interpreter_probe

PROBE = textwrap.dedent("""
    import dataclasses, json, torch
    import spec_hal
    from spec_hal.bench.examples import tree_verify_inputs
    from spec_hal.masks import pack_bitmask
    import spec_hal.kernels.verify as kv
    import spec_hal.kernels.tree_sampling as kts

    default_launch = kv.sampling_launch
    default_tree_launch = kts.tree_sampling_launch

    def launch_with(read_ahead, derive_residual):
        def launch(target, bs, nodes, vocab):
            config = default_launch(target, bs, nodes, vocab)
            tiles = -(-vocab // 32)
            return dataclasses.replace(config, tile_v=32, num_tiles=tiles, tiles_per_chunk=tiles, read_ahead=read_ahead,
                                       derive_residual=derive_residual)
        return launch

    def tree_launch_with(read_ahead):
        def launch(target, bs, nodes, vocab):
            return dataclasses.replace(default_tree_launch(target, bs, nodes, vocab), tile_v=32, read_ahead=read_ahead)
        return launch

    reference, kernels = spec_hal.get_backend("cpu"), spec_hal.get_backend("triton-interpret")
    bs, nodes, steps, vocab = 3, 6, 4, 150  # 5 tiles of 32 ids, the last one partial
    tree, candidates, logits, _, probs, coins, final_coins = tree_verify_inputs(bs, nodes, steps, vocab, "cpu")
    generator = torch.Generator().manual_seed(3)
    allowed = torch.rand(bs * nodes, vocab, generator=generator) < 0.6
    allowed[torch.arange(bs * nodes), candidates.reshape(-1)] = True
    mask = pack_bitmask(allowed)
    index = torch.arange(bs * nodes, dtype=torch.int32)
    index[1::2] = -1
    drafts = candidates[:, 1:].contiguous()
    draft_probs = torch.softmax(torch.randn(bs, nodes - 1, vocab, generator=generator), dim=-1)
    chain_coins = coins[:, 1:].contiguous()
    tree_draft_probs = torch.softmax(torch.randn(bs, nodes, vocab, generator=generator), dim=-1)

    cases = {
        "tree": lambda b, **m: b.verify_sampling(tree, candidates, probs, coins, final_coins, **m),
        "chain": lambda b, **m: b.verify_chain_sampling(drafts, draft_probs, probs, chain_coins, final_coins, **m),
        "chain one-hot": lambda b, **m: b.verify_chain_sampling(drafts, None, probs, chain_coins, final_coins, **m),
        "tree with draft probs": lambda b, **m: b.verify_tree_sampling(tree, candidates, tree_draft_probs, probs, coins, final_coins, **m),
    }
    masks = {"unmasked": {}, "masked": {"token_bitmask": mask}, "half masked": {"token_bitmask": mask, "bitmask_index": index}}

    # Every child rejected where it carries much of its row's mass: the final token is sampled from
    # the target less those children, so where their quantised p is taken off decides it (the
    # derived residual's sums, or the stored ones).
    rejecting_bs = 16
    rejecting_tree, rejecting_candidates = tree_verify_inputs(rejecting_bs, nodes, steps, vocab, "cpu", sampling=False)[:2]
    heavy = torch.softmax(torch.randn(rejecting_bs, nodes, vocab, generator=generator), dim=-1)
    heavy.scatter_add_(2, rejecting_candidates[:, None, :].expand(-1, nodes, -1), torch.full((rejecting_bs, nodes, nodes), 0.12))
    heavy /= heavy.sum(dim=-1, keepdim=True)
    rejecting_coins = torch.full((rejecting_bs, nodes), 0.999)
    rejecting_allowed = torch.rand(rejecting_bs * nodes, vocab, generator=generator) < 0.6
    rejecting_allowed.scatter_(1, rejecting_candidates.repeat_interleave(nodes, dim=0), True)
    rejecting_masks = {"unmasked": {}, "masked": {"token_bitmask": pack_bitmask(rejecting_allowed)}}
    rejecting_final_coins = final_coins[:1].expand(rejecting_bs).contiguous()
    rejecting = lambda b, **m: b.verify_sampling(rejecting_tree, rejecting_candidates, heavy, rejecting_coins, rejecting_final_coins, **m)
    fields = ("predict", "accept_index", "num_correct", "accept_lens")
    results = {}
    for read_ahead in (True, False):
        kts.tree_sampling_launch = tree_launch_with(read_ahead)
        for derive_residual in (True, False):
            kv.sampling_launch = launch_with(read_ahead, derive_residual)
            # derive_residual is the tree walk's alone: the other cases run once per read-ahead setting
            for name, call in (cases.items() if derive_residual else [("tree", cases["tree"])]):
                for mask_name, mask_args in masks.items():
                    want, got = call(reference, **mask_args), call(kernels, **mask_args)
                    same = all(torch.equal(getattr(want, f).long(), getattr(got, f).long()) for f in fields)
                    results[f"read_ahead={read_ahead} derive_residual={derive_residual} {name} {mask_name}"] = same
            for mask_name, mask_args in rejecting_masks.items():
                want, got = rejecting(reference, **mask_args), rejecting(kernels, **mask_args)
                same = all(torch.equal(getattr(want, f).long(), getattr(got, f).long()) for f in fields)
                results[f"read_ahead={read_ahead} derive_residual={derive_residual} every child rejected {mask_name}"] = same
                # the case must keep rejecting every root child, or it tests nothing of the residual
                results[f"read_ahead={read_ahead} derive_residual={derive_residual} {mask_name}: no request accepts"] = bool(
                    (want.num_correct == 0).all())
    print(json.dumps(results))
""")


def test_read_ahead_and_plain_tile_loops_match_the_reference():
    results = run_interpreter_probe(PROBE, timeout=600)
    assert len(results) == 46
    assert all(results.values()), {case: same for case, same in results.items() if not same}
