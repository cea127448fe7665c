"""FedAvg with a switch to local fine-tuning (spec 002 §2.4)."""
from harness import assert_params_equal, make_algorithm, make_task, run_rounds, train_directly


def test_fedavg_until_the_switch_then_local_sgd_from_the_global_model():
    client = {"batch_size": 2, "lr": 0.1}
    alg = make_algorithm("fedavg_then_local", switch_fraction=0.5, rounds=4, client=client)
    run = run_rounds(alg, 4)
    fedavg = run_rounds(make_algorithm("fedavg", rounds=4, client=client), 2)
    assert_params_equal(run.server["params"], fedavg.server["params"])  # frozen after round 2
    for cid in range(3):
        expected = train_directly(alg, train_directly(alg, fedavg.server["params"], cid, 2), cid, 3)
        assert_params_equal(run.clients[cid]["params"], expected)
        assert_params_equal(alg.personal_params(run.server, run.clients[cid], make_task(alg, cid, 4)), expected)
    assert all(m == {} for results in run.messages[2:] for _, m in results)
