"""A silo's own long-lived process: the only code that opens its rows, state, ledger and
identity key (``fedveil deploy silo``; docs/deployment.md, "Silo service").

Flower's SuperNode runs whatever ClientApp the SuperLink's run names, and anyone who can
submit a run to the SuperLink names it. So the silo's data does not live where that code
runs: a :class:`SiloService` holds the :class:`~.silo.Silo` (fedveil's installed code,
warm between messages: imports, rows and state stay in memory) and answers, on a Unix
socket (:mod:`.silo_socket`), only the protocol's requests, each validated like a request
from the server itself: ``query`` (its silo id, signed with its key for the server's
nonce), ``train``, ``evaluate`` and the stages of secure aggregation. Anything else is refused before the silo's data is touched.
Run the service as the account that owns the silo folder and the SuperNode as another
account that may only connect to the socket (``socket_group``): then an app someone
submitted can get no more than the server could, the silo's DP-noised replies within the
plan its folder was prepared for and its ``max_epsilon``.
"""
from __future__ import annotations

import io
import json
import logging
import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pydantic

from ..config import validate
from ..errors import ConfigError
from . import wire
from .silo import SECAGG_KINDS, Silo, SiloRefused
from .silo_data import SiloDataError
from .silo_identity import load_silo_key, sign_claim
from .silo_table import load_silo_table
from .silo_socket import MAX_FRAME_BYTES, FrameError, recv_frame, send_frame

OPS = ("query", "train", "evaluate", *SECAGG_KINDS)
NUMPY = "numpy.ndarray"  # Flower's serialisation type of an Array made from a NumPy array
READY = "silo service listening on"  # logged once the socket accepts connections
READ_TIMEOUT_S = 60.0  # a client that starts a frame and stalls is dropped after this long
LOG = logging.getLogger("fedveil.deploy.silo_service")


class Refusal(ValueError):
    """A request the service will not serve; the message is the one line the caller gets."""


def arrays_to_blobs(arrays: dict[str, np.ndarray]) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Arrays as the protocol's (descriptions, blobs): ``.npy`` bytes, as Flower's Array holds them."""
    described, blobs = [], []
    for key, array in arrays.items():
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        described.append({"key": key, "dtype": str(array.dtype), "shape": list(array.shape), "stype": NUMPY})
        blobs.append(buffer.getvalue())
    return described, blobs


def blobs_to_arrays(described: Any, blobs: list[bytes]) -> dict[str, np.ndarray]:
    """The inverse of :func:`arrays_to_blobs`; a malformed list or blob is a :class:`Refusal`."""
    if not isinstance(described, list) or len(described) != len(blobs):
        raise Refusal("the request's array list does not match its blobs")
    arrays = {}
    for item, blob in zip(described, blobs):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str) or item.get("stype") != NUMPY:
            raise Refusal("every array must be a keyed NumPy array")
        try:
            array = np.load(io.BytesIO(blob), allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:
            raise Refusal(f"array '{item['key']}' is not a NumPy array: {err}") from None
        if array.dtype.hasobject or array.dtype.kind not in "biuf":
            raise Refusal(f"array '{item['key']}' has dtype {array.dtype}: only numbers cross")
        arrays[item["key"]] = array
    return arrays


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:500]


class SiloService:
    """Silo ``folder`` served on the Unix socket ``socket_path`` (see the module docstring).

    ``state_dir`` (default ``folder/state``), ``max_epsilon`` (refuse a run whose plan
    spends more), ``share_metrics`` and ``table`` (the silo's own CSV or Parquet file,
    encoded by the schema in the folder's ``federation.json``; else ``silo.pt``) are the
    silo operator's settings; ``socket_group``
    (a group name or id) lets that group's accounts (the SuperNode's) connect, else only
    the service's own account can.
    """

    def __init__(
        self, folder: str | os.PathLike, socket_path: str | os.PathLike, state_dir: str | os.PathLike | None = None,
        max_epsilon: float | None = None, share_metrics: bool | None = None, socket_group: str | int | None = None,
        max_bytes: int = MAX_FRAME_BYTES, table: str | os.PathLike | None = None,
    ) -> None:
        self.folder, self.socket_path = Path(folder), Path(socket_path)
        self.state_dir, self.max_epsilon, self.share_metrics = state_dir, max_epsilon, share_metrics
        self.socket_group, self.max_bytes = socket_group, max_bytes
        if not self.folder.is_dir():
            raise SiloDataError(f"silo folder '{folder}' does not exist")
        self.key = load_silo_key(self.folder)
        # the silo's own file, read and checked against the federation's schema now: a bad
        # file stops the service at start, not at the first training step
        self.own_rows = None if table is None else load_silo_table(self.folder, table)
        self._silos: dict[str, Silo] = {}  # by the run config's JSON: one silo object per config, kept warm

    # ------------------------------------------------------------------ requests
    def silo(self, config_json: Any) -> Silo:
        """The warm silo for the run config ``config_json`` (built on first use; refused when
        the folder was prepared for another config or the plan exceeds ``max_epsilon``)."""
        if not isinstance(config_json, str):
            raise Refusal("the request carries no run config")
        if config_json not in self._silos:
            try:
                config = validate(json.loads(config_json))
            except (json.JSONDecodeError, pydantic.ValidationError, ConfigError) as err:
                raise Refusal(f"the run config is not a valid fedveil config: {_one_line(err)}") from None
            try:
                silo = Silo.from_folder(config, self.folder, self.state_dir, self.share_metrics, self.own_rows)
            except SiloDataError as err:  # said without the folder's path, which the caller need not learn
                raise Refusal(str(err).replace(f"'{self.folder}'", "this silo's folder")) from None
            if self.max_epsilon is not None and silo.privacy is not None:
                planned = silo.planned_epsilon_through(config.federation.rounds - 1)
                if planned > self.max_epsilon * (1 + 1e-9):
                    raise SiloRefused(
                        f"silo {silo.client_id}: the run's plan spends epsilon={planned:.4g} > its max-epsilon {self.max_epsilon}"
                    )
            self._silos[config_json] = silo
        return self._silos[config_json]

    def handle(self, header: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """Answer one request frame: ``{"op", "config", "meta", "node_id", "arrays"}`` and its blobs."""
        op = header.get("op")
        if op not in OPS:
            raise Refusal(f"unknown request {op!r}: a silo answers only {', '.join(OPS)}")
        meta = header.get("meta")
        if not isinstance(meta, dict):
            raise Refusal("the request has no meta record")
        silo = self.silo(header.get("config"))
        if op == "query":
            return {"ok": True, "meta": self._claim(silo, meta.get("nonce"), header.get("node_id")), "arrays": []}, []
        round_idx, skeleton = meta.get("round"), meta.get("skeleton")
        if not isinstance(round_idx, int) or isinstance(round_idx, bool) or round_idx < 0 or not isinstance(skeleton, str):
            raise Refusal(f"a {op} request needs a round number >= 0 and a skeleton")
        tensors = wire.tensors_from_numpy(blobs_to_arrays(header.get("arrays"), blobs))
        reply_tensors, reply_skeleton = silo.answer(op, round_idx, tensors, skeleton)
        described, reply_blobs = arrays_to_blobs(wire.tensors_to_numpy(reply_tensors))
        LOG.info("silo %d: round %d %s answered", silo.client_id, round_idx + 1, op)
        return {"ok": True, "meta": {"skeleton": reply_skeleton}, "arrays": described}, reply_blobs

    def _claim(self, silo: Silo, nonce: Any, node_id: Any) -> dict[str, Any]:
        claim: dict[str, Any] = {"silo": silo.client_id}
        if self.key is not None and isinstance(nonce, str) and isinstance(node_id, int):
            claim["signature"] = sign_claim(self.key, nonce, silo.client_id, node_id)
        return claim

    def answer(self, header: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """:meth:`handle`, with every refusal or failure turned into a one-line error reply:
        one bad request never stops the service."""
        try:
            return self.handle(header, blobs)
        except (Refusal, SiloRefused, SiloDataError, wire.WireError, ConfigError) as err:
            LOG.warning("refused a %r request: %s", header.get("op"), _one_line(err))
            return {"ok": False, "error": _one_line(err)}, []
        except Exception as err:  # a bug or an unforeseen input: report it, keep serving
            LOG.exception("a %r request failed", header.get("op"))
            return {"ok": False, "error": f"{type(err).__name__}: {_one_line(err)}"}, []

    # ------------------------------------------------------------------ socket
    def bind(self) -> socket.socket:
        """The listening socket, created 0600 (0660 with ``socket_group``); a stale socket
        file left by a killed service is replaced, any other file is not."""
        path = self.socket_path
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise SiloDataError(f"'{path}' exists and is not a socket; give another --socket")
            path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            server.bind(str(path))
        finally:
            os.umask(old)
        if self.socket_group is not None:
            gid = self.socket_group if isinstance(self.socket_group, int) else _group_id(self.socket_group)
            os.chown(path, -1, gid)
            os.chmod(path, 0o660)
        server.listen(8)
        return server

    def serve(self, ready: threading.Event | None = None, stop: threading.Event | None = None) -> None:
        """Serve requests one at a time until ``stop`` is set (or forever)."""
        server = self.bind()
        server.settimeout(0.5)
        LOG.info("%s %s (silo folder %s)", READY, self.socket_path, self.folder)
        if ready is not None:
            ready.set()
        try:
            while stop is None or not stop.is_set():
                try:
                    conn, _ = server.accept()
                except socket.timeout:
                    continue
                with conn:
                    self._serve_one(conn)
        finally:
            server.close()
            self.socket_path.unlink(missing_ok=True)

    def _serve_one(self, conn: socket.socket) -> None:
        conn.settimeout(READ_TIMEOUT_S)
        try:
            header, blobs = recv_frame(conn, self.max_bytes)
        except (FrameError, OSError) as err:
            LOG.warning("dropped a connection: %s", _one_line(err))
            try:
                send_frame(conn, {"ok": False, "error": _one_line(err)})
            except OSError:
                pass
            return
        conn.settimeout(None)
        reply, reply_blobs = self.answer(header, blobs)
        try:
            send_frame(conn, reply, reply_blobs)
        except OSError as err:
            LOG.warning("could not send a reply: %s", _one_line(err))


def _group_id(name: str) -> int:
    import grp

    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise SiloDataError(f"no group named '{name}' on this machine") from None
