"""The ``huggingface`` data set (issue 39, item 4), on tiny data sets saved on disk in the
test (never the network): image and feature columns, ClassLabel names, a client column for
the natural partition, splits of a DatasetDict, each bad option one line."""
from __future__ import annotations

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from fedveil.config import DataConfig  # noqa: E402
from fedveil.data.errors import DataError  # noqa: E402
from fedveil.data.loaders.huggingface import load_huggingface  # noqa: E402
from fedveil.runtime.dataset import build_dataset  # noqa: E402


def image_dataset(tmp_path):
    """Six 4x4 grey images, pixel value 10*i, two ClassLabel classes, three writers."""
    from PIL import Image

    images = [Image.fromarray(np.full((4, 4), 10 * i, dtype=np.uint8)) for i in range(6)]
    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["ant", "bee"]),
                                  "writer": datasets.Value("string")})
    table = datasets.Dataset.from_dict({"img": images, "label": [0, 1, 0, 1, 1, 0],
                                        "writer": ["w2", "w1", "w2", "w3", "w1", "w3"]}, features=features)
    test = datasets.Dataset.from_dict({"img": images[:2], "label": [1, 0], "writer": ["w9", "w9"]}, features=features)
    datasets.DatasetDict({"train": table, "test": test}).save_to_disk(str(tmp_path / "writers"))


def test_an_image_dataset_with_classlabels_and_a_client_column(tmp_path):
    image_dataset(tmp_path)
    source = load_huggingface(tmp_path, path="writers", image="img", client="writer", test_split="test")
    assert source.train.x.shape == (6, 1, 4, 4) and source.num_classes == 2
    assert source.train.info["classes"] == ["ant", "bee"]
    assert source.train.x[:, 0, 0, 0].tolist() == pytest.approx([10 * i / 255 for i in range(6)])
    assert source.train.groups["writer"].tolist() == [1, 0, 1, 2, 0, 2]  # w1 < w2 < w3
    assert source.natural_groups == "writer" and source.test.y.tolist() == [1, 0]
    data = build_dataset(DataConfig(name="huggingface", root=str(tmp_path), num_clients=3, test_fraction=0.5,
                                    options={"path": "writers", "image": "img", "client": "writer"},
                                    partition={"name": "natural", "key": "writer"}), seed=0)
    assert [c.num_train + len(c.test) for c in data.clients] == [2, 2, 2]


def test_feature_columns_and_a_regression_label(tmp_path):
    datasets.Dataset.from_dict({"a": [1.0, 2.0, 3.0], "b": [[0.5, 1.5], [2.5, 3.5], [4.5, 5.5]], "score": [0.1, 0.2, 0.3]}) \
        .save_to_disk(str(tmp_path / "tab"))
    source = load_huggingface(tmp_path, path="tab", features=["a", "b"], label="score", task="regression")
    assert source.task == "regression" and source.num_classes == 0
    assert source.train.x.tolist() == [[1.0, 0.5, 1.5], [2.0, 2.5, 3.5], [3.0, 4.5, 5.5]]
    assert source.train.y.tolist() == pytest.approx([0.1, 0.2, 0.3])


@pytest.mark.parametrize("expected, options", [
    ("data.options.path: give a folder", {}),
    ("give either image (an image column) or features", {"path": "writers"}),
    ("data.options.image: no column 'picture'; the data set has img, label, writer", {"path": "writers", "image": "picture"}),
    ("has splits train, test, not 'validation'", {"path": "writers", "image": "img", "split": "validation"}),
    ("data.options.label: column 'writer' is not a number per row", {"path": "writers", "image": "img", "label": "writer"}),
    ("data.options.task: 'ranking' is not classification or regression", {"path": "writers", "image": "img", "task": "ranking"}),
])
def test_each_bad_option_is_one_line(tmp_path, expected, options):
    image_dataset(tmp_path)
    with pytest.raises(DataError) as caught:
        load_huggingface(tmp_path, **options)
    assert expected in str(caught.value) and "\n" not in str(caught.value)
