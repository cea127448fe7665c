"""PGD adversarial training with dual BN (Split-Mix §4.4.3, Eq. 4.1-4.2, Alg. C.1): the
attack, the dual BN's mix, the pair objective, and FedAvg+AT runs on every executor and
under DP-SGD."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedveil.errors import ConfigError
from fedveil.models import build_model
from fedveil.models.dual_bn import DualBatchNorm, routed, with_mix
from fedveil.models.functional import forward, model_state
from fedveil.runtime import run
from fedveil.runtime.saved_model import evaluate_saved
from fedveil.training import Batch
from fedveil.training.adversarial import PGD, AdversarialPair, PairLoss, PGDPairs
from fedveil.training.request import TaskLoss

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from tiny_runs import merge, rows_of, tiny_config  # noqa: E402

torch.set_num_threads(1)


class Linear2(nn.Module):
    """logits (x . a, 0): CE for label 1 grows along +a, so PGD moves x by +step * sign(a)."""

    def __init__(self, a: torch.Tensor) -> None:
        super().__init__()
        self.a = a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x.flatten(1) @ self.a, torch.zeros(len(x))], dim=1)


def test_pgd_steps_along_the_gradient_sign_and_stays_in_the_ball_and_the_box():
    a = torch.tensor([1.0, -2.0, 0.5, -0.1])
    x = torch.tensor([[0.5, 0.5, 0.99, 0.01]])
    y = torch.tensor([1])
    attack = PGD(eps=8 / 255, steps=3, random_start=False)
    assert attack.step == pytest.approx((10 / 255) / 3)  # min(1.25 eps, eps + 4/255) / steps
    adv = attack.attack(Linear2(a), x, y, torch.Generator().manual_seed(0))
    # 3 steps of 10/765 = 10/255 > eps: every coordinate ends at the ball's edge along sign(a), clipped to [0, 1]
    expected = (x + 8 / 255 * a.sign()).clamp(0, 1)
    torch.testing.assert_close(adv, expected)
    rand = PGD(eps=0.1, steps=2).attack(Linear2(a), x.repeat(50, 1), y.repeat(50), torch.Generator().manual_seed(1))
    assert (rand - x).abs().max() <= 0.1 + 1e-6 and rand.min() >= 0 and rand.max() <= 1


def test_dual_bn_mixes_clean_and_noise_outputs_eq_4_2():
    torch.manual_seed(0)
    layer = DualBatchNorm(3, 2, track_running_stats=False)
    with torch.no_grad():
        layer.noise.weight.uniform_(0.5, 2)
        layer.noise.bias.uniform_(-1, 1)
    x = torch.randn(6, 3, 4, 4)
    state = model_state(layer)
    clean, noise = layer.clean(x), layer.noise(x)
    for lam in (0.0, 0.3, 1.0):
        torch.testing.assert_close(forward(layer, with_mix(state, lam), x), (1 - lam) * clean + lam * noise)
    with routed(layer, "noise"):
        torch.testing.assert_close(layer(x), noise)
    assert layer.route == "mix"
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        with_mix(state, 1.5)


def test_the_pair_objective_weights_clean_and_adversarial_losses_eq_4_1():
    torch.manual_seed(0)
    net = build_model("digit_cnn", (1, 8, 8), 10, width=0.125, norm="dual_batch_average")
    pair = AdversarialPair(net)
    state = {f"net.{k}": v for k, v in model_state(net).items()}
    x, y = torch.rand(8, 1, 8, 8), torch.randint(0, 10, (8,))
    batch = PGDPairs(pair, PGD(steps=2))(state, Batch(x, y, {}), torch.Generator().manual_seed(0))
    assert batch.x.shape == (8, 2, 1, 8, 8) and torch.equal(batch.x[:, 0], x)
    assert (batch.x[:, 1] - x).abs().max() <= 8 / 255 + 1e-6
    out = forward(pair, state, batch.x, train=True)
    own = {k[4:]: v for k, v in state.items()}
    with routed(net, "clean"):
        clean = forward(net, own, x, train=True)
    with routed(net, "noise"):
        adversarial = forward(net, own, batch.x[:, 1], train=True)
    torch.testing.assert_close(out[:, 0], clean)
    torch.testing.assert_close(out[:, 1], adversarial)
    loss = PairLoss(TaskLoss(F.cross_entropy), 0.3).mean(out, batch)
    torch.testing.assert_close(loss, 0.7 * F.cross_entropy(clean, y) + 0.3 * F.cross_entropy(adversarial, y))


AT = {
    "data": {"name": "synthetic_images", "num_clients": 4, "options": {"height": 8, "width": 8, "rows": 240}},
    "model": {"name": "digit_cnn", "options": {"width": 0.125, "norm": "dual_batch_tracked", "rescale_layer": False}},
    "algorithm": {"name": "fedavg", "adversarial": {"lam": 0.5, "steps": 2}},
    "client": {"batch_size": 16, "lr": 0.01, "steps": 2},
    "federation": {"rounds": 2, "clients_per_round": 4},
}


def test_fedavg_at_agrees_on_both_executors_and_serves_any_mix(tmp_path):
    states = {}
    for executor in ("serial", "vectorized"):
        run(tiny_config(**merge(AT, {"executor": executor})), tmp_path / executor, progress=False)
        states[executor] = torch.load(tmp_path / executor / "model.pt", weights_only=True)
    for name, value in states["serial"].items():
        torch.testing.assert_close(states["vectorized"][name], value, msg=name)
    assert not torch.equal(states["serial"]["bn1.clean.running_mean"], states["serial"]["bn1.noise.running_mean"])
    rows = evaluate_saved(tmp_path / "serial", lams=[0.0, 1.0], attack=PGD(steps=2))
    assert [r["lam"] for r in rows] == [0.0, 1.0]
    assert all(0 <= r["robust_accuracy"] <= 1 for r in rows)
    assert rows[0]["loss"] != rows[1]["loss"]  # the two BNs' running statistics differ


def test_fedavg_at_under_dp_sgd_accounts_as_usual(tmp_path):
    sections = merge(AT, {"model": {"options": {"norm": "none"}},
                          "privacy": {"level": "example", "epsilon": 4.0, "clip": 1.0}})
    run(tiny_config(**sections), tmp_path / "dp", progress=False)
    last = rows_of(tmp_path / "dp")[-1]
    assert 0 < last["epsilon"] <= 4.0 + 1e-6


def test_adversarial_training_is_refused_where_it_would_be_ignored():
    from fedveil.runtime.simulation import Simulation

    with pytest.raises(ConfigError, match="not supported by FedProx"):
        Simulation.from_config(tiny_config(**merge(AT, {"algorithm": {"name": "fedprox"}})))


def test_split_mix_dual_bn_adversarial_training_serves_width_and_robustness(tmp_path):
    sections = merge(AT, {
        "model": {"options": {"width": 0.25, "bases": 2}},
        "algorithm": {"name": "split_mix", "budgets": [0.125, 0.25]},
    })
    run(tiny_config(**sections), tmp_path / "sm", progress=False)
    rows = evaluate_saved(tmp_path / "sm", [0.125, 0.25], lams=[0.0, 1.0], attack=PGD(steps=1))
    assert [(r["width"], r["lam"]) for r in rows] == [(0.125, 0.0), (0.125, 1.0), (0.25, 0.0), (0.25, 1.0)]
    assert rows[2]["params"] == 2 * rows[0]["params"]
    state = torch.load(tmp_path / "sm" / "model.pt", weights_only=True)
    assert not torch.equal(state["bases.1.bn1.clean.running_mean"], state["bases.1.bn1.noise.running_mean"])


def test_per_base_pairs_attack_each_base_on_its_own():
    from fedveil.models.functional import submodule_forward
    from fedveil.training.adversarial import PerBasePair, PerBasePGDPairs

    torch.manual_seed(3)
    net = build_model("digit_cnn", (1, 8, 8), 10, width=0.25, bases=2, norm="dual_batch_tracked", rescale_layer=False)
    net = net.with_bases(2, "stack")
    pair = PerBasePair(net)
    state = {f"net.{k}": v for k, v in model_state(net).items()}
    batch = Batch(torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 2, 3]), {})
    attack = PGD(eps=0.05, steps=2)
    out = PerBasePGDPairs(pair, attack)(state, batch, torch.Generator().manual_seed(0))
    assert out.x.shape == (4, 3, 1, 8, 8) and torch.equal(out.x[:, 0], batch.x)
    g = torch.Generator().manual_seed(0)
    own = model_state(net)
    for k in range(2):  # the same generator, attacks in base order
        def predict(x, k=k):
            with routed(net, "noise"):
                return submodule_forward(net, f"bases.{k}", own, x)
        torch.testing.assert_close(out.x[:, 1 + k], attack.attack(predict, batch.x, batch.y, g))
    assert not torch.equal(out.x[:, 1], out.x[:, 2])
    logits = forward(pair, state, out.x, train=True)
    assert logits.shape == (4, 2, 2, 10)


def test_split_mix_trains_with_per_base_attacks_and_fedavg_refuses_them(tmp_path):
    sections = merge(AT, {
        "model": {"options": {"width": 0.25, "bases": 2}},
        "algorithm": {"name": "split_mix", "budgets": [0.125, 0.25], "adversarial": {"per_base": True}},
    })
    run(tiny_config(**sections), tmp_path / "sm", progress=False)
    assert (tmp_path / "sm" / "model.pt").is_file()
    from fedveil.runtime.simulation import Simulation

    with pytest.raises(ConfigError, match="per_base"):
        Simulation.from_config(tiny_config(**merge(AT, {"algorithm": {"adversarial": {"per_base": True}}})))
