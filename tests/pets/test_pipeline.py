"""End to end: tables -> silos -> features -> DP-SGD / MR-MTL -> AP, on an easy hand-made outbreak."""
from __future__ import annotations

import numpy as np
import pytest

from fedveil.pets.epidemic import hidden_week_target
from fedveil.pets.pipeline import Metrics, PipelineConfig, prepare, run_centralised, run_federated, run_sir_baseline
from fedveil.pets.logreg import TrainConfig
from fedveil.pets.tables import NUM_DAYS, PandemicTables, outcome_table, split_by_region


def easy_tables(households=1000, seed=0) -> PandemicTables:
    """Two-person households, one contact each. In 40% of them the first person falls ill (I for
    5 days, then R) on a random day 0..55 and the partner follows 6 days later (80%), so every
    partner infected in the hidden week is announced by the first person's I or R in the window."""
    rng = np.random.default_rng(seed)
    n = 2 * households
    states = np.zeros((n, NUM_DAYS + 7), dtype=np.int8)

    def infect(person, day):
        if day < states.shape[1]:
            states[person, day : day + 5] = 1
            states[person, day + 5 :] = 2

    for h in range(households):
        if rng.random() < 0.4:
            day = int(rng.integers(0, 56))
            infect(2 * h, day)
            if rng.random() < 0.8:
                infect(2 * h + 1, day + 6)
    hid = np.repeat(np.arange(1, households + 1), 2)
    pids = np.arange(1, n + 1)
    return PandemicTables(
        person={"pid": pids, "hid": hid, "person_number": np.tile([1, 2], households),
                "age": rng.integers(0, 90, n), "sex": rng.integers(1, 3, n)},
        household={"hid": np.arange(1, households + 1), "hh_size": np.full(households, 2),
                   "region": (np.arange(households) >= 0.6 * households).astype(int)},
        residence_locations={"rlid": 1000 + np.arange(1, households + 1), "longitude": rng.uniform(-80, -79, households),
                             "latitude": rng.uniform(37, 38, households)},
        activity_locations={c: np.zeros(0, dtype=int) for c in
                            ("alid", "longitude", "latitude", "work", "shopping", "school", "other", "college", "religion")},
        activity_location_assignment={"pid": pids, "activity_number": np.ones(n, dtype=int), "activity_type": np.ones(n, dtype=int),
                                      "start_time": np.zeros(n, dtype=int), "duration": np.full(n, 86400), "lid": 1000 + hid},
        population_network={"pid1": pids[0::2], "pid2": pids[1::2], "lid": 1000 + np.arange(1, households + 1),
                             "start_time": np.full(households, 64800), "duration": np.full(households, 36000),
                             "activity1": np.ones(households, dtype=int), "activity2": np.ones(households, dtype=int)},
        disease_outcome=outcome_table(pids, states[:, :NUM_DAYS]),
        target={"pid": pids, "infected": hidden_week_target(states)},
    )


def test_split_by_region_partitions_people_and_cuts_cross_contacts(tiny):
    silos = split_by_region(tiny)
    assert sorted(silos) == [0, 1]
    np.testing.assert_array_equal(silos[0].person["pid"], [10, 20, 30])
    np.testing.assert_array_equal(silos[1].person["pid"], [40])
    # contacts 10-40 and 30-40 cross the border and are cut; 10-20 (twice) stays
    np.testing.assert_array_equal(silos[0].population_network["pid1"], [10, 20])
    assert len(silos[1].population_network["pid1"]) == 0
    assert len(silos[0].disease_outcome["pid"]) == 3 * NUM_DAYS
    np.testing.assert_array_equal(silos[1].activity_locations["alid"], [3])  # pid 40 shops at location 3
    np.testing.assert_array_equal(silos[1].residence_locations["rlid"], [103])


def test_federated_mrmtl_beats_random_on_an_easy_outbreak():
    data = easy_tables()
    central, silos = prepare(data, num_neighbours=1)
    assert {k: s.num_nodes for k, s in silos.items()} == {"region0": 1200, "region1": 800}
    cfg = PipelineConfig(num_neighbours=1, train=TrainConfig(batch_size=64, lr=1.0, noise_multiplier=0.0),
                         central_epochs=3, rounds=2, local_epochs=2)
    fed = run_federated(silos, cfg)
    m = fed.metrics
    assert m.positives >= 10 and m.num_people == 2000
    assert m.ap > 5 * m.positive_rate  # random guess: AP = positive rate
    assert fed.silos[0].steps == 2 * 2 * (1200 // 64)
    assert run_centralised(central, cfg).metrics.ap > 5 * m.positive_rate
    # the constant-risk SIR baseline ranks people only by silo
    assert run_sir_baseline(silos).metrics.ap < 2 * m.positive_rate
    # Theorem 2.4.4's epsilon is reported per silo with delta = 1/n_k; sigma = 0 is not private
    assert fed.silos[0].thm244["thesis"].delta == 1 / 1200 and fed.silos[0].thm244["thesis"].epsilon == float("inf")


def test_thm244_epsilon_is_finite_with_noise_and_larger_for_the_thesis_exponent():
    data = easy_tables(households=300)
    _, silos = prepare(data, num_neighbours=1)
    cfg = PipelineConfig(num_neighbours=1, train=TrainConfig(batch_size=32, noise_multiplier=1.0), rounds=1, local_epochs=1)
    res = run_federated(silos, cfg)
    for s in res.silos:
        assert s.thm244_s == 2  # own neighbourhood + the partner's
        assert 0 < s.thm244["code"].epsilon < s.thm244["thesis"].epsilon < float("inf")


def test_metrics_and_config_errors():
    m = Metrics.of(np.array([0.9, 0.1, 0.8, 0.2]), np.array([1, 0, 0, 0]))
    assert (m.ap, m.recall, m.positives) == (1.0, 1.0, 1)
    assert m.f1 == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="as many predictions"):
        Metrics.of(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match="num_neighbours"):
        PipelineConfig(num_neighbours=0)
    with pytest.raises(ValueError, match="at least one silo"):
        run_federated({}, PipelineConfig())
