"""The Split-Mix reproductions share only ``splitmix_study`` (and read the paper's numbers
from data), and their plans keep every run in the folder it had before the plans existed."""
from __future__ import annotations

import ast
import os
from importlib.resources import files

from fedveil.reproduce import REPRODUCTIONS, ReproductionContext
from fedveil_reproductions import splitmix_ablation, splitmix_cifar, splitmix_digits

MODULES = ("splitmix_ablation", "splitmix_cifar", "splitmix_digits", "splitmix_robust", "splitmix_variants")


def test_a_reproduction_imports_from_its_siblings_only_the_shared_module_and_the_paper_numbers():
    for module in MODULES:
        tree = ast.parse((files("fedveil_reproductions") / f"{module}.py").read_text())
        siblings = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}
        assert siblings <= {"splitmix_study", "paper_numbers"}, module


def test_plans_name_their_run_folders(tmp_path):
    ctx = ReproductionContext(out_dir=tmp_path, quick=True, data_root=tmp_path)
    names = {name: [run.name for run in REPRODUCTIONS.get(name).plan(ctx)] for name in
             ("splitmix_digits", "splitmix_cifar", "splitmix_robust", "splitmix_contact")}
    assert names["splitmix_digits"][:4] == ["split_mix_seed0", "heterofl_seed0", "sheterofl_seed0", "fedavg_x0.125_seed0"]
    assert names["splitmix_cifar"][0] == "noniid/split_mix_seed0"  # runs/<setting>/<run>
    last = os.path.normpath(ctx.runs_dir / names["splitmix_cifar"][-1])
    assert last == str(tmp_path / "runs" / "iid" / "fedavg_x1_seed0")
    assert names["splitmix_robust"] == ["at_lam0_seed0", "at_lam1_seed0", "dat_seed0", "oat_seed0", "splitmix_dat_seed0",
                                        "budget_at_seed0"]
    assert names["splitmix_contact"] == ["2_split_mix_seed0", "2_baseline_seed0", "all_split_mix_seed0", "all_baseline_seed0"]


def test_the_paper_tables_are_read_by_width():
    assert splitmix_digits.TABLE["sheterofl"] == {0.125: 86.8, 0.25: 87.9, 0.5: 86.9, 1.0: 81.3}
    assert splitmix_cifar.TABLES["iid"]["split_mix"][1.0] == 86.0
    assert splitmix_ablation.paper_row(("tracked", True, True)) == [8.8, 8.8, 8.8, 10.6]
    assert splitmix_ablation.paper_x1(("post average", True, True), ("batch average", True, True)) == "90.2% vs 89.8%"
