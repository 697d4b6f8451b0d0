"""Personalised posteriors, evaluated: each client's own test split (`split_personal`), its personal posterior
(`personal_posterior`: the method's `Algorithm.personal` hook, or local fine-tuning from the global model where the
method keeps no client posterior) and the metrics of the global and the personal model on that split
(`evaluate_personal`, `summarise`), as the engine writes them to personal.jsonl and metrics.jsonl.

Random streams (`generator_for`'s ids, beside the engine's own in `engine.federation`): the split draws from
(seed, 0, `PERSONAL_SPLIT`) alone, so holding data out changes no other random choice; the fine-tuning of client k
in round r from SeedSequence([seed, r, `FINETUNE`, k]) and its predictive's draws from
SeedSequence([seed, r, `PERSONAL_EVALUATION`, k]), so a client's numbers do not depend on the other clients.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, PointEstimate
from bayesadmm.engine.history import append_line
from bayesadmm.engine.simulate import generator_of
from bayesadmm.evaluation.metrics import evaluate
from bayesadmm.likelihoods import Likelihood
from bayesadmm.models import FlatModel
from bayesadmm.solvers.adam import LocalAdam, LocalAdamProx

__all__ = [
    "PERSONAL_SPLIT", "FINETUNE", "PERSONAL_EVALUATION", "FineTune", "Personalisation", "held_out", "split_personal",
    "stream", "personal_posterior", "evaluate_personal", "summarise", "SUMMARISED", "personal",
]  # fmt: skip

PERSONAL_SPLIT, FINETUNE, PERSONAL_EVALUATION = 10**9 + 7, 10**9 + 8, 10**9 + 9
# the metrics summarised over clients (mean and worst), with the direction that is better
SUMMARISED = {"acc": max, "nll": min, "ece": min, "brier": min, "rmse": min, "calibration_error": min, "deviance": min}


@dataclass(frozen=True)
class FineTune:
    """The baseline personal model of a method without client posteriors: `epochs` of Adam from the global mean on
    the client's training data. `lr` and `batch_size` None: the method's own local Adam's where it has one (FedAvg,
    FedProx, FedDyn, ADMM with Adam, the FedLap methods, FedSEP), else 1e-3 and 32 (FedPA's SG-MCMC is no Adam)."""

    epochs: int = 3
    lr: float | None = None
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f"finetune_epochs must be an integer >= 1, got {self.epochs!r}")

    def solver(self, algorithm: Algorithm) -> LocalAdam:
        """The Adam run: this object's lr and batch size, else those of the method's local solver, else defaults."""
        local = algorithm.local.solver if algorithm.local is not None else None
        for _ in range(3):  # into solvers that wrap their Adam run (FedLap-Func's `adam`, FedSEP's inference's)
            if local is None or isinstance(local, (LocalAdam, LocalAdamProx)):
                break
            local = next((getattr(local, a) for a in ("adam", "inference", "solver") if hasattr(local, a)), None)
        lr = self.lr if self.lr is not None else getattr(local, "lr", 1e-3)
        batch_size = self.batch_size if self.batch_size is not None else getattr(local, "batch_size", 32)
        return LocalAdam(lr=float(lr), epochs=self.epochs, batch_size=int(batch_size))


@dataclass(frozen=True)
class Personalisation:
    """What the engine evaluates per client: each client's personal test split `tests` (id → (X, y), on the
    evaluation device), every `every` rounds (0: only after the last round) and at the end, with `finetune` for the
    methods without a personal posterior."""

    tests: Mapping[int, tuple[Tensor, Tensor]]
    every: int = 0
    finetune: FineTune = FineTune()

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"personal_every must be an integer >= 0 (0: the last round only), got {self.every!r}")

    def due(self, round_: int, last_round: int) -> bool:
        """Whether round `round_` is evaluated."""
        return round_ == last_round or (self.every > 0 and round_ % self.every == 0)


def held_out(size: int, fraction: float) -> int:
    """How many of a client's `size` examples its personal test split holds: round(fraction · size), at least one
    and at most size − 1 (a client keeps one training example); 0 for fraction 0 or a client of one example."""
    if fraction <= 0 or size < 2:
        return 0
    return min(size - 1, max(1, round(fraction * size)))


def split_personal(
    parts: Mapping[int, Tensor], fraction: float, generator: torch.Generator
) -> tuple[dict[int, Tensor], dict[int, Tensor]]:
    """Each client's rows `parts[k]` split into (training rows, personal test rows), `held_out` of them drawn at
    random for the test split (clients in id order, one permutation each from `generator`); both sorted."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ValueError(f"personal_split must be in [0, 1) (each client's fraction held out), got {fraction!r}")
    train, test = {}, {}
    for k in sorted(parts):
        rows = parts[k]
        order = torch.randperm(len(rows), generator=generator)
        held = held_out(len(rows), fraction)
        test[k], train[k] = rows[order[:held]].sort().values, rows[order[held:]].sort().values
    return train, test


def stream(seed: int, round_: int, kind: int, client: int) -> torch.Generator:
    """A CPU generator of (seed, round, kind, client) alone (`FINETUNE`, `PERSONAL_EVALUATION`)."""
    return generator_of(seed, round_, kind, client)


def personal_posterior(
    algorithm: Algorithm,
    server: Any,
    state: Any,
    data: Any = None,
    generator: torch.Generator | None = None,
    finetune: FineTune = FineTune(),
) -> Any:
    """Client k's personal posterior: the method's own (`algorithm.personal(server, state)`: BayesADMM's q_k, the
    FedLap methods' local Laplace posterior, FedEP's tilted distribution, ...), or for a method without one a
    `PointEstimate` fine-tuned from the global mean on `data` (client k's training data) with `generator`."""
    if algorithm.personal is not None:
        return algorithm.personal(server, state)
    if data is None or generator is None:
        raise ValueError(
            f"{algorithm.name} keeps no client posterior: its personal model is fine-tuned from the global one; "
            "pass the client's training data (data=) and a generator"
        )
    start = algorithm.posterior(server).mean
    theta, _ = finetune.solver(algorithm).train(data, start, generator)
    return PointEstimate(theta)


def evaluate_personal(
    model: FlatModel,
    global_posterior: Any,
    personal: Mapping[int, Any],
    tests: Mapping[int, tuple[Tensor, Tensor]],
    likelihood: Likelihood,
    samples: int = 32,
    seed: int = 0,
    round_: int = 0,
) -> dict[int, dict[str, Any]]:
    """Per client k (of `personal`, with a non-empty test split): `examples` and the metrics (`metrics.evaluate`:
    at the mean and, where the posterior can be sampled, `ens_` for the predictive over `samples` draws) of the
    global and of its personal posterior on its split `tests[k]`. Both draw from the same generator of
    (seed, round, `PERSONAL_EVALUATION`, k)."""
    results = {}
    for k in sorted(personal):
        X, y = tests[k]
        if len(y) == 0:
            continue
        scores = {
            name: evaluate(model, posterior, X, y, samples, stream(seed, round_, PERSONAL_EVALUATION, k),
                           likelihood=likelihood)
            for name, posterior in (("global", global_posterior), ("personal", personal[k]))
        }  # fmt: skip
        results[k] = {"examples": len(y), **scores}
    return results


def summarise(per_client: Mapping[int, Mapping[str, Any]]) -> dict[str, float]:
    """`{global,personal}_{metric}_{mean,worst}` over the clients for each metric of `SUMMARISED` measured at the
    models' means, and `ens_...` likewise for the predictive where every client's model has one (as metrics.jsonl
    names `test_acc` and `ens_test_acc`); worst is the lowest accuracy, the highest NLL, ECE, ..."""
    line: dict[str, float] = {}
    for prefix in ("", "ens_"):
        for model in ("global", "personal"):
            for metric, best in SUMMARISED.items():
                values = [c[model].get(prefix + metric) for c in per_client.values()]
                if not values or any(v is None or not math.isfinite(v) for v in values):
                    continue
                worst = min if best is max else max
                line[f"{prefix}{model}_{metric}_mean"] = statistics.fmean(values)
                line[f"{prefix}{model}_{metric}_worst"] = worst(values)
    return line


def evaluate_round(
    federation: Any, algorithm: Algorithm, server: Any, states: Mapping[int, Any], seed: int, samples: int, round_: int
) -> dict[int, dict[str, Any]]:
    """`evaluate_personal` of a run's round: each client's personal posterior (`personal_posterior`, fine-tuned on its
    training data `federation.clients(k)` with the generator of (seed, round, `FINETUNE`, k) where the method has
    no hook) against the server's posterior, on the split of `federation.personal`."""
    setup: Personalisation = federation.personal
    personal = {}
    for k in sorted(setup.tests):
        if len(setup.tests[k][1]) == 0:
            continue
        hooked = algorithm.personal is not None
        data = None if hooked else federation.clients(k)
        generator = None if hooked else stream(seed, round_, FINETUNE, k)
        personal[k] = personal_posterior(algorithm, server, states[k], data, generator, setup.finetune)
    global_posterior = algorithm.posterior(server)
    model, likelihood = federation.model, federation.likelihood
    return evaluate_personal(model, global_posterior, personal, setup.tests, likelihood, samples, seed, round_)


def round_metrics(
    run_dir: Path,
    federation: Any,
    algorithm: Algorithm,
    server: Any,
    states: Mapping[int, Any],
    seed: int,
    samples: int,
    round_: int,
) -> dict[str, float]:
    """Every client's global and personal metrics on its own test split (`evaluate_round`), appended to
    run_dir/personal.jsonl; their mean and worst client, and the seconds it took, for the round's metrics line."""
    began = time.perf_counter()
    per_client = evaluate_round(federation, algorithm, server, states, seed, samples, round_)
    append_line(run_dir / "personal.jsonl", personal_record(round_, per_client))
    return {**summarise(per_client), "personal_seconds": time.perf_counter() - began}


def personal_record(round_: int, per_client: Mapping[int, Mapping[str, Any]]) -> dict:
    """A line of personal.jsonl: the round and every evaluated client's metrics (client ids as strings, as JSON keys
    are)."""
    return {"round": round_, "clients": {str(k): dict(v) for k, v in sorted(per_client.items())}}


def personal(result: Any, client: int, data: Any = None, seed: int = 0, finetune: FineTune | None = None) -> Any:
    """Client `client`'s personal posterior of a finished run: `Result.personal` (the method's own, or a model
    fine-tuned on `data` where it keeps none)."""
    return result.personal(client, data, seed, finetune)
