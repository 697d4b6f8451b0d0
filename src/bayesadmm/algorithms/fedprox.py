"""FedProx (Li et al. 2020) as the FedLap paper runs it (`fedlap-digest.md` §1.3), in MEAN-loss units.

    client:  θ_k ← E epochs of Adam on  ℓ̄_k(θ) + μ/2 ‖θ − θ_g‖²,  starting from θ_g (fresh optimizer state)
    server:  θ_g ← (1/|P|) Σ_{k∈P} θ_k      (or N_k-weighted, `fedavg.WeightedMean`; FedAvg's server, `fedavg.py`)

This is the FedLap paper's Eq. 2 with v_k ≡ 0; μ is the paper's α. The proximal term is the SQUARED norm ½μ‖·‖²
(its gradient μ(θ − θ_g) is added to each minibatch gradient of the mean loss): the authors' code used the
un-squared ‖·‖, a defect the spec lists (bayesadmm-spec.md §5), so μ is on the mean-loss scale, the scale of
ADMM's ρ and FedDyn's α here. With μ = 0 this is FedAvg, iterate for iterate (tested).

Absent clients: as FedAvg, the server averages the participants only. Messages are FedAvg's.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, LocalStep, Message, TrainingInfo
from bayesadmm.algorithms.fedavg import (
    LR_SPACE,
    Average,
    ClientState,
    ServerState,
    UnweightedMean,
    average_for,
    averaging_server,
    dp_update,
    reply_for,
)
from bayesadmm.algorithms.spec import Context, MethodSpec
from bayesadmm.algorithms.spec import register as register_method
from bayesadmm.solvers.adam import AdamProblem, local_adam

__all__ = ["ClientState", "ServerState", "make", "Hparams", "SPEC"]


def make(
    *,
    mu: float,
    lr: float = 1e-3,
    epochs: int = 1,
    batch_size: int = 32,
    average: Average | None = None,
    name: str = "fedprox",
) -> Algorithm:
    """FedProx with proximal weight μ ≥ 0 (the FedLap paper's α) on the mean loss; the rest as `fedavg.make`."""
    adam = local_adam(name, lr, epochs, batch_size)
    if isinstance(mu, bool) or not isinstance(mu, numbers.Real) or not math.isfinite(mu) or mu < 0:
        raise ValueError(f"{name}: mu must be a finite number >= 0, got {mu!r}")
    mu = float(mu)
    average = UnweightedMean() if average is None else average
    init_server, broadcast, server_update, posterior = averaging_server(name, average)

    def init_client(server: ServerState, client_id: int) -> ClientState:
        return ClientState()

    def prepare(state: ClientState, message: Message, data) -> AdamProblem:
        theta_g = message["theta"]
        return AdamProblem(theta_g, prox_weight=mu, prox_center=theta_g)

    def finish(state: ClientState, message: Message, data, problem: AdamProblem, result: tuple[Tensor, int]):
        theta, steps = result
        return state, reply_for(theta, data), TrainingInfo(steps)

    local = LocalStep(adam, prepare, finish)
    return Algorithm.from_local(name, init_server, init_client, broadcast, local, server_update, posterior)


@dataclass(frozen=True)
class Hparams:
    """FedProx's hyperparameters: the proximal weight `mu`; the rest as FedAvg's (`fedavg.Hparams`)."""

    mu: float
    lr: float = 1e-3
    epochs: int = 1
    batch_size: int = 32
    weighted: bool = False

    def __post_init__(self) -> None:
        average_for(self.weighted, "fedprox")


def build(hparams: Hparams, context: Context) -> Algorithm:
    return make(
        mu=hparams.mu,
        lr=hparams.lr,
        epochs=hparams.epochs,
        batch_size=hparams.batch_size,
        average=average_for(hparams.weighted, "fedprox"),
        name="fedprox",
    )


SPEC = register_method(
    MethodSpec(
        name="fedprox",
        hparams=Hparams,
        build=build,
        summary="FedProx: FedAvg with a proximal term μ/2‖θ − θ_g‖² on each client",
        # mu (required) a hundred times either side of the scenario's: the span of the FedLap paper's grid
        search_space={**LR_SPACE, "mu": {"around": [0.01, 100]}},
        example={"lr": 0.05, "epochs": 2, "batch_size": 8, "mu": 0.01},
        dp_update=dp_update,
    )
)
