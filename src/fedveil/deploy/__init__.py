"""Deployment: the same algorithm modules as a simulation, with the server half and the
client halves in different processes or machines (docs/deployment.md).

* :mod:`.wire`: what crosses the network (tensors by key plus a JSON skeleton, no pickles);
* :mod:`.silo_data`: each silo's rows in its own folder, the shared ``federation.json``;
* :mod:`.private_files`: files created 0600 in folders created 0700 (rows, ledgers, keys);
* :mod:`.silo`: a silo answering ``train`` / ``evaluate`` requests with its own state and ledger;
* :mod:`.silo_service`: the silo's own long-lived process, the only code that opens its data;
* :mod:`.silo_socket`: the local protocol between a ClientApp and that service;
* :mod:`.server`: the server's rounds over any transport, dropping silos that fail;
* :mod:`.loopback`: the in-process transport (tests, reference);
* :mod:`.flower_app` / :mod:`.flower_client`: the Flower ServerApp and the ClientApp that
  forwards to the silo service (``pip install 'fedveil[flower]'``).

The names below are imported on first use, so the ClientApp forwarder, which imports only
:mod:`.silo_socket`, does not pay for torch.
"""
from importlib import import_module

_HOMES = {
    "DeployedServer": ".server", "Failure": ".server", "Silo": ".silo", "SiloRefused": ".silo",
    "prepare_silos": ".silo_data", "read_federation": ".silo_data",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'fedveil.deploy' has no attribute '{name}'")
    return getattr(import_module(_HOMES[name], __name__), name)
