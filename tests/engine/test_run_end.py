"""The end of a run is a step like the others: a SIGTERM at any point of the last round's tail (its metrics line,
checkpoint, plots, reliability diagram, posterior file, final status) ends as an interruption, a SIGKILL there
leaves a directory that a resume brings to `completed` with the numbers of an uninterrupted run, and a finished run
leaves no lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.engine.test_rundir import _run  # the same tiny federation (fedavg, 2 clients, a classifier)

from bayesadmm.engine import run as engine_run
from bayesadmm.engine import rundir, signals
from bayesadmm.engine.rundir import POSTERIOR, load_state
from bayesadmm.evaluation import diagrams, leavings

ROUNDS = 2
ROOT = Path(__file__).resolve().parents[2]


def _last(name: str, args: tuple) -> bool:
    """Whether the call of `name` with `args` is of the last round's tail."""
    if name == "append_line":
        return args[1]["round"] == ROUNDS
    if name == "save_checkpoint":
        return args[1] == ROUNDS
    if name in ("running", "final"):  # write_json of status.json: the last round's "running", then the final one
        payload = args[1]
        wanted = payload.get("status") == "running" if name == "running" else payload.get("status") != "running"
        return args[0].name == "status.json" and payload.get("round") == ROUNDS and wanted
    return True  # the plot, the reliability diagram and the posterior file are written once, at the end


# (what is called, "before" or "after" it): every step of the last round's tail, in order
POINTS = [
    ("append_line", "after"),  # the metrics line, before its checkpoint: a resume redoes the round
    ("save_checkpoint", "after"),
    ("running", "after"),
    ("try_plot_run", "after"),
    ("write_reliability", "after"),
    ("save_posterior", "before"),
    ("save_posterior", "after"),
    ("final", "before"),
    ("final", "after"),
]


def kill_at(setattr, point: tuple[str, str], signum: int) -> None:
    """Send this process `signum` at `point` of the last round's tail (`setattr`: monkeypatch's, or the builtin)."""
    name, when = point
    owner = {"try_plot_run": diagrams, "write_reliability": leavings}.get(name, engine_run)
    attribute = "write_json" if name in ("running", "final") else name
    original = getattr(owner, attribute)

    def signalled(*args, **kwargs):
        due = _last(name, args)
        if due and when == "before":
            os.kill(os.getpid(), signum)
        found = original(*args, **kwargs)
        if due and when == "after":
            os.kill(os.getpid(), signum)
        return found

    setattr(owner, attribute, signalled)


def _status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def _without_times(run_dir: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in ("seconds", "eval_seconds")} for line in lines]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """An uninterrupted run (in float64, as conftest has the tests run, which a module's fixture precedes)."""
    run_dir, old = tmp_path_factory.mktemp("whole") / "r", torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert _run(run_dir, rounds=ROUNDS).status == "completed"
    finally:
        torch.set_default_dtype(old)
    return run_dir


def _check_like(run_dir: Path, whole: Path) -> None:
    """run_dir is complete, with the files and numbers of the uninterrupted run, and no lock."""
    assert _status(run_dir) == {"status": "completed", "round": ROUNDS}
    assert _without_times(run_dir) == _without_times(whole)
    ours, theirs = load_file(run_dir / POSTERIOR), load_file(whole / POSTERIOR)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert json.loads((run_dir / "reliability.json").read_text()) == json.loads(
        (whole / "reliability.json").read_text()
    )
    assert (run_dir / "curves.png").exists() and (run_dir / "reliability.png").exists()
    assert load_state(run_dir / "checkpoint.pt")["round"] == ROUNDS
    assert not (run_dir / ".lock").exists()


@pytest.mark.parametrize("point", POINTS, ids=[f"{when}-{name}" for name, when in POINTS])
def test_a_sigterm_in_the_last_rounds_tail_is_an_interruption_that_resume_completes(
    tmp_path, monkeypatch, point, whole
):
    kill_at(monkeypatch.setattr, point, signal.SIGTERM)
    with pytest.raises(signals.Interrupted) as raised:
        _run(tmp_path / "r", rounds=ROUNDS)
    assert raised.value.signum == signal.SIGTERM  # the CLI's exit code 128 + 15
    status = _status(tmp_path / "r")
    assert status["status"] == "interrupted" and "resume" in status["message"], status
    monkeypatch.undo()
    resumed = _run(tmp_path / "r", rounds=ROUNDS, resume=True)
    assert resumed.status == "completed" and resumed.round == ROUNDS and resumed.message == ""
    _check_like(tmp_path / "r", whole)
    again = _run(tmp_path / "r", rounds=ROUNDS, resume=True)  # now complete: nothing is written again
    assert again.message.startswith("already complete")


_KILLED = """
import signal, sys, torch
torch.set_default_dtype(torch.float64)  # as conftest has the tests run
from tests.engine.test_run_end import ROUNDS, kill_at
from tests.engine.test_rundir import _run
kill_at(setattr, (sys.argv[1], sys.argv[2]), signal.SIGKILL)
_run(sys.argv[3], rounds=ROUNDS)
"""


@pytest.mark.slow
def test_a_sigkill_in_the_last_rounds_tail_leaves_a_run_that_resume_completes(tmp_path, whole):
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src"), str(ROOT / "tests")])}
    for name, when in POINTS:
        run_dir = tmp_path / f"{when}-{name}"
        found = subprocess.run(
            [sys.executable, "-c", _KILLED, name, when, str(run_dir)], cwd=ROOT, env=environment, capture_output=True
        )
        assert found.returncode == -signal.SIGKILL, found.stderr.decode()[-2000:]
        assert (run_dir / ".lock").exists()  # left by the killed process, whose lock the kernel released
        resumed = _run(run_dir, rounds=ROUNDS, resume=True)
        assert resumed.status == "completed", (name, when, resumed.message)
        _check_like(run_dir, whole)


def test_a_finished_run_leaves_no_lock_and_a_killed_runs_lock_does_not_block(tmp_path):
    assert _run(tmp_path / "r", rounds=1).status == "completed"
    assert not (tmp_path / "r" / ".lock").exists()
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / ".lock").write_text("process 1 on elsewhere since 00:00:00")  # a killed run's, unlocked
    assert _run(tmp_path / "s", rounds=1).status == "completed" and not (tmp_path / "s" / ".lock").exists()


def test_a_lock_file_removed_by_its_finishing_holder_is_not_taken(tmp_path, monkeypatch):
    """A process that opened .lock just before its holder removed it on the way out would hold a file no longer at
    the path, and a third process could then lock a new one: two writers. It locks the file at the path instead."""
    import fcntl

    real, opened = fcntl.flock, []

    def holder_ends_meanwhile(fd, operation):
        if not opened:  # this process has opened .lock; the holder ends now and removes it
            opened.append(fd)
            (tmp_path / ".lock").unlink()
        return real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", holder_ends_meanwhile)
    with rundir.locked(tmp_path):
        with pytest.raises(rundir.RunDirError, match=f"in use by process {os.getpid()}"):
            with rundir.locked(tmp_path):  # a third writer finds the lock held
                pass
    assert not (tmp_path / ".lock").exists()
