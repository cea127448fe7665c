"""What FADE's two unsupervised domain adaptation reproductions share (spec 004 §1.9, §2.2):
source pre-training, the adaptation methods as FADE settings, and target accuracy.

Protocol (the paper and the official code): the source model is trained first on the
source users alone (lambda = 0); adaptation then starts from it with a re-initialised
discriminator (``model.init_from`` + ``model.init_skip = ["disc."]``), the DANN lambda ramp
and learning-rate decay. Every adaptation method is the one FADE module with other
settings:

* ``none``: the adaptation phase without adversary (lambda = 0): the source users keep
  training, the unlabelled target users change nothing. The control for "is the gain
  adaptation or just more source training".
* ``dann`` / ``squared``: FADE-DANN, D on z behind the gradient reversal, vanilla or squared loss.
* ``cdan``: FADE-CDAN, D on ``softmax(f(z)) ⊗ z`` with CDAN's entropy weights.
* ``shot``: FedAvg-SHOT, lambda = 0; target users minimise SHOT's information maximisation
  plus 0.3 x CE on clustering pseudo-labels with the head f frozen (SHOT's own weights,
  Liang et al. 2020: the official FADE code's 0 IM weight is marked "FIXME ad-hoc").
* ``cdan_shot``: CDAN with SHOT's target terms (the "+SHOT" combination of the text).

Target accuracy is transductive, as in the official code: the final global model scored on
every row of the target domain (the target users' unlabelled training rows and the rest).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedveil.data import DATASETS
from fedveil.models.zoo import build_model
from fedveil.runtime.run_dir import MODEL_FILE

EVAL_BATCH = 2048
SHOT_TERMS = {"im_weight": 1.0, "pseudo_label_weight": 0.3, "freeze_head_unlabelled": True}
METHODS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {  # label -> ([algorithm] keys, model options)
    "none": ({"lam": 0.0}, {}),
    "dann": ({"lam": 1.0, "adversarial_loss": "vanilla"}, {}),
    "squared": ({"lam": 1.0, "adversarial_loss": "squared"}, {}),
    "cdan": ({"lam": 1.0, "entropy_weights": True}, {"conditioning": "cdan"}),
    "shot": ({"lam": 0.0, **SHOT_TERMS}, {}),
    "cdan_shot": ({"lam": 1.0, "entropy_weights": True, **SHOT_TERMS}, {"conditioning": "cdan"}),
}
LABELS = {
    "source_only": "Source only", "none": "no adversary", "dann": "FADE-DANN", "squared": "FADE-DANN (squared loss)",
    "cdan": "FADE-CDAN", "shot": "FedAvg-SHOT", "cdan_shot": "FADE-CDAN+SHOT",
}


def adapted(config: dict[str, Any], method: str, pretrained: Path) -> dict[str, Any]:
    """``config`` (the adaptation phase's run, FADE with lambda off) with ``method``'s
    settings, starting from the pre-trained source model with a fresh discriminator."""
    algorithm, options = METHODS[method]
    model = config["model"]
    return {
        **config,
        "algorithm": {**config["algorithm"], **algorithm},
        "model": {**model, "options": {**model.get("options", {}), **options},
                  "init_from": str(pretrained), "init_skip": ["disc."]},
    }


def target_rows(data: dict[str, Any], target_domain: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row (x, y) of the target domain of the data set a run config names."""
    source = DATASETS.get(data["name"])(data.get("root"), download=data.get("download", True), **data.get("options", {}))
    rows = source.train.groups["domain"] == target_domain
    return source.train.x[rows], source.train.y[rows]


def accuracy(run_dir: Path, config: dict[str, Any], num_classes: int, x: torch.Tensor, y: torch.Tensor) -> float:
    """Accuracy of the run's final global model (its ``model.pt``) on ``(x, y)``: the task head's argmax."""
    model = build_model(config["model"]["name"], tuple(x.shape[1:]), num_classes, **config["model"].get("options", {}))
    model.load_state_dict(torch.load(run_dir / MODEL_FILE, weights_only=True))
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), EVAL_BATCH):
            logits = model(x[i : i + EVAL_BATCH])[0]
            correct += int((logits.argmax(1) == y[i : i + EVAL_BATCH]).sum())
    return correct / len(x)
