"""A finished run's saved model (``model.pt``) evaluated again, optionally customised at test
time to another width (Split-Mix, Alg. 4.1 line 11) without retraining."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..config import validate
from ..errors import ConfigError
from ..models.complexity import count_macs, count_params
from .evaluation import evaluate
from .initial_model import initial_params
from .run_dir import CONFIG_FILE, MODEL_FILE, read_json
from .simulation import Simulation


def load_saved_run(run_dir: str | Path, data_root: str | None = None) -> tuple[Simulation, dict]:
    """The run's simulation rebuilt from its ``config.json`` and its final global model."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file() or not (run_dir / MODEL_FILE).is_file():
        raise ConfigError(f"'{run_dir}' is not a finished fedveil run with a global model (needs {CONFIG_FILE} and {MODEL_FILE})")
    raw = read_json(run_dir / CONFIG_FILE)
    if data_root is not None:
        raw["data"]["root"] = data_root
    sim = Simulation.from_config(validate(raw))
    return sim, initial_params(sim.init, str(run_dir), [])


def evaluate_saved(
    run_dir: str | Path, widths: Sequence[float | None] | str = (None,), data_root: str | None = None
) -> list[dict[str, Any]]:
    """Per width: pooled-test metrics of the run's global model, its parameter count and MACs
    per example. ``None`` is the model as the run evaluated it; a number is the model
    customised to that width (algorithms with ``predict_at``); ``"all"`` every width offered."""
    sim, params = load_saved_run(run_dir, data_root)
    algorithm, name = sim.algorithm, sim.config.algorithm.name
    if widths == "all" or any(w is not None for w in widths):
        if not hasattr(algorithm, "predict_at"):
            raise ConfigError(f"algorithm '{name}' has no test-time width (split_mix has)")
    if widths == "all":
        widths = algorithm.widths()
    rows = []
    for width in widths:
        if width is None:
            predict, module = algorithm.predict, sim.trainer.model
        else:
            module = algorithm.model_at(width)

            def predict(_model, state, x, width=width):
                return algorithm.predict_at(state, x, width)

        metrics = evaluate(sim.trainer.model, params, sim.data.test, sim.data.task, sim.config.eval.batch_size, predict=predict)
        rows.append({"width": width, **metrics, "params": count_params(module), "macs": count_macs(module, sim.data.input_shape)})
    return rows
