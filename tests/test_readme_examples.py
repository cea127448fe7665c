"""Every example in README.md is run by a test, scaled down (issue 20 item 6).

The ``fedveil`` command lines of the README's ```bash blocks (``fedveil ...`` and
``.venv/bin/fedveil ...``, ``\\``-continued lines joined, plus the fedveil commands of the
Makefile targets the README runs, e.g. ``make demo``) and its ```python blocks are read from
the README at collection time and run in-process through ``fedveil.cli.main.main`` from an
empty temporary folder:

- ``examples/X.toml`` becomes the absolute path of the repository's file (``runs/...``,
  ``sweeps/...`` and ``results/...`` then land in the temporary folder);
- each command is scaled down by its entry of ``SCALING``: ``key=value`` overrides inserted
  after the command's own positional items (so they win over the README's, and argparse
  still reads them as positionals), and options appended at the end (the last of a
  repeated option wins, e.g. ``--trials``, ``--data-root``);
- data the tests cannot depend on (``../shared/data``) is replaced by tiny files in the
  real format (the MNIST-10k subset pair ``images-idx3-ubyte.gz`` / ``labels-idx1-ubyte.gz``).

Commands that read an earlier command's output (resume / report after a run, compare after
a sweep, evaluate after a Split-Mix run, FedFed phase 2 after phase 1) form a group that
runs in the README's order in one folder. ``test_every_readme_command_has_a_scaling_entry``
fails when the README gains a command (or a python block) this file does not know.
"""
from __future__ import annotations

import ast
import glob
import gzip
import json
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import fedveil.runtime.simulation as simulation
from fedveil.cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
from mnist_idx_files import idx  # noqa: E402  (tests/data helper: tiny IDX files)

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAKEFILE = REPO / "Makefile"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# --------------------------------------------------------------------------- README parsing


def readme_blocks(lang: str, text: str | None = None) -> list[str]:
    """The bodies of the README's fenced blocks of language ``lang``, in order."""
    text = README.read_text() if text is None else text
    return [m.group(1) for m in re.finditer(rf"^```{lang}[ \t]*\n(.*?)^```", text, re.M | re.S)]


def _is_fedveil(token: str) -> bool:
    return token == "fedveil" or token.endswith("bin/fedveil")  # .venv/bin/fedveil, $(VENV)/bin/fedveil


def _command_lines(script: str) -> list[list[str]]:
    """Each line of a shell script (continuations joined) as tokens, comments dropped."""
    lines = []
    for line in script.replace("\\\n", " ").splitlines():
        tokens = shlex.split(line, comments=True)
        if tokens:
            lines.append(tokens)
    return lines


def make_recipe(target: str) -> list[str]:
    """The recipe lines of Makefile ``target``."""
    lines, inside = [], False
    for line in MAKEFILE.read_text().splitlines():
        if re.match(rf"^{re.escape(target)}\s*:(?!=)", line):
            inside = True
        elif inside and line.startswith("\t"):
            lines.append(line.strip())
        elif inside:
            break
    return lines


def readme_commands(text: str | None = None) -> list[str]:
    """Every fedveil command of the README's bash blocks, normalised to ``fedveil ARGS``
    (shell-quoted as the shell would pass them), once each, in README order. A ``make
    TARGET`` line contributes the fedveil commands of that target's recipe."""
    seen: dict[str, None] = {}
    for block in readme_blocks("bash", text):
        for tokens in _command_lines(block):
            if _is_fedveil(tokens[0]):
                found = [tokens]
            elif tokens[0] == "make":
                targets = [t for t in tokens[1:] if "=" not in t and not t.startswith("-")]
                found = [t for target in targets for t in _command_lines("\n".join(make_recipe(target)))
                         if _is_fedveil(t[0])]
            else:
                continue
            for command in found:
                seen.setdefault(shlex.join(["fedveil", *command[1:]]))
    return list(seen)


# --------------------------------------------------------------------------- scaling table


@dataclass(frozen=True)
class Step:
    """How one README command is scaled down and what its run must show.

    ``overrides`` go after the command's own positional items, ``options`` at the end;
    ``{mnist}`` and ``{data}`` in either become the tiny MNIST folder and its data root.
    ``group``: commands sharing one run in README order in one folder (None: on their own).
    ``check(tmp, out)`` asserts on the files written and the standard output.
    ``setup(monkeypatch)`` scales what no flag reaches."""

    overrides: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    check: Callable[[Path, str], None] | None = None
    group: str | None = None
    setup: Callable[[pytest.MonkeyPatch], None] | None = None


def _json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def _one(pattern: str, tmp: Path) -> Path:
    found = glob.glob(str(tmp / pattern))
    assert len(found) == 1, (pattern, found)
    return Path(found[0])


def _rounds(run_dir: Path) -> list[int]:
    return [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def check_listing(*names: str) -> Callable[[Path, str], None]:
    def check(tmp: Path, out: str) -> None:
        listed = {line.split()[0] for line in out.splitlines() if line.strip()}
        assert set(names) <= listed, out

    return check


def check_run(pattern: str, rounds: int = 2, **expected) -> Callable[[Path, str], None]:
    """A finished run in ``tmp/pattern``: ``rounds`` rounds in metrics.jsonl and summary.json,
    its summary printed, and ``expected`` summary values (a callable: a predicate)."""

    def check(tmp: Path, out: str) -> None:
        run_dir = _one(pattern, tmp)
        summary = _json(run_dir / "summary.json")
        assert summary["rounds_completed"] == rounds and _rounds(run_dir) == list(range(1, rounds + 1))
        assert 0.0 <= summary["global_test_accuracy"] <= 1.0
        assert "global model, pooled test accuracy" in out and f"run directory: {run_dir.relative_to(tmp)}" in out
        for key, want in expected.items():
            assert want(summary[key]) if callable(want) else summary[key] == want, (key, summary.get(key))

    return check


def check_config(pattern: str, **expected) -> Callable[[Path, str], None]:
    """The saved config.json has ``expected`` (dotted keys as ``a__b``) and the run finished."""

    def check(tmp: Path, out: str) -> None:
        check_run(pattern)(tmp, out)
        config = _json(_one(pattern, tmp) / "config.json")
        for dotted, want in expected.items():
            node = config
            for key in dotted.split("__"):
                node = node[key]
            assert node == want, (dotted, node)

    return check


def check_resumed(tmp: Path, out: str) -> None:
    """Resuming the finished run re-scores it: no round is added, the summary is the same."""
    run_dir = tmp / "runs" / "mnist_fedavg"
    assert _rounds(run_dir) == [1, 2]
    assert _json(run_dir / "summary.json")["rounds_completed"] == 2
    assert "run directory: runs/mnist_fedavg" in out


def check_report(tmp: Path, out: str) -> None:
    """The metrics table, and the plots drawn again (the scaled run itself skipped them)."""
    run_dir = tmp / "runs" / "mnist_fedavg"
    assert "round" in out.splitlines()[1] and "global_test_accuracy" in out  # the metrics table
    for png in ("learning_curves.png", "client_scores.png", "label_distribution.png"):
        assert f"runs/mnist_fedavg/{png}" in out and (run_dir / png).read_bytes()[:8] == PNG_MAGIC


def check_audit(tmp: Path, out: str) -> None:
    assert "example-level audit of silo 0" in out and re.search(r"^\s*trials\s+20 \(10 with the canary", out, re.M)
    assert re.search(r"^\s*accounted epsilon\s+1\.0000", out, re.M)
    assert re.search(r"^\s*verdict\s+consistent", out, re.M)


def scale_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    """One subprocess instead of the quick suite's dozen: 2 clients, 1 measured round, no DP
    variant (each case is a fresh Python process with torch: seconds each on 2 cores)."""
    import fedveil.bench.harness as harness

    suite = harness.suite

    def small(quick, systems=None, workloads=None, cohorts=None, rounds=None, dp=None, *args, **kwargs):
        return suite(quick, systems, workloads, [2], 1, False, *args, **kwargs)

    monkeypatch.setattr(harness, "suite", small)


def check_bench(tmp: Path, out: str) -> None:
    records = _json(tmp / "bench.json")["records"]
    assert [(r["workload"], r["system"], r["status"]) for r in records] == [("tiny", "fedveil-serial", "ok")], records
    assert records[0]["seconds_per_round"] > 0
    assert "fedveil-serial" in out and "s/round" in out


def check_sweep(tmp: Path, out: str) -> None:
    sweep = tmp / "sweeps" / "quickstart"
    runs = sorted(p.parent for p in sweep.glob("runs/*/summary.json"))
    assert len(runs) == 9, runs  # 3 epsilons x 3 seeds, as written
    pairs = {(_json(r / "config.json")["privacy"]["epsilon"], _json(r / "config.json")["seed"]) for r in runs}
    assert pairs == {(e, s) for e in (1.0, 4.0, 8.0) for s in (0, 1, 2)}
    for run_dir in runs:
        planned = _json(run_dir / "config.json")["privacy"]["epsilon"]
        assert 0 < _json(run_dir / "summary.json")["epsilon"] <= planned * 1.001
    assert "9 runs in sweeps/quickstart; compare them with: fedveil compare sweeps/quickstart" in out


def check_compare(tmp: Path, out: str) -> None:
    sweep = tmp / "sweeps" / "quickstart"
    assert "9 finished runs" in out
    for name in ("compare.md", "compare.json"):
        assert (sweep / name).is_file() and f"sweeps/quickstart/{name}" in out
    for name in ("compare_curves.png", "compare_epsilon.png"):
        assert (sweep / name).read_bytes()[:8] == PNG_MAGIC
    comparison = _json(sweep / "compare.json")
    assert comparison["keys"] == ["privacy.epsilon"]  # grouped by epsilon, mean over the seeds
    groups = {g["privacy.epsilon"]: g for g in comparison["groups"]}
    assert sorted(groups) == [1.0, 4.0, 8.0]
    for eps, group in groups.items():
        assert group["seeds"] == [0, 1, 2] and group["metrics"]["final accuracy"]["n"] == 3
        assert group["metrics"]["final epsilon"]["mean"] == pytest.approx(eps, rel=1e-3)


def check_config_show(tmp: Path, out: str) -> None:
    assert out.startswith("fedprox: algorithm")
    assert re.search(r"^\s+mu\s+float\s+0\.01\b", out, re.M), out


def check_evaluate(tmp: Path, out: str) -> None:
    """Every width of the 8 bases, served without retraining; parameters grow with the width."""
    table = out.split("method signals")[0]  # the run's own signals follow the table
    rows = [line.split() for line in table.splitlines()[1:] if line.strip()]
    assert [r[0] for r in rows] == [f"x{k / 8:g}" for k in range(1, 9)], out
    assert "bases trained per client" in out
    assert all(0.0 <= float(r[2]) <= 1.0 for r in rows)
    params = [int(r[4].replace(",", "")) for r in rows]
    assert params == sorted(params) and params[0] * 8 == params[-1]


def check_reproduce(tmp: Path, out: str) -> None:
    results = tmp / "runs" / "reproduce-quick" / "fedavg_mnist"  # scaled down by --quick: never over results/
    assert (results / "results.md").is_file() and (results / "results.json").is_file()
    assert not (tmp / "results").exists()
    assert "# FedAvg on non-IID MNIST with McMahan et al.'s CNN" in out and "smoke test, not a reproduction" in out
    report = _json(results / "results.json")
    assert "pooled test accuracy" in json.dumps(report)


MNIST = ('data.root="{mnist}"', "data.download=false")
QUIET = ("--quiet",)

# Every README command, exactly as the README writes it (normalised by shlex), and how it is scaled.
SCALING: dict[str, Step] = {
    "fedveil algorithms": Step(check=check_listing("fedavg", "fedprox", "split_mix", "adds", "fedfed_fedavg")),
    "fedveil datasets": Step(check=check_listing("digits", "mnist", "rotated_digits")),
    "fedveil run --algorithm fedprox --dataset digits algorithm.mu=0.01 federation.rounds=20 --out runs/prox": Step(
        ("federation.rounds=2",), QUIET,
        check_config("runs/prox", algorithm__name="fedprox", algorithm__mu=0.01, data__name="digits"),
    ),
    # also `make demo` (its recipe) and the "Without make" block
    "fedveil run examples/quickstart.toml": Step(
        ("federation.rounds=2",), QUIET, check_run("runs/digits-fedavg-*", epsilon=lambda e: 0 < e <= 8.0 * 1.001),
    ),
    "fedveil run examples/mnist_fedavg.toml --out runs/mnist_fedavg": Step(
        ("federation.rounds=2", *MNIST), QUIET, check_run("runs/mnist_fedavg", dataset="mnist", model="lenet"),
        group="mnist_fedavg",
    ),
    "fedveil run examples/dp_fedavg_schedule.toml --out runs/dp_fedavg": Step(
        ("federation.rounds=2",), QUIET,
        check_run("runs/dp_fedavg", num_clients=100, epsilon=lambda e: 0 < e <= 4.0 * 1.001),
    ),
    "fedveil run examples/consortium_secure.toml": Step(
        ("federation.rounds=2",), QUIET,
        check_run("runs/digits-mr_mtl-*", epsilon=lambda e: 0 < e <= 4.0 * 1.001, person_epsilon=lambda e: e > 0),
    ),
    "fedveil run examples/quickstart.toml executor=serial": Step(
        ("federation.rounds=2",), QUIET, check_config("runs/digits-fedavg-*", executor="serial"),
    ),
    "fedveil audit examples/quickstart.toml privacy.epsilon=1 federation.rounds=2 --trials 200": Step(
        (), ("--trials", "20", "--quiet"), check_audit,
    ),
    "fedveil bench --quick": Step(
        (), ("--workloads", "tiny", "--systems", "fedveil-serial", "--json", "bench.json"), check_bench,
        setup=scale_bench,
    ),
    "fedveil run --resume --out runs/mnist_fedavg": Step((), QUIET, check_resumed, group="mnist_fedavg"),
    "fedveil report runs/mnist_fedavg": Step(check=check_report, group="mnist_fedavg"),  # draws the plots
    "fedveil sweep examples/quickstart.toml privacy.epsilon=1,4,8 seed=0,1,2 --out sweeps/quickstart": Step(
        ("federation.rounds=1",), QUIET, check_sweep, group="sweep",
    ),
    "fedveil compare sweeps/quickstart": Step(check=check_compare, group="sweep"),
    "fedveil config show fedprox": Step(check=check_config_show),
    "fedveil run examples/split_mix_digits.toml --out runs/split_mix": Step(
        ("federation.rounds=2", "eval.every=1"), QUIET, check_run("runs/split_mix", algorithm="split_mix"),
        group="split_mix",
    ),
    "fedveil evaluate runs/split_mix --width all": Step(check=check_evaluate, group="split_mix"),
    "fedveil run examples/adds_digits.toml --out runs/adds": Step(
        ("federation.rounds=2", "eval.every=1"), QUIET, check_run("runs/adds", algorithm="adds"),
    ),
    "fedveil run examples/fedfed_distill_digits.toml --out runs/fedfed_distill_digits": Step(
        ("federation.rounds=2",), QUIET, check_run("runs/fedfed_distill_digits", algorithm="fedfed_distill"),
        group="fedfed",
    ),
    "fedveil run examples/fedfed_digits.toml --out runs/fedfed_digits": Step(  # reads runs/fedfed_distill_digits
        ("federation.rounds=2",), QUIET,
        check_run("runs/fedfed_digits", algorithm="fedfed_fedavg", epsilon=lambda e: e > 0), group="fedfed",
    ),
    "fedveil reproduce --list": Step(check=check_listing("fedavg_mnist", "mrmtl_school", "splitmix_digits")),
    # --quick (1 seed, 5 rounds, LeNet x0.5) on 1,000 tiny MNIST rows: a few seconds
    "fedveil reproduce fedavg_mnist --data-root ../shared/data": Step(
        (), ("--quick", "--data-root", "{data}"), check_reproduce,
    ),
}

# --------------------------------------------------------------------------- running


MNIST_ROWS = 1000  # 20 Dirichlet(0.5) clients of mnist_fedavg.toml need >= 10 rows each


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A data root whose ``mnist-10k`` holds the MNIST-10k subset pair as shipped in
    ../shared/data (gzipped IDX), with 1,000 random 28x28 "digits", labels 0..9 in turn."""
    root, rng = tmp_path_factory.mktemp("data"), np.random.default_rng(0)
    mnist = root / "mnist-10k"
    mnist.mkdir()
    images = rng.integers(0, 256, (MNIST_ROWS, 28, 28))
    (mnist / "images-idx3-ubyte.gz").write_bytes(gzip.compress(idx(images), compresslevel=1))
    (mnist / "labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx(np.arange(MNIST_ROWS) % 10)))
    return root


def scaled_argv(command: str, step: Step, data_root: Path) -> list[str]:
    """``command`` as argv for ``main``: example configs by absolute path, the step's
    overrides after the last positional item (config file or key=value), its options last."""
    places = {"mnist": str(data_root / "mnist-10k"), "data": str(data_root)}
    argv = shlex.split(command)[1:]
    argv = [str(REPO / a) if a.startswith("examples/") and a.endswith(".toml") else a for a in argv]
    positional = [i for i, a in enumerate(argv) if not a.startswith("-") and ("=" in a or a.endswith(".toml"))]
    at = positional[-1] + 1 if positional else 1  # else right after the subcommand
    overrides = [o.format(**places) for o in step.overrides]
    return argv[:at] + overrides + argv[at:] + [o.format(**places) for o in step.options]


def run_readme_command(command: str, tmp: Path, data_root: Path, capsys, monkeypatch) -> None:
    step = SCALING[command]
    if step.setup is not None:
        step.setup(monkeypatch)
    # runs skip their PNG plots (`fedveil report` and `fedveil compare` still draw theirs)
    monkeypatch.setattr(simulation, "write_report", lambda path: [])
    argv = scaled_argv(command, step, data_root)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, f"{command}\n  ran as: fedveil {shlex.join(argv)}\n  exit {code}\n{err[-3000:]}"
    if step.check is not None:
        step.check(tmp, out)


def _independent() -> list[str]:
    return [c for c in readme_commands() if c in SCALING and SCALING[c].group is None]


def _groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for command in readme_commands():
        if command in SCALING and SCALING[command].group is not None:
            groups.setdefault(SCALING[command].group, []).append(command)
    return groups


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", _independent(), ids=str)
def test_readme_command_runs_scaled_down(command, in_tmp, data_root, capsys, monkeypatch):
    run_readme_command(command, in_tmp, data_root, capsys, monkeypatch)


@pytest.mark.parametrize("commands", list(_groups().values()), ids=lambda cs: " && ".join(cs))
def test_readme_sequence_runs_in_order_in_one_folder(commands, in_tmp, data_root, capsys, monkeypatch):
    """Commands that read an earlier command's output, in README order, in one folder."""
    for command in commands:
        with monkeypatch.context() as patch:
            run_readme_command(command, in_tmp, data_root, capsys, patch)


# --------------------------------------------------------------------------- python blocks


def run_python_block(code: str, namespace: dict) -> list:
    """Execute ``code``; the values of its top-level expression statements are returned
    (what an interactive session would show)."""
    tree = ast.parse(code)
    shown: list = []
    namespace["_shown"] = shown
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.Expr) and not (
            isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id == "print"
        ):
            call = ast.parse("_shown.append(None)").body[0]
            call.value.args = [node.value]
            tree.body[i] = call
    exec(compile(ast.fix_missing_locations(tree), "README.md", "exec"), namespace)
    return shown


def python_run_block(code: str, tmp: Path, capsys, monkeypatch) -> None:
    """From Python: load_config + run. Scaled by wrapping load_config: a relative
    ``examples/`` path is read from the repository, and ``federation.rounds=2`` is appended
    to the block's overrides; the run directory lands in the temporary folder."""
    import fedveil.config

    load_config = fedveil.config.load_config

    def scaled(path=None, overrides=None):
        if path is not None and str(path).startswith("examples/"):
            path = REPO / path
        return load_config(path, [*(overrides or []), "federation.rounds=2"])

    monkeypatch.setattr(fedveil.config, "load_config", scaled)
    monkeypatch.setattr(simulation, "write_report", lambda path: [])
    namespace: dict = {}
    run_python_block(code, namespace)
    out = capsys.readouterr().out
    summary = namespace["summary"]
    assert summary["rounds_completed"] == 2 and namespace["config"].data.name == "digits"
    assert _json(_one("runs/from-python", tmp) / "summary.json") == json.loads(json.dumps(summary))
    accuracy, epsilon = out.split()
    assert float(accuracy) == summary["global_test_accuracy"] and 0 < float(epsilon) <= 8.0 * 1.001


def python_privacy_block(code: str, tmp: Path, capsys, monkeypatch) -> None:
    """The accountant one-liners: runnable as written (fast); epsilon of the given noise and
    the noise for the target epsilon are both positive, and calibrating back gives epsilon 3."""
    from fedveil.privacy import epsilon

    shown = run_python_block(code, {})
    assert len(shown) == 2 and all(v > 0 for v in shown), shown
    back = epsilon(noise_multiplier=shown[1], sample_rate=0.01, steps=10_000, delta=1e-5)
    assert back == pytest.approx(3.0, rel=0.02)


# a python block is known by a line it contains; every README python block must match exactly one
PYTHON_BLOCKS: dict[str, Callable] = {
    "from fedveil.runtime import run": python_run_block,
    "from fedveil.privacy import epsilon, calibrate_noise": python_privacy_block,
}


def _python_handler(code: str) -> Callable | None:
    handlers = [h for marker, h in PYTHON_BLOCKS.items() if marker in code.splitlines()]
    return handlers[0] if len(handlers) == 1 else None


@pytest.mark.parametrize(
    "code", [c for c in readme_blocks("python") if _python_handler(c)], ids=lambda c: c.strip().splitlines()[0]
)
def test_readme_python_block_runs_scaled_down(code, in_tmp, capsys, monkeypatch):
    _python_handler(code)(code, in_tmp, capsys, monkeypatch)


# --------------------------------------------------------------------------- coverage


def test_every_readme_command_has_a_scaling_entry():
    """Fails when the README gains a fedveil command (or python block) that SCALING (or
    PYTHON_BLOCKS) does not know: add an entry saying how a test runs it, scaled down."""
    commands = readme_commands()
    assert len(commands) >= 20 and "fedveil run examples/quickstart.toml" in commands  # the parser found them
    unmatched = [c for c in commands if c not in SCALING]
    blocks = [c.strip().splitlines()[0] for c in readme_blocks("python") if _python_handler(c) is None]
    if unmatched or blocks:
        print("README commands without a SCALING entry in tests/test_readme_examples.py:")
        for c in unmatched:
            print("  " + c)
        for b in blocks:
            print("  python block starting " + b)
    assert not unmatched and not blocks, f"not covered: {unmatched + blocks}"


def test_every_scaling_entry_is_a_readme_command():
    """A stale entry (the README dropped or changed the command) is reported, so the table
    stays the README's list."""
    stale = sorted(set(SCALING) - set(readme_commands()))
    assert not stale, f"SCALING entries no longer in README.md: {stale}"


def test_readme_example_configs_read_the_shared_data_folder():
    """What scaling hides: an example config's own data.root (read from the file's folder)
    is the ../shared/data of a checkout, the folder `fedveil reproduce ... --data-root
    ../shared/data` reads from the repository root, so the unscaled command finds its data."""
    from fedveil.config import load_config

    shared = (REPO / ".." / "shared" / "data").resolve()
    configs = {a for c in readme_commands() for a in shlex.split(c) if re.fullmatch(r"examples/.+\.toml", a)}
    roots = {path: load_config(str(REPO / path)).data.root for path in sorted(configs)}
    for path, root in roots.items():
        assert root is None or Path(root).parent == shared, f"{path}: data.root {root} is not under {shared}"
    assert any(roots.values())  # mnist_fedavg.toml reads ../shared/data/mnist-10k


def test_the_parser_reads_continuations_comments_venv_paths_and_make_targets():
    text = (
        "```bash\nmake demo   # comment\n.venv/bin/fedveil run a.toml \\\n    x=1 'y=[\"a\"]' --out o  # c\n"
        "# fedveil not-a-command\npython3 -m venv .venv\n```\n```toml\nfedveil = 1\n```\n"
    )
    assert readme_commands(text) == [
        "fedveil run examples/quickstart.toml",  # make demo's recipe
        "fedveil run a.toml x=1 'y=[\"a\"]' --out o",
    ]
