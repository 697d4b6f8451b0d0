"""A user's own model and federated method, as a Flower app names them (``model = "user_app:make_model"``,
``algorithm = "user_app:make_algorithm"``): states are the user's own NamedTuple and dataclass, outside bayesadmm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from bayesadmm import trees
from bayesadmm.algorithms import Algorithm
from bayesadmm.algorithms.base import PointEstimate


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


class Server(NamedTuple):
    theta: torch.Tensor
    rounds: int


@dataclass(frozen=True)
class Client:
    dual: torch.Tensor   # a per-client correction that must survive between rounds (and restarts)
    updates: int


class Info(NamedTuple):
    loss: float


trees.register(Server, Client)  # the states of a method of one's own, allowed in records and checkpoints


def make_algorithm(dim: int, lr: float = 0.1, steps: int = 5, batch: int = 8, rho: float = 0.5) -> Algorithm:
    """A small proximal method with a dual per client (FedDyn-like), in the user's own state classes."""

    def init_server(theta0):
        return Server(theta0.clone(), 0)

    def init_client(server, k):
        return Client(torch.zeros_like(server.theta), 0)

    def broadcast(server):
        return {"theta": server.theta}

    def client_update(state, message, data, generator):
        anchor = message["theta"]
        theta = anchor.clone().requires_grad_(True)
        loss = torch.zeros(())
        for _ in range(steps):
            idx = torch.randint(0, data.num_examples, (batch,), generator=generator)
            loss = data.batch_loss(theta, idx)
            objective = loss - (state.dual * theta).sum() + 0.5 * rho * ((theta - anchor) ** 2).sum()
            (grad,) = torch.autograd.grad(objective, theta)
            theta = (theta - lr * grad).detach().requires_grad_(True)
        theta = theta.detach()
        dual = state.dual - rho * (theta - anchor)
        return Client(dual, state.updates + 1), {"theta": theta}, Info(float(loss))

    def server_update(server, replies):
        thetas = [replies[k]["theta"] for k in sorted(replies)]
        return Server(torch.stack(thetas).mean(0), server.rounds + 1), Info(0.0)

    def posterior(server):
        return PointEstimate(server.theta)

    return Algorithm("user-prox", init_server, init_client, broadcast, client_update, server_update, posterior)


def tensors(seed: int, clients: int = 3, per_client: int = 40):
    """Synthetic 3-class data: each client's (X, y) and a test set."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(4, 3, generator=g, dtype=torch.float64)
    parts = []
    for k in range(clients + 1):
        X = torch.randn(per_client + 10 * k, 4, generator=g, dtype=torch.float64)
        y = (X @ w + 0.3 * torch.randn(X.shape[0], 3, generator=g, dtype=torch.float64)).argmax(1)
        parts.append((X, y))
    return parts[:clients], parts[clients]


def load_client(node_config: dict):
    """A node's own loader (``loader = "user_app:load_client"``): reads the file its node config names under
    ``my-file`` and returns (X, y)."""
    from bayesadmm.flower.loaders import load_tensors

    return load_tensors(node_config["my-file"])
