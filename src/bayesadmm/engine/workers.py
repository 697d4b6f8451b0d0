"""The clients of a run: their states and their updates, in this process (`LocalClients`) or in worker processes that
each keep the states of the clients they train (`ClientPool`).

Both hold the states of their clients from round to round and run the same function, `train_client`, on one torch
thread with the generator of (seed, round, client) and on the same data (client k's examples are the same slice of one
client-ordered training tensor in both), so a run gives the same numbers whatever the number of workers. One thread per
client update is also the fast choice here: the minibatch matrices are small, and two processes each asking for
several threads on two cores slow every elementwise kernel down many times over.

The pool keeps clients where they are (sticky clients). Each client belongs to one worker for the whole run, by a
static assignment that balances the workers' numbers of examples (`assign`: longest processing time first). Workers
are started once per run with the "spawn" method (safe with CUDA and with torch's thread pools, unlike fork); the
algorithm's factory and the client source go to each of them once, pickled (an `Algorithm` is a tuple of closures and
does not pickle; its factory does; for `TensorClients` torch pickles the training set into shared memory), and each
builds the algorithm and its own clients' data and creates or loads their states. Per
round, the broadcast goes once to each worker with the list of its clients that take part (as raw tensor bytes through
the pipe, no serialisation); the worker trains them one after the other and hands over each reply as soon as it has
it, through a shared-memory arena of reply slots (`_train`: one copy into the slot, one copy out in the parent, and
only a few hundred bytes through the pipe). Client states never travel, except when asked for (`states()`, for tests
and tools) or when a resume hands a worker states written by another layout. If a client update fails in a worker (a
breakdown), the other workers finish the round before the parent raises the error, so that the pool closes cleanly.

Checkpoints: `save(run_dir, round)` returns what checkpoint.pt records about the client states. In one process these
are the states themselves (stored with the server, sharing the tensors of its replies). A pool's workers each write
their clients' states to a shard file of their own, `client-states/r<round>-w<worker>.pt`, in parallel, under a
temporary name renamed once complete; checkpoint.pt then lists the shards with their clients. The runner writes
checkpoint.pt last (also by renaming), so it only ever names complete shards of its own round, and deletes shards
of other rounds only after that (`remove_stale_shards`). `restore` reads either form, whatever the number of workers
of the run that wrote it.
"""

from __future__ import annotations

import ctypes
import io
import math
import os
import signal
import tempfile
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol, cast

import torch

from bayesadmm.algorithms.base import Algorithm, Message, info_scalars
from bayesadmm.engine.rundir import (
    SHARD_NAME,
    SHARDS,
    RunDirError,
    dump_state,
    load_state,
    read_state,
    real_folder,
    save_state,
    shard_path,
)
from bayesadmm.engine.simulate import generator_for


def default_workers() -> int:
    """The number of cores this process may use (or $BAYESADMM_WORKERS)."""
    if os.environ.get("BAYESADMM_WORKERS"):
        return max(1, int(os.environ["BAYESADMM_WORKERS"]))
    return usable_cores()


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system has one (a container's share, not the
    host's count), `os.cpu_count()` elsewhere."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@contextmanager
def one_thread():
    """torch on one intra-op thread inside the block (the caller's setting is restored after). Entering it costs
    nothing when torch already runs on one thread; switching the count costs milliseconds (the thread pool restarts),
    so loops over clients enter it once, not per client."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_client(
    algorithm: Algorithm, state, message: Message, data, seed: int, round_: int, client: int
) -> tuple[Any, Message, Any]:
    """One client's update, exactly as every execution path runs it: (new state, reply, info record). The generator
    is a CPU one whatever the device (`bayesadmm.rng` draws on it and moves the numbers), so a GPU run consumes the
    same random numbers."""
    with one_thread():
        return algorithm.client_update(state, message, data, generator_for(seed, round_, client))


def fixed_cohorts(sizes: Mapping[int, int], cohort_size: int, spread: int | None = None) -> list[list[int]]:
    """The clients' cohorts for the whole run, from their numbers of examples `sizes`: the clients, largest first
    (ties: lower id first), are taken a band of `spread` cohorts at a time (`spread` × `cohort_size` clients of
    similar sizes), and each band's clients are dealt to its cohorts back and forth (1, 2, …, n, n, …, 2, 1, 1, …).
    A cohort takes about a fixed time per step of its largest client plus a time per client step
    (`python benchmarks/cohort.py`): cohorts of similar clients waste few steps, and the cohorts of a band, of nearly
    equal work, keep `spread` workers equally busy. `spread` defaults to the cores this process may use
    (`usable_cores`), where `bayesadmm run` starts one worker each. Each cohort's ids in order.

    A round trains each cohort's chosen members together (`engine.cohort`), so what is batched with what depends
    neither on the round's order of clients nor on how many workers share them (`assign` gives each worker whole
    cohorts)."""
    if cohort_size < 1:
        raise ValueError(f"cohort_size must be >= 1, got {cohort_size}")
    spread = max(1, spread if spread is not None else usable_cores())
    ordered = sorted(sizes, key=lambda k: (-sizes[k], k))
    cohorts: list[list[int]] = []
    for start in range(0, len(ordered), spread * cohort_size):
        band = ordered[start : start + spread * cohort_size]
        dealt: list[list[int]] = [[] for _ in range(math.ceil(len(band) / cohort_size))]
        for position, k in enumerate(band):
            turn, index = divmod(position, len(dealt))
            dealt[index if turn % 2 == 0 else len(dealt) - 1 - index].append(k)
        cohorts.extend(sorted(cohort) for cohort in dealt)
    return cohorts


def assign(sizes: Mapping[int, int], workers: int, cohorts: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Clients per worker, with balanced numbers of examples: longest processing time first (Graham 1969), i.e. each
    of `cohorts` (`fixed_cohorts`; one client each by default), from the largest down (ties: lower first id first),
    goes to the worker with the fewest examples so far (ties: fewer cohorts, then lower index). No worker is left
    without a cohort while there are enough. Each worker's clients in id order, whole cohorts."""
    cohorts = [[k] for k in sorted(sizes)] if cohorts is None else [list(c) for c in cohorts]
    load = {c[0]: sum(sizes[k] for k in c) for c in cohorts}
    groups: list[list[int]] = [[] for _ in range(max(1, min(workers, len(cohorts))))]
    counts, loads = [0] * len(groups), [0] * len(groups)
    for cohort in sorted(cohorts, key=lambda c: (-load[c[0]], c[0])):
        emptiest = min(range(len(groups)), key=lambda i: (loads[i], counts[i], i))
        groups[emptiest].extend(cohort)
        loads[emptiest] += load[cohort[0]]
        counts[emptiest] += 1
    return [sorted(group) for group in groups]


class ClientRunner(Protocol):
    """How the engine's loop trains a round's clients and keeps their states: in this process (`LocalClients`), in
    worker processes (`ClientPool`), or anything else that keeps this contract (another transport, batched clients).
    The loop calls `start` or `restore` once, then `train` and `save` per round, and `close` at the end however the
    run ends. Replies come back in the order of `chosen`, and `last_info` holds the scalars of each trained client's
    info record of the last round."""

    last_info: dict[int, dict[str, float]]

    def start(self, server: Any) -> None: ...

    def restore(self, checkpoint: Mapping, run_dir: Path) -> None: ...

    def train(
        self, round_: int, message: Message, chosen: Sequence[int], on_done: Callable[[int], None] | None = None
    ) -> dict[int, Message]: ...

    def states(self) -> dict[int, Any]: ...

    def save(self, run_dir: Path, round_: int) -> dict: ...

    def close(self) -> None: ...


# Given the run's algorithm (for an in-process runner) and the number of workers the settings allow, a ClientRunner.
RunnerFactory = Callable[[Algorithm, int], ClientRunner]


class LocalClients:
    """The states and updates of `clients` (id → data), one client after the other in this process."""

    def __init__(self, algorithm: Algorithm, clients: Mapping[int, Any], seed: int):
        self.algorithm, self.clients, self.seed = algorithm, dict(clients), seed
        self._states: dict[int, Any] = {}
        self.last_info: dict[int, dict[str, float]] = {}  # the scalars of each client's info record, last round

    def start(self, server) -> None:
        """Every client's initial state, from the initial server state."""
        self._states = {k: self.algorithm.init_client(server, k) for k in self.clients}

    def restore(self, checkpoint: Mapping, run_dir: Path) -> None:
        """The client states a checkpoint recorded (`save`'s record in checkpoint.pt: the states, or shards)."""
        self._states = checkpointed_states(checkpoint, run_dir, self.clients)

    def units(self, chosen: Sequence[int]) -> list[list[int]]:
        """The `chosen` clients grouped as they train: one at a time here, a cohort at a time in `CohortClients`."""
        return [[k] for k in chosen]

    def train(
        self, round_: int, message: Message, chosen: Sequence[int], on_done: Callable[[int], None] | None = None
    ) -> dict[int, Message]:
        """Update the `chosen` clients' states; returns their replies in the order of `chosen`. Each state is replaced
        as soon as its client is done (so that old and new states are not all held at once): after an exception the
        states are those of an unfinished round, and the run goes on from its checkpoint."""
        replies, self.last_info = {}, {}
        with one_thread():
            for k in chosen:
                self._states[k], replies[k], info = train_client(
                    self.algorithm, self._states[k], message, self.clients[k], self.seed, round_, k
                )
                self.last_info[k] = info_scalars(info)
                if on_done is not None:
                    on_done(k)
        return replies

    def states(self) -> dict[int, Any]:
        """Every client's current state, by client id."""
        return dict(self._states)

    def save(self, run_dir: Path, round_: int) -> dict:
        """The checkpoint's record of the client states: the states themselves (they are in this process)."""
        return {"clients": self.states()}

    def write_shard(self, path: Path) -> dict:
        """Write the states to `path` (complete or not at all, synced); the shard's entry in checkpoint.pt."""
        save_state(path, self._states)
        return {"file": f"{path.parent.name}/{path.name}", "clients": sorted(self._states)}

    def close(self) -> None:
        pass


def checkpointed_states(checkpoint: Mapping, run_dir: Path, wanted: Iterable[int]) -> dict[int, Any]:
    """The states of the `wanted` clients recorded in a checkpoint: inline ("clients") or in shard files ("shards",
    of which only those holding wanted clients are read)."""
    wanted = list(wanted)
    if "clients" in checkpoint:
        found = checkpoint["clients"]
    else:
        found, needed = {}, set(wanted)
        for shard in checkpoint["shards"]:
            if not needed.isdisjoint(shard["clients"]):
                states = load_state(shard_path(run_dir, shard["file"]))
                found.update((k, state) for k, state in states.items() if k in needed)
    missing = [k for k in wanted if k not in found]
    if missing:
        raise ValueError(f"the checkpoint has no state for clients {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    return {k: found[k] for k in wanted}


def check_states(checkpoint: Mapping, run_dir: Path, wanted: Iterable[int]) -> None:
    """Check, before a resume writes anything, that the checkpoint's client states are whole: every shard it lists
    is read (names confined, checksum verified: `load_state`) and holds the clients listed, and every client in
    `wanted` has a state. The workers read their shards again when they start; this reads one shard at a time."""
    path = Path(run_dir) / "checkpoint.pt"
    found: set = set()
    if "clients" in checkpoint:
        found = set(checkpoint["clients"]) if isinstance(checkpoint["clients"], Mapping) else set()
    else:
        shards = checkpoint["shards"]
        if not isinstance(shards, list) or not all(
            isinstance(s, Mapping) and {"file", "clients"} <= set(s) for s in shards
        ):
            raise RunDirError(f"{path} lists its shards in a form the engine does not write; start the run again")
        for shard in shards:
            states = load_state(shard_path(run_dir, shard["file"]))
            if not isinstance(states, dict) or sorted(states) != sorted(shard["clients"]):
                raise RunDirError(
                    f"{shard_path(run_dir, shard['file'])} does not hold the clients {path} lists for it; "
                    "start the run again"
                )
            found.update(states)
    missing = [k for k in wanted if k not in found]
    if missing:
        raise RunDirError(
            f"{path} has no state for clients {missing[:10]}{' ...' if len(missing) > 10 else ''}; "
            "resume with the run's own clients, or start a new run"
        )


def remove_stale_shards(run_dir: Path, record: Mapping) -> None:
    """Delete the shard files that checkpoint record `record` does not name (other rounds, unfinished writes)."""
    folder = Path(run_dir) / SHARDS
    if not os.path.lexists(folder):
        return
    real_folder(folder)  # a link to elsewhere is refused: deleting "stale shards" there would delete others' files
    keep = {shard["file"] for shard in record.get("shards", [])}
    for path in folder.iterdir():  # only the engine's own names: anything else there is not ours to delete
        name = path.name.removesuffix(".tmp")
        if SHARD_NAME.fullmatch(name) and f"{SHARDS}/{path.name}" not in keep:
            path.unlink(missing_ok=True)  # a link is removed, not what it points to


# ---- messages through a pipe: a header, then each tensor's bytes -------------------------------------------------


def _dumps(obj) -> bytes:
    buffer = io.BytesIO()
    dump_state(obj, buffer)  # the checkpoints' format: no pickle between processes either
    return buffer.getvalue()


def _loads(payload: bytes):
    return read_state(io.BytesIO(payload))


def _raw(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (also for dtypes numpy lacks, e.g. bfloat16)."""
    return tensor.reshape(-1).view(torch.uint8).numpy().data


def _payload(message: Message) -> tuple[list, list[torch.Tensor]]:
    """A message's layout (key, dtype, shape, device) and its tensors as contiguous CPU tensors."""
    tensors = {key: value.detach() for key, value in message.items()}
    layout = [(key, t.dtype, tuple(t.shape), str(t.device)) for key, t in tensors.items()]
    return layout, [t.cpu().contiguous() for t in tensors.values()]


def _send_tensors(connection, header: tuple, layout: list, tensors: list[torch.Tensor]) -> None:
    """The header (with the layout) as a pickled message, then each tensor's bytes written as they are: the reader
    knows their sizes from the layout, so they need no framing (and `Connection.recv_bytes_into` would copy them
    twice more on the way)."""
    connection.send((*header, layout))
    for tensor in tensors:
        view = _raw(tensor)
        while view.nbytes:
            view = view[os.write(connection.fileno(), view) :]


def _receive_tensors(connection, layout: list) -> Message:
    """The tensors that follow a header with this layout, read straight into their memory."""
    message = {}
    for key, dtype, shape, device in layout:
        tensor = torch.empty(shape, dtype=dtype)
        view = _raw(tensor)
        while view.nbytes:
            count = os.readv(connection.fileno(), [view])
            if count == 0:
                raise EOFError("the other end closed the pipe in the middle of a message")
            view = view[count:]
        message[key] = tensor if device == "cpu" else tensor.to(device)
    return message


ARENA_BYTES = 64 << 20  # each worker's shared memory for replies in flight (47 IVON-ADMM replies of the MLP)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 64) * 64  # every tensor in an arena starts on a 64-byte boundary (any dtype can view it)


def _write_arena(arena: torch.Tensor, offset: int, tensors: list[torch.Tensor]) -> None:
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        arena[offset : offset + nbytes].view(tensor.dtype).copy_(tensor.reshape(-1))
        offset += _aligned(nbytes)


def _read_arena(arena: torch.Tensor, offset: int, layout: list) -> Message:
    """A copy of the message at `offset` (the worker writes the slot again once the copy is acknowledged)."""
    message = {}
    for key, dtype, shape, device in layout:
        nbytes = math.prod(shape) * dtype.itemsize
        tensor = arena[offset : offset + nbytes].view(dtype).reshape(shape).clone()
        message[key] = tensor if device == "cpu" else tensor.to(device)
        offset += _aligned(nbytes)
    return message


# ---- inside a worker process ----------------------------------------------------------------------------------------


def _worker(
    connection,
    arena: torch.Tensor,
    make_algorithm: Callable[[], Algorithm],
    source: Callable[[int], Any],
    seed: int,
    group: list[int],
    default_dtype: torch.dtype,
    cohort_size: int = 0,
    cohorts: list[list[int]] | None = None,
) -> None:
    """A worker's life: build its clients, then answer the parent's commands until "close" (or the parent is gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent handles it
    _keep_freed_memory()
    torch.set_num_threads(1)
    torch.set_default_dtype(default_dtype)  # as in the parent, so that tensors made without a dtype agree
    local = _local_runner(make_algorithm(), {k: source(k) for k in group}, source, seed, cohort_size, cohorts)
    commands: dict[str, Callable[..., Any]] = {
        "start": lambda server: local.start(_loads(server)),
        "put": lambda states: local.restore({"clients": _loads(states)}, Path(".")),
        "load": lambda run_dir, shards: local.restore({"shards": shards}, run_dir),
        "save": local.write_shard,
    }
    while True:
        try:
            command, *args = connection.recv()
        except EOFError:  # the parent is gone
            return
        if command == "close":
            return
        if command == "ack":  # the last acknowledgements of a round's replies, not needed any more
            continue
        try:
            if command == "train":
                round_, chosen, layout = args
                _train(connection, arena, local, round_, _receive_tensors(connection, layout), chosen)
                connection.send(("done",))
            else:
                connection.send(("ok", commands[command](*args)))
        except Exception as exc:  # noqa: BLE001 — every failure goes to the parent, which raises it
            text = traceback.format_exc()
            try:
                connection.send(("error", exc, text))
            except Exception:  # noqa: BLE001 — an exception that does not pickle
                connection.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}"), text))


def _train(
    connection, arena: torch.Tensor, local: LocalClients, round_: int, message: Message, chosen: list[int]
) -> None:
    """Train the chosen clients in turn and hand over each reply as soon as it is made.

    A reply goes into the next slot of the worker's shared arena, and only its layout and offset through the pipe: the
    parent copies it out and acknowledges, and slot i is written again only after the acknowledgement of the reply
    that used it before (the parent is usually many replies ahead of that). The slots are as large as the round's first
    reply; a reply that does not fit (or replies larger than the arena) go through the pipe instead.
    """
    slot_bytes = slots = 0
    sent = acknowledged = 0  # replies through slots, and acknowledgements received, this round
    for k, reply, info in _replies(local, round_, message, chosen):
        layout, tensors = _payload(reply)
        nbytes = sum(_aligned(t.numel() * t.element_size()) for t in tensors)
        if slot_bytes == 0 and nbytes > 0:
            slot_bytes, slots = nbytes, arena.numel() // nbytes
        if slots == 0 or nbytes > slot_bytes:
            _send_tensors(connection, ("reply", k, None, info), layout, tensors)
            continue
        while sent - acknowledged >= slots:  # every slot holds a reply the parent has not copied yet
            answer = connection.recv()
            if answer != ("ack",):
                raise RuntimeError(f"expected the parent's acknowledgement of a reply, got {answer!r}")
            acknowledged += 1
        offset = (sent % slots) * slot_bytes
        _write_arena(arena, offset, tensors)
        connection.send(("reply", k, offset, info, layout))
        sent += 1


def _replies(local: LocalClients, round_: int, message: Message, chosen: list[int]):
    """(client, reply, info) of the chosen clients, as each of `local`'s units (a client, or a cohort) is done."""
    for unit in local.units(chosen):
        replies = local.train(round_, message, unit)
        info = local.last_info
        for k in unit:
            yield k, replies[k], info[k]


def _keep_freed_memory() -> None:
    """Have glibc keep the memory freed at the top of the heap rather than return it to the OS at once.

    A worker frees each client's temporaries and its reply as soon as the client is done, so the top of its heap is
    free between clients and glibc trims it; every allocation there then faults its pages in again (~400 page faults
    per FedAvg client of the papers' MLP, ~0.5 ms, a fifth of the update). The worker's memory instead stays at its
    high-water mark. A no-op where malloc is not glibc's (mallopt missing, or ignoring these settings).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: trim only above 1 GiB of free memory at the top
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks below 32 MiB (the maximum) from the heap, where they are reused


# ---- in the parent --------------------------------------------------------------------------------------------------


class ClientPool:
    """The clients' states and updates in `workers` processes, each on one thread, sharing the training data; each
    client stays in the worker it was assigned to (`assign`)."""

    def __init__(self, make_algorithm: Callable[[], Algorithm], source, seed: int, workers: int, cohort_size: int = 0):
        if workers < 2:
            raise ValueError(f"ClientPool needs at least 2 workers, got {workers} (use LocalClients)")
        sizes = dict(source.sizes)
        layout = fixed_cohorts(sizes, cohort_size) if cohort_size > 0 else None
        self.groups = assign(sizes, workers, layout)
        self.owner = {k: index for index, group in enumerate(self.groups) for k in group}
        self.last_info: dict[int, dict[str, float]] = {}
        context = torch.multiprocessing.get_context("spawn")
        self.connections, self.processes, self.arenas = [], [], []
        self._in_round = False  # True from sending a round's work until every worker has finished it
        try:
            for index, group in enumerate(self.groups):
                parent_end, child_end = context.Pipe()
                arena = torch.empty(ARENA_BYTES, dtype=torch.uint8).share_memory_()
                process = context.Process(
                    target=_worker,
                    name=f"bayesadmm-worker-{index}",
                    args=(
                        child_end,
                        arena,
                        make_algorithm,
                        source,
                        seed,
                        group,
                        torch.get_default_dtype(),
                        cohort_size,
                        None if layout is None else [c for c in layout if self.owner[c[0]] == index],
                    ),
                )
                _start(process)
                child_end.close()
                self.connections.append(parent_end)
                self.processes.append(process)
                self.arenas.append(arena)
        except BaseException:
            self.close()
            raise

    def start(self, server) -> None:
        self._call_all([("start", _dumps(server))] * len(self.groups))

    def restore(self, checkpoint: Mapping, run_dir: Path) -> None:
        """The client states a checkpoint recorded: each worker reads the shards that hold its clients, or is handed
        its clients' states (a checkpoint written by one process)."""
        if "shards" in checkpoint:
            self._call_all([("load", Path(run_dir), checkpoint["shards"])] * len(self.groups))
        else:
            states = checkpoint["clients"]
            self._call_all([("put", _dumps({k: states[k] for k in group})) for group in self.groups])

    def train(
        self, round_: int, message: Message, chosen: Sequence[int], on_done: Callable[[int], None] | None = None
    ) -> dict[int, Message]:
        """Update the `chosen` clients' states in their workers; returns their replies in the order of `chosen`."""
        if self._in_round:
            raise RuntimeError("the client pool stopped in the middle of a round (an error); start a new one")
        layout, tensors = _payload(message)  # made once, sent to each worker
        busy = {}
        self._in_round = True
        for index in range(len(self.groups)):
            mine = [k for k in chosen if self.owner[k] == index]
            if mine:
                _send_tensors(self.connections[index], ("train", round_, mine), layout, tensors)
                busy[self.connections[index]] = index
        replies: dict[int, Message] = {}
        failure: Exception | None = None
        self.last_info = {}
        while busy:
            for connection in cast(list[Connection], wait(list(busy))):
                try:
                    kind, *rest = self._receive(busy[connection])
                except Exception as exc:  # noqa: BLE001 — a worker failed (a breakdown) or died: it sends no more
                    failure = failure or exc  # and the others finish the round, so that the pool closes cleanly
                    del busy[connection]
                    continue
                if kind == "reply":
                    k, offset, self.last_info[rest[0]], layout = rest
                    if offset is None:  # too large for the worker's arena: the bytes follow in the pipe
                        replies[k] = _receive_tensors(connection, layout)
                    else:
                        replies[k] = _read_arena(self.arenas[busy[connection]], offset, layout)
                        connection.send(("ack",))  # the worker may write that slot again
                    if on_done is not None:
                        on_done(k)
                else:  # "done"
                    del busy[connection]
        self._in_round = False
        if failure is not None:
            raise failure
        # in the caller's order, so that everything downstream sees the same order as a sequential run
        return {k: replies[k] for k in chosen}

    def states(self) -> dict[int, Any]:
        """Every client's current state, by client id: the workers write them as shards to a temporary directory (not
        as bytes through the pipe, which would hold several copies in memory at once) and this process reads them."""
        with tempfile.TemporaryDirectory(prefix="bayesadmm-states-") as folder:
            record = self.save(Path(folder), 0)
            return checkpointed_states(record, Path(folder), sorted(self.owner))

    def save(self, run_dir: Path, round_: int) -> dict:
        """Each worker writes its clients' states to a shard file (in parallel); the checkpoint's record of them."""
        folder = real_folder(Path(run_dir) / SHARDS)
        shards = self._call_all([("save", folder / f"r{round_:06d}-w{index}.pt") for index in range(len(self.groups))])
        return {"shards": shards}

    def close(self) -> None:
        """Stop the workers: asked to, or killed if in the middle of a round (an error or an interrupt)."""
        for connection in self.connections:
            if not self._in_round:
                try:
                    connection.send(("close",))
                except (OSError, ValueError):  # a worker that is already gone
                    pass
        for connection, process in zip(self.connections, self.processes, strict=True):
            process.join(timeout=0 if self._in_round else 60)
            if process.is_alive():
                process.terminate()
                process.join()
            connection.close()
        self.connections, self.processes, self.arenas = [], [], []

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
                failure = failure or RuntimeError(
                    f"client worker {index} died (exit code {self.processes[index].exitcode})"
                )
        for index in sent:
            try:
                answers.append(self._receive(index)[1])
            except Exception as exc:  # noqa: BLE001
                failure = failure or exc
        if failure is not None:
            raise failure
        return answers

    def _receive(self, index: int) -> tuple:
        try:
            answer = self.connections[index].recv()
        except EOFError:
            self.processes[index].join(timeout=5)
            raise RuntimeError(f"client worker {index} died (exit code {self.processes[index].exitcode})") from None
        if answer[0] == "error":
            _, exc, text = answer
            exc.add_note(f"in client worker {index}:\n{text}")
            raise exc
        return answer


def client_runner(
    make_algorithm: Callable[[], Algorithm],
    source,
    seed: int,
    workers: int,
    algorithm: Algorithm | None = None,
    cohort_size: int = 0,
) -> LocalClients | ClientPool:
    """The clients of `source` in this process for one worker (or one participant), with `algorithm` (made by
    `make_algorithm` if not given), or in a pool of `workers` processes otherwise. With `cohort_size` > 0, the
    clients of a round are trained `cohort_size` at a time as one batched computation (`engine.cohort.CohortClients`,
    in this process or in each worker) where the algorithm's client update and the clients allow it."""
    algorithm = algorithm or make_algorithm()
    if workers <= 1:
        return _local_runner(algorithm, {k: source(k) for k in sorted(source.sizes)}, source, seed, cohort_size)
    # each worker checks that its clients stack (`_local_runner`); here only whether the method batches at all
    return ClientPool(make_algorithm, source, seed, workers, cohort_size if algorithm.local is not None else 0)


def _local_runner(
    algorithm: Algorithm,
    clients: Mapping[int, Any],
    source,
    seed: int,
    cohort_size: int,
    cohorts: list[list[int]] | None = None,
):
    """`CohortClients` where `cohort_size` > 0 and the algorithm and clients batch (in `cohorts` where given: a
    worker's share of the run's), `LocalClients` otherwise."""
    from bayesadmm.engine.cohort import CohortClients, cohort_rows  # (engine.cohort builds on this module)

    rows = cohort_rows(algorithm, clients, source) if cohort_size > 0 else None
    if rows is None:
        return LocalClients(algorithm, clients, seed)
    return CohortClients(algorithm, clients, seed, cohort_size, rows, cohorts=cohorts)


def _start(process) -> None:
    """Start a worker; its arguments (the algorithm's factory, the client source) are pickled here, in the parent, so
    an object that does not pickle fails now, with the fix."""
    import pickle

    try:
        process.start()
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ValueError(
            f"the algorithm's factory and the clients must pickle to run in worker processes "
            f"(workers > 1), and they do not ({exc}): make them module-level functions, "
            f"functools.partials of them, or dataclasses of tensors; or use workers=1"
        ) from exc


__all__: Sequence[str] = [
    "LocalClients",
    "ClientPool",
    "client_runner",
    "train_client",
    "assign",
    "fixed_cohorts",
    "usable_cores",
    "default_workers",
    "one_thread",
    "checkpointed_states",
    "remove_stale_shards",
    "check_states",
    "SHARDS",
]
