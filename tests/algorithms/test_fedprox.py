import pytest
from pydantic import ValidationError

from fedveil import params as P
from harness import (
    assert_params_close,
    assert_params_equal,
    full_batch_grad,
    initial_params,
    make_algorithm,
    make_task,
    run_rounds,
)


def test_default_and_validation():
    assert make_algorithm("fedprox").hp.mu == 0.01
    with pytest.raises(ValidationError):
        make_algorithm("fedprox", mu=-0.1)


def test_mu_zero_is_exactly_fedavg():
    client = {"batch_size": 2, "epochs": 2, "lr": 0.1, "momentum": 0.5}
    avg = run_rounds(make_algorithm("fedavg", sizes=(3, 4, 5), client=client), 3)
    prox = run_rounds(make_algorithm("fedprox", sizes=(3, 4, 5), client=client, mu=0.0), 3)
    assert_params_equal(prox.server["params"], avg.server["params"])


def local_delta_norm(mu):
    alg = make_algorithm("fedprox", client={"batch_size": 1, "steps": 10, "lr": 0.1}, mu=mu)
    start = initial_params(alg.ctx.model)
    result = alg.client_update({"params": start}, None, make_task(alg, 2, 0))
    return float(P.global_norm(result.message["delta"]))


def test_proximal_term_keeps_the_local_model_closer_to_the_global_one():
    free, held = local_delta_norm(0.0), local_delta_norm(2.0)
    assert 0 < held < free


def test_two_full_batch_steps_by_hand():
    lr, mu = 0.1, 0.5
    alg = make_algorithm("fedprox", client={"batch_size": 0, "steps": 2, "lr": lr}, mu=mu)
    data = alg.ctx.data.clients[1].train
    w0 = initial_params(alg.ctx.model)
    # step 1: w1 = w0, so the proximal term is zero
    w1 = {k: w0[k] - lr * g for k, g in full_batch_grad(w0, data).items()}
    # step 2: w2 = w1 - lr * (grad(w1) + mu (w1 - w0))
    w2 = {k: w1[k] - lr * (g + mu * (w1[k] - w0[k])) for k, g in full_batch_grad(w1, data).items()}

    result = alg.client_update({"params": w0}, None, make_task(alg, 1, 0))
    assert_params_close(P.add(w0, result.message["delta"]), w2)
