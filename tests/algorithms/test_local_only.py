from fedveil.algorithms import ALGORITHMS
from harness import assert_params_equal, initial_params, make_algorithm, make_task, run_rounds, train_directly


def test_flags():
    local = ALGORITHMS.get("local")
    assert local.has_personal_models and not local.has_global_model
    assert ALGORITHMS.get("fedavg").has_global_model and not ALGORITHMS.get("fedavg").has_personal_models


def test_personal_models_are_plain_local_sgd_on_own_data():
    alg = make_algorithm("local", client={"batch_size": 1, "lr": 0.1})
    cohorts = [[0, 1], [1], [0, 1]]  # client 2 is never sampled, client 0 skips round 1
    run = run_rounds(alg, 3, cohorts)
    x = initial_params(alg.ctx.model)

    expected = {cid: x for cid in range(3)}
    for r, cohort in enumerate(cohorts):
        for cid in cohort:
            expected[cid] = train_directly(alg, expected[cid], cid, r)
    for cid in range(3):
        personal = alg.personal_params(run.server, run.clients[cid], make_task(alg, cid, 3, "personal"))
        assert_params_equal(personal, expected[cid])
    assert_params_equal(run.clients[2]["params"], x)
    assert_params_equal(alg.global_params(run.server), x)  # the server never changes
    assert all(message == {} for results in run.messages for _, message in results)


def test_unsampled_client_keeps_its_model():
    alg = make_algorithm("local", client={"batch_size": 1, "lr": 0.1})
    after_one = run_rounds(alg, 1, [[0, 1]])
    after_three = run_rounds(alg, 3, [[0, 1], [1], [1]])
    assert_params_equal(after_three.clients[0]["params"], after_one.clients[0]["params"])
