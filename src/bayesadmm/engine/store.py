"""Where a runner keeps its clients' states: in memory (`MemoryStore`, a dict) or on disk (`DiskStore`, safetensors
block files with a bounded in-memory cache), chosen by the `client_store` setting (`store_kind`).

Both stores are mappings from client id to state, read and replaced one client at a time (`store[k]`,
`store[k] = state`), so a runner's code is the same for either and the numbers are the same bits: a state read back
from disk is the tensors that were written. The disk store keeps the states of a block of consecutive clients (by
id) in one file, `client-states/b<first id>-<random hex>.safetensors`: the tree's structure as JSON
(`bayesadmm.trees`, as checkpoints: no pickle, classes only from the registry) and its sha256 in the safetensors
metadata, the tensors as named entries. A file is never rewritten: a changed block goes to a new file (under a
temporary name, renamed when whole) and the old one is deleted unless the last checkpoint names it. A client never
changed is never written: its state is made from the initial server state when its block is first read. A
checkpoint flushes the changed blocks, syncs the files it names to disk, and records every block's file, clients and
sha256 (checked on every read, so a file swapped for another block's or another round's is refused), or "fresh" for
a block never written (checkpoint.pt then holds the initial server state); checkpoint.pt, written last, is what
makes them the run's state, and files it does not name are deleted after it (`runners.remove_stale_shards`).

The cache holds at most `cache_bytes` of states (least recently used blocks leave first, written if changed; at
least the block in use stays). Blocks are as many clients as fit in `BLOCK_BYTES` (1 to 256): a round's clients are
a random few of many, so a block should be little more than the clients a round reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from bayesadmm.engine.rundir import (
    SHARDS,
    RunDirError,
    _sync_directory,
    load_state,
    read_bytes,
    real_folder,
    shard_path,
)
from bayesadmm.engine.settings import CLIENT_STORES
from bayesadmm.trees import flatten, hash_tensors, unflatten

__all__ = [
    "StoreSpec",
    "MemoryStore",
    "DiskStore",
    "make_store",
    "store_kind",
    "read_block",
    "check_block_list",
    "read_shard",
    "STORES",
    "AUTO_DISK_CLIENTS",
    "CACHE_BYTES",
    "BLOCK_NAME",
]

STORES = CLIENT_STORES
# `client_store="auto"` keeps the states on disk above this many clients: 1000 IVON-ADMM clients of the papers' MLP
# hold 1.4 GB of states, which still fits beside everything else on a 24 GB machine; ten times as many does not
AUTO_DISK_CLIENTS = 2000
BLOCK_BYTES = 256 << 10
MAX_BLOCK = 256
# the disk store's cache: the states of 360 IVON-ADMM clients of the papers' MLP, more than a round's 100
CACHE_BYTES = 512 << 20
BLOCK_FORMAT = "bayesadmm-store-1"
BLOCK_NAME = re.compile(r"b[0-9]{1,12}-[0-9a-f]{16}\.safetensors")


def store_kind(setting: str, clients: int, state: Any = None) -> str:
    """What `client_store=setting` means ("memory" or "disk") for a federation of `clients` clients whose states
    are like `state`. "auto": on disk above `AUTO_DISK_CLIENTS` clients, unless their states hold no tensors
    (FedAvg's and FedSEP's clients keep nothing worth a file)."""
    if setting not in STORES:
        raise ValueError(f"client_store must be one of {', '.join(STORES)}, got {setting!r}")
    if setting == "auto":
        heavy = state is None or _nbytes(state) > 0
        return "disk" if clients > AUTO_DISK_CLIENTS and heavy else "memory"
    return setting


@dataclass(frozen=True)
class StoreSpec:
    """What a runner (in this process or a worker) builds its store from: "memory", or "disk" in `run_dir`'s
    client-states folder with a cache of `cache_bytes`."""

    kind: str = "memory"
    run_dir: Path | None = None
    cache_bytes: int = CACHE_BYTES


class MemoryStore(dict):
    """Client id → state, in this process's memory (what runners always did)."""

    def fill(self, ids: Iterable[int], make: Callable[[int], Any]) -> None:
        """Every client's initial state, `make(k)`."""
        self.clear()
        self.update({k: make(k) for k in ids})


def make_store(spec: StoreSpec | None, ids: Iterable[int]) -> MemoryStore | DiskStore:
    """The store `spec` describes for the clients `ids` (a `MemoryStore` where `spec` is None)."""
    if spec is None or spec.kind == "memory":
        return MemoryStore()
    if spec.kind != "disk" or spec.run_dir is None:
        raise ValueError(f"a client store is 'memory' or 'disk' with a run directory, got {spec!r}")
    return DiskStore(Path(spec.run_dir), ids, spec.cache_bytes)


def _nbytes(tree: Any) -> int:
    return sum(t.numel() * t.element_size() for t in flatten(tree)[1])


def _checksum(structure: str, tensors: list) -> str:
    return hash_tensors(hashlib.sha256(structure.encode()), tensors).hexdigest()


def block_bytes(states: Mapping[int, Any]) -> tuple[bytes, str]:
    """A block's file contents (safetensors; the structure, its checksum and the tensors' devices as metadata) and
    its sha256. Tensors that share memory are stored apart (safetensors refuses shared ones)."""
    structure, tensors = flatten({int(k): states[k] for k in sorted(states)})
    text = json.dumps(structure)
    seen: set[tuple[int, Any]] = set()
    named = {}
    for i, t in enumerate(tensors):
        t = t.detach().to("cpu").contiguous()
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        named[str(i)] = t.clone() if key in seen and t.numel() else t
        seen.add(key)
    digest = _checksum(text, list(named.values()))
    devices = json.dumps([str(t.device) for t in tensors])
    meta = {"format": BLOCK_FORMAT, "structure": text, "sha256": digest, "devices": devices}
    return save_tensors(named, metadata=meta), digest


def read_block(path: Path, sha256: str | None = None) -> dict[int, Any]:
    """The states of a block file (`block_bytes`), its checksum verified (and equal to `sha256` where given, the
    checkpoint's record); a RunDirError naming the file for anything else."""
    data = read_bytes(path)
    try:
        size = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8 : 8 + size]).get("__metadata__", {})
        named = load_tensors(data)
        tensors = [named[str(i)] for i in range(len(named))]
        if meta.get("format") != BLOCK_FORMAT or meta.get("sha256") != _checksum(meta["structure"], tensors):
            raise ValueError("its checksum does not match: the file was changed or damaged after it was written")
        devices = json.loads(meta["devices"])
        tensors = [t.to(device) for t, device in zip(tensors, devices, strict=True)]
        states = unflatten(json.loads(meta["structure"]), tensors)
    except Exception as exc:  # noqa: BLE001 — a truncated, foreign or crafted file fails in many ways
        raise RunDirError(
            f"{path} is not a readable bayesadmm client-state block ({type(exc).__name__}: {exc}); "
            "start the run again with --overwrite"
        ) from None
    if sha256 is not None and meta["sha256"] != sha256:
        raise RunDirError(f"{path} is not the block its checkpoint names (another sha256); start the run again")
    return states


def check_block_list(checkpoint: Mapping, path: Path) -> None:
    """Refuse (a RunDirError naming `path`, the checkpoint) a record of client states in a form the engine does not
    write: the inline states ("clients") a mapping from client id, or the block list ("shards") a list of entries,
    each a mapping whose "clients" is a list of client ids (integers) and which names its "file" (a string, its
    "sha256" a string where given) or is "fresh". The readers then index it without meeting another type."""
    if "clients" in checkpoint:
        states = checkpoint["clients"]
        if not isinstance(states, Mapping) or not all(_client_id(k) for k in states):
            raise RunDirError(
                f"{path} records its client states in a form the engine does not write; start the run again"
            )
        return
    shards = checkpoint["shards"]
    if not isinstance(shards, list) or not all(_block_entry(entry) for entry in shards):
        raise RunDirError(
            f"{path} lists its client-state blocks in a form the engine does not write; start the run again"
        )
    for entry in shards:  # a file's name is one the engine writes, inside the run's client-states folder
        if entry.get("fresh") is not True:
            shard_path(path.parent, entry["file"])


def _client_id(k: Any) -> bool:
    return isinstance(k, int) and not isinstance(k, bool)


def _block_entry(entry: Any) -> bool:
    """Whether `entry` is a block-list entry as `DiskStore.flush` or the workers write it."""
    if not isinstance(entry, Mapping):
        return False
    clients = entry.get("clients")
    if not isinstance(clients, list) or not all(_client_id(k) for k in clients):
        return False
    if entry.get("fresh") is True:
        return True
    return "file" in entry and isinstance(entry.get("sha256", ""), str)  # the file's name: `shard_path` checks it


class _Block:
    """A block's states in the cache, whether they changed since its file was written, and their bytes."""

    def __init__(self, states: dict[int, Any], dirty: bool):
        self.states, self.dirty = states, dirty
        self.nbytes = sum(_nbytes(s) for s in states.values())


class DiskStore:
    """Client id → state for the clients `ids`, in block files in `run_dir`'s client-states folder with at most
    `cache_bytes` of them in memory (module docstring)."""

    def __init__(self, run_dir: Path, ids: Iterable[int], cache_bytes: int = CACHE_BYTES):
        self.run_dir, self.ids, self.cache_bytes = Path(run_dir), sorted(ids), cache_bytes
        self.folder = real_folder(self.run_dir / SHARDS)
        self.block_size = 1
        self.files: dict[int, tuple[str, str]] = {}  # block → (file name, sha256)
        self.protected: set[str] = set()  # files the last checkpoint names: never deleted here
        self.unsynced: set[str] = set()  # files written since the last flush
        self.cache: OrderedDict[int, _Block] = OrderedDict()
        self.initial: Callable[[int], Any] | None = None  # the state of a client never written (`fill`)
        self.cached_bytes = 0
        self._position = {k: i for i, k in enumerate(self.ids)}

    # ---- the mapping ------------------------------------------------------------------------------------------------

    def __getitem__(self, k: int) -> Any:
        return self._block(k).states[k]

    def __setitem__(self, k: int, state: Any) -> None:
        block = self._block(k)
        old = _nbytes(block.states[k]) if k in block.states else 0
        block.states[k], block.dirty = state, True
        block.nbytes += _nbytes(state) - old
        self.cached_bytes += _nbytes(state) - old
        self._evict(keep=self._index(k))

    def __contains__(self, k: object) -> bool:
        return k in self._position

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def keys(self) -> list[int]:
        return list(self.ids)

    # ---- filling -----------------------------------------------------------------------------------------------------

    def fill(self, ids: Iterable[int], make: Callable[[int], Any]) -> None:
        """Every client's initial state is `make(k)`: made when a block is first read, written only once changed (a
        checkpoint lists the blocks never written as "fresh")."""
        self._reset()
        if sorted(ids) != self.ids:
            raise ValueError("fill the store with the clients it was made for")
        self.initial = make
        if self.ids:
            self.block_size = _block_size(make(self.ids[0]))

    def restore(self, checkpoint: Mapping, run_dir: Path, initial: Callable[[int], Any] | None = None) -> None:
        """The states a checkpoint recorded: its block files adopted where they are this store's blocks (same
        clients), else read and written again block by block; inline states ("clients") are written likewise.
        `initial(k)`: the state of a client the checkpoint lists as fresh (never written)."""
        self._reset()
        self.initial = initial
        if "shards" in checkpoint and self._adopt(checkpoint["shards"]):
            return

        wanted, done = set(self.ids), set[int]()
        sources: list[Any] = [checkpoint["clients"]] if "clients" in checkpoint else checkpoint["shards"]
        for source in sources:
            if isinstance(source, Mapping) and source.get("fresh"):  # made by `initial` when first read
                if initial is None and not wanted.isdisjoint(source["clients"]):
                    raise ValueError("the checkpoint lists fresh clients but no initial server state")
                done.update(k for k in source["clients"] if k in wanted)
                continue
            if isinstance(source, Mapping) and "file" in source:
                if wanted.isdisjoint(source["clients"]):
                    continue
                source = read_shard(Path(run_dir), source)
            for k, state in source.items():
                if k in wanted:
                    if not self.files and not self.cache:
                        self.block_size = _block_size(state)
                    self[k] = state
                    done.add(k)
        missing = sorted(wanted - done)
        if missing:
            raise ValueError(f"the checkpoint has no state for clients {missing[:10]}")

    def flush(self) -> list[dict]:
        """Write every changed block; the checkpoint's record of all blocks (file, clients, sha256; or "fresh" for
        those never written), whose files are kept from now on until the next flush."""
        for index, block in self.cache.items():
            if block.dirty:
                self._write(index, block.states)
                block.dirty = False
        self._sync()
        record: list[dict] = []
        for index in range(-(-len(self.ids) // self.block_size)):
            if index in self.files:
                name, digest = self.files[index]
                record.append({"file": f"{SHARDS}/{name}", "clients": self._members(index), "sha256": digest})
            else:
                record.append({"clients": self._members(index), "fresh": True})
        self.protected = {name for name, _ in self.files.values()}
        return record

    # ---- inside ------------------------------------------------------------------------------------------------------

    def _reset(self) -> None:
        """Forget every state (their files too, where no checkpoint names them)."""
        for name, _ in self.files.values():
            if name not in self.protected:
                (self.folder / name).unlink(missing_ok=True)
        self.cache.clear()
        self.cached_bytes = 0
        self.files = {}

    def _index(self, k: int) -> int:
        try:
            return self._position[k] // self.block_size
        except KeyError:
            raise KeyError(f"client {k} is not one of this store's clients") from None

    def _members(self, index: int) -> list[int]:
        return self.ids[index * self.block_size : (index + 1) * self.block_size]

    def _block(self, k: int) -> _Block:
        index = self._index(k)
        block = self.cache.get(index)
        if block is None:
            if index in self.files:
                name, digest = self.files[index]
                block = _Block(read_block(self.folder / name, digest), dirty=False)
            elif self.initial is not None:
                block = _Block({k: self.initial(k) for k in self._members(index)}, dirty=False)
            else:
                block = _Block({}, dirty=True)
            self.cache[index] = block
            self.cached_bytes += block.nbytes
            self._evict(keep=index)
        self.cache.move_to_end(index)
        return block

    def _evict(self, keep: int) -> None:
        while self.cached_bytes > self.cache_bytes and len(self.cache) > 1:
            index = next(iter(self.cache))
            if index == keep:
                self.cache.move_to_end(index)
                continue
            block = self.cache.pop(index)
            self.cached_bytes -= block.nbytes
            if block.dirty:
                self._write(index, block.states)

    def _write(self, index: int, states: Mapping[int, Any]) -> None:
        """A block's states to a new file: renamed into place when whole, synced to disk only by the next `flush`
        (a checkpoint needs only the files it names on disk; most blocks written between two are replaced before)."""
        data, digest = block_bytes(states)
        name = f"b{self._members(index)[0]}-{secrets.token_hex(8)}.safetensors"
        tmp = self.folder / (name + ".tmp")
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, self.folder / name)
        self.unsynced.add(name)
        old = self.files.get(index)
        self.files[index] = (name, digest)
        if old is not None and old[0] not in self.protected:
            (self.folder / old[0]).unlink(missing_ok=True)
            self.unsynced.discard(old[0])

    def _sync(self) -> None:
        """fsync the files written since the last flush that are still the blocks' files, then the folder."""
        current = {name for name, _ in self.files.values()}
        for name in sorted(self.unsynced & current):
            fd = os.open(self.folder / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if self.unsynced:
            _sync_directory(self.folder)  # the renames
        self.unsynced = set()

    def _adopt(self, entries: list) -> bool:
        """Take the checkpoint's block files as this store's where they are exactly its blocks; False otherwise."""
        mine = [e for e in entries if e.get("fresh") or BLOCK_NAME.fullmatch(str(e.get("file", "")).partition("/")[2])]
        mine = [e for e in mine if e["clients"] and e["clients"][0] in self._position]
        if not mine or (self.initial is None and any(e.get("fresh") for e in mine)):
            return False
        self.block_size = max(len(e["clients"]) for e in mine)
        files, indexes = {}, []
        for entry in mine:
            index, offset = divmod(self._position[entry["clients"][0]], self.block_size)
            if entry["clients"] != self._members(index) or offset:
                self.block_size = 1
                return False
            indexes.append(index)
            if not entry.get("fresh"):
                files[index] = (entry["file"].partition("/")[2], entry["sha256"])
        if sorted(indexes) != list(range(-(-len(self.ids) // self.block_size))):
            self.block_size = 1
            return False
        self.files, self.protected = files, {name for name, _ in files.values()}
        return True


def _block_size(state: Any) -> int:
    """Clients per block: as many states like `state` as fit in `BLOCK_BYTES`, 1 to `MAX_BLOCK`."""
    return max(1, min(MAX_BLOCK, BLOCK_BYTES // max(_nbytes(state), 1)))


def block_files(folder: Path) -> list[str]:
    """The block files in `folder` (for tests and tools)."""
    return sorted(name for name in os.listdir(folder) if BLOCK_NAME.fullmatch(name))


def read_shard(run_dir: Path, shard: Mapping) -> dict[int, Any]:
    """The states in the shard file a checkpoint lists (`shard`: its entry): a worker's shard, or a disk store's
    block (checked against the sha256 the entry records); a RunDirError naming the file where it is not whole."""
    path = shard_path(run_dir, shard["file"])
    if path.suffix == ".safetensors":
        return read_block(path, shard.get("sha256"))
    return load_state(path)
