"""The spec-hal command line."""
import os
import subprocess
import sys


def spec_hal_cli(*args, env_extra=None):
    env = dict(os.environ)
    env.pop("SPEC_HAL_BACKEND", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "spec_hal.cli", *args], capture_output=True, text=True, env=env, timeout=300)


def test_info_explains_choice():
    result = spec_hal_cli("info")
    assert result.returncode == 0, result.stderr
    assert "selected:" in result.stdout and "draft_topk" in result.stdout
    for name in ("cpu", "cuda", "rocm", "triton-interpret"):
        assert name in result.stdout


def test_info_with_unknown_backend_lists_valid_ones():
    result = spec_hal_cli("info", env_extra={"SPEC_HAL_BACKEND": "nonexistent"})
    assert result.returncode != 0
    assert "nonexistent" in result.stderr
    for name in ("cpu", "cuda", "rocm", "triton-interpret"):
        assert name in result.stderr


def test_info_on_simulated_mi300x_shows_rocm_wave64_fnuz():
    result = spec_hal_cli("info", "--simulate", "mi300x")
    assert result.returncode == 0, result.stderr
    assert "selected: rocm" in result.stdout
    assert "warp size 64" in result.stdout
    assert "float8_e4m3fnuz" in result.stdout
    assert "amd:gfx942" in result.stdout
    assert "MI300X / MI325X" in result.stdout and "304 CUs" in result.stdout and "64 KiB LDS" in result.stdout
    assert "wave64" in result.stdout and "hip_graph" in result.stdout
    assert "4 warps x 64 lanes" in result.stdout  # topk's 256 threads as wave64 launch configs


def test_info_on_simulated_mi355x_and_mi250x():
    mi355x = spec_hal_cli("info", "--simulate", "mi355x")
    assert mi355x.returncode == 0, mi355x.stderr
    assert "gfx950" in mi355x.stdout and "160 KiB LDS" in mi355x.stdout and "float8_e4m3fn" in mi355x.stdout
    assert "fnuz" not in mi355x.stdout
    mi250x = spec_hal_cli("info", "--simulate", "mi250x")
    assert mi250x.returncode == 0, mi250x.stderr
    assert "gfx90a" in mi250x.stdout and "fp8:             none" in mi250x.stdout


def test_info_on_simulated_h100():
    result = spec_hal_cli("info", "--simulate", "h100")
    assert result.returncode == 0, result.stderr
    assert "selected: cuda" in result.stdout and "sm_90" in result.stdout and "warp size 32" in result.stdout


def test_info_simulated_shows_simulated_facts_only_and_honours_backend():
    import torch

    result = spec_hal_cli("info", "--simulate", "mi300x")
    assert result.returncode == 0, result.stderr
    assert torch.__version__ not in result.stdout and "simulated ROCm" in result.stdout
    as_cpu = spec_hal_cli("info", "--simulate", "mi300x", "--backend", "cpu")
    assert as_cpu.returncode == 0 and "selected: cpu (asked for by name)" in as_cpu.stdout
    assert "launch configs" not in as_cpu.stdout
    as_cuda = spec_hal_cli("info", "--simulate", "mi300x", "--backend", "cuda")
    assert as_cuda.returncode == 3 and len(as_cuda.stderr.strip().splitlines()) == 1 and "rocm" in as_cuda.stderr
