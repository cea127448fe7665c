"""The local socket between a silo's Flower ClientApp and its silo service.

Only :mod:`.silo_service`, fedveil's installed code in the silo's own long-lived process,
opens the silo's rows, state, ledger and identity key. Whatever ClientApp Flower runs (the
fedveil forwarder of :mod:`.flower_client`, or an app someone else submitted) can only
send it frames over a Unix socket and gets back what the protocol gives: a signed claim,
a train reply (the silo's DP-noised update within its plan) or an evaluation.

A frame is ``MAGIC``, a 4-byte big-endian header length, a JSON header and the blobs the
header lists (``"blobs": [size, ...]``), each sent raw. Nothing is pickled; sizes are
checked against the limits before anything is read. This module imports no torch, so the
forwarder stays quick to start.
"""
from __future__ import annotations

import json
import socket
import struct
from typing import Any

MAGIC = b"FVS1"
MAX_HEADER_BYTES = 16 << 20
MAX_FRAME_BYTES = 2 << 30  # every blob of one frame together
CALL_TIMEOUT_S = 3600.0  # a training round may be long; a dead service closes the socket at once


class FrameError(ValueError):
    """A frame that is not fedveil's silo protocol (bad magic, size, JSON or blob list)."""


class SiloServiceError(RuntimeError):
    """The silo service refused a request or could not be reached; the message says why."""


def _read_exact(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise FrameError(f"connection closed {left} bytes before the end of a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def send_frame(conn: socket.socket, header: dict[str, Any], blobs: list[bytes] = ()) -> None:
    """Send ``header`` (JSON-able, without ``blobs``) and ``blobs`` as one frame."""
    text = json.dumps({**header, "blobs": [len(b) for b in blobs]}, allow_nan=False).encode()
    conn.sendall(MAGIC + struct.pack(">I", len(text)) + text)
    for blob in blobs:
        conn.sendall(blob)


def recv_frame(conn: socket.socket, max_bytes: int = MAX_FRAME_BYTES) -> tuple[dict[str, Any], list[bytes]]:
    """One frame's header and blobs; :class:`FrameError` (nothing else read) when it breaks the protocol."""
    if _read_exact(conn, 4) != MAGIC:
        raise FrameError("not a fedveil silo frame (bad magic)")
    (size,) = struct.unpack(">I", _read_exact(conn, 4))
    if size > MAX_HEADER_BYTES:
        raise FrameError(f"frame header of {size} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = json.loads(_read_exact(conn, size))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FrameError(f"frame header is not JSON: {err}") from None
    sizes = header.get("blobs") if isinstance(header, dict) else None
    if not isinstance(sizes, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in sizes):
        raise FrameError("frame header has no list of blob sizes")
    if sum(sizes) > max_bytes:
        raise FrameError(f"frame carries {sum(sizes)} bytes, more than the limit {max_bytes}")
    return header, [_read_exact(conn, s) for s in sizes]


def call(path: str, header: dict[str, Any], blobs: list[bytes] = (), timeout: float = CALL_TIMEOUT_S) -> tuple[dict[str, Any], list[bytes]]:
    """Send one request to the silo service at socket ``path``; its reply, or
    :class:`SiloServiceError` with the service's one-line reason."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(path)
            try:
                send_frame(conn, header, blobs)
            except BrokenPipeError:  # the service refused part-way (a frame over its limit): read why
                pass
            reply, reply_blobs = recv_frame(conn)
    except (OSError, FrameError) as err:
        raise SiloServiceError(f"silo service at '{path}' unreachable or broken: {err}") from None
    if not reply.get("ok"):
        raise SiloServiceError(str(reply.get("error", "the silo service refused without a reason")))
    return reply, reply_blobs
