"""ci/: the generated workflow matches ci/matrix.toml, is valid YAML, and runs what the matrix says;
xfail manifests are well formed; the report merger computes each cell's verdict."""
import os
import importlib.util
import json
from pathlib import Path

import pytest

from spec_hal.conformance.plugin import _load_manifest

ROOT = Path(__file__).resolve().parent.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(f"ci_{name}", ROOT / "ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load("generate")
merge_reports = _load("merge_reports")


def _parse_workflow(text: str) -> dict:
    """The committed file is a comment header plus JSON, and JSON is YAML 1.2: parse it as JSON."""
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    return json.loads(body)


def test_committed_workflow_is_what_the_generator_writes():
    committed = generate.WORKFLOW.read_text()
    assert committed == generate.render(generate.load_matrix()), "run `python ci/generate.py` and commit"
    assert generate.main(["--check"]) == 0


def test_workflow_is_valid_yaml_with_the_lanes_of_the_matrix():
    workflow = _parse_workflow(generate.WORKFLOW.read_text())
    assert set(workflow) == {"name", "on", "concurrency", "permissions", "jobs"}
    jobs = workflow["jobs"]
    for job_id, job in jobs.items():
        assert job["runs-on"] and job["steps"], job_id
        for step in job["steps"]:
            assert ("run" in step) != ("uses" in step), (job_id, step)
    matrix = generate.load_matrix()
    expected = {generate._job_id(lane, entry) for lane in matrix["lanes"] for entry in lane["jobs"]} | {"compatibility"}
    assert set(jobs) == expected
    # The CPU lane: unit tests, the cpu and triton-interpret suites, the compile matrix for six targets.
    for job_id in ("cpu-unit", "cpu-conformance-cpu", "cpu-conformance-triton-interpret", "cpu-compile-matrix",
                   "cpu-previous-compile-matrix"):
        assert jobs[job_id]["runs-on"] == "ubuntu-latest" and "if" not in jobs[job_id]
    compile_step = jobs["cpu-compile-matrix"]["steps"][-2]["run"]
    assert "--targets sm_80,sm_90,sm_100,gfx90a,gfx942,gfx950" in compile_step
    assert "triton==3.6.0" in jobs["cpu-previous-compile-matrix"]["steps"][2]["run"]
    # GPU lanes: self-hosted, gated on the repository variable; ROCm in the rocm/pytorch container, soft.
    assert "nvidia-h100" in jobs["h100-conformance-cuda"]["runs-on"]
    for job_id, arch in (("mi300x-conformance-rocm", "amd-gfx942"), ("mi355x-conformance-rocm", "amd-gfx950")):
        job = jobs[job_id]
        assert arch in job["runs-on"] and job["continue-on-error"] is True
        assert job["container"]["image"].startswith("rocm/pytorch:") and "/dev/kfd" in job["container"]["options"]
        assert "SPEC_HAL_GPU_RUNNERS" in job["if"]
        assert "--backend rocm --known-issues ci/xfail/rocm.toml" in job["steps"][-2]["run"]
        assert "triton" not in job["steps"][1]["run"]  # never the CUDA triton wheel over pytorch-triton-rocm
    # The merge job collects every conformance report.
    conformance = sorted(job_id for job_id in jobs if "-conformance-" in job_id)
    assert sorted(jobs["compatibility"]["needs"]) == conformance


def test_workflow_reads_the_same_with_a_yaml_parser():
    # PyYAML is not a dependency (the check above parses the subset the generator writes). Where
    # it is missing the cross-check is skipped visibly, and under CI (CI set, as .ci/run and
    # GitHub Actions do) it fails: CI must not lose it silently.
    try:
        import yaml
    except ModuleNotFoundError:
        if os.environ.get("CI"):
            pytest.fail("PyYAML is not installed: CI must run the YAML cross-check (pip install pyyaml)")
        pytest.skip("PyYAML is not installed: the generated workflow was not cross-checked with a YAML parser")
    text = generate.WORKFLOW.read_text()
    assert yaml.safe_load(text) == _parse_workflow(text)


def test_generator_rejects_a_matrix_naming_an_unknown_runner():
    matrix = generate.load_matrix()
    matrix["lanes"][0]["runner"] = "no-such-runner"
    with pytest.raises(ValueError, match="no-such-runner"):
        generate.workflow(matrix)


def test_every_conformance_lane_has_a_loadable_xfail_manifest():
    matrix = generate.load_matrix()
    backends = {entry["backend"] for lane in matrix["lanes"] for entry in lane["jobs"] if "backend" in entry}
    assert backends == {"cpu", "triton-interpret", "cuda", "rocm"}
    for backend in backends:
        for entry in _load_manifest(str(ROOT / "ci" / "xfail" / f"{backend}.toml")):
            assert entry["reason"] and entry["link"]


def _report(backend, arch, cases, torch="2.13.0", device="dev"):
    return {"backend": backend, "capabilities": {"arch": arch, "device_name": device}, "suite_version": "1",
            "versions": {"torch": torch, "triton": "3.9.0"}, "summary": {},
            "cases": [{"op": op, "params": params, "outcome": outcome} for op, params, outcome in cases]}


def test_merge_gives_pass_xfail_fail_and_na_per_op_dtype_and_column():
    cuda = _report("cuda", "sm_90", [
        ("draft_topk", {"dtype": "torch.float32"}, "passed"),
        ("draft_topk", {"dtype": "torch.float32"}, "xfailed"),
        ("draft_topk", {"dtype": "torch.bfloat16"}, "failed"),
        ("draft_topk", {"dtype": "torch.bfloat16"}, "passed"),
        ("verify_greedy", {}, "passed"),
    ])
    rocm = _report("rocm", "gfx942", [
        ("draft_topk", {"dtype": "torch.float32"}, "passed"),
        ("draft_topk", {"dtype": "torch.bfloat16"}, "skipped"),
        ("verify_greedy", {}, "xpassed"),
    ])
    columns, table, _ = merge_reports.merge([cuda, rocm])
    assert columns == ["cuda sm_90", "rocm gfx942"]
    assert table[("draft_topk", "float32")] == {"cuda sm_90": "xfail", "rocm gfx942": "pass"}
    assert table[("draft_topk", "bfloat16")] == {"cuda sm_90": "fail", "rocm gfx942": "n/a"}
    assert table[("verify_greedy", "-")] == {"cuda sm_90": "pass", "rocm gfx942": "fail"}  # a stale xfail fails


def test_merge_names_columns_apart_when_two_toolchains_share_backend_and_arch():
    reports = [_report("cpu", None, [("op", {}, "passed")]), _report("cpu", None, [("op", {}, "passed")], torch="2.11.0")]
    columns, _, _ = merge_reports.merge(reports)
    assert len(set(columns)) == 2 and "torch 2.11.0" in columns[1] and "(dev)" not in columns[1]  # one device: not named


def test_merge_names_columns_apart_by_device_when_two_gpus_share_an_arch():
    reports = [_report("cuda", "sm_90", [("op", {}, "passed")], device="H100"), _report("cuda", "sm_90", [("op", {}, "passed")], device="H200"),
               _report("rocm", "gfx942", [("op", {}, "passed")])]
    columns, _, _ = merge_reports.merge(reports)
    assert columns == ["cuda sm_90 (H100)", "cuda sm_90 (H200)", "rocm gfx942"]


def test_merge_command_writes_markdown(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_report("rocm", "gfx950", [("draft_topk", {"dtype": "torch.float16"}, "passed")])))
    assert merge_reports.main([str(path), "--output", str(tmp_path / "C.md")]) == 0
    text = (tmp_path / "C.md").read_text()
    assert "| draft_topk | float16 | pass |" in text and "rocm gfx950" in text
