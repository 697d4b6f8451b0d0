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
from bayesadmm.engine.personal import FINETUNE, FineTune, personal_posterior, stream
from bayesadmm.engine.rundir import RunDirError, load_state
from bayesadmm.engine.runners import checkpointed_states, initial_states
from bayesadmm.engine.simulate import generator_for
from bayesadmm.engine.store import check_block_list
from bayesadmm.likelihoods import Likelihood
from bayesadmm.models import FlatModel
from bayesadmm.posterior.artefact import Posterior
from bayesadmm.solvers.von import SubproblemError

__all__ = ["Federation", "Result", "StaleResult", "participants", "PARTICIPANTS", "EVALUATION", "BREAKDOWNS",
           "EXIT_OK", "EXIT_FAILED", "EXIT_DIVERGED"]  # fmt: skip

# The engine's own random streams, generator_for(seed, round, <id>); 10⁹ + 0, 1, 2, 5, 6 are the config layer's set-up
# streams (subsample, partition, initial weights, validation split, test rows), 10⁹ + 7, 8, 9 the personal split,
# fine-tuning and personal evaluation (`engine.personal`), 10⁹ + 10 client-level DP's noise (`privacy.client_level`).
PARTICIPANTS, EVALUATION = 10**9 + 3, 10**9 + 4
BREAKDOWNS = (DivergenceError, SubproblemError, FloatingPointError)
EXIT_OK, EXIT_FAILED, EXIT_DIVERGED = 0, 1, 3


@dataclass(frozen=True)
class Federation:
    """What a run trains and how it is scored. `make_algorithm` is a zero-argument callable returning the Algorithm;
        it and `clients` must pickle for worker processes (module-level functions, `functools.partial`s of them,
        dataclasses of tensors). `metrics`: extra metric callables `fn(outputs (S, N, ...), targets) -> float`. `ood_X`:
    inputs from outside the training distribution; where given, each evaluation also reports the OOD AUROCs and the
    selective accuracies (`bayesadmm.evaluation.metrics.evaluate`'s `ood`), and without it nothing of the metrics
    changes."""

    model: FlatModel
    clients: ClientSource
    make_algorithm: Callable[[], Algorithm]
    theta0: Tensor
    eval_X: Tensor | None  # None: the run is scored elsewhere (a Flower strategy's clients), no metrics here
    eval_y: Tensor | None
    likelihood: Likelihood
    metrics: Mapping[str, Callable[[Tensor, Tensor], float]] = field(default_factory=dict)
    eval_set: str = "test"  # the metrics' prefix: test_*, or val_* for a held-out part of the training set
    # a scenario's run: its zoo model (name and keyword arguments), data set, preprocessing and likelihood, as plain
    # values; recorded in the posterior file so that `bayesadmm predict` can rebuild the model (never code)
    scenario: Mapping[str, Any] | None = None
    # each client's personal test split and how it is evaluated (`engine.personal.Personalisation`); None: not at all
    personal: Any = None
    ood_X: Tensor | None = None  # out-of-distribution inputs: the uncertainty metrics at each evaluation (classifiers)


class StaleResult(ValueError):
    """A `Result` whose run directory now holds another round's checkpoint (the run was resumed or run again since
    the Result was made): what it would read from there is not of its round."""


@dataclass
class Result:
    """How a run ended: `status` (completed, stopped, diverged, budget), the exit code the CLI returns, the last round
    whose state is `server` (the last good one after a divergence), the metrics of every round, and the run
    directory."""

    status: str
    exit_code: int
    round: int
    history: list[dict]
    server: Any
    algorithm: Algorithm
    run_dir: Path
    message: str = ""
    model: FlatModel | None = None  # the model the posterior's parameter vector belongs to (its layout)
    scenario: Mapping[str, Any] | None = None  # `Federation.scenario` of a scenario's run

    unlearned: tuple[int, ...] = ()  # the clients `bayesadmm.unlearn` removed from `server` (none for a trained run)

    @property
    def provenance(self) -> dict[str, Any]:
        """Where the posterior comes from: method, round, run directory and, for a scenario's run, the scenario."""
        found = {"method": self.algorithm.name, "round": self.round, "run": str(self.run_dir)}
        found |= {"unlearned": list(self.unlearned)} if self.unlearned else {}
        return found | ({"scenario": dict(self.scenario)} if self.scenario else {})

    @property
    def posterior(self) -> Any:
        """The server's posterior as a `bayesadmm.Posterior` (a `GaussianPosterior` with `.mean`, `.precision` and
        `.sample`, or a `PointPosterior`, a `PointEstimate`) with the model's layout: `.save`, `.to_module`,
        `.predict`. A user's algorithm whose posterior is neither (or a Result without its model) gives the
        algorithm's own object."""
        return self._product(self.algorithm.posterior(self.server), {})

    def personal(self, client: int, data: Any = None, seed: int = 0, finetune: Any = None) -> Any:
        """Client `client`'s personal posterior at the end of the run: the method's own (`Algorithm.personal` of the
        server and the client's checkpointed state: BayesADMM's q_k, FedLap-Cov's local Laplace posterior, FedEP's
        tilted distribution, ...), or, for a method without one, a `PointEstimate` fine-tuned from the global mean on
        `data` (the client's training data) with `finetune` (`engine.personal.FineTune`) and the generator of
        (seed, round, FINETUNE, client): pass the run's seed for the engine's numbers. A `bayesadmm.Posterior` (with
        the model's layout, so `.save`, `.to_module`, `.predict`) whose provenance names the client."""
        hooked = self.algorithm.personal is not None
        state = self.client_states([client])[client] if hooked else None
        generator = None if hooked else stream(seed, self.round, FINETUNE, client)
        distribution = personal_posterior(self.algorithm, self.server, state, data, generator, finetune or FineTune())
        return self._product(distribution, {"client": client})

    def _product(self, distribution: Any, extra: Mapping[str, Any]) -> Any:
        """`distribution` as a `bayesadmm.Posterior` with the model's layout and this run's provenance (plus
        `extra`); a user's algorithm's own posterior type, or a Result without its model, as it is."""
        if self.model is None:
            return distribution
        try:
            return Posterior.of(distribution, self.model, self.provenance | dict(extra))
        except TypeError:
            return distribution

    def client_states(self, clients: Iterable[int] | None = None) -> dict[int, Any]:
        """The client states of the run's last checkpoint (client id → state; all clients, or those asked for), read
        from the run directory without unpickling (`rundir.load_state`). The checkpoint is of round `round` where the
        run ended normally; after a divergence, of the last checkpointed round (`round`, the last good one). A
        `StaleResult` error where the directory's checkpoint is now of another round (the run was resumed or run
        again since): its client states would not be those of this Result's server."""
        path = self.run_dir / "checkpoint.pt"
        checkpoint = load_state(path)
        if not isinstance(checkpoint, Mapping) or not ("clients" in checkpoint or "shards" in checkpoint):
            raise RunDirError(f"{path} holds no client states")
        check_block_list(checkpoint, path)
        if checkpoint.get("round") != self.round:
            raise StaleResult(
                f"this Result is of round {self.round}; {self.run_dir} now holds round {checkpoint.get('round')!r}: "
                f"bayesadmm.load({str(self.run_dir)!r}) reads it"
            )
        if "clients" in checkpoint:
            ids = sorted(checkpoint["clients"])
        else:
            ids = sorted(k for shard in checkpoint["shards"] for k in shard["clients"])
        initial = initial_states(self.algorithm, checkpoint.get("initial"))  # a disk store's never-written clients
        return checkpointed_states(checkpoint, self.run_dir, ids if clients is None else clients, initial)


def participants(ids: list[int], participation: float, seed: int, round_: int, sampling: str = "fixed") -> list[int]:
    """The clients that take part in `round_`, in id order: all at participation 1; else, by `sampling`, "fixed":
    ⌈participation · K⌉ of the K clients drawn without replacement, or "poisson": each client independently with
    probability `participation` (client-level DP's sampling, which its accountant analyses: the count varies from
    round to round and may be 0). Both from the generator of (seed, round, PARTICIPANTS) alone, so a resume and any
    number of workers choose the same clients."""
    if participation >= 1.0:
        return list(ids)
    generator = generator_for(seed, round_, PARTICIPANTS)
    if sampling == "poisson":
        drawn = torch.rand(len(ids), generator=generator, dtype=torch.float64) < participation
        return sorted(ids[i] for i in drawn.nonzero().flatten().tolist())
    if sampling != "fixed":
        raise ValueError(f"client sampling must be 'fixed' or 'poisson', got {sampling!r}")
    count = max(1, math.ceil(participation * len(ids)))
    order = torch.randperm(len(ids), generator=generator)
    return sorted(ids[i] for i in order[:count].tolist())
