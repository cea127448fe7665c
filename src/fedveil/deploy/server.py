"""The server half of a deployed run: the algorithm's server hooks, over any transport.

Each round the server takes the round's cohort from the seeded client schedule (the
simulation's), lets the algorithm plan it (``configure_round``), sends every cohort silo
that is reachable a ``train`` request, and aggregates the replies that came back
(``aggregate``) in cohort order. A silo that is unreachable, crashes, times out or
refuses is dropped from that round: the aggregate is over the survivors only, exactly as
if the cohort had been the survivors, and the silo's privacy spend stays in its own
ledger (it reports its epsilon, and its person-level epsilon where
``privacy.records_per_person`` > 1, with its next reply). On evaluation rounds every
reachable silo scores the new global model and its personal model on its own rows; the
server summarises the scores under the simulation's metric names.

The server holds no rows. Its record (``config.json``, ``metrics.jsonl``, checkpoints,
``summary.json``, plots) goes through the runtime's :class:`RunRecorder`, so a killed
server resumes from its last checkpoint with ``resume=True``; the silos answer a round
they have already answered with the same reply (see :mod:`fedveil.deploy.silo`).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np
import torch

from ..config import RunConfig
from ..models.functional import model_state
from ..privacy.person_level import PersonEpsilon, person_summary
from ..runtime.device import resolve_device
from ..runtime.evaluation import score_name
from ..runtime.initial_model import initial_params
from ..runtime.run_privacy import RunPrivacy
from ..runtime.recorder import MemoryRecorder, RunRecorder
from ..runtime.round_metrics import summarize_client_scores
from ..runtime.run_dir import RunDirError, config_fingerprint
from ..runtime.simulation import FederationShape, build_run_pieces, robust_messages_of, run_schedule
from ..runtime.secure_sum import SecureSumSettings, decode
from ..runtime.summary import build_summary
from . import wire
from .secagg import SecAggError, SecAggServer
from .reply_check import InvalidReply, ReplyLimits, check_packed, check_train_reply
from .silo import check_deployable

Packed = tuple[dict[str, torch.Tensor], str]


@dataclass
class Failure:
    """A request that got no usable reply: ``reason`` says why (unreachable, timeout, error text)."""

    reason: str


class Transport(Protocol):
    """What carries requests to the silos: the in-process loopback or Flower's grid."""

    name: str

    def reachable(self) -> list[int]:
        """The silo ids that can be asked right now."""

    def exchange(self, kind: str, round_idx: int, requests: dict[int, Packed]) -> dict[int, Packed | Failure]:
        """Send ``kind`` (``train`` or ``evaluate``) requests, one per silo id; every id gets
        a reply or a :class:`Failure`."""


@dataclass
class DeployedServer:
    """Runs the server half of ``config`` over a transport; built from the federation's
    shape alone (``federation.json``), never from rows."""

    config: RunConfig
    shape: FederationShape
    on_round: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.device = resolve_device(self.config.device)
        _, self.model, self.trainer, self.algorithm = build_run_pieces(self.config, self.shape, self.device)
        check_deployable(self.config, self.algorithm)
        self.schedule = run_schedule(self.config, self.shape.num_clients)
        self.init = initial_params(model_state(self.model), self.config.model.init_from, self.config.model.init_skip)
        self.score = score_name(self.shape.task)
        self.limits = ReplyLimits.for_model(self.init, submodels=self.algorithm.submodel_messages)
        sa = self.config.secure_aggregation
        self.secure = SecureSumSettings.from_config(sa) if sa.enabled else None
        self.privacy = None  # distributed DP: the server accounts the noisy sums it unmasks
        if self.secure is not None and self.config.privacy.level == "client":
            fed = self.config.federation
            self.privacy = RunPrivacy.from_config(
                self.config.privacy, self.shape.num_clients, {}, self.trainer, self.model, self.algorithm, self.schedule,
                fed.sampling, fed.clients_per_round, secure=self.secure,
            )

    @property
    def config_dict(self) -> dict[str, Any]:
        """The run config as JSON-ready data (what ``config.json`` records)."""
        return self.config.model_dump(mode="json")

    def run(self, transport: Transport, recorder: RunRecorder | None = None) -> dict[str, Any]:
        """Train every round not yet in ``recorder``'s last checkpoint; returns the summary."""
        recorder = MemoryRecorder() if recorder is None else recorder
        fingerprint = config_fingerprint(self.config_dict)
        checkpoint = recorder.load_checkpoint(self.device)
        if checkpoint is not None and checkpoint.get("fingerprint") != fingerprint:
            raise RunDirError(f"checkpoint in {recorder.where} belongs to another config; start a new run")
        if checkpoint is None:
            state = {
                "round": 0, "server": self.algorithm.init_server(self.init), "elapsed_s": 0.0, "epsilon": {},
                "quarantined": {},
            }
        else:
            state = checkpoint
            if self.privacy is not None:
                self.privacy.load_state_dict(state["privacy"], self.schedule, state["round"])
        rows = recorder.rows_through(state["round"])
        rounds, every = self.config.federation.rounds, self.config.checkpoint.every
        started = time.perf_counter() - state["elapsed_s"]
        client_rows: list[dict[str, Any]] = []
        for r in range(state["round"], rounds):
            row = self.train_round(state, r, transport)
            last = r + 1 == rounds
            if (r + 1) % self.config.eval.every == 0 or last:
                metrics, client_rows = self.evaluate(state, r, transport)
                row.update(metrics)
            state["elapsed_s"] = row["elapsed_s"] = time.perf_counter() - started
            recorder.record_row(row)
            rows.append(row)
            for hook in self.on_round:
                hook(row)
            if last or (every and (r + 1) % every == 0):
                recorder.save_checkpoint({**state, "fingerprint": fingerprint})
        if not client_rows:  # resumed a finished run: score the final state again
            _, client_rows = self.evaluate(state, rounds - 1, transport)
        epsilons = {int(k): v for k, v in state["epsilon"].items()}
        privacy = {}
        if self.privacy is not None:
            privacy = self.privacy.summary()
        elif self.config.privacy.level != "none":
            privacy = {
                "privacy_level": self.config.privacy.level, "delta": self.config.privacy.delta,
                "epsilon": max(epsilons.values(), default=0.0),
                "epsilon_per_client": [epsilons.get(c) for c in range(self.shape.num_clients)],
                "secure_rng": self.config.privacy.secure_rng,
            }
            if self.config.privacy.records_per_person > 1:
                privacy.update(self.person_level_summary(state.get("person_epsilon", {})))
        summary = build_summary(self.config, self.shape.model_name, self.shape, privacy, rows, state["elapsed_s"])
        summary["deployment"] = {
            "transport": transport.name,
            "dropped": {str(r["round"]): r["dropped"] for r in rows if r.get("dropped")},
            "quarantined": dict(state.get("quarantined", {})),
        }
        if self.algorithm.has_global_model:
            recorder.save_model(self.algorithm.global_params(state["server"]))
        recorder.finish(summary, client_rows)
        return summary

    def train_round(self, state: dict[str, Any], round_idx: int, transport: Transport) -> dict[str, Any]:
        """Round ``round_idx`` in place on ``state``: plan, ask the reachable cohort, aggregate the survivors."""
        cohort = [int(c) for c in self.schedule[round_idx]]
        planned = self.algorithm.configure_round(state["server"], cohort, round_idx)
        quarantined = state.setdefault("quarantined", {})
        reachable = set(transport.reachable()) - {int(c) for c in quarantined}
        dropped: dict[str, str] = {
            str(cid): "quarantined" if str(cid) in quarantined else "unreachable" for cid in cohort if cid not in reachable
        }
        asked = [cid for cid in cohort if cid in reachable]
        if self.secure is None:
            requests = {cid: wire.pack(self._train_request(planned, cid, round_idx)) for cid in asked}
            replies = transport.exchange("train", round_idx, requests) if requests else {}
            values = self._take_replies(cohort, replies, state, dropped, round_idx)
            results = robust_messages_of(self.config, [(cid, values[cid]["message"]) for cid in cohort if cid in values])
        else:
            values, results = self._secure_round(planned, cohort, asked, round_idx, transport, state, dropped)
        if results and self.privacy is not None:  # distributed DP: the one noisy mean update
            state["server"] = self.algorithm.server_update(planned, results[0][1]["delta"])
        elif results:
            state["server"] = self.algorithm.aggregate(planned, results, round_idx)
        state["round"] = round_idx + 1
        if self.privacy is not None:
            state["privacy"] = self.privacy.state_dict()
        row: dict[str, Any] = {
            "round": round_idx + 1, "cohort_size": len(cohort), "survivors": len(values) if results else 0,
            "lr": self.trainer.lr_at(round_idx),
        }
        if dropped:
            row["dropped"] = dropped
        losses = [v["loss"] for v in values.values() if v["loss"] is not None and not np.isnan(v["loss"])]
        if losses:
            row["train_loss"] = float(np.mean(losses))
        if self.privacy is not None:
            row["epsilon"] = self.privacy.metrics()["epsilon"]
        elif self.config.privacy.level != "none":
            row["epsilon"] = max(state["epsilon"].values(), default=0.0)
            row["epsilon_per_client"] = [state["epsilon"].get(str(c), 0.0) for c in range(self.shape.num_clients)]
        extra: dict[str, list[float]] = {}
        for v in values.values():
            for key, number in v["extra_metrics"].items():
                extra.setdefault(key, []).append(number)
        row.update({k: float(np.mean(v)) for k, v in extra.items()})
        return row

    def _train_request(self, planned: dict[str, Any], cid: int, round_idx: int) -> dict[str, Any]:
        return {"round": round_idx, "client": cid, "server": self.algorithm.silo_view(planned)}

    def _take_replies(
        self, cohort: list[int], replies: dict[int, Packed | Failure], state: dict[str, Any], dropped: dict[str, str], round_idx: int,
    ) -> dict[int, dict[str, Any]]:
        """The train replies that passed :mod:`.reply_check`, by silo in cohort order; a
        failure drops the silo, an invalid reply also quarantines it; epsilons are taken."""
        quarantined = state["quarantined"]
        values = {}
        for cid in cohort:
            reply = replies.get(cid)
            if reply is None:
                continue
            if isinstance(reply, Failure):
                dropped[str(cid)] = reply.reason
                continue
            try:
                value = self.checked_reply(reply)
                self.check_reported_epsilon(cid, value["epsilon"])
            except (InvalidReply, wire.WireError) as err:
                dropped[str(cid)] = f"invalid reply: {err}"
                quarantined[str(cid)] = f"round {round_idx + 1}: {err}"
                continue
            values[cid] = value
            state["epsilon"][str(cid)] = max(value["epsilon"], state["epsilon"].get(str(cid), 0.0))
            if "person_epsilon" in value:
                state.setdefault("person_epsilon", {})[str(cid)] = value["person_epsilon"]
        return values

    def _secure_round(
        self, planned: dict[str, Any], cohort: list[int], asked: list[int], round_idx: int, transport: Transport,
        state: dict[str, Any], dropped: dict[str, str],
    ) -> tuple[dict[int, dict[str, Any]], list[tuple[int, dict[str, Any]]]]:
        """The round's train exchange under secure aggregation (:mod:`.secagg`): keys,
        shares, masked updates, unmasking; returns the survivors' replies and the one
        combined message (none when fewer than the threshold answered a stage)."""
        server = SecAggServer(self.secure.threshold(len(cohort)), round_idx)
        values: dict[int, dict[str, Any]] = {}

        def stage(kind: str, requests: dict[int, dict[str, Any]]) -> dict[int, Any]:
            answered = {}
            for cid, reply in (transport.exchange(kind, round_idx, {c: wire.pack(r) for c, r in requests.items()}) if requests else {}).items():
                if isinstance(reply, Failure):
                    dropped[str(cid)] = f"{kind}: {reply.reason}"
                    continue
                try:
                    check_packed(*reply, self.limits)
                    answered[cid] = wire.unpack(*reply)
                except (InvalidReply, wire.WireError) as err:
                    dropped[str(cid)] = f"{kind}: invalid reply: {err}"
            return answered

        def base(cid: int) -> dict[str, Any]:
            return {"round": round_idx, "client": cid}

        try:
            keys = stage("train.secagg_advertise", {cid: base(cid) for cid in asked})
            key_lists = server.collect_keys(keys)
            shares = stage("train.secagg_share", {cid: {**base(cid), "publics": key_lists[cid]} for cid in key_lists})
            inbox = server.route_shares(shares)
            requests = {cid: {**self._train_request(planned, cid, round_idx), "secagg_inbox": inbox[cid]} for cid in inbox}
            replies = transport.exchange("train", round_idx, {c: wire.pack(r) for c, r in requests.items()})
            values = self._take_replies(cohort, replies, state, dropped, round_idx)
            layouts = {json.dumps(v["layout"]) for v in values.values()}
            if len(layouts) > 1:
                raise SecAggError("the silos' updates do not share one layout")
            masked = {cid: v["masked"].numpy().astype(np.uint32) for cid, v in values.items()}
            survivors, gone = server.unmask_request(masked)
            revealed = stage("train.secagg_unmask", {cid: {**base(cid), "survivors": survivors, "dropped": gone} for cid in survivors})
            total = server.unmasked_sum(masked, survivors, gone, revealed)
        except (SecAggError, KeyError, TypeError, ValueError) as err:
            self._reject_malformed(server, state, dropped, round_idx, summed=set())
            for cid in asked:
                dropped.setdefault(str(cid), f"secure aggregation stopped: {err}")
            return values, []
        self._reject_malformed(server, state, dropped, round_idx, summed=set(survivors))
        layout = [(key, tuple(shape)) for key, shape in next(iter(values.values()))["layout"]]
        if self.privacy is not None:
            return values, [(-1, {"delta": self._noisy_mean(total, layout, round_idx, len(cohort), len(survivors))})]
        combined = decode(total, len(survivors), layout, self.secure, self.limits.dtype, self.device)
        return values, [] if combined is None else [(-1, combined)]

    def _noisy_mean(self, total: np.ndarray, layout, round_idx: int, cohort_size: int, survivors: int):
        """Distributed DP: the noisy mean update from the unmasked sum, its release accounted
        (the noise the survivors carried) and the ledger checked against the plan."""
        mean = self.privacy.unmasked_mean(total, layout, round_idx, cohort_size, survivors, self.limits.dtype, self.device)
        self.privacy.check.check()
        return mean

    @staticmethod
    def _reject_malformed(
        server: SecAggServer, state: dict[str, Any], dropped: dict[str, str], round_idx: int, summed: set[int],
    ) -> None:
        """Silos whose secure-aggregation reply was malformed: quarantined, and dropped from the
        round unless their masked update is in the sum already (a bad unmask reply only)."""
        for cid, why in server.rejected.items():
            if cid not in summed:
                dropped[str(cid)] = f"invalid reply: {why}"
            state["quarantined"][str(cid)] = f"round {round_idx + 1}: {why}"

    def checked_reply(self, reply: Packed) -> dict[str, Any]:
        """A silo's train reply, unpacked once it passed :mod:`.reply_check` (raises InvalidReply)."""
        check_packed(*reply, self.limits)
        value = wire.unpack(*reply, device=self.device)
        check_train_reply(value, self.limits, secure=self.secure is not None, weighted=self.privacy is None)
        return value

    def check_reported_epsilon(self, cid: int, reported: float) -> None:
        """A silo's epsilon after training, against what its plan allows: under example-level DP
        it is positive (it trained on its rows: a silo cannot report 0) and within its budget
        (``privacy.client_epsilons[cid]`` or ``privacy.epsilon``). A replayed reply may carry
        an earlier, smaller figure: the server keeps the largest a silo reported."""
        privacy = self.config.privacy
        if privacy.level != "example":
            return
        if reported <= 0.0:
            raise InvalidReply(f"epsilon {reported:.6g} says the silo spent nothing, though it trained under DP")
        budget = privacy.client_epsilons[cid] if privacy.client_epsilons is not None else privacy.epsilon
        if budget is not None and reported > budget * (1 + 1e-6):
            raise InvalidReply(f"epsilon {reported:.6g} exceeds the silo's budget {budget:g}")

    def person_level_summary(self, reported: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The simulation's person-level keys from each silo's last reported person-level
        epsilon (None for a silo never heard from)."""
        figures = {int(cid): PersonEpsilon(**value) for cid, value in reported.items()}
        out = person_summary(self.config.privacy.records_per_person, figures)
        out["person_epsilon_per_client"] = [
            figures[c].epsilon if c in figures else None for c in range(self.shape.num_clients)
        ]
        return out

    def evaluate(self, state: dict[str, Any], round_idx: int, transport: Transport) -> tuple[dict[str, Any], list[dict]]:
        """Every reachable silo's scores of the global and its personal model, summarised
        under the simulation's names (``global_client_mse_mean``, ``personal_mse_mean``...);
        silos that do not answer are left out of this round's scores."""
        request = wire.pack({"round": round_idx, "server": self.algorithm.silo_view(state["server"])})
        silos = sorted(set(transport.reachable()) - {int(c) for c in state.get("quarantined", {})})
        replies = transport.exchange("evaluate", round_idx, {cid: request for cid in silos}) if silos else {}
        answered = []
        for cid in silos:
            reply = replies.get(cid)
            if reply is not None and not isinstance(reply, Failure):
                answered.append(wire.unpack(*reply))
        rows = [{"client": a["client"], "num_train": a["num_train"], "num_test": a["num_test"]} for a in answered]
        metrics: dict[str, Any] = {"evaluated_silos": len(answered)}
        for kind in ("global", "personal"):
            with_kind = [(row, a[kind]) for row, a in zip(rows, answered) if kind in a]
            if with_kind:
                kind_rows, scores = zip(*with_kind)
                metrics.update(summarize_client_scores(kind, self.score, list(scores), list(kind_rows)))
        return metrics, rows
