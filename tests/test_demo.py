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


def test_demo_rejects_bad_sizes():
    assert _demo("--max-tokens", "0")[0] == 2


def test_demo_grammar_checks_constrained_greedy():
    code, text = _demo("--max-tokens", "6", "--batch-size", "1", "--grammar")
    assert code == 0
    assert "output in the grammar's language: yes" in text
    assert "speculative output == constrained greedy target output: yes" in text
