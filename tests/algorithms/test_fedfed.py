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
    # the distiller's own signals: its reconstruction error falls, the shared part stays within rho
    rows = rows_of(tmp_path / "run")
    assert rows[-1]["reconstruction_mse"] < rows[0]["reconstruction_mse"]
    assert all(0 < r["shared_norm_share"] <= 0.5 + 1e-6 for r in rows)


def test_the_reconstruction_signal_is_the_trained_distillers_error_on_the_clients_test_rows():
    sim = Simulation.from_config(tiny_config(**DISTILL))
    state = sim.fresh_state()
    server, task = state["server"], sim.task(1, 0)
    result = sim.algorithm.client_update(server, None, task)
    trained = {k: server["params"][k] + d for k, d in result.message["delta"].items()}
    with torch.no_grad():
        x_r, x_s, _, _ = method_call(sim.model, trained, "split", task.data.test.x)
    assert result.extra_metrics["reconstruction_mse"] == pytest.approx(float(((x_r - task.data.test.x) ** 2).mean()))
    ratio = x_s.flatten(1).norm(dim=1) / task.data.test.x.flatten(1).norm(dim=1)
    assert result.extra_metrics["shared_norm_share"] == pytest.approx(float(ratio.mean()))


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


# ---------------------------------------------------------------------------- phase 2

from fedveil.algorithms.fedfed import balanced_draw  # noqa: E402
from fedveil.config import validate  # noqa: E402
from fedveil.models.functional import method_call  # noqa: E402
from fedveil.privacy.feature_release import release_epsilon  # noqa: E402
from fedveil.seeding import torch_generator  # noqa: E402
from tiny_runs import tiny_distiller, tiny_raw  # noqa: E402


def phase2(distiller: str, name: str = "fedfed_fedavg", **sections):
    return tiny_config(**merge({"algorithm": {"name": name, "distiller": distiller, "sigma": 0.5},
                                "model": {"name": "mlp", "options": {"hidden": [8]}}}, sections))


@pytest.fixture
def distiller(tmp_path):
    return tiny_distiller(tmp_path / "distill", {"latent": 4, "width": 4, "rho": 0.3})


def test_the_draw_is_class_balanced_with_a_uniform_remainder():
    labels = torch.tensor([0] * 50 + [1] * 30 + [2] * 2)
    index = balanced_draw(labels, 23, 3, torch.Generator().manual_seed(0))
    assert len(index) == 23
    counts = torch.bincount(labels[index][:21], minlength=3)
    assert counts.tolist() == [7, 7, 7]  # 23 // 3 of each class first (class 2 drawn with replacement)
    assert len(set(index[:7].tolist())) == 7 and len(set(index[7:14].tolist())) == 7  # enough rows: no repeats


def test_setup_releases_every_clients_rows_once_bounded_and_accounted(distiller):
    config = phase2(distiller, algorithm={"sigma": 2.0}, privacy={"accountant": "pld"})
    sim = Simulation.from_config(config)
    pool = sim.fresh_state()["server"]["shared"]
    sizes = [c.num_train for c in sim.data.clients]
    assert len(pool["x"]) == sum(sizes)
    model, state = sim.algorithm.distiller, sim.algorithm.distiller_state
    lo = 0
    for cid, client in enumerate(sim.data.clients):  # x_p = x_s + sigma n, n from the client's setup stream
        x = client.train.x
        _, x_s, _, _ = method_call(model, state, "split", x)
        n = torch.randn(x.shape, generator=torch_generator(config.seed, "setup", cid))
        torch.testing.assert_close(pool["x"][lo : lo + len(x)], x_s + 2.0 * n)
        assert torch.equal(pool["y"][lo : lo + len(x)], client.train.y)
        assert torch.all(x_s.flatten(1).norm(dim=1) <= 0.3 * x.flatten(1).norm(dim=1) * (1 + 1e-6))
        lo += len(x)
    # at privacy.level none the release is still recorded: one Gaussian of sensitivity rho sqrt(64) per client
    expected = release_epsilon(2.0, 0.3, 8.0, config.privacy.delta)
    spent = sim.privacy.spent()
    assert set(spent) == set(range(len(sizes)))
    assert all(e == pytest.approx(expected, rel=1e-3) for e in spent.values())


def test_a_run_reports_the_release_epsilon_and_trains_on_own_plus_shared_rows(tmp_path, distiller):
    config = phase2(distiller, client={"batch_size": 32, "epochs": 1}, federation={"rounds": 2, "clients_per_round": 5})
    summary = run(config, tmp_path / "run", progress=False)
    expected = release_epsilon(0.5, 0.3, 8.0, config.privacy.delta)
    rows = rows_of(tmp_path / "run")
    assert summary["privacy_level"] == "none" and summary["epsilon"] >= expected * (1 - 1e-6)  # rdp: a valid upper bound
    assert all(r["epsilon"] == summary["epsilon"] for r in rows)  # one release, before round 0
    sim = Simulation.from_config(config)
    server = sim.fresh_state()["server"]
    task = sim.task(0, 0)
    data = sim.algorithm.training_rows(server, task)
    n = task.data.num_train
    assert len(data) == 2 * n and torch.equal(data.x[:n], task.data.train.x)
    _, stats = task.trainer.train(server["params"], data, task.generator, 0, **sim.algorithm.request_options(task))
    assert stats.steps == -(-n // 32)  # an epoch over the own rows
    assert stats.examples == 2 * n  # every step as many shared rows as own


def test_example_dp_leaves_room_for_the_release_in_the_budget(tmp_path, distiller):
    budget = 8.0
    config = phase2(distiller, algorithm={"sigma": 2.0}, privacy={"level": "example", "epsilon": budget, "clip": 1.0},
                    federation={"rounds": 2, "clients_per_round": 5})
    summary = run(config, tmp_path / "run", progress=False)
    release = release_epsilon(2.0, 0.3, 8.0, config.privacy.delta)  # 5.41
    assert summary["epsilon_per_client"] == pytest.approx([budget] * 5, rel=2e-3)  # DP-SGD calibrated to the rest
    assert summary["planned_epsilon_per_client"] == pytest.approx([budget] * 5, rel=2e-3)
    assert release < budget
    with pytest.raises(ConfigError, match="unreachable"):  # the release alone (12.5) spends more than the budget
        Simulation.from_config(phase2(distiller, algorithm={"sigma": 1.0},
                                      privacy={"level": "example", "epsilon": budget, "clip": 1.0}))


def test_bad_distillers_data_and_privacy_levels_are_refused(tmp_path, distiller):
    with pytest.raises(ConfigError, match="not a finished fedveil run"):
        Simulation.from_config(phase2(str(tmp_path / "missing")))
    lenet = tmp_path / "lenet"
    lenet.mkdir()
    (lenet / "config.json").write_text('{"model": {"name": "lenet", "options": {}}}')
    (lenet / "model.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="not a fedfed_vae"):
        Simulation.from_config(phase2(str(lenet)))
    with pytest.raises(ConfigError, match="does not fit"):
        Simulation.from_config(phase2(distiller, data={"name": "synthetic_images", "options": {"height": 12, "width": 12}}))
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        Simulation.from_config(phase2(distiller, data={"name": "synthetic_images", "options": {"height": 8, "width": 8}})).fresh_state()
    with pytest.raises(ConfigError, match="client-level DP"):
        Simulation.from_config(phase2(distiller, privacy={"level": "client", "noise_multiplier": 1.0}))
