"""One run's plots per method for the docs: runs each method's example config and copies its
PNGs to ``docs/images/<method>/``, where the method's docs page shows them.

``python scripts/make_method_pngs.py [--data-root ../shared/data] [--only fade adds ...]``
(about ten minutes on 2 CPU cores; FADE on Adult needs the real Adult files)
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"

# method -> (command after `fedveil`, PNGs to keep); {out} is the run directory
RUNS: dict[str, list[tuple[list[str], list[str]]]] = {
    "fade": [(["run", "examples/fade_adult.toml", "--out", "{out}"], ["learning_curves.png"])],
    "adds": [(["run", "examples/adds_digits.toml", "--out", "{out}"], ["learning_curves.png"])],
    "split_mix": [(["run", "examples/split_mix_digits.toml", "--out", "{out}"], ["learning_curves.png"])],
    "fedfed": [
        (["run", "examples/fedfed_distill_digits.toml", "--out", "{tmp}/runs/fedfed_distill_digits"], ["learning_curves.png"]),
        (["run", "examples/fedfed_digits.toml", "algorithm.distiller={tmp}/runs/fedfed_distill_digits", "--out", "{out}"],
         ["learning_curves.png", "privacy_curve.png"]),
    ],
    "dp_schedules": [(["run", "examples/dp_fedavg_schedule.toml", "--out", "{out}"], ["learning_curves.png", "privacy_curve.png"])],
    "pets": [(["pets", "examples/pets_synthetic.toml", "--out", "{out}"], ["precision_recall.png"])],
    "ecos": [(["ecos", "examples/ecos_digits.toml", "--out", "{out}"], ["selection.png"])],
    "mr_mtl": [([  # docs/personalisation.md's example: School's 139 schools, silo-specific DP at epsilon 6
        "run", "--algorithm", "mr_mtl", "--dataset", "school", "data.root={data}/school", "data.num_clients=139",
        "data.partition.name=natural", "data.partition.key=school", "data.test_fraction=0.2",
        "data.options.normalize_target=true", "data.options.standardize_features=true", "data.standardize=per_client",
        "model.name=linear", "model.options.zero_init=true", "client.loss=half_mse", "client.lr=0.01", "algorithm.lam=1.0",
        "federation.rounds=200", "federation.clients_per_round=139", "privacy.level=example", "privacy.epsilon=6",
        "privacy.delta=1e-3", "privacy.clip=1", "executor=vectorized", "--out", "{out}",
    ], ["learning_curves.png", "privacy_curve.png"])],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--only", nargs="+", choices=sorted(RUNS), help="these methods only")
    args = parser.parse_args()
    env = {**os.environ, "FEDVEIL_DATA": args.data_root}
    fedveil = [sys.executable, "-m", "fedveil"]
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.only or sorted(RUNS):
            target = IMAGES / method
            target.mkdir(parents=True, exist_ok=True)
            for step, (command, pngs) in enumerate(RUNS[method]):
                out = Path(tmp) / f"{method}-{step}"
                argv = [a.format(out=out, tmp=tmp, data=args.data_root) for a in command]
                print(f"{method}: fedveil {' '.join(argv)}", flush=True)
                subprocess.run([*fedveil, *argv, "--quiet"], cwd=ROOT, env=env, check=True)
                out = Path(argv[argv.index("--out") + 1])
                for png in pngs:
                    name = png if len(RUNS[method]) == 1 else f"{Path(argv[1]).stem}_{png}"
                    shutil.copy(out / png, target / name)
                    print(f"  -> {(target / name).relative_to(ROOT)}", flush=True)


if __name__ == "__main__":
    main()
