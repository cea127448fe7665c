"""FADE's two UDA reproductions (fade_office, fade_digits) and what they share (fade_uda):
the central-baseline equivalence with hand-written SGD, tiny studies end to end, the run
configs of the protocol, accuracy scored by hand from ``model.pt`` and the method settings."""
from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedveil.config import validate
from fedveil.data import DATASETS
from fedveil.models.zoo import build_model
from fedveil.reproduce import REPRODUCTIONS, ReproductionContext
from fedveil.runtime.recorder import MemoryRecorder
from fedveil.runtime.run_dir import RunDirError
from fedveil.runtime.simulation import Simulation
from fedveil_reproductions import fade_digits, fade_office, fade_uda
from fedveil_reproductions.fade_digits import DigitsStudy
from fedveil_reproductions.fade_office import OfficeStudy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from mnist_idx_files import idx  # noqa: E402  (tests/data helper: tiny IDX files)


@pytest.fixture
def no_run_plots(monkeypatch):
    """Each run's own PNGs take ~1 s; the studies' figures are still drawn."""
    import fedveil.runtime.simulation as simulation

    monkeypatch.setattr(simulation, "write_report", lambda path: [])


# ----------------------------------------------------------------------------- (a) central = SGD

SYNTH = {"num_classes": 3, "num_domains": 2, "samples_per_class": 4, "image_size": 8, "seed": 0}
MLP = {"groups": 2, "hidden": [16], "z_dim": 8, "head_hidden": [6], "disc_hidden": [5]}
LR = 0.5


def central_config(lam: float, conditioning: str, entropy_weights: bool) -> dict:
    """The central baseline's core: one labelled source user (domain 0) and one unlabelled
    target user (domain 1), both every round, one full-batch step, beta 1, uniform weights."""
    return {
        "seed": 3,
        "data": {
            "name": "multidomain_synthetic", "num_clients": 2, "options": SYNTH,
            # 12 rows per user: round(0.01 * 12) = 0 test rows, every row is a training row
            "test_fraction": 0.01,
            "partition": {"name": "domain", "key": "domain", "clients_per_domain": [1, 1]},
        },
        "model": {"name": "fade_mlp", "options": {**MLP, "conditioning": conditioning}},
        "algorithm": {
            "name": "fade", "group_key": "domain", "beta": 1.0, "weighting": "uniform", "lam": lam,
            "lam_schedule": "constant", "unlabelled_clients": [1], "guard": None, "entropy_weights": entropy_weights,
        },
        "client": {"steps": 1, "batch_size": 0, "lr": LR, "momentum": 0.0, "lr_schedule": "constant"},
        "federation": {"rounds": 1, "clients_per_round": 2},
        "checkpoint": {"every": 0},
    }


def hand_step(init: dict, lam: float, cdan: bool, reverse: bool = True) -> dict:
    """One SGD step on 0.5 [CE(f(G(x_s)), y_s) + adv_s] + 0.5 adv_t, written out layer by
    layer; G's gradient of the adversarial terms is multiplied by -lam (the reversal)."""
    source = DATASETS.get("multidomain_synthetic")(None, download=False, **SYNTH).train
    domain = source.groups["domain"]
    xs, ys, xt = source.x[domain == 0], source.y[domain == 0], source.x[domain == 1]
    p = {k: v.detach().clone().requires_grad_(True) for k, v in init.items() if k != "reverse.lam"}

    def linear(h, name):
        return F.linear(h, p[f"{name}.weight"], p[f"{name}.bias"])

    def encoder(x):
        return F.relu(linear(F.relu(linear(x.flatten(1), "encoder.fc1")), "encoder.fc2"))

    def two_layer(h, part):
        return linear(F.relu(linear(h, f"{part}.fc1")), f"{part}.out")

    def adversarial(z, group):
        logits = two_layer(z, "head")
        features, weights = z, torch.ones(len(z))
        if cdan:
            probs = torch.softmax(logits, 1).detach()
            features = torch.stack([probs[i].outer(z[i]).flatten() for i in range(len(z))])  # (C * Z) per row
            weights = 1 + torch.exp((probs * torch.log(probs + 1e-5)).sum(1))  # 1 + exp(-H(p))
        ce = F.cross_entropy(two_layer(features, "disc"), torch.full((len(z),), group), reduction="none")
        return (weights * ce).sum() / weights.sum()

    zs, zt = encoder(xs), encoder(xt)
    task = 0.5 * F.cross_entropy(two_layer(zs, "head"), ys)
    adv = 0.5 * adversarial(zs, 0) + 0.5 * adversarial(zt, 1)
    names = list(p)
    g_task = torch.autograd.grad(task, [p[n] for n in names], retain_graph=True, allow_unused=True)
    g_adv = torch.autograd.grad(adv, [p[n] for n in names], allow_unused=True)
    out = {}
    for name, gt, ga in zip(names, g_task, g_adv):
        gt = torch.zeros_like(p[name]) if gt is None else gt
        ga = torch.zeros_like(p[name]) if ga is None else ga
        sign = -lam if reverse and name.startswith("encoder.") else 1.0
        out[name] = init[name] - LR * (gt + sign * ga)
    return out


@pytest.mark.parametrize(
    "lam, conditioning, entropy_weights",
    [(1.0, "none", False), (0.5, "none", False), (1.0, "cdan", True)],
    ids=["dann", "dann-lam0.5", "cdan-entropy"],
)
def test_central_round_is_one_sgd_step_on_the_mean_of_both_users_losses(lam, conditioning, entropy_weights):
    sim = Simulation.from_config(validate(central_config(lam, conditioning, entropy_weights)))
    assert [len(c.train) for c in sim.data.clients] == [12, 12]  # every row of its domain
    init = {k: v.detach().clone() for k, v in sim.init.items()}
    expected_names = {
        f"{part}.{layer}.{kind}" for part, layers in (("encoder", ("fc1", "fc2")), ("head", ("fc1", "out")), ("disc", ("fc1", "out")))
        for layer in layers for kind in ("weight", "bias")
    }
    assert set(init) == expected_names | {"reverse.lam"}  # the hand-written forward covers every parameter
    rec = MemoryRecorder()
    sim.record(rec)
    assert rec.rows[-1]["lambda"] == lam and rec.rows[-1]["adversarial_users"] == 1.0
    expected = hand_step(init, lam, conditioning == "cdan")
    for name in expected_names:
        assert torch.allclose(rec.model[name], expected[name], rtol=0, atol=1e-6), name
        assert (rec.model[name] - init[name]).abs().max() > 1e-4, name  # every part moved
    # the reversal matters: the same step without it lands elsewhere for G only
    plain = hand_step(init, lam, conditioning == "cdan", reverse=False)
    assert max(float((plain[n] - rec.model[n]).abs().max()) for n in expected_names if n.startswith("encoder.")) > 1e-4
    assert all(torch.allclose(plain[n], rec.model[n], rtol=0, atol=1e-6) for n in expected_names if not n.startswith("encoder."))


# ----------------------------------------------------------------------------- (b) fade_office


def office_ctx(tmp_path: Path) -> ReproductionContext:
    return ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=tmp_path)


def reproduce(name: str, study, ctx: ReproductionContext, monkeypatch):
    """The registered reproduction ``name`` (fade_office, fade_digits) on ``study`` instead of its own."""
    module = {"fade_office": fade_office, "fade_digits": fade_digits}[name]
    monkeypatch.setattr(module, f"{name.removeprefix('fade_')}_study", lambda quick: study)
    return REPRODUCTIONS.get(name)(ctx)


def tiny_office(**changes) -> OfficeStudy:
    # 3 images per class and domain: the iid split deals every target class to all 3 target users
    settings = dict(tasks=["0->1"], methods=["dann", "cdan"], central=["cdan"], seeds=[0, 1], samples_per_class=3,
                    image_size=8, pretrain_rounds=2, pretrain_steps=1, rounds=2, steps=1, batch_size=8, lr=0.3)
    return OfficeStudy(**{**settings, **changes})


def cell(values: list[float]) -> str:
    return f"{np.mean(values):.4f} ± {np.std(values, ddof=1):.4f} (n={len(values)})"


def synthetic_target(study: OfficeStudy, domain: int) -> tuple[torch.Tensor, torch.Tensor]:
    source = DATASETS.get("multidomain_synthetic")(
        None, download=False, num_classes=31, num_domains=3, samples_per_class=study.samples_per_class,
        image_size=study.image_size, domain_shift=study.domain_shift, seed=0,
    ).train
    rows = source.groups["domain"] == domain
    return source.x[rows], source.y[rows]


def hand_accuracy(run_dir: Path, model_name: str, options: dict, num_classes: int, x, y) -> float:
    model = build_model(model_name, tuple(x.shape[1:]), num_classes, **options)
    model.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True))
    with torch.no_grad():
        return int((model(x)[0].argmax(1) == y).sum()) / len(y)


@pytest.mark.usefixtures("no_run_plots")
def test_office_tiny_study_end_to_end_and_reuse(tmp_path, monkeypatch):
    study, ctx = tiny_office(), office_ctx(tmp_path)
    report = reproduce("fade_office", study, ctx, monkeypatch)
    png = ctx.out_dir / "office_target_accuracy.png"
    assert report.figures == [png.name] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    acc = report.extra["target_accuracy"]
    keys = ["federated/source_only", "non-iid/dann", "non-iid/cdan", "iid/dann", "iid/cdan", "central/cdan"]
    assert set(acc) == set(keys) | {"central/source_only"}
    assert acc["central/source_only"] == acc["federated/source_only"]  # one source model serves both
    assert all(list(acc[k]) == ["0->1"] and len(acc[k]["0->1"]) == 2 for k in acc)

    # 93 target rows (31 classes x 3 images); every score is a count over them
    x, y = synthetic_target(study, 1)
    assert len(y) == 93
    for values in acc.values():
        for a in values["0->1"]:
            assert 0 <= a <= 1 and abs(a * 93 - round(a * 93)) < 1e-9
    runs = ctx.runs_dir
    groups3 = {"groups": 3}
    cdan = {"groups": 3, "conditioning": "cdan"}
    assert acc["non-iid/cdan"]["0->1"][1] == pytest.approx(hand_accuracy(runs / "0_to_1_non-iid_cdan_seed1", "fade_cnn", cdan, 31, x, y), abs=1e-12)
    assert acc["iid/dann"]["0->1"][0] == pytest.approx(hand_accuracy(runs / "0_to_1_iid_dann_seed0", "fade_cnn", groups3, 31, x, y), abs=1e-12)
    assert acc["federated/source_only"]["0->1"][1] == pytest.approx(
        hand_accuracy(runs / "0_to_1_pretrain_seed1", "fade_cnn", groups3, 31, x, y), abs=1e-12)

    # rows: per task and average for every setting, then the claims
    by_metric = {}
    for row in report.rows:
        by_metric.setdefault(row.metric, []).append(row)
    labels = {"federated/source_only": "Source only (federated)", "non-iid/dann": "FADE-DANN (non-iid)",
              "non-iid/cdan": "FADE-CDAN (non-iid)", "iid/dann": "FADE-DANN (iid)", "iid/cdan": "FADE-CDAN (iid)",
              "central/cdan": "FADE-CDAN (central)"}
    papers = {"federated/source_only": 72.2, "non-iid/dann": 70.3, "non-iid/cdan": 80.7, "iid/dann": 76.2,
              "iid/cdan": 81.7, "central/cdan": 81.7}
    for key, label in labels.items():
        task_row, avg_row = by_metric[label]
        assert (task_row.setting, avg_row.setting) == ("task 0->1", "average over tasks")
        assert task_row.measured == avg_row.measured == cell(acc[key]["0->1"])  # one task: its average is itself
        assert avg_row.paper == f"{papers[key]} (%, Office/Office-Home avg)"
    claims = [r for r in report.rows if r.metric.startswith("(")]
    assert len(report.rows) == 2 * len(labels) + len(claims)
    assert [r.metric for r in claims] == [
        "(i) FADE-CDAN >= FADE-DANN", "(i) FADE-CDAN >= FADE-DANN", "(ii) FADE-DANN: iid >= non-iid targets",
        "(ii) FADE-CDAN: iid >= non-iid targets", "(iii) FADE-CDAN above Source only",
        "(iv) FADE-CDAN close to central CDAN: gap",
    ]
    assert [r.setting for r in claims[:2]] == ["non-iid targets, average", "iid targets, average"]
    m = {k: float(np.mean(v["0->1"])) for k, v in acc.items()}
    assert claims[0].measured == f"{m['non-iid/cdan']:.4f} vs {m['non-iid/dann']:.4f}"
    assert claims[4].measured == f"{m['non-iid/cdan']:.4f} vs {m['federated/source_only']:.4f}"
    fed, central = acc["non-iid/cdan"]["0->1"], acc["central/cdan"]["0->1"]
    se = math.sqrt(np.var(fed, ddof=1) / 2 + np.var(central, ddof=1) / 2)
    assert claims[5].measured == f"{(np.mean(fed) - np.mean(central)) * 100:+.2f} ± {se * 100:.2f} points"
    assert claims[5].verdict == "reported"

    # a second call reuses the finished runs: nothing retrained, every file byte for byte the same
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in runs.glob("*/*")}
    assert len({p.parent for p in before}) == 12  # 2 seeds x (pretrain + 2 splits x 2 methods + central)
    again = reproduce("fade_office", study, ctx, monkeypatch)
    assert again.rows == report.rows
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in runs.glob("*/*")}
    assert after.keys() == before.keys() and all(after[p][1] == before[p][1] for p in before)
    checkpoints = [p for p in before if p.name == "checkpoint.pt"]
    assert len(checkpoints) == 12 and all(after[p][0] == before[p][0] for p in checkpoints)
    # a run folder of another config is refused, not silently re-scored
    with pytest.raises(RunDirError, match="federation.rounds"):
        reproduce("fade_office", tiny_office(rounds=3), ctx, monkeypatch)


def test_office_adapt_configs(tmp_path):
    study = OfficeStudy(rounds=7, steps=3, batch_size=16)
    pre = tmp_path / "pre"
    shot = fade_office.adapt_config(study, "1->2", "central", "shot", 4, pre)
    assert shot["federation"] == {"rounds": 21, "clients_per_round": 1, "client_probabilities": [0, 1]}
    # one step per round restarts momentum: plain SGD at heavy-ball's effective step 0.01 / (1 - 0.9)
    assert shot["client"] == {"steps": 1, "batch_size": 16, "lr": pytest.approx(0.1), "momentum": 0.0, "lr_schedule": "dann"}
    assert shot["algorithm"] == {
        "name": "fade", "group_key": "domain", "beta": 1.0, "weighting": "uniform", "lam": 0.0,
        "unlabelled_clients": [1], "im_weight": 1.0, "pseudo_label_weight": 0.3, "freeze_head_unlabelled": True,
    }
    assert shot["data"]["num_clients"] == 2 and shot["eval"] == {"every": 21} and shot["seed"] == 4
    assert shot["data"]["partition"] == {
        "name": "class_window", "window": 31, "stride": 10, "source_clients": 1, "source_domain": 1, "target_domain": 2,
    }
    assert shot["model"] == {"name": "fade_cnn", "options": {"groups": 3}, "init_from": str(pre), "init_skip": ["disc."]}
    central_cdan = fade_office.adapt_config(study, "1->2", "central", "cdan", 4, pre)
    assert central_cdan["federation"] == {"rounds": 21, "clients_per_round": 2, "client_probabilities": [1, 1]}
    assert central_cdan["client"]["steps"] == 1 and central_cdan["algorithm"]["beta"] == 1.0
    federated = fade_office.adapt_config(study, "0->1", "non-iid", "dann", 0, pre)
    assert federated["federation"] == {"rounds": 7, "clients_per_round": 2}
    assert federated["client"]["steps"] == 3 and federated["algorithm"]["beta"] == 0.5
    assert federated["algorithm"]["unlabelled_clients"] == [1, 2, 3] and federated["data"]["num_clients"] == 4
    assert federated["data"]["partition"]["window"] == 20
    assert fade_office.adapt_config(study, "0->1", "iid", "dann", 0, pre)["data"]["partition"]["window"] == 31
    pretrain = fade_office.pretrain_config(study, "0->1", 0)
    assert pretrain["federation"] == {"rounds": 50, "clients_per_round": 1, "client_probabilities": [1, 0, 0, 0]}
    assert pretrain["algorithm"]["lam"] == 0.0 and pretrain["client"]["steps"] == 20
    for config in (shot, central_cdan, federated, pretrain):
        validate(config)


# ----------------------------------------------------------------------------- (c) fade_digits


@pytest.fixture
def mnist_root(tmp_path):
    folder = tmp_path / "mnist-10k"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 30), ("t10k", 10)):
        (folder / f"{split}-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx(rng.integers(0, 256, (n, 28, 28)))))
        (folder / f"{split}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx(np.arange(n) % 10)))
    return tmp_path


def test_digits_adapt_configs(tmp_path, mnist_root):
    ctx = ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=mnist_root)
    study = DigitsStudy(rounds=9, eval_every=3)
    pre = tmp_path / "pre"
    base = fade_digits.base_config(ctx, study, "mnist->digits", 0)
    assert base["data"]["root"] == str(mnist_root / "mnist-10k")
    assert base["federation"]["client_probabilities"] == [1.0, 0.0] and base["algorithm"]["unlabelled_clients"] == [1]
    forward = fade_digits.adapt_config(base, study, "mnist->digits", "dann", 0.1, pre)
    assert forward["federation"] == {"rounds": 9, "clients_per_round": 1, "client_probabilities": [0.9, 0.1]}
    assert forward["client"]["lr_schedule"] == "dann" and forward["eval"]["every"] == 3
    assert forward["algorithm"]["lam"] == 1.0 and forward["model"]["init_from"] == str(pre)
    back_base = fade_digits.base_config(ctx, study, "digits->mnist", 0)
    assert back_base["federation"]["client_probabilities"] == [0.0, 1.0]  # source digits = client 1
    assert back_base["algorithm"]["unlabelled_clients"] == [0]
    back = fade_digits.adapt_config(back_base, study, "digits->mnist", "squared", 0.1, pre)
    assert back["federation"]["client_probabilities"] == [0.1, 0.9]
    assert back["algorithm"]["adversarial_loss"] == "squared"
    for config in (base, forward, back_base, back):
        validate(config)


@pytest.mark.usefixtures("no_run_plots")
def test_digits_tiny_study_end_to_end(tmp_path, mnist_root, monkeypatch):
    from sklearn.datasets import load_digits

    ctx = ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=mnist_root)
    study = DigitsStudy(directions=["mnist->digits"], target_probabilities=[0.1, 0.5], seeds=[0],
                        pretrain_rounds=2, rounds=2, steps=1, eval_every=1)
    report = reproduce("fade_digits", study, ctx, monkeypatch)
    assert (ctx.out_dir / "digits_target_accuracy.png").read_bytes()[:4] == b"\x89PNG"
    got = report.extra["target_accuracy"]["mnist->digits"]
    assert set(got) == {"source_only", "none", "dann", "squared"}
    assert all(set(got[m]) == {"0.1", "0.5"} and all(len(v) == 1 for v in got[m].values()) for m in ("none", "dann", "squared"))

    # the target domain: the 1,797 scikit-learn digits, pixel / 16, scored by hand from model.pt
    bunch = load_digits()
    x = torch.from_numpy(bunch.images / 16).float().unsqueeze(1)
    y = torch.from_numpy(bunch.target).long()
    runs = ctx.runs_dir
    assert got["dann"]["0.1"][0] == pytest.approx(hand_accuracy(runs / "mnist_to_digits_dann_p0.1_seed0", "fade_cnn", {"groups": 2}, 10, x, y), abs=1e-12)
    assert got["source_only"][0] == pytest.approx(hand_accuracy(runs / "mnist_to_digits_pretrain_seed0", "fade_cnn", {"groups": 2}, 10, x, y), abs=1e-12)
    squared_cfg = fade_digits.adapt_config(fade_digits.base_config(ctx, study, "mnist->digits", 0), study, "mnist->digits",
                                           "squared", 0.5, runs / "mnist_to_digits_pretrain_seed0")
    assert fade_uda.accuracy(runs / "mnist_to_digits_squared_p0.5_seed0", squared_cfg, 10, x, y) == pytest.approx(
        hand_accuracy(runs / "mnist_to_digits_squared_p0.5_seed0", "fade_cnn", {"groups": 2}, 10, x, y), abs=1e-12)
    partition = json.loads((runs / "mnist_to_digits_pretrain_seed0" / "partition.json").read_text())
    assert partition["train_sizes"] == [32, 1438]  # 40 MNIST rows - round(8.0); 1,797 digits - round(359.4)

    metrics = [r.metric for r in report.rows]
    assert len(report.rows) == 1 + 2 * 3 + 3
    assert metrics[0] == "Source only: target accuracy" and report.rows[0].measured == f"{got['source_only'][0]:.4f} ± 0.0000 (n=1)"
    assert metrics[1:4] == ["no adversary: target accuracy", "FADE-DANN: target accuracy", "FADE-DANN (squared loss): target accuracy"]
    assert report.rows[2].setting == "mnist->digits, target-user probability 0.1"
    assert report.rows[5].measured == f"{got['dann']['0.5'][0]:.4f} ± 0.0000 (n=1)"
    claims = report.rows[7:]
    assert [c.metric for c in claims] == [
        "(i) vanilla: p = 0.1 below p = 0.5", "(ii) p = 0.1: squared above vanilla",
        "(iii) p = 0.5: vanilla adversary above no adversary",
    ]

    def one_seed(higher: float, lower: float) -> str:
        return "holds (one seed: noise not estimated)" if higher > lower else "does not hold"

    assert claims[0].verdict == one_seed(got["dann"]["0.5"][0], got["dann"]["0.1"][0])
    assert claims[1].verdict == one_seed(got["squared"]["0.1"][0], got["dann"]["0.1"][0])
    assert claims[2].verdict == one_seed(got["dann"]["0.5"][0], got["none"]["0.5"][0])
    assert claims[2].measured == f"{got['dann']['0.5'][0]:.4f} vs {got['none']['0.5'][0]:.4f}"


# ----------------------------------------------------------------------------- (d) method settings


def adaptation_base() -> dict:
    return {
        "seed": 1,
        "model": {"name": "fade_cnn", "options": {"groups": 3, "z_dim": 50}},
        "algorithm": {"name": "fade", "group_key": "domain", "beta": 0.5, "lam": 0.0, "unlabelled_clients": [1]},
        "client": {"steps": 5},
    }


def test_adapted_cdan_conditions_the_discriminator_and_starts_from_the_source_model(tmp_path):
    base = adaptation_base()
    config = fade_uda.adapted(base, "cdan", tmp_path / "pre")
    assert config["model"] == {
        "name": "fade_cnn", "options": {"groups": 3, "z_dim": 50, "conditioning": "cdan"},
        "init_from": str(tmp_path / "pre"), "init_skip": ["disc."],
    }
    assert config["algorithm"] == {**base["algorithm"], "lam": 1.0, "entropy_weights": True}
    assert config["client"] == {"steps": 5} and config["seed"] == 1
    assert base == adaptation_base()  # the phase's config is not modified


def test_adapted_shot_has_no_adversary_and_shot_terms(tmp_path):
    config = fade_uda.adapted(adaptation_base(), "shot", tmp_path / "pre")
    algorithm = config["algorithm"]
    assert algorithm["lam"] == 0.0 and algorithm["im_weight"] == 1.0 and algorithm["pseudo_label_weight"] == 0.3
    assert algorithm["freeze_head_unlabelled"] is True and "entropy_weights" not in algorithm
    assert config["model"]["options"] == {"groups": 3, "z_dim": 50}  # plain DANN features, no conditioning
    assert config["model"]["init_skip"] == ["disc."]
    both = fade_uda.adapted(adaptation_base(), "cdan_shot", tmp_path / "pre")
    assert both["algorithm"]["lam"] == 1.0 and both["algorithm"]["entropy_weights"] is True
    assert both["algorithm"]["im_weight"] == 1.0 and both["model"]["options"]["conditioning"] == "cdan"
    none = fade_uda.adapted(adaptation_base(), "none", tmp_path / "pre")
    assert none["algorithm"] == adaptation_base()["algorithm"]  # lambda stays 0
    squared = fade_uda.adapted(adaptation_base(), "squared", tmp_path / "pre")
    assert squared["algorithm"]["adversarial_loss"] == "squared" and squared["algorithm"]["lam"] == 1.0
