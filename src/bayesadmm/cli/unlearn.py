"""`bayesadmm unlearn RUN_DIR CLIENT --out DIR [--rounds N] [--keep-invalid]`: a scenario's run without one client,
written as a run directory that `bayesadmm resume DIR` trains on without it (`bayesadmm.unlearn(..., out=)`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bayesadmm.cli import methods
from bayesadmm.experiments.config import ConfigError
from bayesadmm.posterior.unlearning import unlearn


def add_parser(commands) -> argparse.ArgumentParser:
    """The `unlearn` subcommand's parser."""
    unlearn = commands.add_parser(
        "unlearn",
        help="remove one client's term from a run's posterior, into a run directory to resume without it",
        description="The run in RUN_DIR with client CLIENT's term removed from its server state (bayesadmm.unlearn), "
        "written to DIR as a stopped run: `bayesadmm resume DIR` trains rounds up to --rounds without the client "
        "(repair rounds). RUN_DIR is only read. A run of your own model: use the Python API "
        "(bayesadmm.unlearn(run_dir, client, model=..., out=...)).",
    )
    unlearn.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    unlearn.add_argument("client", type=int, metavar="CLIENT", help="the client's id")
    unlearn.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new run directory (not RUN_DIR)")
    unlearn.add_argument(
        "--rounds", type=int, default=None, help="the rounds of DIR's run (default: RUN_DIR's; more: repair rounds)"
    )
    unlearn.add_argument(
        "--keep-invalid",
        action="store_true",
        help="where removing the term leaves weights of a diagonal posterior without a positive precision, keep the "
        "original's value there (refused otherwise); the repair rounds then move them",
    )
    methods.add_option(unlearn)  # a run of a method of one's own: its module registers it
    unlearn.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    return unlearn


def command(args) -> int:
    try:
        written = unlearn(args.run_dir, args.client, out=args.out, rounds=args.rounds, keep_invalid=args.keep_invalid)
    except (ConfigError, ValueError) as exc:  # UnlearningError and RunDirError are ValueErrors
        if args.debug:
            raise
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    print(written.message)
    print(f"next: bayesadmm resume {written.run_dir}")
    return 0
