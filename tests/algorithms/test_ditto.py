"""Ditto (spec 002 §2.5): FedAvg's global update plus personal models pulled to the round's global model."""
from fedveil import params as P
from fedveil.algorithms import ALGORITHMS
from harness import assert_params_close, full_batch_grad, initial_params, make_algorithm, run_rounds


def test_two_local_trainings_per_round():
    assert ALGORITHMS.get("ditto").trainings_per_round == 2


def test_global_model_is_fedavgs():
    client = {"batch_size": 2, "lr": 0.1}
    ditto = run_rounds(make_algorithm("ditto", lam=0.5, client=client), 3)
    fedavg = run_rounds(make_algorithm("fedavg", client=client), 3)
    assert_params_close(ditto.server["params"], fedavg.server["params"], atol=0.0)


def test_personal_models_by_hand():
    lam, lr = 0.4, 0.1
    alg = make_algorithm("ditto", lam=lam, client={"batch_size": 0, "steps": 1, "lr": lr})
    run = run_rounds(alg, 2)
    data = [c.train for c in alg.ctx.data.clients]
    sizes = [len(d) for d in data]
    w0 = initial_params(alg.ctx.model)
    local1 = [P.add(w0, full_batch_grad(w0, d), -lr) for d in data]  # v starts at w0 = w_bar0: no pull
    bar1 = P.weighted_mean(local1, sizes)
    for cid, d in enumerate(data):
        v1 = local1[cid]
        v2 = P.add(v1, P.add(full_batch_grad(v1, d), P.sub(v1, bar1), lam), -lr)
        assert_params_close(run.clients[cid]["personal"], v2)
