"""``fedveil`` command line: run, sweep, compare, audit, ecos, pets, deploy, report, reproduce, and list what exists.

Every user error (bad config value, missing data, a run directory that already holds a
run) ends the command with one readable line on stderr and exit status 2, before any
file is written.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from .. import __version__
from ..errors import ConfigError
from . import deploy as deploy_cli
from .items import split_items
EXIT_USER_ERROR = 2
# a run's ledger disagrees with its privacy plan, or `fedveil audit`'s lower bound exceeds the accounted epsilon
EXIT_PRIVACY_VIOLATION = 3


def build_parser() -> argparse.ArgumentParser:
    """The ``fedveil`` argument parser with every subcommand and its options."""
    parser = argparse.ArgumentParser(prog="fedveil", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"fedveil {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a federated training", description="Run a federated training.")
    run.add_argument(
        "items", nargs="*", metavar="[CONFIG.toml] [key=value ...]",
        help="a TOML config and/or overrides such as rounds=50 or data.partition.alpha=0.1",
    )
    run.add_argument("--algorithm", help="algorithm name (see `fedveil algorithms`)")
    run.add_argument("--dataset", help="data set name (see `fedveil datasets`)")
    run.add_argument("--out", help="run directory (default: runs/<dataset>-<algorithm>-<time>)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    run.add_argument("--quiet", action="store_true", help="no progress bar")

    audit = sub.add_parser(
        "audit", help="empirical privacy audit of a run config (canary membership inference)",
        description="Train trials of the run's privacy mechanism with and without a canary and compare the "
        "empirical lower bound on epsilon with the accounted epsilon (docs/audit.md). Exit status 3 when the "
        "bound exceeds it.",
    )
    audit.add_argument(
        "items", nargs="*", metavar="[CONFIG.toml] [key=value ...]", help="the run's config and overrides, as for run"
    )
    audit.add_argument("--trials", type=int, default=200, help="models trained, half with the canary (default 200)")
    audit.add_argument("--client", type=int, help="example level: the silo to audit (default 0)")
    audit.add_argument("--rounds", type=int, help="audit only the first N rounds (default: all the run's rounds)")
    audit.add_argument(
        "--executor", choices=["serial", "vectorized"],
        help="example level: how trials are trained (default: the run's executor; ray as serial)",
    )
    audit.add_argument(
        "--no-noise", action="store_true", help="self-test: draw every noise term as zero while the ledger still "
        "claims the planned noise (what a run whose noise is silently off looks like)",
    )
    audit.add_argument("--confidence", type=float, default=0.95, help="Clopper-Pearson confidence (default 0.95)")
    audit.add_argument("--seed", type=int, help="seed of the trials (default: the run's seed)")
    audit.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    audit.add_argument("--quiet", action="store_true", help="no progress bar")

    ecos = sub.add_parser(
        "ecos", help="run one ECOS job: select cloud samples for a client, label, train, score",
        description="Run one ECOS job (spec 000 part 2, PART B; docs/ecos.md): plan and print the client's "
        "epsilon, split client and cloud rows, select cloud samples from the client's noisy coverage upload, label "
        "them (truly or by the client's private kNN), train the cloud's model and score it on the client's domain. "
        "A rerun in the same --out folder reuses the stages already written.",
    )
    ecos.add_argument(
        "items", nargs="+", metavar="CONFIG.toml [key=value ...]",
        help="an ECOS config (examples/ecos_digits.toml) and overrides such as ecos.budget=400 or "
        "labels.source=private_knn",
    )
    ecos.add_argument("--out", help="job folder (default: runs/ecos-<client>-<method>-<time>)")
    ecos.add_argument("--quiet", action="store_true", help="no progress lines (the summary is still printed)")

    pets = sub.add_parser(
        "pets", help="run the PETs Prize pandemic-forecasting pipeline from a config",
        description="Run the PETs Prize pandemic-forecasting pipeline (docs/pets.md): features of each person's "
        "contact neighbourhood, DP-SGD logistic regression, centralised or federated (MR-MTL) over regional silos; "
        "writes summary.json, predictions.csv and precision_recall.png into the run directory.",
    )
    pets.add_argument(
        "items", nargs="+", metavar="CONFIG.toml [section.key=value ...]",
        help="a PETs config (examples/pets_synthetic.toml) and overrides such as train.noise_multiplier=4.5",
    )
    pets.add_argument("--out", help="run directory (default: runs/pets-<method>-<time>)")
    pets.add_argument("--quiet", action="store_true", help="no progress bars (the summary is still printed)")

    sweep = sub.add_parser(
        "sweep", help="run a grid of configs (e.g. privacy.epsilon=1,4,8 seed=0,1,2), resumable as a whole",
        description="Run one training per point of a grid over config keys, each in its own run directory under "
        "--out. A key with comma-separated values is an axis; the config file's [sweep] table adds more. A killed "
        "sweep continues with --resume --out SWEEP_DIR: finished runs are kept, an interrupted one resumes from its "
        "checkpoint. Compare the runs with `fedveil compare SWEEP_DIR`.",
    )
    sweep.add_argument(
        "items", nargs="*", metavar="[CONFIG.toml] [key=v1,v2,... | key=value ...]",
        help="a TOML config and overrides; a value list such as seed=0,1,2 is an axis",
    )
    sweep.add_argument("--zip", action="store_true", help="pair the axes' values position by position instead of a grid")
    sweep.add_argument("--out", help="sweep folder (default: sweeps/<dataset>-<algorithm>-<time>)")
    sweep.add_argument("--resume", action="store_true", help="continue the sweep in --out")
    sweep.add_argument("--ray", action="store_true", help="run the runs as Ray tasks (on ray.address when the config "
                       "sets it, else a local Ray)")
    sweep.add_argument("--quiet", action="store_true", help="no progress bars (one line per finished run)")

    compare = sub.add_parser(
        "compare", help="compare runs or sweeps: a table over seeds and overlaid plots",
        description="Group finished runs by the config keys that differ (the seed aside) and print each group's "
        "final and best metrics as mean ± std over its seeds; write compare.md, compare.json, compare_curves.png and, "
        "for DP runs, compare_epsilon.png (final score against the epsilon spent).",
    )
    compare.add_argument("paths", nargs="+", metavar="RUN_DIR|SWEEP_DIR")
    compare.add_argument("--out", help="where the table and plots go (default: the sweep folder when one is given, "
                         "else ./compare)")

    report = sub.add_parser("report", help="print a run's metrics table and (re)draw its plots")
    report.add_argument("run_dir", metavar="RUN_DIR")

    ev = sub.add_parser(
        "evaluate", help="evaluate a finished run's saved model, optionally at another width",
        description="Evaluate the global model a run saved (model.pt) on the pooled test set; with --width, the "
        "model customised at test time to that width (split_mix) without retraining. Prints accuracy, "
        "parameters and multiply-accumulates per example.",
    )
    ev.add_argument("run_dir", metavar="RUN_DIR")
    ev.add_argument("--width", action="append", help="width in (0, 1], or 'all' for every width the model offers "
                    "(repeatable; default: the width the run evaluated)")
    ev.add_argument("--lam", action="append", type=float, help="dual-BN mix lambda in [0, 1] (Eq. 4.2: 0 most "
                    "accurate, 1 most robust; repeatable; models with a dual_ norm)")
    ev.add_argument("--robust", action="store_true", help="also the robust accuracy under L-inf PGD")
    ev.add_argument("--eps", type=float, default=8 / 255, help="PGD radius (default 8/255)")
    ev.add_argument("--pgd-steps", type=int, default=7, help="PGD steps (default 7)")
    ev.add_argument("--refresh-bn", type=int, default=0, metavar="PASSES", help="re-estimate the BN running "
                    "statistics with PASSES passes over the clients' training rows first ('post average')")
    ev.add_argument("--local-bn", action="store_true", help="score each client with the BN statistics it kept "
                    "(runs with algorithm.buffers = \"local\": 'locally tracked')")
    ev.add_argument("--data-root", help="the data set's folder, when it moved since the run (sets data.root)")

    config = sub.add_parser(
        "config", help="show a component's parameters, or the complete default config",
        description="`fedveil config show NAME`: what NAME is (algorithm, partitioner, model, data set or noise "
        "schedule), where it goes in a config, and its parameters with types and defaults. `fedveil config show` "
        "alone prints the complete default config as TOML.",
    )
    config.add_argument("action", choices=["show"])
    config.add_argument("name", nargs="?", metavar="NAME")
    sub.add_parser("datasets", help="list the data sets")
    sub.add_parser("algorithms", help="list the algorithms")
    sub.add_parser("models", help="list the models")
    sub.add_parser("partitions", help="list the partitioners")

    rep = sub.add_parser("reproduce", help="reproduce a paper experiment")
    rep.add_argument("name", nargs="?", metavar="NAME")
    rep.add_argument("--list", action="store_true", help="list the registered reproductions")
    rep.add_argument("--quick", action="store_true", help="a smoke test that finishes in a few minutes (no verdicts)")
    rep.add_argument("--out", help="output folder (default: results/<NAME>; with --quick runs/reproduce-quick/<NAME>)")
    rep.add_argument(
        "--data-root", help="folder holding the data sets (default: $FEDVEIL_DATA or ~/.cache/fedveil)"
    )

    bench = sub.add_parser(
        "bench", help="run the benchmark suite", description="Time fedveil's executors against a plain "
        "PyTorch loop, the centralised limit, Flower and Opacus (when installed) on the same workloads."
    )
    bench.add_argument("--quick", action="store_true", help="a subset that finishes in about a minute")
    bench.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    bench.add_argument("--systems", help="comma-separated subset of systems")
    bench.add_argument("--workloads", help="comma-separated subset of workloads (mlp, lenet, resnet, fade, splitmix, adds)")
    deploy_cli.add_parser(sub)
    bench.add_argument(
        "--device", default="auto", help="where every system computes: auto (CUDA when available), cpu, cuda, cuda:N"
    )
    return parser


def user_errors() -> tuple[type[Exception], ...]:
    """The exceptions a command reports as one line with exit status 2 (imported only once a
    command runs, so that --help and --version stay fast)."""
    from ..data.errors import DataError
    from ..registry import UnknownNameError
    from ..runtime.run_dir import RunDirError

    return ConfigError, DataError, RunDirError, UnknownNameError


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, with config items allowed after options too (``fedveil run CFG
    --out R rounds=5``: argparse alone takes a list positional only once)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "items") and not any(e.startswith("-") for e in extra):
        args.items = [*args.items, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command of ``argv``; exit status 0, 2 for a user
    error, 3 for a privacy violation, 130 when interrupted."""
    args = parse_args(argv)
    from ..privacy.ledger_check import PrivacyCheckError

    reported = user_errors()
    try:
        return COMMANDS[args.command](args)
    except reported as err:
        print(f"fedveil: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except PrivacyCheckError as err:
        print(f"fedveil: {err}", file=sys.stderr)
        return EXIT_PRIVACY_VIOLATION
    except KeyboardInterrupt:
        hint = "; resume with --resume (the last checkpoint is kept)" if args.command == "run" else ""
        print(f"fedveil: interrupted{hint}", file=sys.stderr)
        return 130


# ----------------------------------------------------------------------------- run


def resolve_run_config(args: argparse.Namespace):
    """Config file (or the saved config of a resumed run) + flags + overrides, validated."""
    from ..config import load_config
    from ..runtime.run_dir import CONFIG_FILE

    path, overrides = split_items(args.items)
    if args.algorithm:
        overrides.insert(0, f'algorithm.name="{args.algorithm}"')
    if args.dataset:
        overrides.insert(0, f'data.name="{args.dataset}"')
    if args.resume:
        if not args.out:
            raise ConfigError("--resume needs --out RUN_DIR")
        saved = Path(args.out) / CONFIG_FILE
        if path is None and saved.exists():
            return _load_saved(saved, overrides)
    return load_config(path, overrides)


def _load_saved(saved: Path, overrides: list[str]):
    import json

    from ..config import apply_overrides, validate

    return validate(apply_overrides(json.loads(saved.read_text()), overrides))


def check_out(out: Path, resume: bool) -> None:
    """Refuse, before any work, an --out that is a file, or a --resume with no run to resume."""
    from ..runtime.run_dir import CONFIG_FILE, RunDirError

    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out '{out}' is a file; give a folder for the run")
    if resume and not (out / CONFIG_FILE).is_file():
        raise RunDirError(f"--resume: '{out}' holds no run to resume (no {CONFIG_FILE}); drop --resume to start one there")


def default_out(config) -> Path:
    """The default run directory ``runs/<dataset>-<algorithm>-<time>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.data.name}-{config.algorithm.name}-{stamp}"


def cmd_run(args: argparse.Namespace) -> int:
    """``fedveil run``: resolve the config, train (or resume) in the run directory, print the summary."""
    from ..runtime import ProgressBar, Simulation

    config = resolve_run_config(args)
    out = Path(args.out) if args.out else default_out(config)
    check_out(out, args.resume)
    bars = [] if args.quiet else [ProgressBar(f"{config.algorithm.name}/{config.data.name}")]
    sim = Simulation.from_config(config, bars)
    try:
        summary = sim.run(out, resume=args.resume)
    finally:  # end the bar's line also when interrupted, so a message starts on its own line
        for bar in bars:
            bar.close()
    print_summary(summary, out)
    return 0


def print_summary(summary: dict, out: Path) -> None:
    """Prints a finished run's headline scores, epsilon, method signals and where its files are."""
    score = summary["score"]
    print(
        f"\n{summary['algorithm']} on {summary['dataset']} ({summary['model']}, {summary['num_clients']} clients, "
        f"{summary['rounds_completed']} rounds, {summary['wall_time_s']:.1f} s)"
    )
    shown = [
        (f"global_test_{score}", f"global model, pooled test {score}"),
        (f"global_client_{score}_mean", f"global model, mean client {score}"),
        (f"global_client_{score}_worst10", f"global model, worst-10% client {score}"),
        (f"personal_{score}_mean", f"personal models, mean client {score}"),
        (f"personal_{score}_worst10", f"personal models, worst-10% client {score}"),
        ("epsilon", spent_label(summary)),
        ("person_epsilon", f"per person of <= {summary.get('records_per_person')} records"),
    ]
    for key, label in shown:
        if key in summary:
            print(f"  {label:<40} {summary[key]:.4f}")
    print_signals(summary, out)
    if summary.get("withheld_unnoised"):
        print(f"  withheld (un-noised, not covered by epsilon): {', '.join(summary['withheld_unnoised'])}"
              " (privacy.keep_unnoised = true keeps them)")
    if summary.get("best"):
        best = summary["best"]
        print(f"  best round by {best['selected_by']}: {best['round']}")
    print(f"  run directory: {out}  (summary.json, metrics.jsonl, learning_curves.png)")


def spent_label(summary: dict) -> str:
    """What the summary's epsilon is the epsilon of: the training's, or (without DP training) the
    setup's release (FedFed's shared features)."""
    if summary.get("privacy_level") == "none" and summary.get("setup_releases"):
        return f"epsilon of the {', '.join(summary['setup_releases'])} release"
    return "privacy spent (epsilon)"


def print_signals(summary: dict, out: Path) -> None:
    """The method's own metrics at the last round that has each (:mod:`fedveil.runtime.signals`):
    the configured evaluation metrics on the global model, then the algorithm's signals."""
    from ..runtime.run_dir import METRICS_FILE, read_metrics
    from ..runtime.signals import algorithm_labels, eval_signals, method_signals, signal_label

    rows = read_metrics(out / METRICS_FILE) if (out / METRICS_FILE).exists() else []
    labels = algorithm_labels(summary.get("algorithm"))
    shown = [(k, f"global model: {k.removeprefix('global_test_')}") for k in eval_signals(summary, summary["score"])]
    shown += [(k, signal_label(k, labels)) for k in method_signals(rows)]
    if not shown:
        return
    print("  method signals (last value):")
    for key, label in shown[:SIGNALS_SHOWN]:
        last = next(r for r in reversed(rows) if key in r) if key not in summary else summary
        where = f"  (round {last['round']})" if last is not summary and "round" in last else ""
        print(f"    {label:<46} {last[key]:.4g}{where}")
    if len(shown) > SIGNALS_SHOWN:
        print(f"    ... and {len(shown) - SIGNALS_SHOWN} more in metrics.jsonl and learning_curves.png")


SIGNALS_SHOWN = 12


# --------------------------------------------------------------------------- audit


def cmd_audit(args: argparse.Namespace) -> int:
    """``fedveil audit``: the empirical privacy audit of a config; status 3 when its lower bound exceeds epsilon."""
    import json

    from ..config import load_config
    from ..runtime.audit_run import audit_run

    config = load_config(*split_items(args.items))
    audit = audit_run(
        config, trials=args.trials, client=args.client, rounds=args.rounds, executor=args.executor,
        noise=not args.no_noise, confidence=args.confidence, seed=args.seed, progress=not args.quiet,
    )
    print(audit.table())
    if args.json:
        Path(args.json).write_text(json.dumps(audit.to_dict(), indent=2) + "\n")
    return EXIT_PRIVACY_VIOLATION if audit.violated else 0


# ---------------------------------------------------------------------------- ecos


def cmd_ecos(args: argparse.Namespace) -> int:
    """``fedveil ecos``: run one ECOS job from its config; a value the job refuses is a one-line user error."""
    from ..runtime.ecos_config import load_ecos_config
    from ..runtime.ecos_job import format_summary, run_job

    path, overrides = split_items(args.items)
    if path is None:
        raise ConfigError("fedveil ecos needs a config file, e.g. examples/ecos_digits.toml")
    try:
        config = load_ecos_config(path, overrides)
        client = config.data.client_domain
        if isinstance(client, int):
            from ..data.loaders.digit_domains import DOMAINS

            known = list(DOMAINS) if config.data.name == "digit_domains_synthetic" else []
            client = known[client] if client < len(known) else f"domain{client}"
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = Path(args.out) if args.out else Path("runs") / f"ecos-{client}-{config.ecos.method}-{stamp}"
        summary = run_job(config, out, progress=not args.quiet)
    except user_errors():
        raise
    except ValueError as err:  # a bad value the ecos modules refused: one line, like a config error
        raise ConfigError(" ".join(str(err).split())) from None
    if args.quiet:
        print(format_summary(summary, out).lstrip("\n"))
    return 0


# ---------------------------------------------------------------------------- pets


def cmd_pets(args: argparse.Namespace) -> int:
    """``fedveil pets``: run the PETs pandemic-forecasting pipeline and print its AP, recall and F1."""
    from ..runtime.pets_job import load_pets_config, run_pets

    path, overrides = split_items(args.items)
    if path is None:
        raise ConfigError("fedveil pets needs a config file, e.g. examples/pets_synthetic.toml")
    config = load_pets_config(path, overrides)
    out = Path(args.out) if args.out else Path("runs") / f"pets-{config.pipeline.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        summary = run_pets(config, out, progress=not args.quiet)
    except user_errors():
        raise
    except ValueError as err:  # a value the pipeline refused (a table without a column...): one line
        raise ConfigError(" ".join(str(err).split())) from None
    print(f"\nPETs pandemic forecasting: {summary['method']} on {summary['data']} "
          f"({len(summary['silos'])} silo(s), {summary['wall_time_s']:.1f} s)")
    print(f"  average precision  {summary['ap']:.4f}   (random guess {summary['random_ap']:.4f})")
    print(f"  recall / F1 at 0.5 {summary['recall']:.4f} / {summary['f1']:.4f}")
    if "thm244_note" in summary:
        worst = max(s["thm244_node_epsilon"]["thesis"] for s in summary["silos"])
        print(f"  Thm 2.4.4 node epsilon {worst:.4g} ({summary['thm244_note']})")
    print(f"  run directory: {out}  (summary.json, predictions.csv, precision_recall.png)")
    return 0


# -------------------------------------------------------------------------- others


def cmd_sweep(args: argparse.Namespace) -> int:
    """``fedveil sweep``: run (or resume) every config of a sweep plan in the sweep directory."""
    from ..runtime.sweep import run_sweep
    from ..runtime.sweep_plan import plan_sweep

    path, overrides = split_items(args.items)
    if args.resume and not args.out:
        raise ConfigError("--resume needs --out SWEEP_DIR")
    resumed_alone = args.resume and path is None and not overrides
    plan = None if resumed_alone else plan_sweep(path, overrides, "zip" if args.zip else None)
    if args.out:
        out = Path(args.out)
    else:
        first = plan.configs()[0]
        out = Path("sweeps") / f"{first.data.name}-{first.algorithm.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    summaries = run_sweep(plan, out, resume=args.resume, progress=not args.quiet, use_ray=args.ray)
    print(f"\n{len(summaries)} runs in {out}; compare them with: fedveil compare {out}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """``fedveil compare``: table of the given runs or sweeps, written with its plots to ``--out``."""
    from ..runtime.compare import compare_runs, format_table, to_json
    from ..runtime.compare_plots import write_plots
    from ..runtime.run_dir import write_json
    from ..runtime.sweep import SWEEP_FILE

    comparison = compare_runs(args.paths)
    one_sweep = len(args.paths) == 1 and (Path(args.paths[0]) / SWEEP_FILE).is_file()
    out = Path(args.out) if args.out else Path(args.paths[0]) if one_sweep else Path("compare")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out '{out}' is a file; give a folder")
    print(format_table(comparison))
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(format_table(comparison, markdown=True) + "\n")
    write_json(out / "compare.json", to_json(comparison))
    print()
    for written in [out / "compare.md", out / "compare.json", *write_plots(comparison, out)]:
        print(written)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """``fedveil report``: a run's metrics table printed and its report files (re)written."""
    from ..runtime.metrics_table import run_table
    from ..runtime.report import write_report

    written = write_report(args.run_dir)
    print(run_table(args.run_dir))
    print()
    for path in written:
        print(path)
    return 0


def _print_entries(registry) -> int:
    width = max(len(n) for n in registry.names())
    for entry in registry.entries():
        print(f"{entry.name:<{width}}  {entry.description}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``fedveil evaluate``: a finished run's saved model re-scored at the given widths, lambdas and attack."""
    from ..runtime.saved_model import evaluate_saved
    from ..training.adversarial import PGD

    widths = "all" if args.width and "all" in args.width else [_width(w) for w in args.width] if args.width else [None]
    for lam in args.lam or ():
        if not 0 <= lam <= 1:
            raise ConfigError(f"--lam: {lam:g} is not in [0, 1]")
    if args.robust and not (args.eps > 0 and args.pgd_steps >= 1):
        raise ConfigError("--robust needs --eps > 0 and --pgd-steps >= 1")
    attack = PGD(args.eps, args.pgd_steps) if args.robust else None
    if args.refresh_bn < 0:
        raise ConfigError(f"--refresh-bn: {args.refresh_bn} passes is negative")
    if args.refresh_bn and args.local_bn:
        raise ConfigError("--refresh-bn and --local-bn are two different BN options: choose one")
    rows = evaluate_saved(args.run_dir, widths, args.data_root, lams=args.lam or [None], attack=attack,
                          refresh_bn=args.refresh_bn, local_bn=args.local_bn)
    robust = f" {'robust':>9}" if attack else ""
    print(f"{'width':>8} {'lambda':>6} {'accuracy':>9}{robust} {'loss':>8} {'params':>12} {'MACs':>14}")
    for r in rows:
        shown = "as run" if r["width"] is None else f"x{r['width']:g}"
        lam = "-" if r["lam"] is None else f"{r['lam']:g}"
        ra = f" {r['robust_accuracy']:>9.4f}" if attack else ""
        print(f"{shown:>8} {lam:>6} {r.get('accuracy', float('nan')):>9.4f}{ra} {r.get('loss', float('nan')):>8.4f} "
              f"{r['params']:>12,} {r['macs']:>14,}")
    summary_file = Path(args.run_dir) / "summary.json"
    if summary_file.is_file():  # what the run itself measured, beside the re-scoring
        import json

        print_signals(json.loads(summary_file.read_text()), Path(args.run_dir))
    return 0


def _width(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--width: '{text}' is not a number in (0, 1] or 'all'") from None
    if not 0 < value <= 1:
        raise ConfigError(f"--width: {value:g} is not in (0, 1]")
    return value


def cmd_config(args: argparse.Namespace) -> int:
    """``fedveil config show [NAME]``: a component's parameters, a default job, or the whole default config."""
    from .catalog import default_config_toml, show

    print(show(args.name) if args.name else default_config_toml(), end="\n" if args.name else "")
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:
    """``fedveil datasets``: lists the registered data sets."""
    from ..data import DATASETS

    return _print_entries(DATASETS)


def cmd_algorithms(args: argparse.Namespace) -> int:
    """``fedveil algorithms``: lists the registered algorithms."""
    from ..algorithms import ALGORITHMS

    return _print_entries(ALGORITHMS)


def cmd_models(args: argparse.Namespace) -> int:
    """``fedveil models``: lists the registered models."""
    from ..models import MODELS

    return _print_entries(MODELS)


def cmd_partitions(args: argparse.Namespace) -> int:
    """``fedveil partitions``: lists the registered partitioners."""
    from ..data import PARTITIONERS

    return _print_entries(PARTITIONERS)


def cmd_reproduce(args: argparse.Namespace) -> int:
    """``fedveil reproduce NAME``: runs a paper reproduction and writes its results (without a name: lists them)."""
    from ..data.source import DATA_ENV_VAR
    from ..reproduce import ReproductionContext, load_reproductions, output_folder, write_results

    reproductions = load_reproductions()
    if args.list or not args.name:
        return _print_entries(reproductions)
    reproduction = reproductions.get(args.name)
    try:
        out = output_folder(args.name, args.out, args.quick)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if args.data_root:
        root = Path(args.data_root)
    elif os.environ.get(DATA_ENV_VAR):
        root = Path(os.environ[DATA_ENV_VAR])
    else:
        root = Path.home() / ".cache" / "fedveil"
    report = reproduction(ReproductionContext(out_dir=out, quick=args.quick, data_root=root))
    md, js = write_results(report, out, args.quick)
    print(md.read_text())
    print(f"wrote {md} and {js}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``fedveil bench``: runs the benchmark suite over the chosen systems and workloads."""
    from ..bench import run_suite

    def names(text: str | None) -> list[str] | None:
        return None if not text else [t.strip() for t in text.split(",") if t.strip()]

    run_suite(args.quick, args.json, names(args.systems), names(args.workloads), device=args.device)
    return 0


COMMANDS = {
    "run": cmd_run,
    "audit": cmd_audit,
    "ecos": cmd_ecos,
    "pets": cmd_pets,
    "sweep": cmd_sweep,
    "compare": cmd_compare,
    "report": cmd_report,
    "evaluate": cmd_evaluate,
    "config": cmd_config,
    "datasets": cmd_datasets,
    "algorithms": cmd_algorithms,
    "models": cmd_models,
    "partitions": cmd_partitions,
    "reproduce": cmd_reproduce,
    "bench": cmd_bench,
    "deploy": deploy_cli.cmd_deploy,
}
