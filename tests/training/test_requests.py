"""The widened training door: every request field gives the same result serial and stacked.

Serial (``LocalTrainer.run``) is the reference; ``train_stacked`` must reproduce it for
BatchNorm models (per-client statistics over real rows only), multi-loss objectives with
group labels, parameter masks, private/public row mixes and several model widths.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from fedveil.config import ClientConfig
from fedveil.data.arrays import ArrayDataset
from fedveil.engine import StackedModel
from fedveil.models import build_model
from fedveil.models.functional import model_state
from fedveil.privacy.dp_sgd import ExampleDP
from fedveil.training import Batch, LocalTrainer, Objective, TrainRequest, task_loss, train_stacked
from fedveil.training.request import TaskLoss

ATOL = 1e-5


def _data(n: int, seed: int, features: int = 5, classes: int = 3) -> ArrayDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=gen)
    y = torch.randint(0, classes, (n,), generator=gen)
    sex = torch.randint(0, 2, (n,), generator=gen)
    return ArrayDataset(x, y, {"sex": sex})


def _trainer(model: nn.Module, **cfg) -> LocalTrainer:
    settings = {"batch_size": 4, "epochs": 2, "lr": 0.1, **cfg}
    return LocalTrainer(model, task_loss("classification"), ClientConfig(**settings), total_rounds=1)


def _requests(states, datasets, seed: int = 0, **fields) -> list[TrainRequest]:
    return [
        TrainRequest({k: v.clone() for k, v in s.items()}, d, torch.Generator().manual_seed(seed + i), 0, **fields)
        for i, (s, d) in enumerate(zip(states, datasets))
    ]


def _serial_and_stacked(trainer: LocalTrainer, make_requests, model: nn.Module | None = None):
    serial = [trainer.run(r) for r in make_requests()]
    stacked = train_stacked(trainer, StackedModel(model or trainer.model), make_requests())
    return serial, stacked


def _assert_states_close(serial, stacked) -> None:
    for (s_state, s_stats), (v_state, v_stats) in zip(serial, stacked):
        assert s_state.keys() == v_state.keys()
        for name in s_state:
            assert s_state[name].dtype == v_state[name].dtype, name
            torch.testing.assert_close(v_state[name], s_state[name], atol=ATOL, rtol=1e-5, msg=name)
        assert s_stats.steps == v_stats.steps and s_stats.examples == v_stats.examples
        assert v_stats.loss == pytest.approx(s_stats.loss, rel=1e-5)


# ---------------------------------------------------------------- BatchNorm and buffers


def test_batchnorm_model_trained_stacked_equals_serial_with_unequal_clients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    trainer = _trainer(model, momentum=0.5, weight_decay=1e-3)
    datasets = [_data(10, 1), _data(6, 2), _data(11, 3)]  # unequal: padded rows and clients leaving early
    start = model_state(model)
    serial, stacked = _serial_and_stacked(trainer, lambda: _requests([start] * 3, datasets))
    _assert_states_close(serial, stacked)
    for (state, stats), data in zip(serial, datasets):
        # running statistics moved away from their initial values, one update per step
        assert not torch.allclose(state["1.running_mean"], start["1.running_mean"])
        assert int(state["1.num_batches_tracked"]) == stats.steps == 2 * -(-len(data) // 4)


def test_batchnorm_running_statistics_match_torch_on_one_batch():
    """One full-batch step: the stacked running mean/var are torch's own BatchNorm update."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.BatchNorm1d(5), nn.Linear(5, 3))
    trainer = _trainer(model, batch_size=0, epochs=1)
    data = _data(7, 4)
    (_, _), = [trainer.run(r) for r in _requests([model_state(model)], [data])]
    stacked = train_stacked(trainer, StackedModel(model), _requests([model_state(model)], [data]))
    reference = copy.deepcopy(model).train()
    reference(data.x)  # torch's own update of the running statistics
    torch.testing.assert_close(stacked[0][0]["0.running_mean"], reference[0].running_mean)
    torch.testing.assert_close(stacked[0][0]["0.running_var"], reference[0].running_var)


def test_batchnorm_resnet_stacked_equals_serial():
    model = build_model("resnet", (3, 8, 8), 4, width=0.25, depth=1, norm="batch")
    trainer = _trainer(model, epochs=1, batch_size=3)
    gen = torch.Generator().manual_seed(5)
    datasets = [ArrayDataset(torch.randn(n, 3, 8, 8, generator=gen), torch.randint(0, 4, (n,), generator=gen)) for n in (5, 7)]
    start = model_state(model)
    assert any(k.endswith("running_var") for k in start)
    serial, stacked = _serial_and_stacked(trainer, lambda: _requests([start] * 2, datasets))
    _assert_states_close(serial, stacked)


def test_dp_sgd_refuses_batchnorm_in_one_line():
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    trainer = _trainer(model)
    dp = ExampleDP(clip=1.0, noise_multiplier=1.0, sampling="poisson", batch_size=4)
    with pytest.raises(ValueError, match=r"BatchNorm1d.*use GroupNorm") as err:
        trainer.run(TrainRequest(model_state(model), _data(8, 0), torch.Generator(), 0, dp=dp))
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- objectives, groups, masks


class TwoHeads(nn.Module):
    """Encoder, task head and a group discriminator (FADE's shape: G, f, D)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(5, 6)
        self.head = nn.Linear(6, 3)
        self.disc = nn.Linear(6, 2)

    def forward(self, x):
        z = torch.relu(self.encoder(x))
        return self.head(z), self.disc(z)


@dataclass(frozen=True)
class TaskPlusGroupLoss(Objective):
    """Task cross-entropy plus ``lam`` times the discriminator's cross-entropy on the group label."""

    lam: float

    def mean(self, out, batch: Batch) -> torch.Tensor:
        task, group = out
        return F.cross_entropy(task, batch.y) + self.lam * F.cross_entropy(group, batch.groups["sex"])


def _opt_out_masks(model: nn.Module) -> list[dict[str, torch.Tensor]]:
    """Client 0 opts out of the discriminator (mask 0), client 1 trains everything."""
    out = []
    for keep in (0.0, 1.0):
        out.append({n: torch.full_like(p, keep) for n, p in model.named_parameters() if n.startswith("disc")})
    return out


@pytest.mark.parametrize("private", [False, True])
def test_two_loss_objective_with_groups_and_opt_out_mask(private):
    torch.manual_seed(2)
    model = TwoHeads()
    trainer = _trainer(model, momentum=0.9)
    datasets = [_data(10, 5), _data(8, 6)]
    start = model_state(model)
    masks = _opt_out_masks(model)
    objective = TaskPlusGroupLoss(0.5)

    def make():
        reqs = _requests([start] * 2, datasets, objective=objective)
        for r, m in zip(reqs, masks):
            r.param_mask = m
            r.dp = ExampleDP(clip=0.5, noise_multiplier=1.0, sampling="shuffle", batch_size=4) if private else None
        return reqs

    serial, stacked = _serial_and_stacked(trainer, make)
    _assert_states_close(serial, stacked)
    for results in (serial, stacked):
        opted_out, trained = results[0][0], results[1][0]
        for name in ("disc.weight", "disc.bias"):  # no update and, under DP, no noise
            assert torch.equal(opted_out[name], start[name])
            assert not torch.allclose(trained[name], start[name])
        assert not torch.allclose(opted_out["encoder.weight"], start["encoder.weight"])


def test_the_group_loss_changes_the_result():
    """The objective is really used: lambda = 0 and lambda = 1 give different encoders."""
    torch.manual_seed(3)
    model = TwoHeads()
    trainer = _trainer(model)
    start = model_state(model)
    out = [trainer.run(_requests([start], [_data(8, 1)], objective=TaskPlusGroupLoss(lam))[0])[0] for lam in (0.0, 1.0)]
    assert not torch.allclose(out[0]["encoder.weight"], out[1]["encoder.weight"])
    assert torch.equal(out[0]["disc.weight"], start["disc.weight"])  # lambda = 0: no gradient reaches D


@dataclass(frozen=True)
class SquaredBatchLoss(Objective):
    """(batch-mean cross-entropy)^2: couples the examples of a batch."""

    per_example_ok = False

    def mean(self, out, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(out, batch.y) ** 2


def test_batch_level_objective_runs_client_by_client_and_is_refused_under_dp():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    trainer = _trainer(model)
    datasets = [_data(9, 7), _data(5, 8)]
    start = model_state(model)
    serial, stacked = _serial_and_stacked(trainer, lambda: _requests([start] * 2, datasets, objective=SquaredBatchLoss()))
    _assert_states_close(serial, stacked)
    dp = ExampleDP(clip=1.0, noise_multiplier=1.0, sampling="shuffle", batch_size=4)
    with pytest.raises(ValueError, match="couples the examples"):
        TrainRequest(start, datasets[0], torch.Generator(), 0, dp=dp, objective=SquaredBatchLoss())


# ---------------------------------------------------------------- private rows


def _mlp() -> nn.Module:
    torch.manual_seed(6)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))


def test_private_rows_clips_only_private_rows_by_hand():
    """One full step, no noise: (sum_i clip(g_i) over private rows + sum_j g_j over public rows) / (B + B_pub)."""
    model = _mlp()
    n_private, n_public, clip = 6, 4, 0.05
    data = _data(n_private + n_public, 9)
    trainer = _trainer(model, steps=1, batch_size=n_private, lr=1.0)
    start = model_state(model)
    dp = ExampleDP(clip=clip, noise_multiplier=0.0, sampling="shuffle", batch_size=n_private)
    new, stats = trainer.run(TrainRequest(start, data, torch.Generator().manual_seed(0), 0, dp=dp, private_rows=n_private))

    def loss(p, x, y):
        return F.cross_entropy(functional_call(model, p, (x.unsqueeze(0),)), y.unsqueeze(0))

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(start, data.x, data.y)
    norms = torch.sqrt(sum(g.flatten(1).square().sum(1) for g in per_example.values()))
    assert (norms[n_private:] > clip).all()  # public rows would be clipped if they were treated as private
    factor = torch.cat([torch.clamp(clip / norms[:n_private], max=1.0), torch.ones(n_public)])
    for name, g in per_example.items():
        expected = start[name] - torch.tensordot(factor, g, dims=1) / (n_private + n_public)
        torch.testing.assert_close(new[name], expected, atol=1e-6, rtol=1e-5)
    assert dp.trainings == [1] and stats.examples == n_private + n_public


def test_private_rows_steps_and_accounting_follow_the_private_rows_only():
    model = _mlp()
    trainer = _trainer(model, epochs=1, batch_size=2)
    data = _data(16, 10)  # 6 private rows, 10 public
    dp = ExampleDP(clip=1.0, noise_multiplier=1.0, sampling="shuffle", batch_size=2)
    _, stats = trainer.run(TrainRequest(model_state(model), data, torch.Generator(), 0, dp=dp, private_rows=6))
    assert dp.trainings == [3]  # an epoch of the 6 private rows in batches of 2, not of all 16 rows
    assert stats.steps == 3
    assert stats.examples == 3 * (2 + 3)  # each step adds round(2 * 10 / 6) = 3 public rows
    with pytest.raises(ValueError, match="private_rows must be in"):
        TrainRequest(model_state(model), data, torch.Generator(), 0, private_rows=17)


@pytest.mark.parametrize("sampling", ["shuffle", "poisson"])
def test_private_rows_stacked_equals_serial_with_noise(sampling):
    model = _mlp()
    trainer = _trainer(model, epochs=1, batch_size=3, momentum=0.5)
    datasets = [_data(14, 11), _data(12, 12)]
    start = model_state(model)

    def make():
        reqs = _requests([start] * 2, datasets, private_rows=None)
        for r, n_private in zip(reqs, (8, 6)):
            r.private_rows = n_private
            r.dp = ExampleDP(clip=0.3, noise_multiplier=1.1, sampling=sampling, batch_size=3)
        return reqs

    serial_requests, stacked_requests = make(), make()
    serial = [trainer.run(r) for r in serial_requests]
    stacked = train_stacked(trainer, StackedModel(model), stacked_requests)
    _assert_states_close(serial, stacked)
    assert [r.dp.trainings for r in serial_requests] == [r.dp.trainings for r in stacked_requests]
    assert [r.dp.trainings for r in serial_requests] == [[8 // 3], [6 // 3]] if sampling == "shuffle" else True


# ---------------------------------------------------------------- model variants


def test_a_cohort_mixing_two_widths_equals_serial():
    """Requests for two model variants (widths) in one wave: each width stacks on its own."""
    from fedveil.runtime.vectorized import VectorizedExecutor

    widths = {0.5: build_model("mlp", (5,), 3, hidden=(4,)), 1.0: build_model("mlp", (5,), 3, hidden=(8,))}
    trainer = _trainer(widths[1.0], epochs=1, batch_size=3, momentum=0.5)
    datasets = [_data(7 + i, 20 + i) for i in range(4)]
    width_of = [0.5, 1.0, 0.5, 1.0]

    def requests():
        return [
            TrainRequest(model_state(widths[w]), d, torch.Generator().manual_seed(i), 0, model=widths[w])
            for i, (w, d) in enumerate(zip(width_of, datasets))
        ]

    serial = [trainer.run(r) for r in requests()]
    executor = VectorizedExecutor()
    posts = [_post(trainer, r, i) for i, r in enumerate(requests())]
    executor._train_wave(posts)
    stacked = [p.result for p in posts]
    _assert_states_close(serial, stacked)
    assert stacked[0][0]["fc1.weight"].shape == (4, 5) and stacked[1][0]["fc1.weight"].shape == (8, 5)
    assert len(executor._stacked) == 2  # one stacked model per width


def _post(trainer, request, job):
    from fedveil.runtime.vectorized import _Post

    return _Post(job, trainer, request)


def test_cross_entropy_per_example_losses_equal_the_vmap_of_the_mean_with_gradients():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 7, generator=g, requires_grad=True)
    batch = Batch(torch.zeros(64, 1), torch.randint(0, 7, (64,), generator=g), {})
    loss = TaskLoss(F.cross_entropy)
    direct = loss.per_example(logits, batch)
    by_vmap = Objective.per_example(loss, logits, batch)  # the generic rule, example by example
    assert torch.equal(direct, by_vmap)
    weights = torch.rand(64, generator=g)
    assert torch.equal(torch.autograd.grad((direct * weights).sum(), logits)[0],
                       torch.autograd.grad((by_vmap * weights).sum(), logits)[0])
