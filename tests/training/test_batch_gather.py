"""A stacked step's batch gather: clients packed into one tensor per field (as a simulation
packs its training rows) give exactly the batches that copying client by client gives."""
from __future__ import annotations

import pickle

import torch

from fedveil.data.arrays import ArrayDataset, packed, shared_rows
from fedveil.engine.reused import ReusedBuffers
from fedveil.training.cohort import _BatchGatherer
from fedveil.training.request import TrainRequest


def _clients(sizes: list[int]) -> list[ArrayDataset]:
    g = torch.Generator().manual_seed(0)
    return [
        ArrayDataset(torch.randn(n, 2, 3, generator=g), torch.randint(0, 5, (n,), generator=g),
                     {"s": torch.randint(0, 2, (n,), generator=g)})
        for n in sizes
    ]


def _requests(data: list[ArrayDataset], private_rows=None) -> list[TrainRequest]:
    return [TrainRequest({}, d, torch.Generator(), 0, private_rows=private_rows) for d in data]


def _expected(data, batches, active, width):
    """The merged batch written out by hand: each client's rows, then its first row as padding."""
    xs, ys, ss, mask = [], [], [], torch.zeros(len(active), width)
    for row, (k, (idx, _)) in enumerate(zip(active, batches)):
        rows = torch.cat([idx, torch.zeros(width - len(idx), dtype=torch.long)])
        xs.append(data[k].x[rows]), ys.append(data[k].y[rows]), ss.append(data[k].groups["s"][rows])
        mask[row, : len(idx)] = 1.0
    return torch.cat(xs), torch.cat(ys), torch.cat(ss), mask


def test_packed_rows_are_views_of_one_tensor_with_the_same_values():
    data = _clients([4, 1, 3])
    views = packed(data)
    base, starts = shared_rows([v.x for v in views])
    assert starts == [0, 4, 5] and base.shape == (8, 2, 3)
    for before, after in zip(data, views):
        assert torch.equal(before.x, after.x) and torch.equal(before.y, after.y)
        assert torch.equal(before.groups["s"], after.groups["s"])
    assert shared_rows([d.x for d in data]) is None  # separate tensors
    # mismatched fields are left alone
    odd = ArrayDataset(torch.randn(2, 3, 3), torch.zeros(2, dtype=torch.long), {"s": torch.zeros(2, dtype=torch.long)})
    assert packed([data[0], odd])[1] is odd
    # pickled (shipped to a worker), a client takes its own rows only, not the pack
    alone = pickle.loads(pickle.dumps(views[1]))
    assert alone.x.untyped_storage().nbytes() == 1 * 2 * 3 * 4 and torch.equal(alone.x, data[1].x)
    assert torch.equal(alone.groups["s"], data[1].groups["s"]) and views[1].x._base is not None  # the view is kept


def test_packed_and_client_by_client_gathers_agree_with_padding_and_dropouts():
    data = _clients([5, 3, 4])
    batches = [(torch.tensor([4, 0, 2]), 3), (torch.tensor([1]), 1), (torch.tensor([3, 3]), 2)]
    for active in ([0, 1, 2], [0, 2]):
        step = [batches[k] for k in active]
        want = _expected(data, step, active, width=3)
        for requests in (_requests(data), _requests(packed(data))):
            gather = _BatchGatherer(requests, ReusedBuffers())
            assert (gather.bases is not None) == (requests[0].data.x._base is not None)
            for _ in range(2):  # buffers reused by the next step hold the new rows
                batch, mask, private = gather(step, active)
                assert torch.equal(batch.x, want[0]) and torch.equal(batch.y, want[1])
                assert torch.equal(batch.groups["s"], want[2]) and torch.equal(mask, want[3]) and private is None


def test_private_row_mask_marks_each_clients_first_private_rows():
    data = packed(_clients([4, 4]))
    gather = _BatchGatherer(_requests(data, private_rows=2), ReusedBuffers())
    _, mask, private = gather([(torch.tensor([0, 1, 3]), 2), (torch.tensor([2, 3]), 1)], [0, 1])
    assert torch.equal(mask, torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]))
    assert torch.equal(private, torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
