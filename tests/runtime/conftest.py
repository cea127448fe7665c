import pytest


@pytest.fixture
def skip_plots(monkeypatch):
    """Drawing the PNGs takes ~1 s a run; tests that do not look at them skip it."""
    import fedveil.runtime.simulation as simulation

    calls = []
    monkeypatch.setattr(simulation, "write_report", lambda path: calls.append(path) or [])
    return calls
