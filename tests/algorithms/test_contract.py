"""What every registered algorithm promises the runtime."""
import io

import pytest
import torch
from pydantic import ValidationError

from fedveil.algorithms import ALGORITHMS
from harness import make_algorithm, run_rounds

NAMES = ALGORITHMS.names()  # new algorithms are covered as soon as they register


def test_registered_names():
    expected = {"ditto", "fedadam", "fedavg", "fedavg_ft", "fedavg_then_local", "fedavgm", "fednova", "fedprox",
                "fedyogi", "ifca", "local", "mocha", "mr_mtl", "scaffold"}
    assert expected <= set(NAMES)  # the methods that exist today stay registered
    assert all(entry.description and entry.obj.__doc__ for entry in ALGORITHMS.entries())


@pytest.mark.parametrize("name", NAMES)
def test_params_are_typed_and_documented(name):
    params = ALGORITHMS.get(name).Params
    assert all(f.description for f in params.model_fields.values())
    with pytest.raises(ValidationError):
        params(no_such_setting=1)


def _tensors_only(tree):
    if isinstance(tree, dict):
        return all(_tensors_only(v) for v in tree.values())
    return isinstance(tree, (torch.Tensor, int, float))


# Methods whose model cannot be the toy harness's linear regressor; each names the test
# that checks the same promise with its own model.
OWN_HARNESS = {
    "fade": "tests/runtime/test_fade.py::test_state_is_plain_checkpointable_data",
    "split_mix": "tests/algorithms/test_split_mix.py::test_state_is_plain_checkpointable_data",
    "heterofl": "tests/runtime/test_resume.py::test_every_algorithm_resumes_exactly (digit_cnn, plain params state)",
    "sheterofl": "tests/runtime/test_resume.py::test_every_algorithm_resumes_exactly (digit_cnn, plain params state)",
    "adds": "tests/runtime/test_resume.py::test_every_algorithm_resumes_exactly (adds_vgg, plain params state)",
    "feddrop": "tests/runtime/test_resume.py::test_every_algorithm_resumes_exactly (adds_vgg, plain params state)",
    "fedfed_distill": "tests/runtime/test_resume.py::test_every_algorithm_resumes_exactly (fedfed_vae, plain params state)",
    **{f"fedfed_{base}": "tests/runtime/test_resume.py::test_every_algorithm_resumes_exactly (a distiller run; the shared "
       "pool is a dict of tensors)" for base in ("fedavg", "fedprox", "scaffold", "fednova")},
}


@pytest.mark.parametrize("name", NAMES)
def test_state_is_plain_checkpointable_data(name):
    if name in OWN_HARNESS:
        pytest.skip(f"needs its own model and data: checked by {OWN_HARNESS[name]}")
    run = run_rounds(make_algorithm(name, client={"batch_size": 2}), 2, cohorts=[[0, 2], [1, 2]])
    states = {"server": run.server, "clients": {c: s for c, s in run.clients.items() if s is not None}}
    assert _tensors_only(states)
    buffer = io.BytesIO()
    torch.save(states, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert torch.equal(loaded["server"]["params"]["weight"], run.server["params"]["weight"])
