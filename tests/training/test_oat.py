"""Once-for-All Adversarial Training (OAT, Wang et al. 2020; Split-Mix's FedAvg+OAT baseline):
the FiLM dual BN picks its BN by lambda and transforms by gamma(lambda), beta(lambda); a
step's lambda is drawn from the list and conditions the attack and the loss; FedAvg+OAT runs
on both executors and is served at any lambda."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedveil.errors import ConfigError
from fedveil.models.dual_bn import FiLMDualBatchNorm, conditioned, with_mix
from fedveil.runtime import run
from fedveil.runtime.saved_model import evaluate_saved
from fedveil.runtime.simulation import Simulation
from fedveil.training import Batch
from fedveil.training.adversarial import OAT_LAMBDA, PGD, OATPair, OATPairLoss, OATPairs
from fedveil.training.request import TaskLoss

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from tiny_runs import merge, tiny_config  # noqa: E402

torch.set_num_threads(1)


def film_layer() -> FiLMDualBatchNorm:
    torch.manual_seed(0)
    layer = FiLMDualBatchNorm(3, 2, track_running_stats=False)
    with torch.no_grad():
        layer.noise.weight.uniform_(0.5, 2)
        layer.noise.bias.uniform_(-1, 1)
    return layer


def test_at_start_film_is_the_identity_and_lambda_picks_the_bn():
    layer, x = film_layer(), torch.randn(4, 3, 5, 5)
    torch.testing.assert_close(layer(x), layer.clean(x))  # mix 0: the clean BN
    layer.mix.fill_(0.3)
    torch.testing.assert_close(layer(x), layer.noise(x))  # any lambda > 0: the noise BN, not a mixture


def test_film_transforms_by_gamma_and_beta_of_lambda():
    layer, x = film_layer(), torch.randn(4, 3, 5, 5)
    with torch.no_grad():
        layer.film[2].weight.normal_()
        layer.film[2].bias.normal_()
    lam = 0.4
    hidden = torch.relu(layer.film[0](torch.tensor([[lam]])))
    gamma, beta = layer.film[2](hidden).chunk(2, dim=1)
    expected = (1 + gamma.view(1, 3, 1, 1)) * layer.noise(x) + beta.view(1, 3, 1, 1)
    with conditioned(layer, lam):
        torch.testing.assert_close(layer(x), expected)
    layer.mix.fill_(lam)  # test time: the same through the mix buffer (with_mix)
    torch.testing.assert_close(layer(x), expected)


def test_a_step_draws_lambda_and_attacks_only_when_it_is_positive():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    pair = OATPair(net)
    batch = Batch(torch.rand(5, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1]), {})
    state = {f"net.{k}": v for k, v in net.state_dict().items()}
    clean = OATPairs(pair, PGD(eps=0.1, steps=2), (0.0,))(state, batch, torch.Generator().manual_seed(0))
    assert torch.equal(clean.x[:, 1], batch.x) and torch.all(clean.groups[OAT_LAMBDA] == 0)
    attacked = OATPairs(pair, PGD(eps=0.1, steps=2), (1.0,))(state, batch, torch.Generator().manual_seed(0))
    assert not torch.equal(attacked.x[:, 1], batch.x) and (attacked.x[:, 1] - batch.x).abs().max() <= 0.1 + 1e-6
    drawn = {float(OATPairs(pair, PGD(steps=1), (0.0, 0.5, 1.0))(state, batch, torch.Generator().manual_seed(s))
                   .groups[OAT_LAMBDA][0]) for s in range(30)}
    assert drawn == {0.0, 0.5, 1.0}


def test_the_loss_weights_by_the_steps_lambda():
    out = torch.randn(4, 2, 3)
    y = torch.tensor([0, 1, 2, 0])
    batch = Batch(torch.zeros(4, 2, 1), y, {OAT_LAMBDA: torch.full((4,), 0.25)})
    ce = torch.nn.functional.cross_entropy
    expected = 0.75 * ce(out[:, 0], y) + 0.25 * ce(out[:, 1], y)
    torch.testing.assert_close(OATPairLoss(TaskLoss(ce)).mean(out, batch), expected)


OAT = {
    "data": {"name": "synthetic_images", "num_clients": 4, "options": {"height": 8, "width": 8, "rows": 240}},
    "model": {"name": "digit_cnn", "options": {"width": 0.125, "norm": "film_dual_batch_tracked", "rescale_layer": False}},
    "algorithm": {"name": "fedavg", "adversarial": {"steps": 2, "oat_lams": [0.0, 0.5, 1.0]}},
    "client": {"batch_size": 16, "lr": 0.01, "steps": 3},
    "federation": {"rounds": 2, "clients_per_round": 4},
}


def test_fedavg_oat_agrees_on_both_executors_and_serves_any_lambda(tmp_path):
    states = {}
    for executor in ("serial", "vectorized"):
        run(tiny_config(**merge(OAT, {"executor": executor})), tmp_path / executor, progress=False)
        states[executor] = torch.load(tmp_path / executor / "model.pt", weights_only=True)
    for name, value in states["serial"].items():
        torch.testing.assert_close(states["vectorized"][name], value, msg=name)
    film = [k for k in states["serial"] if ".film.2." in k]
    assert film and any(states["serial"][k].abs().sum() > 0 for k in film)  # the conditioning was trained
    rows = evaluate_saved(tmp_path / "serial", lams=[0.0, 0.5, 1.0], attack=PGD(steps=1))
    assert [r["lam"] for r in rows] == [0.0, 0.5, 1.0]
    assert rows[1]["loss"] != rows[2]["loss"]  # same noise BN, different FiLM
    assert with_mix({"bn1.mix": torch.tensor(0.0)}, 0.5)["bn1.mix"] == 0.5


def test_oat_needs_a_lambda_conditioned_model():
    sections = merge(OAT, {"model": {"options": {"norm": "dual_batch_tracked"}}})
    with pytest.raises(ConfigError, match="film_dual"):
        Simulation.from_config(tiny_config(**sections))
