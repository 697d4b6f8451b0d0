"""`flwr run` as a Flower user types it, on Flower's default local simulation federation (2 SuperNodes): the app
laid out as `flwr new` lays one out (examples/flower-app, its own ServerApp and ClientApp with a bayesadmm strategy)
and the presets' app, each with its default run config, in a fresh FLWR_HOME. `flwr run` starts a local SuperLink
that outlives it; the test stops it."""

from __future__ import annotations

import contextlib
import json
import os
import re
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


def _flwr_run(app: Path, cwd: Path, *args: str, then: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`flwr run APP --stream ARGS`; `then`: a flwr command run after it on the same local SuperLink (`{run}` in
    it: the run's id), whose output is appended to the result's stdout."""
    home = cwd / "flwr-home"
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{FLWR.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    try:
        done = subprocess.run([str(FLWR), "run", str(app), "--stream", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=400)
        if then:
            run = re.search(r"Successfully started run (\d+)", done.stdout + done.stderr)[1]
            after = subprocess.run([str(FLWR), *(a.replace("{run}", run) for a in then)], cwd=cwd, env=env,
                                   capture_output=True, text=True, timeout=60)
            done.stdout += after.stdout
        return done
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


@pytest.mark.slow
def test_a_failed_serverapp_says_why_in_one_line_and_flwr_ls_shows_the_run_failed(tmp_path):
    """`flwr run` exits 0 whatever its ServerApp does (flwr 1.42: it only starts the run and streams its log), so
    docs/deploy.md says how to see that it failed: the log's one-line reason, before Flower's traceback, and `flwr
    ls --run-id` ("finished:failed", with the reason). Here `out=` holds a run already: refused before any node is
    asked, and that run's files are left as they were."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "status.json").write_text(json.dumps({"status": "completed", "round": 3}))
    done = _flwr_run(ROOT / "flower_app", tmp_path, "--run-config", f'out="{taken}"',
                     then=("ls", "--run-id", "{run}", "--format", "json"))
    assert done.returncode == 0   # Flower's, not the run's
    log = done.stdout + done.stderr
    said = "bayesadmm: the run failed: RunDirError: " + f"{taken} holds a run already (status completed at round 3)"
    assert said in log and log.index(said) < log.index("Traceback"), log[-3000:]
    (listed,) = json.loads(done.stdout[done.stdout.index('{\n  "success"'):])["runs"]
    assert listed["status"] == "finished:failed" and "holds a run already" in listed["status-details"]
    assert json.loads((taken / "status.json").read_text()) == {"status": "completed", "round": 3}
