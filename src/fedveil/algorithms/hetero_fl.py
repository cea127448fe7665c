"""HeteroFL (Diao et al., ICLR 2021) and SHeteroFL, Split-Mix's width-sliced baselines
(spec 000 part 2 §A.8, reference code notes §1.2).

One x1 model; the sub-model of width w is the same architecture with ``int(w c)`` channels
in every hidden layer, whose parameters are the **leading block** of each x1 tensor (the
first channels of every dimension; the image's channels and the class outputs are whole).

* **HeteroFL**: client k trains the sub-model of its budget R_k.
* **SHeteroFL** (slimmable training): client k trains every width of ``budgets`` up to R_k
  at once: each batch goes through each width, the losses are summed, one step (the
  nested sub-models share their leading blocks).
* **Aggregation**: entry by entry, the |D_k|-weighted mean over the clients whose
  sub-model holds the entry; entries nobody trained keep their value.
* **Test time**: the sub-model of ``test_width`` (any width: ``predict_at``).

With the Scaler (``rescale_layer``) a width-w sub-model divides its layers' outputs by w in
training, HeteroFL's static scaler. The SHeteroFL model slices its parameters inside its
forward, which the stacked engine cannot trace: the vectorized executor trains its clients
one by one (same numbers).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from .. import params as P
from ..errors import ConfigError
from ..models.ensemble import BaseEnsemble
from ..models.functional import forward, parameter_names
from .base import ALGORITHMS, Algorithm, ClientResult, ClientTask, RunContext, State
from .budgets import BudgetParams, client_budgets
from .split_mix import PerBaseLoss


class HeteroFLParams(BudgetParams):
    """Budgets (each client's sub-model width), test width and weighting."""


def sliced(params: P.Params, model: nn.Module) -> P.Params:
    """The leading blocks of ``params`` that form ``model``'s state (a narrower sub-model)."""
    shapes = {n: t.shape for n, t in (*model.named_parameters(), *model.named_buffers())}
    return {n: params[n][P.corner(shape)] for n, shape in shapes.items()}


class Slimmable(nn.Module):
    """Nested sub-models trained together (SHeteroFL): ``forward`` returns ``(N, W, C)``, the
    logits of the widest net (whose parameters this module holds) and of each narrower
    architecture run on the leading blocks of those parameters."""

    def __init__(self, widest: nn.Module, narrower: list[nn.Module]) -> None:
        super().__init__()
        self.net = widest
        self._narrower = narrower  # a plain list: their own tensors are never used

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, W, C)``: the logits of each narrower width on the leading blocks, then of the widest net."""
        if not self._narrower:  # HeteroFL: a plain forward, which the stacked engine can trace
            return self.net(x).unsqueeze(1)
        state = {**dict(self.net.named_parameters()), **dict(self.net.named_buffers())}
        outs = [functional_call(net, sliced(state, net), (x,)) for net in self._narrower]
        return torch.stack([*outs, self.net(x)], dim=1)

    def train(self, mode: bool = True) -> "Slimmable":
        """Sets the mode of the narrower nets as well as of this module."""
        for net in self._narrower:
            net.train(mode)
        return super().train(mode)


@ALGORITHMS.register("heterofl", "HeteroFL: each client trains the width-sliced sub-model of its budget")
class HeteroFL(Algorithm):
    """HeteroFL; see the module docstring."""

    Params = HeteroFLParams
    public_metrics = ("width_trained", "params_uploaded")  # set by the client's budget
    signal_labels = {"width_trained": "width trained (client mean)", "params_uploaded": "parameters uploaded per client"}
    submodel_messages = True  # each client uploads the slice its width trained
    slimmable = False

    def __init__(self, params: HeteroFLParams, ctx: RunContext) -> None:
        super().__init__(params, ctx)
        if isinstance(ctx.trainer.model, BaseEnsemble):
            raise ConfigError(f"algorithm '{self.name}' slices one x1 model: leave model.options.bases at 1")
        self.budgets = client_budgets(params, ctx.num_clients, [0.125 * (i + 1) for i in range(8)])
        self.nets = {w: self._net(w) for w in sorted({*self.budgets, *params.budgets})}
        if params.test_width is not None:
            self.nets[params.test_width] = self._net(params.test_width)
        self.objective = PerBaseLoss(ctx.trainer.loss_fn)
        self.trainees = {w: self._trainee(w) for w in set(self.budgets)}

    @property
    def name(self) -> str:
        """``"sheterofl"`` or ``"heterofl"``, as errors name the algorithm."""
        return "sheterofl" if self.slimmable else "heterofl"

    def _net(self, width: float) -> nn.Module:
        """The architecture of the width-``width`` sub-model; widths are fractions of the
        configured x1 model, whose builder width is ``model.options.width`` (normally 1)."""
        full_width = getattr(self.ctx.model_factory, "options", {}).get("width", 1.0)
        try:
            net = self.ctx.model_factory(width=width * full_width)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{self.name}: the model has no sub-model of width {width:g} ({err})") from None
        full = dict(self.ctx.trainer.model.named_parameters())
        for n, t in net.named_parameters():
            if n not in full or any(a > b for a, b in zip(t.shape, full[n].shape)):
                raise ConfigError(f"{self.name}: parameter '{n}' of the width-{width:g} model is not a block of the x1 model")
        return net

    def _trainee(self, budget: float) -> nn.Module:
        """The module client of ``budget`` trains: its sub-model, or (SHeteroFL) every width
        of the budget list up to it, stacked as outputs."""
        if not self.slimmable:
            return Slimmable(self.nets[budget], [])
        narrower = [self.nets[w] for w in sorted(set(self.hp.budgets)) if w < budget]
        return Slimmable(self.nets[budget], narrower)

    def widths(self) -> list[float]:
        """The widths a trained model is served at: the budget widths."""
        return sorted(self.nets)

    # ------------------------------------------------------------------ server
    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """Entry by entry, the weighted mean of the updates whose
        sub-model covers it (:func:`~fedveil.params.corner_mean`)."""
        if not results:
            return server_state
        messages = [m for _, m in results]
        weights = [1.0 if self.hp.weighting == "uniform" else float(m["num_examples"]) for m in messages]
        return {**server_state, "params": P.corner_mean(server_state["params"], [m["delta"] for m in messages], weights)}

    # ------------------------------------------------------------------ client
    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """Trains the leading blocks of the client's budget width
        (SHeteroFL: every width up to it) and sends their delta."""
        budget = self.budgets[task.client_id]
        trainee = self.trainees[budget]
        start = {f"net.{n}": v for n, v in sliced(server_state["params"], trainee.net).items()}
        new, stats = task.trainer.train(
            start, task.data.train, task.generator, task.round, dp=task.dp, model=trainee, objective=self.objective,
        )
        delta = {n[len("net."):]: v for n, v in P.sub(new, start).items()}
        uploaded = sum(v.numel() for n, v in delta.items() if n in set(parameter_names(trainee.net)))
        message = {"delta": delta, "num_examples": task.data.num_train, "steps": stats.steps}
        return ClientResult(message=message, stats=stats, extra_metrics={"width_trained": budget, "params_uploaded": uploaded})

    # ------------------------------------------------------------------ test time
    def predict(self, model: nn.Module, state: P.Params, x: torch.Tensor) -> torch.Tensor:
        """The whole model's logits, or the ``test_width`` sub-model's when set."""
        if self.hp.test_width is None:  # the whole model
            return forward(model, state, x)
        return self.predict_at(state, x, self.hp.test_width)

    def predict_at(self, state: P.Params, x: torch.Tensor, width: float) -> torch.Tensor:
        """Logits of the width-``width`` sub-model (the leading blocks of ``state``)."""
        net = self.model_at(width)
        return forward(net, sliced(state, net), x)

    def model_at(self, width: float) -> nn.Module:
        """The architecture of the width-``width`` sub-model, built once and cached."""
        if width not in self.nets:
            self.nets[width] = self._net(width)
        return self.nets[width]


@ALGORITHMS.register("sheterofl", "SHeteroFL: HeteroFL with slimmable training of every width up to the budget")
class SHeteroFL(HeteroFL):
    """SHeteroFL (Split-Mix's slimmable HeteroFL); see the module docstring."""

    slimmable = True
