"""The fused walk's weight tests (kernels/sampling.py: ``_floor_level``, ``_walk_tests``,
``_walk_weights``) and its greedy requests, under the interpreter.

Since the forty-ninth session a pass of the fused walk weighs a tile in one of three modes: plain
weights (temperature alone), a level limit (top-p's level cut and min-p's floor, the shallower:
only the ids at or above it are weighed), or every test (a key cut or a greedy row in the
program). min-p enters as a level: ``_floor_level`` finds the deepest level whose weight is at
least the row's min weight. A greedy request takes no kept pass (its total is its argmax's weight)
and, in a program of greedy requests only, reads no final row (its final token is its last row's
argmax).

1. ``_floor_level`` against a brute force over every level of the reference table, at min weights
   equal to a level's weight (a strict comparison fails there), one above and one below, 0, 1,
   negative, and the top weight.
2. The fused walk against the cpu reference, bit for bit, on batches whose interpreter program
   mixes greedy requests with requests that take the plain and the level modes (no top-k
   anywhere, so no program falls back to every test): a final token taken from the sampled pass
   for a greedy request fails here, as does a level limit one level short.

Runs in a fresh process: TRITON_INTERPRET must be set before kernels are defined.
"""
import textwrap

from interpreter_probe import run_interpreter_probe

PROBE = textwrap.dedent("""
    import json, torch
    import triton, triton.language as tl
    import spec_hal
    import spec_hal.sampling as semantics
    import spec_hal.kernels.sampling as sampling_kernels

    results = {}

    @triton.jit
    def floor_kernel(min_weight_ptr, out_ptr, table_ptr, count, BLOCK: tl.constexpr):
        lanes = tl.arange(0, BLOCK)
        ok = lanes < count
        min_weight = tl.load(min_weight_ptr + lanes, mask=ok, other=0)
        tl.store(out_ptr + lanes, sampling_kernels._floor_level(min_weight, table_ptr), mask=ok)

    table = semantics.exp2_table("cpu")
    levels = torch.arange(semantics.LEVEL_MAX + 1)
    weights = table[levels & ((1 << semantics.LEVEL_BITS) - 1)] >> (levels >> semantics.LEVEL_BITS)
    probes = [0, -5, 1, 2, 2**semantics.WEIGHT_BITS, 2**semantics.WEIGHT_BITS - 1]
    for level in (0, 1, 2, 511, 1023, 1024, 1025, 5000, 20479, 20480, 37000, 39935, 40958):
        w = int(weights[level])
        probes += [w, w + 1, w - 1]
    probes = [m for m in probes if m <= 2**semantics.WEIGHT_BITS]  # min-p <= 1: a min weight is at most the top weight
    min_weight = torch.tensor(probes, dtype=torch.int64)
    want = torch.tensor([int((weights >= m).nonzero().max()) if m > 0 else semantics.LEVEL_MAX for m in probes], dtype=torch.int32)
    got = torch.empty(len(probes), dtype=torch.int32)
    floor_kernel[(1,)](min_weight, got, table, len(probes), BLOCK=64)
    results["floor level"] = bool(torch.equal(want, got))

    reference, kernels = spec_hal.get_backend("cpu"), spec_hal.get_backend("triton-interpret")
    generator = torch.Generator().manual_seed(7)
    bs, nodes, vocab = 24, 4, 300
    logits = torch.randn(bs * nodes, vocab, generator=generator) * 3
    logits[::5, 7] = 40.0                                  # rows dominated by one token
    # Chains (a greedy drafter, no draft probabilities): each request walks its rows in order.
    drafts = torch.randint(0, vocab, (bs, nodes - 1), generator=generator)
    drafts[:, 0] = logits.reshape(bs, nodes, vocab)[:, 0].argmax(dim=1)
    patterns = {
        "greedy and plain": dict(temperature=torch.tensor([0.0, 0.9] * (bs // 2))),
        "greedy and min-p": dict(temperature=torch.tensor([0.0, 1.1, 0.7] * (bs // 3)),
                                 min_p=torch.tensor([0.0, 0.1, 0.02] * (bs // 3))),
        "greedy, top-p and min-p": dict(temperature=torch.tensor([1.0, 0.0, 0.8, 1.3] * (bs // 4)),
                                        top_p=torch.tensor([0.9, 1.0, 0.5, 1.0] * (bs // 4)),
                                        min_p=torch.tensor([0.05, 0.0, 0.0, 0.2] * (bs // 4))),
        "every request greedy": dict(temperature=torch.zeros(bs)),
        "min-p alone, a number": dict(temperature=0.9, min_p=0.07),
        "top-p alone, a number": dict(temperature=1.2, top_p=0.6),
    }
    for name, params in patterns.items():
        for logprobs in (None, "raw", "processed"):
            args = dict(params, seed=torch.arange(bs) + 3, offset=torch.zeros(bs, dtype=torch.int64), logprobs=logprobs)
            for dtype in (torch.float32, torch.bfloat16):
                want = reference.verify_chain_sampling_from_logits(drafts, None, logits.to(dtype), **args)
                got = kernels.verify_chain_sampling_from_logits(drafts, None, logits.to(dtype), **args)
                same = all(torch.equal(getattr(want.verdict, f), getattr(got.verdict, f)) for f in ("predict", "accept_index", "accept_lens"))
                if logprobs is not None:
                    same = same and torch.allclose(want.logprobs, got.logprobs, atol=1e-5, equal_nan=True)
                results[f"{name} {logprobs} {dtype}"] = bool(same)
    print(json.dumps(results))
""")


def test_walk_weight_modes_match_the_reference():
    results = run_interpreter_probe(PROBE)
    assert len(results) == 1 + 6 * 3 * 2
    assert all(results.values()), {case: same for case, same in results.items() if not same}
