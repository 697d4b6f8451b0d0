"""The Flower ServerApp: the engine's own round loop (`bayesadmm.engine.loop.run_federation`), its clients on
SuperNodes.

    run   = flower_run(run config of `flwr run`)                   # app_config: settings, setup, run directory
    nodes = discover(grid)                                         # which node holds which client, and its size
    run_federation(federation, settings, run_dir, runner=FlowerClients(grid, nodes, ...))

So a Flower run has everything a local run has (participants, evaluation, the metrics line, checkpoint.pt every
round, the divergence stop, stop_at, exact resume), and only the transport differs (`runner.FlowerClients`).
Clients that do not reply are left out of the round (the metrics line names them in ``absent_clients``) and logged
in flower.log, also mirrored to Flower's log (the SuperLink's log, `flwr log`), with when they come back.

Resume: ``flwr run ... --run-config 'out="RUN_DIR" resume=true'`` (or `bayesadmm flower resume`) continues the run
in RUN_DIR from its checkpoint, with the run config it was started with (flower.json), giving the numbers of an
uninterrupted run: the checkpoint holds the server's copy of every client state, sent back to the nodes.
"""

from __future__ import annotations

import json
from logging import WARNING
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from bayesadmm.engine.loop import EXIT_OK, Result, run_federation
from bayesadmm.engine.rundir import write_json
from bayesadmm.experiments.config import RunConfig
from bayesadmm.flower.app_config import (
    APP_CONFIG,
    FlowerRun,
    Timeouts,
    flower_run,
    preset_federation,
    preset_run,
    user_federation,
)
from bayesadmm.flower.runlog import RunLog
from bayesadmm.flower.runner import FlowerClients, discover

__all__ = ["Timeouts", "run_server", "make_server_app", "config_from_run_config", "app"]


def config_from_run_config(run_config: dict) -> tuple[RunConfig, Timeouts]:
    """A preset run config's RunConfig and timeouts (an error lists what is wrong, as `bayesadmm run` does)."""
    run = flower_run(run_config)
    assert run.preset is not None
    return run.preset, run.timeouts


def run_server(grid: Grid, run: FlowerRun | RunConfig, timeouts: Timeouts | None = None) -> Result:
    """The federated run on a Flower grid (a preset RunConfig, or a `FlowerRun`); writes the run directory as a
    local run does, plus flower.log and flower.json; returns the engine's `Result`."""
    if isinstance(run, RunConfig):
        run = preset_run(run, timeouts)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    log = RunLog(run.run_dir / "flower.log")
    return _run(grid, run, log)  # in the run's precision (`run.settings.dtype`), torch's default left alone


def _run(grid: Grid, run: FlowerRun, log: RunLog) -> Result:
    setup = run.setup
    on_start = None
    if run.preset is not None:
        federation, on_start, setup = preset_federation(run)
    what = f"{run.preset.method} on {run.preset.scenario}" if run.preset is not None else setup["algorithm"]
    log(
        f"{what}: {run.clients} clients, {run.settings.rounds} rounds -> {run.run_dir}"
        + (" (resuming)" if run.resume else "")
    )
    text = json.dumps(setup, sort_keys=True)
    nodes, sizes, asked = discover(grid, text, run.clients, run.timeouts, log)
    missing = sorted(set(range(run.clients)) - set(nodes))
    if missing:
        log(f"after {run.timeouts.discovery:g} s no SuperNode holds client(s) {missing}", WARNING)
    if run.preset is None:
        if missing:
            raise RuntimeError(
                f"after {run.timeouts.discovery:g} s no SuperNode holds client(s) {missing}; start them "
                f'(--node-config "partition-id=K data=PATH") or raise discovery-timeout'
            )
        federation = user_federation(run, sizes)
    log("clients -> nodes: " + ", ".join(f"{k} -> {n}" for k, n in nodes.items()))
    ids = sorted(federation.clients.sizes)

    def runner(algorithm, workers):
        return FlowerClients(
            grid, algorithm, ids, nodes, asked, text, federation.clients.sizes, run.timeouts, log, run.settings.device
        )

    def started(run_dir: Path) -> None:
        write_json(run_dir / APP_CONFIG, run.app_config)
        if on_start is not None:
            on_start(run_dir)

    def on_round(line: dict) -> None:
        eval_set = federation.eval_set
        scores = [
            f"{key} {line[key]:.4g}"
            for key in (f"ens_{eval_set}_acc", f"{eval_set}_acc", f"{eval_set}_nll")
            if key in line
        ]
        log(f"round {line['round']}: {line['participants']} clients, " + ", ".join(scores[:1]))

    result = run_federation(
        federation,
        run.settings,
        run.run_dir,
        config=run.config_record(federation.clients.sizes),
        resume=run.resume,
        progress=False,
        title=run.title,
        on_round=on_round,
        overwrite=run.overwrite,
        on_start=started,
        runner=runner,
    )
    message = f": {result.message}" if result.message else ""
    log(f"{result.status} after round {result.round}{message}")
    return result


def make_server_app(run: FlowerRun | RunConfig | None = None, timeouts: Timeouts | None = None) -> ServerApp:
    """A ServerApp for `run`, or (None) for the run config of `flwr run` (`app_config.flower_run`)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        chosen = flower_run(dict(context.run_config)) if run is None else run
        result = run_server(grid, chosen, timeouts)
        if result.exit_code != EXIT_OK:
            raise RuntimeError(f"run {result.status}: {result.message}")

    return app


app = make_server_app()
