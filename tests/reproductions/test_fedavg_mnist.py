"""The FedAvg-MNIST reproduction's rounds-to-target and its list of departures from the paper."""
from fedveil.reproduce import ReproductionContext
from fedveil_reproductions.fedavg_mnist import _config, departures, rounds_to


def test_rounds_to_target_is_the_first_round_at_or_above_it():
    rows = [{"round": 1, "global_test_accuracy": 0.90}, {"round": 2, "train_loss": 0.3},
            {"round": 3, "global_test_accuracy": 0.95}, {"round": 4, "global_test_accuracy": 0.94}]
    assert rounds_to(rows, 0.95) == 3
    assert rounds_to(rows, 0.90) == 1
    assert rounds_to(rows, 0.96) is None


def test_every_departure_is_listed_from_the_config(tmp_path):
    full = departures(_config(ReproductionContext(out_dir=tmp_path, quick=False, data_root=tmp_path), 0))
    text = " ".join(full)
    for fragment in ("10,000-image", "Dirichlet(0.5)", "C = 0.5", "1,663,370 parameters", "momentum 0.9",
                     "E = 1 epoch, B = 32", "20 rounds"):
        assert fragment in text
    quick = departures(_config(ReproductionContext(out_dir=tmp_path, quick=True, data_root=tmp_path), 0))
    assert "here at width 0.5" in " ".join(quick) and "5 rounds" in " ".join(quick)
