"""FedAvg (McMahan et al. 2017) as the FedLap paper runs it (`fedlap-digest.md` §1.4, §2), in MEAN-loss units.

    client:  θ_k ← E epochs of Adam on ℓ̄_k(θ) = ℓ_k(θ)/N_k, starting from θ_g (fresh optimizer state each round)
    server:  θ_g ← (1/|P|) Σ_{k∈P} θ_k                          (`UnweightedMean`, Eq. 2 of the FedLap paper)
         or  θ_g ← Σ_{k∈P} N_k θ_k / Σ_{k∈P} N_k                 (`WeightedMean`, McMahan et al.'s weighting)

P is the set of clients that replied this round. Both papers write the unweighted mean (the digest's [reading]: they
do not say whether their experiments weighted by N_k), so that is the default; every reply carries "num-examples"
so that the weighted variant needs no extra round trip. (The method's `weighted=True` picks `WeightedMean`.)

Absent clients (partial participation): the server averages the participants only, as FedAvg samples clients and
averages the sampled ones; a stale θ_k of an absent client is a model trained from an older θ_g and would pull the
average back. The server records only which clients have replied (`seen_clients`): storing their replies would cost a
model per client that FedAvg never reads. Clients keep no state. A round with no replies is an error.

Messages: broadcast {"theta": θ_g}; reply {"theta": θ_k, "num-examples": N_k (a 0-d tensor of θ's dtype)}.
FedProx (`fedprox.py`) shares this server and these states.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms.base import (
    Algorithm,
    DivergenceError,
    LocalStep,
    Message,
    PointEstimate,
    ServerInfo,
    StackBuffer,
    TrainingInfo,
    seen_clients,
)
from bayesadmm.algorithms.client_update import ClientUpdate
from bayesadmm.algorithms.spec import Context, MethodSpec
from bayesadmm.algorithms.spec import register as register_method
from bayesadmm.solvers.adam import AdamProblem, local_adam
from bayesadmm.trees import register

# θ_g from the participants' replies {client id: {"theta": θ_k, "num-examples": N_k}}
Average = Callable[[Mapping[int, Message]], Tensor]


@register
class ServerState(NamedTuple):
    theta: Tensor  # θ_g
    clients: tuple[int, ...]  # ids of the clients that have replied so far
    round: int = 0  # completed rounds


@register
class ClientState(NamedTuple):
    """Empty: nothing carries over between a FedAvg client's rounds (fresh Adam state, start from θ_g)."""


class UnweightedMean:
    """θ_g = (1/|P|) Σ_{k∈P} θ_k, summed in client-id order (so the result does not depend on the order in which the
    replies arrived). Stacks into its own reused buffer (`StackBuffer`): make one per algorithm."""

    def __init__(self) -> None:
        self.stack = StackBuffer()

    def __call__(self, replies: Mapping[int, Message]) -> Tensor:
        return self.stack(thetas_of(replies)).mean(dim=0)


class WeightedMean:
    """θ_g = Σ_{k∈P} N_k θ_k / Σ_{k∈P} N_k with N_k the replies' "num-examples", in client-id order. Stacks into its
    own reused buffer (`StackBuffer`): make one per algorithm."""

    def __init__(self) -> None:
        self.stack = StackBuffer()

    def __call__(self, replies: Mapping[int, Message]) -> Tensor:
        thetas = self.stack(thetas_of(replies))  # a reused buffer: reduced below (in place), not kept
        counts = torch.stack([replies[k]["num-examples"] for k in sorted(replies)]).to(thetas.dtype)
        if not bool((counts > 0).all()):
            raise ValueError(f"weighted averaging needs positive num-examples, got {counts.tolist()}")
        return thetas.mul_(counts[:, None]).sum(dim=0) / counts.sum()  # in place: (N_k θ_k) with no second matrix


def thetas_of(replies: Mapping[int, Message]) -> list[Tensor]:
    """The replies' θ_k in client-id order."""
    if not replies:
        raise ValueError("the server needs at least one reply to average")
    return [replies[k]["theta"] for k in sorted(replies)]


def reply_for(theta: Tensor, data) -> Message:
    return {
        "theta": theta,
        "num-examples": torch.tensor(float(data.num_examples), dtype=theta.dtype, device=theta.device),
    }


def averaging_server(name: str, average: Average):
    """init_server, broadcast, server_update and posterior of FedAvg and FedProx."""

    def init_server(theta0: Tensor) -> ServerState:
        return ServerState(theta0, (), 0)

    def broadcast(server: ServerState) -> Message:
        return {"theta": server.theta}

    def server_update(server: ServerState, replies: Mapping[int, Message]) -> tuple[ServerState, ServerInfo]:
        if not replies:
            raise ValueError(f"{name}: server_update needs at least one reply")
        theta = average(replies)
        if not bool(torch.isfinite(theta).all()):
            raise DivergenceError(f"{name}: the server parameters are not finite")
        return ServerState(theta, seen_clients(server.clients, replies), server.round + 1), ServerInfo(len(replies))

    def posterior(server: ServerState) -> PointEstimate:
        return PointEstimate(server.theta)

    return init_server, broadcast, server_update, posterior


def make(
    *, lr: float = 1e-3, epochs: int = 1, batch_size: int = 32, average: Average | None = None, name: str = "fedavg"
) -> Algorithm:
    """FedAvg: `epochs` epochs of Adam (learning rate `lr`, minibatches of `batch_size`) on each client's mean loss,
    then `average` of the participants' parameters (default: a new `UnweightedMean`)."""
    adam = local_adam(name, lr, epochs, batch_size)
    average = UnweightedMean() if average is None else average
    init_server, broadcast, server_update, posterior = averaging_server(name, average)

    def init_client(server: ServerState, client_id: int) -> ClientState:
        return ClientState()

    def prepare(state: ClientState, message: Message, data) -> AdamProblem:
        return AdamProblem(message["theta"])

    def finish(state: ClientState, message: Message, data, problem: AdamProblem, result: tuple[Tensor, int]):
        theta, steps = result
        return state, reply_for(theta, data), TrainingInfo(steps)

    local = LocalStep(adam, prepare, finish)
    return Algorithm.from_local(name, init_server, init_client, broadcast, local, server_update, posterior)


def average_for(weighted: bool, name: str) -> Average:
    """A new server average (each with its own stacking buffer): N_k-weighted if `weighted`."""
    if weighted is not True and weighted is not False:
        raise ValueError(f"{name}: weighted must be True or False, got {weighted!r}")
    return WeightedMean() if weighted else UnweightedMean()


@dataclass(frozen=True)
class Hparams:
    """FedAvg's hyperparameters: the local Adam run (`lr`, `epochs`, `batch_size`) and the server's mean, unweighted
    or (`weighted`) weighted by the clients' sizes."""

    lr: float = 1e-3
    epochs: int = 1
    batch_size: int = 32
    weighted: bool = False

    def __post_init__(self) -> None:
        average_for(self.weighted, "fedavg")


def dp_update(hparams: Hparams) -> ClientUpdate:
    """Client-level DP's update: θ_k − θ_g; the N_k-weighted mean would weight a client by its size, beyond the
    clip, so it is refused."""
    if hparams.weighted:
        raise ValueError(
            "client-level DP needs the unweighted mean (a weight N_k scales a client's update past the clip): "
            "set weighted=false"
        )
    return ClientUpdate((("theta", "theta"),), empty_round=noised_round)


def noised_round(server: ServerState, reply: Message) -> tuple[ServerState, ServerInfo]:
    """Client-level DP's round that no client took part in (Poisson sampling drew none): θ_g becomes the reply's θ,
    the broadcast θ_g moved by the noise alone (`privacy.client_level`); FedAvg's and FedProx's."""
    theta = reply["theta"]
    if not bool(torch.isfinite(theta).all()):
        raise DivergenceError("the server parameters are not finite")
    return ServerState(theta, server.clients, server.round + 1), ServerInfo(0)


def build(hparams: Hparams, context: Context) -> Algorithm:
    return make(
        lr=hparams.lr,
        epochs=hparams.epochs,
        batch_size=hparams.batch_size,
        average=average_for(hparams.weighted, "fedavg"),
        name="fedavg",
    )


# Adam's lr: ten times either side of the scenario's (its preset's) lr; a run that sets none, the method's default
# 1e-3 ten times either side
LR_SPACE = {"lr": {"around": [0.1, 10], "log": [1e-4, 1e-2]}}

SPEC = register_method(
    MethodSpec(
        name="fedavg",
        hparams=Hparams,
        build=build,
        summary="FedAvg: the participants' Adam-trained parameters averaged",
        search_space=LR_SPACE,
        example={"lr": 0.05, "epochs": 2, "batch_size": 8},
        dp_update=dp_update,
    )
)
