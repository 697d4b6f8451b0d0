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
of that checkpoint, one shard file per worker), status.json (running / stopped / completed / diverged / interrupted,
with the reason), curves.png (the metrics per round) and environment.json (code version, torch, processor: one record
per start or resume). A checkpoint is written shards first, checkpoint.pt last, each under a temporary name renamed
when complete, so a kill at any point leaves the previous checkpoint whole.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, DivergenceError, info_scalars
from bayesadmm.clients import ClientSource, fingerprint
from bayesadmm.engine.cohort import automatic_cohort
from bayesadmm.engine.provenance import record_environment
from bayesadmm.engine.rundir import (
    RunDirError,
    locked,
    prepare_fresh,
    read_bytes,
    read_checkpoint,
    save_state,
    write_bytes,
    write_json,
)
from bayesadmm.engine.simulate import generator_for
from bayesadmm.engine.workers import (
    ClientRunner,
    RunnerFactory,
    check_states,
    client_runner,
    default_workers,
    remove_stale_shards,
)
from bayesadmm.likelihoods import Likelihood
from bayesadmm.metrics import evaluate
from bayesadmm.models import FlatModel
from bayesadmm.solvers.von import SubproblemError

__all__ = [
    "Settings",
    "Federation",
    "Result",
    "run_federation",
    "participants",
    "check_device",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_DIVERGED",
    "BREAKDOWNS",
    "Interrupted",
    "RunDirError",
    "write_json",
    "ClientRunner",
    "RunnerFactory",
]

# The engine's own random streams, generator_for(seed, round, <id>); 10⁹ + 0, 1, 2, 5 are the config layer's set-up
# streams (subsample, partition, initial weights, validation split).
PARTICIPANTS, EVALUATION = 10**9 + 3, 10**9 + 4
BREAKDOWNS = (DivergenceError, SubproblemError, FloatingPointError)
EXIT_OK, EXIT_FAILED, EXIT_DIVERGED = 0, 1, 3


@dataclass(frozen=True)
class Settings:
    """How a federation runs.

    `workers`: client updates in that many processes (0: one per core on the CPU, one on a GPU), same numbers for any
    count. `cohort`: train a round's clients that many at a time as one batched computation where the method's local
    solver allows it (`engine.cohort`), the per-client numbers up to rounding; 1: one client at a time; 0:
    `automatic_cohort`'s size (on a CPU the clients spread over the cores, at most 16 for Adam and 1 for IVON, where
    batching is no faster; each worker's clients on a GPU).
    `stop_at`: stop after that round with the schedule of `rounds` (0: run all). `checkpoint_every`: write the
    checkpoint every N rounds (and after the last)."""

    rounds: int = 10
    seed: int = 0
    participation: float = 1.0
    eval_samples: int = 32
    device: str = "cpu"
    workers: int = 1
    checkpoint_every: int = 1
    stop_at: int = 0
    cohort: int = 0

    def __post_init__(self) -> None:
        problems = []
        for key in ("rounds", "eval_samples", "checkpoint_every"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{key} must be an integer >= 1, got {value!r}")
        for key in ("seed", "workers", "stop_at", "cohort"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"{key} must be an integer >= 0, got {value!r}")
        if not (isinstance(self.participation, (int, float)) and 0 < self.participation <= 1):
            problems.append(f"participation must be in (0, 1], got {self.participation!r}")
        device_problem = check_device(self.device)
        if device_problem:
            problems.append(device_problem)
        if not problems and self.stop_at > self.rounds:
            problems.append(f"stop_at must be in [0, rounds={self.rounds}] (0: run all rounds), got {self.stop_at}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def last_round(self) -> int:
        return min(self.stop_at, self.rounds) if self.stop_at else self.rounds


def check_device(device: str) -> str | None:
    """What is wrong with `device` on this machine (None: nothing): not a torch device, or one torch cannot use here."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        return f"device must be a torch device such as cpu, cuda or cuda:1, got {device!r}"
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            return (
                f"device={device} but torch {torch.__version__} sees no CUDA device on this machine "
                f"(torch.cuda.is_available() is False)"
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            return f"device={device} but this machine has {torch.cuda.device_count()} CUDA device(s)"
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        return f"device={device} but torch sees no MPS device on this machine"
    elif parsed.type not in ("cpu", "cuda", "mps"):
        return f"device={device}: only cpu, cuda and mps are supported"
    return None


@dataclass(frozen=True)
class Federation:
    """What a run trains and how it is scored. `make_algorithm` is a zero-argument callable returning the Algorithm;
    it and `clients` must pickle for worker processes (module-level functions, `functools.partial`s of them,
    dataclasses of tensors). `metrics`: extra metric callables `fn(outputs (S, N, ...), targets) -> float`."""

    model: FlatModel
    clients: ClientSource
    make_algorithm: Callable[[], Algorithm]
    theta0: Tensor
    eval_X: Tensor
    eval_y: Tensor
    likelihood: Likelihood
    metrics: Mapping[str, Callable[[Tensor, Tensor], float]] = field(default_factory=dict)
    eval_set: str = "test"  # the metrics' prefix: test_*, or val_* for a held-out part of the training set


@dataclass
class Result:
    """How a run ended: `status` (completed, stopped, diverged), the exit code the CLI returns, the last round whose
    state is `server` (the last good one after a divergence), the metrics of every round, and the run directory."""

    status: str
    exit_code: int
    round: int
    history: list[dict]
    server: Any
    algorithm: Algorithm
    run_dir: Path
    message: str = ""

    @property
    def posterior(self) -> Any:
        """The server's posterior (a Gaussian with `.mean` and `.sample`, or a `PointEstimate`)."""
        return self.algorithm.posterior(self.server)


def participants(ids: list[int], participation: float, seed: int, round_: int) -> list[int]:
    """The clients that take part in `round_` (all, or a seeded random fraction), in id order."""
    if participation >= 1.0:
        return list(ids)
    count = max(1, math.ceil(participation * len(ids)))
    order = torch.randperm(len(ids), generator=generator_for(seed, round_, PARTICIPANTS))
    return sorted(ids[i] for i in order[:count].tolist())


def metrics_line(
    round_: int, results: Mapping[str, float], seconds: float, eval_seconds: float, count: int, eval_set: str = "test"
) -> dict:
    """One line of metrics.jsonl: `acc` → `test_acc`, `ens_acc` → `ens_test_acc`, then timings and participants."""
    line: dict[str, Any] = {"round": round_}
    for key, value in results.items():
        line[f"ens_{eval_set}_{key[4:]}" if key.startswith("ens_") else f"{eval_set}_{key}"] = value
    line.update({"seconds": seconds, "eval_seconds": eval_seconds, "participants": count})
    return line


def _save_checkpoint(path: Path, round_: int, server: Any, clients: ClientRunner, identity: dict) -> None:
    """checkpoint.pt: the round, the server state and the record of the client states (`clients.save`: the states, or
    the shard files the workers have just written). Written last and renamed into place, so that it only ever names a
    complete state; the shards it does not name are deleted after."""
    record = clients.save(path.parent, round_)
    # never a half-written checkpoint; `identity` (method, configuration, data) is what a resume must match
    save_state(path, {"round": round_, "server": server, **record, "run": identity})
    remove_stale_shards(path.parent, record)


# what a resume may change: where the files go, how many workers, when to checkpoint or stop, the trackers, the
# device (the numbers are those of the run's configuration, only rounded differently by another processor), and a
# Flower run config's launch flags and timeouts (its keys are spelt with '-': stop-at, round-timeout, ...)
RESUME_MAY_CHANGE = frozenset(
    {"out", "data_dir", "workers", "checkpoint_every", "stop_at", "log", "device"}
    | {"resume", "overwrite", "round_timeout", "discovery_timeout"}
)


def _settings(config: Mapping, prefix: str = "") -> dict[str, str]:
    """A configuration as flat `key: JSON value` pairs (nested tables by dotted keys), without RESUME_MAY_CHANGE."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        if str(key).replace("-", "_") in RESUME_MAY_CHANGE:
            continue
        if isinstance(value, Mapping):
            flat.update(_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value, sort_keys=True)
    return flat


def _check_same_run(path: Path, checkpoint: Mapping, identity: Mapping) -> None:
    """A RunDirError naming the difference if the checkpoint at `path` was written by another method, configuration
    or data than this run's `identity`."""
    saved = checkpoint.get("run")
    if not isinstance(saved, Mapping) or not {"method", "config", "data"} <= set(saved):
        raise RunDirError(f"{path} does not record its run (written by an older bayesadmm); start the run again")
    again = "resume with the run's own, or start a new run (another out=, or --overwrite)"
    if saved["method"] != identity["method"]:
        raise RunDirError(
            f"{path} is a checkpoint of method {saved['method']!r}, this run's is {identity['method']!r}; {again}"
        )
    if isinstance(saved["config"], Mapping) and identity["config"] is not None:
        old, new = _settings(saved["config"]), _settings(identity["config"])
        differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        if differ:
            shown = ", ".join(f"{k} {old.get(k, '(unset)')} → {new.get(k, '(unset)')}" for k in differ[:5])
            raise RunDirError(
                f"the configuration differs from the one {path} was written with ({shown}"
                f"{', ...' if len(differ) > 5 else ''}); restore config.json, or start a new run"
            )
    old_data, new_data = saved["data"], identity["data"]
    if not isinstance(old_data, Mapping) or old_data.get("sizes") != new_data["sizes"]:
        old_sizes = old_data.get("sizes") if isinstance(old_data, Mapping) else None
        raise RunDirError(
            f"the clients differ from those {path} was written with (sizes {_short(old_sizes)} → "
            f"{_short(new_data['sizes'])}); resume with the run's own data, or start a new run"
        )
    if "sha256" in old_data and "sha256" in new_data and old_data["sha256"] != new_data["sha256"]:
        raise RunDirError(
            f"the clients' examples differ from those {path} was written with (same sizes, other values: their sha256 "
            f"differs); resume with the run's own data, or start a new run"
        )


def _short(sizes: Any) -> str:
    text = json.dumps(sizes)
    return text if len(text) <= 80 else text[:77] + "..."


def _read_metrics(path: Path, up_to: int) -> list[dict]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in read_bytes(path).decode().splitlines() if line.strip()]
    return [line for line in lines if line["round"] <= up_to]


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
    process or a pool of worker processes); only the transport differs, the loop is the same.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with locked(run_dir):
        return _run_locked(
            federation, settings, run_dir, config, resume, progress, title, on_round, overwrite, on_start, runner
        )


def _run_locked(
    federation: Federation,
    settings: Settings,
    run_dir: Path,
    config: Mapping | None,
    resume: bool,
    progress: bool,
    title: str,
    on_round: Callable[[dict], None] | None,
    overwrite: bool,
    on_start: Callable[[Path], None] | None,
    runner: RunnerFactory | None,
) -> Result:
    from bayesadmm.reports import try_plot_run

    status_path, metrics_path, checkpoint_path = (
        run_dir / "status.json",
        run_dir / "metrics.jsonl",
        run_dir / "checkpoint.pt",
    )
    algorithm = federation.make_algorithm()
    ids = sorted(federation.clients.sizes)
    config_json = json.loads(json.dumps(dict(config))) if config is not None else None  # as config.json holds it
    identity = {"method": algorithm.name, "config": config_json, "data": fingerprint(federation.clients)}
    checkpoint = None
    if resume:  # everything checked before anything is written
        checkpoint = read_checkpoint(checkpoint_path, settings.rounds)
        _check_same_run(checkpoint_path, checkpoint, identity)
        check_states(checkpoint, run_dir, ids)  # the worker shards too: read and their checksums verified
        if settings.stop_at and settings.stop_at < checkpoint["round"]:
            raise RunDirError(
                f"stop_at={settings.stop_at} is before the checkpoint's round {checkpoint['round']}; "
                f"give a later round, or none to run to the end"
            )
        if checkpoint["round"] >= settings.last_round:
            history = _read_metrics(metrics_path, checkpoint["round"])
            state = json.loads(read_bytes(status_path))["status"] if status_path.exists() else "stopped"
            return Result(
                state,
                EXIT_OK,
                checkpoint["round"],
                history,
                checkpoint["server"],
                algorithm,
                run_dir,
                f"already complete up to round {checkpoint['round']}: nothing to do",
            )
    else:
        prepare_fresh(run_dir, overwrite)
        if on_start is not None:
            on_start(run_dir)
    start = checkpoint["round"] if checkpoint is not None else 0
    if checkpoint is None and config is not None:
        write_json(run_dir / "config.json", dict(config))
    # workers=0: one per core on the CPU; one on a GPU, where every worker process would hold a CUDA context and a
    # copy of the training set of its own and the processes would take turns on the one device
    workers = settings.workers or (default_workers() if torch.device(settings.device).type == "cpu" else 1)
    workers = min(workers, len(participants(ids, settings.participation, settings.seed, 1)))
    cohort_size = settings.cohort or automatic_cohort(len(ids), workers, settings.device, algorithm)
    layout = {"workers": workers, "cohort": cohort_size} if runner is None else {}
    record_environment(run_dir, settings.device, start, layout)
    history = _read_metrics(metrics_path, start)
    # drop rounds after the checkpoint (a kill here leaves the old file whole: the next resume drops them again)
    write_bytes(metrics_path, "".join(json.dumps(line) + "\n" for line in history).encode())

    bar = _progress(settings, start, progress, title)
    checkpointed = [start]  # the round of the last checkpoint written, kept up to date by _rounds
    clients: ClientRunner | None = None
    with _sigterm_as_interrupt():  # from here on a kill is reported as an interruption
        try:  # from the first "running" on, every way out ends with a final status
            write_json(status_path, {"status": "running", "round": start})
            if runner is None:  # worker processes start here: one that cannot (an object that does not pickle) fails
                clients = client_runner(
                    federation.make_algorithm,
                    federation.clients,
                    settings.seed,
                    workers,
                    algorithm,
                    cohort_size=cohort_size if cohort_size > 1 else 0,
                )
            else:
                clients = runner(algorithm, workers)
            if checkpoint is None:
                server = algorithm.init_server(federation.theta0.to(settings.device))
                clients.start(server)
                _save_checkpoint(
                    checkpoint_path, 0, server, clients, identity
                )  # a stop in round 1 still leaves a state
            else:
                server = checkpoint["server"]
                clients.restore(checkpoint, run_dir)
                remove_stale_shards(run_dir, checkpoint)  # those of a checkpoint the kill did not let finish
                del checkpoint  # the states now live in `clients`
            code, status, server = _rounds(
                federation,
                settings,
                algorithm,
                clients,
                ids,
                start,
                server,
                history,
                bar,
                run_dir,
                checkpointed,
                on_round,
                identity,
            )
        except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C, a SIGTERM, or a callback's sys.exit: say so, so
            bar.close()  # that a watcher does not wait for a dead run
            then = (
                f"resume goes on from the checkpoint of round {checkpointed[0]}"
                if checkpoint_path.exists()
                else "no checkpoint was written yet: run it again"
            )
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"ended by SystemExit({exc.code!r})"
            _final_status(status_path, "interrupted", checkpointed[0], f"{why}; {then}")
            raise
        except BaseException as exc:  # anything else: the run failed, and status.json says why
            bar.close()
            _final_status(status_path, "failed", checkpointed[0], f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if clients is not None:
                clients.close()
    bar.close()
    if code == EXIT_OK and settings.last_round == settings.rounds:
        status = {"status": "completed", "round": settings.rounds}
    elif code == EXIT_OK:
        status = {
            "status": "stopped",
            "round": settings.last_round,
            "message": f"stopped after round {settings.stop_at} as asked (stop_at); resume goes on",
        }
    if history:  # before the final status, which tells a watcher the run directory is complete
        try_plot_run(history, run_dir / "curves.png", title=title)
    write_json(status_path, status)
    return Result(
        status["status"],
        code,
        checkpointed[0] if code != EXIT_OK else status["round"],
        history,
        server,
        algorithm,
        run_dir,
        status.get("message", ""),
    )


def _final_status(path: Path, state: str, round_: int, message: str) -> None:
    """The last status of a run that ended early; a disk that refuses even this leaves the exception to say why."""
    try:
        write_json(path, {"status": state, "round": round_, "message": message})
    except OSError:
        pass


class Interrupted(KeyboardInterrupt):
    """A signal ended the run (`signum`); the CLI exits with 128 + signum, as a shell reports it."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Within the block a SIGTERM (what `kill` and most job schedulers send) raises KeyboardInterrupt, like Ctrl-C,
    so the run says it was interrupted; only in the main thread, where Python delivers signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _clients_done_callback(bar: Any, total: int, began: float) -> Callable[[int], None]:
    """A round's client-done callback: shows "client i/total" on the bar, at most every 0.2 s (not a terminal write
    per client: there may be thousands)."""
    finished, shown = 0, began

    def on_done(k: int) -> None:
        nonlocal finished, shown
        finished += 1
        if time.perf_counter() - shown > 0.2:
            bar.set_postfix_str(f"client {finished}/{total}")
            shown = time.perf_counter()

    return on_done


def _rounds(
    federation: Federation,
    settings: Settings,
    algorithm: Algorithm,
    clients: ClientRunner,
    ids: list[int],
    start: int,
    server: Any,
    history: list,
    bar: Any,
    run_dir: Path,
    checkpointed: list[int],
    on_round: Callable[[dict], None] | None,
    identity: dict,
) -> tuple[int, dict, Any]:
    """Rounds start+1 … settings.last_round; returns (exit code, last status, server state of the last good round)
    and keeps the round of the last checkpoint written in checkpointed[0] (for the messages of a failure or an
    interruption)."""
    metrics_path, checkpoint_path, status_path = (
        run_dir / "metrics.jsonl",
        run_dir / "checkpoint.pt",
        run_dir / "status.json",
    )
    status: dict[str, Any] = {"status": "running", "round": start}
    for round_ in range(start + 1, settings.last_round + 1):
        began = time.perf_counter()
        chosen = participants(ids, settings.participation, settings.seed, round_)
        on_done = _clients_done_callback(bar, len(chosen), began)
        try:
            replies = clients.train(round_, algorithm.broadcast(server), chosen, on_done)
            new_server, server_info = algorithm.server_update(server, replies)
        except BREAKDOWNS as exc:
            return EXIT_DIVERGED, _diverged(round_, str(exc)), server
        seconds = time.perf_counter() - began
        began = time.perf_counter()
        results = evaluate(
            federation.model,
            algorithm.posterior(new_server),
            federation.eval_X,
            federation.eval_y,
            likelihood=federation.likelihood,
            samples=settings.eval_samples,
            generator=generator_for(settings.seed, round_, EVALUATION),
            extra=federation.metrics,
        )
        line = metrics_line(round_, results, seconds, time.perf_counter() - began, len(replies), federation.eval_set)
        if len(replies) < len(chosen):  # a runner that reaches clients over a network may miss some (Flower)
            line["absent_clients"] = [k for k in chosen if k not in replies]
        if not all(math.isfinite(v) for v in results.values()):
            return EXIT_DIVERGED, _diverged(round_, f"non-finite {federation.eval_set} metrics {results}"), server
        server = new_server
        line.update({f"server_{k}": v for k, v in info_scalars(server_info).items()})
        line.update(_mean_client_info(clients.last_info))
        _append_line(metrics_path, line)
        if round_ % settings.checkpoint_every == 0 or round_ == settings.last_round:
            _save_checkpoint(checkpoint_path, round_, server, clients, identity)  # a resume redoes the rounds after it
            checkpointed[0] = round_
        history.append(line)
        status = {"status": "running", "round": round_}
        write_json(status_path, status)
        bar.set_postfix_str(_headline(line, federation.eval_set))
        bar.update(1)
        if on_round is not None:
            on_round(line)
    return EXIT_OK, status, server


def _append_line(path: Path, line: Mapping[str, Any]) -> None:
    """`line` as a line of JSON at the end of `path`; a write that fails (a full disk) leaves the file as it was and
    is an OSError naming it (a file object's own says only "No space left on device")."""
    data = memoryview((json.dumps(line) + "\n").encode())
    with open(path, "ab", buffering=0) as f:  # unbuffered: nothing is left to fail again when the file is closed
        size = f.tell()
        try:
            while data:
                data = data[f.write(data) :]
        except OSError as exc:
            with contextlib.suppress(OSError):
                f.truncate(size)  # no torn last line
            raise OSError(exc.errno, f"could not write {path}: {exc.strerror or exc}") from exc


def _diverged(round_: int, reason: str) -> dict:
    return {"status": "diverged", "round": round_ - 1, "message": f"round {round_}: {reason}"}


def _mean_client_info(infos: Mapping[int, Mapping[str, float]]) -> dict[str, float]:
    """`client_<key>`: the mean over this round's participants of each scalar their info records share."""
    if not infos:
        return {}
    keys = set.intersection(*(set(info) for info in infos.values()))
    ordered = [infos[k] for k in sorted(infos)]  # in id order: the sum must not depend on which worker replied first
    return {f"client_{key}": sum(info[key] for info in ordered) / len(ordered) for key in sorted(keys)}


def _headline(line: Mapping[str, Any], eval_set: str) -> str:
    for key, label, scale in (("acc", "acc", 100), ("rmse", "rmse", 1), ("nll", "nll", 1)):
        for name in (f"ens_{eval_set}_{key}", f"{eval_set}_{key}"):
            if name in line:
                return f"{label} {scale * line[name]:.1f}%" if scale == 100 else f"{label} {line[name]:.4g}"
    return ""


def _progress(settings: Settings, start: int, enabled: bool, title: str):
    from tqdm import tqdm

    return tqdm(
        total=settings.last_round,
        initial=start,
        desc=title or "rounds",
        unit="round",
        disable=not enabled,
        dynamic_ncols=True,
        file=sys.stderr,
    )
