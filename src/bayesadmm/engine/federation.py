"""What a run trains and how it ended: `Federation`, `Result`; the clients of a round (`participants`); the engine's
own random streams and exit codes."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, DivergenceError
from bayesadmm.clients import ClientSource
from bayesadmm.engine.simulate import generator_for
from bayesadmm.likelihoods import Likelihood
from bayesadmm.models import FlatModel
from bayesadmm.solvers.von import SubproblemError

__all__ = ["Federation", "Result", "participants", "PARTICIPANTS", "EVALUATION", "BREAKDOWNS", "EXIT_OK",
           "EXIT_FAILED", "EXIT_DIVERGED"]  # fmt: skip

# The engine's own random streams, generator_for(seed, round, <id>); 10⁹ + 0, 1, 2, 5 are the config layer's set-up
# streams (subsample, partition, initial weights, validation split).
PARTICIPANTS, EVALUATION = 10**9 + 3, 10**9 + 4
BREAKDOWNS = (DivergenceError, SubproblemError, FloatingPointError)
EXIT_OK, EXIT_FAILED, EXIT_DIVERGED = 0, 1, 3


@dataclass(frozen=True)
class Federation:
    """What a run trains and how it is scored. `make_algorithm` is a zero-argument callable returning the Algorithm;
    it and `clients` must pickle for worker processes (module-level functions, `functools.partial`s of them,
    dataclasses of tensors). `metrics`: extra metric callables `fn(outputs (S, N, ...), targets) -> float`."""

    model: FlatModel
    clients: ClientSource
    make_algorithm: Callable[[], Algorithm]
    theta0: Tensor
    eval_X: Tensor
    eval_y: Tensor
    likelihood: Likelihood
    metrics: Mapping[str, Callable[[Tensor, Tensor], float]] = field(default_factory=dict)
    eval_set: str = "test"  # the metrics' prefix: test_*, or val_* for a held-out part of the training set


@dataclass
class Result:
    """How a run ended: `status` (completed, stopped, diverged), the exit code the CLI returns, the last round whose
    state is `server` (the last good one after a divergence), the metrics of every round, and the run directory."""

    status: str
    exit_code: int
    round: int
    history: list[dict]
    server: Any
    algorithm: Algorithm
    run_dir: Path
    message: str = ""
    model: FlatModel | None = None  # the model the posterior's parameter vector belongs to (its layout)
    unlearned: tuple[int, ...] = ()  # the clients `bayesadmm.unlearn` removed from `server` (none for a trained run)

    @property
    def posterior(self) -> Any:
        """The server's posterior (a Gaussian with `.mean` and `.sample`, or a `PointEstimate`)."""
        return self.algorithm.posterior(self.server)

    def client_states(self, clients: Iterable[int] | None = None) -> dict[int, Any]:
        """The client states of the run's last checkpoint (client id → state; all clients, or those asked for), read
        from the run directory without unpickling (`rundir.load_state`). The checkpoint is of round `round` where the
        run ended normally; after a divergence, of the last checkpointed round (`round`, the last good one)."""
        from bayesadmm.engine.rundir import RunDirError, load_state
        from bayesadmm.engine.runners import checkpointed_states

        path = self.run_dir / "checkpoint.pt"
        checkpoint = load_state(path)
        if not isinstance(checkpoint, Mapping) or not ("clients" in checkpoint or "shards" in checkpoint):
            raise RunDirError(f"{path} holds no client states")
        if "clients" in checkpoint:
            ids = sorted(checkpoint["clients"])
        else:
            ids = sorted(k for shard in checkpoint["shards"] for k in shard["clients"])
        return checkpointed_states(checkpoint, self.run_dir, ids if clients is None else clients)


def participants(ids: list[int], participation: float, seed: int, round_: int) -> list[int]:
    """The clients that take part in `round_` (all, or a seeded random fraction), in id order."""
    if participation >= 1.0:
        return list(ids)
    count = max(1, math.ceil(participation * len(ids)))
    order = torch.randperm(len(ids), generator=generator_for(seed, round_, PARTICIPANTS))
    return sorted(ids[i] for i in order[:count].tolist())
