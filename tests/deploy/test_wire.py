"""What crosses the wire comes back exactly, and nothing but plain data crosses."""
import math

import numpy as np
import pytest
import torch

from fedveil.deploy.wire import WireError, describe, pack, tensors_from_numpy, tensors_to_numpy, unpack


def test_nested_states_come_back_bit_for_bit():
    value = {
        "params": {"fc.weight": torch.randn(3, 4, dtype=torch.float64), "fc.bias": torch.arange(3, dtype=torch.int64)},
        "bases": [torch.ones(2, dtype=torch.float16), None, True, "x"],
        "plan": (1, 2.5, 0.1 + 0.2),
        7: {"n": np.int64(12), "w": np.float32(0.25)},
        "edge": [math.inf, -math.inf],
    }
    tensors, skeleton = pack(value)
    back = unpack(tensors, skeleton)
    assert set(back) == {"params", "bases", "plan", 7, "edge"}  # the int key comes back an int
    for k in ("fc.weight", "fc.bias"):
        assert back["params"][k].dtype == value["params"][k].dtype and torch.equal(back["params"][k], value["params"][k])
    assert back["bases"][0].dtype == torch.float16 and back["bases"][1:] == [None, True, "x"]
    assert back["plan"] == (1, 2.5, 0.30000000000000004) and isinstance(back["plan"], tuple)
    assert back[7] == {"n": 12, "w": 0.25}
    assert back["edge"] == [math.inf, -math.inf]
    nan_back = unpack(*pack({"x": float("nan")}))
    assert math.isnan(nan_back["x"])


def test_every_tensor_is_listed_with_its_bytes():
    tensors, skeleton = pack({"params": {"w": torch.zeros(5, 2)}, "round": 3})
    rows = describe(tensors, skeleton)
    assert rows[0] == {"key": "params/w", "shape": [5, 2], "dtype": "float32", "bytes": 40}
    assert rows[-1]["key"] == "(skeleton)" and rows[-1]["bytes"] == len(skeleton.encode())


def test_numpy_round_trip_for_flower_records():
    tensors, skeleton = pack({"w": torch.randn(4, dtype=torch.float64)})
    back = unpack(tensors_from_numpy(tensors_to_numpy(tensors)), skeleton)
    assert torch.equal(back["w"], tensors["w"])


def test_what_cannot_cross_is_refused_by_name():
    with pytest.raises(WireError, match="params/f: a function cannot cross"):
        pack({"params": {"f": lambda: 0}})
    with pytest.raises(WireError, match="bfloat16"):
        tensors_to_numpy({"w": torch.zeros(2, dtype=torch.bfloat16)})


def test_a_malformed_message_is_refused():
    tensors, skeleton = pack({"w": torch.zeros(2)})
    with pytest.raises(WireError, match="no such array"):
        unpack({}, skeleton)
    with pytest.raises(WireError, match="does not name"):
        unpack({**tensors, "extra": torch.zeros(1)}, skeleton)
    with pytest.raises(WireError, match="malformed"):
        unpack(tensors, "{not json")
