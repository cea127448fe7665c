"""FedFed phase 1 (spec 003 §1.3-1.6): the distillation loss by hand, a federated run that
trains the generator and the classifier, and the release: bounded, noised as asked, and
exactly x - reconstruction when the bound does not bind and there is no noise."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedveil.algorithms.fedfed import DistillationDraws, DistillationLoss, release_features
from fedveil.data.arrays import ArrayDataset
from fedveil.errors import ConfigError
from fedveil.models import build_model
from fedveil.models.fedfed import NOISE, VAE_EPS
from fedveil.models.functional import model_state
from fedveil.runtime import run
from fedveil.runtime.simulation import Simulation
from fedveil.training import Batch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from tiny_runs import merge, rows_of, tiny_config  # noqa: E402

torch.set_num_threads(1)

DISTILL = {
    "data": {"name": "synthetic_images", "num_clients": 4, "options": {"height": 8, "width": 8, "rows": 320}},
    "model": {"name": "fedfed_vae", "options": {"latent": 8, "width": 4, "rho": 0.5, "sigma": 0.1}},
    "algorithm": {"name": "fedfed_distill"},
    "client": {"batch_size": 16, "lr": 0.01, "momentum": 0.9, "epochs": 1},
    "federation": {"rounds": 3, "clients_per_round": 4},
}


def test_the_loss_is_the_weighted_sum_of_its_four_terms():
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(3, 1, 4, 4, generator=g), torch.tensor([0, 1, 1])
    logits_x, logits_s = torch.randn(3, 2, generator=g), torch.randn(3, 2, generator=g)
    x_r, mu, logvar = torch.rand(3, 1, 4, 4, generator=g), torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    loss = DistillationLoss(F.cross_entropy, 5.0, 2.0, 0.005, 0.4).mean((logits_x, logits_s, x_r, mu, logvar),
                                                                     Batch(x, y, {}))
    kl = sum(-0.5 * (1 + logvar[i, j] - mu[i, j] ** 2 - torch.exp(logvar[i, j])) for i in range(3) for j in range(5)) / 15
    mse = ((x_r - x) ** 2).mean()
    expected = 5 * mse + 2 * F.cross_entropy(logits_s, y) + 0.005 * kl + 0.4 * F.cross_entropy(logits_x, y)
    torch.testing.assert_close(loss, expected)


def test_draws_are_standard_normals_from_the_clients_generator():
    batch = Batch(torch.rand(4, 1, 8, 8), torch.zeros(4, dtype=torch.long), {"domain": torch.arange(4)})
    a = DistillationDraws(6)({}, batch, torch.Generator().manual_seed(3))
    b = DistillationDraws(6)({}, batch, torch.Generator().manual_seed(3))
    assert a.groups[VAE_EPS].shape == (4, 6) and a.groups[NOISE].shape == (4, 1, 8, 8)
    assert torch.equal(a.groups[NOISE], b.groups[NOISE]) and torch.equal(a.groups["domain"], batch.groups["domain"])


def test_a_federated_distillation_trains_generator_and_classifier(tmp_path):
    config = tiny_config(**DISTILL)
    init = Simulation.from_config(config).fresh_state()["server"]["params"]
    run(config, tmp_path / "run", progress=False)
    final = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    for part in ("encoder.0.weight", "decoder.0.weight", "classifier.0.weight"):
        assert not torch.equal(final[part], init[part]), part
    losses = [r["train_loss"] for r in rows_of(tmp_path / "run")]
    assert losses[-1] < losses[0]


def test_example_dp_and_other_models_are_refused():
    with pytest.raises(ConfigError, match="fedfed_vae"):
        Simulation.from_config(tiny_config(**{**DISTILL, "model": {"name": "lenet"},
                                               "data": {**DISTILL["data"], "options": {"height": 28, "width": 28, "rows": 320}}}))
    with pytest.raises(ConfigError, match="example-level DP"):
        Simulation.from_config(tiny_config(**merge(DISTILL, {"privacy": {"level": "example", "epsilon": 4.0, "clip": 1.0}})))


def test_the_release_is_bounded_noised_and_exact_without_noise():
    torch.manual_seed(4)
    model = build_model("fedfed_vae", (1, 8, 8), 10, latent=8, width=4, rho=1.0)
    state = model_state(model)
    bright = ArrayDataset(0.6 + 0.4 * torch.rand(6, 1, 8, 8), torch.arange(6) % 10)
    exact = release_features(model, state, bright, 0.0, torch.Generator().manual_seed(0))
    x_r, _, _, _ = model.eval().split(bright.x)
    torch.testing.assert_close(exact.x, bright.x - x_r)  # sigma 0, rho 1 (not binding on bright images)
    assert torch.equal(exact.y, bright.y)
    noisy = release_features(model, state, bright, 0.5, torch.Generator().manual_seed(0))
    n = torch.randn(exact.x.shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(noisy.x, exact.x + 0.5 * n)
    tight = build_model("fedfed_vae", (1, 8, 8), 10, latent=8, width=4, rho=0.1)
    dark = ArrayDataset(torch.rand(6, 1, 8, 8) * 0.2, torch.zeros(6, dtype=torch.long))
    shared = release_features(tight, model_state(tight), dark, 0.0, torch.Generator().manual_seed(0))
    assert torch.all(shared.x.flatten(1).norm(dim=1) <= 0.1 * dark.x.flatten(1).norm(dim=1) * (1 + 1e-6))
