import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models train far faster on one thread, and pytest -n 2 already fills two cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def skip_plots(monkeypatch):
    """Drawing the PNGs takes ~1 s a run; tests that do not look at them skip it."""
    import fedveil.runtime.simulation as simulation

    calls = []
    monkeypatch.setattr(simulation, "write_report", lambda path: calls.append(path) or [])
    return calls
