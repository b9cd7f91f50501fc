"""spec_hal.distributed and the tensor-parallel engine loop over gloo, two CPU processes (issue 19).

One two-rank session (module fixture, hard deadline) runs the helper checks and the engine
scenarios; the tests below assert on what each rank reported. ``SPEC_HAL_TP_ROUNDS`` sets the
rounds of the greedy and the sampling run (default 500, the issue's figure).
"""
from __future__ import annotations

import os
import time

import pytest
import torch

from spec_hal.distributed import broadcast_tensors, broadcast_verdict, check_consensus, fingerprint
from spec_hal.errors import InvalidInput, RankDivergence
from spec_hal.testing import tp_engine
from spec_hal.types import Verdict

ROUNDS = int(os.environ.get("SPEC_HAL_TP_ROUNDS", "500"))
SESSION_TIMEOUT_S = 600  # hard deadline of the two-rank session (a hang fails the test, it never blocks CI)


def _verdict(bs: int, nodes: int, width: int, *, base: int) -> Verdict:
    """A verdict whose every value depends on ``base`` (so ranks with different bases differ)."""
    return Verdict(predict=torch.arange(bs * nodes, dtype=torch.int32) + base,
                   accept_index=torch.arange(bs * width, dtype=torch.int32).view(bs, width) * 3 + base,
                   num_correct=torch.full((bs,), base, dtype=torch.int32),
                   accept_lens=torch.full((bs,), base + 1, dtype=torch.int32))


def _rejected_argument(call) -> str:
    try:
        call()
    except InvalidInput as exc:
        return exc.argument
    return "nothing rejected"


def _rank_checks(device: torch.device, rounds: int) -> dict:
    """What each rank runs: the helpers on values that differ per rank, then the engine scenarios."""
    import torch.distributed as dist

    rank = dist.get_rank()
    out: dict = {"rank": rank}
    # The verdict, tokens and logprobs of rank 1 reach rank 0 (src = 1), in one collective.
    mine = _verdict(3, 4, 3, base=100 * rank)
    tokens = torch.arange(12, dtype=torch.int64).view(3, 4) - rank
    logprobs = torch.linspace(-2.0, 0.0, 3, dtype=torch.float32) * (rank + 1)
    got = broadcast_verdict(mine, src=1, tokens=tokens, logprobs=logprobs)
    source = _verdict(3, 4, 3, base=100)
    out["broadcast_equals_rank_1"] = all(torch.equal(getattr(got.verdict, f), getattr(source, f)) for f in
                                         ("predict", "accept_index", "num_correct", "accept_lens")) and torch.equal(
        got.tokens, torch.arange(12, dtype=torch.int64).view(3, 4) - 1) and torch.equal(
        got.logprobs, torch.linspace(-2.0, 0.0, 3, dtype=torch.float32) * 2)
    out["inputs_untouched"] = torch.equal(mine.predict, _verdict(3, 4, 3, base=100 * rank).predict)
    # bs = 0 on every rank (an idle replica): the collective still runs; shapes and dtypes kept.
    empty = broadcast_verdict(_verdict(0, 4, 3, base=rank), tokens=torch.empty(0, 4, dtype=torch.int64),
                              logprobs=torch.empty(0, dtype=torch.bfloat16))
    out["bs0_shapes"] = [list(t.shape) for t in (*empty.verdict.__dict__.values(), empty.tokens, empty.logprobs)]
    out["bs0_dtypes"] = [str(t.dtype) for t in (empty.tokens, empty.logprobs)]
    # Mixed dtypes and odd sizes in one buffer (segments stay aligned).
    mixed = broadcast_tensors([torch.tensor([True, rank == 0, False]), torch.arange(5, dtype=torch.int16) + rank,
                               torch.tensor(2.5 + rank, dtype=torch.float64),
                               torch.tensor([1 + 2j * (rank + 1)], dtype=torch.complex128)], src=0)
    out["mixed"] = [mixed[0].tolist(), mixed[1].tolist(), float(mixed[2]), str(mixed[3].tolist())]
    # Bad arguments are rejected before any collective, so the ranks stay in step.
    out["bad_src"] = [_rejected_argument(lambda: broadcast_verdict(mine, src=src)) for src in (2, -1, True)]
    out["bad_reference"] = _rejected_argument(lambda: check_consensus({"x": tokens}, reference=2))
    # Consensus: agreement passes; a tensor that differs on rank 1 only is named, on both ranks.
    check_consensus({"same": torch.arange(7), "empty": torch.empty(0, 3)}, what="agreement")
    out["agreement_passed"] = True
    logits = torch.tensor([1.0, 2.0], dtype=torch.float64)
    if rank == 1:  # one ulp: "logits that differ in the last bit"
        logits = logits.nextafter(torch.tensor(3.0, dtype=torch.float64))
    try:
        check_consensus({"same": torch.arange(7), "differs": logits}, what="probe")
        out["divergence"] = None
    except RankDivergence as exc:
        out["divergence"] = {"ranks": list(exc.ranks), "tensors": list(exc.tensors), "reference": exc.reference,
                             "message": str(exc)}
    # Ranks whose batch shapes already differ (the state before the deadlock) are told so, no hang.
    try:
        check_consensus({"seq_lens": torch.zeros(2 + rank, dtype=torch.int64)})
        out["shape_divergence"] = None
    except RankDivergence as exc:
        out["shape_divergence"] = list(exc.ranks)
    # The GPU command's capture self-test, eagerly (on a GPU it captures the same calls in a graph).
    out["capture_self_test"] = tp_engine.capture_self_test(device)
    # The engine loop.
    ops = __import__("spec_hal.selection", fromlist=["get_backend"]).get_backend("cpu")
    scenarios = tp_engine.default_scenarios(rounds, world_size=2)
    out["scenarios"] = {s.name: tp_engine.run_scenario(s, tp_engine.LoopShape(), ops=ops) for s in scenarios}
    return out


@pytest.fixture(scope="module")
def ranks():
    start = time.monotonic()
    reports = tp_engine.spawn_ranks(_rank_checks, (ROUNDS,), world_size=2, timeout_s=SESSION_TIMEOUT_S)
    print(f"two-rank gloo session: {time.monotonic() - start:.1f} s for {ROUNDS} rounds per run")
    return reports


# -- the engine loop ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["temperature 0", "temperature 0.8", "shared seeds, no broadcast"])
def test_every_rank_emits_the_same_tokens(ranks, name):
    reports = [r["scenarios"][name] for r in ranks]
    assert all("error" not in r for r in reports), [r.get("error") for r in reports]
    rounds = {s.name: s.rounds for s in tp_engine.default_scenarios(ROUNDS)}[name]
    assert [r["rounds"] for r in reports] == [rounds, rounds] and rounds == min(ROUNDS, 100 if "shared" in name else ROUNDS)
    assert reports[0]["tokens"] == reports[1]["tokens"]
    assert reports[0]["graph_modes"] == {"draft + tree": "eager", "verify + broadcast": "eager"}  # CPU: emulation
    if name == "temperature 0":
        assert all(r["matches_greedy_prefix"] for r in reports)  # and the loop is right, not only consistent
        assert all(r["greedy_prefix_length"] >= min(tp_engine.GREEDY_PREFIX, ROUNDS) for r in reports)
    else:
        assert reports[0]["mean_acceptance_length"] > 1.2  # drafts are accepted: the verify really ran


def test_rank_local_seeds_without_broadcast_are_caught_on_every_rank(ranks):
    reports = [r["scenarios"]["rank-local seeds, no broadcast"] for r in ranks]
    for report in reports:
        assert report["diverging_ranks"] == [1]
        assert "rank 1 differs from rank 0" in report["error"] and "'accept_lens'" in report["error"]
        assert report["rounds"] < 50  # caught in the round it happened, not at the end
    assert reports[0]["rounds"] == reports[1]["rounds"]


# -- the helpers ----------------------------------------------------------------------------------


def test_broadcast_delivers_the_source_rank_values(ranks):
    assert all(r["broadcast_equals_rank_1"] and r["inputs_untouched"] for r in ranks)
    assert [r["mixed"] for r in ranks] == [[[True, True, False], [0, 1, 2, 3, 4], 2.5, "[(1+2j)]"]] * 2


def test_capture_self_test_receives_rank_0_values_after_the_inputs_changed(ranks):
    assert [r["capture_self_test"]["received_source_values"] for r in ranks] == [True, True]


def test_broadcast_with_batch_size_zero(ranks):
    for report in ranks:
        assert report["bs0_shapes"] == [[0], [0, 3], [0], [0], [0, 4], [0]]
        assert report["bs0_dtypes"] == ["torch.int64", "torch.bfloat16"]


def test_bad_ranks_are_rejected_before_any_collective(ranks):
    for report in ranks:
        assert report["bad_src"] == ["src", "src", "src"]
        assert report["bad_reference"] == "reference"


def test_consensus_names_the_diverging_rank_and_tensor(ranks):
    for report in ranks:
        assert report["agreement_passed"]
        assert report["divergence"]["ranks"] == [1] and report["divergence"]["tensors"] == ["differs"]
        assert "(probe)" in report["divergence"]["message"]
        assert report["shape_divergence"] == [1]


# -- single process: argument checks, fingerprints, the deadline ----------------------------------


@pytest.mark.parametrize("call, argument", [
    (lambda: broadcast_verdict("verdict"), "verdict"),
    (lambda: broadcast_verdict(Verdict(predict=torch.zeros(6, dtype=torch.float32), accept_index=torch.zeros(2, 2, dtype=torch.int32),
                                       num_correct=torch.zeros(2, dtype=torch.int32), accept_lens=torch.zeros(2, dtype=torch.int32))),
     "verdict.predict"),
    (lambda: broadcast_verdict(Verdict(predict=torch.zeros(7, dtype=torch.int32), accept_index=torch.zeros(2, 2, dtype=torch.int32),
                                       num_correct=torch.zeros(2, dtype=torch.int32), accept_lens=torch.zeros(2, dtype=torch.int32))),
     "verdict.predict"),
    (lambda: broadcast_verdict(Verdict(predict=torch.zeros(6, dtype=torch.int32), accept_index=torch.zeros(2, 2, dtype=torch.int32),
                                       num_correct=torch.zeros(3, dtype=torch.int32), accept_lens=torch.zeros(2, dtype=torch.int32))),
     "verdict.num_correct"),
    (lambda: broadcast_verdict(_verdict(2, 3, 2, base=0), tokens=torch.zeros(3, 3, dtype=torch.int64)), "tokens"),
    (lambda: broadcast_verdict(_verdict(2, 3, 2, base=0), tokens=torch.zeros(2, 3)), "tokens"),
    (lambda: broadcast_verdict(_verdict(2, 3, 2, base=0), logprobs=torch.zeros(2, dtype=torch.int32)), "logprobs"),
    (lambda: broadcast_verdict(_verdict(2, 3, 2, base=0), logprobs=torch.tensor(0.0)), "logprobs"),
    (lambda: broadcast_verdict(_verdict(2, 3, 2, base=0)), "group"),  # valid tensors, no process group
    (lambda: broadcast_tensors(torch.zeros(3)), "tensors"),
    (lambda: broadcast_tensors([]), "tensors"),
    (lambda: broadcast_tensors([torch.zeros(2), "x"]), "tensors[1]"),
    (lambda: check_consensus({}), "tensors"),
    (lambda: check_consensus([torch.zeros(2)]), "tensors"),
    (lambda: check_consensus({1: torch.zeros(2)}), "tensors"),
    (lambda: check_consensus({"a": [1, 2]}), "tensors['a']"),
    (lambda: check_consensus({"a": torch.zeros(2)}), "group"),
])
def test_bad_input_names_the_argument(call, argument):
    with pytest.raises(InvalidInput) as error:
        call()
    assert error.value.argument == argument


def _python_fingerprint(tensor: torch.Tensor) -> list[int]:
    """The documented hash, written independently with Python integers."""
    import zlib

    prime = 2**31 - 1
    data = bytes(tensor.contiguous().view(torch.uint8).reshape(-1).tolist())
    lanes = []
    for lane, (multiplier, offset) in enumerate(((48271, 11), (69621, 97))):
        total = sum((byte + 1) * ((i * multiplier + offset) % (prime - 1) + 1) for i, byte in enumerate(data)) % prime
        salt = zlib.crc32(f"{lane}:{tensor.dtype}:{tuple(tensor.shape)}".encode()) % prime
        lanes.append((total + salt) % prime)
    return lanes


def test_fingerprint_follows_its_definition_and_sees_one_bit():
    values = torch.tensor([[3, -1, 70000], [0, 5, 2**40]], dtype=torch.int64)
    assert fingerprint({"v": values}).tolist() == [_python_fingerprint(values)]
    flipped = values.clone()
    flipped[1, 2] ^= 1
    changed = fingerprint({"a": values, "b": flipped})
    assert (changed[0] != changed[1]).all()  # both lanes see the lowest bit of one element
    floats = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert (fingerprint({"a": floats})[0] != fingerprint({"a": floats.nextafter(torch.tensor(3.0, dtype=torch.float64))})[0]).all()


def test_fingerprint_depends_on_dtype_and_shape_not_on_strides():
    base = torch.arange(6, dtype=torch.int32).view(2, 3)
    rows = fingerprint({"a": base, "b": base.view(3, 2), "c": base.to(torch.int64), "d": base.t().contiguous().t()})
    assert len({tuple(row) for row in rows.tolist()}) == 3  # d equals a (same values, other strides)
    assert rows[3].tolist() == rows[0].tolist()
    assert fingerprint({"empty": torch.empty(0, 4)}).shape == (1, 2)


def _sleep_on_rank_1(device: torch.device) -> int:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(600)
    return dist.get_rank()


def test_spawn_ranks_kills_a_rank_that_never_finishes():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[.*1\] did not finish"):
        tp_engine.spawn_ranks(_sleep_on_rank_1, world_size=2, timeout_s=10)
    assert time.monotonic() - start < 45


# -- the command line the GPU runs use (scripts/tp_nccl.sh) ---------------------------------------


def _report(name: str, rank: int, tokens, *, rounds: int, modes=("eager", "eager"), error=None) -> dict:
    if error is not None:
        return {"scenario": name, "rank": rank, "error": error, "diverging_ranks": [1], "rounds": rounds}
    return {"scenario": name, "rank": rank, "tokens": tokens, "rounds": rounds, "matches_greedy_prefix": True,
            "graph_modes": {"draft + tree": modes[0], "verify + broadcast": modes[1]}}


def test_summary_fails_on_any_broken_promise():
    scenarios = [tp_engine.Scenario(name="run", temperature=0.0, rounds=4),
                 tp_engine.Scenario(name="bad seeds", rounds=4, expect_divergence=True)]

    def judge(run_reports, divergence_errors=("x", "x"), *, expect_device_graphs=False):
        per_rank = [[run_reports[rank], _report("bad seeds", rank, None, rounds=1, error=divergence_errors[rank])]
                    for rank in range(2)]
        for rank, error in enumerate(divergence_errors):
            if error is None:
                per_rank[rank][1] = _report("bad seeds", rank, [[1]], rounds=4)
        return tp_engine.summarise(per_rank, scenarios, expect_device_graphs=expect_device_graphs)[0]

    same = [_report("run", rank, [[1, 2]], rounds=4) for rank in range(2)]
    assert judge(same)
    assert not judge([same[0], _report("run", 1, [[1, 3]], rounds=4)])  # tokens differ
    assert not judge([same[0], _report("run", 1, [[1, 2]], rounds=3)])  # a rank stopped early
    assert not judge(same, divergence_errors=(None, None))  # the divergent run was not caught
    assert not judge(same, expect_device_graphs=True)  # a runner fell back to eager on a GPU
    captured = [_report("run", rank, [[1, 2]], rounds=4, modes=("cuda_graph", "cuda_graph")) for rank in range(2)]
    assert judge(captured, expect_device_graphs=True)


def test_command_line_runs_every_scenario_and_writes_the_report(tmp_path, capsys):
    import json

    out = tmp_path / "tp.json"
    code = tp_engine.main(["--rounds", "4", "--temperatures", "0", "--timeout", "300", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    report = json.loads(out.read_text())
    assert report["ok"] and [s["name"] for s in report["scenarios"]] == [
        "temperature 0", "shared seeds, no broadcast", "rank-local seeds, no broadcast"]
    assert "caught by the consensus check" in text and "capture self-test" in text
