"""The run directory's files: written whole or not at all and synced to disk, one writer at a time, never silently
overwritten.

Every file is written under a temporary name, flushed and fsynced, then renamed over the old one, and the directory
is fsynced after the rename: a killed process or a power loss leaves either the old file or the new one. A SIGTERM or
Ctrl-C that arrives while a file is written is acted on once it is in place (an exception raised from a signal
handler inside torch.save would leave a torn write and torch's "unexpected pos" instead of the interruption), and a
write that fails (a full disk) is an OSError naming the file, whoever wrote it. A run holds
an exclusive lock on `.lock` (released by the kernel when the process ends, however it ends) so that two processes
never write one run directory; the lock file names the holder. Starting a run in a directory that holds one already
is refused unless asked to overwrite it; resuming reads and checks the checkpoint before anything is written.

States are stored without pickle (`save_state`): the tree's structure as JSON and its tensors, read back with
`torch.load(weights_only=True)`, which loads tensors, strings and plain containers and nothing else, and rebuilt by
`bayesadmm.trees` from its registry of state classes only (nothing a file names is imported). A checkpoint handed
over by someone else therefore cannot run code when it is resumed.

A run directory is confined: its files are opened without following symbolic links (`O_NOFOLLOW`, and `lstat` before
anything is opened), only regular files are read (a FIFO or a device is refused before it is opened, so it cannot
hang a resume), and shard names a checkpoint lists must be exactly those the engine writes (`shard_path`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bayesadmm.trees import TreeError, flatten, hash_tensors, unflatten

__all__ = [
    "RunDirError",
    "write_bytes",
    "write_json",
    "dump_state",
    "read_state",
    "save_state",
    "load_state",
    "locked",
    "prepare_fresh",
    "read_checkpoint",
    "read_bytes",
    "open_append",
    "shard_path",
    "real_folder",
    "SHARDS",
    "POSTERIOR",
    "RUN_FILES",
]

# the run's posterior, written when it ends (`bayesadmm.Posterior.save`)
POSTERIOR = "posterior.safetensors"
# what a run writes; a directory holding any of them holds a run
RUN_FILES = ("config.json", "metrics.jsonl", "checkpoint.pt", "status.json", POSTERIOR)
LOCK = ".lock"
SHARDS = "client-states"  # the run directory's folder of checkpoint shards
# the only shard names the engine writes (`r<round>-w<worker>.pt`, and the disk store's blocks
# `b<first client>-<hex>.safetensors`, `engine.store`), and so the only ones a checkpoint may list
SHARD_NAME = re.compile(r"r[0-9]{6}-w[0-9]{1,4}\.pt|b[0-9]{1,12}-[0-9a-f]{16}\.safetensors")
# flags that keep an open inside the run directory: never through a symbolic link, never blocking on a FIFO
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class OldStateError(TreeError):
    """A state file of the format before checksums."""


class RunDirError(ValueError):
    """The run directory cannot be used as asked (another run in it, in use, an unreadable checkpoint); the message
    says what to do instead."""


def _sync_directory(folder: Path) -> None:
    """fsync a directory, so that a rename in it survives a power loss (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_DEFERRED = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Within the block SIGTERM and SIGINT are only recorded; after it they are raised again for the handlers that
    were there before (the run's interruption, Python's KeyboardInterrupt, or the default: the process ends). Signal
    handlers can only be set in the main thread; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {int(signum): signal.signal(signum, lambda s, frame: caught.append(s)) for signum in _DEFERRED}
    try:
        yield
    finally:
        for signum, handler in previous.items():  # None: a handler not set from Python, taken as the default
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def _open_regular(path: Path) -> int:
    """A file descriptor for reading `path`, a regular file reached without a symbolic link; a RunDirError naming it
    otherwise (a FIFO or a device is refused before it is opened)."""
    mode = os.lstat(path).st_mode  # a missing file: FileNotFoundError, naming it
    if stat.S_ISLNK(mode):
        raise RunDirError(
            f"{path} is a symbolic link; a run directory's files are read only from inside it: "
            "replace the link by the file it points to, or start the run again"
        )
    if not stat.S_ISREG(mode):
        raise RunDirError(f"{path} is not a regular file (a FIFO, device or folder); remove it, or start the run again")
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between the two looks
        os.close(fd)
        raise RunDirError(f"{path} is not a regular file; remove it, or start the run again")
    return fd


def open_append(path: Path) -> Any:
    """`path` opened for appending (created if missing), unbuffered, as a regular file reached without a symbolic
    link: a RunDirError naming it otherwise, so that a link placed in a run directory cannot make a run append to a
    file outside it, nor a FIFO hang it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _NONBLOCK, 0o644)
    except OSError as exc:  # ELOOP: a link in its place; ENXIO: a FIFO without a reader
        raise RunDirError(
            f"cannot append to {path} ({exc.strerror}): a run directory's files are written only inside it; "
            "remove what is in its place, or start the run again"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunDirError(f"{path} is not a regular file (a FIFO, device or folder); remove it, or start the run again")
    return os.fdopen(fd, "ab", buffering=0)


def read_bytes(path: Path) -> bytes:
    """The contents of the run directory's file `path`, opened as `_open_regular` allows."""
    with os.fdopen(_open_regular(Path(path)), "rb") as f:
        return f.read()


def real_folder(folder: Path) -> Path:
    """`folder`, created if missing; a RunDirError if it is a symbolic link or not a folder (nothing is written or
    deleted through a link out of the run directory)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        raise RunDirError(
            f"{folder} is a symbolic link or not a folder; a run keeps its files inside its directory: "
            "remove it (the run's shards are rewritten at the next checkpoint), or start the run again"
        )
    return folder


def shard_path(run_dir: Path, name: object) -> Path:
    """The shard file `name` that a checkpoint lists, inside run_dir's real client-states folder; a RunDirError if
    the name is not one the engine writes (`client-states/rNNNNNN-wK.pt` or a store block: no other folder, no
    `..`)."""
    folder, _, file = name.partition("/") if isinstance(name, str) else ("", "", "")
    if folder != SHARDS or not SHARD_NAME.fullmatch(file):
        shown = repr(name)[:120]
        raise RunDirError(
            f"{Path(run_dir) / 'checkpoint.pt'} lists a shard {shown}, not a name the engine writes "
            f"({SHARDS}/rNNNNNN-wK.pt or bN-HEX.safetensors); the checkpoint was edited: start the run again "
            "with --overwrite"
        )
    if os.path.lexists(Path(run_dir) / SHARDS) and not stat.S_ISDIR(os.lstat(Path(run_dir) / SHARDS).st_mode):
        raise RunDirError(f"{Path(run_dir) / SHARDS} is a symbolic link or not a folder; start the run again")
    return Path(run_dir) / SHARDS / file


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[Any]:
    """A binary file object for `path`'s new contents: written to a temporary file, synced, then renamed over `path`;
    on an error the temporary file is removed, `path` is untouched and the OSError names `path`. The temporary file
    is created afresh (never opened through a link left in its place), and the rename replaces a link at `path`
    itself, not the file it points to. A signal that arrives meanwhile is acted on after the rename."""
    tmp = path.with_name(path.name + ".tmp")
    with _signals_deferred():
        try:
            tmp.unlink(missing_ok=True)  # a link removed is only the link
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644), "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise OSError(exc.errno, f"could not write {path}: {exc.strerror or exc}") from exc
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _sync_directory(path.parent)


class _Writes:
    """A file object that remembers the OSError of a failed write: torch.save turns one into a RuntimeError
    ("unexpected pos") that names neither the file nor the reason."""

    def __init__(self, f: Any):
        self.f = f
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        try:
            self.f.flush()
        except OSError as exc:
            self.error = exc
            raise


def write_bytes(path: Path, data: bytes) -> None:
    with _replacing(Path(path)) as f:
        f.write(data)


def write_json(path: Path, payload: Any) -> None:
    """`payload` as indented JSON, written whole or not at all."""
    write_bytes(path, (json.dumps(payload, indent=1) + "\n").encode())


# 2: with the sha256 of the structure and the tensors (1, without it, is refused: there is nothing to check it by)
STATE_FORMAT = "bayesadmm-state-2"
OLD_STATE_FORMATS = ("bayesadmm-state-1",)


def _checksum(structure: str, tensors: list) -> str:
    return hash_tensors(hashlib.sha256(structure.encode()), tensors).hexdigest()


def sealed(structure: str, tensors: list) -> dict:
    """What `dump_state` saves for a structure (JSON text) and its tensors: with their checksum."""
    return {"format": STATE_FORMAT, "structure": structure, "tensors": tensors, "sha256": _checksum(structure, tensors)}


def dump_state(tree: Any, f: Any) -> None:
    """A state tree (`bayesadmm.trees`) into the binary file object `f`, as its JSON structure and tensors, with
    their sha256 (checked by `read_state`)."""
    structure, tensors = flatten(tree)
    torch.save(sealed(json.dumps(structure), tensors), f)


def read_state(f: Any, map_location: str | None = None) -> Any:
    """The tree `dump_state` wrote (nothing but tensors and plain values is ever loaded), its checksum verified; a
    TreeError or torch's UnpicklingError for anything else. `map_location="cpu"` reads a GPU run's tensors on a
    machine without one."""
    payload = torch.load(f, weights_only=True, map_location=map_location)
    if isinstance(payload, dict) and payload.get("format") in OLD_STATE_FORMATS:
        raise OldStateError("written by an older bayesadmm, without a checksum")
    if not isinstance(payload, dict) or payload.get("format") != STATE_FORMAT:
        raise TreeError("not a state file written by bayesadmm")
    structure, tensors = payload.get("structure"), payload.get("tensors")
    if not (isinstance(structure, str) and isinstance(tensors, list) and all(isinstance(t, Tensor) for t in tensors)):
        raise TreeError("not a state file written by bayesadmm")
    if payload.get("sha256") != _checksum(structure, tensors):
        raise TreeError("its checksum does not match: the file was changed or damaged after it was written")
    return unflatten(json.loads(structure), tensors)


def save_state(path: Path, tree: Any) -> None:
    """`dump_state` to `path`, written whole or not at all."""
    with _replacing(Path(path)) as f:
        writes = _Writes(f)
        try:
            dump_state(tree, writes)
        except RuntimeError:
            if writes.error is None:
                raise
            raise writes.error from None  # an OSError, which _replacing turns into one naming the file


def load_state(path: Path, map_location: str | None = None) -> Any:
    """The tree `save_state` wrote to `path`; a RunDirError naming the file if it is not one (or was tampered with).
    `map_location`: as `read_state`."""
    fd = _open_regular(Path(path))  # a link or a FIFO: refused before it is opened
    try:
        with os.fdopen(fd, "rb") as f:
            return read_state(f, map_location)
    except OldStateError:
        raise RunDirError(
            f"{path} was written by an older bayesadmm (no checksum to verify it by); start the run again"
        ) from None
    except Exception as exc:  # noqa: BLE001 — a truncated, foreign or crafted file fails in many ways
        reason = str(exc).split(". ")[0].splitlines()[0] if str(exc) else ""  # torch's messages run to paragraphs
        raise RunDirError(
            f"{path} is not a readable bayesadmm state file ({type(exc).__name__}: {reason}); "
            "it is truncated, corrupt or not a checkpoint: start the run again with --overwrite"
        ) from None


@contextlib.contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """Hold run_dir's lock for the block; a RunDirError naming the holder if another process has it. The lock file is
    removed on the way out while the lock is still held, so a finished run leaves none; a process that opened the
    file before it was removed finds, once it holds the lock, that the file is no longer the one at the path, and
    takes the lock again on a new file (so two writers never hold two files). A killed run's file stays, and the
    kernel released its lock."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, as before
        yield
        return
    path = Path(run_dir) / LOCK
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
        except OSError as exc:  # ELOOP: a link in its place
            raise RunDirError(f"cannot open the lock file {path} ({exc.strerror}); remove it and try again") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = "another process"
            with contextlib.suppress(OSError):  # the holder may have removed the file as it ended
                holder = path.read_text().strip() or holder
            raise RunDirError(
                f"{run_dir} is in use by {holder}; wait for that run to end, or choose another out="
            ) from None
        if _same_file(fd, path):
            break
        os.close(fd)  # removed by the holder that just finished: lock the file now at the path
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"process {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # still holding the lock: no other process holds this file
        os.close(fd)  # releases the lock


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is the file at `path` (not one removed since it was opened)."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    opened = os.fstat(fd)
    return (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino)


def prepare_fresh(run_dir: Path, overwrite: bool) -> None:
    """Make sure a fresh run may start in run_dir: refused where a run is already, unless `overwrite`, which removes
    that run's files (and nothing else)."""
    run_dir = Path(run_dir)
    found = [name for name in RUN_FILES if os.path.lexists(run_dir / name)]
    if not found:
        return
    if not overwrite:
        status = _status(run_dir)
        raise RunDirError(
            f"{run_dir} holds a run already ({status}); choose another out=, resume it, or overwrite it "
            f"(--overwrite, or overwrite=True)"
        )
    for name in found:
        (run_dir / name).unlink()  # a link is removed, not the file it points to
    shards = run_dir / SHARDS
    if os.path.islink(shards):
        shards.unlink()
    else:
        shutil.rmtree(shards, ignore_errors=True)  # rmtree removes links inside, never what they point to


def _status(run_dir: Path) -> str:
    try:
        status = json.loads(read_bytes(run_dir / "status.json"))
        return f"status {status['status']} at round {status['round']}"
    except (OSError, ValueError, KeyError, TypeError):  # RunDirError is a ValueError
        return "its files are there"


def read_checkpoint(path: Path, rounds: int) -> dict:
    """The checkpoint at `path`, checked to be one this run can continue from (a RunDirError naming the file if not).
    Read without unpickling (`load_state`)."""
    if not os.path.lexists(path):
        raise RunDirError(f"{path.parent} has no checkpoint to resume from; start the run without resume")
    checkpoint = load_state(path)
    if not isinstance(checkpoint, dict) or not {"round", "server"} <= set(checkpoint):
        raise RunDirError(f"{path} is not a bayesadmm checkpoint (no round and server state)")
    if not ("clients" in checkpoint or "shards" in checkpoint):
        raise RunDirError(f"{path} holds no client states")
    round_ = checkpoint["round"]
    if isinstance(round_, bool) or not isinstance(round_, int) or not 0 <= round_ <= rounds:
        raise RunDirError(f"{path} is of round {round_!r}, not one of this run's 0..{rounds}")
    return checkpoint
