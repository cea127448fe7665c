import numpy as np
import pytest
import torch

from fedveil.data.arrays import ArrayDataset
from fedveil.data.federated import build_federated
from fedveil.data.label_plot import label_distribution_table, plot_label_distribution
from fedveil.data.partition import ClassWindowPartitioner

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_table_rows_and_totals():
    table = label_distribution_table(np.array([[1, 2, 0], [3, 4, 10]]), class_names=["cat", "dog", "eel"])
    lines = table.splitlines()
    assert lines[0].split() == ["client", "cat", "dog", "eel", "total"]
    assert lines[2].split() == ["0", "1", "2", "0", "3"]
    assert lines[3].split() == ["1", "3", "4", "10", "17"]
    assert lines[-1].split() == ["total", "4", "6", "10", "20"]


def test_table_rejects_bad_input():
    with pytest.raises(ValueError, match="num_clients, num_classes"):
        label_distribution_table(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="2 class names for 3 classes"):
        label_distribution_table(np.ones((2, 3), dtype=int), class_names=["a", "b"])


def test_plot_writes_png(tmp_path):
    path = tmp_path / "labels.png"
    plot_label_distribution(np.arange(12).reshape(3, 4), path, title="toy")
    assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_plot_large_matrix_without_annotations(tmp_path):
    path = tmp_path / "big.png"
    plot_label_distribution(np.random.default_rng(0).integers(0, 50, (50, 41)), path)
    assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_counts_from_a_federated_dataset(tmp_path):
    y = torch.arange(4).repeat_interleave(10)
    data = ArrayDataset(torch.zeros(40, 2), y)
    parts = ClassWindowPartitioner(ClassWindowPartitioner.Params(window=2, stride=2)).split(
        data, 2, np.random.default_rng(0)
    )
    fed = build_federated(
        "toy", data, parts, task="classification", num_classes=4, pooled_test=None,
        val_fraction=0.0, test_fraction=0.2, seed=0,
    )
    counts = fed.label_counts()
    assert counts.sum() == 32  # 20 rows per client, 4 of them held out for test
    assert label_distribution_table(counts).splitlines()[-1].split()[-1] == "32"
    plot_label_distribution(counts, tmp_path / "fed.png")
    assert (tmp_path / "fed.png").read_bytes()[:8] == PNG_SIGNATURE
