"""Centralised DP-GD / DP-PSGD (Alg. 2.1): clipping, noise scale, momentum, budget stop."""
import math

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from fedveil.privacy.dp_gd import DPGDParams, bias_corrected_momentum, train_dp_gd
from fedveil.privacy.schedules import (
    PredefinedSchedule,
    ValidationPlateauSchedule,
    make_schedule,
    psgd_budget,
    run_until_exhausted,
)

R = 0.392704  # (4, 1e-8)-DP via Lemma 4
N, D = 24, 3


def logistic_problem():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    y = (x @ torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64) > 0).double()
    torch.manual_seed(1)
    return nn.Linear(D, 1).double(), x, y


def bce(out, y):
    return F.binary_cross_entropy_with_logits(out.squeeze(-1), y)


def zero_sigmas(steps):
    return PredefinedSchedule((0.0,) * steps)


def full_grad(model, w, x, y):
    leaves = {k: v.detach().requires_grad_(True) for k, v in w.items()}
    loss = bce(torch.func.functional_call(model, leaves, (x,)), y)
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def start(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_without_noise_and_clipping_it_is_plain_full_batch_gd():
    model, x, y = logistic_problem()
    res = train_dp_gd(model, x, y, bce, zero_sigmas(20), DPGDParams(lr=0.5, clip_norm=1e6), torch.Generator())
    w = start(model)
    for _ in range(20):
        g = full_grad(model, w, x, y)
        w = {k: w[k] - 0.5 * g[k] for k in w}
    for k in w:
        torch.testing.assert_close(res.params[k], w[k], rtol=0, atol=1e-10)
    assert res.losses[0] > res.losses[-1] and res.stop_reason == "schedule" and res.steps == 20
    assert res.budget_used == math.inf and res.epsilon == math.inf  # sigma = 0 is not private


def test_per_example_gradients_are_clipped_to_C():
    model, x, y = logistic_problem()
    C = 0.05  # below every per-example gradient norm here
    res = train_dp_gd(model, x, y, bce, zero_sigmas(1), DPGDParams(lr=1.0, clip_norm=C), torch.Generator())
    w0 = start(model)
    expected = {k: torch.zeros_like(v) for k, v in w0.items()}
    for i in range(N):  # per-example gradients one at a time, clipped by hand
        g = full_grad(model, w0, x[i : i + 1], y[i : i + 1])
        norm = math.sqrt(sum(float((v**2).sum()) for v in g.values()))
        assert norm > C
        for k in g:
            expected[k] += g[k] * (C / norm) / N
    step = {k: w0[k] - res.params[k] for k in w0}
    for k in step:
        torch.testing.assert_close(step[k], expected[k], rtol=1e-9, atol=1e-12)
    assert math.sqrt(sum(float((v**2).sum()) for v in step.values())) <= C


def zero_gradient_loss(out, y):
    return (out * 0.0).sum()


@pytest.mark.parametrize("batch_size, denominator", [(None, 10), (4, 4)])
def test_noise_std_is_C_sigma_over_n(batch_size, denominator):
    model = nn.Linear(200, 100).double()  # 20,100 noise draws in one step
    x, y = torch.randn(10, 200, dtype=torch.float64), torch.zeros(10, dtype=torch.float64)
    C, sigma = 2.0, 3.0
    hp = DPGDParams(lr=1.0, clip_norm=C, batch_size=batch_size)
    schedule, gen = PredefinedSchedule((sigma,)), torch.Generator().manual_seed(3)
    res = train_dp_gd(model, x, y, zero_gradient_loss, schedule, hp, gen)
    w0 = start(model)
    noise = torch.cat([(w0[k] - res.params[k]).flatten() for k in w0])
    assert float(noise.std()) == pytest.approx(C * sigma / denominator, rel=0.03)
    assert abs(float(noise.mean())) < 0.03 * C * sigma / denominator


def test_bias_corrected_momentum_eq_2_3():
    gen = torch.Generator().manual_seed(4)
    gs = [{"w": torch.randn(5, generator=gen, dtype=torch.float64)} for _ in range(6)]
    beta = 0.8
    m = {"w": torch.randn(5, generator=gen, dtype=torch.float64)}  # m_1 is ignored at t = 1
    for t, g in enumerate(gs, start=1):
        m = bias_corrected_momentum(m, g, beta, t)
        if t == 1:
            torch.testing.assert_close(m["w"], gs[0]["w"])  # m_2 = g_1
        ema = (1 - beta) * sum(beta ** (t - i) * gs[i - 1]["w"] for i in range(1, t + 1)) / (1 - beta**t)
        torch.testing.assert_close(m["w"], ema, rtol=1e-12, atol=1e-12)  # Eq. 2.13
    assert bias_corrected_momentum(m, gs[0], 0.0, 3)["w"].equal(gs[0]["w"])  # beta = 0 is Eq. 2.2


def test_momentum_training_follows_the_ema_of_true_gradients():
    model, x, y = logistic_problem()
    beta, lr, T = 0.9, 0.3, 8
    res = train_dp_gd(
        model, x, y, bce, zero_sigmas(T), DPGDParams(lr=lr, clip_norm=1e6, momentum=beta), torch.Generator()
    )
    w, grads = start(model), []
    for t in range(1, T + 1):
        grads.append(full_grad(model, w, x, y))
        m = {k: (1 - beta) * sum(beta ** (t - i) * grads[i - 1][k] for i in range(1, t + 1)) / (1 - beta**t) for k in w}
        w = {k: w[k] - lr * m[k] for k in w}
    for k in w:
        torch.testing.assert_close(res.params[k], w[k], rtol=0, atol=1e-10)


def test_uniform_schedule_spends_exactly_the_budget():
    model, x, y = logistic_problem()
    hp = DPGDParams(budget=R, delta=1e-8)
    res = train_dp_gd(model, x, y, bce, make_schedule("uniform", R=R, T=30), hp, torch.Generator().manual_seed(5))
    assert res.steps == 30 and res.stop_reason == "schedule"
    assert res.budget_used == pytest.approx(R, rel=1e-9)
    assert res.rho == pytest.approx(0.196352, abs=1e-6)
    assert res.epsilon == pytest.approx(4.0, abs=1e-4)
    assert all(a > b for a, b in zip(res.residuals, res.residuals[1:]))
    assert res.residuals[-1] == pytest.approx(0.0, abs=1e-12)


def test_run_stops_when_the_budget_is_exhausted():
    model, x, y = logistic_problem()
    too_long = make_schedule("uniform", R=2 * R, T=10)  # each step costs R/5
    res = train_dp_gd(model, x, y, bce, too_long, DPGDParams(budget=R), torch.Generator())
    assert res.steps == 5 and res.stop_reason == "budget"
    decaying = make_schedule("exp_decay", sigma0=12.0, k=0.05)
    res = train_dp_gd(model, x, y, bce, decaying, DPGDParams(budget=R), torch.Generator())
    expected = run_until_exhausted(decaying, R)
    assert res.steps == len(expected) and res.stop_reason == "budget"
    assert res.sigmas == pytest.approx(list(expected))
    assert res.budget_used <= R * (1 + 1e-9) and 1 / decaying.sigma(res.steps) ** 2 > R - res.budget_used


def test_psgd_batches_cost_p_squared():
    model, x, y = logistic_problem()
    n = 6
    p = n / N
    schedule = make_schedule("uniform", R=psgd_budget(R, p), T=12)
    res = train_dp_gd(model, x, y, bce, schedule, DPGDParams(budget=R, batch_size=n), torch.Generator().manual_seed(6))
    assert res.steps == 12 and res.budget_used == pytest.approx(R, rel=1e-9)
    assert res.sigmas[0] == pytest.approx(math.sqrt(12 / (R / p**2)))


def test_on_step_feeds_a_validation_schedule():
    model, x, y = logistic_problem()
    schedule = ValidationPlateauSchedule(sigma0=4.0, k=0.5, period=2, m=1)
    seen = []

    def validate(t, params):
        seen.append(t)
        schedule.record(0.5)  # flat accuracy: halve at validations 4, 6, ...

    res = train_dp_gd(model, x, y, bce, schedule, DPGDParams(max_steps=6), torch.Generator(), on_step=validate)
    assert seen == [1, 2, 3, 4, 5, 6] and res.stop_reason == "max_steps"
    assert res.sigmas == [4.0, 4.0, 4.0, 4.0, 2.0, 2.0]


def test_bad_input():
    model, x, y = logistic_problem()
    with pytest.raises(ValidationError):
        DPGDParams(lr=0.0)
    with pytest.raises(ValidationError):
        DPGDParams(momentum=1.0)
    with pytest.raises(ValueError, match="batch_size"):
        train_dp_gd(model, x, y, bce, zero_sigmas(1), DPGDParams(batch_size=N + 1), torch.Generator())
    with pytest.raises(ValueError, match="budget or max_steps"):
        train_dp_gd(model, x, y, bce, make_schedule("exp_decay"), DPGDParams(), torch.Generator())
