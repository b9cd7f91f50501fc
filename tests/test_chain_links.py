"""The chain trees that ``verify_chain_sampling_from_logits`` walks without draft probabilities
(kernels/sampling.py: ``_chain_parts``) are views of persistent per-(device, S) buffers, grown by
powers of two. Checked here: the links, retrieve index and zero columns equal a chain built from
scratch at every batch size; growing keeps the outgrown buffer alive (a captured CUDA graph may
still read it; freeing it would let the graph read reused memory); and a sequence of calls that
grows the buffer between two batch sizes gives the cpu reference's verdicts at each call. Inside a
stream capture (simulated: the CPU has none) a batch that outgrows the buffer gets links of its own
and the cache is left as it was (a buffer made in a capture holds values only once that graph has
replayed).
Runs in a fresh process: TRITON_INTERPRET must be set before kernels are defined.
"""
import textwrap

from interpreter_probe import run_interpreter_probe

PROBE = textwrap.dedent("""
    import json, torch
    import spec_hal
    import spec_hal.kernels.sampling as ks

    def chain_ok(bs, steps):
        tree, zero_ids, zero_coins = ks._chain_parts(bs, steps, torch.device("cpu"))
        lanes = torch.arange(steps + 1)
        want_next = torch.where(lanes < steps, lanes + 1, -1).expand(bs, steps + 1)
        index = torch.arange(bs * (steps + 1)).view(bs, steps + 1)
        return (torch.equal(tree.retrieve_next_token, want_next) and bool((tree.retrieve_next_sibling == -1).all())
                and torch.equal(tree.retrieve_index, index) and tree.num_steps == steps
                and zero_ids.shape == (bs, 1) and zero_ids.dtype == torch.int64 and not zero_ids.any()
                and zero_coins.shape == (bs, 1) and zero_coins.dtype == torch.float32 and not zero_coins.any())

    result = {"small": chain_ok(3, 4)}
    first = ks._CHAIN_LINKS[(torch.device("cpu"), 4)]
    result["grown"] = chain_ok(40, 4)
    second = ks._CHAIN_LINKS[(torch.device("cpu"), 4)]
    result["capacities"] = [first[0], second[0]]
    result["outgrown kept"] = any(entry[1] is first[1] for entry in ks._OUTGROWN)
    result["small after growth"] = chain_ok(3, 4) and chain_ok(0, 4)
    result["other steps"] = chain_ok(5, 2)
    ks.capturing = lambda device: True  # as inside a CUDA stream capture: no buffer made or grown
    result["captured"] = chain_ok(100, 4) and chain_ok(3, 7)
    result["cache after capture"] = [ks._CHAIN_LINKS[(torch.device("cpu"), 4)][0], (torch.device("cpu"), 7) in ks._CHAIN_LINKS]
    ks.capturing = lambda device: False

    reference, kernels = spec_hal.get_backend("cpu"), spec_hal.get_backend("triton-interpret")
    generator = torch.Generator().manual_seed(3)
    same = []
    for bs in (2, 70, 2):  # 70 outgrows the 64 rows of the buffer made for 40
        steps, vocab = 4, 50
        logits = torch.randn(bs * (steps + 1), vocab, generator=generator) * 2
        draft = torch.randint(0, vocab, (bs, steps), generator=generator)
        draft[:, 0] = logits.view(bs, steps + 1, vocab)[:, 0].argmax(-1)  # some acceptances
        seed, offset = torch.arange(bs, dtype=torch.int64), torch.full((bs,), 7, dtype=torch.int64)
        args = dict(temperature=0.7, seed=seed, offset=offset)
        ours = kernels.verify_chain_sampling_from_logits(draft, None, logits, **args).verdict
        want = reference.verify_chain_sampling_from_logits(draft, None, logits, **args).verdict
        same.append(all(torch.equal(getattr(ours, f), getattr(want, f)) for f in ("predict", "accept_index", "num_correct", "accept_lens")))
    result["verdicts"] = same
    print(json.dumps(result))
""")


def test_chain_links_are_exact_at_every_size_and_outgrown_buffers_stay_alive():
    result = run_interpreter_probe(PROBE)
    assert result["small"] and result["grown"] and result["small after growth"] and result["other steps"], result
    assert result["capacities"] == [16, 64], result
    assert result["outgrown kept"], result
    assert result["captured"] and result["cache after capture"] == [64, False], result
    assert result["verdicts"] == [True, True, True], result
