"""The client half of a deployed run: one silo, its rows, its state, its own privacy ledger.

A :class:`Silo` answers two requests from the server, whatever carries them (Flower, the
in-process loopback): ``train`` (round r, the server state the algorithm planned for
this round) runs the algorithm's ``client_update`` through the same trainer as a
simulation, with the same random stream ``(seed, "train", r, client)`` and, under
example-level DP, the noise its own privacy plan calibrated; ``evaluate`` scores the
global model and the silo's personal model on its own test rows. The reply carries the
algorithm's message (a model update and the row count its weighting needs) and the silo's
epsilon (with ``privacy.records_per_person`` > 1 also its person-level epsilon and how it
was accounted), never a row, a label, a group attribute or anything per example. The
training loss and the test scores are computed from the silo's rows without noise, so
under DP a silo sends them only when it opts in (``share_metrics``; ``fedveil deploy silo
--share-metrics true``); without DP it sends them by default.

Everything that persists lives in the silo's state folder, written before the reply
leaves (so a silo that crashes and restarts continues from it):

* ``ledger.pt``: every noisy release the silo made, append-only;
* ``round-<r>.pt``: the client state after round r, a fingerprint of round r's request
  and the reply sent. A round the silo has already answered gets the same reply again,
  whatever the request (the server resumed from a checkpoint before that round, lost the
  reply, or changed its aggregate since because another silo answered a round it had
  missed): that releases nothing new. Training a round twice would spend its budget twice
  and, once the ledger is above the plan, make the silo refuse every later round.

Every file is created 0600 and the state folder (with any missing parent) 0700
(:mod:`.private_files`): only the silo's own account can read its states and ledger.

Before training, a ``train`` request is checked and refused (:class:`SiloRefused`, one
line, nothing trained, nothing recorded in the ledger) if it is for another silo or
another round, or if any number in it is not finite (a NaN or infinite parameter would be
trained on, spend budget and send back garbage).

Privacy: the silo plans its own DP-SGD noise from its own row count and its rounds of the
seeded client schedule, exactly as the simulation plans that client's, and checks its
ledger against that plan after every round. With ``privacy.secure_rng = false`` the noise
is drawn from seeded streams the server could regenerate from the config; a deployment
should set ``privacy.secure_rng = true`` (the silo warns otherwise).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..algorithms.base import ClientTask
from ..config import RunConfig
from ..data.federated import ClientData, FederatedDataset
from ..errors import ConfigError
from ..privacy.ledger import PrivacyLedger
from ..privacy.person_level import PersonEpsilon, person_epsilon
from ..runtime.device import federated_to, resolve_device, to_cpu
from ..runtime.evaluation import check_metrics
from ..runtime.run_privacy import RunPrivacy
from ..runtime.round_metrics import RoundEvaluator
from ..runtime.run_dir import config_fingerprint
from ..runtime.distributed_dp import silo_streams
from ..runtime.secure_sum import SecureSumSettings, encode, layout_of
from ..runtime.simulation import FederationShape, build_run_pieces, run_schedule, training_task
from . import wire
from .private_files import private_folder, write_private, write_private_bytes
from .secagg import SecAggClient, SecAggError
from .silo_data import SiloDataError, load_silo, read_federation, read_silo_keys
from .silo_identity import load_silo_key

SECAGG_KINDS = ("train.secagg_advertise", "train.secagg_share", "train.secagg_unmask")  # secure aggregation's stages
LEDGER_FILE = "ledger.pt"
PLAN_TOLERANCE = 1e-6  # relative: as the simulation's ledger check
_ROUND_FILE = re.compile(r"round-(\d+)\.pt")


class SiloRefused(RuntimeError):
    """The silo will not answer this request (over its privacy plan, another run's request)."""


def request_fingerprint(tensors: dict[str, torch.Tensor], skeleton: str) -> str:
    """SHA-256 over a packed request's skeleton and every tensor's bytes, in key order."""
    digest = hashlib.sha256(skeleton.encode())
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(tensors[key].contiguous().numpy().tobytes())
    return digest.hexdigest()


def non_finite(value: Any) -> str | None:
    """The path (``server/params/fc.weight``) of the first tensor with a NaN or infinite
    entry, or the first such float, in an unpacked message; None when every number is finite."""
    for path, node, _ in wire.walk(value):
        if isinstance(node, torch.Tensor):
            bad = (node.is_floating_point() or node.is_complex()) and not bool(torch.isfinite(node).all())
        else:
            bad = isinstance(node, float) and not math.isfinite(node)
        if bad:
            return path or "message"
    return None


def check_deployable(config: RunConfig, algorithm) -> None:
    """What deployment does not do yet, refused in one line before anything starts."""
    if config.privacy.level == "client" and not config.secure_aggregation.enabled:
        raise ConfigError(
            "privacy.level: central client-level DP trusts the server to add the noise; deployed, the silos add it "
            "themselves under secure aggregation (distributed DP): set secure_aggregation.enabled = true, or use "
            "privacy.level = \"example\""
        )
    if algorithm.has_setup:
        raise ConfigError(f"algorithm: {type(algorithm).__name__} has a setup phase, which deployment does not run yet")
    if config.executor == "ray":
        raise ConfigError("executor: a deployed silo trains in its own process; use executor = \"serial\"")


class Silo:
    """Silo ``client_id`` of a deployed run of ``config`` (see the module docstring)."""

    def __init__(
        self, config: RunConfig, shape: FederationShape, client_id: int, data, state_dir: str | os.PathLike,
        share_metrics: bool | None = None,
    ) -> None:
        if not 0 <= client_id < shape.num_clients:
            raise SiloDataError(f"silo id {client_id} is outside 0..{shape.num_clients - 1}")
        self.config, self.shape, self.client_id = config, shape, client_id
        # training loss and test scores are computed from private rows without noise: under DP a
        # silo sends them only if it chooses to (the model update, counts and epsilon always go)
        self.share_metrics = config.privacy.level == "none" if share_metrics is None else share_metrics
        self.device = resolve_device(config.device)
        _, self.model, self.trainer, self.algorithm = build_run_pieces(config, shape, self.device)
        check_deployable(config, self.algorithm)
        own = FederatedDataset(
            f"silo-{client_id}", [data], data.test, shape.task, shape.num_classes, shape.input_shape
        )
        check_metrics(config.eval.metrics, config.eval.group, own)
        self.data = federated_to(own, self.device)
        fed = config.federation
        self.schedule = run_schedule(config, shape.num_clients)
        self.secure = SecureSumSettings.from_config(config.secure_aggregation) if config.secure_aggregation.enabled else None
        self.privacy = RunPrivacy.from_config(
            config.privacy, shape.num_clients, {client_id: data.num_train}, self.trainer, self.model, self.algorithm,
            self.schedule, fed.sampling, fed.clients_per_round, weighted_sampling=fed.client_probabilities is not None,
            secure=self.secure,
        )
        noised_here = self.privacy is not None and (self.privacy.plan.clients or self.privacy.plan.distributed is not None)
        if noised_here and not config.privacy.secure_rng:
            warnings.warn(
                "privacy.secure_rng is false: this silo's DP noise comes from streams seeded by the config, which the "
                "server knows; set privacy.secure_rng = true in a real deployment",
                stacklevel=2,
            )
        ev = config.eval
        self.evaluator = RoundEvaluator(
            self.algorithm, self.data, self.trainer, config.seed, ev.batch_size, ev.personal, ev.metrics, ev.group
        )
        self.state_dir = private_folder(state_dir)
        self._load_ledger()
        # the silo's identity key and every silo's public key, where its folder has them
        # (from_folder): secure aggregation's round keys are then signed and checked
        self.identity_key, self.peer_keys = None, None
        self.secagg: SecAggClient | None = None  # this round's session, made at its advertise stage

    @classmethod
    def from_folder(
        cls, config: RunConfig, folder: str | os.PathLike, state_dir: str | os.PathLike | None = None,
        share_metrics: bool | None = None, own_rows: tuple[int, ClientData] | None = None,
    ) -> "Silo":
        """The silo whose rows and ``federation.json`` ``fedveil deploy prepare`` wrote in
        ``folder`` (or whose rows are ``own_rows``: its id and the rows it read from its own
        file, :mod:`.silo_table`); refused unless ``config`` is the config the folder was
        prepared for. Its state goes to ``state_dir`` (default ``folder/state``)."""
        shape, fingerprint = read_federation(folder)
        if fingerprint != config_fingerprint(config.model_dump(mode="json")):
            raise SiloDataError(
                f"'{folder}' was prepared for another config than the one this run sends (seed, data, privacy or "
                "algorithm differ); prepare the silos again from the run's config"
            )
        client_id, data = own_rows if own_rows is not None else load_silo(folder)[:2]
        state_dir = Path(folder) / "state" if state_dir is None else state_dir
        silo = cls(config, shape, client_id, data, state_dir, share_metrics)
        keys = read_silo_keys(folder)
        if keys:
            silo.identity_key, silo.peer_keys = load_silo_key(folder), keys
        return silo

    # ------------------------------------------------------------------ persistence
    def _load_ledger(self) -> None:
        path = self.state_dir / LEDGER_FILE
        if self.privacy is not None and path.exists():
            self.privacy.ledger = PrivacyLedger.from_state_dict(torch.load(path, weights_only=True))

    def _save_ledger(self) -> None:
        if self.privacy is not None:
            state = self.privacy.ledger.state_dict()
            write_private(self.state_dir / LEDGER_FILE, lambda handle: torch.save(state, handle))

    def _round_file(self, round_idx: int) -> Path:
        return self.state_dir / f"round-{round_idx}.pt"

    def _trained_rounds(self) -> list[int]:
        return sorted(int(m[1]) for name in os.listdir(self.state_dir) if (m := _ROUND_FILE.fullmatch(name)))

    def _record(self, round_idx: int) -> dict[str, Any] | None:
        path = self._round_file(round_idx)
        return torch.load(path, weights_only=True, map_location=self.device) if path.exists() else None

    def state_before(self, round_idx: int):
        """The client state as of the start of round ``round_idx``: after the last round before
        it that this silo trained, or None (never trained: the algorithm initialises it)."""
        earlier = [r for r in self._trained_rounds() if r < round_idx]
        return None if not earlier else self._record(earlier[-1])["client_state"]

    # ------------------------------------------------------------------ requests
    def answer(self, kind: str, round_idx: int, tensors: dict[str, torch.Tensor], skeleton: str) -> tuple[dict[str, torch.Tensor], str]:
        """The packed reply to a request of ``kind`` (``train``, ``evaluate`` or a secure
        aggregation stage), whatever transport carried it."""
        if kind in SECAGG_KINDS and self.secure is None:
            raise SiloRefused(f"silo {self.client_id}: {kind} asked, but this run does not use secure aggregation")
        handlers = {"train": self.train, "evaluate": self.evaluate, "train.secagg_advertise": self.secagg_advertise,
                    "train.secagg_share": self.secagg_share, "train.secagg_unmask": self.secagg_unmask}
        if kind not in handlers:
            raise SiloRefused(f"silo {self.client_id}: unknown request '{kind}'")
        return handlers[kind](round_idx, tensors, skeleton)

    def _stage_request(self, round_idx: int, tensors, skeleton: str) -> dict[str, Any]:
        request = wire.unpack(tensors, skeleton)
        if not isinstance(request, dict) or request.get("client") != self.client_id or request.get("round") != round_idx:
            raise SiloRefused(f"silo {self.client_id}: a secure-aggregation request for another silo or round")
        return request

    def _threshold(self, round_idx: int) -> int:
        """The threshold this silo insists on: from its own copy of the seeded schedule, not the server's word."""
        return self.secure.threshold(len(self.schedule[round_idx]))

    def secagg_advertise(self, round_idx: int, tensors, skeleton: str) -> tuple[dict[str, torch.Tensor], str]:
        """Secure aggregation, stage 0: a new session at the silo's own threshold and its signed round public keys."""
        self._stage_request(round_idx, tensors, skeleton)
        sign = None if self.identity_key is None else (lambda payload: self.identity_key.sign(payload).hex())
        self.secagg = SecAggClient(self.client_id, self._threshold(round_idx), sign, self.peer_keys)
        return wire.pack(self.secagg.advertise(round_idx))

    def secagg_share(self, round_idx: int, tensors, skeleton: str) -> tuple[dict[str, torch.Tensor], str]:
        """Secure aggregation, stage 1: the encrypted shares of
        this silo's secrets for the other silos in ``publics``."""
        request = self._stage_request(round_idx, tensors, skeleton)
        return wire.pack(self._secagg_call(lambda s: s.share(round_idx, request.get("publics") or {})))

    def secagg_unmask(self, round_idx: int, tensors, skeleton: str) -> tuple[dict[str, torch.Tensor], str]:
        """Reveal the shares that unmask the sum over ``survivors``, once per round and set of
        survivors, whatever the session: a silo's recorded input is replayed (masked afresh)
        in a later session of the same round, so unmasking that round over another set of
        survivors would hand the server the difference of two sums, the input of the silos
        in one set only. With a threshold above half the cohort no second set can then be
        unmasked at all (the silos that answered the first hold more than the rest)."""
        request = self._stage_request(round_idx, tensors, skeleton)
        survivors, dropped = list(request.get("survivors") or []), list(request.get("dropped") or [])
        earlier = self._unmasked_for(round_idx)
        shares = self._secagg_call(lambda s: s.unmask(round_idx, survivors, dropped))
        summed = sorted(int(c) for c in survivors)
        if earlier is not None and earlier != summed:
            raise SiloRefused(
                f"silo {self.client_id}: round {round_idx + 1} was unmasked over silos {earlier} already; another set "
                "of survivors would reveal the difference of the two sums"
            )
        if earlier is None:  # kept before the shares leave
            write_private_bytes(self._unmask_file(round_idx), json.dumps(summed).encode())
        return wire.pack(shares)

    def _unmask_file(self, round_idx: int) -> Path:
        return self.state_dir / f"unmasked-{round_idx}.json"

    def _unmasked_for(self, round_idx: int) -> list[int] | None:
        """The survivors this silo unmasked round ``round_idx`` over, in any session, or None."""
        path = self._unmask_file(round_idx)
        return json.loads(path.read_text()) if path.exists() else None

    def _secagg_call(self, step):
        if self.secagg is None:
            raise SiloRefused(f"silo {self.client_id}: no secure-aggregation session (restarted mid-round?)")
        try:
            return step(self.secagg)
        except (SecAggError, KeyError, TypeError, ValueError) as err:
            raise SiloRefused(f"silo {self.client_id}: secure aggregation: {err}") from None

    def _masked(self, round_idx: int, reply_tensors, reply_skeleton: str, inbox: Any) -> tuple[dict[str, torch.Tensor], str]:
        """A recorded secure reply with its quantised update masked for this round's session."""
        reply = wire.unpack(reply_tensors, reply_skeleton)
        quantized = reply.pop("secure_input").numpy().astype("uint32")
        masked = self._secagg_call(lambda s: s.mask(round_idx, dict(inbox or {}), quantized))
        reply["masked"] = torch.from_numpy(masked.astype("int64"))
        return wire.pack(reply)

    def train(self, round_idx: int, tensors: dict[str, torch.Tensor], skeleton: str) -> tuple[dict[str, torch.Tensor], str]:
        """Answer a packed ``train`` request for round ``round_idx``; returns the packed reply."""
        request = wire.unpack(tensors, skeleton, self.device)
        inbox = request.pop("secagg_inbox", None) if isinstance(request, dict) else None
        fingerprint = request_fingerprint(*wire.pack(request)) if inbox is not None else request_fingerprint(tensors, skeleton)
        done = self._record(round_idx)
        if done is not None:  # answered before: the same release again, whatever is asked now
            if done["request"] != fingerprint:
                warnings.warn(f"silo {self.client_id}: round {round_idx + 1} asked again with another request; "
                              "replaying the reply it already sent", stacklevel=2)
            return self._sent(round_idx, done["reply_tensors"], done["reply_skeleton"], inbox)
        if request.get("client") != self.client_id or request.get("round") != round_idx:
            raise SiloRefused(f"silo {self.client_id}: request for client {request.get('client')} round {request.get('round')}")
        where = non_finite(request)
        if where is not None:
            raise SiloRefused(
                f"silo {self.client_id} refuses round {round_idx + 1}: the request holds a non-finite value (NaN or "
                f"infinity) at '{where}'; nothing is trained"
            )
        client_state = self.state_before(round_idx)
        if client_state is None:
            client_state = self.algorithm.init_client(self.client_id, request["server"])
        task = training_task(self.config.seed, self.client_id, round_idx, self.data.clients[0], self.trainer, self.privacy)
        result = self.algorithm.client_update(request["server"], client_state, task)
        self._account(task, result, round_idx)
        shared = self.share_metrics and result.stats is not None
        reply = {
            "message": result.message,
            "loss": float(result.stats.loss) if shared else None,
            "extra_metrics": {k: float(v) for k, v in result.extra_metrics.items()} if self.share_metrics else {},
            "epsilon": self.epsilon(),
        }
        person = self.person_epsilon()
        if person is not None:
            reply["person_epsilon"] = dataclasses.asdict(person)
        if self.secure is not None:  # the update leaves only masked; the record keeps it quantised, unmasked
            message = reply.pop("message")
            quantized = self._secure_input(message, round_idx)
            reply["secure_input"] = torch.from_numpy(quantized.astype("int64"))
            reply["layout"] = [[key, list(shape)] for key, shape in layout_of(message["delta"])]
        reply_tensors, reply_skeleton = wire.pack(reply)
        record = {
            "request": fingerprint, "client_state": to_cpu(result.state), "reply_tensors": reply_tensors,
            "reply_skeleton": reply_skeleton,
        }
        write_private(self._round_file(round_idx), lambda handle: torch.save(record, handle))
        return self._sent(round_idx, reply_tensors, reply_skeleton, inbox)

    def _secure_input(self, message: dict[str, Any], round_idx: int) -> np.ndarray:
        """The vector secure aggregation sums: the quantised weighted update, or under
        distributed DP the clipped, rounded update with this silo's Skellam share added."""
        plan = None if self.privacy is None else self.privacy.plan.distributed
        if plan is not None:
            share = plan.share(round_idx, len(self.schedule[round_idx]))
            streams = silo_streams(self.privacy.noise, self.config.seed, round_idx, self.client_id)
            return plan.mechanism.encode(message["delta"], share, *streams)
        weight = self.algorithm.weights([message])[0]
        return encode(message["delta"], weight, self.secure, self.config.seed, round_idx, self.client_id)

    def _sent(self, round_idx: int, reply_tensors, reply_skeleton: str, inbox: Any) -> tuple[dict[str, torch.Tensor], str]:
        """What leaves for a recorded reply: itself, or under secure aggregation its update masked."""
        if self.secure is None:
            return reply_tensors, reply_skeleton
        return self._masked(round_idx, reply_tensors, reply_skeleton, inbox)

    def _account(self, task: ClientTask, result, round_idx: int) -> None:
        """Record this training's releases in the silo's ledger (saved before anything is
        sent) and refuse to reply if the ledger now exceeds the plan through this round."""
        if self.privacy is None:
            if result.releases:
                raise RuntimeError(f"{type(self.algorithm).__name__} returned noisy releases in a run without privacy")
            return
        if task.dp is not None:
            self.privacy.record_client(self.client_id, task.data.num_train, task.dp, list(task.dp.trainings))
        if result.releases:
            self.privacy.record_releases(self.client_id, result.releases)
        self._save_ledger()
        # a round it missed, answered after later ones (a resumed server): the plan through the latest
        latest = max([round_idx, *self._trained_rounds()])
        spent, planned = self.epsilon(), self.planned_epsilon_through(latest)
        if spent > planned * (1 + PLAN_TOLERANCE):
            raise SiloRefused(
                f"silo {self.client_id} refuses round {round_idx + 1}: its ledger has spent epsilon={spent:.4g}, more "
                f"than its plan allows through this round ({planned:.4g}); nothing of this training is sent"
            )

    def planned_epsilon_through(self, round_idx: int) -> float:
        """Epsilon of every release the plan calibrated for this silo in rounds 0..``round_idx``
        (the rounds of the seeded schedule it is in), plus its setup releases; under distributed
        DP the population's releases through that round, which cover every silo."""
        if self.privacy.plan.distributed is not None:
            planned = [self.privacy.plan.distributed.planned_release(r) for r in range(round_idx + 1)]
            return self.privacy.ledger.epsilon_of(planned, self.config.privacy.delta)
        planned = list(self.privacy.plan.setup.get(self.client_id, []))
        for r in range(round_idx + 1):
            if self.client_id in {int(c) for c in self.schedule[r]}:
                planned += self.privacy.plan.planned_round(r, [self.client_id]).get(self.client_id, [])
        return self.privacy.ledger.epsilon_of(planned, self.config.privacy.delta)

    def epsilon(self) -> float:
        """Epsilon this silo has spent so far (0 without DP)."""
        return 0.0 if self.privacy is None else float(self.privacy.spent().get(self.client_id, 0.0))

    def person_epsilon(self) -> PersonEpsilon | None:
        """This silo's person-level epsilon and its method, when ``privacy.records_per_person`` > 1
        (:mod:`fedveil.privacy.person_level`); None otherwise."""
        k = self.config.privacy.records_per_person
        if self.privacy is None or k == 1:
            return None
        return person_epsilon(self.privacy.ledger, self.client_id, k, self.config.privacy.delta)

    def evaluate(self, round_idx: int, tensors: dict[str, torch.Tensor], skeleton: str) -> tuple[dict[str, torch.Tensor], str]:
        """Answer a packed ``evaluate`` request (the server state after round ``round_idx``):
        the scores of the global and the personal model on this silo's own rows, if it
        shares them (else only its counts and epsilon)."""
        request = wire.unpack(tensors, skeleton, self.device)
        server_state = request["server"]
        client = self.data.clients[0]
        reply: dict[str, Any] = {
            "client": self.client_id, "num_train": client.num_train, "num_test": len(client.test), "epsilon": self.epsilon(),
        }
        if not self.share_metrics:
            return wire.pack(reply)
        if self.algorithm.has_global_model:
            reply["global"] = self.evaluator.client_scores(self.algorithm.global_params(server_state), client)
        if self.evaluator.personal:
            personal = self.evaluator.personal_params(
                server_state, self.state_before(round_idx + 1), self.client_id, client, round_idx
            )
            reply["personal"] = self.evaluator.client_scores(personal, client)
        return wire.pack(reply)
