"""`--methods FILE.py`: the user's own method modules, loaded by the commands that build or read methods (run,
resume, sweep, tune, compare). A file is imported only because the user named it on the command line (or a sweep's
parent named it, through `BAYESADMM_METHODS`); docs/guides/own-algorithm.md."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def names() -> list[str]:
    """The registered methods' names."""
    from bayesadmm.algorithms import names as registered

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
    from bayesadmm.algorithms import spec

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
