"""The clients of a run, by the names they had when they lived here: where they go (`engine.policy`), in this process
(`engine.runners`), in worker processes (`engine.pool`, over `engine.transport`), batched (`engine.cohort`)."""

from __future__ import annotations

from bayesadmm.engine.policy import assign, default_workers, fixed_cohorts, usable_cores
from bayesadmm.engine.pool import ClientPool, client_runner
from bayesadmm.engine.runners import (
    SHARDS,
    ClientRunner,
    LocalClients,
    RunnerFactory,
    check_states,
    checkpointed_states,
    one_thread,
    remove_stale_shards,
    train_client,
)

__all__ = [
    "LocalClients",
    "ClientPool",
    "ClientRunner",
    "RunnerFactory",
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
