"""`bayesadmm.unlearn(..., out=DIR)`: the run without the clients unlearned, as a run directory `bayesadmm resume` (a
scenario's run) or `bayesadmm.run(..., resume=True)` goes on from.

DIR holds what a run stopped after the unlearned round holds, each file written by the engine's own writers:
config.json with the removal recorded ("unlearned": the client ids; a scenario's run also `exclude_client`, so that
a resume builds the federation without the client; `bayesadmm.run`'s table of the clients' sizes without them; the
rounds as asked), checkpoint.pt of the same round (`engine.checkpoint.save_checkpoint`) with the unlearned server
state, the other clients' states and the run's identity without the clients (their sizes and per-client sha256,
the ids removed: a resume with a removed client's data is refused, `engine.identity.check_same_run`), metrics.jsonl
(the rounds so far), the files that describe the run (environment.json, partition.json, personal.jsonl) and
status.json, "stopped" at that round. The files are written in a new folder beside DIR, renamed to DIR once whole: a
crash leaves no DIR (a hidden `.DIR-*.partial` folder at most), never half of one. The original run directory is
only read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bayesadmm.engine.checkpoint import save_checkpoint
from bayesadmm.engine.federation import EXIT_OK, Result, StaleResult
from bayesadmm.engine.history import read_metrics
from bayesadmm.engine.rundir import RunDirError, _sync_directory, load_state, read_bytes, write_bytes, write_json
from bayesadmm.engine.runners import LocalClients
from bayesadmm.privacy.example_level import ExampleServer

__all__ = ["UNLEARNED", "OutError", "check_out", "write_run", "config_without", "data_without"]

# config.json's and the checkpoint's data record's key for the clients removed
UNLEARNED = "unlearned"
# files that describe the run, copied as they are
DESCRIPTIONS = ("environment.json", "partition.json")


class OutError(ValueError):
    """A run without the client cannot be written as asked; `unlearn` raises it as its `UnlearningError`."""


def check_out(out: Any, source: Path) -> Path:
    """`out` as a Path a run may be written to: not the run's own directory, and new or an empty folder; an OutError
    naming the fix otherwise, before anything is written."""
    if not isinstance(out, (str, os.PathLike)):
        raise OutError(f"out= takes a folder's path, got {type(out).__name__}")
    out, own = Path(out), Path(source).resolve()
    if out.resolve() == own or own in out.resolve().parents:
        raise OutError(f"out={out} is the run's own directory or inside it; give a new folder (the run stays as it is)")
    if os.path.lexists(out):
        if os.path.islink(out) or not out.is_dir():
            raise OutError(f"out={out} is not a folder (a file or a symbolic link); give a new folder")
        if any(out.iterdir()):
            raise OutError(f"out={out} is not empty; give a new or empty folder")
    return out


def write_run(result: Result, out: Path, rounds: int | None) -> Result:
    """Write the run directory `out` of `result` (an unlearned Result: `result.unlearned` the clients it removed,
    `result.run_dir` the run it came from) and return the Result with `run_dir=out`; `rounds`: the run's rounds from
    now on (None: the original's). An OutError before anything is written where the run cannot be resumed without
    the clients."""
    source = result.run_dir
    if isinstance(result.server, ExampleServer):
        raise OutError(
            "a run with example-level DP: its accountant counts each client's rounds in the federation that drew them, "
            "which a resume without the client would not match; unlearn without out=, or retrain without the client"
        )
    checkpoint = load_state(source / "checkpoint.pt")
    if not isinstance(checkpoint, Mapping) or checkpoint.get("round") != result.round:  # moved on since
        raise OutError(f"{source / 'checkpoint.pt'} is not of this Result's round {result.round}: bayesadmm.load it")
    identity = checkpoint.get("run")
    if not isinstance(identity, Mapping) or not {"method", "config", "data"} <= set(identity):
        raise OutError(f"{source / 'checkpoint.pt'} does not record its data (an older bayesadmm): retrain instead")
    recorded = identity["data"].get(UNLEARNED, []) if isinstance(identity["data"], Mapping) else []
    if not isinstance(recorded, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in recorded):
        raise OutError(f"{source / 'checkpoint.pt'} records its removed clients as {recorded!r:.60}, not a list of ids")
    removed = tuple(dict.fromkeys([*recorded, *result.unlearned]))  # those removed before, then this Result's
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < result.round):
        raise OutError(f"rounds= must be an int of at least the unlearned round {result.round}, got {rounds!r}")
    config = config_without(_read_config(source), removed, rounds, out)
    identity_without = {  # what a resume without the clients must match
        "method": identity["method"],
        "config": config_without(identity["config"], removed, rounds, out) if identity["config"] is not None else None,
        "data": data_without(identity["data"], removed),
    }
    try:
        states = {k: s for k, s in result.client_states().items() if k not in removed}
    except StaleResult as exc:
        raise OutError(str(exc)) from None
    last, without = _rounds(config), f"without client{'s' if len(removed) > 1 else ''} {', '.join(map(str, removed))}"
    then = (
        f"resume trains rounds {result.round + 1} to {last} {without}"
        if last > result.round
        else f"its {last} rounds are done (unlearn with rounds= for more)"
    )
    message = f"{result.message} (bayesadmm.unlearn); {then}"
    status = {"status": "stopped", "round": result.round, "message": message}
    written = dataclasses.replace(result, run_dir=out, status="stopped", exit_code=EXIT_OK, message=message)

    def write(folder: Path) -> None:
        write_json(folder / "config.json", config)
        write_bytes(folder / "metrics.jsonl", _lines(result.history))
        for name in DESCRIPTIONS:
            if os.path.lexists(source / name):
                write_bytes(folder / name, read_bytes(source / name))
        if os.path.lexists(source / "personal.jsonl"):
            write_bytes(folder / "personal.jsonl", _lines(read_metrics(source / "personal.jsonl", result.round)))
        clients = LocalClients(result.algorithm, dict.fromkeys(states), seed=0)  # only to save the states
        clients.restore({"clients": states}, folder)
        save_checkpoint(folder / "checkpoint.pt", result.round, result.server, clients, identity_without)
        write_json(folder / "status.json", status)

    _written_whole(out, write)
    return written


def config_without(config: Any, removed: tuple[int, ...], rounds: int | None, out: Path) -> dict:
    """config.json (or the checkpoint's record of it) of the run without the clients `removed` (recorded under
    "unlearned"), with `rounds` rounds (None: as it was): `bayesadmm.run`'s table of the clients' sizes without them,
    or a scenario's `exclude_client` (one client: the key holds one id) and `out`. An OutError for another kind of
    run (a Flower run's directory)."""
    if not isinstance(config, Mapping):
        raise OutError("the run's config.json is not a table; restore it")
    new = json.loads(json.dumps(config))  # a copy, of JSON's values
    if "dataset" in new and "scenario" in new:  # `bayesadmm run SCENARIO`
        excluded = [k for k in (new.get("exclude_client", -1),) if k != -1]
        if len(set([*excluded, *removed])) > 1:
            raise OutError(
                f"a scenario's run leaves out one client (exclude_client), and this one would leave out clients "
                f"{', '.join(map(str, dict.fromkeys([*excluded, *removed])))}: unlearn without out=, or run the "
                "clients you keep with bayesadmm.run"
            )
        new.update(exclude_client=removed[0], out=str(out))
        if rounds is not None:
            new["rounds"] = rounds
    elif "algorithm" in new and isinstance(new.get("clients"), Mapping) and isinstance(new.get("settings"), Mapping):
        new["clients"] = {k: n for k, n in new["clients"].items() if k not in {str(j) for j in removed}}
        if rounds is not None:
            new["settings"]["rounds"] = rounds
    else:
        raise OutError(
            "out= writes runs of bayesadmm.run and of `bayesadmm run SCENARIO`; this is another kind of run (a Flower "
            "run's): unlearn without out=, or retrain without the client"
        )
    if rounds is not None and isinstance(new.get("run"), Mapping) and isinstance(new["run"].get("settings"), Mapping):
        new["run"]["settings"]["rounds"] = rounds  # the run's record (`runspec.RunSpec`) says the same
    new[UNLEARNED] = list(removed)
    return new


def data_without(data: Any, removed: tuple[int, ...]) -> dict:
    """A checkpoint's record of the run's data (`clients.fingerprint` and what the run is scored on) without the
    clients `removed`, recorded under "unlearned": their sizes and per-client sha256 dropped; the sha256 of all the
    clients' examples, which cannot be taken apart, and of the personal test splits (the removed clients' among them)
    are left unrecorded, so a resume checks each remaining client's examples and records the rest anew."""
    if not isinstance(data, Mapping) or not isinstance(data.get("sizes"), Mapping):
        raise OutError("the checkpoint's record of its data holds no clients' sizes; retrain without the client")
    gone = {str(k) for k in removed}
    new: dict[str, Any] = {"sizes": {k: n for k, n in data["sizes"].items() if k not in gone}}
    if isinstance(data.get("client_sha256"), Mapping):
        new["client_sha256"] = {k: h for k, h in data["client_sha256"].items() if k not in gone}
    if isinstance(data.get("evaluation"), Mapping):
        new["evaluation"] = {k: v for k, v in data["evaluation"].items() if k != "personal" or v is None}
    new[UNLEARNED] = list(removed)
    return new


def _read_config(source: Path) -> dict:
    try:
        return json.loads(read_bytes(source / "config.json"))
    except (OSError, ValueError) as exc:  # RunDirError (a link, a FIFO) is a ValueError
        raise OutError(f"{source / 'config.json'} cannot be read ({exc}); restore it") from None


def _rounds(config: Mapping) -> int:
    """The number of rounds a config.json of either kind (`config_without`'s) says."""
    return int(config["rounds"] if "rounds" in config else config["settings"]["rounds"])


def _lines(history: list[dict]) -> bytes:
    """metrics.jsonl's (or personal.jsonl's) text of these rounds, as the engine writes it."""
    return "".join(json.dumps(line) + "\n" for line in history).encode()


def _written_whole(out: Path, write: Callable[[Path], None]) -> None:
    """`write(folder)` into a new folder beside `out`, renamed to `out` (absent or empty) once complete; removed
    however `write` fails, so that no half-written run is ever at `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{out.name}-", suffix=".partial", dir=out.parent))
    try:
        os.chmod(folder, 0o755)  # a run directory's usual mode (mkdtemp's is the owner's only)
        write(folder)
        os.rename(folder, out)  # replaces an empty folder; refused if one appeared at `out` meanwhile
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise RunDirError(f"could not write {out}: {exc}") from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    _sync_directory(out.parent)
