"""`bayesadmm precompile`: the fused kernels of a scenario's runs compiled into torch's on-disk cache."""

from __future__ import annotations

import argparse
import sys

from bayesadmm.experiments.config import ConfigError, presets
from bayesadmm.experiments.precompile import precompile
from bayesadmm.experiments.values import unknown


def add_parser(commands) -> argparse.ArgumentParser:
    """The `precompile` subcommand's parser."""
    precompile = commands.add_parser(
        "precompile",
        help="compile the fused kernels of a scenario's runs into torch's on-disk cache (make setup does this)",
        description="Runs each of the scenario's methods whose runs compile their kernels (IVON's solver, where "
        "compile=auto compiles for the scenario; the others are skipped) for two short rounds with compile=on (one "
        "client at a time and in cohorts) and the drop-in optimizer, so that later runs find their compiled kernels "
        "in the cache instead of compiling them in their first round.",
    )
    precompile.add_argument(
        "scenario", nargs="?", default="fmnist-heterog10", help="a preset (default fmnist-heterog10)"
    )
    precompile.add_argument(
        "--methods", default=None, help="comma-separated methods (default: the preset's; those that compile run)"
    )
    precompile.add_argument(
        "--cohorts", default="0,4", help="comma-separated cohort settings to run each method with (default 0,4)"
    )
    precompile.add_argument(
        "--data-fraction", type=float, default=0.01, help="the part of the training set the short runs use"
    )
    precompile.add_argument("--force", action="store_true", help="run even if this cache holds the kernels already")
    precompile.add_argument("--data-dir", default=None, help="folder with the dataset's files")
    return precompile


def command(args) -> int:
    if args.scenario not in presets():
        refusal = unknown("unknown scenario", [args.scenario], sorted(presets()), listed="choose one of", quote=True)
        print(f"bayesadmm: {refusal}", file=sys.stderr)
        return 2
    try:
        cohorts = [int(value) for value in args.cohorts.split(",")]
        if min(cohorts) < 0:
            raise ValueError
    except ValueError:
        print(f"bayesadmm: --cohorts takes integers >= 0 separated by commas, got {args.cohorts!r}", file=sys.stderr)
        return 2
    methods = args.methods.split(",") if args.methods else None
    try:
        precompile(
            args.scenario,
            methods=methods,
            cohorts=cohorts,
            data_fraction=args.data_fraction,
            data_dir=args.data_dir,
            force=args.force,
        )
    except (ConfigError, FileNotFoundError) as exc:  # the data loaders' errors say how to get the data
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    return 0
