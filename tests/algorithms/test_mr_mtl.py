"""MR-MTL (spec 002 §2.7): hand-computed rounds, its endpoints, and the closed-form fixed point."""
import numpy as np
import pytest
import torch

from fedveil import params as P
from harness import (
    assert_params_close, assert_params_equal, full_batch_grad, initial_params, make_algorithm, make_task, run_rounds,
)

FULL_BATCH_ONE_STEP = {"batch_size": 0, "steps": 1, "lr": 0.1}


def test_lambda_zero_is_local_training_bit_for_bit():
    mrmtl = run_rounds(make_algorithm("mr_mtl", lam=0.0, client={"batch_size": 1, "lr": 0.1}), 3)
    local = run_rounds(make_algorithm("local", client={"batch_size": 1, "lr": 0.1}), 3)
    for cid in range(3):
        assert_params_equal(mrmtl.clients[cid]["params"], local.clients[cid]["params"])


def test_two_rounds_by_hand():
    lam, lr = 0.7, 0.1
    alg = make_algorithm("mr_mtl", lam=lam, client=FULL_BATCH_ONE_STEP)
    run = run_rounds(alg, 2)
    data = [c.train for c in alg.ctx.data.clients]
    sizes = [len(d) for d in data]
    w0 = initial_params(alg.ctx.model)
    # round 1: w_k = w_bar = w0, so the regulariser is zero
    w1 = [P.add(w0, full_batch_grad(w0, d), -lr) for d in data]
    bar1 = P.weighted_mean(w1, sizes)
    # round 2: w_k <- w_k - lr (grad F_k(w_k) + lam (w_k - w_bar1))
    w2 = [P.add(w, P.add(full_batch_grad(w, d), P.sub(w, bar1), lam), -lr) for w, d in zip(w1, data)]
    for cid in range(3):
        assert_params_close(run.clients[cid]["params"], w2[cid])
    assert_params_close(run.server["params"], P.weighted_mean(w2, sizes))


def test_peer_mean_equals_the_server_recursion():
    server = run_rounds(make_algorithm("mr_mtl", lam=0.3, client={"batch_size": 2, "lr": 0.1}), 4)
    peer = run_rounds(make_algorithm("mr_mtl", lam=0.3, aggregator="peer", client={"batch_size": 2, "lr": 0.1}), 4)
    assert_params_close(server.server["params"], peer.server["params"], atol=1e-12)
    assert "params" in peer.messages[0][0][1] and "delta" in server.messages[0][0][1]


def _fixed_point(alg, lam: float) -> list[np.ndarray]:
    """Solve (A_k + lam I) w_k - lam sum_j p_j w_j = b_k for mean-squared-error silos (bias as a column)."""
    blocks = []
    for client in alg.ctx.data.clients:
        x = np.c_[client.train.x.numpy(), np.ones(len(client.train))]
        y = client.train.y.numpy()
        blocks.append((2 * x.T @ x / len(y), 2 * x.T @ y / len(y), len(y)))
    k, d = len(blocks), blocks[0][0].shape[0]
    p = np.array([n for _, _, n in blocks], dtype=float)
    p /= p.sum()
    system, rhs = np.zeros((k * d, k * d)), np.zeros(k * d)
    for i, (a, b, _) in enumerate(blocks):
        system[i * d:(i + 1) * d, i * d:(i + 1) * d] += a + lam * np.eye(d)
        for j in range(k):
            system[i * d:(i + 1) * d, j * d:(j + 1) * d] -= lam * p[j] * np.eye(d)
        rhs[i * d:(i + 1) * d] = b
    return np.split(np.linalg.solve(system, rhs), k)


def _flat(params) -> np.ndarray:
    return np.r_[params["weight"].reshape(-1).numpy(), params["bias"].numpy()]


@pytest.mark.parametrize("lam", [0.5, 20.0])
def test_converges_to_the_closed_form_fixed_point(lam):
    alg = make_algorithm("mr_mtl", lam=lam, sizes=(12, 20, 30), rounds=600, client={"batch_size": 0, "steps": 1, "lr": 0.04})
    run = run_rounds(alg, 600)
    for cid, want in enumerate(_fixed_point(alg, lam)):
        np.testing.assert_allclose(_flat(run.clients[cid]["params"]), want, atol=1e-6)


def test_large_lambda_tends_to_the_fedavg_consensus_model():
    """lambda -> inf: every personal model -> the minimiser of sum_k p_k F_k, which FedAvg
    with one full-batch step per round converges to."""
    alg = make_algorithm("fedavg", sizes=(12, 20, 30), rounds=600, client={"batch_size": 0, "steps": 1, "lr": 0.04})
    fedavg = _flat(run_rounds(alg, 600).server["params"])
    gaps = [max(np.abs(w - fedavg).max() for w in _fixed_point(alg, lam)) for lam in (1.0, 100.0, 1e4)]
    assert gaps[0] > 1e-2 and gaps[1] < gaps[0] / 20 and gaps[2] < gaps[1] / 50 and gaps[2] < 1e-5


def test_unsampled_silo_evaluates_the_common_initial_model():
    alg = make_algorithm("mr_mtl", lam=0.1)
    run = run_rounds(alg, 1, cohorts=[[0, 1]])
    assert_params_equal(alg.personal_params(run.server, None, make_task(alg, 2, 1)), run.server["params"])
    assert torch.equal(run.clients[2]["params"]["weight"], initial_params(alg.ctx.model)["weight"])


def test_partial_cohorts_keep_the_mean_of_the_personal_models_exact():
    """Cohorts of 2 of 3 silos, a silo's state made at its first round from the current mean
    (as the simulation does): after every round w_bar is the size-weighted mean of the
    personal models of the silos seen so far, computed by hand."""
    alg = make_algorithm("mr_mtl", lam=0.5, client={"batch_size": 2, "lr": 0.1})
    sizes = [len(c.train) for c in alg.ctx.data.clients]
    server, clients = alg.init_server(initial_params(alg.ctx.model)), {}
    for r, cohort in enumerate([[0, 1], [1, 2], [0, 2], [2, 1]]):
        results = []
        for cid in cohort:
            state = clients.get(cid) or alg.init_client(cid, server)
            result = alg.client_update(server, state, make_task(alg, cid, r))
            clients[cid] = result.state
            results.append((cid, result.message))
        server = alg.aggregate(server, results, r)
        seen = sorted(clients)
        by_hand = P.weighted_mean([clients[c]["params"] for c in seen], [sizes[c] for c in seen])
        assert_params_close(server["params"], by_hand, atol=1e-12)
    assert sizes[0] != sizes[1] or sizes[1] != sizes[2]  # the weighting is exercised


def test_peer_aggregation_refuses_a_partial_cohort_before_training():
    from fedveil.errors import ConfigError

    alg = make_algorithm("mr_mtl", aggregator="peer")
    server = alg.init_server(initial_params(alg.ctx.model))
    assert alg.configure_round(server, [0, 1, 2], 0) is server
    with pytest.raises(ConfigError, match="aggregator = 'peer' needs every silo in every round .* 2 of 3"):
        alg.configure_round(server, [0, 2], 0)
