"""`bayesadmm sweep`: a resumable grid of runs, then their comparison table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bayesadmm.cli import methods
from bayesadmm.cli.compare import add_table_rounds, table_rounds
from bayesadmm.engine.history import is_terminal, log_every
from bayesadmm.engine.signals import Interrupted
from bayesadmm.evaluation.reports import compare
from bayesadmm.experiments.config import ConfigError
from bayesadmm.experiments.grids import SHIPPED_PREFIX, shipped_sweep, with_axes
from bayesadmm.experiments.sweep import Grid, Sweep, grid, is_sweep_file, points, read_sweep_file, run_dirs


def add_parser(commands) -> argparse.ArgumentParser:
    """The `sweep` subcommand's parser."""
    sweep = commands.add_parser(
        "sweep",
        help="run a grid of runs (KEY=a,b,c or KEY=start:stop per axis), resumable, and compare them",
        description="Runs every combination of the KEY=VALUES axes (a,b,c; or an integer range start:stop[:step]) "
        "as `bayesadmm run`s in folders under --out, skipping finished ones and resuming interrupted ones, then "
        "prints the comparison table of the grid. SOURCE: a scenario, several (a,b), a config file, a sweep file "
        '({"scenario": ..., "grid": {...}, "set": {...}}), or @NAME, a sweep file shipped with bayesadmm (one per '
        "results table; @fmnist-heterog10, @diabetes-iid5-smoke, ...; a wrong name lists them).",
    )
    sweep.add_argument("source", metavar="SOURCE")
    sweep.add_argument("axes", nargs="*", metavar="KEY=VALUES")
    sweep.add_argument("--out", type=Path, required=True, help="the sweep's folder (one subfolder per run)")
    sweep.add_argument("--jobs", type=int, default=1, help="runs at a time; each gets cores/jobs workers (default 1)")
    add_table_rounds(sweep)
    sweep.add_argument("--quiet", action="store_true", help="no progress (a bar on a terminal, log lines elsewhere)")
    methods.add_option(sweep)
    return sweep


def command(args) -> int:
    try:
        if args.jobs < 1:
            raise ConfigError("--jobs must be at least 1")
        rounds = table_rounds(args.at)
        given = grid(args.axes)  # added to (or replacing) every grid's axes
        source = shipped_sweep(args.source) if args.source.startswith(SHIPPED_PREFIX) else Path(args.source)
        if is_sweep_file(source):
            grids, notes = with_axes(read_sweep_file(source), given)
            for note in notes:
                print(f"sweep: {note}")
        else:
            grids = [Grid([s for s in args.source.split(",") if s], given)]
        todo = points(grids, args.out)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    print(f"sweep: {len(todo)} runs in {args.out} ({args.jobs} at a time)", flush=True)
    bar = None if args.quiet else progress_display(len(todo), sys.stderr)

    def progress(done, total, finished, running) -> None:
        if bar is not None:
            bar.show(done, total, finished, running)

    sweep = Sweep(todo, jobs=args.jobs, on_progress=progress)
    try:
        outcomes = sweep.run()
    except ConfigError as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("\nbayesadmm: interrupted; the same command goes on where it stopped", file=sys.stderr)
        return 128 + (exc.signum if isinstance(exc, Interrupted) else 2)
    finally:
        if bar is not None:
            bar.close()
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.state] = counts.get(outcome.state, 0) + 1
        if outcome.state in ("failed", "refused", "diverged"):
            print(f"{outcome.point.name}: {outcome.state} {outcome.message}".rstrip())
    print("runs: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    finished = run_dirs(outcomes)
    if finished:
        print(compare(finished, rounds, args.out))
        print(f"wrote {args.out / 'table.md'}, {args.out / 'curves.png'} and {args.out / 'runs.jsonl'}")
    if counts.get("refused"):
        return 2
    return 1 if counts.get("failed") else 0


class SweepBar:
    """A sweep's progress on a terminal: one tqdm bar of the grid's rounds, with the runs done and running."""

    def __init__(self, runs: int, stream):
        from tqdm import tqdm

        self.runs = runs
        self.bar = tqdm(total=0, unit="round", dynamic_ncols=True, file=stream)

    def show(self, done: int, total: int, finished: list, running: list) -> None:
        self.bar.total, self.bar.n = total, done
        names = ", ".join(p.name for p in running[:2]) + (" ..." if len(running) > 2 else "")
        self.bar.set_postfix_str(f"runs {len(finished)}/{self.runs} done; now: {names or '-'}", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


class SweepLog:
    """A sweep's progress where the output is not a terminal (a file, a pipe, CI): a line per finished run, and a
    line each time the grid's rounds done pass another 1/`LOG_LINES` of its rounds (at most ~50 such lines)."""

    def __init__(self, runs: int, stream):
        self.runs, self.stream = runs, stream
        self.reported = 0  # outcomes printed so far
        self.step_shown = 0  # the last multiple of the rounds' step printed

    def show(self, done: int, total: int, finished: list, running: list) -> None:
        for count, outcome in enumerate(finished[self.reported :], self.reported + 1):
            # the reason of a failure is printed with the others' at the end, and is in the run's log
            self._line(f"sweep: {outcome.point.name} {outcome.state} (runs {count}/{self.runs} done)")
        self.reported = len(finished)
        if total and done // log_every(total) > self.step_shown and running:
            self.step_shown = done // log_every(total)
            names = ", ".join(p.name for p in running[:2]) + (" ..." if len(running) > 2 else "")
            self._line(f"sweep: round {done}/{total} of the grid; now: {names}")

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        pass


def progress_display(runs: int, stream) -> SweepBar | SweepLog:
    """A bar where `stream` is a terminal, a log of lines elsewhere (`engine.history.is_terminal`)."""
    return SweepBar(runs, stream) if is_terminal(stream) else SweepLog(runs, stream)
