"""`bayesadmm methods [list | show NAME]`: the registered methods, and one method's hyperparameters, presets and search
space (`bayesadmm.experiments.methods.describe`: its spec, and its presets from the scenario files). `--methods
FILE.py`: the user's own method modules, loaded by the commands that build or read methods (methods, run, resume,
sweep, tune, compare). A file is imported only because the user named it on the command line (or a sweep's parent
named it, through `BAYESADMM_METHODS`); docs/guides/own-algorithm.md."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bayesadmm.algorithms import names as registered
from bayesadmm.algorithms import spec
from bayesadmm.experiments.methods import describe


def names() -> list[str]:
    """The registered methods' names."""
    return registered()


def add_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--methods",
        dest="method_modules",
        action="append",
        default=[],
        metavar="FILE.py",
        help="a Python file of your own methods (it calls bayesadmm.algorithms.register); repeatable "
        "(docs/guides/own-algorithm.md)",
    )


def load(files: list[str]) -> int:
    """Import the method modules named by --methods and by the environment (a sweep's runs get their parent's), and
    name them in the environment for the processes this command starts; 2 after a one-line error if one fails."""
    paths = [p for p in os.environ.get(spec.ENVIRONMENT, "").split(os.pathsep) if p]
    paths += [str(Path(file).expanduser().resolve()) for file in files]
    for path in paths:
        try:
            spec.load(path)
        except Exception as exc:  # noqa: BLE001 — the user's module: any error it raises is reported, not a traceback
            print(f"bayesadmm: --methods {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
    if paths:
        os.environ[spec.ENVIRONMENT] = os.pathsep.join(dict.fromkeys(paths))
    return 0


def add_parser(commands) -> argparse.ArgumentParser:
    """The `methods` subcommand's parser."""
    parser = commands.add_parser(
        "methods",
        help="list the methods, or show one's hyperparameters, presets and search space",
        description="`bayesadmm methods` (or `methods list`): every registered method with its summary. "
        "`bayesadmm methods show NAME`: its hyperparameters (type, default or required), its presets per scenario, "
        "`bayesadmm tune`'s search space, and whether it has client-level differential privacy.",
    )
    parser.add_argument("action", nargs="?", default="list", choices=["list", "show"])
    parser.add_argument("name", nargs="?", default=None, help="the method to show")
    add_option(parser)
    return parser


def command(args) -> int:
    if load(args.method_modules):
        return 2
    if args.action == "list":
        if args.name is not None:
            print(f"bayesadmm: methods list takes no name; to see one method: bayesadmm methods show {args.name}",
                  file=sys.stderr)  # fmt: skip
            return 2
        width = max(len(name) for name in spec.names())
        for one in spec.specs():
            print(f"{one.name:<{width}}  {one.summary}")
        return 0
    if args.name is None:
        print("bayesadmm: methods show needs a method's name (bayesadmm methods lists them)", file=sys.stderr)
        return 2

    try:
        print(describe(args.name))
    except ValueError as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    return 0
