"""``move_kv``'s default-mode records (kernels/kv.py: ``_move_rows_kernel``), launched directly
under the Triton interpreter. Every program records ``RECORD_BLOCK`` entries of the list at a time
before its walk, grid-stride over all (cache, tile) programs, so a bad entry anywhere in a long
list must reach the flag at its index in the caller's list, and the smallest code must win: the
first bad ``src`` entry, else the first bad ``dst`` entry.

The conformance suite's fuzz lists are a few entries long, which program (0, 0) alone records;
these lists of 1300 entries spread their bad entries over the blocks of every program of a
(3 caches, 2 tiles) grid.
"""
import textwrap

from interpreter_probe import run_interpreter_probe

PROBE = textwrap.dedent("""
    import json, torch
    import spec_hal.kernels.kv as kv

    CODE = 2**44  # a record code is op + argument + index: int64, as the op's own codes are
    NO_RECORD = 2**62
    caches = torch.zeros(3, 60, 40)  # 3 caches of 60 slots, rows of 40 floats: 2 tiles of 32 columns
    offsets = torch.tensor([0, 60 * 40, 2 * 60 * 40])

    def flag_after(src, dst):
        flag = torch.full((1,), NO_RECORD, dtype=torch.int64)
        kv._move_rows_kernel[(3, 2)](caches, offsets, 40, 60, 40, src, dst, src.shape[0], 50, flag, CODE,
                                     CHUNK=64, BLOCK=32, OFFSET_MULTIPLE=1, RECORD_BLOCK=kv.RECORD_BLOCK)
        return int(flag)

    def lists(bad_src, bad_dst, length=1300):
        src, dst = torch.full((length,), -1), torch.full((length,), -1)
        for index, value in bad_src.items():
            src[index] = value
        for index, value in bad_dst.items():
            dst[index] = value
        return src, dst

    results = {}
    for index in (0, 31, 32, 200, 545, 1000, 1299):  # blocks of programs 0, 1, 6, 5, 1, 1, 4 (RECORD_BLOCK 32)
        for value in (50, 59, -2):  # >= check_slots (50), even where the cache has the slot; below -1
            results[f"src {index} {value}"] = flag_after(*lists({index: value}, {})) == CODE + index
            results[f"dst {index} {value}"] = flag_after(*lists({}, {index: value})) == CODE + 2**40 + index
    results["smallest src wins"] = flag_after(*lists({545: 50, 1100: -2}, {200: 99})) == CODE + 545
    results["smallest dst wins"] = flag_after(*lists({}, {1299: 70, 700: -3})) == CODE + 2**40 + 700
    results["valid list records nothing"] = flag_after(*lists({5: 49, 900: 0}, {5: 1, 900: 48})) == NO_RECORD
    print(json.dumps(results))
""")


def test_every_program_records_its_blocks_of_a_long_list():
    results = run_interpreter_probe(PROBE)
    assert len(results) == 7 * 3 * 2 + 3
    assert all(results.values()), {case: same for case, same in results.items() if not same}
