"""The chain sampling kernel's lane reductions as scalars (``SamplingLaunch.scalar_reduce``, the
GPU launches: kernels/verify.py ``_lanes_reduce``) against the (R,) reductions the interpreter's
launches use, through the interpreter.

The interpreter's own launch config batches many requests per program, where scalar reductions do
not apply, so the conformance suite never runs them. This test launches the padded and the ragged
chain sampling (with and without draft probabilities, unmasked, masked, masked through an index;
passed counts; the draft-aligned layout) with one request a program, AMD's plain tile loop over
several 32-id tiles in two chunks, both settings, and compares every integer output with the cpu
reference. Runs in a fresh process: TRITON_INTERPRET must be set before kernels are defined.
"""
import textwrap

from interpreter_probe import run_interpreter_probe

PROBE = textwrap.dedent("""
    import dataclasses, json, torch
    import spec_hal
    from spec_hal.masks import pack_bitmask
    import spec_hal.kernels.verify as kv

    default_launch = kv.sampling_launch

    def launch_with(scalar_reduce):
        def launch(target, bs, nodes, vocab):
            config = default_launch(target, bs, nodes, vocab)
            tiles = -(-vocab // 32)
            return dataclasses.replace(config, requests=1, tile_v=32, num_tiles=tiles, tiles_per_chunk=-(-tiles // 2),
                                       read_ahead=False, scalar_reduce=scalar_reduce)
        return launch

    reference, kernels = spec_hal.get_backend("cpu"), spec_hal.get_backend("triton-interpret")
    generator = torch.Generator().manual_seed(5)
    bs, steps, vocab = 3, 5, 150  # 5 tiles of 32 ids, the last one partial
    counts = torch.tensor([5, 0, 3])
    total = int(counts.sum())

    def probs(rows):
        return torch.softmax(3 * torch.randn(rows, vocab, generator=generator), dim=-1)

    target_probs, draft_probs = probs(bs * (steps + 1)).view(bs, steps + 1, vocab), probs(bs * steps).view(bs, steps, vocab)
    # drafts mostly the target's likeliest ids, so that chains are accepted to different depths
    drafts = torch.where(torch.rand(bs, steps, generator=generator) < 0.7, target_probs[:, :steps].argmax(-1),
                         torch.randint(0, vocab, (bs, steps), generator=generator))
    coins, final_coins = torch.rand(bs, steps, generator=generator), torch.rand(bs, generator=generator)
    flat_drafts = drafts[:, :3].reshape(-1)[:total].contiguous()
    flat_target, flat_draft_probs = probs(total + bs), probs(total)
    flat_coins = torch.rand(total, generator=generator)
    bonus = torch.randint(0, vocab, (bs,), generator=generator)

    def masks(rows, tokens):
        allowed = torch.rand(rows, vocab, generator=generator) < 0.6
        allowed[torch.arange(rows), tokens] = True
        index = torch.arange(rows, dtype=torch.int32)
        index[1::2] = -1
        return {"unmasked": {}, "masked": {"token_bitmask": pack_bitmask(allowed)},
                "half masked": {"token_bitmask": pack_bitmask(allowed), "bitmask_index": index}}

    padded_masks = masks(bs * (steps + 1), torch.cat([drafts, drafts[:, :1]], dim=1).reshape(-1))
    ragged_masks = masks(total + bs, torch.cat([flat_drafts, flat_drafts[:bs]]))

    def passed(b, q, **m):
        counts_out = torch.zeros(bs, dtype=torch.int32)
        verdict = b.verify_chain_sampling(drafts, q, target_probs, coins, final_coins, passed_counts=counts_out, **m)
        return verdict, counts_out

    cases = {
        "chain": (padded_masks, lambda b, **m: b.verify_chain_sampling(drafts, draft_probs, target_probs, coins, final_coins, **m)),
        "chain one-hot": (padded_masks, lambda b, **m: b.verify_chain_sampling(drafts, None, target_probs, coins, final_coins, **m)),
        "chain passed": (padded_masks, lambda b, **m: passed(b, draft_probs, **m)),
        "ragged": (ragged_masks, lambda b, **m: b.verify_chain_sampling_ragged(
            flat_drafts, counts, flat_draft_probs, flat_target, flat_coins, final_coins, max_drafts=steps, **m)),
        "ragged one-hot": (ragged_masks, lambda b, **m: b.verify_chain_sampling_ragged(
            flat_drafts, counts, None, flat_target, flat_coins, final_coins, max_drafts=steps, **m)),
        "ragged draft-aligned": (ragged_masks, lambda b, **m: b.verify_chain_sampling_ragged(
            flat_drafts, counts, flat_draft_probs, flat_target[:total], flat_coins, final_coins, max_drafts=steps,
            bonus_tokens=bonus, **m)),
    }
    fields = ("predict", "accept_index", "num_correct", "accept_lens")

    def same(want, got):
        if isinstance(want, tuple):
            return same(want[0], got[0]) and torch.equal(want[1], got[1])
        return all(torch.equal(getattr(want, f).long(), getattr(got, f).long()) for f in fields)

    results = {}
    for scalar_reduce in (True, False):
        kv.sampling_launch = launch_with(scalar_reduce)
        for name, (mask_cases, call) in cases.items():
            for mask_name, mask_args in mask_cases.items():
                if name == "ragged draft-aligned" and mask_args:
                    continue  # draft-aligned masks index T rows, not T + bs
                results[f"scalar_reduce={scalar_reduce} {name} {mask_name}"] = same(call(reference, **mask_args),
                                                                                     call(kernels, **mask_args))
    print(json.dumps(results))
""")


def test_scalar_and_vector_lane_reductions_match_the_reference():
    results = run_interpreter_probe(PROBE, timeout=600)
    assert len(results) == 32
    assert all(results.values()), {case: same for case, same in results.items() if not same}
