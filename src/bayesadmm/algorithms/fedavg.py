"""FedAvg (McMahan et al. 2017) as the FedLap paper runs it (`fedlap-digest.md` §1.4, §2), in MEAN-loss units.

    client:  θ_k ← E epochs of Adam on ℓ̄_k(θ) = ℓ_k(θ)/N_k, starting from θ_g (fresh optimizer state each round)
    server:  θ_g ← (1/|P|) Σ_{k∈P} θ_k                          (unweighted, Eq. 2 of the FedLap paper)
         or  θ_g ← Σ_{k∈P} N_k θ_k / Σ_{k∈P} N_k                 (`weighted=True`, McMahan et al.'s weighting)

P is the set of clients that replied this round. Both papers write the unweighted mean (the digest's [reading]: they
do not say whether their experiments weighted by N_k), so that is the default; every reply carries "num-examples"
so that the weighted variant needs no extra round trip.

Absent clients (partial participation): the server averages the participants only, as FedAvg samples clients and
averages the sampled ones; a stale θ_k of an absent client is a model trained from an older θ_g and would pull the
average back. The server records only which clients have replied (`seen_clients`): storing their replies would cost a
model per client that FedAvg never reads. Clients keep no state. A round with no replies is an error.

Messages: broadcast {"theta": θ_g}; reply {"theta": θ_k, "num-examples": N_k (a 0-d tensor of θ's dtype)}.
FedProx (`fedprox.py`) shares this server and these states.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, DivergenceError, Message, PointEstimate, seen_clients, stacked
from bayesadmm.solvers.adam import local_adam


class ServerState(NamedTuple):
    theta: Tensor                       # θ_g
    clients: tuple[int, ...]            # ids of the clients that have replied so far
    round: int = 0                      # completed rounds


class ClientState(NamedTuple):
    """Empty: nothing carries over between a FedAvg client's rounds (fresh Adam state, start from θ_g)."""


def average(replies: Mapping[int, Message], weighted: bool) -> Tensor:
    """The server's θ_g: the mean of the replies' θ_k, weighted by their "num-examples" if `weighted`.

    Summed in client-id order, so the result does not depend on the order in which the replies arrived.
    """
    ids = sorted(replies)
    if not ids:
        raise ValueError("the server needs at least one reply to average")
    thetas = stacked([replies[k]["theta"] for k in ids])   # a reused buffer: reduced below (in place), not kept
    if not weighted:
        return thetas.mean(dim=0)
    counts = torch.stack([replies[k]["num-examples"] for k in ids]).to(thetas.dtype)
    if not bool((counts > 0).all()):
        raise ValueError(f"weighted averaging needs positive num-examples, got {counts.tolist()}")
    return thetas.mul_(counts[:, None]).sum(dim=0) / counts.sum()   # in place: (N_k θ_k) with no second matrix


def reply_for(theta: Tensor, data) -> Message:
    return {"theta": theta, "num-examples": torch.tensor(float(data.num_examples), dtype=theta.dtype,
                                                         device=theta.device)}


def require_generator(name: str, generator) -> None:
    if generator is None:
        raise ValueError(f"{name}: client_update needs the client's torch.Generator (it shuffles the minibatches)")


def averaging_server(name: str, weighted: bool):
    """init_server, broadcast, server_update and posterior of FedAvg and FedProx."""

    def init_server(theta0: Tensor) -> ServerState:
        return ServerState(theta0, (), 0)

    def broadcast(server: ServerState) -> Message:
        return {"theta": server.theta}

    def server_update(server: ServerState, replies: Mapping[int, Message]):
        if not replies:
            raise ValueError(f"{name}: server_update needs at least one reply")
        theta = average(replies, weighted)
        if not bool(torch.isfinite(theta).all()):
            raise DivergenceError(f"{name}: the server parameters are not finite")
        return ServerState(theta, seen_clients(server.clients, replies), server.round + 1), {"clients": len(replies)}

    def posterior(server: ServerState) -> PointEstimate:
        return PointEstimate(server.theta)

    return init_server, broadcast, server_update, posterior


def make(*, lr: float = 1e-3, epochs: int = 1, batch_size: int = 32, weighted: bool = False,
         name: str = "fedavg") -> Algorithm:
    """FedAvg: `epochs` epochs of Adam (learning rate `lr`, minibatches of `batch_size`) on each client's mean loss,
    then the (by default unweighted) mean of the participants' parameters."""
    adam = local_adam(name, lr, epochs, batch_size)
    if not isinstance(weighted, bool):
        raise ValueError(f"{name}: weighted must be True or False, got {weighted!r}")
    init_server, broadcast, server_update, posterior = averaging_server(name, weighted)

    def init_client(server: ServerState, client_id: int) -> ClientState:
        return ClientState()

    def client_update(state: ClientState, message: Message, data, generator: torch.Generator):
        require_generator(name, generator)
        theta, steps = adam.train(data, message["theta"], generator)
        return state, reply_for(theta, data), {"iterations": steps}

    return Algorithm(name, init_server, init_client, broadcast, client_update, server_update, posterior)
