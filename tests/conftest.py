import pytest

import spec_hal.selection


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: minutes of work; left out of `make test-quick` (-m 'not slow')")


@pytest.fixture(autouse=True)
def fresh_selection(monkeypatch):
    """Each test starts with no cached backends and no SPEC_HAL_BACKEND from the environment."""
    monkeypatch.delenv("SPEC_HAL_BACKEND", raising=False)
    spec_hal.selection.reset()
    yield
    spec_hal.selection.reset()
