"""The client updates of a round: in this process (`LocalClients`) or in parallel worker processes (`ClientPool`).

Both run the same function, `train_client`, with one torch thread and the generator of (seed, round, client), on the
same data (client k's examples are the same slice of one client-ordered training tensor in both), so a run gives
the same numbers whatever the number of workers. One thread per client update is also the fast choice here: the
minibatch matrices are small, and two processes each asking for several threads on two cores slow every
elementwise kernel down many times over.

Workers are started once per run with the "spawn" method (safe with CUDA and with torch's thread pools, unlike
fork). The training data go to them once, in shared memory, not copied per worker; each worker rebuilds the model and
the algorithm from the run's config (an `Algorithm` is a tuple of closures and does not pickle). Per round, each task
carries a client's state and the broadcast as `torch.save` bytes (the broadcast serialised once per round, unpacked
once per worker per round; bytes avoid one shared-memory file per tensor), and returns the new state and the reply. Tasks are submitted largest client first so that the slowest client does not start last.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, Callable, Mapping, Sequence

import torch

from bayesadmm.algorithms.base import Algorithm, Message
from bayesadmm.engine.simulate import generator_for


def default_workers() -> int:
    """The number of cores this process may use (or $BAYESADMM_WORKERS)."""
    if os.environ.get("BAYESADMM_WORKERS"):
        return max(1, int(os.environ["BAYESADMM_WORKERS"]))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@contextmanager
def one_thread():
    """torch on one intra-op thread inside the block (the caller's setting is restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_client(algorithm: Algorithm, state, message: Message, data, seed: int, round_: int,
                 client: int) -> tuple[Any, Message]:
    """One client's update, exactly as every execution path runs it. The generator is a CPU one whatever the device
    (`bayesadmm.rng` draws on it and moves the numbers), so a GPU run consumes the same random numbers."""
    with one_thread():
        state, reply, _ = algorithm.client_update(state, message, data, generator_for(seed, round_, client))
    return state, reply


class LocalClients:
    """Client updates one after the other in this process."""

    def __init__(self, algorithm: Algorithm, clients: Mapping[int, Any], seed: int):
        self.algorithm, self.clients, self.seed = algorithm, clients, seed

    def train(self, round_: int, message: Message, states: Mapping[int, Any],
              on_done: Callable[[int], None] | None = None) -> tuple[dict, dict]:
        new_states, replies = {}, {}
        for k in states:
            new_states[k], replies[k] = train_client(self.algorithm, states[k], message, self.clients[k], self.seed,
                                                     round_, k)
            if on_done is not None:
                on_done(k)
        return new_states, replies

    def close(self) -> None:
        pass


def _dumps(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _loads(payload: bytes):
    return torch.load(io.BytesIO(payload), weights_only=False)


# ---- inside a worker process ----------------------------------------------------------------------------------------
_WORKER: dict = {}


def _init_worker(config_json: dict, model, train_X: torch.Tensor, train_y: torch.Tensor,
                 slices: Mapping[int, tuple[int, int]], default_dtype: torch.dtype) -> None:
    from bayesadmm.engine.runner import make_algorithm
    from bayesadmm.experiments.config import RunConfig
    from bayesadmm.problems.neural import ClassificationData

    torch.set_num_threads(1)
    torch.set_default_dtype(default_dtype)   # as in the parent, so that tensors made without a dtype agree
    config = RunConfig(**config_json)
    device = torch.device(config.device)
    X, y = train_X.to(device), train_y.to(device)   # no copy on the CPU: views of the shared tensors
    clients = {k: ClassificationData(model, X[a:b], y[a:b]) for k, (a, b) in slices.items()}
    _WORKER.update(algorithm=make_algorithm(config, model, {k: d.num_examples for k, d in clients.items()}),
                   clients=clients, seed=config.seed)


def _worker_task(client: int, round_: int, state: bytes, message: bytes) -> bytes:
    w = _WORKER
    if w.get("round") != round_:   # the broadcast is the same for every client of a round: unpack it once
        w.update(round=round_, message=_loads(message))
    return _dumps(train_client(w["algorithm"], _loads(state), w["message"], w["clients"][client], w["seed"], round_,
                               client))


class ClientPool:
    """Client updates in `workers` processes, each on one thread, sharing the training data."""

    def __init__(self, config, model, train_X: torch.Tensor, train_y: torch.Tensor,
                 slices: Mapping[int, tuple[int, int]], workers: int):
        if workers < 2:
            raise ValueError(f"ClientPool needs at least 2 workers, got {workers} (use LocalClients)")
        shared_X, shared_y = train_X.cpu().share_memory_(), train_y.cpu().share_memory_()
        self.sizes = {k: b - a for k, (a, b) in slices.items()}
        context = torch.multiprocessing.get_context("spawn")
        self.executor = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                                            initargs=(config.to_json(), model, shared_X, shared_y, dict(slices),
                                                      torch.get_default_dtype()))

    def train(self, round_: int, message: Message, states: Mapping[int, Any],
              on_done: Callable[[int], None] | None = None) -> tuple[dict, dict]:
        broadcast = _dumps({key: value.cpu() for key, value in message.items()})   # serialised once per round
        order = sorted(states, key=lambda k: -self.sizes[k])
        futures = {self.executor.submit(_worker_task, k, round_, _dumps(states[k]), broadcast): k for k in order}
        results: dict[int, tuple] = {}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for future in done:
                    k = futures[future]
                    results[k] = _loads(future.result())   # re-raises the worker's exception
                    if on_done is not None:
                        on_done(k)
        except BaseException:
            for future in pending:
                future.cancel()
            raise
        # in the caller's order, so that everything downstream sees the same order as a sequential run
        return {k: results[k][0] for k in states}, {k: results[k][1] for k in states}

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


def client_runner(config, experiment, workers: int) -> LocalClients | ClientPool:
    """Sequential for one worker (or one participant), a process pool otherwise."""
    if workers <= 1:
        return LocalClients(experiment.algorithm, experiment.clients, config.seed)
    return ClientPool(config, experiment.model, experiment.train_X, experiment.train_y, experiment.slices, workers)


__all__: Sequence[str] = ["LocalClients", "ClientPool", "client_runner", "train_client", "default_workers",
                          "one_thread"]
