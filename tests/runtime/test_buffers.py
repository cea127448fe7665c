"""Buffers (BatchNorm running statistics) are part of the model state: checkpointed,
aggregated by the rule the algorithm picks, never scaled by a server optimiser."""
from __future__ import annotations

import json

import pytest
import torch

from fedveil.runtime import run
from tiny_runs import tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")

BATCHNORM = {"name": "resnet", "options": {"depth": 1, "width": 0.25, "norm": "batch"}}


def _run(tmp_path, name: str, rounds: int, **algorithm):
    config = tiny_config(
        model=BATCHNORM, algorithm={"name": "fedavg", **algorithm},
        federation={"rounds": rounds, "clients_per_round": 3}, checkpoint={"every": 1},
    )
    out = tmp_path / name
    summary = run(config, out, progress=False)
    return summary, torch.load(out / "checkpoint.pt", weights_only=False)


def test_averaged_statistics_ignore_the_server_step(tmp_path):
    """After one round the server's statistics are the clients' average whatever server_lr is;
    the parameters take the server step."""
    _, one = _run(tmp_path, "lr1", 1, server_lr=1.0)
    _, two = _run(tmp_path, "lr2", 1, server_lr=2.0)
    server1, server2 = one["server"]["params"], two["server"]["params"]
    stats = [k for k in server1 if k.endswith(("running_mean", "running_var"))]
    assert stats and all(torch.equal(server1[k], server2[k]) for k in stats)
    assert not torch.allclose(server1["stem.weight"], server2["stem.weight"])
    assert not torch.equal(server1["stem_norm.running_var"], torch.ones_like(server1["stem_norm.running_var"]))
    tracked = server1["stem_norm.num_batches_tracked"]
    assert tracked.dtype == torch.int64 and int(tracked) > 0


def test_local_statistics_stay_with_the_clients(tmp_path):
    summary, checkpoint = _run(tmp_path, "local", 2, buffers="local")
    server = checkpoint["server"]["params"]
    assert torch.equal(server["stem_norm.running_mean"], torch.zeros_like(server["stem_norm.running_mean"]))
    assert int(server["stem_norm.num_batches_tracked"]) == 0
    own = [s["buffers"] for s in checkpoint["clients"].values() if isinstance(s, dict) and "buffers" in s]
    assert own and all(not torch.equal(b["stem_norm.running_mean"], server["stem_norm.running_mean"]) for b in own)
    assert "personal_accuracy_mean" in summary  # each client is scored with its own statistics
