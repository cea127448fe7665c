"""Find a data set's files on disk, or fetch them from their canonical source.

Downloads go to a hidden temporary file next to the target, are checked against the
published md5, and only then renamed into place, so an interrupted or corrupt transfer
never leaves a file that a later run would take for the real one.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

from .errors import DataError
from .source import DATA_ENV_VAR

TIMEOUT_S = 30
CHUNK = 1 << 20
# Python >= 3.11.4 can also sanitise members itself; older ones rely on our checks alone.
_SAFE_FILTER = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


@dataclass(frozen=True)
class RemoteFile:
    """One file of a data set: its name in the data directory, where to fetch it, and its
    md5 (``None`` where no published checksum could be confirmed: then it is not checked)."""

    name: str
    url: str
    md5: str | None = None


def _how_to_fix(dataset_name: str, data_dir: Path, files: list[RemoteFile]) -> str:
    sources = ", ".join(f.url for f in files)
    return (
        f"To fix: download the files yourself ({sources}) and put them in {data_dir}, "
        f"or point to a directory that has them with data.root=<dir> (root=<dir> in "
        f"Python) or the {DATA_ENV_VAR} environment variable (which is searched as "
        f"${DATA_ENV_VAR}/{dataset_name})"
    )


def _open(url: str):
    """The response for ``url`` (http, https or file), waiting at most ``TIMEOUT_S``."""
    return urllib.request.urlopen(url, timeout=TIMEOUT_S)


def _fetch(file: RemoteFile, data_dir: Path) -> None:
    """Download ``file`` into ``data_dir``; on any failure remove the partial file and
    raise ``OSError``, ``ValueError`` or ``HTTPException`` with the reason."""
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".part", dir=data_dir)
    try:
        digest = hashlib.md5(usedforsecurity=False)
        with os.fdopen(fd, "wb") as out, _open(file.url) as src:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
        if file.md5 is not None and digest.hexdigest() != file.md5:
            raise ValueError(
                f"checksum mismatch for {file.name}: md5 {digest.hexdigest()}, "
                f"expected {file.md5} (the download is corrupt or the file has changed)"
            )
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; a data file is for everyone
        os.replace(tmp, data_dir / file.name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ensure_files(
    dataset_name: str, data_dir: Path, files: list[RemoteFile], download: bool, *, note: str = ""
) -> Path:
    """``data_dir`` once every one of ``files`` is in it, downloading missing ones if
    ``download`` allows; else a :class:`DataError` that says what is missing and how to
    get it. ``note`` (e.g. another layout the loader accepts) is added to that message."""
    data_dir = Path(data_dir)
    missing = [f for f in files if not (data_dir / f.name).is_file()]
    if not missing:
        return data_dir
    names = ", ".join(f.name for f in missing)
    extra = f" {note}." if note else ""
    if not download:
        raise DataError(
            f"data set '{dataset_name}' not found: {data_dir} lacks {names} and downloading "
            f"is switched off (data.download=true, or download=True in Python, allows it)."
            f"{extra} {_how_to_fix(dataset_name, data_dir, missing)}"
        )
    for file in missing:
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            _fetch(file, data_dir)
        except (OSError, ValueError, http.client.HTTPException) as err:
            raise DataError(
                f"data set '{dataset_name}' not found in {data_dir} (missing: {names}) and "
                f"downloading {file.url} failed: {err}.{extra} "
                f"{_how_to_fix(dataset_name, data_dir, missing)}"
            ) from err
    return data_dir


def extract_tar(path: Path, dest: Path) -> None:
    """Unpack the tar archive ``path`` into ``dest``, all or nothing.

    Members that are links or devices, or whose path would land outside ``dest``, are
    refused with a :class:`DataError`. The archive is unpacked into a hidden temporary
    folder first and its top-level entries are moved into ``dest`` only when every member
    came out, so a corrupt or truncated archive leaves nothing behind.
    """
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{Path(path).name}.", suffix=".part", dir=dest))
    try:
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            for m in members:
                inside = (dest / m.name).resolve().is_relative_to(dest)
                if not inside or not (m.isfile() or m.isdir()):
                    raise DataError(
                        f"{path} holds an unsafe entry '{m.name}' (a link, a device or a path "
                        f"outside {dest}); refusing to extract it. Delete the archive and "
                        "download it again from its canonical source"
                    )
            tar.extractall(staging, members=members, **_SAFE_FILTER)
        for entry in staging.iterdir():
            os.replace(entry, dest / entry.name)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise DataError(
            f"cannot extract {path} into {dest}: {err}. The archive is corrupt or truncated, "
            "or the folder is not writable; delete the archive and download it again"
        ) from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
