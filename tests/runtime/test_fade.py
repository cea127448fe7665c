"""FADE (spec 004): gradient reversal, the squared adversarial loss, Alg. 3.2's momentum,
opt-out, the schedules, the divergence guard, and serial = vectorized with and without DP."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedveil.algorithms.fade import FadeObjective, lambda_at
from fedveil.config import ClientConfig
from fedveil.data.arrays import ArrayDataset
from fedveil.engine import StackedModel
from fedveil.errors import ConfigError
from fedveil.models import build_model
from fedveil.models.functional import model_state
from fedveil.models.layers import GradientReversal, reverse_gradient
from fedveil.runtime import run
from fedveil.training import Batch, LocalTrainer, Objective, TrainRequest, task_loss
from tiny_runs import merge, rows_of, tiny_config

FADE = {
    "data": {"name": "rotated_digits", "num_clients": 4, "partition": {"name": "domain"}},
    "model": {"name": "fade_mlp", "options": {"hidden": [16], "z_dim": 8, "head_hidden": [], "disc_hidden": [8], "groups": 4}},
    "algorithm": {"name": "fade", "group_key": "domain"},
    "client": {"batch_size": 16, "lr": 0.1},
    "federation": {"rounds": 3, "clients_per_round": 4},
    "checkpoint": {"every": 1},
}


def _run(tmp_path, name: str, **sections):
    out = tmp_path / name
    run(tiny_config(**merge(FADE, sections)), out, progress=False)
    return rows_of(out), torch.load(out / "checkpoint.pt", weights_only=True)


# ----------------------------------------------------------------- gradient reversal


def test_gradient_reversal_is_identity_forward_and_minus_lambda_backward():
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    layer = GradientReversal(0.7).double()
    out = layer(x)
    assert torch.equal(out, x)  # exactly the identity
    upstream = torch.randn(5, 3, dtype=torch.float64)
    (grad,) = torch.autograd.grad(out, x, upstream)
    torch.testing.assert_close(grad, -0.7 * upstream)


def test_stacked_gradient_reversal_uses_each_clients_lambda():
    model = build_model("fade_mlp", (6,), 3, hidden=[5], z_dim=4, head_hidden=[], disc_hidden=[], groups=2)
    stacked = StackedModel(model)
    state = model_state(model)
    params = {n: torch.stack([state[n]] * 2) for n, _ in model.named_parameters()}
    lams = torch.tensor([0.0, 2.0])
    x = torch.randn(8, 6)
    leaves = {n: v.clone().requires_grad_(True) for n, v in params.items()}
    _, group_logits = stacked(leaves, x, 2, buffers={"reverse.lam": lams})
    grads = torch.autograd.grad(group_logits.sum(), [leaves["encoder.fc1.weight"], leaves["disc.out.weight"]])
    assert torch.equal(grads[0][0], torch.zeros_like(grads[0][0]))  # lambda 0: no signal reaches G
    for k, lam in enumerate((0.0, 2.0)):  # serial reference with the client's own lambda
        ref_state = {**{n: v.detach().clone().requires_grad_(True) for n, v in state.items()}, "reverse.lam": torch.tensor(lam)}
        _, out = torch.func.functional_call(model, ref_state, (x[4 * k : 4 * k + 4],))
        ref = torch.autograd.grad(out.sum(), [ref_state["encoder.fc1.weight"], ref_state["disc.out.weight"]])
        torch.testing.assert_close(grads[0][k], ref[0])
        torch.testing.assert_close(grads[1][k], ref[1])


# ----------------------------------------------------------------- the adversarial losses


def _two_group_batch(n: int = 12):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, 6, generator=gen)
    y = torch.randint(0, 3, (n,), generator=gen)
    g = torch.ones(n, dtype=torch.long)  # one user, one group
    return Batch(x, y, {"sex": g})


def test_squared_loss_gradient_is_bce_times_grad_bce():
    """Eq. 3.6: d/dD (BCE^2 / 2) = BCE * dBCE/dD, with BCE written independently (two groups:
    the two-logit cross-entropy is the BCE of the logit difference)."""
    torch.manual_seed(0)
    model = build_model("fade_mlp", (6,), 3, hidden=[5], z_dim=4, groups=2)
    batch = _two_group_batch()
    params = dict(model.named_parameters())

    def disc_grad(value_fn):
        out = model(batch.x)
        return torch.autograd.grad(value_fn(out), [params["disc.out.weight"]])[0], out

    squared = FadeObjective("sex", labelled=False, adversarial_loss="squared")
    g_sq, _ = disc_grad(lambda out: squared.mean(out, batch))

    def bce(out):
        margin = out[1][:, 1] - out[1][:, 0]
        return F.binary_cross_entropy_with_logits(margin, batch.groups["sex"].float())

    g_bce, out = disc_grad(bce)
    torch.testing.assert_close(g_sq, float(bce(out).detach()) * g_bce)
    vanilla = FadeObjective("sex", labelled=False)
    torch.testing.assert_close(disc_grad(lambda o: vanilla.mean(o, batch))[0], g_bce)


def test_power_loss_puts_the_power_inside_the_mean():
    torch.manual_seed(1)
    model = build_model("fade_mlp", (6,), 3, hidden=[5], z_dim=4, groups=2)
    batch = _two_group_batch()
    out = model(batch.x)
    ce = F.cross_entropy(out[1], batch.groups["sex"], reduction="none")
    power = FadeObjective("sex", labelled=False, adversarial_loss="power", q=3.0)
    torch.testing.assert_close(power.mean(out, batch), (ce**3).mean() / 3)
    assert power.per_example_ok and not FadeObjective("sex", adversarial_loss="squared").per_example_ok


# ----------------------------------------------------------------- schedules and server


def test_lambda_and_learning_rate_schedules():
    assert lambda_at(0, 100, 1.0, "dann", 0) == 0.0
    assert lambda_at(100, 100, 1.0, "dann", 0) == pytest.approx(0.99991, abs=1e-5)  # spec §2.10
    assert lambda_at(50, 100, 2.0, "dann", 0) == pytest.approx(2 * (2 / (1 + math.exp(-5)) - 1))
    assert lambda_at(30, 100, 1.0, "dann", 40) == 0.0
    assert lambda_at(39, 100, 0.5, "constant", 40) == 0.0 and lambda_at(40, 100, 0.5, "constant", 40) == 0.5
    trainer = LocalTrainer(None, None, ClientConfig(lr=0.01, lr_schedule="dann"), total_rounds=10)
    assert trainer.lr_at(0) == 0.01
    assert trainer.lr_at(5) == pytest.approx(0.01 * 6**-0.75)


def test_server_momentum_beta(tmp_path):
    """Alg. 3.2: theta' = beta sum_i p_i theta_i + (1 - beta) theta; beta = 1 is FedAvg's average."""
    from fedveil.algorithms.fade import Fade, FadeParams
    from fedveil.algorithms.base import RunContext

    model = build_model("fade_mlp", (6,), 3, hidden=[5], z_dim=4, groups=2)
    trainer = LocalTrainer(model, task_loss("classification"), ClientConfig(), 1)
    ctx = RunContext(num_clients=2, task="classification", num_classes=3, input_shape=(6,), rounds=1, seed=0,
                     model_factory=lambda device=None: model, trainer=trainer)
    theta = model_state(model)
    users = [{k: v + 1.0 if v.is_floating_point() else v for k, v in theta.items()},
             {k: v - 3.0 if v.is_floating_point() else v for k, v in theta.items()}]
    messages = [(i, {"delta": {k: u[k] - theta[k] for k in theta}, "num_examples": n, "steps": 1})
                for i, (u, n) in enumerate(zip(users, (1, 3)))]
    for beta in (0.5, 1.0):
        fade = Fade(FadeParams(beta=beta, guard=None), ctx)
        new = fade.aggregate(fade.init_server(theta), messages, 0)["params"]
        w = "encoder.fc1.weight"
        average = 0.25 * users[0][w] + 0.75 * users[1][w]
        torch.testing.assert_close(new[w], beta * average + (1 - beta) * theta[w])


# ----------------------------------------------------------------- runs


def test_opted_out_user_leaves_d_bit_identical_and_trains_on_the_task_only():
    torch.manual_seed(2)
    model = build_model("fade_mlp", (6,), 3, hidden=[5], z_dim=4, groups=2)
    trainer = LocalTrainer(model, task_loss("classification"), ClientConfig(batch_size=4, epochs=2, lr=0.1, weight_decay=0.01), 1)
    start = model_state(model)
    batch = _two_group_batch(10)
    data = ArrayDataset(batch.x, batch.y, batch.groups)
    mask = {n: torch.zeros_like(v) for n, v in start.items() if n.startswith("disc.")}
    opted_out, _ = trainer.run(TrainRequest(start, data, torch.Generator().manual_seed(0), 0,
                                            objective=FadeObjective("sex", adversarial=False), param_mask=mask))

    class TaskOnly(Objective):  # the task loss alone, written independently of FadeObjective
        def mean(self, out, b):
            return F.cross_entropy(out[0], b.y)

    reference, _ = trainer.run(TrainRequest(start, data, torch.Generator().manual_seed(0), 0, objective=TaskOnly(), param_mask=mask))
    for name in mask:
        assert torch.equal(opted_out[name], start[name])
    for name in start:
        torch.testing.assert_close(opted_out[name], reference[name])


CASES = {
    "vanilla": {},
    "squared-cdan-entropy": {"algorithm": {"adversarial_loss": "squared", "entropy_weights": True},
                             "model": {"options": {"conditioning": "cdan"}}},
    "power-opt-out-unlabelled": {"algorithm": {"adversarial_loss": "power", "q": 2.0, "opt_out": 0.5,
                                               "unlabelled_clients": [3], "im_weight": 0.3}},
    "dp-vanilla": {"privacy": {"level": "example", "epsilon": 4.0, "clip": 1.0}},
    "dp-power-opt-out": {"algorithm": {"adversarial_loss": "power", "opt_out_clients": [1]},
                         "privacy": {"level": "example", "epsilon": 4.0, "clip": 1.0}},
    "client-dp": {"privacy": {"level": "client", "noise_multiplier": 1.0}},
}


@pytest.mark.usefixtures("skip_plots")
@pytest.mark.parametrize("case", list(CASES))
def test_serial_and_vectorized_agree(tmp_path, case):
    results = {}
    for executor in ("serial", "vectorized"):
        results[executor] = _run(tmp_path, executor, **merge(CASES[case], {"executor": executor}))
    (rows_s, ck_s), (rows_v, ck_v) = results["serial"], results["vectorized"]
    for ra, rb in zip(rows_s, rows_v):
        for key in ra:
            if key not in ("elapsed_s",):
                assert ra[key] == pytest.approx(rb[key], rel=1e-5, abs=1e-6, nan_ok=True), key
    for name, value in ck_s["server"]["params"].items():
        torch.testing.assert_close(ck_v["server"]["params"][name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.usefixtures("skip_plots")
def test_state_is_plain_checkpointable_data(tmp_path):
    """The contract test's promise with FADE's own model: the checkpoint loads with weights_only."""
    rows, checkpoint = _run(tmp_path, "ck")
    assert "reverse.lam" in checkpoint["server"]["params"] and isinstance(checkpoint["server"]["lambda_off_round"], int)
    assert [r["adversarial_users"] for r in rows] == [1.0, 1.0, 1.0]
    assert rows[0]["lambda"] == 0.0 and 0 < rows[1]["lambda"] < rows[2]["lambda"] < 1


@pytest.mark.usefixtures("skip_plots")
def test_divergence_guard_resets_d_and_pauses_lambda(tmp_path):
    rows, checkpoint = _run(tmp_path, "guard", algorithm={"guard": 1e-6}, federation={"rounds": 2})
    assert rows[0]["group_loss"] > 1e-6
    assert rows[1]["lambda"] == 0.0  # the round after a reset plays with lambda = 0
    rows_off, _ = _run(tmp_path, "noguard", algorithm={"guard": None}, federation={"rounds": 2})
    assert rows_off[1]["lambda"] > 0 and "group_loss" not in rows_off[0]


def test_bad_setups_fail_in_one_line(tmp_path):
    plain = {**FADE, "model": {"name": "mlp"}}
    with pytest.raises(ConfigError, match="fade_mlp"):
        run(tiny_config(**plain), tmp_path / "a", progress=False)
    with pytest.raises(ConfigError, match="no group 'sex'"):
        run(tiny_config(**merge(FADE, {"algorithm": {"group_key": "sex"}})), tmp_path / "b", progress=False)
    with pytest.raises(ConfigError, match="does not support example-level DP"):
        run(tiny_config(**merge(FADE, {"algorithm": {"adversarial_loss": "squared"},
                                       "privacy": {"level": "example", "epsilon": 4.0}})), tmp_path / "c", progress=False)


def test_shot_pseudo_labels_follow_the_feature_clusters():
    """Two well-separated feature clusters; predictions that are right for most rows but
    wrong for a few: the centroid relabelling recovers the cluster of every row."""
    from fedveil.algorithms.fade import shot_pseudo_labels

    z = torch.tensor([[5.0, 0.1], [4.0, -0.2], [6.0, 0.3], [0.1, 5.0], [-0.3, 4.0], [0.2, 6.0]])
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.1, 0.9], [0.6, 0.4], [0.2, 0.8]])
    assert probs.argmax(1).tolist() == [0, 0, 1, 1, 0, 1]  # two rows predicted wrongly
    assert shot_pseudo_labels(z, probs).tolist() == [0, 0, 0, 1, 1, 1]


SHOT = {"algorithm": {"unlabelled_clients": [2, 3], "lam": 0.0, "im_weight": 0.3, "pseudo_label_weight": 0.3,
                      "freeze_head_unlabelled": True}}


@pytest.mark.usefixtures("skip_plots")
def test_fedavg_shot_agrees_across_executors_and_refuses_example_dp(tmp_path):
    (rows_s, ck_s), (rows_v, ck_v) = (_run(tmp_path, e, **merge(SHOT, {"executor": e})) for e in ("serial", "vectorized"))
    for name, value in ck_s["server"]["params"].items():
        torch.testing.assert_close(ck_v["server"]["params"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    with pytest.raises(ConfigError, match="does not support example-level DP"):
        run(tiny_config(**merge(FADE, merge(SHOT, {"privacy": {"level": "example", "epsilon": 4.0}}))),
            tmp_path / "dp", progress=False)


def test_unlabelled_user_with_a_frozen_head_moves_only_the_encoder():
    from fedveil.algorithms.base import ClientTask, RunContext
    from fedveil.algorithms.fade import Fade, FadeParams
    from fedveil.data.federated import ClientData

    torch.manual_seed(4)
    model = build_model("fade_mlp", (6,), 3, hidden=[5], z_dim=4, groups=2)
    trainer = LocalTrainer(model, task_loss("classification"), ClientConfig(batch_size=4, epochs=1, lr=0.5), 2)
    ctx = RunContext(num_clients=1, task="classification", num_classes=3, input_shape=(6,), rounds=2, seed=0,
                     model_factory=lambda device=None: model, trainer=trainer)
    fade = Fade(FadeParams(unlabelled_clients=[0], lam=0.0, im_weight=1.0, pseudo_label_weight=1.0,
                           freeze_head_unlabelled=True, guard=None), ctx)
    batch = _two_group_batch(12)
    rows = ArrayDataset(batch.x, batch.y, batch.groups)
    task = ClientTask(0, 1, ClientData(train=rows, val=None, test=rows), torch.Generator().manual_seed(0), trainer)
    delta = fade.client_update(fade.init_server(model_state(model)), None, task).message["delta"]
    assert all(torch.equal(v, torch.zeros_like(v)) for k, v in delta.items() if k.startswith(("head.", "disc.")))
    assert delta["encoder.fc1.weight"].abs().max() > 0
