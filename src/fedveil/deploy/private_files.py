"""Files only their owner may read: a silo's rows, ledger, states and round records, and
private keys.

Every such file is *created* with mode 0600 (``os.open(..., 0o600)``), never written
first and chmod-ed after, so no other user can open it even for an instant; it is written
to a temporary file beside it and renamed into place (a crash leaves the old file or the
new one, both 0600). Folders are created 0700, each missing parent too. Creation modes
only ever lose bits to the umask, so the result is never wider than 0600 / 0700 whatever
the umask; the owner's own bits are then set back on the open file or the new folder
(``fchmod`` / ``chmod``, which only adds owner bits), so an unusual umask such as 0o277
does not leave a file its owner cannot rewrite.

Folders that already exist are left as they are (an operator's ``/data/federation`` keeps
its mode); files are replaced, so a rewritten file is 0600 even where an older one was not.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable

from ..runtime.run_dir import atomic_write

FILE_MODE = 0o600
FOLDER_MODE = 0o700


def private_folder(path: str | os.PathLike) -> Path:
    """``path`` as a folder, creating it and each missing parent with mode 0700."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, FOLDER_MODE)
        except FileExistsError:  # made meanwhile by another process: leave it as it is
            continue
        os.chmod(folder, FOLDER_MODE)  # the umask may have taken owner bits: only adds them back
    if not path.is_dir():
        raise NotADirectoryError(f"'{path}' exists and is not a folder")
    return path


def write_private(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(handle)`` on a new 0600 temporary file beside ``path``, fsync it and
    rename it to ``path`` (whose folder must exist)."""
    path = Path(path)
    atomic_write(path, write, mode=FILE_MODE)
    return path


def write_private_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """``data`` as the 0600 file ``path`` (atomically, as :func:`write_private`)."""
    return write_private(path, lambda handle: handle.write(data))
