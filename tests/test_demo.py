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


def test_demo_rejects_bad_sizes_before_any_work():
    with pytest.raises(SystemExit) as stop:
        _demo("--max-tokens", "0")
    assert stop.value.code == 2


def test_demo_summarises_large_batches():
    code, text = _demo("--max-tokens", "3", "--batch-size", "9", "--no-hybrid", "--no-graphs")
    assert code == 0 and "speculative output == greedy target output: yes" in text
    assert "generated" not in text and sum(line.startswith("request ") for line in text.splitlines()) == 9


@pytest.mark.parametrize("recurrent", (False, True))
def test_incremental_greedy_equals_full_forward_decoding(recurrent):
    """The demo's self-check (TargetModel.greedy, incremental) against decoding by a full
    forward over the whole sequence for every token, the definition of greedy decoding."""
    from spec_hal.testing.models import TargetModel

    model = TargetModel(vocab_size=64, hidden_size=16, recurrent=recurrent, context_gain=0.3)
    prompt = torch.tensor([[12, 7, 33, 5, 48, 21, 9, 60, 17, 2], [2, 12, 7, 33, 5, 48, 21, 9, 60, 17]])
    tokens = prompt.clone()
    for _ in range(40):
        tokens = torch.cat([tokens, model.forward(tokens)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    assert torch.equal(model.greedy(prompt, 40), tokens[:, prompt.shape[1]:])
def test_demo_8b_preset_refuses_a_cpu_backend_in_one_line():
    from spec_hal.cli import CommandFailed

    with pytest.raises(CommandFailed) as failure:
        _demo("--preset", "8b")
    assert failure.value.code == 2
    assert "--preset: 8b needs a GPU backend" in str(failure.value) and "\n" not in str(failure.value)


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
