"""pFedMe (Dinh et al. 2020; spec 001 §4): per batch, K steps on the personal problem
f(theta) + lambda/2 ||theta - w_i||^2, then w_i <- w_i - eta lambda (w_i - theta); server
w <- (1 - beta) w + beta mean(w_i); theta is the client's personal model."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedveil import params as P
from fedveil.errors import ConfigError
from fedveil.runtime import run
from fedveil.runtime.simulation import Simulation
from fedveil.seeding import torch_generator
from harness import (
    DTYPE, SEED, assert_params_close, full_batch_grad, initial_params, make_algorithm, make_task, run_rounds,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from tiny_runs import rows_of, tiny_config  # noqa: E402

torch.set_num_threads(1)


def test_one_client_by_hand():
    """Two local steps on batches of 2, K = 3 inner steps each, by hand with autograd's
    full-batch gradients on the same batches the trainer draws."""
    lam, plr, lr, K = 2.0, 0.1, 0.05, 3
    alg = make_algorithm("pfedme", lam=lam, inner_steps=K, personal_lr=plr, client={"batch_size": 2, "steps": 2, "lr": lr})
    w0 = initial_params(alg.ctx.model)
    server = alg.init_server(w0)
    cid = 2  # 4 rows: two different batches
    data = alg.ctx.data.clients[cid].train
    batches = list(alg.ctx.trainer.batch_indices(len(data), torch_generator(SEED, "train", 0, cid)))
    assert len(batches) == 2 and len(batches[0]) == 2
    theta, w = dict(w0), dict(w0)
    for idx in batches:
        d = data.subset(idx)
        for _ in range(K):
            theta = P.add(theta, P.add(full_batch_grad(theta, d), P.sub(theta, w), lam), -plr)
        w = P.add(w, P.sub(w, theta), -lr * lam)
    result = alg.client_update(server, None, make_task(alg, cid, 0))
    assert_params_close(result.state["personal"], theta)
    assert_params_close(result.message["delta"], P.sub(w, w0))
    assert result.stats.steps == 2 * K and result.stats.examples == 2 * K * 2
    assert_params_close(alg.personal_params(server, result.state, make_task(alg, cid, 0)), theta)
    assert alg.personal_params(server, None, make_task(alg, cid, 0)) is server["params"]


def test_a_solved_inner_problem_is_the_proximal_point():
    """Many inner steps solve the personal problem: theta = (H + lam I)^-1 (b + lam w), the
    minimiser of the batch's mean squared error (H = 2/n A^T A, b = 2/n A^T y, A = [x, 1])
    plus lam/2 ||theta - w||^2; then w1 = w0 - eta lam (w0 - theta)."""
    lam, lr = 2.0, 0.1
    alg = make_algorithm("pfedme", lam=lam, inner_steps=400, personal_lr=0.05, client={"batch_size": 0, "steps": 1, "lr": lr})
    w0 = initial_params(alg.ctx.model)
    cid = 1
    data = alg.ctx.data.clients[cid].train
    a = torch.cat([data.x, torch.ones(len(data), 1, dtype=DTYPE)], 1)
    h, b = 2 / len(data) * a.T @ a, 2 / len(data) * a.T @ data.y
    w_flat = torch.cat([w0["weight"].reshape(-1), w0["bias"]])
    solved = torch.linalg.solve(h + lam * torch.eye(4, dtype=DTYPE), b + lam * w_flat)
    theta = {"weight": solved[:3].reshape(1, 3), "bias": solved[3:]}
    result = alg.client_update(alg.init_server(w0), None, make_task(alg, cid, 0))
    assert_params_close(result.state["personal"], theta, atol=1e-10)
    assert_params_close(result.message["delta"], P.scale(P.sub(theta, w0), lr * lam), atol=1e-10)


def test_one_inner_step_from_the_global_model_is_fedavg():
    """K = 1, one full-batch step: theta = w - plr g(w) (no pull at theta = w), so
    w_i = w - eta lam plr g(w): FedAvg with learning rate eta lam plr, and beta = 1
    averages like FedAvg (sample weights)."""
    lam, plr, lr = 3.0, 0.2, 0.1
    pfedme = run_rounds(make_algorithm("pfedme", lam=lam, inner_steps=1, personal_lr=plr,
                                       client={"batch_size": 0, "steps": 1, "lr": lr}), 1)
    fedavg = run_rounds(make_algorithm("fedavg", client={"batch_size": 0, "steps": 1, "lr": lr * lam * plr}), 1)
    assert_params_close(pfedme.server["params"], fedavg.server["params"])
    w0 = initial_params(make_algorithm("pfedme").ctx.model)
    data = make_algorithm("pfedme").ctx.data.clients
    for cid, state in pfedme.clients.items():
        assert_params_close(state["personal"], P.add(w0, full_batch_grad(w0, data[cid].train), -plr))


@pytest.mark.parametrize("beta, weighting", [(1.0, "samples"), (0.5, "samples"), (2.0, "uniform")])
def test_server_mixes_the_mean_of_local_models(beta, weighting):
    alg = make_algorithm("pfedme", beta=beta, weighting=weighting)
    w = {"weight": torch.tensor([[1.0, 2.0, 3.0]], dtype=DTYPE), "bias": torch.tensor([0.5], dtype=DTYPE)}
    locals_ = [P.scale(w, 2.0), P.add(w, {"weight": torch.ones(1, 3, dtype=DTYPE), "bias": -torch.ones(1, dtype=DTYPE)})]
    messages = [(c, {"delta": P.sub(v, w), "num_examples": n}) for c, (v, n) in enumerate(zip(locals_, (1, 3)))]
    new = alg.aggregate({"params": w}, messages, 0)["params"]
    mean = P.weighted_mean(locals_, (1, 3) if weighting == "samples" else (1, 1))
    expected = P.add(P.scale(w, 1 - beta), P.scale(mean, beta))  # (1 - beta) w + beta mean(w_i)
    assert_params_close(new, expected)
    if beta == 1.0:  # the plain mean: weight (2 + 3*2, 4 + 3*3, 6 + 3*4) / 4, bias (1 - 3*0.5) / 4
        assert_params_close(new, {"weight": torch.tensor([[2.0, 3.25, 4.5]], dtype=DTYPE), "bias": torch.tensor([-0.125], dtype=DTYPE)})
    assert alg.aggregate({"params": w}, [], 0)["params"] is w


def test_example_level_dp_is_refused():
    config = tiny_config(algorithm={"name": "pfedme"}, privacy={"level": "example", "epsilon": 4.0, "clip": 0.5})
    with pytest.raises(ConfigError, match="PFedMe does not support example-level DP"):
        Simulation.from_config(config)


def test_an_overshooting_outer_step_is_refused():
    with pytest.raises(ConfigError, match="client.lr \\* algorithm.lam = 7.5 >= 2"):
        make_algorithm("pfedme", lam=15.0, client={"lr": 0.5})


def test_serial_and_vectorized_agree(tmp_path):
    states = {}
    for executor in ("serial", "vectorized"):
        config = tiny_config(
            algorithm={"name": "pfedme", "inner_steps": 2, "personal_lr": 0.05, "lam": 5.0}, executor=executor,
            client={"batch_size": 64, "lr": 0.1}, federation={"rounds": 2, "clients_per_round": 3}, checkpoint={"every": 0},
        )
        run(config, tmp_path / executor, progress=False)
        states[executor] = torch.load(tmp_path / executor / "checkpoint.pt", weights_only=True)
    serial, vectorized = states["serial"], states["vectorized"]
    for name, value in serial["server"]["params"].items():
        torch.testing.assert_close(vectorized["server"]["params"][name], value, rtol=1e-6, atol=1e-7, msg=name)
    assert serial["clients"].keys() == vectorized["clients"].keys() and serial["clients"]
    for cid, state in serial["clients"].items():
        for name, value in state["personal"].items():
            torch.testing.assert_close(vectorized["clients"][cid]["personal"][name], value, rtol=1e-6, atol=1e-7)
    last = rows_of(tmp_path / "serial")[-1]
    assert 0.0 <= last["personal_accuracy_mean"] <= 1.0  # theta_i scored as the personal models


def test_batchnorm_statistics_follow_the_personal_model(tmp_path):
    """w_i takes theta_i's running statistics, and the server averages them without beta: with
    a one-client cohort the server's statistics are that client's personal ones."""
    config = tiny_config(
        model={"name": "resnet", "options": {"depth": 1, "width": 0.25, "norm": "batch"}},
        algorithm={"name": "pfedme", "inner_steps": 2, "beta": 0.5}, client={"batch_size": 64},
        federation={"rounds": 1, "clients_per_round": 1}, checkpoint={"every": 0},
    )
    run(config, tmp_path / "bn", progress=False)
    checkpoint = torch.load(tmp_path / "bn" / "checkpoint.pt", weights_only=True)
    server, (personal,) = checkpoint["server"]["params"], [s["personal"] for s in checkpoint["clients"].values()]
    buffers = [k for k in server if k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert buffers
    for k in buffers:
        torch.testing.assert_close(server[k], personal[k], rtol=1e-6, atol=1e-7, msg=k)
    assert int(server["stem_norm.num_batches_tracked"]) > 0 and server["stem_norm.num_batches_tracked"].dtype == torch.int64
