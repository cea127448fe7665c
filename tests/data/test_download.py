"""ensure_files and extract_tar: local files, file:// downloads, failures leave nothing."""
from __future__ import annotations

import hashlib
import http.client
import io
import tarfile

import pytest

from fedveil.data import DataError
from fedveil.data import download as dl
from fedveil.data.download import RemoteFile, ensure_files, extract_tar

PAYLOAD = b"real bytes of a data file\n" * 100


def served(tmp_path, name="served.bin", content=PAYLOAD):
    """A file:// URL serving ``content``, and its md5."""
    src = tmp_path / "server"
    src.mkdir(exist_ok=True)
    (src / name).write_bytes(content)
    return (src / name).as_uri(), hashlib.md5(content).hexdigest()


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_files_present_need_no_network(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x")
    files = [RemoteFile("a.bin", "http://127.0.0.1:9/a.bin", "0" * 32)]
    assert ensure_files("toy", tmp_path, files, download=False) == tmp_path


def test_missing_without_download_says_where_and_how(tmp_path):
    data_dir = tmp_path / "nowhere"
    files = [RemoteFile("a.bin", "https://example.org/a.bin"), RemoteFile("b.bin", "https://example.org/b.bin")]
    with pytest.raises(DataError) as err:
        ensure_files("toy", data_dir, files, download=False)
    message = str(err.value)
    for part in ("'toy'", str(data_dir), "a.bin", "b.bin", "https://example.org/a.bin",
                 "data.root=", "FEDVEIL_DATA", "switched off"):
        assert part in message
    assert not data_dir.exists()


def test_download_verifies_md5_and_renames_into_place(tmp_path):
    url, md5 = served(tmp_path)
    data_dir = tmp_path / "new" / "toy"
    assert ensure_files("toy", data_dir, [RemoteFile("a.bin", url, md5)], download=True) == data_dir
    assert (data_dir / "a.bin").read_bytes() == PAYLOAD
    assert leftovers(data_dir) == ["a.bin"]


def test_md5_none_skips_the_check(tmp_path):
    url, _ = served(tmp_path)
    ensure_files("toy", tmp_path / "d", [RemoteFile("a.bin", url, None)], download=True)
    assert (tmp_path / "d" / "a.bin").read_bytes() == PAYLOAD


def test_md5_mismatch_is_refused_and_removed(tmp_path):
    url, _ = served(tmp_path)
    data_dir = tmp_path / "d"
    with pytest.raises(DataError, match="checksum mismatch") as err:
        ensure_files("toy", data_dir, [RemoteFile("a.bin", url, "0" * 32)], download=True)
    assert url in str(err.value) and "'toy'" in str(err.value)
    assert leftovers(data_dir) == []


def test_unreachable_url_names_url_and_leaves_nothing(tmp_path):
    url = "http://127.0.0.1:9/a.bin"  # the discard port: nothing listens there
    data_dir = tmp_path / "d"
    with pytest.raises(DataError) as err:
        ensure_files("toy", data_dir, [RemoteFile("a.bin", url, None)], download=True)
    message = str(err.value)
    assert url in message and str(data_dir) in message and "FEDVEIL_DATA" in message
    assert leftovers(data_dir) == []


def test_interrupted_transfer_leaves_no_partial_file(tmp_path, monkeypatch):
    class Broken(io.BytesIO):
        def read(self, size=-1):
            if self.tell():
                raise http.client.IncompleteRead(b"")
            return super().read(10)

    monkeypatch.setattr(dl, "_open", lambda url: Broken(PAYLOAD))
    with pytest.raises(DataError, match="IncompleteRead"):
        ensure_files("toy", tmp_path, [RemoteFile("a.bin", "https://x/a.bin")], download=True)
    assert leftovers(tmp_path) == []


def test_earlier_good_files_are_kept_when_a_later_one_fails(tmp_path):
    url, md5 = served(tmp_path)
    data_dir = tmp_path / "d"
    files = [RemoteFile("a.bin", url, md5), RemoteFile("b.bin", "http://127.0.0.1:9/b.bin")]
    with pytest.raises(DataError, match="b.bin"):
        ensure_files("toy", data_dir, files, download=True)
    assert leftovers(data_dir) == ["a.bin"]


def make_tar(path, entries):
    """A .tar.gz at ``path``; ``entries`` maps names to bytes (``None``: a symlink)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, content in entries.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return path


def test_extract_tar(tmp_path):
    archive = make_tar(tmp_path / "a.tar.gz", {"top/x.bin": b"xx", "top/sub/y.bin": b"yyy"})
    dest = tmp_path / "out"
    extract_tar(archive, dest)
    assert (dest / "top" / "x.bin").read_bytes() == b"xx"
    assert (dest / "top" / "sub" / "y.bin").read_bytes() == b"yyy"
    assert leftovers(dest) == ["top"]


@pytest.mark.parametrize("bad", ["../escape.bin", "/abs/escape.bin", "top/link"])
def test_extract_tar_refuses_unsafe_members(tmp_path, bad):
    content = None if bad.endswith("link") else b"evil"
    archive = make_tar(tmp_path / "a.tar.gz", {"top/ok.bin": b"ok", bad: content})
    dest = tmp_path / "out"
    with pytest.raises(DataError, match="unsafe entry"):
        extract_tar(archive, dest)
    assert leftovers(dest) == []
    assert not (tmp_path / "escape.bin").exists()


def test_extract_truncated_tar_leaves_nothing(tmp_path):
    archive = make_tar(tmp_path / "a.tar.gz", {"top/x.bin": bytes(range(256)) * 400})
    archive.write_bytes(archive.read_bytes()[:-200])
    dest = tmp_path / "out"
    with pytest.raises(DataError, match="a.tar.gz"):
        extract_tar(archive, dest)
    assert leftovers(dest) == []
