"""PGD adversarial training with dual batch normalisation (Split-Mix §4.4.3, App. C.1.2,
Alg. C.1; spec 000 part 2 §A.7), as a train request: no second training loop.

* ``input_fn`` (:class:`PGDPairs`): each step's batch becomes pairs ``(x, x + delta)``,
  ``delta`` the L-inf PGD attack on the current model with its noise BNs, in eval mode,
  without parameter gradients (the reference code's ``ctx_noparamgrad_and_eval``);
* ``model`` (:class:`AdversarialPair`): the clean half through the clean BNs, the
  adversarial half through the noise BNs;
* ``objective`` (:class:`PairLoss`): Eq. (4.1), ``(1 - lambda_n) L(x) + lambda_n L(x + delta)``.

An adversarial example depends only on its own example and the current model, so each
pair's loss is still a per-example loss: DP-SGD clips and accounts pairs as examples
(with a model without batch statistics).

Decision on discrepancy E.3 (PGD step): the reference code's step
``min(1.25 eps, eps + 4/255) / steps`` with a random start, which produced the paper's
numbers, rather than the thesis's 2/255 (``step_size`` overrides it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..models.dual_bn import conditioned, routed
from ..models.functional import forward, submodule_forward
from ..params import Params
from ..privacy.randomness import uniform
from .request import Batch, Objective


@dataclass(frozen=True)
class PGD:
    """L-inf projected gradient descent on the summed cross-entropy, inputs kept in [0, 1]."""

    eps: float = 8 / 255
    steps: int = 7
    step_size: float | None = None  # default: the reference code's min(1.25 eps, eps + 4/255) / steps
    random_start: bool = True

    def __post_init__(self) -> None:
        if not self.eps > 0 or self.steps < 1 or (self.step_size is not None and not self.step_size > 0):
            raise ValueError(f"PGD needs eps > 0, steps >= 1 and step_size > 0, got {self}")

    @property
    def step(self) -> float:
        """The step size: ``step_size`` if given, else ``min(1.25 eps, eps + 4/255) / steps``."""
        if self.step_size is not None:
            return self.step_size
        return min(1.25 * self.eps, self.eps + 4 / 255) / self.steps

    def attack(self, predict: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor,
               generator: torch.Generator) -> torch.Tensor:
        """``x + delta`` with ``||delta||_inf <= eps`` raising ``sum CE(predict(x + delta), y)``;
        the random start draws from ``generator``. Outputs ``(N, K, C)`` (several bases) sum
        the loss over K."""
        delta = torch.zeros_like(x)
        if self.random_start:
            delta = (2 * uniform(x.numel(), generator, x.dtype, x.device).view(x.shape) - 1) * self.eps
            delta = (x + delta).clamp(0, 1) - x
        for _ in range(self.steps):
            delta = delta.detach().requires_grad_(True)
            with torch.enable_grad():
                out = predict(x + delta)
                loss = _summed_ce(out, y)
                (grad,) = torch.autograd.grad(loss, delta)
            delta = (delta + self.step * grad.sign()).clamp(-self.eps, self.eps)
            delta = (x + delta).clamp(0, 1) - x
        return (x + delta).detach()


def _summed_ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if out.dim() == 3:  # (N, K, C): one attack against K bases at once
        return sum(F.cross_entropy(out[:, k], y, reduction="sum") for k in range(out.shape[1]))
    return F.cross_entropy(out, y, reduction="sum")


class AdversarialPair(nn.Module):
    """``forward(x2)`` for pairs ``x2 (N, 2, ...)``: ``(N, 2, ...)`` outputs, the clean half
    through the clean BNs, the adversarial half through the noise BNs (Alg. C.1 lines 5-7)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        """``(N, 2, ...)`` outputs of the clean halves (clean BNs) and the adversarial halves (noise BNs)."""
        with routed(self.net, "clean"):
            clean = self.net(pairs[:, 0])
        with routed(self.net, "noise"):
            adversarial = self.net(pairs[:, 1])
        return torch.stack([clean, adversarial], dim=1)


@dataclass(frozen=True)
class PairLoss(Objective):
    """Eq. (4.1): ``(1 - lam) inner(clean outputs) + lam inner(adversarial outputs)``."""

    inner: Objective
    lam: float

    def mean(self, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``(1 - lam)`` times ``inner`` on the clean outputs plus ``lam`` times it on the adversarial ones."""
        return (1 - self.lam) * self.inner.mean(out[:, 0], batch) + self.lam * self.inner.mean(out[:, 1], batch)


@dataclass(frozen=True)
class PGDPairs:
    """``TrainRequest.input_fn``: a batch of ``x`` becomes pairs ``(x, PGD(x))`` against the
    current state of ``pair.net`` with its noise BNs, in eval mode."""

    pair: AdversarialPair
    attack: PGD

    def __call__(self, state: Params, batch: Batch, generator: torch.Generator) -> Batch:
        net = self.pair.net
        own = {k[len("net."):]: v.detach() for k, v in state.items() if k.startswith("net.")}

        def predict(x: torch.Tensor) -> torch.Tensor:
            with routed(net, "noise"):
                return forward(net, own, x)

        adversarial = self.attack.attack(predict, batch.x, batch.y, generator)
        return Batch(torch.stack([batch.x, adversarial], dim=1), batch.y, batch.groups)


# ---------------------------------------------------------------------------- per-base attacks


class PerBasePair(nn.Module):
    """Split-Mix's adversarial pairs with one attack per base (the reference code): inputs
    ``(N, 1 + M, ...)``, the clean rows and one adversarial copy per base; outputs ``(N, 2, M, C)``,
    every base on the clean rows (clean BNs) and base k on its own copy (noise BNs)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """``(N, 2, M, C)``: every base on the clean rows, then base k on its own adversarial copy."""
        with routed(self.net, "clean"):
            clean = self.net(rows[:, 0])
        with routed(self.net, "noise"):
            adversarial = torch.stack([base(rows[:, 1 + k]) for k, base in enumerate(self.net.bases)], dim=1)
        return torch.stack([clean, adversarial], dim=1)


@dataclass(frozen=True)
class PerBasePGDPairs:
    """``TrainRequest.input_fn``: a batch of ``x`` becomes ``(x, PGD_0(x), ..., PGD_{M-1}(x))``,
    ``PGD_k`` the attack on base k alone with its noise BNs (M times the cost of one attack)."""

    pair: PerBasePair
    attack: PGD

    def __call__(self, state: Params, batch: Batch, generator: torch.Generator) -> Batch:
        net = self.pair.net
        own = {k[len("net."):]: v.detach() for k, v in state.items() if k.startswith("net.")}
        copies = [batch.x]
        for k in range(len(net.bases)):
            def predict(x: torch.Tensor, k: int = k) -> torch.Tensor:
                with routed(net, "noise"):
                    return submodule_forward(net, f"bases.{k}", own, x)

            copies.append(self.attack.attack(predict, batch.x, batch.y, generator))
        return Batch(torch.stack(copies, dim=1), batch.y, batch.groups)


# ---------------------------------------------------------------------------- OAT

OAT_LAMBDA = "oat_lambda"


class OATPair(nn.Module):
    """Once-for-All Adversarial Training's pair forward (Wang et al. NeurIPS 2020; Split-Mix's
    FedAvg+OAT baseline): both halves through the network conditioned on the step's lambda
    (``groups[OAT_LAMBDA]``; FiLM dual BNs, :func:`~fedveil.models.dual_bn.conditioned`)."""

    takes_groups = True

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, pairs: torch.Tensor, groups: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """``(N, 2, ...)`` outputs of both halves, conditioned on ``groups[OAT_LAMBDA]`` (0 without it)."""
        lam = float(groups[OAT_LAMBDA][0]) if groups and OAT_LAMBDA in groups else 0.0
        with conditioned(self.net, lam):
            return torch.stack([self.net(pairs[:, 0]), self.net(pairs[:, 1])], dim=1)


@dataclass(frozen=True)
class OATPairLoss(Objective):
    """Eq. (4.1) with the step's lambda: ``(1 - lam) inner(clean) + lam inner(adversarial)``."""

    inner: Objective

    def mean(self, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Eq. (4.1) with ``lam`` read from the batch's ``OAT_LAMBDA`` group."""
        lam = float(batch.groups[OAT_LAMBDA][0])
        return (1 - lam) * self.inner.mean(out[:, 0], batch) + lam * self.inner.mean(out[:, 1], batch)


@dataclass(frozen=True)
class OATPairs:
    """``TrainRequest.input_fn``: draws the step's lambda uniformly from ``lams`` (the
    client's generator), then pairs ``(x, PGD(x))`` against the network conditioned on it
    (for lambda = 0 the adversarial half has no weight and is ``x`` itself)."""

    pair: OATPair
    attack: PGD
    lams: tuple[float, ...]

    def __call__(self, state: Params, batch: Batch, generator: torch.Generator) -> Batch:
        lam = self.lams[int(torch.randint(len(self.lams), (1,), generator=generator, device=generator.device))]
        net = self.pair.net
        own = {k[len("net."):]: v.detach() for k, v in state.items() if k.startswith("net.")}

        def predict(x: torch.Tensor) -> torch.Tensor:
            with conditioned(net, lam):
                return forward(net, own, x)

        adversarial = batch.x if lam == 0 else self.attack.attack(predict, batch.x, batch.y, generator)
        groups = {**batch.groups, OAT_LAMBDA: torch.full((len(batch.y),), lam, device=batch.x.device)}
        return Batch(torch.stack([batch.x, adversarial], dim=1), batch.y, groups)


def adversarial_request(net: nn.Module, inner: Objective, lam: float, attack: PGD,
                        pair: nn.Module | None = None, oat_lams: tuple[float, ...] | None = None,
                        per_base: bool = False) -> dict[str, Any]:
    """The ``model`` / ``objective`` / ``input_fn`` of an adversarial training of ``net``
    (pass a built ``pair`` to reuse it across calls, so that requests stack together). With
    ``oat_lams``, OAT: lambda drawn per step from them (``lam`` unused); with ``per_base``
    (an ensemble ``net``), one attack per base."""
    if per_base:
        pair = PerBasePair(net) if pair is None else pair
        return {"model": pair, "objective": PairLoss(inner, lam), "input_fn": PerBasePGDPairs(pair, attack)}
    if oat_lams is not None:
        pair = OATPair(net) if pair is None else pair
        return {"model": pair, "objective": OATPairLoss(inner), "input_fn": OATPairs(pair, attack, tuple(oat_lams))}
    pair = AdversarialPair(net) if pair is None else pair
    return {"model": pair, "objective": PairLoss(inner, lam), "input_fn": PGDPairs(pair, attack)}


def prefixed(state: Params, prefix: str = "net.") -> Params:
    """``state`` with ``prefix`` put before every key (a network's state as its pair's)."""
    return {prefix + k: v for k, v in state.items()}


def unprefixed(state: Params, prefix: str = "net.") -> Params:
    """The entries of ``state`` whose keys start with ``prefix``, with it stripped (undoes :func:`prefixed`)."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
