"""Benchmark of ``move_kv``: the accepted-path KV move of tree drafting (P13).

Workload per (bs, S, K, N): a pool of ``layers`` x (K, V) caches of (num_slots, heads, head_dim)
bf16; every request moves S rows (ranks 1..S, each from the next verify slot down by one: the
longest overlapping chain a fully accepted tree path can produce, so every source but the last
is also a destination). Requests sit at random places in the pool. Bandwidth counts the bytes
read plus written by the moves and is reported as a share of this device's measured copy
bandwidth; the torch reference (``spec_hal.kv.move_kv``) and ``torch.compile`` of it run in the
same process on the same inputs.

    python benchmarks/kv.py [--quick] [--device cuda] [--no-compile]
"""
from __future__ import annotations

import torch

from harness import DEVICE_TIME_NOTE, common_arguments, copy_bandwidth, device_time_s, fmt_ratio, fmt_us, header, maybe_compile

CONFIGS = ((3, 1, 4), (5, 4, 8), (5, 8, 32))  # (S, K, N)
BATCHES = (1, 64, 256)


def build_moves(bs: int, steps: int, nodes: int, num_slots: int, device, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(bs*(S+1),) src/dst like accepted_kv_moves: rank 0 skipped (-1), ranks 1..S shifted down."""
    width = steps + 1
    blocks = num_slots // (nodes + 1)
    starts = torch.randperm(blocks, generator=generator)[:bs] * (nodes + 1)
    ranks = torch.arange(width)
    src = (starts[:, None] + torch.clamp(ranks + 1, max=nodes - 1)[None, :]).clone()
    dst = (starts[:, None] + ranks[None, :]).clone()
    moved = (ranks >= 1) & (ranks + 1 <= nodes - 1)
    src[:, ~moved] = -1
    dst[:, ~moved] = -1
    return src.reshape(-1).to(device), dst.reshape(-1).to(device)


def main(argv=None) -> None:
    parser = common_arguments(__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--slots", type=int, default=65536, help="slots per cache")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    import spec_hal
    from spec_hal.kv import move_kv as reference_move_kv

    if args.quick:
        args.layers, args.slots = min(args.layers, 2), min(args.slots, 16384)
    backend = spec_hal.get_backend("cuda" if device.type == "cuda" else ("rocm" if device.type == "hip" else "triton-interpret"))
    caches = [torch.randn(args.slots, args.heads, args.head_dim, device=device).to(torch.bfloat16) for _ in range(2 * args.layers)]
    row_bytes = args.heads * args.head_dim * 2
    compiled = None if args.no_compile else maybe_compile(reference_move_kv, device)
    batches = (1, 64) if args.quick else BATCHES
    configs = CONFIGS[1:2] if args.quick else CONFIGS
    timing = dict(warmup=1, repeat=2, trials=1) if device.type == "cpu" else {}
    command = "python benchmarks/kv.py" + (" --quick" if args.quick else "")
    print(header(f"move_kv ({args.layers} layers x (K, V) x {args.heads} heads x {args.head_dim} bf16, {args.slots} slots)", device, command))
    print(DEVICE_TIME_NOTE)
    bandwidth = copy_bandwidth(device, nbytes=(1 << 30) if device.type == "cuda" else (1 << 26))
    print(f"copy bandwidth used as 100%: {bandwidth / 1e9:.0f} GB/s\n")
    print("| bs | S, K, N | moves | MB moved | spec_hal (us) | share of copy BW | torch ref (us) | torch.compile (us) | vs ref | vs compile |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for steps, topk, nodes in configs:
        for bs in batches:
            src, dst = build_moves(bs, steps, nodes, args.slots, device, generator)
            moves = int(((src >= 0) & (dst >= 0)).sum())
            nbytes = 2 * moves * row_bytes * len(caches)
            ours = device_time_s(lambda: backend.move_kv(caches, src, dst), device, **timing)
            ref = device_time_s(lambda: reference_move_kv(caches, src, dst), device, **timing)
            comp = device_time_s(None if compiled is None else (lambda: compiled(caches, src, dst)), device, **timing)
            share = nbytes / ours / bandwidth if moves else 0.0
            print(f"| {bs} | {steps}, {topk}, {nodes} | {moves} | {nbytes / 1e6:.1f} | {fmt_us(ours)} | {share:.0%} | "
                  f"{fmt_us(ref)} | {fmt_us(comp)} | {fmt_ratio(ref, ours)} | {fmt_ratio(comp, ours)} |", flush=True)


if __name__ == "__main__":
    main()
