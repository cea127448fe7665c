"""FixMatch cloud training (ECOS use case 1): augmentations, the input function, the loss,
and one training through the runtime's trainer."""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedveil.data.arrays import ArrayDataset
from fedveil.ecos.cloud_training import CloudSGD, accuracy, train_classifier
from fedveil.ecos.fixmatch import (
    FixMatchInputs, FixMatchLoss, FixMatchSettings, strong_augment, train_fixmatch, weak_augment,
)
from fedveil.models.functional import model_state
from fedveil.training.request import Batch

torch.set_num_threads(1)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------- augmentations


def test_augmentations_keep_shape_and_range_and_are_deterministic_for_a_seed():
    x = torch.rand(6, 3, 8, 8, generator=gen(0))
    for augment in (weak_augment, strong_augment):
        out = augment(x, gen(1))
        assert out.shape == x.shape and out.dtype == x.dtype
        assert out.min() >= 0.0 and out.max() <= 1.0
        assert torch.equal(out, augment(x, gen(1)))
        assert not torch.equal(out, augment(x, gen(2)))
    assert torch.equal(x, torch.rand(6, 3, 8, 8, generator=gen(0)))  # the input is not changed in place


def test_weak_augmentation_translates_by_at_most_two_pixels_without_flipping():
    image = torch.zeros(1, 10, 10)
    image[0, 4, 3], image[0, 4, 5] = 1.0, 0.5  # asymmetric: a flip would swap them
    x = image.expand(300, 1, 10, 10).clone()
    out = weak_augment(x, gen(3))
    assert torch.allclose(out.sum(dim=(1, 2, 3)), torch.full((300,), 1.5))  # nothing lost: the pattern is interior
    shifts = set()
    for row in out[:, 0]:
        (i,), (j,) = torch.nonzero(row == 1.0, as_tuple=True)
        assert row[i, j + 2] == 0.5  # same orientation, same distance
        shifts.add((int(i) - 4, int(j) - 3))
    assert shifts == {(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)}  # all 25 shifts, none larger


def test_weak_translation_zero_pads_the_uncovered_border():
    x = torch.ones(200, 1, 8, 8)
    out = weak_augment(x, gen(4))
    # a shift (dy, dx) leaves (8 - |dy|)(8 - |dx|) ones; the ones form one rectangle
    sums = out.sum(dim=(1, 2, 3))
    allowed = {(8 - a) * (8 - b) for a in range(3) for b in range(3)}
    assert set(sums.tolist()) <= {float(v) for v in allowed}
    assert set(torch.unique(out).tolist()) == {0.0, 1.0}
    assert (sums < 64).any() and (sums == 64).any()


def test_strong_augmentation_differs_from_weak_and_cuts_out_a_grey_square():
    x = torch.rand(5, 1, 8, 8, generator=gen(5)) * 0.5 + 0.25
    weak, strong = weak_augment(x, gen(6)), strong_augment(x, gen(6))  # strong starts with the same weak draws
    assert (strong - weak).abs().amax(dim=(1, 2, 3)).min() > 0.01  # every row is changed
    plain = strong_augment(torch.zeros(4, 2, 8, 8), gen(7), brightness=0.0, contrast=0.0, noise=0.0)
    for row in plain:
        square = row == 0.5
        assert square.sum() == 2 * 4  # a 2 x 2 square (8 / 4) in both channels, the rest 0
        assert torch.equal(square[0], square[1]) and ((row == 0) | square).all()
        (i, j) = torch.nonzero(square[0], as_tuple=True)
        assert i.max() - i.min() == 1 and j.max() - j.min() == 1


def test_strong_brightness_is_one_shift_per_row_and_noise_has_its_scale():
    x = torch.full((50, 1, 8, 8), 0.5)
    weak = weak_augment(x, gen(8))  # 0.5 inside, 0 on the zero-padded border
    out = strong_augment(x, gen(8), contrast=0.0, noise=0.0, cutout=0.125)  # same shifts; a 1 x 1 cutout
    shifts = []
    for w_row, s_row in zip(weak, out):
        d = (s_row - w_row)[w_row == 0.5]  # never clamped: 0.5 + U(-0.2, 0.2)
        b = d.median()
        assert ((d - b).abs() < 1e-6).sum() >= len(d) - 1  # one shift for the row (but the cutout pixel)
        shifts.append(float(b))
    assert max(abs(b) for b in shifts) <= 0.2 + 1e-6 and np.std(shifts) > 0.05  # U(-0.2, 0.2) has std 0.115
    noisy = strong_augment(x, gen(8), brightness=0.0, contrast=0.0, cutout=0.125)
    inside = weak == 0.5
    assert 0.04 < (noisy - weak)[inside].std() < 0.06  # N(0, 0.05^2), cutout pixels aside


@pytest.mark.parametrize("bad", [torch.rand(3, 8, 8), torch.zeros(2, 1, 4, 4, dtype=torch.long)])
def test_augmentations_refuse_non_image_batches(bad):
    with pytest.raises(ValueError, match="N x C x H x W"):
        weak_augment(bad, gen(0))


# ---------------------------------------------------------------------------- the loss


def test_loss_is_supervised_mean_plus_weighted_confident_consistency_by_hand():
    # all-zero logits over 2 classes: every cross-entropy is ln 2
    out = torch.zeros(5, 2)
    batch = Batch(out, torch.tensor([0, 1, 1, 0, 1]),
                  {"labelled": torch.tensor([1, 1, 0, 0, 0]), "confident": torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0])})
    expected = math.log(2) + 0.1 * (2 * math.log(2)) / 3  # L_s = ln 2; L_u = (ln 2 + ln 2) / 3 unlabelled rows
    assert FixMatchLoss().mean(out, batch).item() == pytest.approx(expected, rel=1e-6)
    assert FixMatchLoss(unlabeled_weight=1.0).mean(out, batch).item() == pytest.approx(math.log(2) * 5 / 3, rel=1e-6)


def test_loss_with_known_logits_matches_cross_entropy_term_by_term():
    out = torch.tensor([[2.0, -1.0, 0.5], [0.0, 1.0, 3.0], [4.0, 0.0, -2.0], [0.3, 0.2, 0.1], [-1.0, 2.0, 0.0]])
    y = torch.tensor([0, 1, 0, 2, 1])
    groups = {"labelled": torch.tensor([1, 1, 0, 0, 0]), "confident": torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0])}
    ce = [F.cross_entropy(out[i : i + 1], y[i : i + 1]).item() for i in range(5)]
    expected = (ce[0] + ce[1]) / 2 + 0.25 * (ce[2] + ce[4]) / 3
    assert FixMatchLoss(0.25).mean(out, Batch(out, y, groups)).item() == pytest.approx(expected, rel=1e-6)
    # only labelled rows: plain cross-entropy; only unlabelled rows: the weighted term alone
    lab = {"labelled": torch.ones(5, dtype=torch.long), "confident": torch.zeros(5)}
    assert FixMatchLoss(0.25).mean(out, Batch(out, y, lab)).item() == pytest.approx(F.cross_entropy(out, y).item(), rel=1e-6)
    unl = {"labelled": torch.zeros(5, dtype=torch.long), "confident": torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])}
    assert FixMatchLoss(0.25).mean(out, Batch(out, y, unl)).item() == pytest.approx(0.25 * (ce[0] + ce[3]) / 5, rel=1e-6)


def test_loss_without_a_confident_row_is_zero_and_still_differentiable():
    logits = torch.randn(3, 2, generator=gen(9)).requires_grad_(True)
    batch = Batch(logits, torch.tensor([-1, -1, -1]), {"labelled": torch.zeros(3), "confident": torch.zeros(3)})
    loss = FixMatchLoss().mean(logits, batch)
    assert loss.item() == 0.0
    (grad,) = torch.autograd.grad(loss, logits)
    assert torch.equal(grad, torch.zeros(3, 2))
    assert FixMatchLoss.per_example_ok is False


def test_loss_needs_the_row_flags():
    with pytest.raises(ValueError, match="needs the per-row group 'confident'"):
        FixMatchLoss().mean(torch.zeros(2, 2), Batch(torch.zeros(2, 2), torch.tensor([0, 1]), {"labelled": torch.ones(2)}))


# ---------------------------------------------------------------------------- the input function


def blob_model() -> nn.Module:
    """logit_0 = 0, logit_1 = 10 * (pixel sum) - 20, behind a Dropout(0.9) that only evaluation mode skips."""
    net = nn.Sequential(OrderedDict(flatten=nn.Flatten(), drop=nn.Dropout(0.9), fc=nn.Linear(64, 2)))
    with torch.no_grad():
        net.fc.weight.zero_()
        net.fc.weight[1] = 10.0
        net.fc.bias.copy_(torch.tensor([0.0, -20.0]))
    return net


def blobs(values: list[float]) -> torch.Tensor:
    """1 x 8 x 8 images, each a 2 x 2 blob of the value at rows/cols 3-4 (weak shifts keep it inside)."""
    x = torch.zeros(len(values), 1, 8, 8)
    for i, v in enumerate(values):
        x[i, 0, 3:5, 3:5] = v
    return x


def test_input_fn_pseudo_labels_are_the_models_argmax_and_labels_are_kept():
    net = blob_model()
    # pixel sums 4v: logits_1 = 40v - 20; v = 1 -> +20 (p1 ~ 1), 0.25 -> -10 (p0 = 0.99995),
    # 0.52 -> +0.8 (p1 = 0.69), 0.45 -> -2 (p0 = 0.88): labels 1, 0, 1, 0; confident at 0.95: 1, 1, 0, 0
    x = blobs([1.0, 0.25, 1.0, 0.25, 0.52, 0.45])
    y = torch.tensor([0, 1, -1, -1, -1, -1])  # the labelled rows' labels disagree with the model: they are kept
    groups = {"labelled": torch.tensor([1, 1, 0, 0, 0, 0]), "domain": torch.arange(6)}
    fn = FixMatchInputs(net, threshold=0.95)
    out = fn(model_state(net), Batch(x, y, groups), gen(10))
    assert out.y.tolist() == [0, 1, 1, 0, 1, 0]
    assert out.groups["confident"].tolist() == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert torch.equal(out.groups["domain"], torch.arange(6)) and torch.equal(out.groups["labelled"], groups["labelled"])
    assert torch.allclose(out.x[:2].sum(dim=(1, 2, 3)), torch.tensor([4.0, 1.0]))  # labelled rows: weak only
    assert out.x.shape == x.shape and out.x.min() >= 0 and out.x.max() <= 1
    assert not torch.allclose(out.x[2:].sum(dim=(1, 2, 3)), x[2:].sum(dim=(1, 2, 3)), atol=1e-3)  # strong copies
    # a lower threshold makes the 0.69 and 0.88 rows confident; rows map independently of their order
    flipped = Batch(x.flip(0), y.flip(0), {"labelled": groups["labelled"].flip(0)})
    low = FixMatchInputs(net, threshold=0.6)(model_state(net), flipped, gen(11))
    assert low.y.tolist() == [0, 1, 0, 1, 1, 0] and low.groups["confident"].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_input_fn_of_an_all_labelled_batch_only_augments_weakly():
    net = blob_model()
    x, y = blobs([1.0, 0.5]), torch.tensor([1, 0])
    out = FixMatchInputs(net)(model_state(net), Batch(x, y, {"labelled": torch.ones(2)}), gen(12))
    assert torch.equal(out.x, weak_augment(x, gen(12))) and torch.equal(out.y, y)
    assert out.groups["confident"].tolist() == [0.0, 0.0]
    assert FixMatchInputs(net) == FixMatchInputs(net) and FixMatchInputs(net) != FixMatchInputs(blob_model())


# ---------------------------------------------------------------------------- training


def halves(n: int, seed: int) -> ArrayDataset:
    """1 x 8 x 8 images in [0, 1]: class 0 lights the top half, class 1 the bottom half (noisy)."""
    g = gen(seed)
    y = torch.arange(n) % 2
    x = 0.1 * torch.rand(n, 1, 8, 8, generator=g)
    x[y == 0, :, :4] += 0.8
    x[y == 1, :, 4:] += 0.8
    return ArrayDataset(x.clamp(0, 1), y, {"domain": torch.zeros(n, dtype=torch.long)})


SGD = CloudSGD(epochs=15, batch_size=5, lr=0.05)
LABELLED, UNLABELLED, TEST = halves(10, 0), halves(200, 1).x, halves(200, 2)


def test_fixmatch_fits_a_separable_problem_deterministically_from_the_supervised_start():
    settings = FixMatchSettings(unlabeled_ratio=7)
    trained = train_fixmatch(LABELLED, UNLABELLED, 2, "lenet", {"width": 0.25}, SGD, settings, seed=1)
    assert accuracy(trained.model, trained.params, TEST) >= 0.95
    assert trained.seconds > 0 and np.isfinite(trained.loss)
    again = train_fixmatch(LABELLED, UNLABELLED, 2, "lenet", {"width": 0.25}, SGD, settings, seed=1)
    assert all(torch.equal(trained.params[k], again.params[k]) for k in trained.params)
    supervised = train_classifier(LABELLED, 2, "lenet", {"width": 0.25}, SGD, seed=1)
    start, supervised_start = model_state(trained.model), model_state(supervised.model)
    assert all(torch.equal(start[k], supervised_start[k]) for k in start)  # same initial weights for a seed
    assert any(not torch.equal(trained.params[k], supervised.params[k]) for k in start)


def test_the_unlabelled_rows_enter_only_through_the_weighted_term():
    noise = torch.rand(200, 1, 8, 8, generator=gen(13))  # a different unlabelled pool of the same size
    sgd = CloudSGD(epochs=3, batch_size=5, lr=0.05)

    def run(pool: torch.Tensor, weight: float):
        settings = FixMatchSettings(unlabeled_weight=weight, threshold=0.0)  # every pseudo-label counts
        return train_fixmatch(LABELLED, pool, 2, "linear", {}, sgd, settings, seed=2)

    # linear model: no batch statistics, so with weight 0 the unlabelled pixels cannot matter
    a, b = run(UNLABELLED, 0.0), run(noise, 0.0)
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    c, d = run(UNLABELLED, 0.1), run(noise, 0.1)
    assert any(not torch.equal(c.params[k], d.params[k]) for k in c.params)
    assert any(not torch.equal(a.params[k], c.params[k]) for k in a.params)
    assert c.loss != a.loss


def test_empty_labelled_set_returns_the_initial_model_and_empty_pool_trains_supervised():
    empty = LABELLED.subset(torch.zeros(0, dtype=torch.long))
    untrained = train_fixmatch(empty, UNLABELLED, 2, "linear", {}, SGD, FixMatchSettings(), seed=3)
    initial = model_state(untrained.model)
    assert untrained.seconds == 0.0 and np.isnan(untrained.loss)
    assert all(torch.equal(untrained.params[k], initial[k]) for k in initial)
    sgd = CloudSGD(epochs=20, batch_size=5, lr=0.1)
    alone = train_fixmatch(LABELLED, UNLABELLED[:0], 2, "linear", {}, sgd, FixMatchSettings(), seed=3)
    assert np.isfinite(alone.loss) and accuracy(alone.model, alone.params, TEST) >= 0.9


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: FixMatchSettings(unlabeled_weight=-0.1), "unlabeled_weight must be a finite number >= 0"),
        (lambda: FixMatchSettings(threshold=1.5), r"threshold must lie in \[0, 1\]"),
        (lambda: FixMatchSettings(unlabeled_ratio=0), "unlabeled_ratio must be an integer >= 1"),
        (lambda: FixMatchSettings(unlabeled_ratio=2.5), "unlabeled_ratio must be an integer"),
        (lambda: FixMatchLoss(unlabeled_weight=float("nan")), "unlabeled_weight"),
        (lambda: FixMatchInputs(blob_model(), threshold=-0.5), "threshold"),
        (lambda: train_fixmatch(LABELLED, torch.zeros(5, 1, 4, 4), 2, "linear", {}, SGD, FixMatchSettings(), 0),
         r"unlabelled_x rows have shape \(1, 4, 4\), the labelled rows \(1, 8, 8\)"),
        (lambda: train_fixmatch(LABELLED, UNLABELLED, 2, "linear", {}, SGD, {"threshold": 0.9}, 0),
         "settings must be FixMatchSettings"),
        (lambda: train_fixmatch(LABELLED.x, UNLABELLED, 2, "linear", {}, SGD, FixMatchSettings(), 0),
         "labelled must be an ArrayDataset"),
        (lambda: train_fixmatch(LABELLED, UNLABELLED, 1, "linear", {}, SGD, FixMatchSettings(), 0),
         "num_classes must be an integer >= 2"),
    ],
)
def test_bad_settings_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()
