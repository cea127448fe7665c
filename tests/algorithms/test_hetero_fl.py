"""HeteroFL and SHeteroFL (spec 000 part 2 §A.8): leading-block sub-models, entry-wise
aggregation, slimmable training as a sum of per-width losses, and HeteroFL = FedAvg when
every client can afford the whole model."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedveil import params as P
from fedveil.algorithms.hetero_fl import Slimmable, sliced
from fedveil.errors import ConfigError
from fedveil.models import build_model
from fedveil.models.functional import model_state
from fedveil.runtime import run
from fedveil.runtime.simulation import Simulation

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from tiny_runs import merge, run_in_float64, tiny_config  # noqa: E402

torch.set_num_threads(1)

HETERO = {
    "data": {"name": "synthetic_images", "num_clients": 6, "options": {"height": 8, "width": 8, "rows": 600}},
    "model": {"name": "digit_cnn", "options": {"width": 0.5}},
    "algorithm": {"name": "heterofl", "budgets": [0.25, 0.5, 1.0]},  # fractions of the x1 model (width 0.5)
    "client": {"batch_size": 16, "lr": 0.01, "momentum": 0.9, "steps": 3},
    "federation": {"rounds": 2, "clients_per_round": 6},
    "checkpoint": {"every": 1},
}


def test_corner_mean_averages_each_entry_over_the_updates_that_cover_it():
    params = {"w": torch.zeros(2, 3)}
    updates = [{"w": torch.ones(1, 2)}, {"w": torch.full((2, 3), 4.0)}]
    new = P.corner_mean(params, updates, [1.0, 3.0])["w"]
    # entries (0,0),(0,1): both updates, (1*1 + 3*4) / 4 = 3.25; the rest only the second: 4
    assert torch.equal(new, torch.tensor([[3.25, 3.25, 4.0], [4.0, 4.0, 4.0]]))
    untouched = P.corner_mean({"w": torch.ones(2), "b": torch.ones(1)}, [{"w": -torch.ones(1)}], [1.0])
    assert untouched["w"].tolist() == [0.0, 1.0] and untouched["b"].tolist() == [1.0]


def test_a_sub_model_is_the_leading_block_of_every_tensor():
    full = build_model("digit_cnn", (1, 8, 8), 10, width=0.5)
    narrow = build_model("digit_cnn", (1, 8, 8), 10, width=0.125)
    state = model_state(full)
    sub = sliced(state, narrow)
    assert sub["conv1.weight"].shape == (8, 1, 5, 5) and torch.equal(sub["conv1.weight"], state["conv1.weight"][:8])
    assert sub["conv2.weight"].shape == (8, 8, 5, 5) and torch.equal(sub["conv2.weight"], state["conv2.weight"][:8, :8])
    assert sub["fc3.weight"].shape == (10, 64) and torch.equal(sub["fc3.weight"], state["fc3.weight"][:, :64])


def test_slimmable_training_sums_the_losses_of_every_width():
    torch.manual_seed(0)
    nets = {w: build_model("digit_cnn", (1, 8, 8), 10, width=w) for w in (0.125, 0.25)}
    module = Slimmable(nets[0.25], [nets[0.125]])
    state = {n: v.detach().requires_grad_(True) for n, v in model_state(nets[0.25]).items()}
    x, y = torch.rand(12, 1, 8, 8), torch.randint(0, 10, (12,))
    out = functional_call(module, {f"net.{n}": v for n, v in state.items()}, (x,))
    assert out.shape == (12, 2, 10)
    loss = F.cross_entropy(out[:, 0], y) + F.cross_entropy(out[:, 1], y)
    grads = torch.autograd.grad(loss, list(state.values()))
    # by hand: each width's forward on its own block, gradients summed into the shared tensors
    wide = functional_call(nets[0.25], state, (x,))
    narrow = functional_call(nets[0.125], sliced(state, nets[0.125]), (x,))
    torch.testing.assert_close(out[:, 1], wide)
    torch.testing.assert_close(out[:, 0], narrow)
    expected = torch.autograd.grad(F.cross_entropy(wide, y) + F.cross_entropy(narrow, y), list(state.values()))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


def test_heterofl_with_every_client_at_full_width_is_fedavg(tmp_path):
    common = merge(HETERO, {"algorithm": {"budgets": [1.0]}})
    run(tiny_config(**common), tmp_path / "hetero", progress=False)
    fedavg = merge(HETERO, {})
    fedavg["algorithm"] = {"name": "fedavg"}
    run(tiny_config(**fedavg), tmp_path / "fedavg", progress=False)
    a = torch.load(tmp_path / "hetero" / "checkpoint.pt", weights_only=True)["server"]["params"]
    b = torch.load(tmp_path / "fedavg" / "checkpoint.pt", weights_only=True)["server"]["params"]
    for name in b:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("algorithm", ["heterofl", "sheterofl"])
def test_serial_and_vectorized_agree(algorithm):
    params = {}
    for executor in ("serial", "vectorized"):
        # in float64: in float32 a max-pool near-tie can split the executors (see test_split_mix.py)
        config = tiny_config(**merge(HETERO, {"executor": executor, "algorithm": {"name": algorithm}}))
        with pytest.warns() if (algorithm == "sheterofl" and executor == "vectorized") else _nothing():
            _, server = run_in_float64(config)
        params[executor] = server["params"]
    for name, value in params["serial"].items():
        torch.testing.assert_close(params["vectorized"][name], value, rtol=1e-10, atol=1e-12, msg=name)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_widths_serve_the_leading_blocks_and_untrained_entries_stay(tmp_path):
    """Budgets and served widths are fractions of the configured model (builder width 0.5)."""
    config = tiny_config(**merge(HETERO, {"algorithm": {"budgets": [0.25, 0.5]}}))
    sim = Simulation.from_config(config)
    init = sim.fresh_state()["server"]["params"]
    run(config, tmp_path / "run", progress=False)
    final = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["server"]["params"]
    # no client affords more than half the x1 model (builder width 0.25): conv1's channels 16..31 never move
    assert torch.equal(final["conv1.weight"][16:], init["conv1.weight"][16:])
    assert not torch.equal(final["conv1.weight"][:16], init["conv1.weight"][:16])
    x = torch.rand(5, 1, 8, 8)
    narrow = build_model("digit_cnn", (1, 8, 8), 10, width=0.125)
    torch.testing.assert_close(sim.algorithm.predict_at(final, x, 0.25),
                               functional_call(narrow.eval(), sliced(final, narrow), (x,)))


def test_an_ensemble_model_is_refused():
    with pytest.raises(ConfigError, match="bases at 1"):
        Simulation.from_config(tiny_config(**merge(HETERO, {"model": {"options": {"bases": 2}}})))
