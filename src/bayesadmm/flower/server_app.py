"""The Flower ServerApp of the presets' app and of `bayesadmm flower demo`: `flwr run`'s run config (`app_config`:
a preset, or a model of your own named by the run config) made into a `BayesStrategy` and started. Its rounds are
the engine's (`engine.run.Run`), so a Flower run has everything a local run has (participants, evaluation, the
metrics line, checkpoint.pt every round, the divergence stop, stop_at, exact resume), and only the transport differs
(`runner.FlowerClients`). Clients that do not reply are left out of the round (the metrics line names them in
``absent_clients``) and logged in flower.log, also mirrored to Flower's log (the SuperLink's log, `flwr log`), with
when they come back.

Resume: ``flwr run ... --run-config 'out="RUN_DIR" resume=true'`` (or `bayesadmm flower resume`) continues the run
in RUN_DIR from its checkpoint, with the run config it was started with (flower.json), giving the numbers of an
uninterrupted run: the checkpoint holds the server's copy of every client state, sent back to the nodes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from logging import ERROR, WARNING
from pathlib import Path

from flwr.app import Context
from flwr.common.logger import log as flwr_log
from flwr.serverapp import Grid, ServerApp

from bayesadmm.engine.federation import EXIT_OK, Federation, Result
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
from bayesadmm.flower.bayes_strategy import BayesStrategy, one_line
from bayesadmm.flower.runlog import RunLog

__all__ = ["Timeouts", "run_server", "make_server_app", "config_from_run_config", "strategy_of", "app"]


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
    strategy = strategy_of(run)
    strategy.start(grid)  # in the run's precision (`run.settings.dtype`), torch's default left alone
    return strategy.result


def strategy_of(run: FlowerRun) -> BayesStrategy:
    """The strategy of a `flwr run` run config: a preset's federation (built as a local run builds it; clients no
    node holds are logged and left out), or a model of your own whose clients' sizes the nodes report (all must)."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    log = RunLog(run.run_dir / "flower.log")
    setup, on_start, config = run.setup, None, run.config_record
    if run.preset is not None:
        preset, on_start, setup, spec = preset_federation(run)
        config = functools.partial(run.config_record, spec=spec)

        def federation_of(sizes: Mapping[int, int], initial: object) -> Federation:
            missing = sorted(set(range(run.clients)) - set(sizes))
            if missing:
                log(f"after {run.timeouts.discovery:g} s no SuperNode holds client(s) {missing}", WARNING)
            return preset
    else:

        def federation_of(sizes: Mapping[int, int], initial: object) -> Federation:
            absent = (run.clients or max(sizes, default=-1) + 1) - len(sizes)  # ids are below it (`discover`)
            if absent > 0:
                missing = [k for k in range(len(sizes) + 10) if k not in sizes][:absent]  # the first of them
                more = f" ({absent} in all)" if absent > len(missing) else ""
                raise RuntimeError(
                    f"after {run.timeouts.discovery:g} s no SuperNode holds client(s) {missing}{more}; start them "
                    f'(--node-config "partition-id=K data=PATH") or raise discovery-timeout'
                )
            return user_federation(run, sizes)

    def started(run_dir: Path) -> None:
        write_json(run_dir / APP_CONFIG, run.app_config)
        if on_start is not None:
            on_start(run_dir)

    def on_round(line: dict) -> None:
        keys = [
            f"{kind}{where}_{metric}" for metric in ("acc", "nll") for where in ("test", "val") for kind in ("ens_", "")
        ]
        scores = [f"{key} {line[key]:.4g}" for key in keys if key in line]
        log(f"round {line['round']}: {line['participants']} clients" + "".join(f", {score}" for score in scores[:1]))

    return BayesStrategy(
        federation_of, setup, run.settings, run.run_dir, config=config, clients=run.clients or None,
        fraction_evaluate=0.0, timeouts=run.timeouts, resume=run.resume, overwrite=run.overwrite, title=run.title,
        on_start=started, on_round=on_round,
    )  # fmt: skip


def make_server_app(run: FlowerRun | RunConfig | None = None, timeouts: Timeouts | None = None) -> ServerApp:
    """A ServerApp for `run`, or (None) for the run config of `flwr run` (`app_config.flower_run`)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        # a failure is logged in one line before Flower's traceback (the strategy logs its own), and raised, so
        # that Flower records the run "finished:failed" (`flwr ls`); `flwr run` exits 0 whatever happens here
        try:
            chosen = flower_run(dict(context.run_config)) if run is None else run
            if isinstance(chosen, RunConfig):
                chosen = preset_run(chosen, timeouts)
            strategy = strategy_of(chosen)
        except Exception as exc:
            flwr_log(ERROR, "bayesadmm: the run cannot start: %s", one_line(exc))
            raise
        strategy.start(grid)
        result = strategy.result
        if result.exit_code != EXIT_OK:
            strategy.log(f"the run ended {result.status}: {result.message}", ERROR)
            raise RuntimeError(f"run {result.status}: {result.message}")

    return app


app = make_server_app()
