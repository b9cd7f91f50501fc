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


def test_info_on_simulated_h100():
    result = spec_hal_cli("info", "--simulate", "h100")
    assert result.returncode == 0, result.stderr
    assert "selected: cuda" in result.stdout and "sm_90" in result.stdout and "warp size 32" in result.stdout
