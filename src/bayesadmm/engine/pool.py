"""The clients of a run in worker processes (`ClientPool`), each keeping the states of the clients it trains, and
`client_runner`, which picks the runner of a run: `LocalClients`, `CohortClients` or a `ClientPool`.

Both kinds of runner hold the states of their clients from round to round and run the same function, `train_client`,
on one torch thread with the generator of (seed, round, client) and on the same data (client k's examples are the same
slice of one client-ordered training tensor in both), so a run gives the same numbers whatever the number of workers.
One thread per client update is also the fast choice here: the minibatch matrices are small, and two processes each
asking for several threads on two cores slow every elementwise kernel down many times over.

The pool keeps clients where they are (sticky clients). Each client belongs to one worker for the whole run, by a
static assignment that balances the workers' numbers of examples (`policy.assign`: longest processing time first).
Workers are started once per run with the "spawn" method (safe with CUDA and with torch's thread pools, unlike fork);
the algorithm's factory and the client source go to each of them once, pickled (an `Algorithm` is a tuple of closures
and does not pickle; its factory does; for `TensorClients` torch pickles the training set into shared memory), and
each builds the algorithm and its own clients' data and creates or loads their states. Per round, the broadcast goes
once to each worker with the list of its clients that take part (`transport.Train`, the tensors as raw bytes through
the pipe, no serialisation); the worker trains them one after the other and hands over each reply as soon as it has
it, through a shared-memory arena of reply slots (`_train`: one copy into the slot, one copy out in the parent, and
only a few hundred bytes through the pipe). The parent sends nothing while a round runs (it frees a slot by counting
its copy in a semaphore), so neither side can wait on a send while the other waits on its own, whatever the number
and size of the replies. Client states never travel, except when asked for (`states()`, for tests and tools) or when
a resume hands a worker states written by another layout. If a client update fails in a worker (a breakdown), or a
worker dies, the other workers finish the round before the parent raises the error, so that the pool closes cleanly.
A reply whose record is malformed (a client not asked for, a layout outside the arena) or a round in which no worker
has sent anything for `STALL_SECONDS` ends at once with an error naming the worker. The requests and answers are
`engine.transport`'s typed records.
"""

from __future__ import annotations

import multiprocessing
import signal
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, cast

import torch

from bayesadmm.algorithms.base import Algorithm, Message, trains_in_cohorts
from bayesadmm.engine import transport
from bayesadmm.engine.cohort import local_runner
from bayesadmm.engine.policy import assign, cohort_blocks
from bayesadmm.engine.processes import keep_freed_memory as _keep_freed_memory
from bayesadmm.engine.processes import start_worker as _start
from bayesadmm.engine.rundir import SHARDS, real_folder
from bayesadmm.engine.runners import LocalClients, checkpointed_states, initial_states
from bayesadmm.engine.store import StoreSpec
from bayesadmm.engine.transport import (
    CLOSE,
    DONE,
    Error,
    Load,
    Ok,
    Put,
    Reply,
    Save,
    Start,
    Train,
    check_reply,
    dumps,
    layout_bytes,
    loads,
    payload,
    read_arena,
    receive_tensors,
    send_tensors,
    write_arena,
)

__all__ = ["ClientPool", "client_runner", "local_runner", "STALL_SECONDS"]

# A round in which no worker has sent anything for this long ends with an error naming the workers it waits for:
# generous, since a worker sends nothing while it trains one unit (a client, or a cohort of them).
STALL_SECONDS = 30 * 60.0
# the usual cause of a worker that dies at once, which its own traceback (on stderr) names less plainly: each worker
# process imports the user's script, and one that starts a run at its top level then starts it again in the worker
UNGUARDED = (
    "; if it died as it started (its traceback above), and your script starts the run at its top level, put that "
    'under if __name__ == "__main__": (each worker process imports your script), or use workers=1'
)
PARENT_CHECK_SECONDS = 1.0  # how often a worker that waits for a free slot checks that the parent is still there


# ---- inside a worker process ----------------------------------------------------------------------------------------


def _worker(
    connection,
    arena: torch.Tensor,
    copied,
    make_algorithm: Callable[[], Algorithm],
    source: Callable[[int], Any],
    seed: int,
    group: list[int],
    default_dtype: torch.dtype,
    cohort_size: int = 0,
    blocks: list[list[int]] | None = None,
    store: StoreSpec | None = None,
) -> None:
    """A worker's life: build its clients, then answer the parent's requests until `CLOSE` (or the parent is gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent handles it
    _keep_freed_memory()
    torch.set_num_threads(1)
    torch.set_default_dtype(default_dtype)  # as in the parent, so that tensors made without a dtype agree
    local = local_runner(make_algorithm(), {k: source(k) for k in group}, source, seed, cohort_size, blocks, store)
    while True:
        try:
            request = connection.recv()
        except EOFError:  # the parent is gone
            return
        if request == CLOSE:
            return
        try:
            if isinstance(request, Train):
                message = receive_tensors(connection, request.layout)
                _train(connection, arena, copied, local, request.round, message, request.chosen)
                connection.send(DONE)
            else:
                connection.send(Ok(_handle(local, request)))
        except Exception as exc:  # noqa: BLE001 — every failure goes to the parent, which raises it
            text = traceback.format_exc()
            try:
                connection.send(Error(exc, text))
            except Exception:  # noqa: BLE001 — an exception that does not pickle
                connection.send(Error(RuntimeError(f"{type(exc).__name__}: {exc}"), text))


def _handle(local: LocalClients, request: Start | Put | Load | Save) -> Any:
    """Carry out a request other than `Train` in the worker; its result for the parent."""
    if isinstance(request, Start):
        return local.start(loads(request.server))
    if isinstance(request, Put):
        return local.restore({"clients": loads(request.states)}, Path("."))
    if isinstance(request, Load):
        initial = None if request.initial is None else loads(request.initial)
        return local.restore({"shards": request.shards, "initial": initial}, request.run_dir)
    if isinstance(request, Save):
        return local.write_shard(request.path)
    raise TypeError(f"unknown request {request!r}")


def _train(
    connection, arena: torch.Tensor, copied, local: LocalClients, round_: int, message: Message, chosen: list[int]
) -> None:
    """Train the chosen clients in turn and hand over each reply as soon as it is made.

    A reply goes into the next slot of the worker's shared arena, and only its layout and offset through the pipe: the
    parent copies it out and counts the copy in the semaphore `copied`, and slot i is written again only once the
    reply that used it before has been copied (the parent is usually many replies ahead of that). The slots are as
    large as the round's first reply; a reply that does not fit (or replies larger than the arena) go through the pipe
    instead. The parent sends nothing during a round and reads whatever comes, and this worker waits only for the
    parent to read what it has sent already (a full pipe, every slot full): no circle of waits, for any number of
    replies of any size.
    """
    while copied.acquire(block=False):  # the copies of the last round's replies, all counted before this round began
        pass
    slot_bytes = slots = 0
    sent = freed = 0  # replies through slots, and copies of them counted, this round
    for k, reply, info in _replies(local, round_, message, chosen):
        layout, tensors = payload(reply)
        nbytes = layout_bytes(layout)
        if slot_bytes == 0 and nbytes > 0:
            slot_bytes, slots = nbytes, arena.numel() // nbytes
        if slots == 0 or nbytes > slot_bytes:
            send_tensors(connection, Reply(k, None, info, layout), tensors)
            continue
        while sent - freed >= slots:  # every slot holds a reply the parent has not copied yet
            _wait_for_copy(copied)
            freed += 1  # the parent copies a worker's replies in the order they were sent
        offset = (sent % slots) * slot_bytes
        write_arena(arena, offset, tensors)
        connection.send(Reply(k, offset, info, layout))
        sent += 1


def _wait_for_copy(copied) -> None:
    """Wait until the parent has copied one more reply out of the arena; end the worker if the parent is gone."""
    parent = multiprocessing.parent_process()
    while not copied.acquire(timeout=PARENT_CHECK_SECONDS):
        if parent is not None and not parent.is_alive():
            raise SystemExit(1)


def _replies(local: LocalClients, round_: int, message: Message, chosen: list[int]):
    """(client, reply, info) of the chosen clients, as each of `local`'s units (a client, or a cohort) is done."""
    for unit in local.units(chosen):
        replies = local.train(round_, message, unit)
        info = local.last_info
        for k in unit:
            yield k, replies[k], info[k]


# ---- in the parent --------------------------------------------------------------------------------------------------


class ClientPool:
    """The clients' states and updates in `workers` processes, each on one thread, sharing the training data; each
    client stays in the worker it was assigned to (`assign`)."""

    def __init__(
        self,
        make_algorithm: Callable[[], Algorithm],
        source,
        seed: int,
        workers: int,
        cohort_size: int = 0,
        store: StoreSpec | None = None,
        participation: float = 1.0,
        stall_seconds: float | None = None,
    ):
        if workers < 2:
            raise ValueError(f"ClientPool needs at least 2 workers, got {workers} (use LocalClients)")
        sizes = dict(source.sizes)
        layout = cohort_blocks(sizes, cohort_size, participation) if cohort_size > 0 else None
        self.groups = assign(sizes, workers, layout)
        self.owner = {k: index for index, group in enumerate(self.groups) for k in group}
        self.last_info: dict[int, dict[str, float]] = {}
        self.store, self.make_algorithm = store, make_algorithm
        self.initial_server: Any = None  # what the clients a disk store never wrote start from
        self.stall_seconds = STALL_SECONDS if stall_seconds is None else stall_seconds
        context = torch.multiprocessing.get_context("spawn")
        self.connections, self.processes, self.arenas, self.copied = [], [], [], []
        self._in_round = False  # True from sending a round's work until every worker has finished it
        try:
            for index, group in enumerate(self.groups):
                parent_end, child_end = context.Pipe()
                arena = torch.empty(transport.ARENA_BYTES, dtype=torch.uint8).share_memory_()
                copied = context.Semaphore(0)  # replies copied out of the arena: slots the worker may write again
                process = context.Process(
                    target=_worker,
                    name=f"bayesadmm-worker-{index}",
                    args=(
                        child_end,
                        arena,
                        copied,
                        make_algorithm,
                        source,
                        seed,
                        group,
                        torch.get_default_dtype(),
                        cohort_size,
                        None if layout is None else [c for c in layout if self.owner[c[0]] == index],
                        store,
                    ),
                )
                _start(process)
                child_end.close()
                self.connections.append(parent_end)
                self.processes.append(process)
                self.arenas.append(arena)
                self.copied.append(copied)
        except BaseException:
            self.close()
            raise

    def start(self, server) -> None:
        self.initial_server = server
        self._call_all([Start(dumps(server))] * len(self.groups))

    def restore(self, checkpoint: Mapping, run_dir: Path) -> None:
        """The client states a checkpoint recorded: each worker reads the shards that hold its clients, or is handed
        its clients' states (a checkpoint written by one process)."""
        self.initial_server = checkpoint.get("initial")
        if "shards" in checkpoint:
            initial = None if self.initial_server is None else dumps(self.initial_server)
            self._call_all([Load(Path(run_dir), checkpoint["shards"], initial)] * len(self.groups))
        else:
            states = checkpoint["clients"]
            self._call_all([Put(dumps({k: states[k] for k in group})) for group in self.groups])

    def train(
        self, round_: int, message: Message, chosen: Sequence[int], on_done: Callable[[int], None] | None = None
    ) -> dict[int, Message]:
        """Update the `chosen` clients' states in their workers; returns their replies in the order of `chosen`."""
        if self._in_round:
            raise RuntimeError("the client pool stopped in the middle of a round (an error); start a new one")
        layout, tensors = payload(message)  # made once, sent to each worker
        pending: dict[int, set[int]] = {}  # by worker: its chosen clients whose replies have not come yet
        self._in_round = True
        for index in range(len(self.groups)):
            mine = [k for k in chosen if self.owner[k] == index]
            if mine:
                send_tensors(self.connections[index], Train(round_, mine, layout), tensors)
                pending[index] = set(mine)
        replies: dict[int, Message] = {}
        failure: Exception | None = None
        self.last_info = {}
        while pending:
            handles: dict[Any, int] = {self.connections[index]: index for index in pending}
            handles.update({self.processes[index].sentinel: index for index in pending})  # to see a death at once
            ready = wait(list(handles), timeout=self.stall_seconds)
            if not ready:  # (the pool stays in the round: close() stops the workers)
                raise RuntimeError(self._stalled(round_, sorted(pending)))
            for index in sorted({handles[handle] for handle in ready}):
                connection = self.connections[index]
                try:
                    if connection not in ready and not connection.poll():  # it died, and left nothing to read
                        raise self._died(index)
                    answer = self._receive(index)
                except Exception as exc:  # noqa: BLE001 — a worker failed (a breakdown) or died: it sends no more
                    failure = failure or exc  # and the others finish the round, so that the pool closes cleanly
                    del pending[index]
                    continue
                if answer == DONE:
                    missing = pending.pop(index)
                    if missing:  # (the pool stays in the round: close() stops the workers)
                        raise RuntimeError(
                            f"{self._name(index)} ended round {round_} without the replies of clients {sorted(missing)}"
                        )
                    continue
                try:  # our own code makes the replies, but an error here must name the worker, not crash later
                    reply = check_reply(answer, pending[index], self.arenas[index].numel())
                except ValueError as exc:  # (the pool stays in the round: close() stops the workers)
                    raise RuntimeError(f"{self._name(index)}, round {round_}: {exc}") from None
                k = reply.client
                pending[index].remove(k)
                self.last_info[k] = reply.info
                if reply.offset is None:  # too large for the worker's arena: the bytes follow in the pipe
                    replies[k] = receive_tensors(connection, reply.layout)
                else:
                    replies[k] = read_arena(self.arenas[index], reply.offset, reply.layout)
                    self.copied[index].release()  # the worker may write that slot again
                if on_done is not None:
                    on_done(k)
        self._in_round = False
        if failure is not None:
            raise failure
        # in the caller's order, so that everything downstream sees the same order as a sequential run
        return {k: replies[k] for k in chosen}

    def _name(self, index: int) -> str:
        return f"client worker {index} (pid {self.processes[index].pid})"

    def _died(self, index: int) -> RuntimeError:
        self.processes[index].join(timeout=5)
        return RuntimeError(f"{self._name(index)} died (exit code {self.processes[index].exitcode}){UNGUARDED}")

    def _stalled(self, round_: int, indices: list[int]) -> str:
        """Why a round ends that made no progress for `stall_seconds`: the workers it waits for."""
        codes = {index: self.processes[index].exitcode for index in indices}
        waited = "; ".join(
            f"{self._name(index)}, " + ("still running" if code is None else f"exit code {code}")
            for index, code in codes.items()
        )
        return (
            f"round {round_} made no progress: no client worker has sent anything for {self.stall_seconds:g} s, "
            f"and it waits for {waited} (a client update that does not end, or one slower than "
            f"bayesadmm.engine.pool.STALL_SECONDS allows)"
        )

    def states(self) -> dict[int, Any]:
        """Every client's current state, by client id: the workers write them as shards to a temporary directory (not
        as bytes through the pipe, which would hold several copies in memory at once) and this process reads them."""
        if self.store is not None and self.store.kind == "disk" and self.store.run_dir is not None:
            run_dir = Path(self.store.run_dir)  # the workers' disk stores: their blocks, flushed
            initial = initial_states(self.make_algorithm(), self.initial_server)
            return checkpointed_states(self.save(run_dir, 0), run_dir, sorted(self.owner), initial)
        with tempfile.TemporaryDirectory(prefix="bayesadmm-states-") as folder:
            record = self.save(Path(folder), 0)
            return checkpointed_states(record, Path(folder), sorted(self.owner))

    def save(self, run_dir: Path, round_: int) -> dict:
        """Each worker writes its clients' states to a shard file (in parallel); the checkpoint's record of them."""
        folder = real_folder(Path(run_dir) / SHARDS)
        shards = self._call_all([Save(folder / f"r{round_:06d}-w{index}.pt") for index in range(len(self.groups))])
        record = {"shards": [entry for entries in shards for entry in entries]}
        if any(entry.get("fresh") for entry in record["shards"]):
            record["initial"] = self.initial_server
        return record

    def close(self) -> None:
        """Stop the workers: asked to, or killed if in the middle of a round (an error or an interrupt)."""
        for connection in self.connections:
            if not self._in_round:
                try:
                    connection.send(CLOSE)
                except (OSError, ValueError):  # a worker that is already gone
                    pass
        for connection, process in zip(self.connections, self.processes, strict=True):
            process.join(timeout=0 if self._in_round else 60)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
            if process.is_alive():  # a worker that does not take SIGTERM (e.g. a stopped one)
                process.kill()
                process.join()
            connection.close()
        self.connections, self.processes, self.arenas, self.copied = [], [], [], []

    def _call_all(self, requests: list[tuple]) -> list:
        """Send one command to each worker, then collect the answers in worker order (all of them, so that the
        workers stay in step even if one fails; the first failure is raised after)."""
        if self._in_round:
            raise RuntimeError("the client pool stopped in the middle of a round (an error); start a new one")
        answers: list = []
        failure: Exception | None = None
        sent: list[int] = []
        for index, request in enumerate(requests):
            try:
                self.connections[index].send(request)
                sent.append(index)
            except OSError:
                failure = failure or self._died(index)
        for index in sent:
            try:
                answers.append(cast(Ok, self._receive(index)).value)
            except Exception as exc:  # noqa: BLE001
                failure = failure or exc
        if failure is not None:
            raise failure
        return answers

    def _receive(self, index: int) -> Ok | Reply | str:
        try:
            answer = self.connections[index].recv()
        except (EOFError, ConnectionResetError):  # the worker is gone: its end of the pipe closed, or reset
            raise self._died(index) from None
        if isinstance(answer, Error):
            answer.exception.add_note(f"in client worker {index}:\n{answer.traceback}")
            raise answer.exception
        return answer


def client_runner(
    make_algorithm: Callable[[], Algorithm],
    source,
    seed: int,
    workers: int,
    algorithm: Algorithm | None = None,
    cohort_size: int = 0,
    store: StoreSpec | None = None,
    participation: float = 1.0,
) -> LocalClients | ClientPool:
    """The clients of `source` in this process for one worker (or one participant), with `algorithm` (made by
    `make_algorithm` if not given), or in a pool of `workers` processes otherwise. With `cohort_size` > 0, the
    clients of a round are trained up to `cohort_size` at a time as one batched computation
    (`engine.cohort.CohortClients`, in this process or in each worker, grouped as `policy.cohort_blocks` says at the
    run's `participation`) where the algorithm's client update and the clients allow it. `store`: where the client
    states are kept (`engine.store`; in memory by default)."""
    algorithm = algorithm or make_algorithm()
    if workers <= 1:
        clients = {k: source(k) for k in sorted(source.sizes)}
        return local_runner(algorithm, clients, source, seed, cohort_size, store=store, participation=participation)
    # each worker checks that its clients stack (`local_runner`); here only whether the method batches at all
    cohort_size = cohort_size if trains_in_cohorts(algorithm) else 0
    return ClientPool(make_algorithm, source, seed, workers, cohort_size, store, participation)
