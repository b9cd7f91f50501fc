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
                 "tokens per target step:", "time per op family", "speculative output == greedy target output: yes"):
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
