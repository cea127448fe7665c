"""The School reproduction's study loop and report on a tiny School-format file."""
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.io

from fedveil.reproduce import ReproductionContext
from fedveil_reproductions.mrmtl_school import report, school_task
from fedveil_reproductions.silo_study import SiloStudy, run_grid


def tiny_school(root: Path, schools: int = 4) -> None:
    rng = np.random.default_rng(0)
    xs, ys = np.empty((1, schools), dtype=object), np.empty((1, schools), dtype=object)
    for k in range(schools):
        n = 30 + 5 * k
        x = np.c_[rng.integers(0, 2, (n, 25)), rng.integers(8, 92, (n, 1)), rng.integers(3, 44, (n, 1)), np.ones((n, 1))]
        xs[0, k] = x.astype(float)
        ys[0, k] = np.clip(1 + 20 * x[:, :3].sum(1, keepdims=True) + rng.normal(0, 3, (n, 1)), 1, 70)
    (root / "school").mkdir(parents=True)
    scipy.io.savemat(root / "school" / "school.mat", {"X": xs, "Y": ys})


def test_study_runs_every_method_and_reports_the_claims(tmp_path):
    tiny_school(tmp_path / "data")
    ctx = ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=tmp_path / "data")
    study = SiloStudy(epsilons=[2.0, math.inf], lambdas=[0.3, 3.0], rounds=2, lr=0.03)
    task = school_task(ctx, num_silos=4)
    results = run_grid(ctx.runs_dir, study, task)
    assert set(results) == {"local", "fedavg", "finetune", "ditto(lam=1)", "mr_mtl(lam=0.3)", "mr_mtl(lam=3)"}
    for by_eps in results.values():
        assert set(by_eps) == {"2", "inf"}
        assert all(0 < v[0] < 1 for v in by_eps.values())  # normalised scores: MSE below 1
    again = run_grid(ctx.runs_dir, study, task)  # finished runs are re-scored, not retrained
    assert again == results
    rep = report(results, study, task, quick=True)
    claims = [r for r in rep.rows if r.metric.startswith("MR-MTL(best lambda)")]
    assert [r.setting for r in claims] == ["eps=2", "eps=inf"]
    for row, eps in zip(claims, ("2", "inf")):  # the verdict, worked out again from the scores
        mean = {m: sum(v[eps]) / len(v[eps]) for m, v in results.items()}
        best = min(mean[f"mr_mtl(lam={lam:g})"] for lam in (0.3, 3.0))
        expected = best < mean["local"] and best < mean["fedavg"]
        assert row.verdict == ("holds" if expected else "does not hold")
    sweep = [r for r in rep.rows if r.setting == "lambda sweep"]
    assert sweep == []  # one private epsilon: no sweep to compare
    scores = [r for r in rep.rows if r.metric.endswith(": test MSE")]
    assert len(scores) == 12 and {r.paper for r in scores} == {"curve only"}  # README numbers: epsilon 6 only


def tiny_school_few_features(root: Path, sizes=(30, 34, 38, 40)) -> None:
    """Schools whose only non-constant columns are the two integer ones: with at most 32
    training rows a silo's local epoch is one full batch, so training is plain gradient descent
    on a well-determined least-squares problem."""
    rng = np.random.default_rng(1)
    xs, ys = np.empty((1, len(sizes)), dtype=object), np.empty((1, len(sizes)), dtype=object)
    for k, n in enumerate(sizes):
        x = np.zeros((n, 28))
        x[:, 3], x[:, 4], x[:, 27] = rng.integers(8, 92, n), rng.integers(3, 44, n), 1.0
        xs[0, k] = x
        ys[0, k] = np.clip(10 + 0.3 * x[:, 3:4] + (k - 1.5) * 0.4 * x[:, 4:5] + rng.normal(0, 2, (n, 1)), 1, 70)
    (root / "school").mkdir(parents=True)
    scipy.io.savemat(root / "school" / "school.mat", {"X": xs, "Y": ys})


def least_squares_mse(ctx, num_silos: int, pooled: bool) -> float:
    """Test MSE (weighted by test rows) of least squares on each silo's standardised rows
    (pooled: one fit over all silos), worked out with numpy from the raw rows."""
    from fedveil.config import validate
    from fedveil.runtime.dataset import build_dataset

    config = school_task(ctx, num_silos=num_silos).config({"name": "local"}, math.inf, 0, SiloStudy([math.inf], []))
    config["data"]["standardize"] = "none"  # the same split, raw rows
    raw = build_dataset(validate(config).data, 0)

    def standardised(client):
        x_train, x_test = client.train.x.double().numpy(), client.test.x.double().numpy()
        mean, std = x_train.mean(0), x_train.std(0)
        std[std == 0] = 1.0
        design = lambda x: np.c_[(x - mean) / std, np.ones(len(x))]  # noqa: E731
        return design(x_train), client.train.y.double().numpy(), design(x_test), client.test.y.double().numpy()

    silos = [standardised(c) for c in raw.clients]
    if pooled:
        w = np.linalg.lstsq(np.vstack([s[0] for s in silos]), np.concatenate([s[1] for s in silos]), rcond=None)[0]
        fits = [w] * len(silos)
    else:
        fits = [np.linalg.lstsq(s[0], s[1], rcond=None)[0] for s in silos]
    errors = np.concatenate([(s[2] @ w - s[3]) ** 2 for s, w in zip(silos, fits)])
    return float(errors.mean())


def test_without_dp_local_and_fedavg_converge_to_least_squares_on_per_silo_standardised_rows(tmp_path):
    """The School preprocessing ([C1]'s per-silo StandardScaler) and training, checked against
    numpy: non-private Local is every silo's own least-squares fit, non-private FedAvg with one
    full-batch step per round is gradient descent on the pooled loss, i.e. the pooled fit."""
    tiny_school_few_features(tmp_path / "data")
    ctx = ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=tmp_path / "data")
    study = SiloStudy(epsilons=[math.inf], lambdas=[], rounds=150, lr=0.5, baselines=["local", "fedavg"])
    results = run_grid(ctx.runs_dir, study, school_task(ctx, num_silos=4))
    local, fedavg = results["local"]["inf"][0], results["fedavg"]["inf"][0]
    assert local == pytest.approx(least_squares_mse(ctx, 4, pooled=False), rel=1e-3)
    assert fedavg == pytest.approx(least_squares_mse(ctx, 4, pooled=True), rel=1e-3)
    assert fedavg != pytest.approx(local, rel=1e-2)  # the two fits differ: the check tells them apart
