"""``spec-hal demo`` runs end to end and reports what the README shows."""
from __future__ import annotations

import io

import pytest
import torch

from spec_hal.cli import build_parser
from spec_hal.demo import run_demo


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # the demo uses one thread on CPU
    yield
    torch.set_num_threads(threads)


def _demo(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = run_demo(build_parser().parse_args(["demo", "--backend", "cpu", *argv]), out=out)
    return code, out.getvalue()


def test_demo_greedy_checks_itself():
    code, text = _demo("--max-tokens", "6", "--batch-size", "1")
    assert code == 0
    for line in ("backend: cpu", "verify_greedy", "commit_mamba_state", "mean acceptance length:",
                 "tokens per target step:", "time per section, per round", "speculative round:",
                 "speculative output == greedy target output: yes"):
        assert line in text, f"missing {line!r} in the demo output"


def test_demo_sampling_attention_only_without_graphs():
    code, text = _demo("--max-tokens", "5", "--temperature", "0.7", "--no-hybrid", "--no-graphs", "--page-size", "1",
                       "-S", "2", "-K", "2", "-N", "4")
    assert code == 0
    assert "verify_sampling" in text and "commit_mamba_state" not in text and "greedy target output" not in text


def test_demo_rejects_bad_sizes():
    assert _demo("--max-tokens", "0")[0] == 2


def test_demo_8b_preset_refuses_a_cpu_backend_in_one_line(capsys):
    code, text = _demo("--preset", "8b")
    assert code == 2 and text == ""
    message = capsys.readouterr().err.strip()
    assert "--preset 8b needs a GPU backend" in message and "\n" not in message


def test_demo_bfloat16_preset_with_low_rank_noise_reports_the_op_share(monkeypatch):
    """The 8b preset's code path (bfloat16 models, low-rank draft noise, per-section report) at a
    size a CPU runs in a second."""
    from spec_hal import demo

    monkeypatch.setitem(demo.PRESETS, "8b", demo.Preset(vocab=512, hidden=64, dtype="bfloat16", noise_rank=8, exact=False))
    code, text = _demo("--preset", "8b", "--max-tokens", "6", "--batch-size", "2", "-S", "3", "-K", "2", "-N", "6")
    assert code == 0
    for line in ("V=512 H=64 bfloat16 (preset 8b)", "rank-8 noise", "verify_greedy", "target forward",
                 "of which draft model forwards", "speculative round:", "speculative output == greedy target output:"):
        assert line in text, f"missing {line!r} in the demo output"


def test_step_report_splits_the_draft_replay_into_model_and_ops():
    """Per round: ops = 2 + 3 + (10 - 4) ms, model = 5 + 4 ms; prefill outside the round."""
    from spec_hal.demo_timing import step_report
    from spec_hal.testing.engine import DRAFT_TREE_GRAPH, PREFILL, TARGET

    timings = {PREFILL: 0.5, TARGET: 0.010, "verify_greedy": 0.004, DRAFT_TREE_GRAPH: 0.020, "move_kv": 0.006}
    lines = step_report(timings, 2, device_events=True, draft_forwards_s=0.004, compiled_before=True)
    assert lines[-2] == "speculative round: 20.000 ms; spec_hal ops 11.000 ms (55.0%), model forwards 9.000 ms (45.0%)"
    assert lines[-1] == "prefill (once, not in the round): 500.000 ms"
    assert "CUDA events" in lines[0] and "untimed first run" in lines[0]


def test_demo_grammar_checks_constrained_greedy():
    code, text = _demo("--max-tokens", "6", "--batch-size", "1", "--grammar")
    assert code == 0
    assert "output in the grammar's language: yes" in text
    assert "speculative output == constrained greedy target output: yes" in text
