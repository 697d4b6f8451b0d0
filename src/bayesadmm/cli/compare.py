"""`bayesadmm compare`: the Table-1-style comparison of finished runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bayesadmm.cli import methods
from bayesadmm.evaluation.personal_reports import personal_report
from bayesadmm.evaluation.reports import compare


def add_parser(commands) -> argparse.ArgumentParser:
    """The `compare` subcommand's parser."""
    compare = commands.add_parser(
        "compare",
        help="Table-1-style comparison of finished runs (accuracy, NLL and ECE at the given rounds, the OOD "
        "AUROCs and selective accuracies where the runs measured them, and seconds per round)",
    )
    compare.add_argument(
        "sources", nargs="+", type=Path, metavar="RUNS", help="run folders, sweep folders or runs.jsonl files"
    )
    add_table_rounds(compare)
    methods.add_option(compare)
    compare.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write table.md, table.tex, curves.png and the runs behind them (runs.jsonl) here",
    )
    compare.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="KEY=VALUES",
        help="compare only the runs whose KEY is one of VALUES (a,b,c), e.g. --only method=fedavg,feddyn",
    )
    compare.add_argument(
        "--paper",
        default=None,
        metavar="SCENARIO",
        help="also set accuracy and NLL beside the papers' published numbers for this scenario "
        "(written to paper.md with --out)",
    )
    return compare


def add_table_rounds(parser: argparse.ArgumentParser) -> None:
    """The table's rounds, `--at` (`--rounds`, its former name, is still accepted): named apart from a run's
    `rounds=`, the rounds it trains, which it is not."""
    parser.add_argument(
        "--at",
        "--rounds",
        dest="at",
        default="10,25,50",
        metavar="R,R,...",
        help="the rounds the table shows, comma-separated (default 10,25,50); each cell at R is the mean of rounds "
        "R-2..R. Not the rounds the runs train (rounds=N); --rounds is an older name of this option",
    )


def table_rounds(text: str) -> list[int]:
    """--at of a table: round numbers >= 1, comma-separated."""
    try:
        rounds = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        rounds = []
    if not rounds or min(rounds) < 1:
        raise ValueError(
            f"--at (the table's rounds) takes round numbers >= 1 separated by commas (e.g. 10,25,50), got {text!r}"
        )
    return rounds


def command(args) -> int:
    try:
        rounds = table_rounds(args.at)
        only = {}
        for pair in args.only:
            key, sep, values = pair.partition("=")
            if not sep or not key or not values:
                raise ValueError(f"--only takes KEY=a,b,c, got {pair!r}")
            only[key.strip()] = [v.strip() for v in values.split(",") if v.strip()]
        if args.out is not None:  # before any run is read: a folder that cannot be made is a one-line error
            try:
                args.out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                reason = exc.strerror or exc
                raise ValueError(f"--out {args.out} cannot be created ({reason}); choose another folder") from None
        print(compare(args.sources, rounds, args.out, paper=args.paper, only=only))
        personal = personal_report(args.sources, args.out, only)  # runs with a personal split: global vs personal
        if personal is not None:
            print(f"\npersonalised (each client's own test split):\n\n{personal}")
    except (ValueError, OSError) as exc:  # OSError: a source that cannot be read, or a file of --out not written
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    if args.out:
        names = ["table.md", "table.tex", "curves.png", "runs.jsonl"]
        names += [name for name in ("personal.md", "personal.png") if (args.out / name).exists()]
        written = ", ".join(str(args.out / name) for name in names)
        print(f"wrote {written}")
    return 0
