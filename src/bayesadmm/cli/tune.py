"""`bayesadmm tune`: a method's hyperparameters chosen on a validation split with Optuna."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bayesadmm.cli import methods
from bayesadmm.experiments.config import ConfigError, resolve
from bayesadmm.experiments.tune import Tuning, report, space_for


def add_parser(commands) -> argparse.ArgumentParser:
    """The `tune` subcommand's parser."""
    tune = commands.add_parser(
        "tune",
        help="choose a method's hyperparameters on a validation split with Optuna (resumable), and report",
        description="Trials of `bayesadmm run` with validation=0.1 (unless set), scored by the validation metric at "
        "the last round, hopeless ones pruned. Each method's search space is centred on the scenario's preset (or "
        "on NAME=VALUE given here), and the first trial runs the preset's own values where the space holds them. "
        "The study is kept in OUT/study.db, so the same command goes on after a kill. Ends with OUT/report.md: the "
        "chosen values, every trial, and the command that runs the chosen setting on the test set with several seeds.",
    )
    tune.add_argument("scenario", help="a preset or a config file")
    tune.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="settings of every trial (method= at least)")
    tune.add_argument("--out", type=Path, required=True, help="the tune's folder (study.db, trial-NNNN/, report.md)")
    methods.add_option(tune)
    tune.add_argument("--trials", type=int, default=20, help="finished trials to run in all (default 20)")
    tune.add_argument("--round-budget", type=int, default=0, help="or stop once the trials ran this many rounds")
    tune.add_argument(
        "--metric",
        default="",
        help="val_acc (maximised; the default for classification), val_rmse (the default for Gaussian regression), "
        "val_nll, ... (minimised), val_coverage90 (tuned towards 0.90: |coverage - 0.90| minimised)",
    )
    tune.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="add or replace a searched hyperparameter: NAME=around:LOW:HIGH (log-uniform from LOW to HIGH times the "
        "run's NAME: the preset's, or NAME=VALUE given here), NAME=log:LOW:HIGH, NAME=range:LOW:HIGH or NAME=a,b,c",
    )
    return tune


def command(args) -> int:
    try:
        if args.trials < 1 or args.round_budget < 0:
            raise ConfigError("--trials must be at least 1 and --round-budget at least 0")
        config, _ = resolve(args.scenario, args.overrides)
        space = space_for(config.method, args.space)
        tuning = Tuning(
            args.scenario, tuple(args.overrides), space, args.out, args.trials, args.round_budget, args.metric
        )
    except (ConfigError, ImportError, ValueError, FileNotFoundError) as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2

    def finished(trial) -> None:
        value = "" if trial.value is None else f" {tuning.metric}={trial.value:.4f}"
        print(f"trial {trial.number}: {trial.state.name.lower()}{value} {trial.params}", flush=True)

    tuning.on_trial = finished
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # this command prints one line per trial itself
    searched = ", ".join(f"{p.name}={p.summary()}" for p in tuning.space.values())
    print(f"tuning {config.method} on {args.scenario}: {searched}")
    try:
        study = tuning.run()
    except KeyboardInterrupt:
        print("bayesadmm: interrupted; the same command goes on where it stopped", file=sys.stderr)
        return 130
    print(report(tuning, study))
    print(f"wrote {args.out / 'report.md'} and {args.out / 'curves.png'}")
    return 0
