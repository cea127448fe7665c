"""Centralised DP-GD / DP-PSGD (Alg. 2.1): clipping, noise scale, momentum, budget stop, accounting."""
import math
from collections import Counter

import dp_accounting
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dp_accounting.rdp import RdpAccountant
from pydantic import ValidationError
from torch import nn

from fedveil.privacy import dp_gd
from fedveil.privacy.dp_gd import DPGDParams, bias_corrected_momentum, calibrated_psgd_schedule, train_dp_gd
from fedveil.privacy.randomness import SECURE
from fedveil.privacy.schedules import (
    PredefinedSchedule,
    ValidationPlateauSchedule,
    make_schedule,
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
    assert res.rho == math.inf and res.epsilon == math.inf  # sigma = 0 is not private


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


def test_a_linear_stack_without_noise_takes_per_example_clipped_gd_steps():
    """Linear-ReLU-Linear (per-example norms and clipped sum in closed form): each step is
    ``theta -= lr sum_n clip_C(g_n) / N`` with g_n from autograd one example at a time."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 9), nn.ReLU(), nn.Linear(9, 3)).double()
    x, y = 2 * torch.randn(20, 6, dtype=torch.float64), torch.randint(0, 3, (20,))
    C, lr, steps = 2.5, 0.5, 3
    res = train_dp_gd(model, x, y, F.cross_entropy, zero_sigmas(steps), DPGDParams(lr=lr, clip_norm=C), torch.Generator())
    w, clipped = start(model), set()
    for _ in range(steps):
        total = {k: torch.zeros_like(v) for k, v in w.items()}
        for i in range(len(x)):
            leaves = {k: v.detach().requires_grad_(True) for k, v in w.items()}
            loss = F.cross_entropy(torch.func.functional_call(model, leaves, (x[i : i + 1],)), y[i : i + 1])
            g = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
            norm = math.sqrt(sum(float((v**2).sum()) for v in g.values()))
            clipped.add(norm > C)
            for k in g:
                total[k] += g[k] * min(1.0, C / norm)
        w = {k: w[k] - lr * total[k] / len(x) for k in w}
    assert clipped == {True, False}  # clipping acts on some examples, not all
    for k in w:
        torch.testing.assert_close(res.params[k], w[k], rtol=0, atol=1e-12)


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
    assert res.rho == pytest.approx(R / 2, rel=1e-9)
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
    assert 2 * res.rho <= R * (1 + 1e-9) and 1 / decaying.sigma(res.steps) ** 2 > R - 2 * res.rho


def test_full_batch_reports_the_zcdp_closed_form():
    """Lemma 3 + Thm 1: rho = sum_t 1/(2 sigma_t^2); Lemma 4: epsilon = rho + 2 sqrt(rho ln(1/delta))."""
    model, x, y = logistic_problem()
    sigmas = (9.0, 7.5, 6.0, 4.0)
    res = train_dp_gd(model, x, y, bce, PredefinedSchedule(sigmas), DPGDParams(delta=1e-6), torch.Generator())
    rho = sum(1 / (2 * s**2) for s in sigmas)
    assert res.rho == pytest.approx(rho, rel=1e-12)
    assert res.epsilon == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1e6)), rel=1e-12)


DELTA = 1e-8
ROWS = 1000
R_EXACT = 2 * (math.sqrt(4 + math.log(1 / DELTA)) - math.sqrt(math.log(1 / DELTA))) ** 2  # (4, 1e-8), Lemma 4


def poisson_gaussian_epsilon(q, sigmas, delta=DELTA):
    """Independent figure: dp_accounting's RDP accountant over Poisson-subsampled Gaussian steps."""
    acc = RdpAccountant()
    for sigma, count in Counter(sigmas).items():
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), count)
    return acc.get_epsilon(delta)


def old_p_squared_epsilon(q, sigmas, delta=DELTA):
    """What the with-replacement book-keeping reported: Lemma 4 of rho = sum_t p^2 / (2 sigma_t^2)."""
    rho = sum(q**2 / (2 * s**2) for s in sigmas)
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def rows_problem(rows=ROWS):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(rows, D, generator=gen, dtype=torch.float64)
    torch.manual_seed(1)
    return nn.Linear(D, 1).double(), x, (x[:, 0] > 0).double()


@pytest.mark.parametrize("batch_size, sigma", [(100, 1.0), (50, 0.8)])
def test_psgd_reports_the_poisson_subsampled_gaussian_epsilon(batch_size, sigma):
    """Issue 33: the steps the old p^2 zCDP cost let a (4, 1e-8) budget pay for, now accounted by RDP."""
    q = batch_size / ROWS
    steps = math.floor(R_EXACT * sigma**2 / q**2)  # the old budget stop: sum_t p^2 / sigma^2 <= R
    model, x, y = rows_problem()
    hp = DPGDParams(batch_size=batch_size, delta=DELTA)
    res = train_dp_gd(model, x, y, bce, PredefinedSchedule((sigma,) * steps), hp, torch.Generator().manual_seed(2))
    assert res.steps == steps and res.rho is None
    expected = poisson_gaussian_epsilon(q, res.sigmas)
    assert res.epsilon == pytest.approx(expected, rel=0.01)
    assert old_p_squared_epsilon(q, res.sigmas) == pytest.approx(4.0, abs=0.02)
    assert res.epsilon >= old_p_squared_epsilon(q, res.sigmas)


def test_psgd_budget_stops_before_the_accounted_epsilon_exceeds_it():
    q, sigma = 0.1, 1.0
    model, x, y = rows_problem()
    hp = DPGDParams(batch_size=100, budget=R_EXACT, delta=DELTA)
    res = train_dp_gd(model, x, y, bce, PredefinedSchedule((sigma,) * 50), hp, torch.Generator().manual_seed(3))
    assert res.stop_reason == "budget" and res.steps >= 1
    assert res.epsilon <= 4.0 < poisson_gaussian_epsilon(q, [sigma] * (res.steps + 1))
    assert res.epsilon == pytest.approx(poisson_gaussian_epsilon(q, res.sigmas), rel=0.01)
    assert res.residuals[-1] == pytest.approx(4.0 - res.epsilon)


def test_calibrated_psgd_schedule_spends_the_budget_by_the_reporting_accountant():
    model, x, y = rows_problem()
    hp = DPGDParams(batch_size=100, budget=R_EXACT, delta=DELTA)
    shape = 0.95 ** np.arange(12)  # decaying noise, as a chapter-2 dynamic schedule
    schedule = calibrated_psgd_schedule(shape, hp, ROWS)
    assert schedule.sigmas[0] / schedule.sigmas[-1] == pytest.approx(shape[0] / shape[-1])
    res = train_dp_gd(model, x, y, bce, schedule, hp, torch.Generator().manual_seed(4))
    assert res.steps == 12 and res.stop_reason == "schedule"
    independent = poisson_gaussian_epsilon(0.1, res.sigmas)
    assert res.epsilon == pytest.approx(independent, rel=0.01)
    assert res.epsilon == pytest.approx(4.0, rel=1e-3) and res.epsilon <= 4.0 * (1 + 1e-9)
    with pytest.raises(ValueError, match="budget"):
        calibrated_psgd_schedule(shape, DPGDParams(batch_size=100), ROWS)
    with pytest.raises(ValueError, match="batch_size"):
        calibrated_psgd_schedule(shape, DPGDParams(budget=R_EXACT), ROWS)


def record_batches(monkeypatch):
    """Wrap the trainer's private_gradient to see the rows of every batch (column 0 holds the row id)."""
    batches, original = [], dp_gd.private_gradient

    def recording(model, w, xb, *args, **kwargs):
        batches.append(xb[:, 0].long().tolist())
        return original(model, w, xb, *args, **kwargs)

    monkeypatch.setattr(dp_gd, "private_gradient", recording)
    return batches


@pytest.mark.parametrize("source", [torch.Generator().manual_seed(5), SECURE], ids=["seeded", "secure"])
def test_psgd_batches_are_poisson(monkeypatch, source):
    rows, batch_size, steps = 200, 20, 300
    q = batch_size / rows
    x = torch.zeros(rows, D, dtype=torch.float64)
    x[:, 0] = torch.arange(rows)
    y = torch.zeros(rows, dtype=torch.float64)
    batches = record_batches(monkeypatch)
    hp = DPGDParams(batch_size=batch_size)
    train_dp_gd(nn.Linear(D, 1).double(), x, y, zero_gradient_loss, PredefinedSchedule((1.0,) * steps), hp, source)
    sizes = np.array([len(b) for b in batches])
    assert len(batches) == steps and all(len(set(b)) == len(b) for b in batches)  # no row twice
    sd = math.sqrt(rows * q * (1 - q))  # Binomial(rows, q) batch sizes
    assert abs(sizes.mean() - rows * q) < 6 * sd / math.sqrt(steps)
    assert 0.6 * sd**2 < sizes.var() < 1.5 * sd**2
    inclusions = np.bincount(np.concatenate(batches), minlength=rows) / steps  # each row ~ Bernoulli(q)
    assert abs(inclusions.mean() - q) < 0.01 and inclusions.min() > 0


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
