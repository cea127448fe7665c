"""Buffers reused between rounds: handed out again only when nothing else holds them, so a
result kept by an algorithm (views into last round's stacked parameters) is never overwritten."""
from __future__ import annotations

import torch
from torch import nn

from fedveil.config import ClientConfig
from fedveil.data.arrays import ArrayDataset
from fedveil.engine import StackedModel
from fedveil.engine.reused import ReusedBuffers, held_elsewhere
from fedveil.models.functional import model_state
from fedveil.training import LocalTrainer, TrainRequest, task_loss, train_stacked


def test_a_buffer_no_one_holds_is_handed_out_again_and_a_held_one_is_not():
    reused = ReusedBuffers()
    first = reused.take("a", (3, 4), torch.float32, torch.device("cpu"))
    ptr = first.data_ptr()
    first.fill_(1.0)
    kept = first[1]  # a view outlives the tensor handed out
    del first
    second = reused.take("a", (3, 4), torch.float32, torch.device("cpu"))
    assert second.data_ptr() != ptr and torch.equal(kept, torch.ones(4))
    del kept, second
    third = reused.take("a", (3, 4), torch.float32, torch.device("cpu"))
    again = third.data_ptr()
    del third
    assert reused.take("a", (3, 4), torch.float32, torch.device("cpu")).data_ptr() == again
    # another shape or dtype under the same key: a new buffer
    assert reused.take("a", (2, 4), torch.float32, torch.device("cpu")).shape == (2, 4)
    assert reused.take("a", (2, 4), torch.float64, torch.device("cpu")).dtype == torch.float64


def test_stack_copies_values_of_parameters_that_require_grad():
    reused = ReusedBuffers()
    params = [nn.Parameter(torch.randn(2, 3)) for _ in range(4)]
    out = reused.stack("w", params)
    assert torch.equal(out, torch.stack([p.detach() for p in params])) and not out.requires_grad
    assert not held_elsewhere(torch.empty(5)) and held_elsewhere(out)  # `out` is a view of the kept buffer


def test_a_kept_result_survives_the_next_stacked_training():
    """Round 1's client models (views into its stacked parameters) are kept, as a personalised
    algorithm keeps them; round 2 on the same stacked model must not write into them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    trainer = LocalTrainer(model, task_loss("classification"), ClientConfig(batch_size=4, epochs=1, lr=0.1), total_rounds=2)
    gen = torch.Generator().manual_seed(1)
    data = [ArrayDataset(torch.randn(8, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen), {}) for _ in range(3)]
    stacked = StackedModel(model)
    start = model_state(model)

    def requests(round_idx: int, states):
        return [TrainRequest({k: v.clone() for k, v in s.items()}, d, torch.Generator().manual_seed(i), round_idx)
                for i, (s, d) in enumerate(zip(states, data))]

    first = train_stacked(trainer, stacked, requests(0, [start] * 3))
    kept = [state for state, _ in first]
    copies = [{k: v.clone() for k, v in s.items()} for s in kept]
    second = train_stacked(trainer, stacked, requests(1, kept))
    for state, copy in zip(kept, copies):
        assert all(torch.equal(state[k], copy[k]) for k in copy)
    assert not torch.equal(second[0][0]["0.weight"], kept[0]["0.weight"])  # round 2 did train
    # nothing kept: the next training takes last round's memory again
    ptr = second[0][0]["0.weight"].data_ptr()
    states = [{k: v.clone() for k, v in s.items()} for s, _ in second]
    del first, kept, second
    third = train_stacked(trainer, stacked, requests(1, states))
    assert third[0][0]["0.weight"].data_ptr() == ptr
