"""Deployment: the same algorithm modules as a simulation, with the server half and the
client halves in different processes or machines (docs/deployment.md).

* :mod:`.wire`: what crosses the network (tensors by key plus a JSON skeleton, no pickles);
* :mod:`.silo_data`: each silo's rows in its own folder, the shared ``federation.json``;
* :mod:`.private_files`: files created 0600 in folders created 0700 (rows, ledgers, keys);
* :mod:`.silo`: a silo answering ``train`` / ``evaluate`` requests with its own state and ledger;
* :mod:`.server`: the server's rounds over any transport, dropping silos that fail;
* :mod:`.loopback`: the in-process transport (tests, reference);
* :mod:`.flower_app`: the Flower ServerApp / ClientApp (``pip install 'fedveil[flower]'``).
"""
from .server import DeployedServer, Failure
from .silo import Silo, SiloRefused
from .silo_data import prepare_silos, read_federation

__all__ = ["DeployedServer", "Failure", "Silo", "SiloRefused", "prepare_silos", "read_federation"]
