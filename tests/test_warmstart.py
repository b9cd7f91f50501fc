"""spec_hal.warmup and ``spec-hal warmup``: every op's first call is made and reported."""
import torch

import spec_hal
from spec_hal.cli import main
from spec_hal.warmstart import Shapes

TINY = Shapes(vocab=40, hidden=8, topk=2, num_steps=2, num_nodes=4, page_size=4, logits_dtype=torch.float32,
              hidden_dtype=torch.float32, kv_dtype=torch.float32)
REPORTED = {"draft_topk", "expand_tree", "organize_draft", "build_tree", "verify_greedy", "verify_sampling", "verify_chain",
            "verify_chain_sampling", "bonus+compact", "kv moves+slots", "commit_mamba_state"}


def test_warmup_runs_every_op_at_every_batch_size():
    report = spec_hal.warmup(batch_sizes=(0, 3), shapes=TINY, device="cpu")
    assert report.backend == "cpu"
    assert {(e.op, e.batch_size) for e in report.entries} == {(op, bs) for op in REPORTED for bs in (0, 3)}
    assert all(e.first_call_ms >= 0 and e.kernels_compiled is None for e in report.entries)  # the reference compiles nothing
    assert "verify_greedy" in report.format()


def test_warmup_subset_keeps_the_tree_building_ops():
    report = spec_hal.warmup(["verify_chain"], batch_sizes=(2,), shapes=TINY, device="cpu")
    assert {e.op for e in report.entries} == {"draft_topk", "expand_tree", "organize_draft", "build_tree", "verify_greedy", "verify_chain"}


def test_cli_warmup(capsys):
    assert main(["warmup", "--batch-sizes", "2", "--vocab", "40", "--hidden", "8", "-K", "2", "-S", "2", "-N", "4",
                 "--page-size", "4", "--dtype", "float32", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "warmup on cpu" in out and "commit_mamba_state" in out
