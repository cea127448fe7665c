"""IFCA with private selection (spec 002 §1.4, §2.8)."""
import math

import numpy as np
import pytest
import torch

from fedveil import params as P
from fedveil.privacy.dp_sgd import ExampleDP
from fedveil.seeding import torch_generator
from harness import assert_params_close, make_algorithm, make_task, run_rounds


def _with_centroids(alg, centroids):
    server = alg.init_server(alg.ctx.model.state_dict())
    return {**server, "centroids": dict(enumerate(centroids))}


def _least_squares(alg):
    x = torch.cat([c.train.x for c in alg.ctx.data.clients])
    y = torch.cat([c.train.y for c in alg.ctx.data.clients])
    sol = torch.linalg.lstsq(torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1), y.unsqueeze(1)).solution
    return {"weight": sol[:-1].T.clone(), "bias": sol[-1].clone()}


def test_non_private_selection_picks_the_lowest_clipped_loss():
    alg = make_algorithm("ifca", clusters=2, sizes=(6, 8, 10))
    good = _least_squares(alg)
    far = P.add(good, good, 30.0)
    server = _with_centroids(alg, [far, good])
    task = make_task(alg, 0, 0)
    scores = alg.scores(server["centroids"], task)
    assert float(scores[0]) == pytest.approx(alg.hp.loss_clip)  # clipped
    assert float(scores[1]) < alg.hp.loss_clip
    assert alg.choose(server["centroids"], task) == (1, [])


def test_private_selection_is_the_exponential_mechanism():
    """argmin(s - Gumbel(b)) picks g with probability softmax(-s / b), b = 2 Delta / eps_sel."""
    alg = make_algorithm("ifca", clusters=3, sizes=(11, 8, 10))
    scores = torch.tensor([0.2, 0.5, 0.9])
    alg.scores = lambda centroids, task: scores
    budget = 2.0
    eps_sel = alg.hp.selection_budget_fraction * budget
    b = 2 * (1 / (11 - 1)) / eps_sel  # regression on client 0 would use loss_clip / n; force classification's Delta
    alg.sensitivity = lambda n: 1 / (n - 1)
    trials, counts = 4000, np.zeros(3)
    for t in range(trials):
        task = make_task(alg, 0, 0)
        task.generator = torch_generator(123, "pick", t)
        task.dp, task.privacy_budget = ExampleDP(1.0, 1.0, "poisson", 4), budget
        choice, releases = alg.choose({g: {} for g in range(3)}, task)
        counts[choice] += 1
        assert releases[0].event.rho == pytest.approx(eps_sel**2 / 8)
    want = np.exp(-scores.numpy() / b) / np.exp(-scores.numpy() / b).sum()
    assert np.all(np.abs(counts / trials - want) < 4 * np.sqrt(want * (1 - want) / trials))


def test_centroids_move_by_their_members_weighted_updates():
    alg = make_algorithm("ifca", clusters=2)
    server = _with_centroids(alg, [{"w": torch.zeros(2)}, {"w": torch.ones(2)}])
    results = [
        (0, {"delta": {"w": torch.tensor([1.0, 0.0])}, "cluster": 0, "weight": 1.0}),
        (1, {"delta": {"w": torch.tensor([0.0, 4.0])}, "cluster": 0, "weight": 3.0}),
    ]
    out = alg.aggregate(server, results, 0)
    assert torch.equal(out["centroids"][0]["w"], torch.tensor([0.25, 3.0]))
    assert torch.equal(out["centroids"][1]["w"], torch.ones(2))  # no members: unchanged


def test_phases_select_then_freeze_then_regularise_towards_the_cluster():
    rounds = 10
    alg = make_algorithm("ifca", clusters=2, select_fraction=0.2, fedavg_fraction=0.5, lam=0.5, rounds=rounds,
                         client={"batch_size": 2, "lr": 0.05})
    assert (alg.selection_rounds, alg.fedavg_rounds) == (2, 5)
    calls = []
    original = alg.choose
    alg.choose = lambda centroids, task: calls.append(task.round) or original(centroids, task)
    run = run_rounds(alg, rounds)
    assert sorted(set(calls)) == [0, 1] and len(calls) == 2 * 3
    for cid in range(3):  # personal models after the cluster-FedAvg phase
        state = run.clients[cid]
        personal = alg.personal_params(run.server, state, make_task(alg, cid, rounds))
        assert_params_close(personal, state["params"], atol=0.0)
    assert math.isclose(sum(1 for _ in run.server["centroids"]), 2)


def test_planned_selections_count_the_selection_rounds_taken_part_in():
    alg = make_algorithm("ifca", clusters=2, select_fraction=0.3, rounds=10)
    planned = alg.planned_releases(0, 20, 3.0, [0, 2, 5, 7])  # selection rounds: 0, 1, 2
    assert sorted(planned) == [0, 2]
    for (release,) in planned.values():
        assert release.count == 1 and release.event.rho == pytest.approx((0.03 * 3.0) ** 2 / 8)
    late = alg.planned_releases(1, 20, 3.0, [6, 9])  # first seen after the selection phase: one choice
    assert sorted(late) == [6] and late[6][0].count == 1
