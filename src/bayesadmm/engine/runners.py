"""The clients of a run in this process: the `ClientRunner` contract the engine's loop trains clients through,
`LocalClients` (one client after the other), `train_client` (one client's update, exactly as every execution path
runs it), and the checkpoint's record of client states (`checkpointed_states`, `check_states`,
`remove_stale_shards`).

Checkpoints: `save(run_dir, round)` returns what checkpoint.pt records about the client states. In one process these
are the states themselves (stored with the server, sharing the tensors of its replies). A pool's workers
(`engine.pool`) each write their clients' states to a shard file of their own, `client-states/r<round>-w<worker>.pt`,
in parallel, under a temporary name renamed once complete; checkpoint.pt then lists the shards with their clients.
The runner writes checkpoint.pt last (also by renaming), so it only ever names complete shards of its own round, and
deletes shards of other rounds only after that (`remove_stale_shards`). `restore` reads either form, whatever the
number of workers of the run that wrote it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from bayesadmm.algorithms.base import Algorithm, Message, info_scalars
from bayesadmm.engine.rundir import SHARD_NAME, SHARDS, RunDirError, real_folder, save_state, shard_path
from bayesadmm.engine.simulate import generator_for
from bayesadmm.engine.store import DiskStore, MemoryStore, StoreSpec, check_block_list, make_store, read_shard
from bayesadmm.threads import one_thread

__all__ = [
    "ClientRunner",
    "RunnerFactory",
    "LocalClients",
    "train_client",
    "one_thread",
    "checkpointed_states",
    "check_states",
    "remove_stale_shards",
    "SHARDS",
]


def train_client(
    algorithm: Algorithm, state, message: Message, data, seed: int, round_: int, client: int
) -> tuple[Any, Message, Any]:
    """One client's update, exactly as every execution path runs it: (new state, reply, info record). The generator
    is a CPU one whatever the device (`bayesadmm.rng` draws on it and moves the numbers), so a GPU run consumes the
    same random numbers."""
    with one_thread():
        return algorithm.client_update(state, message, data, generator_for(seed, round_, client))


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
    """The states and updates of `clients` (id → data), one client after the other in this process; the states in
    the store `store` describes (`engine.store`: in memory by default)."""

    def __init__(self, algorithm: Algorithm, clients: Mapping[int, Any], seed: int, store: StoreSpec | None = None):
        self.algorithm, self.clients, self.seed = algorithm, dict(clients), seed
        self._states: MemoryStore | DiskStore = make_store(store, self.clients)
        self.last_info: dict[int, dict[str, float]] = {}  # the scalars of each client's info record, last round
        self.initial_server: Any = None  # what the clients a disk store never wrote start from

    def start(self, server) -> None:
        """Every client's initial state, from the initial server state."""
        self.initial_server = server
        self._states.fill(self.clients, lambda k: self.algorithm.init_client(server, k))

    def restore(self, checkpoint: Mapping, run_dir: Path) -> None:
        """The client states a checkpoint recorded (`save`'s record in checkpoint.pt: the states, or shards)."""
        self.initial_server = checkpoint.get("initial")
        initial = initial_states(self.algorithm, self.initial_server)
        if isinstance(self._states, DiskStore):
            self._states.restore(checkpoint, run_dir, initial)
        else:
            self._states = MemoryStore(checkpointed_states(checkpoint, run_dir, self.clients, initial))

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
        """The checkpoint's record of the client states: the states themselves (they are in this process), or the
        disk store's blocks."""
        if isinstance(self._states, DiskStore):
            return {"shards": self._states.flush(), "initial": self.initial_server}
        return {"clients": self.states()}

    def write_shard(self, path: Path) -> list[dict]:
        """Write the states to `path` (complete or not at all, synced), or flush the disk store's blocks; the entries
        of checkpoint.pt's list of shards."""
        if isinstance(self._states, DiskStore):
            return self._states.flush()
        save_state(path, dict(self._states))
        return [{"file": f"{path.parent.name}/{path.name}", "clients": sorted(self._states)}]

    def close(self) -> None:
        pass


def initial_states(algorithm: Algorithm, server: Any) -> Callable[[int], Any] | None:
    """Client k's initial state from the initial server state `server` (None where there is none)."""
    return None if server is None else (lambda k: algorithm.init_client(server, k))


def checkpointed_states(
    checkpoint: Mapping, run_dir: Path, wanted: Iterable[int], initial: Callable[[int], Any] | None = None
) -> dict[int, Any]:
    """The states of the `wanted` clients recorded in a checkpoint: inline ("clients") or in shard files ("shards",
    of which only those holding wanted clients are read; a disk store's "fresh" blocks are `initial(k)`)."""
    wanted = list(wanted)
    if "clients" in checkpoint:
        found = checkpoint["clients"]
    else:
        found, needed = {}, set(wanted)
        for shard in checkpoint["shards"]:
            if needed.isdisjoint(shard["clients"]):
                continue
            if shard.get("fresh"):
                if initial is None:
                    raise ValueError("the checkpoint's clients in their initial state need the algorithm to make them")
                found.update((k, initial(k)) for k in shard["clients"] if k in needed)
            else:
                states = read_shard(run_dir, shard)
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
    check_block_list(checkpoint, path)
    found: set = set()
    if "clients" in checkpoint:
        found = set(checkpoint["clients"])
    else:
        for shard in checkpoint["shards"]:
            if shard.get("fresh"):
                if checkpoint.get("initial") is None:
                    raise RunDirError(f"{path} lists clients in their initial state but no initial server state")
                found.update(shard["clients"])
                continue
            states = read_shard(run_dir, shard)
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
    keep = {shard["file"] for shard in record.get("shards", []) if "file" in shard}
    for path in folder.iterdir():  # only the engine's own names: anything else there is not ours to delete
        name = path.name.removesuffix(".tmp")
        if SHARD_NAME.fullmatch(name) and f"{SHARDS}/{path.name}" not in keep:
            path.unlink(missing_ok=True)  # a link is removed, not what it points to
