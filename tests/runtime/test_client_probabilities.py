"""``federation.client_probabilities``: weighted fixed-size cohorts (FADE's imbalanced users).

Expected frequencies are worked out by hand: with one client a round, client k joins a
round with probability p_k, so its count over R rounds is Binomial(R, p_k); with two of
three clients drawn one after the other without replacement from weights (0.5, 0.25, 0.25),
client 0 is left out only when the cohort is {1, 2}, which has probability
2 * 0.25 * 0.25 / 0.75 = 1/6.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from fedveil.config import ConfigError, validate
from fedveil.runtime.sampling import client_schedule, selection_probabilities
from fedveil.runtime.simulation import Simulation
from fedveil.seeding import numpy_generator
from tiny_runs import tiny_raw


def counts(schedule, num_clients: int) -> np.ndarray:
    out = np.zeros(num_clients, dtype=int)
    for cohort in schedule:
        out[cohort] += 1
    return out


def assert_binomial(count: int, rounds: int, p: float) -> None:
    sd = math.sqrt(rounds * p * (1 - p))
    assert abs(count - rounds * p) <= 4 * sd, (count, rounds * p, sd)


# --- the schedule -------------------------------------------------------------------------


def test_zero_weight_clients_are_never_drawn():
    schedule = client_schedule(6, 2, 500, "fixed", seed=3, probabilities=[1.0, 0.0, 2.0, 0.0, 3.0, 4.0])
    assert len(schedule) == 500
    for cohort in schedule:
        assert len(cohort) == 2 and len(set(cohort.tolist())) == 2
        assert set(cohort.tolist()) <= {0, 2, 4, 5}
        assert cohort.tolist() == sorted(cohort.tolist())
    seen = counts(schedule, 6)
    assert seen[1] == 0 and seen[3] == 0
    assert (seen[[0, 2, 4, 5]] > 0).all()  # every weighted client does turn up in 500 rounds


def test_only_the_non_zero_clients_form_every_cohort_when_there_are_exactly_m_of_them():
    schedule = client_schedule(5, 2, 50, "fixed", seed=0, probabilities=[0, 0.3, 0, 0.7, 0])
    assert all(cohort.tolist() == [1, 3] for cohort in schedule)


def test_one_client_a_round_frequency_is_binomial():
    rounds = 4000
    schedule = client_schedule(2, 1, rounds, "fixed", seed=11, probabilities=[0.9, 0.1])
    assert all(len(c) == 1 for c in schedule)
    seen = counts(schedule, 2)
    assert seen.sum() == rounds
    assert_binomial(int(seen[1]), rounds, 0.1)
    # and not uniform: 0.5 * 4000 = 2000 is ~80 standard deviations away
    assert seen[1] < 1000


def test_one_client_a_round_frequency_among_four_clients():
    rounds = 4000
    schedule = client_schedule(4, 1, rounds, "fixed", seed=5, probabilities=[0.3, 0.3, 0.3, 0.1])
    seen = counts(schedule, 4)
    assert_binomial(int(seen[3]), rounds, 0.1)
    for k in range(3):
        assert_binomial(int(seen[k]), rounds, 0.3)


def test_two_of_three_inclusion_follows_sequential_draws_without_replacement():
    rounds = 4000
    schedule = client_schedule(3, 2, rounds, "fixed", seed=2, probabilities=[0.5, 0.25, 0.25])
    seen = counts(schedule, 3)
    assert seen.sum() == 2 * rounds
    assert_binomial(int(seen[0]), rounds, 5 / 6)  # uniform sampling would give 2/3
    assert_binomial(int(seen[1]), rounds, 7 / 12)  # (2 - 5/6) / 2 each for clients 1 and 2


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("n,m,rounds", [(10, 3, 20), (5, 5, 4), (8, 1, 30)])
def test_without_probabilities_the_schedule_is_unchanged(seed, n, m, rounds):
    rng = numpy_generator(seed, "client-sampling")
    expected = [sorted(rng.choice(n, m, replace=False).tolist()) for _ in range(rounds)]
    got = client_schedule(n, m, rounds, "fixed", seed)
    assert [c.tolist() for c in got] == expected
    assert [c.tolist() for c in client_schedule(n, m, rounds, "fixed", seed, None)] == expected


def test_weighted_schedule_is_numpys_weighted_choice_on_the_sampling_stream():
    rng = numpy_generator(4, "client-sampling")
    p = np.array([0.2, 0.6, 0.2])
    expected = [sorted(rng.choice(3, 1, replace=False, p=p).tolist()) for _ in range(30)]
    got = client_schedule(3, 1, 30, "fixed", 4, probabilities=[0.2, 0.6, 0.2])
    assert [c.tolist() for c in got] == expected


def test_weights_are_normalised():
    a = client_schedule(2, 1, 200, "fixed", 9, probabilities=[2.0, 2.0])
    b = client_schedule(2, 1, 200, "fixed", 9, probabilities=[0.5, 0.5])
    assert [c.tolist() for c in a] == [c.tolist() for c in b]
    c = client_schedule(3, 1, 200, "fixed", 9, probabilities=[1.0, 3.0, 1.0])
    d = client_schedule(3, 1, 200, "fixed", 9, probabilities=[0.2, 0.6, 0.2])
    assert [x.tolist() for x in c] == [x.tolist() for x in d]
    # both clients of [2, 2] do get drawn (a schedule of one client only would also "match")
    assert set(counts(a, 2).nonzero()[0].tolist()) == {0, 1}


def test_selection_probabilities_normalises_and_checks():
    assert selection_probabilities([2, 6, 2], 3, 1, "fixed").tolist() == [0.2, 0.6, 0.2]
    assert selection_probabilities([0, 4], 2, 1, "fixed").tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="finite"):
        selection_probabilities([1.0, float("inf")], 2, 1, "fixed")
    with pytest.raises(ValueError, match="finite"):
        selection_probabilities([1.0, float("nan")], 2, 1, "fixed")


def test_seed_changes_the_weighted_schedule():
    a = client_schedule(4, 1, 100, "fixed", 0, probabilities=[1, 1, 1, 1])
    b = client_schedule(4, 1, 100, "fixed", 1, probabilities=[1, 1, 1, 1])
    assert [c.tolist() for c in a] != [c.tolist() for c in b]


# --- through the config -------------------------------------------------------------------


def raw(**sections):
    return tiny_raw(**sections)


def test_simulation_uses_the_configured_probabilities():
    config = validate(raw(
        data={"num_clients": 4}, federation={"rounds": 4000, "clients_per_round": 1, "client_probabilities": [0.3, 0.0, 0.6, 0.1]},
    ))
    schedule = Simulation.from_config(config).schedule
    assert len(schedule) == 4000
    seen = counts(schedule, 4)
    assert seen[1] == 0
    assert_binomial(int(seen[3]), 4000, 0.1)
    assert_binomial(int(seen[2]), 4000, 0.6)


def test_simulation_without_probabilities_keeps_the_uniform_schedule():
    config = validate(raw(data={"num_clients": 5}, federation={"rounds": 6, "clients_per_round": 3}))
    assert config.federation.client_probabilities is None
    rng = numpy_generator(0, "client-sampling")
    expected = [sorted(rng.choice(5, 3, replace=False).tolist()) for _ in range(6)]
    assert [c.tolist() for c in Simulation.from_config(config).schedule] == expected


def config_error(**sections) -> str:
    with pytest.raises(ConfigError) as err:
        Simulation.from_config(validate(raw(**sections)))
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize(
    "federation,pattern",
    [
        ({"client_probabilities": [0.5, 0.5]}, r"^federation: client_probabilities has 2 entries for 5 clients"),
        ({"client_probabilities": [1, 1, 1, 1, 1, 1]}, r"^federation: client_probabilities has 6 entries for 5 clients"),
        ({"client_probabilities": [1, 1, -0.5, 1, 1]}, r"^federation: client_probabilities must be finite and >= 0"),
        (
            {"client_probabilities": [1, 0, 0, 1, 0], "clients_per_round": 3},
            r"^federation: client_probabilities gives only 2 clients a chance but clients_per_round=3",
        ),
        ({"client_probabilities": [1, 1, 1, 1, 1], "sampling": "poisson"}, r"^federation: .*sampling = \"fixed\""),
    ],
)
def test_bad_probabilities_are_one_line_config_errors(federation, pattern):
    import re

    message = config_error(data={"num_clients": 5}, federation=federation)
    assert re.search(pattern, message), message


def test_client_level_dp_refuses_weighted_sampling():
    message = config_error(
        data={"num_clients": 10},
        federation={"rounds": 2, "clients_per_round": 2, "client_probabilities": [1] * 9 + [3]},
        privacy={"level": "client", "noise_multiplier": 1.0},
    )
    assert message.startswith("federation.client_probabilities: client-level DP accounts uniform cohort sampling")


def test_client_level_dp_without_probabilities_is_accepted():
    # the refusal above is due to the probabilities, not to the rest of that config
    config = validate(raw(
        data={"num_clients": 10}, federation={"rounds": 2, "clients_per_round": 2},
        privacy={"level": "client", "noise_multiplier": 1.0},
    ))
    assert Simulation.from_config(config).privacy is not None


def test_example_level_dp_accepts_weighted_sampling():
    config = validate(raw(
        data={"num_clients": 4},
        federation={"rounds": 3, "clients_per_round": 1, "client_probabilities": [0.9, 0.0, 0.0, 0.1]},
        privacy={"level": "example", "noise_multiplier": 1.0},
    ))
    sim = Simulation.from_config(config)
    assert sim.privacy is not None
    assert all(c.tolist() in ([0], [3]) for c in sim.schedule)
