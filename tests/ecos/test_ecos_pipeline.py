"""The ECOS pipeline (plan, select, stage costs, the ledger) and cloud training on the selection."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedveil.data.arrays import ArrayDataset
from fedveil.ecos.cloud_training import CloudSGD, accuracy, train_classifier
from fedveil.ecos.coverage import coverage_release
from fedveil.ecos.pipeline import CloudPool, ECOSSettings, plan, select
from fedveil.models.functional import model_state
from fedveil.privacy.ledger import PrivacyLedger

torch.set_num_threads(1)
SIDE = 8


def stripes(n: int, vertical: bool, seed: int) -> torch.Tensor:
    """``n`` 3 x 8 x 8 images of stripes two pixels wide (vertical or horizontal), with noise."""
    g = torch.Generator().manual_seed(seed)
    line = (torch.arange(SIDE) // 2 % 2).float()
    image = line.view(1, SIDE).expand(SIDE, SIDE) if vertical else line.view(SIDE, 1).expand(SIDE, SIDE)
    return image.expand(n, 3, SIDE, SIDE) + 0.05 * torch.randn(n, 3, SIDE, SIDE, generator=g)


CLIENT = stripes(200, vertical=True, seed=0)
CLOUD = torch.cat([stripes(150, vertical=True, seed=1), stripes(150, vertical=False, seed=2)])  # rows < 150: in-distribution
SETTINGS = ECOSSettings(extractor_options={"cells": 2}, R=10, sigma=5.0, accountant="rdp")  # RDP: fast epsilons


def ledger() -> PrivacyLedger:
    return PrivacyLedger(SETTINGS.accountant)


def test_plan_is_one_coverage_release_and_its_epsilon():
    spend = plan(ECOSSettings())
    assert spend.releases == (coverage_release(25.0, 0.8),)
    assert spend.epsilon == PrivacyLedger("pld").epsilon_of([coverage_release(25.0, 0.8)], 1e-5)
    assert spend.epsilon == pytest.approx(0.0995, rel=0.02)  # sensitivity 1; the paper's 2 gives 0.215
    assert plan(ECOSSettings(epsilon_budget=0.1)).epsilon == spend.epsilon


def test_an_over_budget_setting_is_refused_before_any_work():
    settings = ECOSSettings(extractor_options={"cells": 2}, R=10, epsilon_budget=0.05)
    with pytest.raises(ValueError, match=r"costs epsilon 0\.099\d* .* over the budget 0\.05"):
        plan(settings)
    pool, spent = CloudPool(CLOUD, settings, seed=0), PrivacyLedger("pld")
    with pytest.raises(ValueError, match="over the budget"):
        select("ecos", CLIENT, pool, 50, settings, spent, "client", seed=0)
    assert len(spent) == 0 and "features" not in vars(pool) and "centroids" not in vars(pool)  # nothing computed


def test_a_client_whose_ledger_would_pass_the_budget_is_refused():
    settings = ECOSSettings(extractor_options={"cells": 2}, R=10, epsilon_budget=0.12)  # one upload 0.0995, two 0.145
    spent = PrivacyLedger("pld")
    select("ecos", CLIENT, CLOUD, 50, settings, spent, "client", seed=0)
    with pytest.raises(ValueError, match="client 'client' would reach epsilon .* over the budget 0.12"):
        select("proximity", CLIENT, CLOUD, 50, settings, spent, "client", seed=1)
    assert len(spent) == 1


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
@pytest.mark.parametrize("method", ["ecos", "proximity"])
def test_a_private_selection_records_exactly_the_planned_release(method, accountant):
    settings = dataclasses.replace(SETTINGS, sigma=25.0, accountant=accountant)
    spent = PrivacyLedger(accountant)
    chosen = select(method, CLIENT, CLOUD, 60, settings, spent, "client", seed=3)
    [release] = spent.releases("client")
    assert release.event == coverage_release(25.0, 0.8).event and release.count == 1
    independent = PrivacyLedger(accountant).epsilon_of([coverage_release(25.0, 0.8)], 1e-5)
    assert chosen.epsilon == spent.epsilon("client", 1e-5) == pytest.approx(independent, rel=1e-12)
    assert spent.subjects == ["client"]


@pytest.mark.parametrize("method", ["random", "k_center"])
def test_the_baselines_record_nothing(method):
    spent = ledger()
    chosen = select(method, CLIENT, CLOUD, 60, SETTINGS, spent, "client", seed=3)
    assert len(spent) == 0 and chosen.epsilon == 0.0 and chosen.summary is None
    assert chosen.indices.size == 60 and np.unique(chosen.indices).size == 60
    assert chosen.cost.upload_bytes == chosen.cost.download_bytes == chosen.cost.client_summary_s == 0
    assert (chosen.cost.cloud_features_s > 0) == (method == "k_center")


def test_ecos_picks_the_clients_stripes_and_costs_4R_plus_24_bytes_up():
    chosen = select("ecos", CLIENT, CLOUD, 100, SETTINGS, ledger(), "client", seed=4)
    assert 0 < chosen.indices.size <= 100 and np.unique(chosen.indices).size == chosen.indices.size
    assert (chosen.indices < 150).mean() >= 0.9  # the vertical stripes, half of the pool
    cost = chosen.cost
    assert cost.upload_bytes == chosen.summary.nbytes == 4 * 10 + 24
    d_e = 2 * 2 * 9  # HOG: 2 x 2 cells, one 2 x 2 block, 9 bins
    assert cost.download_bytes == 4 * 10 * d_e
    assert min(cost.cloud_features_s, cost.cloud_clustering_s, cost.client_summary_s, cost.cloud_selection_s) > 0
    random = select("random", CLIENT, CLOUD, 100, SETTINGS, ledger(), "client", seed=4)
    assert (random.indices < 150).mean() < 0.7


def test_the_settings_cap_reaches_the_selection():
    pool = CloudPool(CLOUD, SETTINGS, seed=4)
    size = select("ecos", CLIENT, pool, 100, SETTINGS, ledger(), "client", seed=4)
    share = dataclasses.replace(SETTINGS, cap="pool_share")
    literal = select("ecos", CLIENT, pool, 100, share, ledger(), "client", seed=4)
    np.testing.assert_array_equal(size.summary.scores, literal.summary.scores)  # the same upload
    assert SETTINGS.cap == "cluster_size" and size.indices.size >= 90  # the covered half can give 100
    assert literal.indices.size <= 50  # the vertical stripes are half of the pool


def test_selection_is_deterministic_given_the_seed():
    def run(method: str, seed: int, cloud):
        return select(method, CLIENT, cloud, 40, SETTINGS, ledger(), "client", seed)

    first, second = CloudPool(CLOUD, SETTINGS, seed=5), CloudPool(CLOUD, SETTINGS, seed=5)
    np.testing.assert_array_equal(first.centroids, second.centroids)
    for method in ("ecos", "random", "k_center", "proximity"):
        np.testing.assert_array_equal(run(method, 5, first).indices, run(method, 5, second).indices)
    np.testing.assert_array_equal(run("ecos", 5, first).summary.scores, run("ecos", 5, second).summary.scores)
    assert not np.array_equal(run("random", 5, first).indices, run("random", 6, first).indices)
    assert not np.array_equal(run("ecos", 5, first).summary.scores, run("ecos", 6, first).summary.scores)
    np.testing.assert_array_equal(run("ecos", 5, CLOUD).indices, run("ecos", 5, first).indices)  # images: a fresh pool
    features = first.features
    run("k_center", 5, first)
    assert first.features is features  # computed once per pool


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: select("mak", CLIENT, CLOUD, 5, SETTINGS, ledger(), 0, 0), "unknown selection method 'mak'"),
        (lambda: select("ecos", CLIENT, CLOUD, 301, SETTINGS, ledger(), 0, 0), "B = 301 exceeds the 300"),
        (lambda: select("ecos", CLIENT, CLOUD, 5, SETTINGS, PrivacyLedger("pld"), 0, 0), "accounts with 'pld'"),
        (lambda: select("ecos", CLIENT[0], CLOUD, 5, SETTINGS, ledger(), 0, 0), "client images"),
        (lambda: select("random", CLIENT, CLOUD, 5, SETTINGS, None, 0, 0), "PrivacyLedger"),
        (lambda: select("ecos", CLIENT, CloudPool(CLOUD, ECOSSettings(R=5), 0), 5, SETTINGS, ledger(), 0, 0),
         "another feature extractor or R"),
        (lambda: ECOSSettings(extractor="resnet18"), "unknown feature extractor"),
        (lambda: ECOSSettings(sigma=0.0), "sigma"),
        (lambda: ECOSSettings(cap="pool"), "cap must be one of"),
        (lambda: ECOSSettings(sample_rate=1.5), "sample_rate"),
        (lambda: ECOSSettings(accountant="moments"), "accountant"),
        (lambda: CloudSGD(momentum=1.0), "momentum"),
        (lambda: CloudSGD(lr_schedule="warm"), "lr_schedule"),
    ],
)
def test_pipeline_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def halves(n: int, seed: int) -> ArrayDataset:
    """A separable problem: class 1 lights the left half of the image, class 0 the right half."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = 0.1 * torch.randn(n, 3, SIDE, SIDE, generator=g)
    left = y.bool()
    x[left, :, :, : SIDE // 2] += 1.0
    x[~left, :, :, SIDE // 2 :] += 1.0
    return ArrayDataset(x, y)


def test_cloud_training_fits_a_separable_problem_deterministically():
    sgd = CloudSGD(epochs=10, batch_size=16)
    trained = train_classifier(halves(64, 0), 2, "lenet", {"width": 0.25}, sgd, seed=1)
    assert accuracy(trained.model, trained.params, halves(200, 1), batch_size=64) >= 0.95
    assert trained.seconds > 0 and np.isfinite(trained.loss)
    again = train_classifier(halves(64, 0), 2, "lenet", {"width": 0.25}, sgd, seed=1)
    assert all(torch.equal(trained.params[k], again.params[k]) for k in trained.params)


def test_an_empty_selection_leaves_the_initial_model():
    empty = halves(64, 0).subset(torch.zeros(0, dtype=torch.long))
    trained = train_classifier(empty, 2, "lenet", {"width": 0.25}, CloudSGD(), seed=1)
    assert trained.seconds == 0.0 and np.isnan(trained.loss)
    initial = model_state(trained.model)  # training is functional: the module keeps its initial state
    assert all(torch.equal(trained.params[k], initial[k]) for k in initial)
    with pytest.raises(ValueError, match="non-empty"):
        accuracy(trained.model, trained.params, empty)
