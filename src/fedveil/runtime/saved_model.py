"""A finished run's saved model (``model.pt``) evaluated again, optionally customised at test
time to another width (Split-Mix, Alg. 4.1 line 11) without retraining."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from ..data.arrays import ArrayDataset
from ..errors import ConfigError
from ..models.complexity import count_macs, count_params
from ..models.dual_bn import has_dual_bn, with_mix
from ..models.functional import refresh_batch_norm
from ..seeding import torch_generator
from ..training.adversarial import PGD
from .evaluation import evaluate
from .initial_model import initial_params
from .finished_run import final_checkpoint, saved_simulation
from .run_dir import CONFIG_FILE, MODEL_FILE
from .simulation import Simulation


def load_saved_run(run_dir: str | Path, data_root: str | None = None) -> tuple[Simulation, dict]:
    """The run's simulation rebuilt from its ``config.json`` and its final global model."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file() or not (run_dir / MODEL_FILE).is_file():
        raise ConfigError(f"'{run_dir}' is not a finished fedveil run with a global model (needs {CONFIG_FILE} and {MODEL_FILE})")
    sim = saved_simulation(run_dir, data_root)
    return sim, initial_params(sim.init, str(run_dir), [])


def saved_client_states(run_dir: str | Path) -> dict[int, dict]:
    """Every client's state at the end of a finished run (read from its checkpoint, in memory
    or in ``client_states/``, without touching the run)."""
    return final_checkpoint(run_dir)["clients"]


def kept_statistics(run_dir: str | Path) -> dict[int, dict]:
    """Each client's own BN statistics at the end of the run (Table C.3's "locally tracked":
    kept by the client for what it trained); a clear error for a run whose clients kept none."""
    states = saved_client_states(run_dir)
    if not any("buffers" in s for s in states.values()):
        raise ConfigError("--local-bn needs a run whose clients kept their BN statistics (algorithm.buffers = \"local\")")
    return {cid: s.get("buffers", {}) for cid, s in states.items()}


def locally_tracked(sim: Simulation, kept: dict[int, dict], params: dict) -> list[dict]:
    """``params`` with each client's ``kept`` statistics (the global ones where it kept none)."""
    return [{**params, **kept.get(cid, {})} for cid in range(sim.data.num_clients)]


def evaluate_saved(
    run_dir: str | Path, widths: Sequence[float | None] | str = (None,), data_root: str | None = None, *,
    lams: Sequence[float | None] = (None,), attack: PGD | None = None, refresh_bn: int = 0, local_bn: bool = False,
) -> list[dict[str, Any]]:
    """Per width and dual-BN mix: pooled-test metrics of the run's global model, its parameter
    count and MACs per example. A width ``None`` is the model as the run evaluated it; a
    number is the model customised to that width (algorithms with ``predict_at``); ``"all"``
    every width offered. A ``lam`` mixes every dual BN (Eq. 4.2; models with a ``dual_``
    norm). With ``attack``, also ``robust_accuracy``: accuracy on PGD examples made against
    the same customised model (the paper's RA). ``refresh_bn`` > 0 scores "post average"
    instead (Table C.3, the reference code's protocol): for each client, the running BN
    statistics re-estimated with that many passes over its own training rows, then its test
    rows scored (those of its domain when the test set is shared); the metrics are the mean
    over clients. ``local_bn`` scores "locally tracked" the same way, each client with the BN
    statistics it kept (runs with ``algorithm.buffers = "local"``)."""
    sim, params = load_saved_run(run_dir, data_root)
    algorithm, name, model = sim.algorithm, sim.config.algorithm.name, sim.trainer.model
    if refresh_bn > 0 and not any(m.track_running_stats for m in model.modules()
                                  if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)):
        raise ConfigError("--refresh-bn: the model has no BatchNorm with running statistics to refresh (use a *_tracked norm)")
    if widths == "all" or any(w is not None for w in widths):
        if not hasattr(algorithm, "predict_at"):
            raise ConfigError(f"algorithm '{name}' has no test-time width (split_mix has)")
    if any(lam is not None for lam in lams) and not has_dual_bn(model):
        raise ConfigError("--lam mixes dual batch norms: the run's model has none (train with model.options.norm = \"dual_...\")")
    if widths == "all":
        widths = algorithm.widths()
    modules = {width: model if width is None else algorithm.model_at(width) for width in widths}  # refuses unserved widths
    states = {lam: params if lam is None else with_mix(params, lam) for lam in lams}
    # post average: each client's refreshed statistics, once per mix (every width slices them)
    refreshed = {lam: refreshed_per_client(sim, state, refresh_bn) for lam, state in states.items()} if refresh_bn > 0 else {}
    if local_bn:
        kept = kept_statistics(run_dir)  # read once, then laid over every mix
        refreshed = {lam: locally_tracked(sim, kept, state) for lam, state in states.items()}
    rows = []
    for width in widths:
        module = modules[width]
        if width is None:
            predict = algorithm.predict
        else:
            def predict(_model, state, x, width=width):
                return algorithm.predict_at(state, x, width)

        for lam, state in states.items():
            if refresh_bn > 0 or local_bn:
                metrics = post_average(sim, refreshed[lam], predict)
            else:
                metrics = evaluate(model, state, sim.data.test, sim.data.task, sim.config.eval.batch_size, predict=predict)
            if attack is not None:
                metrics["robust_accuracy"] = robust_accuracy(
                    lambda x, state=state, predict=predict: predict(model, state, x), sim.data.test, attack,
                    sim.config.eval.batch_size, torch_generator(sim.config.seed, "robust-eval"),
                )
            rows.append({"width": width, "lam": lam, **metrics, "params": count_params(module),
                         "macs": count_macs(module, sim.data.input_shape)})
    return rows


def refreshed_per_client(sim: Simulation, params: dict, passes: int) -> list[dict]:
    """``params`` with the BN statistics each client re-estimates on its own training rows."""
    states = []
    for client in sim.data.clients:
        x, size = client.train.x, sim.config.client.batch_size or len(client.train)
        batches = [x[i : i + size] for _ in range(passes) for i in range(0, len(x), size) if len(x[i : i + size]) > 1]
        states.append(refresh_batch_norm(sim.trainer.model, params, batches))
    return states


def post_average(sim: Simulation, client_states: list[dict], predict) -> dict[str, float]:
    """Mean over clients of their test metrics, each with its own refreshed BN statistics."""
    per_client = [
        evaluate(sim.trainer.model, state, client_test_rows(sim, client), sim.data.task, sim.config.eval.batch_size,
                 predict=predict)
        for client, state in zip(sim.data.clients, client_states)
    ]
    return {k: sum(m[k] for m in per_client) / len(per_client) for k in per_client[0] if k != "n"}


def client_test_rows(sim: Simulation, client) -> ArrayDataset:
    """The client's test split, or (a separate shared test set) the test rows of its domain."""
    if len(client.test):
        return client.test
    test, train = sim.data.test, client.train
    if "domain" in test.groups and "domain" in train.groups and len(train.groups["domain"].unique()) == 1:
        return test.subset(test.groups["domain"] == train.groups["domain"][0])
    raise ConfigError("--refresh-bn / --local-bn score each client on its own test rows: this data set gives clients none")


def robust_accuracy(predict, data: ArrayDataset, attack: PGD, batch_size: int, generator: torch.Generator) -> float:
    """Accuracy of ``predict`` on ``attack``'s adversarial version of each test batch."""
    correct = 0
    for start in range(0, len(data), batch_size):
        x, y = data.x[start : start + batch_size], data.y[start : start + batch_size]
        adversarial = attack.attack(predict, x, y, generator)
        with torch.no_grad():
            correct += int((predict(adversarial).argmax(1) == y).sum())
    return correct / len(data)
