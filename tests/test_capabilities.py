"""Capability probing, driven by simulated device properties (no GPU needed)."""
import subprocess
import sys

import pytest
import torch

from spec_hal.capabilities import (
    SIMULATED_DEVICES,
    DeviceFacts,
    TritonFacts,
    capabilities_from,
    normalize_arch,
    probe,
)


def simulated(name):
    facts, triton = SIMULATED_DEVICES[name]
    return capabilities_from(facts, triton)


@pytest.mark.parametrize(
    "raw, is_hip, expected",
    [("9.0", False, "sm_90"), ("10.0", False, "sm_100"), ("8.6", False, "sm_86"),
     ("gfx942:sramecc+:xnack-", True, "gfx942"), ("gfx950", True, "gfx950"), ("gfx90a:xnack+", True, "gfx90a"),
     (None, False, None)],
)
def test_normalize_arch(raw, is_hip, expected):
    assert normalize_arch(raw, is_hip=is_hip) == expected


def test_h100():
    caps = simulated("h100")
    assert (caps.backend, caps.arch, caps.warp_size, caps.multiprocessors) == ("cuda", "sm_90", 32, 132)
    assert caps.fp8_dtype == "float8_e4m3fn"
    assert caps.triton_usable


def test_mi300x_is_wave64_with_fnuz_fp8():
    caps = simulated("mi300x")
    assert (caps.backend, caps.arch, caps.warp_size, caps.multiprocessors) == ("rocm", "gfx942", 64, 304)
    assert caps.fp8_dtype == "float8_e4m3fnuz"
    assert caps.triton_usable


def test_mi355x_uses_ocp_fp8():
    caps = simulated("mi355x")
    assert (caps.backend, caps.arch, caps.warp_size) == ("rocm", "gfx950", 64)
    assert caps.fp8_dtype == "float8_e4m3fn"


def test_amd_warp_size_defaults_to_64_when_torch_does_not_report_it():
    caps = capabilities_from(DeviceFacts("cuda:0", True, "AMD", "gfx942:sramecc+", 304), TritonFacts("3.6.0", active_backend="hip"))
    assert caps.warp_size == 64


def test_cpu_only_machine():
    caps = simulated("cpu")
    assert caps.backend == "cpu" and caps.arch is None and caps.fp8_dtype is None
    assert not caps.triton_usable and "interpreter" in caps.triton_reason


def test_machine_without_triton():
    caps = simulated("cpu-no-triton")
    assert caps.triton_version is None and not caps.triton_usable
    assert "not importable" in caps.triton_reason


def test_triton_built_for_the_wrong_vendor_is_unusable():
    facts, _ = SIMULATED_DEVICES["mi300x"]
    caps = capabilities_from(facts, TritonFacts("3.6.0", active_backend="cuda"))
    assert not caps.triton_usable and "pytorch-triton-rocm" in caps.triton_reason


def test_ampere_has_no_fp8():
    caps = capabilities_from(DeviceFacts("cuda:0", False, "A100", "8.0", 108, 32), TritonFacts("3.6.0", active_backend="cuda"))
    assert caps.fp8_dtype is None


def test_capabilities_are_frozen():
    caps = simulated("h100")
    with pytest.raises(Exception):
        caps.arch = "sm_80"


def test_probe_is_cached():
    assert probe("cpu") is probe("cpu")


def test_import_does_no_device_work():
    code = "import spec_hal, torch; spec_hal.get_backend(); assert not torch.cuda.is_initialized(); print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: get_backend() legitimately probes it")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_import_alone_initialises_nothing():
    code = "import sys, spec_hal, torch; assert not torch.cuda.is_initialized(); assert 'triton' not in sys.modules; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_arch_table_covers_the_six_ci_targets():
    from spec_hal.capabilities import ARCH_TABLE

    assert set(ARCH_TABLE) == {"sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx950"}
    assert ARCH_TABLE["gfx942"].products[:2] == ("MI300X", "MI325X") and ARCH_TABLE["gfx942"].multiprocessors == 304
    assert "MI355X" in ARCH_TABLE["gfx950"].products and ARCH_TABLE["gfx950"].shared_bytes == 160 * 1024
    assert ARCH_TABLE["gfx90a"].shared_bytes == ARCH_TABLE["gfx942"].shared_bytes == 64 * 1024
    assert all(info.warp_size == 64 for info in ARCH_TABLE.values() if info.vendor == "amd")
    assert [ARCH_TABLE[a].fp8_dtype for a in ("gfx90a", "gfx942", "gfx950")] == [None, "float8_e4m3fnuz", "float8_e4m3fn"]


def test_mi250x_is_wave64_without_fp8():
    caps = simulated("mi250x")
    assert (caps.backend, caps.arch, caps.warp_size, caps.fp8_dtype) == ("rocm", "gfx90a", 64, None)


def test_offline_targets_are_wave64_on_amd():
    from spec_hal.kernels.launch import KernelTarget

    mi300x = KernelTarget.for_arch("gfx942")
    assert (mi300x.vendor, mi300x.warp_size, mi300x.multiprocessors) == ("amd", 64, 304)
    assert (mi300x.warps(256), KernelTarget.for_arch("sm_90").warps(256)) == (4, 8)
    assert KernelTarget.for_arch("gfx942", multiprocessors=228).multiprocessors == 228  # MI300A
