import pytest
import torch
from pydantic import ValidationError
from torch import nn
import torch.nn.functional as F

from fedveil import params as P
from harness import (
    assert_params_close,
    initial_params,
    make_algorithm,
    make_task,
    run_rounds,
    train_directly,
)


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def message(dw, db, n):
    return {"delta": {"w": t(*dw), "b": t(db)}, "num_examples": n, "steps": 1}


SERVER = {"params": {"w": t(1.0, 2.0), "b": t(0.5)}}
# client 0: 1 example, client 1: 3 examples
RESULTS = [(0, message([2.0, 0.0], 1.0, 1)), (1, message([-2.0, 4.0], -1.0, 3))]


def test_sample_weighted_mean_of_deltas():
    # (1*[2, 0] + 3*[-2, 4]) / 4 = [-1, 3];  (1*1 + 3*(-1)) / 4 = -0.5
    new = make_algorithm("fedavg").aggregate(SERVER, RESULTS, 0)
    assert_params_close(new["params"], {"w": t(0.0, 5.0), "b": t(0.0)})


def test_uniform_weighting():
    # ([2, 0] + [-2, 4]) / 2 = [0, 2];  (1 - 1) / 2 = 0
    new = make_algorithm("fedavg", weighting="uniform").aggregate(SERVER, RESULTS, 0)
    assert_params_close(new["params"], {"w": t(1.0, 4.0), "b": t(0.5)})


def test_server_lr_scales_the_step():
    new = make_algorithm("fedavg", server_lr=0.5).aggregate(SERVER, RESULTS, 0)
    assert_params_close(new["params"], {"w": t(0.5, 3.5), "b": t(0.25)})


def test_empty_cohort_leaves_the_model_unchanged():
    assert make_algorithm("fedavg").aggregate(SERVER, [], 0) is SERVER


def test_bad_params_are_rejected():
    cls = make_algorithm("fedavg").Params
    with pytest.raises(ValidationError):
        cls(server_lr=0.0)
    with pytest.raises(ValidationError):
        cls(weighting="median")


def test_client_message_is_the_local_sgd_delta():
    alg = make_algorithm("fedavg", client={"batch_size": 2})
    start = initial_params(alg.ctx.model)
    for cid, steps in [(0, 1), (1, 2), (2, 2)]:  # 2, 3, 4 rows in batches of 2
        result = alg.client_update({"params": start}, None, make_task(alg, cid, 0))
        assert result.message["num_examples"] == [2, 3, 4][cid]
        assert result.message["steps"] == result.stats.steps == steps
        assert_params_close(result.message["delta"], P.sub(train_directly(alg, start, cid, 0), start))


def test_one_round_is_the_weighted_mean_of_local_models():
    alg = make_algorithm("fedavg", client={"batch_size": 1, "lr": 0.1})
    x = initial_params(alg.ctx.model)
    local = [train_directly(alg, x, cid, 0) for cid in range(3)]
    expected = {k: (2 * local[0][k] + 3 * local[1][k] + 4 * local[2][k]) / 9 for k in x}
    assert_params_close(run_rounds(alg, 1).server["params"], expected)


def test_one_client_full_batch_is_centralised_gradient_descent():
    rounds, lr = 5, 0.1
    alg = make_algorithm("fedavg", sizes=(6,), rounds=rounds, client={"batch_size": 0, "steps": 1, "lr": lr})
    data = alg.ctx.data.clients[0].train

    model = nn.Linear(3, 1).to(torch.float64)
    model.load_state_dict(alg.ctx.model.state_dict())
    for _ in range(rounds):
        model.zero_grad()
        F.mse_loss(model(data.x).reshape(-1), data.y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad

    expected = {k: v.detach() for k, v in model.named_parameters()}
    assert_params_close(run_rounds(alg, rounds).server["params"], expected)
