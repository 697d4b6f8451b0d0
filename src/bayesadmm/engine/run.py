"""`Run`: one run of a federation in its run directory, the object the engine's loop (`engine.loop.run_federation`)
drives: its start or resume, its rounds one `step` at a time, its checkpoints and its final status."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from bayesadmm.algorithms.base import compiled_kernels, info_scalars
from bayesadmm.clients import fingerprint
from bayesadmm.engine import personal, store
from bayesadmm.engine.checkpoint import final_status, save_checkpoint
from bayesadmm.engine.cohort import run_layout
from bayesadmm.engine.federation import (
    BREAKDOWNS,
    EVALUATION,
    EXIT_DIVERGED,
    EXIT_OK,
    Federation,
    Result,
    participants,
)
from bayesadmm.engine.history import (
    append_line,
    close_progress,
    headline,
    mean_client_info,
    metrics_line,
    note,
    on_done,
    progress_bar,
)
from bayesadmm.engine.history import read_metrics as _read_metrics
from bayesadmm.engine.identity import carried_removals, check_same_run, evaluation_fingerprint
from bayesadmm.engine.pool import client_runner
from bayesadmm.engine.provenance import record_environment
from bayesadmm.engine.rundir import (
    RunDirError,
    prepare_fresh,
    read_bytes,
    read_checkpoint,
    write_bytes,
    write_json,
)
from bayesadmm.engine.runners import ClientRunner, RunnerFactory, check_states, remove_stale_shards
from bayesadmm.engine.settings import Settings
from bayesadmm.engine.simulate import generator_for
from bayesadmm.engine.store import StoreSpec, store_kind
from bayesadmm.evaluation.leavings import leave
from bayesadmm.evaluation.metrics import evaluate
from bayesadmm.optim.compilation import compiled_here, compiling_note
from bayesadmm.posterior.artefact import save_posterior
from bayesadmm.privacy.client_level import BudgetExhausted, PrivateServer
from bayesadmm.privacy.example_level import ExampleServer

__all__ = ["Run"]


class Run:
    """One run of a federation in its run directory: the server state, the clients (a `ClientRunner`), the metrics
    of every round so far (`history`), the last round done (`round`) and the last checkpointed (`checkpointed`).

        run = Run(federation, settings, run_dir)
        with run:                              # closes the clients (worker processes) however it ends
            run.start()                        # or run.resume(): False where the run is already complete
            while run.round < settings.last_round and run.step() is not None:
                ...
            result = run.finish()

    `start` and `resume` each check the run directory, then `open` the run: status "running", the clients, the
    initial or checkpointed states. `step` is one round (its metrics line; None where the algorithm broke down, which
    `outcome` then says), which checkpoints itself where `checkpoint_every` says; `checkpoint` writes one now.
    `run_federation` drives a Run with the run directory locked (`rundir.locked`, which a Run used directly leaves
    to its caller), a SIGTERM as an interruption and a final status however the run ends (`guard`)."""

    def __init__(
        self,
        federation: Federation,
        settings: Settings,
        run_dir: Path | str,
        *,
        config: Mapping | None = None,
        progress: bool = False,
        title: str = "",
        on_round: Callable[[dict], None] | None = None,
        runner: RunnerFactory | None = None,
    ):
        self.federation, self.settings, self.run_dir = federation, settings, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config, self.progress, self.title, self.on_round, self.runner = config, progress, title, on_round, runner
        self.status_path = self.run_dir / "status.json"
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.checkpoint_path = self.run_dir / "checkpoint.pt"
        self.algorithm = federation.make_algorithm()
        self.ids = sorted(federation.clients.sizes)
        config_json = json.loads(json.dumps(dict(config))) if config is not None else None  # as config.json holds it
        personal_tests = federation.personal.tests if federation.personal is not None else None
        scored_on = evaluation_fingerprint(federation.eval_X, federation.eval_y, federation.ood_X, personal_tests)
        data = {**fingerprint(federation.clients), "evaluation": scored_on}  # trained on, and scored on
        self.identity = {"method": self.algorithm.name, "config": config_json, "data": data}
        self.server: Any = None
        self.history: list[dict] = []
        self.round = self.checkpointed = 0
        self.clients: ClientRunner | None = None
        self.outcome: tuple[int, dict] | None = None  # (exit code, status) once a round broke down
        self.complete = False  # resumed a run already complete up to its last round
        self._checkpoint: Mapping | None = None  # read by `prepare_resume`, until `open` hands it to the clients
        self._bar: Any = None
        self._workers = self._cohort = 1

    # ---- starting --------------------------------------------------------------------------------------------------

    def start(self, overwrite: bool = False, on_start: Callable[[Path], None] | None = None) -> None:
        """A fresh start (`prepare_fresh`), then `open`: the initial server state and checkpoint of round 0."""
        self.prepare_fresh(overwrite, on_start)
        self.open()

    def resume(self) -> bool:
        """Go on from the run directory's checkpoint (`prepare_resume`, then `open`); False, and nothing written, where
        the run is already complete up to its last round (`result()` says so)."""
        if not self.prepare_resume():
            return False
        self.open()
        return True

    def prepare_fresh(self, overwrite: bool = False, on_start: Callable[[Path], None] | None = None) -> None:
        """Check that the run directory may take a new run (`overwrite` replaces one), call `on_start(run_dir)`, and
        write config.json, the environment and an empty metrics.jsonl."""
        prepare_fresh(self.run_dir, overwrite)
        if on_start is not None:
            on_start(self.run_dir)
        if self.config is not None:
            write_json(self.run_dir / "config.json", dict(self.config))
        self._prepare_files(0)

    def prepare_resume(self) -> bool:
        """Check the checkpoint (its run, its client states, a private run's accounting, `stop_at`) before anything is
        written; False where the run is already complete up to its last round (its final status written), else record
        the environment and drop the metrics lines of the rounds after the checkpoint. A checkpoint of the last round
        without its final status is a run whose end was cut short: True, no round left, and `finish` ends it."""
        settings = self.settings
        checkpoint = read_checkpoint(self.checkpoint_path, settings.rounds)
        check_same_run(self.checkpoint_path, checkpoint, self.identity)
        self.identity = carried_removals(self.identity, checkpoint)  # clients unlearned stay recorded as such
        check_states(checkpoint, self.run_dir, self.ids)  # the worker shards too: read and their checksums verified
        self._check_accounting(checkpoint)
        if settings.stop_at and settings.stop_at < checkpoint["round"]:
            raise RunDirError(
                f"stop_at={settings.stop_at} is before the checkpoint's round {checkpoint['round']}; "
                f"give a later round, or none to run to the end"
            )
        self.round = self.checkpointed = checkpoint["round"]
        if checkpoint["round"] >= settings.last_round and self._ended(checkpoint["round"]):
            self.history = _read_metrics(self.metrics_path, checkpoint["round"])
            self.server, self.complete = checkpoint["server"], True
            return False
        # a checkpoint of the last round whose end was cut short (a kill while the posterior file, the plots or the
        # final status were written) opens as any other: no round is left to run, and `finish` writes them again
        self._checkpoint = checkpoint
        self._prepare_files(checkpoint["round"])
        return True

    def _check_accounting(self, checkpoint: Mapping) -> None:
        """A private run's accountant history must be that of the checkpoint's rounds: a history cut short would
        report less ε than was spent (and client-level DP's noise, drawn from the stream of the history's length,
        would repeat a round's). Client-level DP: one step per round; example-level DP: each client's rounds trained,
        those it was drawn for (at most, where a runner over a network may have missed some)."""
        server, round_ = checkpoint["server"], checkpoint["round"]
        if isinstance(server, PrivateServer):
            found, expected = f"{len(server.steps)} rounds", f"{round_}"
            if len(server.steps) == round_:
                return
        elif isinstance(server, ExampleServer):
            trained = dict(server.trained)
            drawn = dict.fromkeys(self.ids, 0)
            settings, sampling = self.settings, self.algorithm.client_sampling
            for r in range(1, round_ + 1):
                for k in participants(self.ids, settings.participation, settings.seed, r, sampling):
                    drawn[k] += 1
            exact = self.runner is None  # the engine's own runner trains every client drawn
            if set(trained) <= set(drawn) and all(
                trained.get(k, 0) == n if exact else 0 <= trained.get(k, 0) <= n for k, n in drawn.items()
            ):
                return
            found, expected = "other clients' training rounds", "the clients drawn in its rounds"
        else:
            return
        raise RunDirError(
            f"{self.checkpoint_path} is of round {round_} but its privacy accountant's history holds {found}, not "
            f"{expected}: the privacy spent would be misreported; the file was edited: restore it, or start the run "
            "again"
        )

    def _ended(self, round_: int) -> bool:
        """Whether status.json records the end of the run at round `round_` (completed, or stopped as asked): written
        after the run's posterior file, plots and reliability diagram, so these are whole."""
        try:
            status = json.loads(read_bytes(self.status_path))
        except (OSError, ValueError):  # missing, unreadable, not JSON (RunDirError is a ValueError): not ended
            return False
        return (
            isinstance(status, dict)
            and status.get("status") in ("completed", "stopped")
            and status.get("round") == round_
        )

    def _prepare_files(self, start: int) -> None:
        settings = self.settings
        self._workers, self._cohort = run_layout(settings, self.ids, self.algorithm, self.federation.theta0)
        layout: dict[str, Any] = {"workers": self._workers, "cohort": self._cohort} if self.runner is None else {}
        layout["compiled_kernels"] = compiled_kernels(self.algorithm)  # the run's `compile` setting, decided
        record_environment(self.run_dir, settings.device, start, layout)
        self.history = _read_metrics(self.metrics_path, start)
        # drop rounds after the checkpoint (a kill here leaves the old file whole: the next resume drops them again)
        write_bytes(self.metrics_path, "".join(json.dumps(line) + "\n" for line in self.history).encode())
        if self.federation.personal is not None or (self.run_dir / "personal.jsonl").exists():
            kept = _read_metrics(self.run_dir / "personal.jsonl", start)  # personal.jsonl likewise
            write_bytes(self.run_dir / "personal.jsonl", "".join(json.dumps(line) + "\n" for line in kept).encode())
        self._bar = progress_bar(settings.last_round, start, self.progress, self.title)

    def open(self) -> None:
        """Status "running", the clients (worker processes start here: one that cannot, an object that does not
        pickle, fails), and the states: the initial ones with a checkpoint of round 0 on a fresh start (a stop in
        round 1 still leaves a state), the checkpoint's on a resume."""
        write_json(self.status_path, {"status": "running", "round": self.round})
        self.clients = self._make_clients()
        checkpoint, self._checkpoint = self._checkpoint, None
        if checkpoint is None:
            settings = self.settings
            self.server = self.algorithm.init_server(self.federation.theta0.to(settings.device, settings.torch_dtype))
            self.clients.start(self.server)
            self.checkpoint()
        else:
            self.server = checkpoint["server"]
            # those of a checkpoint the kill did not let finish, before a disk store writes blocks of its own
            remove_stale_shards(self.run_dir, checkpoint)
            self.clients.restore(checkpoint, self.run_dir)
        if compiled_kernels(self.algorithm) and not compiled_here():  # the first round waits for the compiler
            note(self._bar, compiling_note(self.round + 1))

    def _make_clients(self) -> ClientRunner:
        if self.runner is not None:
            return self.runner(self.algorithm, self._workers)
        federation = self.federation
        return client_runner(
            federation.make_algorithm,
            federation.clients,
            self.settings.seed,
            self._workers,
            self.algorithm,
            cohort_size=self._cohort if self._cohort > 1 else 0,
            store=StoreSpec(self._store_kind(), self.run_dir, store.CACHE_BYTES),
            participation=self.settings.participation,
        )

    def _store_kind(self) -> str:
        """Where the client states live (`engine.store.store_kind`, judged on the first client's initial state)."""
        theta0 = self.federation.theta0.to(self.settings.device, self.settings.torch_dtype)
        first = self.algorithm.init_client(self.algorithm.init_server(theta0), self.ids[0]) if self.ids else None
        return store_kind(self.settings.client_store, len(self.ids), first)

    # ---- rounds ----------------------------------------------------------------------------------------------------

    def step(self) -> dict | None:
        """Round `round + 1`: participants, broadcast, client updates, server update, evaluation, its metrics line,
        a checkpoint where due (a resume redoes the rounds after it), status. Returns the metrics line, or None where
        the algorithm broke down or the metrics are not finite (`outcome`: status "diverged", the state unchanged),
        or where a private run's next round would exceed its budget (status "budget", `privacy.BudgetExhausted`).
        `next_round`, the runner's `train`, `end_round`: a Flower strategy calls the halves around its own exchange."""
        assert self.clients is not None, "open the run first (start or resume)"
        began = time.perf_counter()
        round_, chosen = self.next_round()
        try:
            message = self.algorithm.broadcast(self.server)
        except BudgetExhausted as exc:  # before any client trains: the run ends with the budget it has left
            self._out_of_budget(round_, str(exc))
            return None
        try:
            replies = self.clients.train(round_, message, chosen, on_done(self._bar, len(chosen), began))
        except BREAKDOWNS as exc:
            self._diverged(round_, str(exc))
            return None
        return self.end_round(round_, chosen, replies, began)

    def next_round(self) -> tuple[int, list[int]]:
        """The next round's number and its participants (the seeded choice of `participants`, sampled as the
        algorithm asks: `Algorithm.client_sampling`)."""
        round_ = self.round + 1
        if round_ > self.settings.rounds:
            raise RuntimeError(f"the run has {self.settings.rounds} rounds, all done; there is no round {round_}")
        settings = self.settings
        chosen = participants(self.ids, settings.participation, settings.seed, round_, self.algorithm.client_sampling)
        return round_, chosen

    def end_round(self, round_: int, chosen: list[int], replies: Mapping[int, Any], began: float) -> dict | None:
        """The rest of round `round_` once the clients' `replies` are in (`began`: when the round started): the
        server update, evaluation, metrics line, checkpoint and status (`step`'s doc)."""
        settings, federation = self.settings, self.federation
        try:
            new_server, server_info = self.algorithm.server_update(self.server, replies)
        except BREAKDOWNS as exc:
            self._diverged(round_, str(exc))
            return None
        seconds = time.perf_counter() - began
        began = time.perf_counter()
        results = self._evaluate(new_server, round_)
        line = metrics_line(round_, results, seconds, time.perf_counter() - began, len(replies), federation.eval_set)
        if len(replies) < len(chosen):  # a runner that reaches clients over a network may miss some (Flower)
            line["absent_clients"] = [k for k in chosen if k not in replies]
        if not all(math.isfinite(v) for v in results.values()):
            self._diverged(round_, f"non-finite {federation.eval_set} metrics {results}")
            return None
        if federation.personal is not None and federation.personal.due(round_, settings.last_round):
            line.update(self._personal(new_server, round_))
        self.server, self.round = new_server, round_
        # a private run's accounting (dp_epsilon, ...) under its own names, the server's other scalars as server_*
        line.update({k if k.startswith("dp_") else f"server_{k}": v for k, v in info_scalars(server_info).items()})
        line.update(mean_client_info(self.clients.last_info))  # type: ignore[union-attr]
        self._record(line)
        return line

    def _evaluate(self, server: Any, round_: int) -> dict[str, float]:
        federation = self.federation
        if federation.eval_X is None or federation.eval_y is None:  # scored elsewhere (a Flower strategy's clients)
            return {}
        return evaluate(
            federation.model,
            self.algorithm.posterior(server),
            federation.eval_X,
            federation.eval_y,
            likelihood=federation.likelihood,
            samples=self.settings.eval_samples,
            generator=generator_for(self.settings.seed, round_, EVALUATION),
            extra=federation.metrics,
            ood=federation.ood_X,
        )

    def _personal(self, server: Any, round_: int) -> dict[str, float]:
        """Every client's global and personal metrics on its own test split (`personal.round_metrics`)."""
        states = self.clients.states() if self.algorithm.personal is not None else {}  # type: ignore[union-attr]
        args = (server, states or dict.fromkeys(self.ids), self.settings.seed, self.settings.eval_samples, round_)
        return personal.round_metrics(self.run_dir, self.federation, self.algorithm, *args)

    def _record(self, line: dict) -> None:
        """The metrics line, the checkpoint where due, the status, the bar and `on_round`, in this order."""
        round_ = line["round"]
        append_line(self.metrics_path, line)
        if round_ % self.settings.checkpoint_every == 0 or round_ == self.settings.last_round:
            self.checkpoint()
        self.history.append(line)
        write_json(self.status_path, {"status": "running", "round": round_})
        self._bar.set_postfix_str(headline(line, self.federation.eval_set))
        self._bar.update(1)
        if self.on_round is not None:
            self.on_round(line)

    def _out_of_budget(self, round_: int, reason: str) -> None:
        """Status "budget": the state after round `round_` − 1, checkpointed, so that a resume with a larger budget
        goes on from it."""
        if self.checkpointed < self.round:
            self.checkpoint()
        self.outcome = (EXIT_OK, {"status": "budget", "round": self.round, "message": reason})

    def _diverged(self, round_: int, reason: str) -> None:
        status = {"status": "diverged", "round": round_ - 1, "message": f"round {round_}: {reason}; {self._to_try()}"}
        self.outcome = (EXIT_DIVERGED, status)

    def _to_try(self) -> str:
        """What to change after a divergence: client-level DP's noise and clipping are the usual cause in a private
        run; the step size, the damping or the data otherwise."""
        if isinstance(self.server, PrivateServer):
            return (
                "try a larger clip (dp clip), more clients a round (participation, more clients), or example-level DP "
                "(dp level 'example')"
            )
        return (
            "try a smaller lr, a larger damping (the method's rho or delta), or check the data (its scale, its labels)"
        )

    def checkpoint(self) -> None:
        """Write the checkpoint of the current round now (client states first, checkpoint.pt last)."""
        assert self.clients is not None, "open the run first (start or resume)"
        save_checkpoint(self.checkpoint_path, self.round, self.server, self.clients, self.identity)
        self.checkpointed = self.round

    def run_rounds(self) -> None:
        """`step` until the last round, or until a round breaks down."""
        while self.round < self.settings.last_round and self.outcome is None:
            self.step()

    # ---- ending ----------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Every way out of the block ends with a final status: an interruption (Ctrl-C, a SIGTERM, a callback's
        SystemExit) or a failure is recorded in status.json and raised; the clients are closed however it ends."""
        try:
            yield
        except (KeyboardInterrupt, SystemExit) as exc:  # say so, so that a watcher does not wait for a dead run
            self._close_bar("interrupted")
            then = (
                f"resume goes on from the checkpoint of round {self.checkpointed}"
                if self.checkpoint_path.exists()
                else "no checkpoint was written yet: run it again"
            )
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"ended by SystemExit({exc.code!r})"
            final_status(self.status_path, "interrupted", self.checkpointed, f"{why}; {then}")
            raise
        except BaseException as exc:  # anything else: the run failed, and status.json says why
            self._close_bar("failed")
            final_status(self.status_path, "failed", self.checkpointed, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.close()

    def finish(self) -> Result:
        """The final status (completed, stopped as asked, or diverged), written after what the evaluation leaves
        (`evaluation.leavings.leave`: curves.png, the reliability diagram) and the posterior file (the status tells a
        watcher the run directory is complete); the run's `Result`."""
        code, status = self.outcome or (EXIT_OK, {})
        if self.outcome is None and self.settings.last_round == self.settings.rounds:
            status = {"status": "completed", "round": self.settings.rounds}
        elif self.outcome is None:
            status = {
                "status": "stopped",
                "round": self.settings.last_round,
                "message": f"stopped after round {self.settings.stop_at} as asked (stop_at); resume goes on",
            }
        self._close_bar(status["status"])
        if self.history:  # curves.png and, for a likelihood with confidence bins, the reliability diagram
            posterior = functools.partial(self.algorithm.posterior, self.server)
            leave(self.run_dir, self.federation, self.settings, self.round, self.history, posterior, self.title)
        last = self.checkpointed if code != EXIT_OK else status["round"]
        result = self.result(status["status"], code, last, status.get("message", ""))
        save_posterior(result)
        write_json(self.status_path, status)
        return result

    def result(self, status: str | None = None, code: int = EXIT_OK, round_: int | None = None, message: str = ""):
        """The run's `Result`; by default that of a run found already complete (status as status.json has it)."""
        if status is None:
            exists = self.status_path.exists()
            status = json.loads(read_bytes(self.status_path))["status"] if exists else "stopped"
            message = f"already complete up to round {self.round}: nothing to do"
        round_ = self.round if round_ is None else round_
        federation = self.federation
        return Result(
            status, code, round_, self.history, self.server, self.algorithm, self.run_dir, message,
            federation.model, federation.scenario,
        )  # fmt: skip

    def close(self) -> None:
        """Close the clients (stop worker processes); the Run keeps its server state and history."""
        if self.clients is not None:
            clients, self.clients = self.clients, None
            clients.close()

    def _close_bar(self, outcome: str) -> None:
        """Close the progress; a log's last line says how the run ended (`outcome`)."""
        if self._bar is not None:
            close_progress(self._bar, outcome)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
