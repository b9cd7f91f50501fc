"""``move_kv``'s packing kernel (kernels/kv.py: ``_pack_moves_kernel``), launched directly under
the Triton interpreter: the used moves (source and destination both >= 0) first, in list order,
then -1 in every other position, the number of used moves in ``count``, and the smallest bad
entry recorded at its index in the caller's list.

The conformance suite checks move_kv's effect on the caches, which a wrong tail cannot always
show: stale scratch that holds equal source and destination (zeros) copies a slot onto itself.
This test fills the scratch with a sentinel, so any position the kernel leaves unwritten fails.
Lists of 1 to 1300 entries cover one program, a full block, one past it, and programs that count
the used moves of several blocks before their own.
"""
import textwrap

from interpreter_probe import run_interpreter_probe

PROBE = textwrap.dedent("""
    import json, torch
    import spec_hal.kernels.kv as kv
    from spec_hal.kernels.launch import cdiv

    CODE = 2**44  # a record code is op + argument + index: int64, as the op's own codes are
    generator = torch.Generator().manual_seed(3)
    results = {}
    for length in (1, 7, 255, 256, 257, 600, 1300):
        for density in (0.0, 0.3, 1.0):
            src = torch.randint(0, 50, (length,), generator=generator)
            dst = torch.randint(0, 50, (length,), generator=generator)
            src[torch.rand(length, generator=generator) > density] = -1
            dst[torch.rand(length, generator=generator) < 0.1] = -1
            for index_dtype in (torch.int32, torch.int64):
                packed_src = torch.full((length,), -7, dtype=torch.int64)
                packed_dst = torch.full((length,), -7, dtype=torch.int64)
                count = torch.full((1,), -7, dtype=torch.int64)
                flag = torch.full((1,), 2**62, dtype=torch.int64)
                kv._pack_moves_kernel[(cdiv(length, kv.PACK_BLOCK),)](
                    src.to(index_dtype), dst.to(index_dtype), length, 50, packed_src, packed_dst, count, flag, CODE,
                    BLOCK=kv.PACK_BLOCK, SCAN=kv.PACK_SCAN)
                used = (src >= 0) & (dst >= 0)
                want_src = torch.cat([src[used], torch.full((length - int(used.sum()),), -1)])
                want_dst = torch.cat([dst[used], torch.full((length - int(used.sum()),), -1)])
                results[f"{length} {density} {index_dtype}"] = bool(
                    torch.equal(packed_src, want_src) and torch.equal(packed_dst, want_dst) and int(count) == int(used.sum())
                    and int(flag) == 2**62)
    # Bad entries (outside -1 .. check_slots - 1) in the third and fifth blocks: the smallest
    # index of the first argument is recorded, as the unpacked kernel records it.
    src, dst = torch.full((1300,), -1), torch.full((1300,), -1)
    src[530], src[1100], dst[700] = 50, -2, 99
    flag = torch.full((1,), 2**62, dtype=torch.int64)
    scratch = torch.empty(1300, dtype=torch.int64)
    kv._pack_moves_kernel[(cdiv(1300, kv.PACK_BLOCK),)](src, dst, 1300, 50, scratch, scratch.clone(), torch.empty(1, dtype=torch.int64),
                                                        flag, CODE, BLOCK=kv.PACK_BLOCK, SCAN=kv.PACK_SCAN)
    results["records"] = int(flag) == CODE + 530
    print(json.dumps(results))
""")


def test_pack_puts_used_moves_first_and_minus_one_after():
    results = run_interpreter_probe(PROBE, timeout=900)
    assert len(results) == 7 * 3 * 2 + 1
    assert all(results.values()), {case: same for case, same in results.items() if not same}
