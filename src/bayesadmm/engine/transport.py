"""What goes between the engine and its worker processes (`engine.pool`): the requests and answers, as small typed
records (`Start`, `Put`, `Load`, `Save`, `Train`; `Ok`, `Reply`, `Error`; `CLOSE`, `DONE`), messages of tensors
through a pipe (a pickled header with the tensors' layout, then each tensor's raw bytes: no serialisation), and the
shared-memory arena of reply slots (one copy in, in the worker; one copy out, in the parent), whose layouts the parent
checks before it reads them (`layout_bytes`).

Server and client states go through a pipe in the checkpoints' format (`dump_state`), never pickled.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch

from bayesadmm.algorithms.base import Message
from bayesadmm.engine.rundir import dump_state, read_state

__all__ = [
    "Start",
    "Put",
    "Load",
    "Save",
    "Train",
    "Ok",
    "Reply",
    "Error",
    "CLOSE",
    "DONE",
    "ARENA_BYTES",
    "dumps",
    "loads",
    "payload",
    "send_tensors",
    "receive_tensors",
    "aligned",
    "layout_bytes",
    "check_reply",
    "write_arena",
    "read_arena",
]

# ---- requests (parent → worker) and answers (worker → parent) ------------------------------------------------------

CLOSE = "close"  # the parent's last request: the worker returns
DONE = "done"  # the worker has sent every reply of a round


class Start(NamedTuple):
    """Make every client's initial state from the initial server state (`dump_state` bytes)."""

    server: bytes


class Put(NamedTuple):
    """Take these client states (`dump_state` bytes of {client: state}), from a checkpoint written by one process."""

    states: bytes


class Load(NamedTuple):
    """Read the worker's clients' states from the checkpoint's shards (in `run_dir`)."""

    run_dir: Path
    shards: list
    initial: bytes | None = None  # `dump_state` bytes of the initial server state (a disk store's fresh clients)


class Save(NamedTuple):
    """Write the worker's clients' states to the shard file `path`; the answer is the shard's entry."""

    path: Path


class Train(NamedTuple):
    """Train `chosen` in round `round`; the broadcast's tensors (of `layout`) follow in the pipe."""

    round: int
    chosen: list[int]
    layout: list


class Ok(NamedTuple):
    """A request other than `Train` is done; its result."""

    value: Any


class Reply(NamedTuple):
    """A client's reply: in the worker's arena at `offset`, or (offset None) its tensors follow in the pipe."""

    client: int
    offset: int | None
    info: dict
    layout: list


class Error(NamedTuple):
    """A request failed in the worker: the exception (or a RuntimeError saying what it was) and its traceback."""

    exception: BaseException
    traceback: str


# ---- messages of tensors through a pipe: a header, then each tensor's bytes ----------------------------------------


def dumps(obj) -> bytes:
    buffer = io.BytesIO()
    dump_state(obj, buffer)  # the checkpoints' format: no pickle between processes either
    return buffer.getvalue()


def loads(payload: bytes):
    return read_state(io.BytesIO(payload))


def _raw(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (also for dtypes numpy lacks, e.g. bfloat16)."""
    return tensor.reshape(-1).view(torch.uint8).numpy().data


def payload(message: Message) -> tuple[list, list[torch.Tensor]]:
    """A message's layout (key, dtype, shape, device) and its tensors as contiguous CPU tensors."""
    tensors = {key: value.detach() for key, value in message.items()}
    layout = [(key, t.dtype, tuple(t.shape), str(t.device)) for key, t in tensors.items()]
    return layout, [t.cpu().contiguous() for t in tensors.values()]


def send_tensors(connection, header: Train | Reply, tensors: list[torch.Tensor]) -> None:
    """The header (with the tensors' layout) as a pickled message, then each tensor's bytes written as they are: the
    reader knows their sizes from the layout, so they need no framing (and `Connection.recv_bytes_into` would copy
    them twice more on the way)."""
    connection.send(header)
    for tensor in tensors:
        view = _raw(tensor)
        while view.nbytes:
            view = view[os.write(connection.fileno(), view) :]


def receive_tensors(connection, layout: list) -> Message:
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


def aligned(nbytes: int) -> int:
    return -(-nbytes // 64) * 64  # every tensor in an arena starts on a 64-byte boundary (any dtype can view it)


def layout_bytes(layout: object) -> int:
    """The bytes that a message of this layout takes in an arena (each tensor `aligned`); ValueError saying what is
    wrong if `layout` is not a list of (key, dtype, shape, device) entries, as `payload` makes them."""
    if not isinstance(layout, list):
        raise ValueError(f"its layout is a {type(layout).__name__}, not a list of (key, dtype, shape, device)")
    total = 0
    for entry in layout:
        if not (isinstance(entry, tuple) and len(entry) == 4):
            raise ValueError(f"its layout has the entry {entry!r}, not (key, dtype, shape, device)")
        key, dtype, shape, device = entry
        if not (isinstance(key, str) and isinstance(dtype, torch.dtype) and isinstance(device, str)):
            raise ValueError(f"its layout has the entry {entry!r}, not (key, dtype, shape, device)")
        if not (isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape)):
            raise ValueError(f"its entry {key!r} has the shape {shape!r}, not a tuple of sizes")
        total += aligned(math.prod(shape) * dtype.itemsize)
    return total


def check_reply(answer: object, pending: set[int], arena_bytes: int) -> Reply:
    """A worker's answer, once checked to be a `Reply` for one of the clients it still owes this round (`pending`),
    with a well-formed layout (`layout_bytes`), inside the worker's arena of `arena_bytes` if it is there: the parent
    checks before it reads the reply's bytes. ValueError saying what is wrong otherwise."""
    if not isinstance(answer, Reply):
        raise ValueError(f"{answer!r} instead of a client's reply")
    k = answer.client
    if not (isinstance(k, int) and k in pending):
        raise ValueError(f"a reply for client {k!r}, which it was not asked for or has sent already")
    try:
        nbytes = layout_bytes(answer.layout)
        offset = answer.offset
        if offset is not None and not (type(offset) is int and 0 <= offset and offset + nbytes <= arena_bytes):
            raise ValueError(f"its {nbytes} bytes at offset {offset!r} are not inside the arena of {arena_bytes} bytes")
        if not isinstance(answer.info, dict):
            raise ValueError(f"its info is a {type(answer.info).__name__}, not a dict")
    except ValueError as exc:
        raise ValueError(f"a malformed reply for client {k} ({exc})") from None
    return answer


def write_arena(arena: torch.Tensor, offset: int, tensors: list[torch.Tensor]) -> None:
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        arena[offset : offset + nbytes].view(tensor.dtype).copy_(tensor.reshape(-1))
        offset += aligned(nbytes)


def read_arena(arena: torch.Tensor, offset: int, layout: list) -> Message:
    """A copy of the message at `offset` (the worker writes the slot again once the parent says it has copied it,
    `engine.pool`; the parent checks first that the layout lies inside the arena, `layout_bytes`). The bytes
    are copied by one memcpy, not by torch's copy, which splits a reply of the papers' MLP over the parent's threads:
    on a machine whose other cores are busy those wait for each other (~5 ms a reply on a loaded 2-core machine)."""
    message = {}
    whole = _raw(arena)
    for key, dtype, shape, device in layout:
        nbytes = math.prod(shape) * dtype.itemsize
        tensor = torch.empty(shape, dtype=dtype)
        if nbytes:
            _raw(tensor)[:] = whole[offset : offset + nbytes]
        message[key] = tensor if device == "cpu" else tensor.to(device)
        offset += aligned(nbytes)
    return message
