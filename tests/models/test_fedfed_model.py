"""FedFed's feature distiller (spec 003 §1.3-1.6): the split is exact (x = x_r + x_s before
the clip), the shared part never exceeds the per-record bound, and with no noise and a bound
that does not bind the shared feature is x - reconstruction exactly."""
from __future__ import annotations

import pytest
import torch

from fedveil.models import build_model, count_params
from fedveil.models.fedfed import NOISE, VAE_EPS
from fedveil.models.functional import forward, model_state

torch.set_num_threads(1)


def net(**options):
    return build_model("fedfed_vae", (1, 28, 28), 10, **options)


def test_the_shared_part_never_exceeds_the_bound():
    torch.manual_seed(0)
    for rho in (0.05, 0.3, 1.0):
        model = net(rho=rho).eval()
        x = torch.rand(16, 1, 28, 28) * torch.rand(16, 1, 1, 1)  # bright and dark images
        x_r, x_s, _, _ = model.split(x)
        assert torch.all(x_s.flatten(1).norm(dim=1) <= rho * x.flatten(1).norm(dim=1) * (1 + 1e-6))
        assert torch.all((x_r >= 0) & (x_r <= 1))


def test_with_no_noise_and_an_unbinding_bound_the_shared_feature_is_x_minus_reconstruction():
    torch.manual_seed(1)
    model = net(rho=1.0, sigma=0.0).eval()
    x = 0.6 + 0.4 * torch.rand(8, 1, 28, 28)  # bright images: ||x - x_r|| <= ||x|| for x_r in [0, 1]
    x_r, x_s, mu, _ = model.split(x)
    assert torch.all((x - x_r).flatten(1).norm(dim=1) <= x.flatten(1).norm(dim=1))  # the bound does not bind
    assert torch.equal(x_s, x - x_r)
    torch.testing.assert_close(x_r + x_s, x)
    # the training forward with zero noise feeds the classifier exactly x_s
    out = model(x, {NOISE: torch.randn_like(x)})
    torch.testing.assert_close(out[1], model.classifier(x - x_r))


def test_training_draws_come_from_the_groups():
    torch.manual_seed(2)
    model = net(sigma=0.2)
    state = model_state(model)
    x = torch.rand(4, 1, 28, 28)
    groups = {VAE_EPS: torch.randn(4, 64), NOISE: torch.randn(4, 1, 28, 28)}
    a = forward(model, state, x, train=True, groups=groups)
    b = forward(model, state, x, train=True, groups=groups)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v)  # same draws, same outputs: no hidden randomness
    c = forward(model, state, x, train=True, groups={**groups, NOISE: torch.randn(4, 1, 28, 28)})
    assert not torch.allclose(a[1], c[1]) and torch.allclose(a[0], c[0])


def test_outputs_and_size():
    model = net()
    logits_x, logits_s, x_r, mu, logvar = model(torch.rand(3, 1, 28, 28))
    assert logits_x.shape == logits_s.shape == (3, 10) and x_r.shape == (3, 1, 28, 28) and mu.shape == logvar.shape == (3, 64)
    # encoder 1*16*16 + 2*16 + 16*32*16 + 2*32; mu, logvar 2 * (1568*64 + 64); decoder 64*1568 + 1568,
    # 32*16*16 + 2*16, 16*1*16 + 1; classifier 1*32*9 + 32 + 32*64*9 + 64 + 64*10 + 10
    expected = (256 + 32 + 8192 + 64) + 2 * (1568 * 64 + 64) + (64 * 1568 + 1568 + 8192 + 32 + 256 + 1) \
        + (288 + 32 + 18432 + 64 + 650)
    assert count_params(model) == expected


def test_bad_shapes_and_options_are_refused():
    with pytest.raises(ValueError, match="divisible by 4"):
        build_model("fedfed_vae", (1, 30, 30), 10)
    with pytest.raises(ValueError, match="rho"):
        net(rho=0.0)
