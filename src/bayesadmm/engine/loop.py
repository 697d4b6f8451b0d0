"""The federated round loop and everything around it: participants, client updates (in this process or in worker
processes), server update, evaluation, metrics, checkpoints and exact resume, the divergence stop, a progress bar and
the run directory. It runs objects, never names: a `Federation` (model, clients, algorithm factory, evaluation data,
likelihood) under `Settings` (rounds, seed, participation, ...). `bayesadmm.run` builds these from a user's model and
tensors; `bayesadmm run PRESET` builds them from a config (bayesadmm.experiments.build).

One round: sample the participating clients, broadcast, run each participant's `client_update` with the generator
of (seed, round, client), `server_update`, evaluate the server's posterior on the evaluation set (at its mean and, for
posteriors that can be sampled, the predictive over `eval_samples` draws), append a line to metrics.jsonl, checkpoint.

Every random choice comes from a generator derived from (seed, round, client) (`simulate.generator_for`; client
ids from 10⁹ on are the engine's own streams), and nothing uses torch's global RNG, so a resume after a kill
continues with exactly the numbers an uninterrupted run would have produced, whatever the number of workers.

Files in the run directory: config.json (what the caller describes the run by), metrics.jsonl (one JSON object per
round: the evaluation metrics, `server_*` and mean `client_*` scalars of the algorithm's info records, timings),
checkpoint.pt (the state after the last checkpointed round), client-states/ (with parallel workers: the client states
of that checkpoint, one shard file per worker), status.json (running / stopped / completed / diverged / budget (a
private run's privacy budget spent) / interrupted, with the reason), curves.png (the metrics per round), for a
likelihood with confidence bins (classifiers) reliability.json and reliability.png (the reliability diagrams of the
last evaluation; both `bayesadmm.evaluation.leavings`), posterior.safetensors and environment.json (code version,
torch, processor: one record per start or resume). A checkpoint is written shards first, checkpoint.pt last, each
under a temporary name renamed when complete, so a kill at any point leaves the previous checkpoint whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from bayesadmm.engine.federation import Federation, Result
from bayesadmm.engine.run import Run
from bayesadmm.engine.rundir import locked
from bayesadmm.engine.runners import RunnerFactory
from bayesadmm.engine.settings import Settings
from bayesadmm.engine.signals import sigterm_as_interrupt

__all__ = ["run_federation"]


def run_federation(
    federation: Federation,
    settings: Settings,
    run_dir: Path | str,
    *,
    config: Mapping | None = None,
    resume: bool = False,
    progress: bool = True,
    title: str = "",
    on_round: Callable[[dict], None] | None = None,
    overwrite: bool = False,
    on_start: Callable[[Path], None] | None = None,
    runner: RunnerFactory | None = None,
) -> Result:
    """Run (or, with `resume`, continue from run_dir's checkpoint) the federation; returns how it ended.

    `config` is written to run_dir/config.json on a fresh start (what the run is, for people and for `resume`);
    `on_round(line)` is called with each round's metrics line. A divergence (a breakdown of the algorithm, or
    non-finite metrics) ends the run with status "diverged" and the last good state in the checkpoint; Ctrl-C or a
    SIGTERM raises KeyboardInterrupt (`Interrupted` with the signal's number for a SIGTERM) after recording the
    interruption in status.json (a SystemExit, e.g. from `on_round`, is recorded as an interruption too); any other
    exception, the start of worker processes included, is recorded as status "failed" with its reason, and raised.

    The run directory is locked for the run (a second process is refused, `RunDirError`); a fresh start where a run
    is already is refused unless `overwrite`; a resume checks the checkpoint before it writes anything, and a run
    that is already complete is returned as it is. `on_start(run_dir)` is called on a fresh start once these checks
    have passed, before the run writes its first file (for records of the caller's own, e.g. the client split).
    `runner(algorithm, workers)` gives the `ClientRunner` that trains the clients (default: `client_runner`, in this
    process or a pool of worker processes); only the transport differs, the loop is the same. (A `Run` is the
    object this drives, for a caller that wants the rounds one at a time.)
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with locked(run_dir), sigterm_as_interrupt():  # a SIGTERM is an interruption from the start
        run = Run(
            federation, settings, run_dir, config=config, progress=progress, title=title, on_round=on_round,
            runner=runner,
        )  # fmt: skip
        if resume and not run.prepare_resume():  # everything checked before anything is written
            return run.result()
        if not resume:
            run.prepare_fresh(overwrite, on_start)
        with run.guard():  # from here on every way out ends with a final status, the end of the run included: a
            run.open()  # kill while it writes the posterior file and plots leaves a status that is not final, and a
            run.run_rounds()  # resume writes them again
            return run.finish()
