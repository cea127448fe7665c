"""The worked example of docs/algorithm_hooks.md runs as written, on both executors.

The example's code block is executed against a private algorithm registry (so the demo
algorithm never joins the real one), then one round of a tiny cohort with group labels
is trained serial and vectorized: the results agree and opted-out clients leave the
discriminator bit-identical.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

import fedveil.algorithms.base as base
from fedveil.algorithms.base import ClientTask, RunContext
from fedveil.config import ClientConfig
from fedveil.data.arrays import ArrayDataset
from fedveil.data.federated import ClientData
from fedveil.models.functional import model_state
from fedveil.registry import Registry
from fedveil.runtime.serial import SerialExecutor
from fedveil.runtime.vectorized import VectorizedExecutor
from fedveil.training import LocalTrainer, task_loss

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithm_hooks.md"


def _example_namespace(monkeypatch) -> dict:
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    monkeypatch.setattr(base, "ALGORITHMS", Registry("algorithm"))
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation
    assert base.ALGORITHMS.names() == ["group_adversary_demo"]
    return namespace


def _client(n: int, seed: int) -> ClientData:
    gen = torch.Generator().manual_seed(seed)
    rows = ArrayDataset(torch.randn(n, 5, generator=gen), torch.randint(0, 3, (n,), generator=gen),
                        {"sex": torch.randint(0, 2, (n,), generator=gen)})
    return ClientData(train=rows, val=None, test=rows)


def test_worked_example_runs_serial_and_vectorized_alike(monkeypatch):
    ns = _example_namespace(monkeypatch)
    torch.manual_seed(0)
    model = ns["TwoHeads"](5, 3)
    trainer = LocalTrainer(model, task_loss("classification"), ClientConfig(batch_size=4, epochs=1, lr=0.1), 1)
    ctx = RunContext(num_clients=4, task="classification", num_classes=3, input_shape=(5,), rounds=1, seed=0,
                     model_factory=lambda device=None: model, trainer=trainer)
    algorithm = base.ALGORITHMS.get("group_adversary_demo")(ns["GroupAdversaryParams"](), ctx)
    server = algorithm.init_server(model_state(model))
    clients = [_client(8 + i, i) for i in range(4)]

    def jobs():
        return [(ClientTask(i, 0, c, torch.Generator().manual_seed(i), trainer), None) for i, c in enumerate(clients)]

    serial = SerialExecutor().run_cohort(algorithm, server, jobs())
    vectorized = VectorizedExecutor().run_cohort(algorithm, server, jobs())
    for cid, (s, v) in enumerate(zip(serial, vectorized)):
        for name, delta in s.message["delta"].items():
            torch.testing.assert_close(v.message["delta"][name], delta, atol=1e-6, rtol=1e-5)
        disc_moved = s.message["delta"]["disc.weight"].abs().max() > 0
        assert disc_moved == (cid % 3 != 0)  # clients 0 and 3 opt out of the discriminator
    new = algorithm.aggregate(server, [(i, r.message) for i, r in enumerate(serial)], 0)
    assert not torch.equal(new["params"]["encoder.weight"], server["params"]["encoder.weight"])
