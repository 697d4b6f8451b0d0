"""`flwr run` as a Flower user types it, on Flower's default local simulation federation (2 SuperNodes): the app
laid out as `flwr new` lays one out (examples/flower-app, its own ServerApp and ClientApp with a bayesadmm strategy)
and the presets' app, each with its default run config, in a fresh FLWR_HOME. `flwr run` starts a local SuperLink
that outlives it; the test stops it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

ROOT = Path(__file__).resolve().parents[2]
FLWR = Path(sys.executable).parent / "flwr"


def _flwr_run(app: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    home = cwd / "flwr-home"
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{FLWR.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    try:
        return subprocess.run([str(FLWR), "run", str(app), "--stream", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=400)
    finally:
        _stop_local_superlink(home)


def _stop_local_superlink(home: Path) -> None:
    """Stop the SuperLink (and its SuperExec) that `flwr run` left running for this FLWR_HOME."""
    found = [int(pid) for pid in subprocess.run(["pgrep", "-f", str(home)], capture_output=True, text=True).stdout.split()]
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in found) and time.monotonic() < deadline:
        time.sleep(0.2)  # the next `flwr run` must not find this SuperLink on the local port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _status(run_dir: Path) -> str:
    return json.loads((run_dir / "status.json").read_text())["status"]


def test_flwr_run_of_the_template_app_works_out_of_the_box(tmp_path):
    app = tmp_path / "app"
    shutil.copytree(ROOT / "examples" / "flower-app", app)
    done = _flwr_run(app, tmp_path, "--run-config", "num-server-rounds=2 ivon-admm.lr=0.04")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "flower-app"
    assert _status(run_dir) == "completed", (run_dir / "flower.log").read_text()
    assert json.loads((run_dir / "config.json").read_text())["flower-strategy"]["hparams"]["lr"] == 0.04
    evaluated = [json.loads(line) for line in (run_dir / "client-evaluation.jsonl").read_text().splitlines()]
    assert [e["round"] for e in evaluated] == [1, 2] and evaluated[-1]["clients"] == 2
    assert (run_dir / "posterior.safetensors").exists() and (run_dir / "final_model.pt").exists()


def test_flwr_run_of_the_preset_app_works_out_of_the_box(tmp_path):
    done = _flwr_run(ROOT / "flower_app", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and _status(runs[0]) == "completed", (runs[0] / "flower.log").read_text()


def test_flwr_run_of_the_own_model_example_works_out_of_the_box(tmp_path):
    """examples/flower on the simulation: its nodes have no file, so the app's loader draws theirs by partition-id."""
    app = tmp_path / "app"
    shutil.copytree(ROOT / "examples" / "flower", app)
    done = _flwr_run(app, tmp_path, "--run-config", 'num-server-rounds=2 out="runs/example"')
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "example"
    assert _status(run_dir) == "completed", (run_dir / "flower.log").read_text()
    assert "ens_test_acc" in (run_dir / "metrics.jsonl").read_text()
