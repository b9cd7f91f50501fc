"""The first pass of the every-row cut searches (kernels/sampling_rows.py: ``_level_bins_kernel``)
against the reference's weights: every chunk's 16 bins of 4096 levels hold the exact sum of the
weights (top-p rows) and the number of ids (top-k rows) whose level falls in them.

The later passes pick a cut's digit from these sums, so an error in a light bin (digits 8 and 9
weigh at most 2^7 and 2^3 an id against 2^39 at the max) would rarely move a cut and could pass the
end-to-end cases; this test reads the bins themselves. Rows sweep every digit from 0 to LEVEL_MAX
(and past it), in order and shuffled, with NaN, +-inf, and a temperature that puts most ids in the
light digits. Dropping the weights of digits 8 and up, or adding them to bin 7, fails here
(checked by mutation, 2026-11-30). Written for a rework of the pass's accumulators (BENCHMARKS.md,
forty-fifth session). Runs in a fresh process: TRITON_INTERPRET must be set before kernels are
defined."""
import textwrap

from interpreter_probe import run_interpreter_probe

PROBE = textwrap.dedent("""
    import json, torch
    import spec_hal
    import spec_hal.kernels.sampling_rows as rows_kernels
    import spec_hal.sampling as semantics
    from spec_hal.topk import sanitize_logits

    captured = []  # the bins tensor of each _level_bins_kernel launch, (rows, chunks, 2, 16) int64
    kernel = rows_kernels._level_bins_kernel
    bins_at = kernel.arg_names.index("bins_ptr")

    class Recorder:
        def __getitem__(self, grid):
            launch = kernel[grid]

            def run(*args, **kwargs):
                captured.append(args[bins_at])
                return launch(*args, **kwargs)
            return run

    rows_kernels._level_bins_kernel = Recorder()
    chunk_len = 64  # 5 chunks of 4 tiles a row
    rows_kernels.split_launch = lambda target, rows, vocab: rows_kernels.SplitLaunch(
        rows=4, chunks=-(-vocab // chunk_len), chunk_len=chunk_len, block_v=16, bins_block=16, kept_block=16, warps=1)

    vocab, rows = 300, 5
    generator = torch.Generator().manual_seed(0)
    temperature = torch.tensor([1.0, 0.7, 2.5, 1.0, 0.05])
    scale = semantics.row_params(rows, vocab, "cpu", temperature, 0, 1.0, 0.0).scale
    sweep = torch.linspace(0, semantics.LEVEL_MAX + 500, vocab)  # every digit, 10 and past LEVEL_MAX
    x = torch.empty(rows, vocab)
    x[0] = 10.0 - sweep / scale[0]
    x[1] = (10.0 - sweep / scale[1])[torch.randperm(vocab, generator=generator)]
    x[2] = torch.randn(vocab, generator=generator) * 8
    x[3] = x[0][torch.randperm(vocab, generator=generator)]
    x[3, ::17] = float("nan")
    x[3, 5::23] = float("-inf")
    x[3, 200] = float("inf")
    x[4] = torch.randn(vocab, generator=generator) * 0.6  # temperature 0.05: most ids in digits 5-10
    results = {}
    kernels = spec_hal.get_backend("triton-interpret")
    kernels.process_logits(x, temperature=temperature, top_k=torch.full((rows,), 7), top_p=0.9)
    bins = captured[-1]
    chunks = bins.shape[1]
    xs = sanitize_logits(x)
    level, weight = semantics.levels_and_weights(xs, xs.max(dim=1).values, scale)
    digit = level >> 12
    mass = torch.zeros(rows, chunks, 16, dtype=torch.int64)
    count = torch.zeros(rows, chunks, 16, dtype=torch.int64)
    for chunk in range(chunks):
        part = slice(chunk * chunk_len, (chunk + 1) * chunk_len)
        for d in range(16):
            here = digit[:, part] == d
            mass[:, chunk, d] = torch.where(here, weight[:, part], 0).sum(dim=1)
            count[:, chunk, d] = here.sum(dim=1)
    results["mass"] = torch.equal(bins[:, :, 0], mass)
    results["count"] = torch.equal(bins[:, :, 1], count)
    results["digits 8 and 9 weigh"] = bool((mass[:, :, 8] > 0).any() and (mass[:, :, 9] > 0).any())
    results["digit 10 counted"] = bool((count[:, :, 10] > 0).any())
    print(json.dumps(results))
""")


def test_level_bins_hold_each_digits_exact_weight_and_count():
    results = run_interpreter_probe(PROBE, timeout=600)
    assert all(results.values()), results
