"""``spec-hal bench --sizes quick`` runs every suite on the CPU and writes complete JSON and
markdown reports. A smoke test: nothing here asserts anything about time."""
from __future__ import annotations

import json

import pytest
import torch

from spec_hal.bench import SUITES
from spec_hal.cli import main
from spec_hal.registry import all_ops


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # the bench uses one thread on CPU
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    json_path, markdown_path = folder / "bench.json", folder / "bench.md"
    code = main(["bench", "--backend", "cpu", "--sizes", "quick", "--quiet", "--json", str(json_path), "--markdown", str(markdown_path)])
    return code, json.loads(json_path.read_text()), markdown_path.read_text()


def test_quick_bench_runs_every_suite(quick_run):
    code, report, markdown = quick_run
    assert code == 0
    assert set(report["suite_seconds"]) == set(SUITES)
    assert {table["suite"] for table in report["tables"]} == set(SUITES)
    for key in ("device", "device_name", "backend", "torch", "triton", "spec_hal", "copy_bandwidth_gbs", "command"):
        assert key in report["environment"]
    assert report["environment"]["backend"] == "cpu"
    for table in report["tables"]:
        assert table["rows"], f"table {table['title']!r} has no rows"
        keys = {column["key"] for column in table["columns"]}
        for row in table["rows"]:
            assert set(row) <= keys
        assert f"### {table['title']}" in markdown


def test_host_and_coldstart_tables_cover_every_op(quick_run):
    _, report, _ = quick_run
    by_suite = {table["suite"]: table for table in report["tables"]}
    host_ops = [row["op"] for row in by_suite["host"]["rows"]]
    assert sorted(host_ops) == sorted(all_ops()), "an op without an example in spec_hal/bench/examples.py"
    assert all(row["public_us"] is not None and row["reference_us"] is not None for row in by_suite["host"]["rows"])
    cold_ops = {row["op"]: row for row in by_suite["coldstart"]["rows"]}
    assert set(cold_ops) == set(all_ops())
    assert all(row["first_ms"] is not None and row["second_process_ms"] is not None for row in cold_ops.values())


def test_bench_rejects_an_unknown_backend(capsys):
    assert main(["bench", "--backend", "no-such-backend", "--sizes", "quick", "--quiet"]) == 3


def test_masks_suite_allows_each_request_its_candidates():
    """The masks suite's masks allow every candidate of a request in each of that request's rows
    (drafts proposed under the grammar), so masking does not reject drafts and the masked and
    unmasked runs verify the same trees; the other ids stay about 70% allowed."""
    from spec_hal.bench.masks import _masks
    from spec_hal.masks import allowed_matrix

    bs, nodes, vocab = 5, 4, 300
    candidates = torch.randint(0, vocab, (bs, nodes), generator=torch.Generator().manual_seed(0))
    mask, index = _masks(bs * nodes, vocab, "cpu", candidates)
    allowed = allowed_matrix(mask, None, bs * nodes, vocab)
    rows = torch.arange(bs * nodes)[:, None]
    own_candidates = candidates.repeat_interleave(nodes, dim=0)  # row b * N + n: request b's candidates
    assert allowed[rows, own_candidates].all()
    other = torch.ones_like(allowed)
    other[rows, own_candidates] = False
    assert 0.6 < allowed[other].float().mean() < 0.8
    plain, _ = _masks(bs * nodes, vocab, "cpu")
    assert not allowed_matrix(plain, None, bs * nodes, vocab)[rows, own_candidates].all()


def test_masks_suite_covers_masked_verification_and_ragged_chains(tmp_path):
    """The masks suite (issue #14): masked vs unmasked rows per op, and every ragged chain op
    (greedy, sampling with and without draft probabilities) against its padded op."""
    json_path = tmp_path / "masks.json"
    assert main(["bench", "--backend", "cpu", "--sizes", "quick", "--only", "masks", "--quiet", "--json", str(json_path)]) == 0
    masks, ragged = json.loads(json_path.read_text())["tables"]
    assert {row["op"] for row in masks["rows"]} >= {"verify_greedy(logits)", "verify_sampling", "verify_chain(logits)", "draft_topk(k=4)",
                                                     "verify_chain_sampling", "verify_chain_sampling(draft_probs=None)", "verify_tree_sampling"}
    assert all(row["plain_us"] is not None and row["masked_us"] is not None for row in masks["rows"])
    assert {row["op"] for row in ragged["rows"]} == {"verify_chain_ragged (logits)", "verify_chain_sampling_ragged",
                                                     "verify_chain_sampling_ragged (draft_probs=None)"}
    assert all(row["ragged_us"] is not None and row["padded_us"] is not None for row in ragged["rows"])
    assert all(row["padded_drafts"] >= row["drafts"] for row in ragged["rows"])
