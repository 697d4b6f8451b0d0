"""Continue a Flower run from its checkpoint: `flwr run APP CONNECTION --run-config 'out="RUN_DIR" resume=true'`.

The ServerApp reads the run config the run was started with from RUN_DIR/flower.json (only out, stop-at, the
timeouts and the device may change) and the state from RUN_DIR/checkpoint.pt, which holds the server state and the
server's copy of every client state; the nodes are sent their states with their first message, so the numbers are
those of a run that was never interrupted. RUN_DIR is a path on the machine that runs the SuperLink (where the
ServerApp writes it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bayesadmm.flower.app_config import APP_CONFIG
from bayesadmm.flower.preset import preset_app


def resume_argv(run_dir: Path, connection: str, app_dir: Path | None = None, stop_at: int = 0) -> list[str]:
    """The `flwr run` command that resumes `run_dir`; `app_dir` defaults to the preset app for a preset run (an
    app of your own model must be named). Checks the run directory first; a ValueError says what is missing."""
    run_dir = Path(run_dir).resolve()
    path = run_dir / APP_CONFIG
    if not path.exists() or not (run_dir / "checkpoint.pt").exists():
        raise ValueError(f"{run_dir} is not a Flower run with a checkpoint (no {APP_CONFIG} or checkpoint.pt)")
    if app_dir is None:
        if json.loads(path.read_text()).get("model"):
            raise ValueError("this run is of your own model: name its Flower app with --app DIR")
        app_dir = preset_app()
    run_config = f'out="{run_dir}" resume=true' + (f" stop-at={int(stop_at)}" if stop_at else "")
    flwr = Path(sys.executable).parent / "flwr"  # this environment's, where bayesadmm is installed
    return [
        str(flwr) if flwr.exists() else "flwr",
        "run",
        str(app_dir),
        connection,
        "--run-config",
        run_config,
        "--stream",
    ]


def resume(run_dir: Path, connection: str, app_dir: Path | None = None, stop_at: int = 0) -> int:
    """Run `resume_argv`'s command; its exit code."""
    return subprocess.call(resume_argv(run_dir, connection, app_dir, stop_at))
