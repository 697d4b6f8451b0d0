"""The grid of a sweep, as `bayesadmm sweep` takes it: KEY=VALUES axes on the command line ("a,b,c" or an integer
range "start:stop[:step]") and sweep files (JSON): {"scenario": "fmnist-heterog10" or [...], "grid": {"method":
["fedavg", "feddyn"], "seed": "0:3"}, "set": {"rounds": 50}} (`set`: one value for every point), or a list of such
grids. `experiments.sweep` turns the grids into points and runs them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from bayesadmm.algorithms.spec import get, names
from bayesadmm.experiments.config import GENERAL_KEYS, ConfigError


def values(text: str) -> list[str]:
    """A value list: "a,b,c", or an integer range "start:stop[:step]" (stop excluded, as in Python)."""
    if ":" in text and all(part.strip().lstrip("-").isdigit() for part in text.split(":")):
        bounds = [int(part) for part in text.split(":")]
        if len(bounds) not in (2, 3) or (len(bounds) == 3 and bounds[2] == 0):
            raise ConfigError(f"a range is start:stop or start:stop:step with step != 0, got {text!r}")
        found = [str(v) for v in range(*bounds)]
        if not found:
            raise ConfigError(f"the range {text!r} is empty")
        return found
    return [v.strip() for v in text.split(",") if v.strip()]


def grid(pairs: Sequence[str]) -> dict[str, list[str]]:
    """KEY=VALUES pairs as axes, in the order given; a key given twice is an error."""
    axes: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"sweep axes are KEY=VALUES (a,b,c or start:stop), got {pair!r}")
        if key.strip() in axes:
            raise ConfigError(f"{key.strip()} is given twice; list its values in one KEY=a,b,c")
        axes[key.strip()] = values(text)
        if not axes[key.strip()]:
            raise ConfigError(f"{key.strip()} has no values")
    return axes


class Grid(NamedTuple):
    """Scenarios and the axes over which each is run: every combination of the axes' values is a point."""

    scenarios: list[str]
    axes: dict[str, list[str]]


def read_sweep_file(path: Path) -> list[Grid]:
    """The grids of a sweep file: one {"scenario": ..., "grid": {...}, "set": {...}} object, or a list of them (a
    table whose rows need different settings per scenario, e.g. a learning rate chosen per scenario)."""
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the sweep file {path}: {exc}") from None
    specs = spec if isinstance(spec, list) else [spec]
    if not specs:
        raise ConfigError(f"{path} holds no grid; a sweep file is one grid object or a non-empty list of them")
    grids = []
    for one in specs:
        if not isinstance(one, dict) or "scenario" not in one or not set(one) <= {"scenario", "grid", "set"}:
            raise ConfigError(
                f'{path}: a sweep file is {{"scenario": ..., "grid": {{KEY: [values]}}, "set": {{KEY: value}}}}'
                " or a list of such objects"
            )
        scenarios = one["scenario"] if isinstance(one["scenario"], list) else [one["scenario"]]
        if not scenarios or not all(isinstance(s, str) and s.strip() for s in scenarios):
            raise ConfigError(f'{path}: "scenario" is a scenario or a non-empty list of them, got {one["scenario"]!r}')
        for part in ("grid", "set"):
            if not isinstance(one.get(part, {}), dict):
                raise ConfigError(f'{path}: "{part}" is an object of KEY: values, got {one[part]!r}')
        axes: dict[str, list[str]] = {}
        for key, given in one.get("grid", {}).items():
            axes[key] = _axis(path, key, given)
        for key, value in one.get("set", {}).items():
            if not _scalar(value):
                raise ConfigError(f"{path}: set.{key} is one value (a number, a string or true/false), got {value!r}")
            axes[key] = [_text(value)]
        grids.append(Grid([str(s) for s in scenarios], axes))
    return grids


def with_axes(grids: Sequence[Grid], given: dict[str, list[str]]) -> tuple[list[Grid], list[str]]:
    """A sweep file's grids with the command line's axes added to (or replacing) each grid's. Where the command line
    names the methods, a grid that sets a method's hyperparameter that one of those methods does not have was written
    for another method (e.g. FedEP's ``inference``): it is left out, and named in the notes returned."""
    methods = [m for m in given.get("method", []) if m in names()]  # an unknown one: `points` names it
    kept, notes = [], []
    for number, one in enumerate(grids, start=1):
        own = [k for k in one.axes if k not in given and k not in GENERAL_KEYS and not k.startswith("likelihood.")]
        foreign = {m: [k for k in own if k not in {f.name for f in get(m).fields()}] for m in methods}
        foreign = {m: keys for m, keys in foreign.items() if keys}
        if foreign:
            method, keys = next(iter(foreign.items()))
            notes.append(f"left out grid {number} of the sweep file: it sets {', '.join(keys)}, which {method} has not")
            continue
        kept.append(Grid(one.scenarios, {**one.axes, **given}))
    if not kept:
        raise ConfigError("every grid of the sweep file sets a hyperparameter the methods given do not have: "
                          + "; ".join(notes))  # fmt: skip
    return kept, notes


def _scalar(value) -> bool:
    return isinstance(value, (str, int, float, bool))


def _axis(path: Path, key: str, given) -> list[str]:
    """A sweep file's grid axis: "a,b,c" or "start:stop", or a list of values; refused where it has none (a grid
    with an empty axis has no points) or is not one of these (a single number belongs in "set")."""
    if isinstance(given, str):
        try:
            found = values(given)
        except ConfigError as exc:
            raise ConfigError(f"{path}: grid.{key}: {exc}") from None
    elif isinstance(given, list) and all(_scalar(v) for v in given):
        found = [_text(v) for v in given]
    else:
        raise ConfigError(
            f'{path}: grid.{key} is a list of values or "a,b,c" / "start:stop", got {given!r}'
            + (f' (one value goes in "set": {{"{key}": {given!r}}})' if _scalar(given) else "")
        )
    if not found:
        raise ConfigError(f"{path}: grid.{key} has no values; give at least one, or leave the key out")
    return found


def is_sweep_file(path: Path) -> bool:
    """Whether `path` is a sweep file rather than a run's config file (which has no "grid")."""
    if Path(path).suffix != ".json" or not Path(path).is_file():
        return False
    try:
        spec = json.loads(Path(path).read_text())
    except ValueError:
        return False
    return isinstance(spec, list) or (isinstance(spec, dict) and "grid" in spec)


def _text(value) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


# `bayesadmm sweep @NAME` names a sweep file shipped in the package (bayesadmm/sweeps/NAME.json): the "@" keeps those
# names apart from scenario names, several of which are also sweep files' names (fmnist-heterog10)
SHIPPED_PREFIX = "@"


def shipped_sweeps() -> dict[str, Path]:
    """The sweep files shipped with the package (bayesadmm/sweeps/*.json, one per results table), by name."""
    from importlib import resources

    folder = Path(str(resources.files("bayesadmm") / "sweeps"))
    return {path.stem: path for path in sorted(folder.glob("*.json"), key=lambda p: p.stem)}


def shipped_sweep(name: str) -> Path:
    """The shipped sweep file called `name` ("@fmnist-heterog10" or "fmnist-heterog10"); a ConfigError lists the
    names where there is none. The file is read as JSON data (`read_sweep_file`), never executed."""
    files = shipped_sweeps()
    path = files.get(name.removeprefix(SHIPPED_PREFIX))
    if path is None:
        raise ConfigError(f"no shipped sweep file {name!r}; the shipped ones: " + ", ".join(f"@{n}" for n in files))
    return path
