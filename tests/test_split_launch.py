"""The every-row processing's launch (kernels/sampling_rows.py: ``split_launch``): how a row is cut
into chunks on each vendor, and where a from-logits verify computes only its walk's rows
(``path_rows_pay``). Pure host arithmetic; the kernels' results do not depend on it
(tests/test_sampling_split.py runs them at 1-10 chunks a row)."""
import pytest

from spec_hal.kernels import sampling_rows
from spec_hal.kernels.launch import KernelTarget, cdiv

H100 = KernelTarget.for_arch("sm_90", multiprocessors=132)
MI300X = KernelTarget.for_arch("gfx942", multiprocessors=304)
SHAPES = [(rows, vocab) for rows in (1, 4, 16, 32, 64, 128, 256, 263, 264, 1024, 5000) for vocab in (10, 1000, 32000, 128256, 151936)]


@pytest.mark.parametrize("target", [H100, MI300X], ids=["sm_90", "gfx942"])
@pytest.mark.parametrize("rows,vocab", SHAPES)
def test_chunks_cover_the_row_without_an_empty_chunk(target, rows, vocab):
    config = sampling_rows.split_launch(target, rows, vocab)
    assert 1 <= config.chunks <= sampling_rows.MAX_CHUNKS
    for tile in (config.block_v, config.bins_block, config.kept_block):
        assert config.chunk_len % tile == 0  # the passes loop over whole tiles of a chunk
    assert (config.chunks - 1) * config.chunk_len < vocab <= config.chunks * config.chunk_len
    assert config.c_pad >= config.chunks


@pytest.mark.parametrize("rows,vocab", SHAPES)
def test_nvidia_chunks_fill_whole_waves_within_the_chunk_target(rows, vocab):
    """On NVIDIA a launch fills at most the fewest waves of 2 programs an SM whose chunks hold at
    most CHUNK_IDS ids (rounded up to a tile), and at most MAX_WAVES waves unless every row takes
    one chunk; the chunks hold at most CHUNK_IDS ids unless a limit stopped them."""
    config = sampling_rows.split_launch(H100, rows, vocab)
    slots = 2 * H100.multiprocessors
    fewest_waves = cdiv(cdiv(vocab, sampling_rows.CHUNK_IDS) * rows, slots)
    if config.chunks < sampling_rows.MAX_CHUNKS and fewest_waves <= sampling_rows.MAX_WAVES:
        assert config.chunk_len <= cdiv(sampling_rows.CHUNK_IDS, config.block_v) * config.block_v
    assert rows * config.chunks <= max(min(fewest_waves, sampling_rows.MAX_WAVES) * slots, rows)


@pytest.mark.parametrize("rows,vocab,chunks", [
    (16, 32000, 16),    # one wave: 264 // 16 = 16 chunks of 2048 (was 32 chunks of 1024: two waves)
    (32, 32000, 8),     # one wave: 8 chunks of 4096
    (64, 151936, 8),    # 7 chunks of at most 24576 ids take 448 programs: two waves, 528 // 64 = 8
    (128, 151936, 8),   # 4 waves
    (256, 151936, 4),   # 7 chunks would take 7 waves: MAX_WAVES leaves 4 (was 3 chunks)
    (1024, 151936, 1),  # past MAX_WAVES with one chunk a row
    (4, 151936, 30),    # MAX_CHUNKS wanted; 5120-id chunks make 30
    (256, 32000, 2),
])
def test_nvidia_chunks_at_measured_shapes(rows, vocab, chunks):
    assert sampling_rows.split_launch(H100, rows, vocab).chunks == chunks


def test_amd_keeps_about_four_programs_a_cu():
    """No AMD GPU here measured the wave rule: AMD keeps cdiv(4 x CUs, rows) chunks a row."""
    assert sampling_rows.split_launch(MI300X, 64, 151936).chunks == cdiv(151936, cdiv(cdiv(151936, cdiv(4 * 304, 64)), 1024) * 1024)
    assert sampling_rows.split_launch(MI300X, 16, 32000).chunks == 32


@pytest.mark.parametrize("rows,vocab,pays", [
    (8, 151936, False),    # bs 1 N 8: one wave of every-row programs (measured 1.05-1.08x on the path rows)
    (37, 151936, False),   # 7 chunks x 37 rows = 259 programs: still one wave of 264
    (38, 151936, True),    # 266 programs: two waves
    (64, 151936, True),    # bs 8 N 8 (measured 0.83x)
    (64, 32000, False),    # bs 8 N 8 at V 32000: one wave (measured 1.03-1.05x)
    (132, 32000, False),
    (133, 32000, True),
    (256, 32000, True),    # bs 64 N 4 (measured 0.82x)
    (44, 128256, False),
    (45, 128256, True),
])
def test_path_rows_from_two_waves_of_every_row_programs(rows, vocab, pays):
    """``path_rows_pay`` (kernels/sampling_rows.py): the walk's rows alone where step 5 over every
    row would take more than one wave of 2 programs an SM (132 SMs here)."""
    assert sampling_rows.path_rows_pay(H100, rows, vocab) is pays


def test_path_rows_limits():
    """No path rows past one slab of row blocks (they have no slabs); on AMD from more chunks than
    about 4 programs a CU; the interpreter takes them whenever they fit."""
    assert not sampling_rows.path_rows_pay(H100, sampling_rows.MAX_ROW_BLOCKS + 1, 32000)
    assert sampling_rows.path_rows_pay(MI300X, 5000, 151936)
    assert not sampling_rows.path_rows_pay(MI300X, 4, 32000)
    assert sampling_rows.path_rows_pay(KernelTarget("interpreter", None, 1, 1), 3, 10)


@pytest.mark.parametrize("target", [H100, MI300X], ids=["sm_90", "gfx942"])
@pytest.mark.parametrize("rows,vocab", SHAPES)
def test_window_cuts_tile_the_window(target, rows, vocab):
    """The window fold's tiles split the 4096-level window evenly (its grid is the tiles)."""
    config = sampling_rows.split_launch(target, rows, vocab)
    assert sampling_rows.WINDOW_LEVELS % config.cuts_tile == 0


@pytest.mark.parametrize("rows_per_request", [1, 4, 5, 64])
def test_slabs_bound_the_window_counts_of_small_vocabularies(rows_per_request):
    """``slab_rows``: where a row's window counts (32 KiB a chunk) outweigh its logits (2 bytes an
    id), a slab holds at most WINDOW_COUNTS_BYTES of them, in whole requests and at least one; the
    statistical cases' 24,000 rows of 8 ids were 786 MB of counts in one slab. Where they do not,
    or without a search (no counts), only the grid's row axis limits it."""
    row_counts_bytes = 2 * sampling_rows.WINDOW_LEVELS * 4
    small = sampling_rows.split_launch(H100, 24000, 8)
    slab = sampling_rows.slab_rows(small, rows_per_request, 8, search=True)
    assert slab % rows_per_request == 0 and slab >= rows_per_request
    assert slab * small.chunks * row_counts_bytes <= max(sampling_rows.WINDOW_COUNTS_BYTES, rows_per_request * small.chunks * row_counts_bytes)
    assert sampling_rows.slab_rows(small, rows_per_request, 8, search=False) >= 65535 - rows_per_request
    large = sampling_rows.split_launch(H100, 24000, 151936)
    assert sampling_rows.slab_rows(large, rows_per_request, 151936, search=True) >= 65535 - rows_per_request


def test_path_rows_need_one_slab_of_window_counts():
    """The path rows have no slabs: a small vocabulary with more rows than one slab of window
    counts keeps process_rows (on AMD, which takes the every-row path at every batch)."""
    rows = sampling_rows.WINDOW_COUNTS_BYTES // (2 * sampling_rows.WINDOW_LEVELS * 4) + 1
    assert not sampling_rows.path_rows_pay(MI300X, rows, 1000)
    assert sampling_rows.path_rows_pay(MI300X, rows, 151936)
