"""Backend selection: explicit name, SPEC_HAL_BACKEND, plugins, built-in priority, errors."""
import sys
from pathlib import Path

import pytest
import torch

import spec_hal
from spec_hal.errors import BackendUnavailable, UnsupportedOnBackend
from spec_hal.selection import available_backends, choose, get_backend

DUMMY_PLUGIN = str(Path(__file__).parent / "dummy_plugin")


@pytest.fixture
def dummy_plugin_installed(monkeypatch):
    monkeypatch.syspath_prepend(DUMMY_PLUGIN)
    spec_hal.selection.reset()
    yield
    sys.modules.pop("spec_hal_dummy", None)


def test_cpu_is_always_available():
    assert available_backends()["cpu"] is None
    assert get_backend("cpu").name == "cpu"


def test_auto_selection_on_a_cpu_only_machine():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    choice = choose()
    assert choice.name == "cpu"
    assert "cuda" in choice.why and "rocm" in choice.why  # says why the GPU backends were skipped


def test_unknown_name_lists_valid_backends():
    with pytest.raises(BackendUnavailable) as error:
        get_backend("nonexistent")
    for name in ("cpu", "cuda", "rocm", "triton-interpret"):
        assert name in str(error.value)


def test_environment_variable_selects(monkeypatch):
    monkeypatch.setenv("SPEC_HAL_BACKEND", "cpu")
    assert choose().why == "SPEC_HAL_BACKEND=cpu"
    monkeypatch.setenv("SPEC_HAL_BACKEND", "nonexistent")
    with pytest.raises(BackendUnavailable):
        get_backend()


def test_unusable_explicit_choice_raises_with_reason_and_never_falls_back():
    if torch.cuda.is_available():
        pytest.skip("cuda is usable here")
    with pytest.raises(BackendUnavailable) as error:
        get_backend("cuda")
    assert "CUDA" in str(error.value) or "cuda" in str(error.value)


def test_unavailable_reasons_are_sentences():
    for name, reason in available_backends().items():
        assert reason is None or len(reason) > 10, name


def test_plugin_is_discovered_and_preferred(dummy_plugin_installed):
    assert "dummy" in available_backends()
    assert choose().name == "dummy"
    backend = get_backend()
    assert backend.name == "dummy"
    assert backend.provider("draft_topk").description.startswith("dummy plugin")


def test_disabled_plugin_is_skipped_with_its_reason(dummy_plugin_installed, monkeypatch):
    monkeypatch.setenv("SPEC_HAL_DUMMY_DISABLED", "1")
    assert available_backends()["dummy"] == "disabled by SPEC_HAL_DUMMY_DISABLED=1"
    assert choose().name != "dummy"


def test_missing_provider_raises_unsupported_naming_op_and_backend():
    backend = get_backend("cpu")
    stripped = spec_hal.Backend("partial", backend.capabilities, {}, {"draft_topk": "needs a vocabulary kernel"})
    with pytest.raises(UnsupportedOnBackend) as error:
        stripped.draft_topk(torch.zeros(1, 4), 1)
    assert error.value.op == "draft_topk" and error.value.backend == "partial"
    assert "vocabulary kernel" in str(error.value)


def test_module_level_ops_dispatch_cpu_tensors_to_cpu():
    probs, ids = spec_hal.draft_topk(torch.tensor([[0.0, 2.0, 1.0]]), 2)
    assert ids.tolist() == [[1, 2]]


def test_explain_names_the_choice_and_every_provider():
    text = spec_hal.explain()
    assert "selected: " in text and "draft_topk" in text
    if not torch.cuda.is_available():
        assert "no CUDA support" in text or "no CUDA device" in text
