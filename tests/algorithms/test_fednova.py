import pytest
import torch

from fedveil import params as P
from fedveil.algorithms.fednova import step_weight
from harness import assert_params_close, initial_params, make_algorithm, run_rounds, train_directly


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_equal_steps_and_sizes_without_momentum_is_fedavg():
    client = {"batch_size": 2, "lr": 0.1}
    avg = run_rounds(make_algorithm("fedavg", sizes=(4, 4, 4), client=client), 3)
    nova = run_rounds(make_algorithm("fednova", sizes=(4, 4, 4), client=client), 3)
    assert [m["steps"] for _, m in nova.messages[0]] == [2, 2, 2]
    assert_params_close(nova.server["params"], avg.server["params"])


@pytest.mark.parametrize("server_lr", [1.0, 0.5])
def test_unequal_steps_by_hand(server_lr):
    # 1, 2, 4 rows, batch 1, one epoch: tau = 1, 2, 4; p = 1/7, 2/7, 4/7
    client = {"batch_size": 1, "lr": 0.05}
    alg = make_algorithm("fednova", sizes=(1, 2, 4), client=client, server_lr=server_lr)
    run = run_rounds(alg, 1)
    assert [m["steps"] for _, m in run.messages[0]] == [1, 2, 4]
    x = initial_params(alg.ctx.model)
    deltas = [P.sub(train_directly(alg, x, cid, 0), x) for cid in range(3)]
    # tau_eff = (1 + 4 + 16) / 7 = 3;  sum p_i Delta_i / tau_i = (Delta_1 + Delta_2 + Delta_3) / 7
    expected = {k: x[k] + server_lr * 3 / 7 * sum(d[k] for d in deltas) for k in x}
    assert_params_close(run.server["params"], expected)

    fedavg = {k: x[k] + server_lr * (deltas[0][k] + 2 * deltas[1][k] + 4 * deltas[2][k]) / 7 for k in x}
    assert not torch.allclose(run.server["params"]["weight"], fedavg["weight"])


def test_step_weight_closed_form():
    assert step_weight(5, 0.0) == 5
    assert step_weight(1, 0.9) == pytest.approx(1.0)
    assert step_weight(3, 0.5) == pytest.approx(4.25)  # gradients weighted 1.75, 1.5, 1
    for rho in (0.0, 0.3, 0.9):
        for tau in range(1, 8):
            # ||a||_1 accumulated step by step: the k-th gradient counts sum_{j<=tau-k} rho^j
            counter = total = 0.0
            for _ in range(tau):
                counter = rho * counter + 1
                total += counter
            assert step_weight(tau, rho) == pytest.approx(total)


def test_aggregate_with_local_momentum_by_hand():
    alg = make_algorithm("fednova", client={"momentum": 0.5})
    state = {"params": {"w": t(0.0, 0.0)}}
    results = [
        (0, {"delta": {"w": t(1.0, 2.0)}, "num_examples": 1, "steps": 1}),  # a = 1
        (1, {"delta": {"w": t(4.25, -8.5)}, "num_examples": 1, "steps": 3}),  # a = 4.25
    ]
    # tau_eff = (1 + 4.25) / 2 = 2.625;  sum p_i d_i = ([1, 2] + [1, -2]) / 2 = [1, 0]
    new = alg.aggregate(state, results, 0)
    assert_params_close(new["params"], {"w": t(2.625, 0.0)})


def test_empty_cohort():
    alg = make_algorithm("fednova")
    state = {"params": {"w": t(1.0)}}
    assert alg.aggregate(state, [], 0) is state
