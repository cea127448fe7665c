"""The in-process transport: silos in this process, every request and reply packed and
unpacked as over the network (:mod:`fedveil.deploy.wire`), and faults on demand.

It is what the tests compare with the simulation, and the reference the Flower transport
must agree with. ``faults`` maps ``(round, silo)`` (0-based round) to what goes wrong
there: ``"down"`` (unreachable: no request reaches it), ``"crash"`` (it dies before
training), ``"lost"`` (it trains, records the release in its ledger and saves its state,
but the reply never arrives: a crash or a timeout after training).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .server import Failure, Packed
from .silo import Silo, SiloRefused


@dataclass
class LoopbackTransport:
    """The silos of this process as a :class:`~fedveil.deploy.server.Transport`,
    with ``faults`` injected and every request logged."""

    silos: dict[int, Silo]
    faults: dict[tuple[int, int], str] = field(default_factory=dict)
    name: str = "loopback"
    log: list[tuple[str, int, int, Packed]] = field(default_factory=list)  # (kind, round, silo, request) as sent

    def reachable(self) -> list[int]:
        """Every silo of this process (a ``"down"`` fault fails its request instead)."""
        return sorted(self.silos)

    def exchange(self, kind: str, round_idx: int, requests: dict[int, Packed]) -> dict[int, Packed | Failure]:
        """Each silo answers its request (packed and unpacked as over the wire),
        unless a fault of this train round replaces the reply by a :class:`Failure`."""
        replies: dict[int, Packed | Failure] = {}
        for cid, packed in requests.items():
            self.log.append((kind, round_idx, cid, packed))
            fault = self.faults.get((round_idx, cid)) if kind == "train" else None
            if fault == "down":
                replies[cid] = Failure("unreachable")
            elif fault == "crash":
                replies[cid] = Failure("silo crashed")
            else:
                try:
                    reply = self.silos[cid].answer(kind, round_idx, *packed)
                    replies[cid] = Failure("timeout") if fault == "lost" else reply
                except SiloRefused as err:
                    replies[cid] = Failure(str(err))
        return replies
