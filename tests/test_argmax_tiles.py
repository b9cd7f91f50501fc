"""The fused argmax over target logits (``_argmax_tile_kernel`` + the walks' merge of its tiles)
over several tiles per row, with NaN, infinities, ties across tiles, signed zeros and token
bitmasks (nothing allowed, the maximum masked, only -inf allowed).

The interpreter's own launch config gives a row one tile, so the conformance suite never merges
tiles there. This test launches the kernels through the interpreter with 32-id tiles (V = 150:
four whole tiles and a partial one) and compares the argmax (``verify_chain``'s bonus token at
width 1) with the cpu reference.
Runs in a fresh process: TRITON_INTERPRET must be set before kernels are defined.
"""
import textwrap

from interpreter_probe import run_interpreter_probe

PROBE = textwrap.dedent("""
    import dataclasses, json, torch
    import spec_hal
    from spec_hal.masks import pack_bitmask
    import spec_hal.kernels.verify as kv
    from spec_hal.kernels.launch import KernelTarget

    default_launch = kv.argmax_launch
    kv.argmax_launch = lambda target, rows, vocab: dataclasses.replace(default_launch(target, rows, vocab), block=32)

    reference, kernels = spec_hal.get_backend("cpu"), spec_hal.get_backend("triton-interpret")
    generator = torch.Generator().manual_seed(11)
    rows, vocab = 10, 150
    logits = torch.randn(rows, vocab, generator=generator)
    logits[1, ::3] = float("nan")
    logits[1, 77] = float("inf")
    logits[1, 140] = float("inf")                    # +inf twice: the lower id
    logits[2] = float("nan")                         # nothing but NaN: id 0
    logits[3] = float("-inf")
    logits[4] = torch.randint(0, 2, (vocab,), generator=generator).float()  # ties across every tile
    logits[5, :] = -1.0
    logits[5, 145] = 3.0                             # the maximum in the partial tile
    logits[6, :128] = float("-inf")                  # the whole tiles all -inf
    logits[7, 33] = float("nan")
    logits[7, 64] = 1e30
    logits[8, 0] = -0.0
    logits[8, 1:] = float("-inf")
    logits[8, 40] = 0.0                              # signed zeros tie: the lower id
    logits[9] = logits[9] * 1e38
    allowed = torch.rand(rows, vocab, generator=generator) < 0.5
    allowed[3] = False                               # nothing allowed
    allowed[5, 145] = False                          # the maximum masked
    allowed[6, :128] = True                          # only -inf allowed in the whole tiles
    allowed[6, 128:] = False
    allowed[7, 64] = False
    candidates = torch.zeros(rows, 1, dtype=torch.int64)
    results = {}
    for name, extra in {"plain": {}, "masked": {"token_bitmask": pack_bitmask(allowed)}}.items():
        for dtype in (torch.float32, torch.bfloat16):
            x = logits.to(dtype)
            want, got = reference.verify_chain(candidates, x, **extra), kernels.verify_chain(candidates, x, **extra)
            results[f"{name} {dtype}"] = all(torch.equal(w.long(), g.long()) for w, g in zip(want, got))
    results["tiles per row"] = kv.argmax_tiles_per_row(logits, KernelTarget("interpreter", None, 1, 1))
    print(json.dumps(results))
""")


def test_argmax_over_several_tiles_matches_the_reference():
    results = run_interpreter_probe(PROBE, timeout=600)
    assert results.pop("tiles per row") == 5
    assert len(results) == 4
    assert all(results.values()), {case: same for case, same in results.items() if not same}
