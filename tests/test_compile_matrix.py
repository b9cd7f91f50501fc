"""The offline compile matrix: resource parsing, limits, failure on spills, known issues, timeouts.

The full matrix over every kernel and six targets runs in CI (`make test`); these tests compile
only tiny fixture kernels (tests/compile_fixtures) for one NVIDIA and one AMD target.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from spec_hal import compile_matrix as cm
from spec_hal.capabilities import ARCH_TABLE

FIXTURES = Path(__file__).parent / "compile_fixtures"
FIXTURE_MODULE = "spilling_kernels"


@pytest.fixture
def fixture_module(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return FIXTURE_MODULE


def _by_kernel(report, arch, kernel):
    return next(k for k in report["kernels"] if k["arch"] == arch and k["kernel"] == kernel)


def test_spills_and_clean_kernels_are_told_apart(fixture_module):
    report = cm.run_matrix(["sm_90", "gfx942"], module_names=[fixture_module], jobs=2)
    assert report["distinct_compiles"] == 4
    clean_nv = _by_kernel(report, "sm_90", "small_copy")
    assert clean_nv["outcome"] == "pass" and 0 < clean_nv["registers"] <= 255 and clean_nv["local_bytes"] == 0
    assert clean_nv["threads"] == 128 and clean_nv["num_warps"] == 4
    clean_amd = _by_kernel(report, "gfx942", "small_copy")
    assert clean_amd["outcome"] == "pass" and clean_amd["spills"] == 0 and clean_amd["sgprs"] > 0
    assert clean_amd["threads"] == 128 and clean_amd["num_warps"] == 2  # wave64: 128 threads are 2 wavefronts
    hog_nv = _by_kernel(report, "sm_90", "register_hog")
    assert hog_nv["outcome"] == "fail" and hog_nv["registers"] <= 32 and hog_nv["local_bytes"] > 0
    assert any("local-memory frame" in problem for problem in hog_nv["problems"])
    hog_amd = _by_kernel(report, "gfx942", "register_hog")
    assert hog_amd["outcome"] == "fail" and hog_amd["spills"] > 0
    assert any("register spills" in problem for problem in hog_amd["problems"])
    assert report["failed"] == 2


def _cli(*args, env_extra=None):
    env = {key: value for key, value in os.environ.items() if key != "SPEC_HAL_BACKEND"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FIXTURES), env.get("PYTHONPATH")]))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "spec_hal.cli", "compile-matrix", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_cli_fails_on_spills_and_writes_json_and_markdown(tmp_path):
    # TRITON_INTERPRET=1 in the environment must not turn the compile into interpretation.
    result = _cli("--targets", "sm_90,gfx942", "--modules", FIXTURE_MODULE, "--json", str(tmp_path / "m.json"),
                  "--markdown", str(tmp_path / "m.md"), env_extra={"TRITON_INTERPRET": "1"})
    assert result.returncode == cm.EXIT_FAILED, result.stdout + result.stderr
    assert "FAIL sm_90 register_hog" in result.stdout and "FAIL gfx942 register_hog" in result.stdout
    report = json.loads((tmp_path / "m.json").read_text())
    assert {k["outcome"] for k in report["kernels"]} == {"pass", "fail"}
    table = (tmp_path / "m.md").read_text()
    assert "| spilling_kernels.register_hog | gfx942 |" in table and "FAIL" in table


def test_known_issues_turn_expected_failures_green_and_stale_entries_exit_6(tmp_path):
    manifest = tmp_path / "known.toml"
    manifest.write_text(
        '[[known_issue]]\nkernel = "spilling_kernels.register_hog"\naction = "xfail"\n'
        'reason = "capped registers"\nlink = "tests/compile_fixtures/spilling_kernels.py"\n'
    )
    result = _cli("--targets", "sm_90", "--modules", FIXTURE_MODULE, "--known-issues", str(manifest))
    assert result.returncode == cm.EXIT_OK, result.stdout + result.stderr
    assert "1 xfail" in result.stdout
    # The progress line already applies the manifest (it printed "fail" for listed compiles once).
    progress = [line for line in result.stderr.splitlines() if "register_hog" in line]
    assert progress and all(line.endswith(" xfail") for line in progress), result.stderr
    manifest.write_text(manifest.read_text().replace("register_hog", "small_copy"))
    result = _cli("--targets", "sm_90", "--modules", FIXTURE_MODULE, "--known-issues", str(manifest))
    assert result.returncode == cm.EXIT_FAILED  # register_hog fails again, unlisted
    manifest.write_text(manifest.read_text() + '\n[[known_issue]]\nkernel = "spilling_kernels.register_hog"\n'
                        'action = "skip"\nreason = "r"\nlink = "l"\n')
    result = _cli("--targets", "sm_90", "--modules", FIXTURE_MODULE, "--known-issues", str(manifest))
    assert result.returncode == cm.EXIT_STALE, result.stdout  # small_copy passes: its xfail entry is stale
    assert "STALE" in result.stdout and "1 skipped" in result.stdout


def test_smoke_targets_keep_the_first_spec_of_each_kernel():
    # No compile: the real kernel modules' spec lists, sm_90 in full, sm_80 one spec per kernel.
    modules = ["spec_hal.kernels.compaction", "spec_hal.kernels.mamba"]
    full, listed = cm.collect_jobs(modules, ["sm_90", "sm_80"])
    smoke, smoke_listed = cm.collect_jobs(modules, ["sm_90", "sm_80"], smoke_archs=["sm_80"])
    assert smoke_listed == listed  # "listed" counts what the modules list, whatever is compiled
    assert [job for job in smoke if job.arch == "sm_90"] == [job for job in full if job.arch == "sm_90"]
    kept = [(job.module, job.kernel) for job in smoke if job.arch == "sm_80"]
    every = [(job.module, job.kernel) for job in full if job.arch == "sm_80"]
    assert kept == list(dict.fromkeys(every)) and len(kept) < len(every)
    first = {}
    for job in full:
        if job.arch == "sm_80":
            first.setdefault((job.module, job.kernel), job.spec_index)
    assert {(job.module, job.kernel): job.spec_index for job in smoke if job.arch == "sm_80"} == first


def test_a_smoke_target_never_makes_an_entry_stale(fixture_module):
    # small_copy passes, so an xfail entry for it is stale where every configuration is compiled;
    # on a smoke target the other configurations were never compiled, so nothing can be said.
    listed = [{"kernel": "spilling_kernels.small_copy", "action": "xfail", "reason": "r", "link": "l"}]
    full = cm.run_matrix(["sm_90"], module_names=[fixture_module], jobs=1, known_issues=listed)
    assert full["stale_known_issues"] and full["smoke_targets"] == []
    smoke = cm.run_matrix(["sm_90"], module_names=[fixture_module], jobs=1, known_issues=listed, smoke_archs=["sm_90"])
    assert smoke["stale_known_issues"] == [] and smoke["smoke_targets"] == ["sm_90"]
    assert smoke["failed"] == 1  # register_hog still fails: a smoke target is compiled and checked
    with pytest.raises(ValueError, match="smoke targets"):
        cm.run_matrix(["sm_90"], module_names=[fixture_module], smoke_archs=["gfx942"])


def test_manifest_entries_need_reason_and_link(tmp_path):
    manifest = tmp_path / "known.toml"
    manifest.write_text('[[known_issue]]\nkernel = "x"\naction = "xfail"\nreason = "r"\n')
    with pytest.raises(ValueError, match="link"):
        cm.load_known_issues(str(manifest))


def test_a_compile_past_the_timeout_is_stopped_and_fails(fixture_module, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # a cold cache: every compile takes > 10 ms
    # Listed as xfail (for its spills) or not, a compile that never finishes fails.
    listed = [{"kernel": "spilling_kernels.register_hog", "action": "xfail", "reason": "spills", "link": "l"}]
    report = cm.run_matrix(["sm_90"], module_names=[fixture_module], jobs=1, timeout_s=0.01, known_issues=listed)
    assert report["failed"] == 2
    assert all("longer than" in k["error"] for k in report["kernels"])
    assert _by_kernel(report, "sm_90", "register_hog")["known_issue"].startswith("xfail")


@pytest.mark.parametrize("error, problems, outcome", [
    (None, ["local-memory frame 8 B"], "xfail"),
    (None, [], "xpass"),
    ("CompilationError: at 3:4: unsupported", [], "fail"),
    ("CompilationError: at 3:4: unsupported", ["local-memory frame 8 B"], "fail"),
])
def test_an_xfail_entry_covers_resource_findings_not_compile_errors(error, problems, outcome):
    # The manifest lists frames and spills; a listed kernel that stops compiling must still fail CI.
    result = _resources("sm_90", error=error, problems=problems, known_issue="xfail: frame (link)")
    assert result.outcome == outcome


def _resources(arch, **fields):
    info = ARCH_TABLE[arch]
    values = dict(module="m", kernel="k", arch=arch, num_warps=4, threads=4 * info.warp_size, constexprs="{}",
                  signature="{}", options="{}", shared_limit_bytes=info.shared_bytes, registers=32, spills=0, local_bytes=0)
    values.update(fields)
    return cm.KernelResources(**values)


def test_limits():
    assert cm.check_limits(_resources("sm_90")) == []
    assert "limit" in cm.check_limits(_resources("gfx942", shared_bytes=64 * 1024 + 1))[0]
    assert cm.check_limits(_resources("gfx950", shared_bytes=64 * 1024 + 1)) == []  # MI355X has 160 KiB LDS
    assert "threads" in cm.check_limits(_resources("gfx942", num_warps=32, threads=2048))[0]
    assert "65536" in cm.check_limits(_resources("sm_80", registers=255, threads=512))[0]
    assert cm.check_limits(_resources("gfx942", registers=255, threads=512)) == []  # a per-lane VGPR count


def test_every_kernel_module_lists_launch_configs_for_every_target():
    from spec_hal.kernels import KERNEL_MODULES

    jobs, listed = cm.collect_jobs(KERNEL_MODULES, cm.DEFAULT_TARGETS)
    assert listed >= len(jobs) > 0
    for arch in cm.DEFAULT_TARGETS:
        modules = {job.module for job in jobs if job.arch == arch}
        assert modules == set(KERNEL_MODULES), f"{arch}: {set(KERNEL_MODULES) - modules} list no compile specs"
    for job in jobs:
        warp = 64 if job.arch.startswith("gfx") else 32
        assert job.num_warps * warp <= 1024, job


def test_unknown_target_is_a_usage_error():
    result = _cli("--targets", "sm_90,rdna9")
    assert result.returncode == cm.EXIT_USAGE
    assert "rdna9" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_known_issues_can_be_limited_to_triton_versions():
    entries = [{"kernel": "a", "triton": "<3.9"}, {"kernel": "b"}, {"kernel": "c", "triton": ">=3.9,<4"}]
    assert [e["kernel"] for e in cm.active_known_issues(entries, "3.6.0")] == ["a", "b"]
    assert [e["kernel"] for e in cm.active_known_issues(entries, "3.9.0")] == ["b", "c"]
