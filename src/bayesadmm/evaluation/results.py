"""Where finished runs are read from, and how many runs are kept as one file.

A source of runs is a run's folder (config.json, metrics.jsonl, status.json), a folder of run folders (a sweep's
`--out`), or a `runs.jsonl` file: one line per run holding its name, configuration, status and every round's metrics.
`compare --out DIR` writes DIR/runs.jsonl beside the table it made, so a published table keeps exactly the runs
behind it in one file, and `bayesadmm compare DIR/runs.jsonl` rebuilds the table from it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

RUNS_FILE = "runs.jsonl"


class Run(NamedTuple):
    """One run's results: where it came from (`name`), its resolved configuration, its metrics per round
    (`history`, as in metrics.jsonl), its status.json (empty when the folder has none), and the folder's other JSON
    files by name (`extra`: environment.json, the code and machine it ran on, and whatever a script added)."""

    name: str
    config: dict
    history: list[dict]
    status: dict
    extra: dict = {}


def read_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """A run folder's configuration and metrics per round."""
    run = load_run(run_dir)
    return run.config, run.history


def load_run(run_dir: Path) -> Run:
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json)")
    config = _json_object(run_dir / "config.json")
    metrics_file, status_file = run_dir / "metrics.jsonl", run_dir / "status.json"
    history = _metrics(metrics_file) if metrics_file.exists() else []
    status = _json_object(status_file) if status_file.exists() else {}
    extra = {}
    for path in sorted(run_dir.glob("*.json")):
        if path.name not in ("config.json", "status.json"):
            try:
                extra[path.name] = json.loads(path.read_text())
            except ValueError:  # a damaged side file does not make the run's results unreadable
                continue
    return Run(str(run_dir), config, history, status, extra)


def _json_object(path: Path) -> dict:
    """A JSON object file of a run; a ValueError naming the file if it is not one (damaged, or edited by hand)."""
    try:
        loaded = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); restore it, or leave this run out") from None
    if not isinstance(loaded, dict):
        kind = type(loaded).__name__
        raise ValueError(f"{path} holds a {kind}, not a JSON object; restore it, or leave this run out")
    return loaded


def _metrics(path: Path) -> list[dict]:
    """metrics.jsonl's rounds; a ValueError naming the file and line where one is not a round's JSON object (a line
    torn by a crash, or an edit)."""
    history = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if not isinstance(entry, dict) or not isinstance(entry.get("round"), int):
            raise ValueError(
                f"{path}:{number} is not a round's metrics (a torn or edited line); remove that line, or resume the "
                "run, which rewrites the file from its checkpoint"
            )
        history.append(entry)
    return history


def runs_in(source: Path) -> list[Run]:
    """The runs `source` holds: a run folder, a folder of run folders, or a runs.jsonl file."""
    source = Path(source)
    if source.is_file():
        return read_runs_file(source)
    if (source / "config.json").exists():
        return [load_run(source)]
    if source.is_dir():
        folders = sorted(p for p in source.iterdir() if (p / "config.json").exists())
        if folders:
            return [load_run(folder) for folder in folders]
        raise FileNotFoundError(f"{source} holds no runs (no config.json in it or in its subfolders)")
    raise FileNotFoundError(f"{source} does not exist (give run folders, a sweep's folder or a {RUNS_FILE} file)")


def read_runs_file(path: Path) -> list[Run]:
    runs = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            runs.append(
                Run(entry["name"], entry["config"], entry["metrics"], entry.get("status", {}), entry.get("extra", {}))
            )
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                f"{path}:{number} is not a run (a {RUNS_FILE} line holds name, config, status and metrics)"
            ) from None
    return runs


def write_runs_file(path: Path, runs: Iterable[Run]) -> None:
    """`runs` as one file, one line per run; written whole to a temporary file first, so a table's file is never
    left half-written (it may be the file the runs were just read from)."""
    path = Path(path)
    text = "".join(
        json.dumps({"name": r.name, "config": r.config, "status": r.status, "extra": r.extra, "metrics": r.history})
        + "\n"
        for r in runs
    )
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def gather(sources: Sequence[Path]) -> tuple[list[Run], list[str]]:
    """Every run of `sources`, each once (a run given twice, as a folder or inside a file, counts once), with notes
    on what was counted once."""
    runs, seen, repeated = [], set(), 0
    for source in sources:
        for run in runs_in(source):
            key = json.dumps([run.config, run.history], sort_keys=True)
            if key in seen:
                repeated += 1
                continue
            seen.add(key)
            runs.append(run)
    notes = [f"counted once: {repeated} run(s) given more than once"] if repeated else []
    return runs, notes


__all__ = ["Run", "RUNS_FILE", "read_run", "load_run", "runs_in", "read_runs_file", "write_runs_file", "gather"]
