"""STC (Sattler et al. 2019; spec 001 §4): top-p sparsification of the whole update,
ternarisation to {-mu, 0, +mu}, error feedback on clients and server, Golomb bit counts."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from fedveil import params as P
from fedveil.algorithms.stc import golomb_b_star, golomb_position_bits, kept_count, stc_compress
from fedveil.runtime import run
from harness import DTYPE, assert_params_close, initial_params, make_algorithm, make_task, train_directly

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from tiny_runs import tiny_config  # noqa: E402

torch.set_num_threads(1)


def _t(values):
    return torch.tensor(values, dtype=DTYPE)


def test_compress_a_hand_made_update():
    # 10 entries over two tensors, compressed as ONE vector; p = 0.3 keeps 3: 4.0, -3.0, -2.0
    update = {"a": _t([[0.5, -2.0, 1.0], [0.1, -3.0, 0.0]]), "b": _t([0.2, 4.0, -0.3, 0.05])}
    out = stc_compress(update, 0.3)
    assert out.mu == 3.0 and out.nonzeros == 3  # mu = (4 + 3 + 2) / 3
    assert torch.equal(out.sent["a"], _t([[0.0, -3.0, 0.0], [0.0, -3.0, 0.0]]))
    assert torch.equal(out.sent["b"], _t([0.0, 3.0, 0.0, 0.0]))
    assert torch.equal(out.residual["a"], _t([[0.5, 1.0, 1.0], [0.1, 0.0, 0.0]]))
    assert torch.equal(out.residual["b"], _t([0.2, 1.0, -0.3, 0.05]))


def test_kept_count_and_golomb_bits():
    assert kept_count(10, 0.2) == 2 and kept_count(10, 0.25) == 3 and kept_count(10, 0.01) == 1 and kept_count(4, 1.0) == 4
    # b* = 1 + floor(log2(log(phi - 1) / log(1 - p))), worked out by hand:
    # p = 0.01: log(0.618) / log(0.99) = 47.88, log2 = 5.58 -> b* = 6
    # p = 0.2:  log(0.618) / log(0.8)  = 2.157, log2 = 1.11 -> b* = 2
    # p = 0.5:  0.694, log2 = -0.53 -> b* = 0
    assert [golomb_b_star(p) for p in (0.01, 0.2, 0.5, 1.0)] == [6, 2, 0, 0]
    assert golomb_position_bits(0.2) == 2 + 1 / (1 - 0.8**4)  # 3.6938
    assert abs(golomb_position_bits(0.01) - 8.1079) < 1e-4  # 6 + 1 / (1 - 0.5256), 0.99^64 = exp(-0.6432)
    assert golomb_position_bits(0.5) == 2.0 and golomb_position_bits(1.0) == 1.0


def test_full_sparsity_of_equal_magnitudes_is_fedavg():
    """p = 1 and no residual: every entry is kept, and with equal magnitudes the ternarisation
    is exact, so the server applies FedAvg's weighted mean update."""
    sizes = (1, 3)
    cases = {
        # upload only: any signs; mean = (1 u0 + 3 u1) / 4 = weight [1.625, 1.375, -1.375], bias 1.375
        False: ([{"weight": _t([[0.5, -0.5, 0.5]]), "bias": _t([-0.5])}, {"weight": _t([[2.0, 2.0, -2.0]]), "bias": _t([2.0])}],
                {"weight": _t([[1.625, 1.375, -1.375]]), "bias": _t([1.375])}),
        # downstream too: the mean must have equal magnitudes as well: one sign pattern, mean 1.625
        True: ([{"weight": _t([[0.5, -0.5, 0.5]]), "bias": _t([-0.5])}, {"weight": _t([[2.0, -2.0, 2.0]]), "bias": _t([-2.0])}],
               {"weight": _t([[1.625, -1.625, 1.625]]), "bias": _t([-1.625])}),
    }
    for downstream, (updates, mean) in cases.items():
        alg = make_algorithm("stc", sparsity=1.0, downstream=downstream, sizes=sizes)
        server = alg.init_server(initial_params(alg.ctx.model))
        messages = []
        for u, n in zip(updates, sizes):
            packed = stc_compress(u, 1.0)
            assert_params_close(packed.sent, u, atol=0.0)
            assert packed.nonzeros == 4
            messages.append({"update": packed.sent, "buffers": {}, "num_examples": n})
        new = alg.aggregate(server, list(enumerate(messages)), 0)
        assert_params_close(new["params"], P.add(server["params"], mean))
        assert_params_close(new["params"], P.add(server["params"], P.weighted_mean(updates, sizes)))
        if downstream:
            assert_params_close(new["residual"], P.zeros_like(mean))


def test_one_round_by_hand():
    """Upload-only STC at p = 0.5 on the toy problem: each client's message is its own
    trained delta, top-2 of 4 entries ternarised, and the server adds their weighted mean."""
    alg = make_algorithm("stc", sparsity=0.5, downstream=False, client={"batch_size": 2, "lr": 0.1})
    w0 = initial_params(alg.ctx.model)
    server = alg.init_server(w0)
    results, expected_sent = [], []
    for cid in range(3):
        delta = P.sub(train_directly(alg, w0, cid, 0), w0)
        flat = torch.cat([delta["weight"].reshape(-1), delta["bias"]])
        top = flat.abs().topk(2).indices
        mu = flat.abs()[top].mean()
        sent = torch.zeros_like(flat)
        sent[top] = mu * flat[top].sign()
        expected_sent.append({"weight": sent[:3].reshape(1, 3), "bias": sent[3:]})
        result = alg.client_update(server, None, make_task(alg, cid, 0))
        assert_params_close(result.message["update"], expected_sent[-1])
        assert_params_close(result.state["residual"], P.sub(delta, expected_sent[-1]))
        bits = 2 * (golomb_position_bits(0.5) + 1) + 32  # two non-zeros: 2 position bits + 1 sign bit each
        assert result.extra_metrics == {"params_uploaded": 2.0, "upload_bits": bits}
        results.append((cid, result.message))
    new = alg.aggregate(server, results, 0)
    sizes = [len(c.train) for c in alg.ctx.data.clients]
    assert_params_close(new["params"], P.add(w0, P.weighted_mean(expected_sent, sizes)))


def test_error_feedback_conserves_the_updates():
    """Over rounds, sum(sent) + final residual = sum(raw updates), for every client (its
    trained deltas) and for the server (the averaged uploads it received)."""
    rounds = 4
    alg = make_algorithm("stc", sparsity=0.25, rounds=rounds, client={"batch_size": 2, "lr": 0.05})
    server = alg.init_server(initial_params(alg.ctx.model))
    clients = {cid: None for cid in range(3)}
    cohorts = [[0, 1, 2], [0, 2], [1, 2], [0, 1, 2]]
    raw = {cid: None for cid in clients}
    sent = {cid: None for cid in clients}
    uploads_sum = broadcast_sum = None
    acc = lambda total, x: x if total is None else P.add(total, x)  # noqa: E731
    for r, cohort in enumerate(cohorts):
        results = []
        for cid in cohort:
            start = server["params"]
            raw[cid] = acc(raw[cid], P.sub(train_directly(alg, start, cid, r), start))
            result = alg.client_update(server, clients[cid], make_task(alg, cid, r))
            clients[cid] = result.state
            sent[cid] = acc(sent[cid], result.message["update"])
            assert result.extra_metrics["params_uploaded"] == 1.0  # ceil(0.25 * 4) = 1 entry
            results.append((cid, result.message))
        sizes = [alg.ctx.data.clients[c].num_train for c in cohort]
        uploads_sum = acc(uploads_sum, P.weighted_mean([m["update"] for _, m in results], sizes))
        before = server["params"]
        server = alg.aggregate(server, results, r)
        broadcast_sum = acc(broadcast_sum, P.sub(server["params"], before))
    for cid in clients:
        assert_params_close(P.add(sent[cid], clients[cid]["residual"]), raw[cid])
        assert sum(int(torch.count_nonzero(v)) for v in clients[cid]["residual"].values()) > 0
    assert_params_close(P.add(broadcast_sum, server["residual"]), uploads_sum)


def test_serial_and_vectorized_agree(tmp_path):
    params, clients = {}, {}
    for executor in ("serial", "vectorized"):
        config = tiny_config(
            algorithm={"name": "stc", "sparsity": 0.1}, executor=executor,
            federation={"rounds": 3, "clients_per_round": 3}, checkpoint={"every": 0},
        )
        run(config, tmp_path / executor, progress=False)
        checkpoint = torch.load(tmp_path / executor / "checkpoint.pt", weights_only=True)
        params[executor], clients[executor] = checkpoint["server"], checkpoint["clients"]
    for name, value in params["serial"]["params"].items():
        torch.testing.assert_close(params["vectorized"]["params"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    for name, value in params["serial"]["residual"].items():
        torch.testing.assert_close(params["vectorized"]["residual"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert clients["serial"].keys() == clients["vectorized"].keys() and clients["serial"]
    for cid, state in clients["serial"].items():
        for name, value in state["residual"].items():
            torch.testing.assert_close(clients["vectorized"][cid]["residual"][name], value, rtol=1e-5, atol=1e-6)


def test_batchnorm_statistics_are_averaged_plainly(tmp_path):
    """Buffers are not compressed: after one round STC's running statistics are the clients'
    weighted mean, as FedAvg's (same start, same batches), while the parameters differ."""
    model = {"name": "resnet", "options": {"depth": 1, "width": 0.25, "norm": "batch"}}
    servers = {}
    for name, algorithm in {"stc": {"name": "stc", "sparsity": 0.1}, "fedavg": {"name": "fedavg"}}.items():
        config = tiny_config(model=model, algorithm=algorithm, federation={"rounds": 1, "clients_per_round": 3},
                             checkpoint={"every": 0})
        run(config, tmp_path / name, progress=False)
        servers[name] = torch.load(tmp_path / name / "checkpoint.pt", weights_only=True)["server"]
    stc, fedavg = servers["stc"], servers["fedavg"]
    buffers = [k for k in fedavg["params"] if k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert buffers and not set(buffers) & set(stc["residual"])
    for k in buffers:
        torch.testing.assert_close(stc["params"][k], fedavg["params"][k], rtol=1e-6, atol=1e-7, msg=k)
    assert stc["params"]["stem_norm.num_batches_tracked"].dtype == torch.int64
    assert not torch.allclose(stc["params"]["stem.weight"], fedavg["params"]["stem.weight"])
