"""MNIST / Fashion-MNIST (IDX), CIFAR-10/100 (python pickles) and digits loaders, on tiny
files written by hand in the original formats."""
from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import tarfile

import numpy as np
import pytest
import torch

from fedveil.data import DATASETS, DataError
from fedveil.data.loaders import cifar, mnist
from fedveil.data.loaders.cifar import load_cifar10, load_cifar100
from fedveil.data.loaders.digits import load_digits
from fedveil.data.loaders.mnist import load_fashion_mnist, load_mnist, read_idx
from mnist_idx_files import idx  # tests/data helper: tiny IDX files

# --- MNIST / Fashion-MNIST ----------------------------------------------------------------


def digits_like(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n, dtype=np.uint8)


def write(path, content: bytes, gz: bool):
    if gz:
        path = path.with_name(path.name + ".gz")
        content = gzip.compress(content)
    path.write_bytes(content)
    return path


def write_mnist(directory, gz=True, n_train=5, n_test=3):
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {"train": digits_like(n_train, 0), "t10k": digits_like(n_test, 1)}
    for split, (images, labels) in arrays.items():
        write(directory / f"{split}-images-idx3-ubyte", idx(images), gz)
        write(directory / f"{split}-labels-idx1-ubyte", idx(labels), gz)
    return arrays


def assert_split(data, images, labels):
    assert data.x.dtype == torch.float32 and data.x.shape == (len(images), 1, 28, 28)
    assert torch.equal(data.x, torch.from_numpy(images.astype(np.float32) / 255).unsqueeze(1))
    assert data.y.dtype == torch.int64 and data.y.tolist() == labels.tolist()


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_official_files(tmp_path, gz):
    arrays = write_mnist(tmp_path, gz=gz)
    source = load_mnist(tmp_path, download=False)
    assert_split(source.train, *arrays["train"])
    assert_split(source.test, *arrays["t10k"])
    assert (source.task, source.num_classes) == ("classification", 10)
    assert source.train.info["classes"] == [str(d) for d in range(10)]
    assert source.train.x.min() >= 0 and source.train.x.max() <= 1


def test_mnist_subset_pair_is_train_only(tmp_path):
    images, labels = digits_like(4, 2)
    write(tmp_path / "images-idx3-ubyte", idx(images), gz=True)
    write(tmp_path / "labels-idx1-ubyte", idx(labels), gz=True)
    source = load_mnist(tmp_path, download=False)
    assert source.test is None
    assert_split(source.train, images, labels)


def test_fashion_mnist_same_layout_other_names(tmp_path):
    arrays = write_mnist(tmp_path)
    source = load_fashion_mnist(tmp_path, download=False)
    assert_split(source.train, *arrays["train"])
    assert source.train.info["classes"][0] == "T-shirt/top"
    assert source.train.info["classes"][9] == "Ankle boot"


def test_registered():
    assert DATASETS.get("mnist") is load_mnist
    assert DATASETS.get("fashion_mnist") is load_fashion_mnist
    assert DATASETS.get("cifar10") is load_cifar10
    assert DATASETS.get("cifar100") is load_cifar100
    assert DATASETS.get("digits") is load_digits


def test_read_idx_values_and_dims(tmp_path):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = write(tmp_path / "cube-idx3-ubyte", idx(array), gz=True)
    assert np.array_equal(read_idx(path), array)
    assert np.array_equal(read_idx(path, ndim=3), array)


@pytest.mark.parametrize(
    "content, match",
    [
        (idx(np.zeros((2, 28, 28)), magic_type=0x0D), "magic number 0x00000d03"),
        (b"\x12\x34" + idx(np.zeros((2, 28, 28)))[2:], "magic number 0x12340803"),
        (b"\0\0", "2 bytes"),
        (idx(np.zeros((2, 28, 28)))[:-1], "truncated"),
        (idx(np.zeros((2, 28, 28))) + b"\0", "truncated or corrupt"),
        (idx(np.zeros((2, 28, 28)))[:10], "truncated inside its header"),
    ],
)
def test_read_idx_rejects_bad_files(tmp_path, content, match):
    path = write(tmp_path / "bad-idx3-ubyte", content, gz=False)
    with pytest.raises(DataError, match=match) as err:
        read_idx(path)
    assert "bad-idx3-ubyte" in str(err.value)


def test_truncated_gzip_names_the_file(tmp_path):
    write_mnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz"):
        load_mnist(tmp_path, download=False)


def test_swapped_files_fail_on_dims(tmp_path):
    write_mnist(tmp_path)
    images, labels = tmp_path / "t10k-images-idx3-ubyte.gz", tmp_path / "t10k-labels-idx1-ubyte.gz"
    tmp = tmp_path / "swap"
    images.rename(tmp)
    labels.rename(images)
    tmp.rename(labels)
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte.gz.*expected 0x00000803"):
        load_mnist(tmp_path, download=False)


def test_image_and_label_counts_must_agree(tmp_path):
    write_mnist(tmp_path)
    write(tmp_path / "train-labels-idx1-ubyte", idx(np.zeros(4)), gz=True)
    with pytest.raises(DataError, match="5 images but train-labels-idx1-ubyte.gz has 4 labels"):
        load_mnist(tmp_path, download=False)


def test_wrong_image_size(tmp_path):
    write_mnist(tmp_path)
    write(tmp_path / "train-images-idx3-ubyte", idx(np.zeros((5, 8, 8))), gz=True)
    with pytest.raises(DataError, match="8x8 images, expected 28x28"):
        load_mnist(tmp_path, download=False)


def test_mnist_missing_directory(tmp_path):
    missing = tmp_path / "no-mnist-here"
    with pytest.raises(DataError) as err:
        load_mnist(missing, download=False)
    message = str(err.value)
    assert str(missing) in message and "train-images-idx3-ubyte.gz" in message
    assert "ossci-datasets.s3.amazonaws.com" in message and "images-idx3-ubyte.gz +" in message


def test_mnist_downloads_and_checks_md5(tmp_path, monkeypatch):
    server = tmp_path / "server"
    arrays = write_mnist(server)
    md5 = {p.name[:-3]: hashlib.md5(p.read_bytes()).hexdigest() for p in server.iterdir()}
    monkeypatch.setattr(mnist, "MNIST_URL", server.as_uri() + "/")
    monkeypatch.setattr(mnist, "MNIST_MD5", md5)
    source = load_mnist(tmp_path / "cache", download=True)
    assert_split(source.test, *arrays["t10k"])
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(os.listdir(server))

    monkeypatch.setattr(mnist, "MNIST_MD5", {k: "0" * 32 for k in md5})
    with pytest.raises(DataError, match="checksum mismatch"):
        load_mnist(tmp_path / "cache2", download=True)
    assert os.listdir(tmp_path / "cache2") == []


# --- CIFAR ----------------------------------------------------------------------------------


def pickle_to(path, obj):
    """Pickled as the originals are: protocol 2, bytes keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=2))


def cifar_batch(n, seed, **labels):
    rng = np.random.default_rng(seed)
    batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}
    batch.update({k.encode(): rng.integers(0, m, n).tolist() for k, m in labels.items()})
    return batch


CIFAR10_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer",
                 b"dog", b"frog", b"horse", b"ship", b"truck"]


def write_cifar10(folder):
    batches = {f"data_batch_{i}": cifar_batch(2, i, labels=10) for i in range(1, 6)}
    batches["test_batch"] = cifar_batch(3, 9, labels=10)
    for name, batch in batches.items():
        pickle_to(folder / name, batch)
    pickle_to(folder / "batches.meta", {b"label_names": CIFAR10_NAMES, b"num_vis": 3072})
    return batches


def images_of(*batches):
    data = np.concatenate([b[b"data"] for b in batches])
    return torch.from_numpy(data.astype(np.float32) / 255).reshape(-1, 3, 32, 32)


def test_cifar10_values(tmp_path):
    batches = write_cifar10(tmp_path / "cifar-10-batches-py")
    source = load_cifar10(tmp_path, download=False)
    train_batches = [batches[f"data_batch_{i}"] for i in range(1, 6)]
    assert source.train.x.shape == (10, 3, 32, 32) and source.train.x.dtype == torch.float32
    assert torch.equal(source.train.x, images_of(*train_batches))
    assert source.train.y.tolist() == sum((b[b"labels"] for b in train_batches), [])
    assert source.train.y.dtype == torch.int64
    assert torch.equal(source.test.x, images_of(batches["test_batch"]))
    assert source.test.y.tolist() == batches["test_batch"][b"labels"]
    assert source.train.info["classes"][:2] == ["airplane", "automobile"]
    # planes are stored one after another: green of pixel (0, 0) is byte 32 * 32
    first = train_batches[0][b"data"][0]
    assert source.train.x[0, 1, 0, 0] == torch.tensor(first[1024] / 255, dtype=torch.float32)
    assert (source.task, source.num_classes) == ("classification", 10)


def test_cifar10_root_may_be_the_extracted_folder(tmp_path):
    batches = write_cifar10(tmp_path / "cifar-10-batches-py")
    source = load_cifar10(tmp_path / "cifar-10-batches-py", download=False)
    assert torch.equal(source.test.x, images_of(batches["test_batch"]))


def test_cifar10_archive_is_extracted(tmp_path):
    batches = write_cifar10(tmp_path / "staging" / "cifar-10-batches-py")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with tarfile.open(data_dir / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "staging" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    source = load_cifar10(data_dir, download=False)
    assert torch.equal(source.test.x, images_of(batches["test_batch"]))
    assert sorted(os.listdir(data_dir)) == ["cifar-10-batches-py", "cifar-10-python.tar.gz"]


def test_cifar100_fine_and_coarse(tmp_path):
    folder = tmp_path / "cifar-100-python"
    train = cifar_batch(4, 0, fine_labels=100, coarse_labels=20)
    test = cifar_batch(2, 1, fine_labels=100, coarse_labels=20)
    pickle_to(folder / "train", train)
    pickle_to(folder / "test", test)
    fine = [f"fine{i}".encode() for i in range(100)]
    coarse = [f"coarse{i}".encode() for i in range(20)]
    pickle_to(folder / "meta", {b"fine_label_names": fine, b"coarse_label_names": coarse})
    source = load_cifar100(tmp_path, download=False)
    assert torch.equal(source.train.x, images_of(train))
    assert source.train.y.tolist() == train[b"fine_labels"]
    assert source.train.groups["coarse"].tolist() == train[b"coarse_labels"]
    assert source.test.groups["coarse"].tolist() == test[b"coarse_labels"]
    assert source.train.info["classes"][7] == "fine7"
    assert source.train.info["coarse_classes"][19] == "coarse19"
    assert source.num_classes == 100


def test_cifar_reads_numpy1_pickles(tmp_path):
    """The official files name numpy 1's module path, which numpy 2 renamed."""
    folder = tmp_path / "cifar-10-batches-py"
    batches = write_cifar10(folder)
    legacy = pickle.dumps(batches["test_batch"], protocol=2)
    legacy = legacy.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray" in legacy
    (folder / "test_batch").write_bytes(legacy)
    assert torch.equal(load_cifar10(tmp_path, download=False).test.x, images_of(batches["test_batch"]))


def test_cifar_corrupt_pickle(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar10(folder)
    (folder / "data_batch_3").write_bytes(pickle.dumps(cifar_batch(2, 3, labels=10))[:50])
    with pytest.raises(DataError, match="data_batch_3"):
        load_cifar10(tmp_path, download=False)


def test_cifar_wrong_shape(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar10(folder)
    pickle_to(folder / "test_batch", {b"data": np.zeros((3, 1024), np.uint8), b"labels": [0, 1, 2]})
    with pytest.raises(DataError, match=r"test_batch.*shape \(3, 1024\).*\(N, 3072\)"):
        load_cifar10(tmp_path, download=False)


def test_cifar_label_count_mismatch(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar10(folder)
    pickle_to(folder / "test_batch", {b"data": np.zeros((3, 3072), np.uint8), b"labels": [0, 1]})
    with pytest.raises(DataError, match="test_batch.*'labels'"):
        load_cifar10(tmp_path, download=False)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def test_cifar_pickle_cannot_run_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar10(folder)
    (folder / "data_batch_1").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(DataError, match="data_batch_1.*refusing"):
        load_cifar10(tmp_path, download=False)
    assert not (tmp_path / "pwned.txt").exists()


def test_cifar_missing_directory(tmp_path):
    with pytest.raises(DataError) as err:
        load_cifar100(tmp_path / "absent", download=False)
    message = str(err.value)
    assert str(tmp_path / "absent") in message and "cifar-100-python.tar.gz" in message
    assert "www.cs.toronto.edu/~kriz/" in message and "cifar-100-python/" in message


def test_cifar_archive_checksum_checked(tmp_path, monkeypatch):
    fake = tmp_path / "fake.tar.gz"
    fake.write_bytes(b"not the archive")
    monkeypatch.setattr(
        cifar, "CIFAR10_ARCHIVE",
        cifar.RemoteFile("cifar-10-python.tar.gz", fake.as_uri(), cifar.CIFAR10_ARCHIVE.md5),
    )
    with pytest.raises(DataError, match="checksum mismatch"):
        load_cifar10(tmp_path / "d", download=True)
    assert os.listdir(tmp_path / "d") == []


# --- digits ---------------------------------------------------------------------------------


def test_digits_bundled():
    from sklearn.datasets import load_digits as sk

    bunch = sk()
    source = load_digits(download=False)
    assert source.test is None and source.num_classes == 10
    assert source.train.x.shape == (1797, 1, 8, 8) and source.train.x.dtype == torch.float32
    assert torch.equal(source.train.x[:, 0], torch.from_numpy(bunch.images / 16).float())
    assert source.train.y.dtype == torch.int64
    assert source.train.y.tolist() == bunch.target.tolist()
