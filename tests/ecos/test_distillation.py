"""ECOS use case 2 (B.6 Case 2): the distillation loss against a hand computation, its CE
limit, a student that moves toward a fixed teacher, determinism and argument errors."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedveil.data.arrays import ArrayDataset
from fedveil.ecos.cloud_training import CloudModel, CloudSGD, train_classifier
from fedveil.ecos.distillation import TEACHER_LOGITS, DistillationLoss, distill, teacher_logits
from fedveil.models.functional import forward
from fedveil.training.request import Batch

torch.set_num_threads(1)


def batch(student: torch.Tensor, teacher: torch.Tensor, y: torch.Tensor) -> Batch:
    return Batch(torch.zeros(len(y), 1), y, {TEACHER_LOGITS: teacher})


LOGITS = torch.tensor([[2.0, -1.0, 0.5], [0.1, 0.2, 3.0], [-2.0, 4.0, 1.0], [0.0, 0.0, 0.0]])
TEACHER = torch.tensor([[5.0, 0.0, -3.0], [1.0, 1.0, 1.0], [0.0, 9.0, -1.0], [2.0, -2.0, 0.5]])
Y = torch.tensor([0, 2, 1, 2])


@pytest.mark.parametrize("kd_weight, temperature", [(0.1, 10.0), (0.5, 2.0), (1.0, 1.0)])
def test_the_loss_is_weighted_t2_kl_plus_cross_entropy(kd_weight, temperature):
    t = temperature
    kl = F.kl_div(F.log_softmax(LOGITS / t, dim=1), F.log_softmax(TEACHER / t, dim=1), reduction="batchmean",
                  log_target=True)
    expected = kd_weight * t * t * kl + (1 - kd_weight) * F.cross_entropy(LOGITS, Y)
    got = DistillationLoss(kd_weight, temperature).mean(LOGITS, batch(LOGITS, TEACHER, Y))
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    # a per-row mean: the batch loss is the mean of the rows' losses (so DP-SGD / vmap may use it)
    loss = DistillationLoss(kd_weight, temperature)
    per_row = loss.per_example(LOGITS, batch(LOGITS, TEACHER, Y))
    assert per_row.shape == (4,) and per_row.mean().item() == pytest.approx(got.item(), rel=1e-6)


def test_the_b6_defaults_and_the_ce_limit():
    loss = DistillationLoss()
    assert (loss.kd_weight, loss.temperature) == (0.1, 10.0)
    plain = DistillationLoss(kd_weight=0.0).mean(LOGITS, batch(LOGITS, TEACHER, Y))
    assert plain.item() == pytest.approx(F.cross_entropy(LOGITS, Y).item(), rel=1e-7)
    # a teacher that agrees with the student leaves only (1 - w) CE
    same = DistillationLoss(0.3, 4.0).mean(LOGITS, batch(LOGITS, LOGITS.clone(), Y))
    assert same.item() == pytest.approx(0.7 * F.cross_entropy(LOGITS, Y).item(), rel=1e-6)


# A tiny two-feature, three-class problem; the teacher's labels differ from the true ones on
# half the rows (it predicts by the first feature's sign only).
def problem(n: int = 120) -> ArrayDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g)
    y = (x[:, 1] > 0).long() + (x[:, 1] > 1).long()  # the truth depends on the second feature
    return ArrayDataset(x, y)


def fixed_teacher() -> CloudModel:
    """A linear teacher whose logits follow the first feature only."""
    data = problem()
    net_model = train_classifier(data, 3, "linear", {}, CloudSGD(epochs=1), 0)
    weight = torch.tensor([[4.0, 0.0], [-4.0, 0.0], [0.0, 0.0]])
    params = {k: (weight if k.endswith("weight") else torch.zeros(3)) for k in net_model.params}
    return CloudModel(net_model.model, params, 0.0, 0.0)


def agreement(student: CloudModel, teacher: CloudModel, x: torch.Tensor) -> float:
    with torch.no_grad():
        ours = forward(student.model, student.params, x).argmax(1)
    return float((ours == teacher_logits(teacher, x).argmax(1)).float().mean())


def test_a_distilled_student_moves_toward_the_teacher():
    data, teacher = problem(), fixed_teacher()
    sgd = CloudSGD(epochs=20, lr=0.1, batch_size=16)
    supervised = distill(data, teacher, 3, "linear", {}, sgd, seed=1, kd_weight=0.0)
    distilled = distill(data, teacher, 3, "linear", {}, sgd, seed=1, kd_weight=1.0, temperature=2.0)
    assert agreement(distilled, teacher, data.x) > agreement(supervised, teacher, data.x) + 0.2
    assert agreement(distilled, teacher, data.x) > 0.85


def test_kd_weight_zero_is_train_classifier_and_a_seed_fixes_the_result():
    data, teacher, sgd = problem(), fixed_teacher(), CloudSGD(epochs=3, lr=0.1, batch_size=16)
    plain = train_classifier(data, 3, "mlp", {"hidden": [8]}, sgd, seed=4)
    zero = distill(data, teacher, 3, "mlp", {"hidden": [8]}, sgd, seed=4, kd_weight=0.0)
    for k in plain.params:
        torch.testing.assert_close(zero.params[k], plain.params[k])
    a = distill(data, teacher, 3, "mlp", {"hidden": [8]}, sgd, seed=4)
    b = distill(data, teacher, 3, "mlp", {"hidden": [8]}, sgd, seed=4)
    c = distill(data, teacher, 3, "mlp", {"hidden": [8]}, sgd, seed=5)
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    assert not all(torch.equal(a.params[k], c.params[k]) for k in a.params)
    none = data.subset(torch.tensor([], dtype=torch.long))
    empty = distill(none, teacher, 3, "mlp", {"hidden": [8]}, sgd, seed=4)  # nothing selected: the initial student
    start = train_classifier(none, 3, "mlp", {"hidden": [8]}, sgd, seed=4)
    assert empty.seconds == 0.0 and all(torch.equal(empty.params[k], start.params[k]) for k in start.params)


@pytest.mark.parametrize("kwargs, message", [
    ({"kd_weight": 1.5}, "kd_weight must be in \\[0, 1\\]"),
    ({"kd_weight": -0.1}, "kd_weight must be in \\[0, 1\\]"),
    ({"kd_weight": float("nan")}, "kd_weight must be in \\[0, 1\\]"),
    ({"temperature": 0.0}, "temperature must be a positive finite number"),
    ({"temperature": -2.0}, "temperature must be a positive finite number"),
    ({"temperature": "10"}, "temperature must be a real number"),
])
def test_bad_arguments_are_one_line_errors(kwargs, message):
    data, teacher = problem(), fixed_teacher()
    with pytest.raises(ValueError, match=message) as err:
        DistillationLoss(**kwargs)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=message):
        distill(data, teacher, 3, "linear", {}, CloudSGD(epochs=1), 0, **kwargs)


def test_a_missing_teacher_is_a_one_line_error():
    data = problem()
    for teacher in (None, "teacher"):
        with pytest.raises(ValueError, match="teacher must be a trained CloudModel") as err:
            distill(data, teacher, 3, "linear", {}, CloudSGD(epochs=1), 0)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="the batch has no 'teacher_logits' group") as err:
        DistillationLoss().mean(LOGITS, Batch(torch.zeros(4, 1), Y, {}))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="do not match the student's"):
        DistillationLoss().mean(LOGITS, batch(LOGITS, TEACHER[:, :2], Y))
    with pytest.raises(ValueError, match="the student needs 4 classes"):
        distill(data, fixed_teacher(), 4, "linear", {}, CloudSGD(epochs=1), 0)
