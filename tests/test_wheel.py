"""The wheel is the product: built from this checkout, installed into a fresh virtual environment
outside it, every ``spec-hal`` subcommand runs from another directory (issue 23).

The environment reuses the packages of the interpreter running the tests (torch, Triton, pytest)
through a ``.pth`` file instead of downloading them, and ``pip install --no-index`` must find every
declared dependency among them. Slow (about two minutes on two cores): not part of ``make test-quick``.
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _run(command, *, cwd, env, timeout=900):
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, command))} -> {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "SPEC_HAL_BACKEND")}
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"),
          str(ROOT)], cwd=work, env=env)
    wheel = next((work / "dist").glob("spec_hal-*.whl"))
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], cwd=work, env=env)
    python = venv / "bin" / "python"
    venv_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    # The running interpreter's packages (torch...), without processing their .pth files: an
    # editable spec_hal installed there stays invisible; the wheel is the only spec_hal. In the
    # running interpreter's order: a venv's packages shadow the base python's (a set here once put
    # the base's setuptools 65 before the venv's 84, and pip refused torch's setuptools>=77.0.3 on
    # about one hash seed in two).
    candidates = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    ours = [path for path in dict.fromkeys(candidates) if os.path.isdir(path)]
    Path(venv_site, "host-packages.pth").write_text("\n".join(ours) + "\n")
    _run([python, "-m", "pip", "install", "--quiet", "--no-index", str(wheel)], cwd=work, env=env)
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {"wheel": wheel, "cwd": elsewhere, "env": env, "bin": venv / "bin", "site": venv_site}


def test_wheel_declares_pytest_a_core_dependency_and_ships_the_manifest(installed):
    with zipfile.ZipFile(installed["wheel"]) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith("METADATA"))
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
        assert any(line.startswith("Requires-Dist: pytest") and "extra" not in line for line in requires), requires
        names = archive.namelist()
        assert "spec_hal/known_issues/compile-matrix.toml" in names
    # Every package of the checkout is in the wheel (a subpackage missing from pyproject's list
    # would import from a checkout and fail from the wheel).
    packages = {path.parent.relative_to(ROOT).as_posix() for path in (ROOT / "spec_hal").rglob("__init__.py")}
    shipped = {name.rsplit("/", 1)[0] for name in names if name.endswith("/__init__.py")}
    assert packages <= shipped, sorted(packages - shipped)


def test_installed_spec_hal_is_the_wheel(installed):
    result = _run([installed["bin"] / "python", "-c", "import spec_hal; print(spec_hal.__file__)"],
                  cwd=installed["cwd"], env=installed["env"])
    assert result.stdout.strip().startswith(installed["site"])


@pytest.mark.parametrize("argv", [
    ["info"],
    ["demo", "--max-tokens", "8"],
    ["conformance", "--backend", "cpu", "-k", "topk"],
    # One small module: the point is that the subcommand and its manifest load from the wheel; the
    # whole sm_90 lane here took 11 minutes on two cores, a second copy of what `make
    # compile-matrix` compiles anyway.
    ["compile-matrix", "--targets", "sm_90", "--modules", "spec_hal.kernels.compaction"],
], ids=lambda argv: argv[0])
def test_subcommand_runs_from_another_directory(installed, argv):
    if argv[0] == "compile-matrix":
        pytest.importorskip("triton", reason="the compile matrix needs the triton extra")
    result = _run([installed["bin"] / "spec-hal", *argv], cwd=installed["cwd"], env=installed["env"])
    assert "Traceback" not in result.stderr and "Warning" not in result.stdout + result.stderr, result.stderr[-3000:]
