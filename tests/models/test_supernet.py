"""ADDS supernets (spec 001 §1.5, §1.10, Table 2): Table 2's VGG counts exactly, a masked
supernet computes what the extracted dense subnet computes, and the two roles' gradients
reach only their own parameters (weights vs keep ratios)."""
from __future__ import annotations

import torch
from torch import nn

from fedveil.models import build_model, count_macs
from fedveil.models import subnet as sn
from fedveil.models import unit_sampling as us
from fedveil.models.functional import forward, model_state
from fedveil.models.supernet import EPS, ROLE, UNIFORMS, UNIT_MASK

torch.set_num_threads(1)


def vgg(**options):
    return build_model("adds_vgg", (1, 28, 28), 62, **options)


def test_table_2_vgg_weight_counts_and_macs():
    net = vgg()
    conv = sum(m.weight.numel() for m in net.convs)
    fc = sum(m.weight.numel() for m in [*net.fcs, net.head])
    assert (conv, fc, conv + fc) == (369_216, 5_306_368, 5_675_584)  # "369.22K / 5.31M / 5.68M"
    # an ordinary network of the same layers, counted by forward hooks
    plain = nn.Sequential(
        nn.Conv2d(1, 64, 3, padding=1), nn.MaxPool2d(2, ceil_mode=True), nn.Conv2d(64, 128, 3, padding=1),
        nn.MaxPool2d(2, ceil_mode=True), nn.Conv2d(128, 256, 3, padding=1), nn.MaxPool2d(2, ceil_mode=True),
        nn.Flatten(), nn.Linear(4096, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 62),
    )
    assert net.macs() == count_macs(plain, (1, 28, 28)) == 29_352_960 + 5_306_368
    # a subnet's MACs: the formula F of spec 001 §1.10 with c = (8, 16, 32), n = (100, 50)
    c1, c2, c3, n1, n2 = 8, 16, 32, 100, 50
    assert net.macs([c1, c2, c3, n1, n2]) == 784 * 9 * c1 + 196 * 9 * c1 * c2 + 49 * 9 * c2 * c3 + 16 * c3 * n1 + n1 * n2 + 62 * n2


def random_keep(counts, seed=0):
    g = torch.Generator().manual_seed(seed)
    keep = []
    for c in counts:
        k = torch.rand(c, generator=g) < 0.5
        k[0] = True
        keep.append(k)
    return keep


def test_a_masked_supernet_computes_the_extracted_subnet():
    net = vgg(width=0.125)
    state = model_state(net)
    keep = random_keep(net.unit_counts)
    sub = sn.extract({k: v for k, v in state.items() if k != "alpha"}, net.unit_axes(), keep)
    dense = build_model("adds_vgg", (1, 28, 28), 62, channels=[int(k.sum()) for k in keep[:3]],
                        hidden=[int(k.sum()) for k in keep[3:]])
    x = torch.rand(6, 1, 28, 28)
    mask = torch.cat(keep).float().expand(6, -1)
    masked = forward(net, state, x, train=True, groups={UNIT_MASK: mask})
    plain = forward(dense, {**sub, "alpha": torch.zeros(5)}, x, train=True)
    torch.testing.assert_close(masked, plain, rtol=1e-4, atol=1e-5)
    # embed puts every extracted entry back where it came from
    for name, axes in net.unit_axes().items():
        back = sn.embed(sub[name], state[name], axes, keep)
        m = sn.element_mask(state[name].shape, axes, keep)
        assert torch.equal(back[m], state[name][m]) and torch.all(back[~m] == 0)
        assert sub[name].numel() == int(m.sum())


def test_unit_axes_cover_the_first_fc_layer_channel_by_channel():
    net = build_model("adds_vgg", (1, 8, 8), 10, channels=[2, 3], hidden=[4])
    keep = [torch.tensor([True, False]), torch.tensor([False, True, True]), torch.tensor([True, False, True, True])]
    mask = sn.element_mask(net.fcs[0].weight.shape, net.unit_axes()["fcs.0.weight"], keep)
    # 8x8 -> 4 -> 2: 4 positions per channel; channels 1 and 2 of the last conv kept
    assert mask.shape == (4, 12)
    assert torch.equal(mask[0], torch.tensor([False] * 4 + [True] * 8)) and not mask[1].any()


def sampling_groups(n_train, n_val, counts, eps=0.5):
    j = sum(counts)
    u_train, u_val = torch.rand(j), torch.rand(j)
    return {
        ROLE: torch.cat([torch.zeros(n_train), torch.ones(n_val)]),
        UNIFORMS: torch.cat([u_train.expand(n_train, j), u_val.expand(n_val, j)]),
        EPS: torch.full((n_train + n_val,), eps),
    }


def test_weight_rows_train_weights_and_validation_rows_train_keep_ratios():
    torch.manual_seed(0)
    net = build_model("adds_vgg", (1, 8, 8), 10, channels=[4, 6], hidden=[8])
    x, y = torch.rand(10, 1, 8, 8), torch.randint(0, 10, (10,))
    for n_train, n_val in ((10, 0), (0, 10)):
        state = {k: v.detach().clone().requires_grad_(True) for k, v in model_state(net).items()}
        state["alpha"].data.fill_(0.7)
        groups = sampling_groups(n_train, n_val, net.unit_counts)
        out = forward(net, state, x, train=True, groups=groups)
        grads = dict(zip(state, torch.autograd.grad(
            nn.functional.cross_entropy(out, y), list(state.values()), allow_unused=True)))
        alpha_grad = grads.pop("alpha")
        weights_moved = any(g is not None and g.abs().sum() > 0 for g in grads.values())
        if n_val:  # architecture step: keep ratios only (Eq. 9: weights are constants)
            assert alpha_grad is not None and torch.all(alpha_grad != 0) and not weights_moved
        else:  # weight step under hard masks: weights only
            assert (alpha_grad is None or torch.all(alpha_grad == 0)) and weights_moved


def test_weight_rows_see_bernoulli_masks_of_eq_13_probabilities():
    """MLP supernet, by hand: logits = head(relu(fc(x)) * [u < p]), p from Eq. 13-14 with
    b = the mean activations normalised to a maximum of 1."""
    net = build_model("adds_vgg", (1, 8, 8), 10, channels=[], hidden=[400])
    state = model_state(net)
    state["alpha"] = torch.tensor([0.5245])
    x = torch.rand(4, 1, 8, 8)
    groups = sampling_groups(4, 0, net.unit_counts, eps=1.0)
    out = forward(net, state, x, train=True, groups=groups)
    hidden = torch.relu(x.flatten(1) @ state["fcs.0.weight"].T + state["fcs.0.bias"])
    b = hidden.mean(0) / hidden.mean(0).max()
    p = torch.sigmoid((b - us.solve_beta(b, 0.5245, 1.0)) / 1.0)
    assert abs(float(p.sum()) - 0.5245 * 400) < 1e-3
    mask = (groups[UNIFORMS][0] < p).float()
    torch.testing.assert_close(out, (hidden * mask) @ state["head.weight"].T + state["head.bias"])
    assert 0.4 < float(mask.mean()) < 0.65


def test_evaluation_uses_the_whole_supernet():
    net = build_model("adds_vgg", (1, 8, 8), 10, channels=[4], hidden=[8])
    state, x = model_state(net), torch.rand(5, 1, 8, 8)
    full = forward(net, state, x, groups={UNIT_MASK: torch.ones(5, 12)})
    torch.testing.assert_close(forward(net, state, x), full)


# ---------------------------------------------------------------------------- text supernet


def char_lstm():
    return build_model("adds_char_lstm", (12,), 30, embed_dim=4, hidden=10, fc=6)


def test_a_masked_text_supernet_computes_the_supernet_with_dropped_entries_zeroed():
    """Cutting a unit from the next layer's input (non-recurrent connections only) is the
    same as zeroing its entries in the index-mapped parameters (spec 001 §1.5)."""
    torch.manual_seed(0)
    net = char_lstm()
    state = model_state(net)
    keep = random_keep(net.unit_counts, seed=3)
    zeroed = dict(state)
    for name, axes in net.unit_axes().items():
        zeroed[name] = state[name] * sn.element_mask(state[name].shape, axes, keep)
    x = torch.randint(0, 30, (5, 12))
    masked = forward(net, state, x, groups={UNIT_MASK: torch.cat(keep).float().expand(5, -1)})
    torch.testing.assert_close(masked, forward(net, zeroed, x), rtol=1e-5, atol=1e-6)
    # the recurrent weights are never cut
    assert not any("weight_hh" in n or "lstm1" in n for n in net.unit_axes())


def test_text_supernet_macs_by_hand():
    net = char_lstm()
    # 12 steps x (LSTM1 4*10*(4+10) + LSTM2 4*10*(k1+10)) + k2*k3 + k3*30, with k = (7, 5, 3)
    assert net.macs([7, 5, 3], seq_len=12) == 12 * (4 * 10 * 14 + 4 * 10 * 17) + 5 * 3 + 3 * 30


def test_text_supernet_roles_train_their_own_parameters():
    torch.manual_seed(1)
    net = char_lstm()
    x, y = torch.randint(0, 30, (8, 12)), torch.randint(0, 30, (8,))
    for n_train, n_val in ((8, 0), (0, 8)):
        state = {k: v.detach().clone().requires_grad_(True) for k, v in model_state(net).items()}
        state["alpha"].data.fill_(0.6)
        out = forward(net, state, x, train=True, groups=sampling_groups(n_train, n_val, net.unit_counts))
        grads = dict(zip(state, torch.autograd.grad(
            nn.functional.cross_entropy(out, y), list(state.values()), allow_unused=True)))
        alpha_grad = grads.pop("alpha")
        weights_moved = any(g is not None and g.abs().sum() > 0 for g in grads.values())
        assert weights_moved == bool(n_train)
        assert (alpha_grad is not None and bool(torch.all(alpha_grad != 0))) == bool(n_val)


# ---------------------------------------------------------------------------- LRP importance


def test_the_z_plus_step_is_eq_11_and_conserves_relevance():
    from fedveil.models.supernet import _z_plus

    g = torch.Generator().manual_seed(0)
    a, w = torch.rand(3, 5, generator=g, dtype=torch.float64), torch.randn(4, 5, generator=g, dtype=torch.float64)
    r_out = torch.rand(3, 4, generator=g, dtype=torch.float64)
    r_in = _z_plus(a, r_out, lambda t: t @ w.clamp(min=0).T)
    # Eq. 11 written out: R_i = sum_j a_i w+_ij / (sum_i' a_i' w+_i'j) R_j
    wp = w.clamp(min=0)
    z = a @ wp.T
    expected = torch.einsum("ni,ji,nj->ni", a, wp, r_out / z)
    torch.testing.assert_close(r_in, expected)
    torch.testing.assert_close(r_in.sum(1), r_out.sum(1))  # conservation (Eq. 10)


def test_max_pooling_gives_relevance_to_the_winners():
    from fedveil.models.supernet import _z_plus

    a = torch.tensor([[[[1.0, 3.0], [2.0, 0.5]]]], dtype=torch.float64)
    r = _z_plus(a, torch.tensor([[[[6.0]]]], dtype=torch.float64), lambda t: torch.nn.functional.max_pool2d(t, 2))
    torch.testing.assert_close(r, torch.tensor([[[[0.0, 6.0], [0.0, 0.0]]]], dtype=torch.float64))


def test_lrp_importances_of_an_mlp_by_hand():
    torch.manual_seed(2)
    net = build_model("adds_vgg", (6,), 3, channels=[], hidden=[5, 4], importance="lrp")
    x, y = torch.rand(7, 6), torch.tensor([0, 1, 2, 0, 1, 2, 0])
    b = net.importances(x, y)
    h1 = torch.relu(net.fcs[0](x))
    h2 = torch.relu(net.fcs[1](h1))
    logits = net.head(h2)
    r = torch.zeros_like(logits)
    r[torch.arange(7), y] = logits[torch.arange(7), y]
    w = net.head.weight.clamp(min=0)
    r2 = h2 * ((r / (h2 @ w.T + 1e-9)) @ w)
    w1 = net.fcs[1].weight.clamp(min=0)
    r1 = h1 * ((r2 / (h1 @ w1.T + 1e-9)) @ w1)
    for got, rel in zip(b, [r1, r2]):
        expected = rel.abs().mean(0)
        torch.testing.assert_close(got, (expected / expected.max()).detach(), rtol=1e-4, atol=1e-6)


def test_lrp_supernet_trains_like_slim_with_its_own_importances():
    torch.manual_seed(3)
    net = build_model("adds_vgg", (1, 8, 8), 10, channels=[4], hidden=[8], importance="lrp")
    state = {k: v.detach().clone().requires_grad_(True) for k, v in model_state(net).items()}
    state["alpha"].data.fill_(0.6)
    x, y = torch.rand(6, 1, 8, 8), torch.randint(0, 10, (6,))
    groups = {**sampling_groups(3, 3, net.unit_counts), "adds_label": y}
    out = forward(net, state, x, train=True, groups=groups)
    (alpha_grad,) = torch.autograd.grad(nn.functional.cross_entropy(out, y), [state["alpha"]])
    assert torch.all(alpha_grad != 0)
    assert len(net.importances(x, y)) == 2
