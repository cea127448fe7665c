"""Shakespeare next-character prediction with one client per speaking role, as in LEAF.

Reads a directory of plain-text works in the Project Gutenberg layout, one ``.txt`` per
work: front matter (title, list of persons), then ``ACT``/``SCENE`` headings; each speech
starts with the speaker's name alone on a line after a blank line (``Ham.``,
``First Clown.``, ``BOATSWAIN.`` or, in some editions, ``THESEUS`` without the dot),
followed by the spoken lines; stage directions are in ``[...]`` and may span lines.
A speech runs until the next speaker or heading, across stage directions and blank
lines. Works without act or scene headings (poems, sonnets) have no roles and are skipped.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch

from ..arrays import ArrayDataset
from ..errors import DataError
from ..source import DATASETS, DataSource, resolve_data_dir

VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))  # newline and printable ASCII
UNKNOWN = len(VOCAB)  # index of every character outside VOCAB
_LOOKUP = np.full(129, UNKNOWN, dtype=np.int64)  # code point (capped at 128) -> index
_LOOKUP[[ord(c) for c in VOCAB]] = np.arange(len(VOCAB))

_HEADING = re.compile(
    r"^(act|scene)(\s*[.:,-]|\s+([ivxlc]+|\d+|first|second|third|fourth|fifth)\b|\s*$)",
    re.IGNORECASE,
)
_NAME = re.compile(r"^[A-Z0-9][\w'&.-]*(?: [\w'&.-]+){0,4}$")
_NAME_LINKS = {"and", "of", "the", "de", "la", "le", "du"}  # lower-case words inside names
_GUTENBERG_MARK = re.compile(r"^\*\*\*\s*(START|END) OF", re.IGNORECASE)


def _speaker(line: str) -> str | None:
    """The role named by ``line`` if it looks like a speaker line, else ``None``.

    A name has at most five words, each capitalised, a number or a linking word
    ("First Clown.", "1 Clown.", "MRS. PAGE.", "Ros. and Guil."); without a final dot it
    must be upper case, so a verse line such as "Till" is not a name.
    """
    name = line[:-1] if line.endswith(".") else line
    if not _NAME.match(name):
        return None
    if any(not (w[0].isupper() or w[0].isdigit() or w in _NAME_LINKS) for w in name.split(" ")):
        return None
    if name == line and name != name.upper():
        return None
    return name


def _strip_directions(line: str, inside: bool) -> tuple[str, bool]:
    """``line`` without ``[...]`` stage directions (whitespace collapsed), and whether a
    direction is still open at its end."""
    kept = []
    for ch in line:
        if ch == "[":
            inside = True
        elif ch == "]":
            inside = False
        elif not inside:
            kept.append(ch)
    return " ".join("".join(kept).split()), inside


def parse_play(text: str) -> dict[str, str]:
    """Speech of each role of one work, keyed by role name in order of first appearance;
    lines of all the role's speeches joined by newlines. ``{}`` for works without
    act or scene headings."""
    lines = text.splitlines()
    marks = [i for i, line in enumerate(lines) if _GUTENBERG_MARK.match(line)]
    if len(marks) >= 2:  # a full Gutenberg file: keep what lies between its licence blocks
        lines = lines[marks[0] + 1 : marks[1]]
    speech: dict[str, list[str]] = {}
    role, in_body, after_blank, in_direction = None, False, True, False
    for raw in lines:
        if not raw.strip():
            after_blank, in_direction = True, False  # an unclosed "[" ends with its paragraph
            continue
        line, in_direction = _strip_directions(raw, in_direction)
        if _HEADING.match(line):
            role, in_body, after_blank = None, True, True
            continue
        if not line:  # a line of stage directions only
            after_blank = True
            continue
        name = _speaker(line) if after_blank and not raw[0].isspace() else None
        if in_body and name is not None:
            role = name
        elif in_body and role is not None:
            speech.setdefault(role, []).append(line)
        after_blank = False
    return {r: "\n".join(spoken) for r, spoken in speech.items()}


def encode(text: str) -> np.ndarray:
    """Indices of ``text``'s characters in :data:`VOCAB` (:data:`UNKNOWN` for others)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return _LOOKUP[np.minimum(codes, 128)]


def _windows(codes: np.ndarray, seq_len: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of ``seq_len`` indices starting every ``stride``, each with its next index."""
    starts = np.arange(0, len(codes) - seq_len, stride)
    return codes[starts[:, None] + np.arange(seq_len)], codes[starts + seq_len]


def _read_roles(data_dir: Path) -> list[tuple[str, str]]:
    """("PLAY:ROLE", speech) for every role of every work, plays in file-name order."""
    files = sorted(data_dir.glob("*.txt")) if data_dir.is_dir() else []
    if not files:
        raise DataError(
            f"no Shakespeare plays in {data_dir}: put the works there as plain-text files, "
            "one Project Gutenberg .txt per play (e.g. hamlet.txt), or pass root=/ set "
            "$FEDVEIL_DATA to where they are. They cannot be downloaded automatically: "
            "Project Gutenberg ships the complete works as one file, not one per play"
        )
    roles = []
    for path in files:
        text = path.read_text(encoding="utf-8-sig", errors="replace")
        roles.extend((f"{path.stem}:{role}", speech) for role, speech in parse_play(text).items())
    return roles


@DATASETS.register("shakespeare", "Shakespeare next-character prediction, a client per speaking role")
def load_shakespeare(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    seq_len: int = 80,
    stride: int | None = None,
    min_chars: int = 1000,
    max_roles: int | None = None,
) -> DataSource:
    """Windows of ``seq_len`` characters -> the next character, grouped by speaking role.

    Every role with at least ``min_chars`` characters of speech is one group
    (``groups["client"]``, names in ``info["roles"]`` as "PLAY:ROLE"); ``max_roles`` keeps
    only that many roles with the most speech, in the same order. Windows start every
    ``stride`` characters (default ``seq_len``: non-overlapping, to bound memory).
    ``download`` is accepted like every loader's, but nothing can be fetched: Project
    Gutenberg ships the complete works as one file, not one file per play.
    """
    stride = seq_len if stride is None else stride
    if seq_len < 1 or stride < 1:
        raise ValueError(f"seq_len and stride must be >= 1, got {seq_len} and {stride}")
    if max_roles is not None and max_roles < 1:
        raise ValueError(f"max_roles must be >= 1 (or None for all roles), got {max_roles}")
    if min_chars <= seq_len:
        raise ValueError(
            f"min_chars ({min_chars}) must exceed seq_len ({seq_len}) so every role has a window"
        )
    roles = _read_roles(resolve_data_dir("shakespeare", root))
    roles = [(name, speech) for name, speech in roles if len(speech) >= min_chars]
    if max_roles is not None:
        largest = sorted(range(len(roles)), key=lambda i: (-len(roles[i][1]), i))[:max_roles]
        roles = [roles[i] for i in sorted(largest)]
    if not roles:
        raise DataError(
            f"no speaking role has {min_chars} characters of speech in the plays found; "
            "check that the files are plays in the Gutenberg layout or lower min_chars"
        )
    xs, ys, clients = [], [], []
    for index, (_, speech) in enumerate(roles):
        x, y = _windows(encode(speech), seq_len, stride)
        xs.append(x)
        ys.append(y)
        clients.append(np.full(len(y), index, dtype=np.int64))
    info = {"roles": [n for n, _ in roles], "vocab": VOCAB, "unknown_index": UNKNOWN}
    train = ArrayDataset(
        torch.from_numpy(np.concatenate(xs)),
        torch.from_numpy(np.concatenate(ys)),
        {"client": torch.from_numpy(np.concatenate(clients))},
        info,
    )
    return DataSource(train, None, "classification", UNKNOWN + 1, natural_groups="client")
