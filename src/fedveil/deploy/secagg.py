"""Secure aggregation: the server learns the sum of the surviving silos' updates and
nothing about any one of them (Bonawitz et al. 2017, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning", CCS, the semi-honest protocol of section 4 with every
pair of silos as neighbours; primitives in :mod:`.secagg_crypto`).

One round, for the cohort U of silos the server reached:

1. ``advertise``: each silo makes two X25519 key pairs, (c) to encrypt shares and (s) to
   agree pairwise masks, and sends both public keys (U1: those that answered).
2. ``share``: each silo draws a self-mask seed b_u, Shamir-shares b_u and its s private
   key t-of-|U1|, and sends silo v's two shares encrypted under the key it agrees with v
   (U2: those that answered). The server only routes ciphertexts.
3. ``train``: each silo trains as usual, encodes its update as the vector
   x_u = [p_u * delta_u, p_u] (p_u its FedAvg weight over a public scale), quantises it
   to integers (:mod:`fedveil.runtime.secure_sum`) and sends y_u = q(x_u) + PRG(b_u) + sum_v +-PRG(s_uv)
   mod 2^32, where s_uv is the key u agrees with v (+ if u < v, - if u > v) (U3: those
   that answered). Pairwise masks of two answering silos cancel in the sum.
4. ``unmask``: each silo of U3 sends its share of b_v for every v in U3 and of s_v for
   every v in U2 \\ U3 (never both for the same v; only once per round). With t shares the
   server rebuilds those secrets, removes the self masks and the dropped silos' leftover
   pairwise masks, and is left with sum_{u in U3} q(x_u) mod 2^32.

The server then divides the summed weighted update by the summed weight: FedAvg's mean
over the survivors, up to the quantisation error :func:`quantization_bound` bounds. A
round continues while at least ``threshold`` silos remain at every stage; otherwise the
model stays as it was and the round's silos are listed as dropped.

Secure against an honest-but-curious server and up to t - 1 colluding parties; not against
a server that lies about who dropped to *different* silos in the unmask stage (the
protocol's malicious variant needs signatures and a consistency round, not built).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import secagg_crypto as crypto


class SecAggError(ValueError):
    """A secure-aggregation step that cannot go on (too few silos, an inconsistent request)."""


def _hex(data: bytes) -> str:
    return data.hex()


def _unhex(text: Any, what: str) -> bytes:
    try:
        return bytes.fromhex(str(text))
    except ValueError:
        raise SecAggError(f"{what} is not hex") from None


def _is_hex(text: Any, size: int | None) -> bool:
    """Whether ``text`` is hex (of ``size`` bytes when given; at most 4 KiB otherwise)."""
    if not isinstance(text, str) or len(text) % 2 or len(text) > 8192:
        return False
    try:
        return size is None or len(bytes.fromhex(text)) == size
    except ValueError:
        return False


def _sign(u: int, v: int) -> int:
    return 1 if u < v else -1


@dataclass
class _ClientSession:
    c_private: bytes
    c_public: bytes
    s_private: bytes
    s_public: bytes
    publics: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # U1: v -> (c_pk, s_pk)
    self_seed: bytes = b""
    inbox: dict[int, bytes] = field(default_factory=dict)  # U2 \ {u}: v -> ciphertext to u
    own_shares: dict[str, str] = field(default_factory=dict)  # its own shares of b_u and s_u
    masked_for: frozenset[int] = frozenset()  # U2
    unmasked: bool = False


def key_advert(round_idx: int, silo: int, c_pk: str, s_pk: str) -> bytes:
    """What a silo signs with its identity key when it advertises its round keys."""
    return f"fedveil-secagg-keys|{round_idx}|{silo}|{c_pk}|{s_pk}".encode()


class SecAggClient:
    """Silo ``silo_id``'s side: one session per round, in memory only (a silo that restarts
    mid-round has lost it and counts as dropped from that round).

    With ``sign`` (the silo's identity key signing a payload, hex) and ``peer_keys`` (every
    silo's public identity key, from ``federation.json``) the round keys are authenticated:
    each advertisement is signed, and a silo shares its secrets only with silos whose
    advertisement verifies under their registered key. A server (or anyone who can submit a
    run) then cannot invent silos to collect t shares of one silo's secrets (the attack the
    protocol's PKI assumption rules out; Bonawitz et al. 2017, section 4).
    """

    def __init__(self, silo_id: int, threshold: int, sign=None, peer_keys: dict[int, str] | None = None) -> None:
        if threshold < 2:
            raise SecAggError(f"a threshold of {threshold} would let one silo's shares open another's secrets; use 2 or more")
        self.silo_id, self.threshold, self.sign, self.peer_keys = silo_id, threshold, sign, peer_keys
        self.sessions: dict[int, _ClientSession] = {}

    def advertise(self, round_idx: int) -> dict[str, str]:
        """Round ``round_idx``'s fresh key pairs (c for the channel, s for the
        masks): the public keys in hex, signed when the silo has an identity key."""
        c_private, c_public = crypto.new_key_pair()
        s_private, s_public = crypto.new_key_pair()
        self.sessions = {round_idx: _ClientSession(c_private, c_public, s_private, s_public)}  # older rounds are over
        advert = {"c_pk": _hex(c_public), "s_pk": _hex(s_public)}
        if self.sign is not None:
            advert["signature"] = self.sign(key_advert(round_idx, self.silo_id, advert["c_pk"], advert["s_pk"]))
        return advert

    def _check_signed(self, round_idx: int, publics: dict[int, dict[str, str]]) -> None:
        from .silo_identity import verify

        for v, p in publics.items():
            registered = self.peer_keys.get(int(v))
            if registered is None:
                raise SecAggError(f"silo {v} is not in the federation's silo keys")
            if not verify(registered, str(p.get("signature", "")), key_advert(round_idx, int(v), str(p["c_pk"]), str(p["s_pk"]))):
                raise SecAggError(f"the round keys of silo {v} are not signed by its registered key")

    def _session(self, round_idx: int) -> _ClientSession:
        if round_idx not in self.sessions:
            raise SecAggError(f"silo {self.silo_id} has no secure-aggregation session for round {round_idx + 1}")
        return self.sessions[round_idx]

    def share(self, round_idx: int, publics: dict[int, dict[str, str]]) -> dict[int, str]:
        """Encrypted shares of b_u and s_u for every other silo of U1 (``publics``)."""
        session = self._session(round_idx)
        if self.peer_keys is not None:
            self._check_signed(round_idx, publics)
        keys = {int(v): (_unhex(p["c_pk"], "c_pk"), _unhex(p["s_pk"], "s_pk")) for v, p in publics.items()}
        if keys.get(self.silo_id) != (session.c_public, session.s_public):
            raise SecAggError(f"silo {self.silo_id}: the key list does not hold its own keys")
        if len(keys) < self.threshold:
            raise SecAggError(f"only {len(keys)} silos advertised keys, fewer than the threshold {self.threshold}")
        if len({k for pair in keys.values() for k in pair}) != 2 * len(keys):
            raise SecAggError("two silos advertised the same public key")
        session.publics, session.self_seed = keys, os.urandom(crypto.SEED_BYTES)
        order = sorted(keys)
        b_shares = crypto.split_secret(session.self_seed, self.threshold, len(order))
        s_shares = crypto.split_secret(session.s_private, self.threshold, len(order))
        out = {}
        for index, v in enumerate(order):
            if v == self.silo_id:
                session.own_shares = {"b": _hex(b_shares[index]), "s": _hex(s_shares[index])}
                continue
            plaintext = json.dumps({"from": self.silo_id, "to": v, "b": _hex(b_shares[index]), "s": _hex(s_shares[index])})
            key = crypto.agree(session.c_private, keys[v][0])
            out[v] = _hex(crypto.encrypt(key, plaintext.encode(), _associated(round_idx, self.silo_id, v)))
        return out

    def mask(self, round_idx: int, inbox: dict[int, str], quantized: np.ndarray) -> np.ndarray:
        """y_u: ``quantized`` (uint32) plus its self mask and pairwise masks with U2 = the
        senders in ``inbox`` and itself."""
        session = self._session(round_idx)
        senders = {int(v) for v in inbox}
        if not senders <= set(session.publics) or self.silo_id in senders:
            raise SecAggError("the shares come from silos that did not advertise keys")
        if len(senders) + 1 < self.threshold:
            raise SecAggError(f"only {len(senders) + 1} silos shared keys, fewer than the threshold {self.threshold}")
        session.inbox = {int(v): _unhex(ct, "a share") for v, ct in inbox.items()}
        session.masked_for = frozenset(senders | {self.silo_id})
        total = quantized.astype(np.uint32) + crypto.mask(session.self_seed, quantized.size)
        for v in senders:
            pairwise = crypto.mask(crypto.agree(session.s_private, session.publics[v][1]), quantized.size)
            total = total + pairwise if _sign(self.silo_id, v) > 0 else total - pairwise
        return total.astype(np.uint32)

    def unmask(self, round_idx: int, survivors: list[int], dropped: list[int]) -> dict[str, dict[int, str]]:
        """Its shares of b_v for the ``survivors`` and of s_v for the ``dropped``; refused
        unless they split U2 exactly, include this silo and number at least the threshold."""
        session = self._session(round_idx)
        alive, gone = {int(v) for v in survivors}, {int(v) for v in dropped}
        if session.unmasked:
            raise SecAggError(f"silo {self.silo_id} already answered the unmask request of round {round_idx + 1}")
        if alive & gone or (alive | gone) != session.masked_for or self.silo_id not in alive:
            raise SecAggError("the survivors and the dropped silos do not split the silos that masked this round")
        if len(alive) < self.threshold:
            raise SecAggError(f"only {len(alive)} survivors, fewer than the threshold {self.threshold}")
        session.unmasked = True
        shares: dict[str, dict[int, str]] = {"b": {}, "s": {}}
        for v in sorted(alive | gone):
            if v == self.silo_id:
                shares["b"][v] = session.own_shares["b"]
                continue
            key = crypto.agree(session.c_private, session.publics[v][0])
            opened = json.loads(crypto.decrypt(key, session.inbox[v], _associated(round_idx, v, self.silo_id)))
            if opened.get("from") != v or opened.get("to") != self.silo_id:
                raise SecAggError(f"the share from silo {v} is addressed wrongly")
            which = "b" if v in alive else "s"
            shares[which][v] = opened[which]
        return shares


def _associated(round_idx: int, sender: int, receiver: int) -> bytes:
    return f"fedveil-secagg|{round_idx}|{sender}|{receiver}".encode()


class SecAggServer:
    """The server's side of one round: it routes and unmasks, and never holds a secret
    of a silo that has not dropped (its self-mask seed is rebuilt only for survivors)."""

    def __init__(self, threshold: int, round_idx: int) -> None:
        self.threshold, self.round_idx = threshold, round_idx
        self.publics: dict[int, dict[str, str]] = {}
        self.shared: dict[int, dict[int, str]] = {}
        self.rejected: dict[int, str] = {}  # silo -> why its stage reply was malformed (it is left out)

    def _reject(self, silo: int, why: str) -> None:
        self.rejected[int(silo)] = why

    def _enough(self, silos, stage: str) -> None:
        if len(silos) < self.threshold:
            raise SecAggError(f"{stage}: {len(silos)} silos answered, fewer than the threshold {self.threshold}")

    def collect_keys(self, replies: dict[int, dict[str, str]]) -> dict[int, dict[int, dict[str, str]]]:
        """From the ``advertise`` replies (U1), the ``share`` request of each silo: every key."""
        for u, r in replies.items():
            keys_ok = isinstance(r, dict) and {"c_pk", "s_pk"} <= set(r) <= {"c_pk", "s_pk", "signature"}
            if keys_ok and all(_is_hex(r[k], crypto.SEED_BYTES) for k in ("c_pk", "s_pk")) and _is_hex(r.get("signature", ""), None):
                self.publics[int(u)] = dict(r)
            else:
                self._reject(u, "advertise: not two 32-byte public keys (and a signature)")
        self._enough(self.publics, "advertise")
        return {u: self.publics for u in self.publics}

    def route_shares(self, replies: dict[int, dict[int, str]]) -> dict[int, dict[int, str]]:
        """From the ``share`` replies (U2), each silo's inbox: the ciphertexts addressed to it."""
        for u, r in replies.items():
            peers = set(self.publics) - {int(u)}
            if isinstance(r, dict) and set(r) == peers and all(_is_hex(ct, None) for ct in r.values()):
                self.shared[int(u)] = {int(v): ct for v, ct in r.items()}
            else:
                self._reject(u, "share: not one ciphertext for each other silo")
        self._enough(self.shared, "share")
        inbox: dict[int, dict[int, str]] = {u: {} for u in self.shared}
        for u, cts in self.shared.items():
            for v, ct in cts.items():
                if v in inbox:
                    inbox[v][u] = ct
        return inbox

    def unmask_request(self, masked: dict[int, Any]) -> tuple[list[int], list[int]]:
        """(survivors U3, dropped U2 \\ U3) from the silos whose masked vector arrived."""
        self._enough(masked, "masked input")
        survivors = sorted(int(u) for u in masked)
        return survivors, sorted(set(self.shared) - set(survivors))

    def unmasked_sum(
        self, masked: dict[int, np.ndarray], survivors: list[int], dropped: list[int], shares: dict[int, dict[str, dict[int, str]]],
    ) -> np.ndarray:
        """sum_{u in U3} q(x_u) mod 2^32, from the masked vectors and at least ``threshold``
        silos' ``unmask`` replies."""
        shares = {w: r for w, r in shares.items() if self._well_formed_unmask(w, r, survivors, dropped)}
        self._enough(shares, "unmask")
        order = sorted(self.publics)
        index = {v: order.index(v) + 1 for v in order}  # Shamir share numbers follow the sorted U1
        size = next(iter(masked.values())).size
        total = np.zeros(size, dtype=np.uint32)
        for u in survivors:
            total = total + masked[u].astype(np.uint32)
        for u in survivors:  # self masks
            total = total - crypto.mask(self._rebuild(shares, "b", u, index), size)
        for v in dropped:  # pairwise masks the survivors added for a silo that dropped
            s_private = self._rebuild(shares, "s", v, index)
            for u in survivors:
                pairwise = crypto.mask(crypto.agree(s_private, _unhex(self.publics[u]["s_pk"], "s_pk")), size)
                total = total - pairwise if _sign(u, v) > 0 else total + pairwise
        return total.astype(np.uint32)

    def _well_formed_unmask(self, silo: int, reply: Any, survivors: list[int], dropped: list[int]) -> bool:
        """Whether an unmask reply holds a share of b_v for each survivor and of s_v for each
        dropped silo, nothing else (a silo sending other shares is left out)."""
        ok = (
            isinstance(reply, dict) and set(reply) == {"b", "s"}
            and isinstance(reply["b"], dict) and set(reply["b"]) == set(survivors)
            and isinstance(reply["s"], dict) and set(reply["s"]) == set(dropped)
            and all(_is_hex(v, None) for part in reply.values() for v in part.values())
        )
        if not ok:
            self._reject(silo, "unmask: not one share per survivor and per dropped silo")
        return ok

    def _rebuild(self, shares: dict[int, dict[str, dict[int, str]]], which: str, silo: int, index: dict[int, int]) -> bytes:
        found = {index[w]: _unhex(r[which][silo], "a share") for w, r in shares.items() if silo in r.get(which, {})}
        if len(found) < self.threshold:
            raise SecAggError(f"unmask: {len(found)} shares of silo {silo}'s secret, fewer than the threshold")
        return crypto.combine_secret(found)
