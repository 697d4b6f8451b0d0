"""Writing a run's checkpoint and its final status: the two records a kill must never leave half-written."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from bayesadmm.engine.rundir import save_state, write_json
from bayesadmm.engine.runners import ClientRunner, remove_stale_shards

__all__ = ["save_checkpoint", "final_status"]


def save_checkpoint(path: Path, round_: int, server: Any, clients: ClientRunner, identity: dict) -> None:
    """checkpoint.pt: the round, the server state and the record of the client states (`clients.save`: the states, or
    the shard files the workers have just written). Written last and renamed into place, so that it only ever names a
    complete state; the shards it does not name are deleted after."""
    record = clients.save(path.parent, round_)
    # never a half-written checkpoint; `identity` (method, configuration, data) is what a resume must match
    save_state(path, {"round": round_, "server": server, **record, "run": identity})
    remove_stale_shards(path.parent, record)


def final_status(path: Path, state: str, round_: int, message: str) -> None:
    """The last status of a run that ended early; a disk that refuses even this leaves the exception to say why."""
    with contextlib.suppress(OSError):
        write_json(path, {"status": state, "round": round_, "message": message})
