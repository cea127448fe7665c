"""``fedveil pets``: the PETs Prize pandemic-forecasting pipeline (:mod:`fedveil.pets`) run from a
TOML config, into a run directory with a summary and a plot, like every other method.

The config names the data (the challenge's CSV tables in a folder, or the synthetic
stand-in generated from a seed and written into the run directory), the pipeline
(``centralised``, ``mrmtl``, ``local`` or ``sir_baseline``) and DP-SGD's settings. The run
directory holds ``config.json``, ``summary.json`` (average precision, recall and F1, pooled
and per silo, and Theorem 2.4.4's node-level figures labelled as what they are: not a
guarantee for this pipeline, docs/pets.md), ``predictions.csv`` and ``precision_recall.png``.
"""
from __future__ import annotations

import csv
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationError, model_validator
from sklearn.metrics import precision_recall_curve

from ..config import Section, apply_dotted_overrides
from ..config_file import read_config_file
from ..errors import ConfigError, format_validation_error
from ..pets import pipeline
from ..pets.csv_io import read_csv_tables, write_csv_tables
from ..pets.logreg import TrainConfig
from ..pets.synthetic import SyntheticConfig, synthetic_pandemic
from ..pets.tables import PandemicTables
from .plots import finish_axes, new_figure, save

METHODS = ("centralised", "mrmtl", "local", "sir_baseline")
NOT_A_GUARANTEE = "Theorem 2.4.4 under its assumptions, which this pipeline does not meet: not a guarantee"


class PetsSynthetic(Section):
    """The synthetic stand-in for the challenge's population (``fedveil.pets.synthetic``)."""

    num_people: int = Field(4000, ge=10, description="people in the synthetic population")
    num_regions: int = Field(3, ge=1, description="regions, one silo each")
    seed: int = Field(0, description="seed of the population and its outbreak")


class PetsData(Section):
    """Where the tables come from: a folder of the challenge's CSV files, or the stand-in."""

    dir: str | None = Field(None, description="folder of the challenge's CSV tables (relative to the config file)")
    synthetic: PetsSynthetic | None = Field(None, description="generate the synthetic stand-in instead")

    @model_validator(mode="after")
    def _one_source(self) -> "PetsData":
        if (self.dir is None) == (self.synthetic is None):
            raise ValueError("give exactly one of data.dir (CSV tables) and data.synthetic")
        return self


class PetsPipeline(Section):
    """Which pipeline, over how many neighbours, rounds and epochs (docs/pets.md)."""

    method: Literal["centralised", "mrmtl", "local", "sir_baseline"] = Field(
        "mrmtl", description="centralised, mrmtl (federated MR-MTL), local (MR-MTL at lambda 0) or sir_baseline"
    )
    num_neighbours: int = Field(20, ge=1, description="S_1, contacts sampled per person")
    max_occurrences: int | None = Field(None, ge=1, description="cap on the neighbourhoods one person is in")
    central_epochs: int = Field(2, ge=0, description="epochs of the centralised model")
    rounds: int = Field(2, ge=0, description="MR-MTL rounds")
    local_epochs: int = Field(1, ge=0, description="epochs per silo per round")
    mrmtl_lambda: float = Field(0.0006, ge=0.0, description="MR-MTL's lambda (thesis convention)")
    seed: int = Field(1234, description="seed of the example windows and of DP-SGD")


class PetsTrain(Section):
    """DP-SGD of the logistic model (defaults: the final submission's, [C2])."""

    batch_size: int = Field(512, ge=1)
    lr: float = Field(0.2, gt=0.0)
    clip: float = Field(15.0, gt=0.0)
    noise_multiplier: float = Field(0.01, ge=0.0)
    gamma: float = Field(2.0, ge=0.0, description="focal loss gamma (0 with alpha none: plain BCE)")
    alpha: float | None = Field(0.75, ge=0.0, le=1.0, description="focal loss alpha")


class PetsConfig(Section):
    """A ``fedveil pets`` config: the data, the pipeline and DP-SGD's settings."""

    data: PetsData
    pipeline: PetsPipeline = Field(default_factory=PetsPipeline)
    train: PetsTrain = Field(default_factory=PetsTrain)

    def pipeline_config(self) -> pipeline.PipelineConfig:
        """The :class:`~fedveil.pets.pipeline.PipelineConfig` of this config (lambda 0 for ``local``)."""
        p = self.pipeline
        lam = 0.0 if p.method == "local" else p.mrmtl_lambda
        return pipeline.PipelineConfig(
            num_neighbours=p.num_neighbours, train=TrainConfig(**self.train.model_dump()), central_epochs=p.central_epochs,
            rounds=p.rounds, local_epochs=p.local_epochs, mrmtl_lambda=lam, seed=p.seed,
        )


def load_pets_config(path: str | Path, overrides: list[str] | None = None) -> PetsConfig:
    """A PETs config from its TOML file and ``section.key=value`` overrides, or ConfigError."""
    raw = apply_dotted_overrides(read_config_file(path), overrides or [])
    try:
        return PetsConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, model=PetsConfig)) from None


def run_pets(config: PetsConfig, out: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run the configured pipeline into run directory ``out`` (refused if it holds a finished
    run); returns the summary."""
    out = Path(out)
    if (out / "summary.json").exists():
        raise ConfigError(f"{out} holds a finished PETs run; choose another --out")
    started = time.perf_counter()
    tables = _tables(config.data)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config.model_dump(mode="json"), indent=2) + "\n")
    if config.data.synthetic is not None:  # the stand-in, kept beside the run as the challenge's CSV files
        write_csv_tables(tables, out / "data")
    central, silos = pipeline.prepare(tables, config.pipeline.num_neighbours, progress, config.pipeline.max_occurrences)
    cfg = config.pipeline_config()
    method = config.pipeline.method
    if method == "centralised":
        result = pipeline.run_centralised(central, cfg, progress)
    elif method == "sir_baseline":
        result = pipeline.run_sir_baseline(silos)
    else:
        result = pipeline.run_federated(silos, cfg, progress, name=method)
    summary = _summary(config, result, time.perf_counter() - started)
    _write_predictions(result, out / "predictions.csv")
    plot_precision_recall(result, out / "precision_recall.png", f"PETs pandemic forecasting: {method}")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _tables(data: PetsData) -> PandemicTables:
    """The configured tables, read or generated before anything is written."""
    if data.synthetic is None:
        if not Path(data.dir).is_dir():
            raise ConfigError(f"data.dir '{data.dir}' is not a folder of the challenge's CSV tables")
        try:
            return read_csv_tables(data.dir)
        except FileNotFoundError as err:
            raise ConfigError(f"data.dir: {err}") from None
    options = data.synthetic
    return synthetic_pandemic(SyntheticConfig(num_people=options.num_people, num_regions=options.num_regions, seed=options.seed))


def _metrics(metrics: pipeline.Metrics) -> dict[str, Any]:
    return {**asdict(metrics), "random_ap": metrics.positive_rate}


def _summary(config: PetsConfig, result: pipeline.PipelineResult, seconds: float) -> dict[str, Any]:
    silos = []
    for silo in result.silos:
        row = {"silo": silo.name, "num_people": silo.num_people, "steps": silo.steps, **_metrics(silo.metrics)}
        if silo.thm244:
            row["thm244_node_epsilon"] = {key: value.epsilon for key, value in silo.thm244.items()}
            row["thm244_delta"] = {key: value.delta for key, value in silo.thm244.items()}
        silos.append(row)
    summary = {
        "method": config.pipeline.method, "data": "synthetic_pandemic" if config.data.synthetic else "csv tables",
        **_metrics(result.metrics), "silos": silos, "wall_time_s": seconds,
        "noise_multiplier": config.train.noise_multiplier,
    }
    if any(s.thm244 for s in result.silos):
        summary["thm244_note"] = NOT_A_GUARANTEE
    return summary


def _write_predictions(result: pipeline.PipelineResult, path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["silo", "risk", "infected"])
        for silo in result.silos:
            writer.writerows((silo.name, f"{p:.6g}", int(y)) for p, y in zip(silo.probs, silo.labels))


def plot_precision_recall(result: pipeline.PipelineResult, path: Path, title: str) -> Path:
    """Precision-recall curves (precision on a log scale: infections are rare): every silo's
    and the pooled one, with the AP of each and of a random guess (the positive rate)."""
    fig = new_figure(6.0, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    curves = [(s.name, s.probs, s.labels) for s in result.silos]
    if len(curves) > 1:
        curves.append(("pooled", np.concatenate([s.probs for s in result.silos]), np.concatenate([s.labels for s in result.silos])))
    for name, probs, labels in curves:
        if labels.sum() == 0:
            continue
        precision, recall, _ = precision_recall_curve(labels, probs)
        ap = pipeline.Metrics.of(probs, labels).ap
        ax.plot(recall, precision, lw=2.2 if name == "pooled" else 1.2, label=f"{name} (AP {ap:.3f})")
    pooled = result.metrics
    ax.set_xlabel("recall")
    ax.set_xlim(0, 1)
    if pooled.positives:
        ax.axhline(pooled.positive_rate, color="grey", ls=":", label=f"random guess ({pooled.positive_rate:.4f})")
        ax.set_ylabel("precision (log scale)")
        ax.set_yscale("log")  # positives are rare: precision lives near the positive rate
        ax.set_ylim(max(pooled.positive_rate / 3, 1e-5), 1.05)
    else:
        ax.set_ylabel("precision")
        title += " (no infections in the hidden week: nothing to rank)"
    ax.set_title(title)
    finish_axes(ax)
    return save(fig, path)
