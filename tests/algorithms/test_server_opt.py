import io

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from harness import assert_params_close, assert_params_equal, make_algorithm, run_rounds


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def msg(delta, n=1):
    return {"delta": {"w": t(*delta)}, "num_examples": n, "steps": 1}


def test_defaults():
    m = make_algorithm("fedavgm").hp
    assert (m.server_momentum, m.server_lr) == (0.9, 1.0)
    for name in ("fedadam", "fedyogi"):
        a = make_algorithm(name).hp
        assert (a.server_lr, a.beta1, a.beta2, a.tau) == (0.01, 0.9, 0.99, 1e-3)


@pytest.mark.parametrize(
    "name, bad",
    [
        ("fedavgm", {"server_momentum": 1.0}),
        ("fedavgm", {"server_momentum": -0.1}),
        ("fedadam", {"beta1": 1.0}),
        ("fedadam", {"beta2": -0.5}),
        ("fedyogi", {"tau": 0.0}),
        ("fedyogi", {"server_lr": 0.0}),
    ],
)
def test_bad_params_are_rejected(name, bad):
    with pytest.raises(ValidationError):
        make_algorithm(name, **bad)


def test_fedavgm_without_momentum_is_fedavg():
    client = {"batch_size": 2, "lr": 0.1}
    avg = run_rounds(make_algorithm("fedavg", client=client, server_lr=0.7), 3)
    avgm = run_rounds(make_algorithm("fedavgm", client=client, server_lr=0.7, server_momentum=0.0), 3)
    assert_params_equal(avgm.server["params"], avg.server["params"])


def test_fedavgm_two_steps_by_hand():
    alg = make_algorithm("fedavgm", server_momentum=0.9, server_lr=0.5)
    state = alg.init_server({"w": t(0.0, 0.0)})
    state = alg.aggregate(state, [(0, msg([1.0, -2.0]))], 0)  # v = [1, -2], w = 0.5 v
    assert_params_close(state["params"], {"w": t(0.5, -1.0)})
    state = alg.aggregate(state, [(0, msg([3.0, 0.0]))], 1)  # v = 0.9 [1, -2] + [3, 0] = [3.9, -1.8]
    assert_params_close(state["momentum"], {"w": t(3.9, -1.8)})
    assert_params_close(state["params"], {"w": t(0.5 + 0.5 * 3.9, -1.0 - 0.5 * 1.8)})


def reference(kind, rounds, w0, eta, b1, b2, tau):
    """Reddi et al. 2021, Alg. 2, in numpy: rounds = [[(delta, n), ...], ...]."""
    w, m, v = np.array(w0), np.zeros(len(w0)), np.full(len(w0), tau**2)
    for cohort in rounds:
        d = sum(n * np.array(x) for x, n in cohort) / sum(n for _, n in cohort)
        m = b1 * m + (1 - b1) * d
        if kind == "fedadam":
            v = b2 * v + (1 - b2) * d**2
        else:
            v = v - (1 - b2) * d**2 * np.sign(v - d**2)
        w = w + eta * m / (np.sqrt(v) + tau)
    return w, m, v


# Round 2 has a smaller update than round 1 in the first coordinate (v - Delta^2 > 0,
# Yogi's v shrinks) and a larger one in the second (v - Delta^2 < 0, v grows).
ROUNDS = [[([1.0, 0.01], 1), ([0.5, -0.03], 3)], [([0.05, 0.2], 2), ([0.01, 0.4], 2)]]


@pytest.mark.parametrize("name", ["fedadam", "fedyogi"])
@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("hp", [{}, {"server_lr": 0.3, "beta1": 0.5, "beta2": 0.9, "tau": 0.05}])
def test_adaptive_server_matches_the_formulas(name, steps, hp):
    alg = make_algorithm(name, **hp)
    h = alg.hp
    state = alg.init_server({"w": t(0.2, -0.1)})
    for r, cohort in enumerate(ROUNDS[:steps]):
        state = alg.aggregate(state, [(i, msg(d, n)) for i, (d, n) in enumerate(cohort)], r)
    w, m, v = reference(name, ROUNDS[:steps], [0.2, -0.1], h.server_lr, h.beta1, h.beta2, h.tau)
    assert_params_close(state["params"], {"w": torch.from_numpy(w)})
    assert_params_close(state["m"], {"w": torch.from_numpy(m)})
    assert_params_close(state["v"], {"w": torch.from_numpy(v)})


def test_adam_and_yogi_differ_once_the_update_shrinks():
    states = {}
    for name in ("fedadam", "fedyogi"):
        alg = make_algorithm(name)
        s = alg.init_server({"w": t(0.0, 0.0)})
        for r, cohort in enumerate(ROUNDS):
            s = alg.aggregate(s, [(i, msg(d, n)) for i, (d, n) in enumerate(cohort)], r)
        states[name] = s
    # first coordinate: Yogi's v decreases additively, Adam's multiplicatively
    assert float(states["fedyogi"]["v"]["w"][0]) > float(states["fedadam"]["v"]["w"][0])


@pytest.mark.parametrize("name", ["fedavgm", "fedadam", "fedyogi"])
def test_optimiser_state_is_checkpointable(name):
    alg = make_algorithm(name, client={"batch_size": 2})
    state = run_rounds(alg, 2).server
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert loaded.keys() == state.keys()
    for key, value in state.items():
        assert isinstance(value, dict) and all(isinstance(x, torch.Tensor) for x in value.values())
        assert_params_equal(loaded[key], value)
