import pytest
from pydantic import ValidationError

from fedveil import params as P
from harness import (
    assert_params_close,
    assert_params_equal,
    full_batch_grad,
    initial_params,
    make_algorithm,
    run_rounds,
    train_directly,
)

SIZES = (2, 3, 5)
STEPS = (1, 2, 3)  # batches of 2


def test_params():
    assert make_algorithm("scaffold").hp.server_lr == 1.0
    with pytest.raises(ValidationError):
        make_algorithm("scaffold", server_lr=0.0)
    with pytest.raises(ValidationError):  # the paper's uniform averaging is not optional
        make_algorithm("scaffold", weighting="samples")


def test_first_round_is_uniform_fedavg():
    client = {"batch_size": 2, "lr": 0.1}
    avg = run_rounds(make_algorithm("fedavg", sizes=SIZES, client=client, weighting="uniform"), 1)
    scaffold = run_rounds(make_algorithm("scaffold", sizes=SIZES, client=client), 1)
    assert_params_equal(scaffold.server["params"], avg.server["params"])


def test_control_variates_after_the_first_round():
    lr = 0.1
    alg = make_algorithm("scaffold", sizes=SIZES, client={"batch_size": 2, "lr": lr})
    run = run_rounds(alg, 1, cohorts=[[0, 2]])
    x = initial_params(alg.ctx.model)
    expected = {}
    for cid in (0, 2):  # option II: c_i = c_i - c + (x - y_i) / (K eta_l), with c = c_i = 0
        y = train_directly(alg, x, cid, 0)
        expected[cid] = P.scale(P.sub(x, y), 1.0 / (STEPS[cid] * lr))
        assert run.messages[0][[0, 2].index(cid)][1]["steps"] == STEPS[cid]
        assert_params_close(run.clients[cid]["control"], expected[cid])
    assert_params_equal(run.clients[1]["control"], P.zeros_like(x))  # not sampled
    # c = 0 + |S|/N * mean(delta c_i) = 2/3 * (c_0 + c_2) / 2
    assert_params_close(run.server["control"], P.scale(P.add(expected[0], expected[2]), 1.0 / 3))


def test_second_round_by_hand():
    """Corrected local steps, lr of the round (exponential schedule), server x and c."""
    K, lr0, decay, eta_g = 2, 0.1, 0.5, 0.8
    client = {"batch_size": 0, "steps": K, "lr": lr0, "lr_schedule": "exponential", "lr_decay": decay}
    alg = make_algorithm("scaffold", sizes=SIZES, client=client, server_lr=eta_g)
    before = run_rounds(alg, 1)
    after = run_rounds(alg, 2)

    x, c, lr = before.server["params"], before.server["control"], lr0 * decay
    dy, dc = [], []
    for cid in range(3):
        c_i, data = before.clients[cid]["control"], alg.ctx.data.clients[cid].train
        y = x
        for _ in range(K):
            g = full_batch_grad(y, data)
            y = {k: y[k] - lr * (g[k] - c_i[k] + c[k]) for k in y}
        new_c_i = {k: c_i[k] - c[k] + (x[k] - y[k]) / (K * lr) for k in y}
        assert_params_close(after.clients[cid]["control"], new_c_i)
        dy.append(P.sub(y, x))
        dc.append(P.sub(new_c_i, c_i))
    assert_params_close(after.server["params"], {k: x[k] + eta_g * sum(d[k] for d in dy) / 3 for k in x})
    assert_params_close(after.server["control"], {k: c[k] + sum(d[k] for d in dc) / 3 for k in x})  # |S|/N = 1


def test_identical_clients_with_full_participation_is_fedavg():
    client = {"batch_size": 0, "steps": 3, "lr": 0.1}
    avg = run_rounds(make_algorithm("fedavg", sizes=(4, 4, 4), identical=True, client=client), 4)
    scaffold = run_rounds(make_algorithm("scaffold", sizes=(4, 4, 4), identical=True, client=client), 4)
    assert float(P.global_norm(scaffold.server["control"])) > 0  # the variates are in play, but cancel
    assert_params_close(scaffold.server["params"], avg.server["params"])
