"""A grid of runs (methods × seeds × scenarios × any setting), run to the end however often it is stopped.

    bayesadmm sweep fmnist-heterog10 method=fedavg,feddyn,ivon-admm seed=0:3 rounds=50 --out runs/table1

Each point of the grid is one `bayesadmm run` in a child process, in a folder of its own under the sweep's folder
(named by the point's values: `method=fedavg,seed=0`), with its output in logs/. What a point's folder holds decides
what happens to it, so a sweep killed at any moment and started again loses nothing and repeats nothing finished:

    completed or diverged (a result), or stopped at its stop_at   -> skipped
    a checkpoint (interrupted, failed, stopped earlier, or
    "running" from a process that was killed)                     -> resumed from it
    nothing finished                                              -> started (again)
    a run of another configuration                                -> refused before anything starts

A child ends with the sweep however the sweep ends (`kill -9` included: each child asks the kernel for a SIGTERM
when its parent dies, and checkpoints on it), and a sweep started again waits for the runs of its folder that are
still ending before it looks at them.

The cores are shared, never oversubscribed: `jobs` runs at a time, each with `workers = cores // jobs` worker
processes (one run using every core by default). A child's exit 2 (a user error, e.g. a missing data folder) stops
the sweep from starting more runs: the others would fail the same way. At the end, `compare` makes the table of the
whole grid (table.md, curves.png in the sweep's folder).

Sweep files (JSON) hold the same thing: {"scenario": "fmnist-heterog10" or [...], "grid": {"method": ["fedavg",
"feddyn"], "seed": "0:3"}, "set": {"rounds": 50}} (`set`: one value for every point), or a list of such grids
(read, with the command line's axes, by `experiments.grids`).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bayesadmm.engine.policy import default_workers
from bayesadmm.engine.rundir import RunDirError, locked, open_append
from bayesadmm.engine.signals import Interrupted
from bayesadmm.evaluation.reports import setting_of
from bayesadmm.experiments.config import ConfigError, RunConfig, resolve
from bayesadmm.experiments.grids import Grid, grid, is_sweep_file, read_sweep_file, values

FINAL = ("completed", "diverged")
PARENT = "BAYESADMM_SWEEP_PID"  # set in a child's environment: the sweep it must not outlive


@dataclass(frozen=True)
class Point:
    """One run of the grid: its scenario, its KEY=VALUE overrides, and its folder."""

    scenario: str
    overrides: tuple[str, ...]
    run_dir: Path
    config: RunConfig = field(compare=False)  # the resolved configuration, checked when the point was made

    @property
    def name(self) -> str:
        return self.run_dir.name


@dataclass
class Outcome:
    point: Point
    state: str  # skipped (already done), completed, diverged, stopped, failed, refused
    message: str = ""


def points(grids: Sequence[Grid], out: Path) -> list[Point]:
    """Every combination of every grid, each checked as `bayesadmm run` would check it (an error names the point).
    A point's folder is named by its values of the keys that vary over the whole sweep (and its scenario, when
    there are several)."""
    combinations = [
        (scenario, dict(zip(grid.axes, chosen, strict=True)))
        for grid in grids
        for scenario in grid.scenarios
        for chosen in itertools.product(*grid.axes.values())
    ]
    keys = list(dict.fromkeys(key for _, chosen in combinations for key in chosen))
    varying = [key for key in keys if len({chosen.get(key) for _, chosen in combinations}) > 1]
    several = len({scenario for scenario, _ in combinations}) > 1
    made: dict[str, Point] = {}
    for scenario, chosen in combinations:
        name = ",".join(f"{key}={chosen[key]}" for key in varying if key in chosen) or "run"
        if several:
            name = f"{scenario},{name}" if name != "run" else scenario
        name = name.replace("/", "_")
        if name in made:
            raise ConfigError(f"the sweep has the point {name} twice; give each grid different values")
        run_dir = Path(out) / name
        overrides = tuple(f"{k}={v}" for k, v in chosen.items()) + (f"out={run_dir}",)
        try:
            config, _ = resolve(scenario, overrides)
        except (ConfigError, FileNotFoundError) as exc:
            raise ConfigError(f"{name}: {exc}") from None
        made[name] = Point(scenario, overrides, run_dir, config)
    return list(made.values())


def what_to_do(point: Point) -> str:
    """skip, resume, start or refuse (with the reason after a colon), from what the point's folder holds."""
    folder = point.run_dir
    if not (folder / "config.json").exists():
        return "start"
    saved, wanted = _identity(json.loads((folder / "config.json").read_text())), _identity(point.config.to_json())
    differs = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
    if differs:
        return f"refuse: {folder} holds a run of another configuration (differs in {', '.join(differs)})"
    status = json.loads((folder / "status.json").read_text())["status"] if (folder / "status.json").exists() else ""
    if status in FINAL:  # the same configuration (rounds included) ran to its end
        return "skip"
    if status == "stopped" and 0 < point.config.stop_at <= _round_of(folder):  # it reached the point's stop_at
        return "skip"
    return "resume" if (folder / "checkpoint.pt").exists() else "start"


def _identity(config: dict) -> dict[str, str]:
    """What makes a point's run that run: its settings as `compare` groups them (hyperparameters beside the general
    keys, so a difference names the key), and its seed."""
    return {**setting_of(config), "seed": json.dumps(config.get("seed"))}


@dataclass
class Sweep:
    """Runs `points` `jobs` at a time; `on_progress(done_rounds, total_rounds, finished, running)` is called about
    once a second (the CLI draws a progress bar with an ETA from it)."""

    points: list[Point]
    jobs: int = 1
    on_progress: Callable[[int, int, list[Outcome], list[Point]], None] | None = None
    logs: Path | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    _totals: dict[Point, int] = field(default_factory=dict)

    def run(self) -> list[Outcome]:
        """Run what is left of the grid; a SIGTERM or Ctrl-C stops every child cleanly (each checkpoints) and is
        raised as `KeyboardInterrupt` (`Interrupted` for a SIGTERM)."""

        def interrupt(signum, frame):
            raise Interrupted(signum)

        previous = signal.signal(signal.SIGTERM, interrupt)
        try:
            return self._run()
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _run(self) -> list[Outcome]:
        for point in self.points:  # the children of a sweep killed just before are still checkpointing
            _wait_until_free(point.run_dir)
        plans = {p: what_to_do(p) for p in self.points}
        self._totals = {p: p.config.stop_at or p.config.rounds for p in self.points}
        refused = [plan for plan in plans.values() if plan.startswith("refuse")]
        if refused:
            raise ConfigError(refused[0][len("refuse: ") :] + "; give the sweep another --out, or move that folder")
        todo = [p for p in self.points if plans[p] != "skip"]
        self.outcomes = [Outcome(p, "skipped") for p in self.points if plans[p] == "skip"]
        workers = max(1, default_workers() // max(1, self.jobs))
        running: dict[Point, subprocess.Popen] = {}
        stop_starting = False
        try:
            while todo or running:
                while todo and len(running) < self.jobs and not stop_starting:
                    point = todo.pop(0)
                    running[point] = self._start(point, plans[point], workers)
                for point, process in list(running.items()):
                    if process.poll() is not None:
                        del running[point]
                        outcome = _outcome(point, process.returncode)
                        self.outcomes.append(outcome)
                        stop_starting = stop_starting or outcome.state == "refused"
                if stop_starting and not running:
                    break
                if self.on_progress is not None:
                    self.on_progress(*self._rounds(), self.outcomes, list(running))
                time.sleep(0.5)
        finally:  # Ctrl-C or a SIGTERM: each child gets a SIGTERM, writes its checkpoint and ends; wait for them
            for process in running.values():
                if process.poll() is None:
                    process.terminate()
            for process in running.values():
                process.wait()
        if self.on_progress is not None:
            self.on_progress(*self._rounds(), self.outcomes, [])
        return self.outcomes

    def _start(self, point: Point, plan: str, workers: int) -> subprocess.Popen:
        command = [sys.executable, "-m", "bayesadmm"]
        if plan == "resume":
            command += ["resume", str(point.run_dir), "--quiet"]
            if point.config.stop_at:
                command += ["--stop-at", str(point.config.stop_at)]
        else:
            has_workers = any(o.startswith("workers=") for o in point.overrides)
            extra = [] if has_workers else [f"workers={workers}"]
            command += ["run", point.scenario, *point.overrides, *extra, "--quiet", "--overwrite"]
        logs = self.logs or point.run_dir.parent / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open_append(logs / f"{point.name}.log") as log:  # never through a link out of the sweep's folder
            log.write(f"$ {' '.join(command)}\n".encode())
            # a process group of its own: a Ctrl-C in the terminal reaches the sweep only, which stops each child once
            return subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, PARENT: str(os.getpid())},  # the child ends with this process (end_with_parent)
            )

    def _rounds(self) -> tuple[int, int]:
        """Rounds finished over the whole grid, and rounds in it."""
        done = sum(min(_round_of(p.run_dir), total) for p, total in self._totals.items())
        return done, sum(self._totals.values())


def end_with_parent(parent: int) -> None:
    """Have this process (a sweep's child) get a SIGTERM when `parent`, the sweep, ends, however it ends: a sweep
    killed with -9 cannot stop its children itself, and an orphan would hold its run's folder. Linux's
    PR_SET_PDEATHSIG where there is one; elsewhere a thread that looks for the parent every second."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM)) == 0:
            if os.getppid() != parent:  # the parent ended before the request: nothing would send the signal
                os.kill(os.getpid(), signal.SIGTERM)
            return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="bayesadmm-parent-watch", daemon=True).start()


def _wait_until_free(folder: Path, timeout: float = 60.0) -> None:
    """Wait until no process holds the run folder's lock (a run that got its SIGTERM writes its checkpoint first);
    a ConfigError naming the holder if it still does after `timeout` seconds."""
    if not (folder / ".lock").exists():
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            with locked(folder):
                return
        except RunDirError as exc:
            if time.monotonic() > deadline:
                raise ConfigError(f"{exc} (waited {timeout:.0f} s)") from None
            time.sleep(0.2)


def _round_of(folder: Path) -> int:
    try:
        return int(json.loads((folder / "status.json").read_text())["round"])
    except (OSError, ValueError, KeyError):
        return 0


def _outcome(point: Point, code: int) -> Outcome:
    try:
        status = json.loads((point.run_dir / "status.json").read_text())
    except (OSError, ValueError):
        status = {}
    if code == 2:
        return Outcome(point, "refused", f"a user error: see logs/{point.name}.log")
    state = {0: status.get("status", "completed"), 3: "diverged"}.get(code, "failed")
    return Outcome(point, state, status.get("message", ""))


def run_dirs(outcomes: Sequence[Outcome]) -> list[Path]:
    """The folders of the runs that give a table row: finished ones (completed or diverged, now or before)."""
    return [o.point.run_dir for o in outcomes if o.state in ("skipped", "completed", "diverged", "stopped")]


__all__ = [
    "Grid",
    "Point",
    "Outcome",
    "Sweep",
    "values",
    "grid",
    "read_sweep_file",
    "is_sweep_file",
    "points",
    "what_to_do",
    "run_dirs",
    "end_with_parent",
    "PARENT",
]
