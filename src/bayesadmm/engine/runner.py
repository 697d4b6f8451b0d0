"""The federated run: data → split → model → algorithm → rounds → metrics, checkpoints and a plot.

One round: sample the participating clients, broadcast, run each participant's `client_update` with the generator
of (seed, round, client), `server_update`, evaluate the server's posterior on the test set (at its mean and, for
Gaussian posteriors, the predictive over `eval_samples` draws), append a line to metrics.jsonl, checkpoint.

Every random choice comes from a generator derived from (seed, round, client) (`simulate.generator_for`; client
ids from 10⁹ on are the engine's own streams), and nothing uses torch's global RNG, so `resume` after a kill
continues with exactly the numbers an uninterrupted run would have produced.

Files in the run directory: config.json (resolved config), metrics.jsonl (one JSON object per round), checkpoint.pt
(the state after the last checkpointed round: every round by default, `checkpoint_every`), client-states/ (with
parallel workers: the client states of that checkpoint, one shard file per worker, named in checkpoint.pt),
status.json (running / stopped / completed / diverged / interrupted, with the reason), partition.json and labels.png
(the client split), curves.png (accuracy and NLL per round), environment.json (code version, torch, processor: one
record per start or resume, `provenance`). A checkpoint is written shards first, checkpoint.pt last, each under a
temporary name and renamed when complete, so a kill at any point leaves the previous checkpoint whole.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from bayesadmm.algorithms import REGISTRY, Algorithm, DivergenceError
from bayesadmm.engine.provenance import record_environment
from bayesadmm.engine.simulate import generator_for
from bayesadmm.engine.workers import client_runner, default_workers, remove_stale_shards
from bayesadmm.experiments.config import RunConfig
from bayesadmm.metrics import evaluate
from bayesadmm.models import FlatModel, make_model
from bayesadmm.problems.neural import ClassificationData
from bayesadmm.solvers.von import SubproblemError

# The engine's own random streams: generator_for(seed, 0, <id>) for set-up, generator_for(seed, round, <id>) per round.
SUBSAMPLE, PARTITION, INIT, PARTICIPANTS, EVALUATION, VALIDATION = (10**9 + i for i in range(6))
BREAKDOWNS = (DivergenceError, SubproblemError, FloatingPointError)

EXIT_OK, EXIT_FAILED, EXIT_DIVERGED = 0, 1, 3


@dataclass
class Experiment:
    config: RunConfig
    model: FlatModel
    clients: dict[int, ClassificationData]
    X_test: Tensor
    y_test: Tensor
    algorithm: Algorithm
    theta0: Tensor
    parts: list[Tensor]
    train_labels: Tensor
    num_classes: int
    train_X: Tensor                         # the clients' examples, client by client (each client's data is a view)
    train_y: Tensor
    slices: dict[int, tuple[int, int]]      # client k's rows of train_X / train_y


def load_data(config: RunConfig) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """Training and test inputs as floats (raw 0–255 or scaled to [0, 1]), labels, and the number of classes."""
    data_dir = config.data_dir or None
    if config.dataset in ("fashion-mnist", "mnist"):
        from bayesadmm.data import load_image_dataset
        X, y = load_image_dataset(config.dataset, "train", data_dir=data_dir)
        X_test, y_test = load_image_dataset(config.dataset, "test", data_dir=data_dir)
        num_classes = 10
    elif config.dataset in ("cifar10", "cifar100"):
        from bayesadmm.data import load_cifar
        X, y = load_cifar(config.dataset, "train", data_dir=data_dir)
        X_test, y_test = load_cifar(config.dataset, "test", data_dir=data_dir)
        num_classes = 10 if config.dataset == "cifar10" else 100
    else:
        raise ValueError(f"unknown dataset {config.dataset!r}; valid: fashion-mnist, mnist, cifar10, cifar100")
    scale = 1.0 if config.preprocessing == "raw" else 1.0 / 255.0
    return X.float() * scale, y, X_test.float() * scale, y_test, num_classes


def build(config: RunConfig) -> Experiment:
    """Everything a run needs, deterministically from the config."""
    from bayesadmm.data.partitions import make_partition, subsample

    X, y, X_test, y_test, num_classes = load_data(config)
    if config.data_fraction < 1.0:
        keep = subsample(len(y), config.data_fraction, generator_for(config.seed, 0, SUBSAMPLE))
        X, y = X[keep], y[keep]
    if config.validation > 0:
        # Hold out part of the training set and evaluate on it instead of the test set: for choosing
        # hyperparameters without looking at the test set. The metrics are then named val_* (not test_*).
        order = torch.randperm(len(y), generator=generator_for(config.seed, 0, VALIDATION))
        held = max(1, round(config.validation * len(y)))
        val_idx, train_idx = order[:held].sort().values, order[held:].sort().values
        X_test, y_test = X[val_idx], y[val_idx]
        X, y = X[train_idx], y[train_idx]
    options = {"two-level-dirichlet": {"alpha1": config.alpha1, "alpha2": config.alpha2},
               "per-class-dirichlet": {"alpha": config.alpha2},
               "classes-per-client": {"classes": config.classes_per_client, "per_class": config.per_class},
               "shards": {"classes": config.classes_per_client, "per_class": config.per_class},
               }.get(config.partition, {})
    parts = make_partition(config.partition, y, config.clients, generator_for(config.seed, 0, PARTITION), **options)
    in_shape = {"mlp": {"in_features": int(X[0].numel()), "num_classes": num_classes},
                "logistic": {"in_features": int(X[0].numel()), "num_classes": num_classes}}
    model = make_model(config.model, **in_shape.get(config.model, {"num_classes": num_classes}))
    device = torch.device(config.device)
    # One client-ordered copy of the training set, each client a view of its rows: parallel workers then share
    # two tensors instead of two per client, and every execution path sees the same memory layout.
    order = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    train_X, train_y = X[order].to(device), y[order].to(device)
    bounds = torch.tensor([0] + [len(idx) for idx in parts]).cumsum(0).tolist()
    slices = {k: (bounds[k], bounds[k + 1]) for k in range(len(parts))}
    clients = {k: ClassificationData(model, train_X[a:b], train_y[a:b]) for k, (a, b) in slices.items()}
    theta0 = model.initial_params(generator_for(config.seed, 0, INIT)).to(device)
    algorithm = make_algorithm(config, model, {k: d.num_examples for k, d in clients.items()})
    return Experiment(config, model, clients, X_test.to(device), y_test.to(device), algorithm, theta0, parts, y,
                      num_classes, train_X, train_y, slices)


def make_algorithm(config: RunConfig, model: FlatModel, client_sizes: dict[int, int]) -> Algorithm:
    """The registry factory called with the configured hyperparameters plus what the engine knows."""
    factory = REGISTRY[config.method]
    accepted = inspect.signature(factory).parameters
    kwargs = {k: v for k, v in config.hparams.items() if k != "cosine"}
    supplied = {"dim": model.dim, "model": model, "num_clients": config.clients, "client_sizes": client_sizes,
                "cosine_rounds": config.rounds if config.hparams.get("cosine") else None}
    kwargs.update({k: v for k, v in supplied.items() if k in accepted})
    return factory(**kwargs)


def participants(config: RunConfig, round_: int) -> list[int]:
    """The clients that take part in `round_` (all, or a seeded random fraction)."""
    if config.participation >= 1.0:
        return list(range(config.clients))
    count = max(1, math.ceil(config.participation * config.clients))
    order = torch.randperm(config.clients, generator=generator_for(config.seed, round_, PARTICIPANTS))
    return sorted(order[:count].tolist())


def _write_json(path: Path, payload) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)


def _save_checkpoint(path: Path, round_: int, server, clients) -> None:
    """checkpoint.pt: the round, the server state and the record of the client states (`clients.save`: the states, or
    the shard files the workers have just written). Written last and renamed into place, so that it only ever names a
    complete state; the shards it does not name are deleted after."""
    record = clients.save(path.parent, round_)
    tmp = path.with_suffix(".tmp")
    torch.save({"round": round_, "server": server, **record}, tmp)
    os.replace(tmp, path)  # never a half-written checkpoint
    remove_stale_shards(path.parent, record)


def _metrics_line(round_: int, results: dict, seconds: float, eval_seconds: float, count: int,
                  eval_set: str = "test") -> dict:
    line = {"round": round_}
    for key, value in results.items():
        line[f"ens_{eval_set}_{key[4:]}" if key.startswith("ens_") else f"{eval_set}_{key}"] = value
    line.update({"seconds": seconds, "eval_seconds": eval_seconds, "participants": count})
    return line


def _read_metrics(path: Path, up_to: int) -> list[dict]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if line["round"] <= up_to]


def run(config: RunConfig, resume: bool = False, progress: bool = True) -> int:
    """Run (or resume) the configured experiment; returns the exit code."""
    from bayesadmm.reports import try_plot_run

    run_dir = config.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    status_path, metrics_path, checkpoint_path = (run_dir / "status.json", run_dir / "metrics.jsonl",
                                                   run_dir / "checkpoint.pt")
    experiment = build(config)
    algorithm = experiment.algorithm
    checkpoint = torch.load(checkpoint_path, weights_only=False) if resume and checkpoint_path.exists() else None
    start = checkpoint["round"] if checkpoint is not None else 0
    if checkpoint is None:
        _write_json(run_dir / "config.json", config.to_json())
        _write_json(run_dir / "partition.json", {"clients": [idx.tolist() for idx in experiment.parts]})
        try:
            from bayesadmm.data.partitions import plot_label_distribution
            plot_label_distribution(experiment.train_labels, experiment.parts, experiment.num_classes,
                                    run_dir / "labels.png", title=f"{config.scenario}: labels per client")
        except Exception as exc:  # a plot is never worth losing a run
            print(f"warning: could not plot the label distribution: {exc}", file=sys.stderr)
    record_environment(run_dir, config.device, start)
    history = _read_metrics(metrics_path, start)
    metrics_path.write_text("".join(json.dumps(line) + "\n" for line in history))  # drop rounds after the checkpoint

    bar = _progress(config, start, progress)
    status = {"status": "running", "round": start}
    _write_json(status_path, status)
    # workers=0: one per core on the CPU; one on a GPU, where every worker process would hold a CUDA context and a
    # copy of the training set of its own and the processes would take turns on the one device
    workers = config.workers or (default_workers() if torch.device(config.device).type == "cpu" else 1)
    checkpointed = [start]   # the round of the last checkpoint written, kept up to date by _rounds
    clients = client_runner(config, experiment, min(workers, _max_participants(config)))
    with _sigterm_as_interrupt():   # from here on a kill is reported as an interruption
        try:
            if checkpoint is None:
                server = algorithm.init_server(experiment.theta0)
                clients.start(server)
                _save_checkpoint(checkpoint_path, 0, server, clients)  # a stop in round 1 still leaves a state
            else:
                server = checkpoint["server"]
                clients.restore(checkpoint, run_dir)
                remove_stale_shards(run_dir, checkpoint)   # those of a checkpoint the kill did not let finish
                del checkpoint   # the states now live in `clients`
            code, status = _rounds(config, experiment, clients, start, server, history, bar, run_dir,
                                   checkpointed)
        except KeyboardInterrupt:   # Ctrl-C, or a SIGTERM: say so, so that a watcher does not wait for a dead run
            bar.close()
            then = (f"`bayesadmm resume {run_dir}` goes on from the checkpoint of round {checkpointed[0]}"
                    if checkpoint_path.exists() else "no checkpoint was written yet: run it again")
            _write_json(status_path, {"status": "interrupted", "round": checkpointed[0],
                                      "message": f"interrupted; {then}"})
            raise
        finally:
            clients.close()
    bar.close()
    if code == EXIT_OK and _last_round(config) == config.rounds:
        status = {"status": "completed", "round": config.rounds}
    elif code == EXIT_OK:
        status = {"status": "stopped", "round": _last_round(config),
                  "message": f"stopped after round {config.stop_at} as asked (stop_at); `bayesadmm resume` goes on"}
    else:
        print(f"stopped: {status['message']} (state of round {checkpointed[0]} is in {checkpoint_path})",
              file=sys.stderr)
    if history:   # before the final status, which tells a watcher the run directory is complete
        try_plot_run(history, run_dir / "curves.png",
                     title=f"{config.scenario} — {config.method} (seed {config.seed})")
    _write_json(status_path, status)
    return code


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Within the block a SIGTERM (what `kill` and most job schedulers send) raises KeyboardInterrupt, like Ctrl-C,
    so the run says it was interrupted; only in the main thread, where Python delivers signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _last_round(config: RunConfig) -> int:
    return min(config.stop_at, config.rounds) if config.stop_at else config.rounds


def _max_participants(config: RunConfig) -> int:
    return len(participants(config, 1))


def _rounds(config: RunConfig, experiment: Experiment, clients, start: int, server, history: list,
            bar, run_dir: Path, checkpointed: list[int]) -> tuple[int, dict]:
    """Rounds start+1 … config.rounds; returns (exit code, last status) and keeps the round of the last checkpoint
    written in checkpointed[0] (for the messages of a failure or an interruption)."""
    algorithm = experiment.algorithm
    metrics_path, checkpoint_path, status_path = (run_dir / "metrics.jsonl", run_dir / "checkpoint.pt",
                                                   run_dir / "status.json")
    status = {"status": "running", "round": start}
    for round_ in range(start + 1, _last_round(config) + 1):
        began = time.perf_counter()
        chosen = participants(config, round_)
        finished, shown = [], [began]

        def on_done(k: int) -> None:
            finished.append(k)
            if time.perf_counter() - shown[0] > 0.2:   # not a terminal write per client: there may be thousands
                bar.set_postfix_str(f"client {len(finished)}/{len(chosen)}")
                shown[0] = time.perf_counter()

        try:
            replies = clients.train(round_, algorithm.broadcast(server), chosen, on_done)
            server, _ = algorithm.server_update(server, replies)
        except BREAKDOWNS as exc:
            return EXIT_DIVERGED, {"status": "diverged", "round": round_ - 1, "message": f"round {round_}: {exc}"}
        seconds = time.perf_counter() - began
        began = time.perf_counter()
        results = evaluate(experiment.model, algorithm.posterior(server), experiment.X_test, experiment.y_test,
                           samples=config.eval_samples, generator=generator_for(config.seed, round_, EVALUATION))
        line = _metrics_line(round_, results, seconds, time.perf_counter() - began, len(chosen),
                             "val" if config.validation > 0 else "test")
        if not all(math.isfinite(v) for v in results.values()):
            return (EXIT_DIVERGED, {"status": "diverged", "round": round_ - 1,
                                    "message": f"round {round_}: non-finite test metrics {results}"})
        with metrics_path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        if round_ % config.checkpoint_every == 0 or round_ == _last_round(config):
            _save_checkpoint(checkpoint_path, round_, server, clients)   # a resume redoes the rounds after it
            checkpointed[0] = round_
        history.append(line)
        status = {"status": "running", "round": round_}
        _write_json(status_path, status)
        acc = next(line[key] for key in ("ens_test_acc", "test_acc", "ens_val_acc", "val_acc") if key in line)
        bar.set_postfix_str(f"acc {100 * acc:.1f}%")
        bar.update(1)
    return EXIT_OK, status


def _progress(config: RunConfig, start: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=_last_round(config), initial=start, desc=f"{config.method} rounds", unit="round",
                disable=not enabled, dynamic_ncols=True, file=sys.stderr)
