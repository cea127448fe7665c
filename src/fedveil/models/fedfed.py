"""FedFed's feature-distillation network (Yang et al. NeurIPS 2023 §3.2, Alg. 1; spec 003
§1.3-1.5): a small beta-VAE generator q(x; theta) and a classifier f(.; w) trained together.

The generator splits each input (pixels in [0, 1]) into a performance-robust part
``x_r = q(x)`` (the VAE's reconstruction, kept on the client) and a performance-sensitive
part ``x_s = x - x_r``, clipped per record to ``||x_s|| <= rho ||x||`` (the paper's bound,
§3.3; the official code has none). Eq. 9 trains f on the noisy sensitive part
``x_s + sigma n``; the code also trains f on x. ``forward(x, groups)`` returns

    (f(x), f(x_s + sigma n), x_r, mu, logvar)

so the objective (:class:`~fedveil.algorithms.fedfed.DistillationLoss`) can form every loss
term; evaluation reads the first output, the classifier on raw inputs. In training the
reparameterisation draws and the noise come from the batch's groups (``VAE_EPS``,
``NOISE``: standard normals drawn by the algorithm from the client's generator); without
them (evaluation, the release) ``z = mu`` and no noise is added. BatchNorm keeps running
statistics, averaged like parameters (no DP-SGD in phase 1: the paper trains the generator
on raw data, see ``docs/fedfed.md``).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .zoo import MODELS, num_outputs

VAE_EPS, NOISE = "fedfed_vae_eps", "fedfed_noise"


def clip_to_fraction(x_s: torch.Tensor, x: torch.Tensor, rho: float) -> torch.Tensor:
    """``x_s * min(1, rho ||x|| / ||x_s||)`` per row: ``||x_s|| <= rho ||x||`` (§3.3)."""
    norm_s = x_s.flatten(1).norm(dim=1)
    bound = rho * x.flatten(1).norm(dim=1)
    scale = torch.where(norm_s > bound, bound / norm_s.clamp(min=torch.finfo(x_s.dtype).tiny), torch.ones_like(norm_s))
    return x_s * scale.view(-1, *([1] * (x_s.dim() - 1)))


class FeatureDistiller(nn.Module):
    """Encoder (2 strided convs of ``width``, ``2 width`` channels) -> mu, logvar -> decoder (2
    transposed convs, sigmoid) and a classifier (2 conv-pool stages of ``2 width``, ``4 width``
    channels, global average, linear); see the module docstring."""

    takes_groups = True

    def __init__(self, channels: int, size: int, num_classes: int, latent: int, width: int, rho: float,
                 sigma: float) -> None:
        super().__init__()
        self.rho, self.sigma, self.shape = rho, sigma, (channels, size, size)
        feat = (2 * width, size // 4, size // 4)
        flat = math.prod(feat)
        self.encoder = nn.Sequential(
            nn.Conv2d(channels, width, 4, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 4, 2, 1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.Flatten(),
        )
        self.mu, self.logvar = nn.Linear(flat, latent), nn.Linear(flat, latent)
        self.decoder = nn.Sequential(
            nn.Linear(latent, flat), nn.Unflatten(1, feat),
            nn.ConvTranspose2d(2 * width, width, 4, 2, 1, bias=False), nn.BatchNorm2d(width), nn.LeakyReLU(0.2),
            nn.ConvTranspose2d(width, channels, 4, 2, 1), nn.Sigmoid(),
        )
        self.classifier = nn.Sequential(
            nn.Conv2d(channels, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, num_classes),
        )

    def split(self, x: torch.Tensor, vae_eps: torch.Tensor | None = None):
        """``(x_r, x_s, mu, logvar)``: reconstruction, clipped residual, posterior moments."""
        h = self.encoder(x)
        mu, logvar = self.mu(h), self.logvar(h).clamp(-20, 20)
        z = mu if vae_eps is None else mu + torch.exp(0.5 * logvar) * vae_eps
        x_r = self.decoder(z)
        return x_r, clip_to_fraction(x - x_r, x, self.rho), mu, logvar

    def forward(self, x: torch.Tensor, groups: dict[str, torch.Tensor] | None = None):
        """``(f(x), f(x_s + sigma n), x_r, mu, logvar)``,
        reparameterised and noised by the batch's groups when given."""
        groups = groups or {}
        x_r, x_s, mu, logvar = self.split(x, groups.get(VAE_EPS))
        noisy = x_s + self.sigma * groups[NOISE] if NOISE in groups else x_s
        return self.classifier(x), self.classifier(noisy), x_r, mu, logvar


@MODELS.register("fedfed_vae", "FedFed feature distiller: small conv beta-VAE generator + CNN classifier")
def fedfed_vae(
    input_shape: tuple, num_classes: int, latent: int = 64, width: int = 16, rho: float = 0.5, sigma: float = 0.15,
) -> nn.Module:
    """For square images whose side is a multiple of 4 (e.g. 1x28x28, 3x32x32); ``rho`` is
    the per-record bound ``||x_s|| <= rho ||x||``, ``sigma`` the std of the noise the
    classifier sees in training (the released features' noise is the algorithm's)."""
    if len(input_shape) != 3:
        raise ValueError(f"fedfed_vae needs images of shape (C, H, W), got {input_shape}")
    c, h, w = input_shape
    if h != w or h % 4:
        raise ValueError(f"fedfed_vae needs square images with a side divisible by 4, got {h}x{w}")
    if not 0 < rho <= 1 or sigma < 0:
        raise ValueError(f"need 0 < rho <= 1 and sigma >= 0, got rho={rho}, sigma={sigma}")
    for option, value in (("latent", latent), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{option} must be an int >= 1, got {value!r}")
    return FeatureDistiller(c, h, num_outputs(num_classes), latent, width, rho, sigma)
