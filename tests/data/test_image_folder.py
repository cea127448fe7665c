"""The ``image_folder`` data set (issue 39, item 3): class subfolders (and client folders
first), resize, grayscale, per-channel normalisation, each bad input one line; tiny PNGs
are written in each test with known pixel values."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedveil.config import DataConfig
from fedveil.data.errors import DataError
from fedveil.data.loaders.image_folder import load_image_folder
from fedveil.runtime.dataset import build_dataset


def png(path: Path, value: int, size=(4, 6), rgb=True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.full((*size, 3) if rgb else size, value, dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def test_class_subfolders_become_labels_in_name_order_with_pixels_in_0_1(tmp_path):
    png(tmp_path / "imgs" / "dog" / "a.png", 51)
    png(tmp_path / "imgs" / "cat" / "b.png", 255)
    png(tmp_path / "imgs" / "cat" / "c.png", 0)
    (tmp_path / "imgs" / "cat" / "notes.txt").write_text("not an image")
    source = load_image_folder(tmp_path, path="imgs")
    assert source.train.info["classes"] == ["cat", "dog"] and source.num_classes == 2
    assert source.train.y.tolist() == [0, 0, 1]
    assert source.train.x.shape == (3, 3, 4, 6)
    assert source.train.x[:, 0, 0, 0].tolist() == pytest.approx([1.0, 0.0, 0.2])


def test_resize_grayscale_and_per_channel_normalisation(tmp_path):
    png(tmp_path / "imgs" / "a" / "1.png", 100, size=(8, 8))
    png(tmp_path / "imgs" / "b" / "2.png", 200, size=(5, 7))
    with pytest.raises(DataError, match=r"images of 2 different sizes .*set data.options.size"):
        load_image_folder(tmp_path, path="imgs")
    source = load_image_folder(tmp_path, path="imgs", size=[4, 4], grayscale=True, normalize="per_channel")
    x = source.train.x
    assert x.shape == (2, 1, 4, 4)
    assert x.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert x[0].flatten().unique().tolist() == pytest.approx([-x[1].flatten().unique().item()])


def test_client_folders_give_a_natural_partition(tmp_path):
    for client, n in (("clinic-a", 3), ("clinic-b", 5)):
        for i in range(n):
            png(tmp_path / "silos" / client / ("sick" if i % 2 else "well") / f"{i}.png", 10 * i)
    source = load_image_folder(tmp_path, path="silos", client_folders=True)
    assert source.natural_groups == "client" and source.train.groups["client"].tolist() == [0] * 3 + [1] * 5
    assert source.train.info["group_categories"]["client"] == ["clinic-a", "clinic-b"]
    data = build_dataset(DataConfig(name="image_folder", root=str(tmp_path), num_clients=2, test_fraction=0.4,
                                    options={"path": "silos", "client_folders": True},
                                    partition={"name": "natural", "key": "client"}), seed=0)
    assert sorted(c.num_train + len(c.test) for c in data.clients) == [3, 5]


def test_a_test_folder_uses_the_training_classes(tmp_path):
    png(tmp_path / "train" / "cat" / "a.png", 1)
    png(tmp_path / "train" / "dog" / "b.png", 2)
    png(tmp_path / "test" / "dog" / "c.png", 3)
    source = load_image_folder(tmp_path, path="train", test_path="test")
    assert source.test.y.tolist() == [1]
    png(tmp_path / "odd" / "fox" / "d.png", 3)
    with pytest.raises(DataError, match="class folder 'fox' is not one of the training classes cat, dog"):
        load_image_folder(tmp_path, path="train", test_path="odd")


@pytest.mark.parametrize("expected, setup, options", [
    ("data.options.path: give the folder", lambda p: None, {}),
    ("does not exist", lambda p: None, {"path": "nowhere"}),
    ("has no class subfolder", lambda p: (p / "flat").mkdir(), {"path": "flat"}),
    ("holds no image files", lambda p: (p / "empty" / "cat").mkdir(parents=True), {"path": "empty"}),
    ("is not an image Pillow can read", lambda p: ((p / "bad" / "cat").mkdir(parents=True), (p / "bad" / "cat" / "x.png").write_text("no")),
     {"path": "bad"}),
    ("data.options.size: [4] is not [height, width]", lambda p: None, {"path": "x", "size": [4]}),
    ("data.options.normalize: 'zscore' is not none or per_channel", lambda p: None, {"path": "x", "normalize": "zscore"}),
])
def test_each_bad_input_is_one_line(tmp_path, expected, setup, options):
    setup(tmp_path)
    with pytest.raises(DataError) as caught:
        load_image_folder(tmp_path, **options)
    assert expected in str(caught.value) and "\n" not in str(caught.value)
