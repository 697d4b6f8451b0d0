"""A method module of your own: FedAvg with server momentum (FedAvgM, Hsu et al. 2019) as the method "fedavgm".

Importing this file registers the method, after which it is a name like the built-in ones:

    bayesadmm run diabetes-iid5 method=fedavgm rounds=5 --methods examples/my_methods.py
    bayesadmm sweep diabetes-iid5 method=fedavgm momentum=0,0.9 --out runs/fedavgm --methods examples/my_methods.py

or, from Python, `import my_methods` (or `bayesadmm.algorithms.spec.load("examples/my_methods.py")`) and
`bayesadmm.run(model, clients, test, algorithm="fedavgm", hparams={"momentum": 0.9})`.
docs/guides/own-algorithm.md explains each part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

import bayesadmm
from bayesadmm.algorithms import Context, MethodSpec, fedavg, register


class Server(NamedTuple):
    theta: Tensor  # the global model θ_g
    velocity: Tensor  # the momentum buffer v


bayesadmm.trees.register(Server)  # a state class: allowed in checkpoints


class ServerInfo(NamedTuple):
    step_norm: float  # ‖η_s v‖, the size of the server's step


def fedavgm(lr: float, epochs: int, batch_size: int, server_lr: float, momentum: float) -> bayesadmm.Algorithm:
    """FedAvg's clients (Adam from θ_g: `fedavg.make`'s client step, which the engine trains in batched cohorts);
    the server takes a heavy-ball step on Δ = θ_g − (the clients' size-weighted mean): v ← βv + Δ, θ_g ← θ_g − η_s v."""
    client = fedavg.make(lr=lr, epochs=epochs, batch_size=batch_size)
    average = fedavg.WeightedMean()  # sums in client order: the same bits whatever order the replies came in

    def init_server(theta0: Tensor) -> Server:
        return Server(theta0.clone(), torch.zeros_like(theta0))

    def broadcast(server: Server) -> dict[str, Tensor]:
        return {"theta": server.theta}

    def server_update(server, replies):
        velocity = momentum * server.velocity + (server.theta - average(replies))
        step = server_lr * velocity
        return Server(server.theta - step, velocity), ServerInfo(float(step.norm()))

    def posterior(server):
        return bayesadmm.PointEstimate(server.theta)

    # FedAvg's init_client, client_update and LocalStep, with this server
    return client._replace(
        name="fedavgm", init_server=init_server, broadcast=broadcast, server_update=server_update, posterior=posterior
    )


@dataclass(frozen=True)
class Hparams:
    """The method's hyperparameters: these fields are what `KEY=VALUE` and `hparams=` may set, typed, with their
    defaults; a field without a default must be given."""

    lr: float = 1e-3
    epochs: int = 1
    batch_size: int = 32
    server_lr: float = 1.0
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if not 0 <= self.momentum < 1:
            raise ValueError(f"fedavgm: momentum must be in [0, 1), got {self.momentum!r}")


def build(hparams: Hparams, context: Context) -> bayesadmm.Algorithm:
    """The algorithm from its hyperparameters and what the engine supplies (context.dim, .model, .client_sizes,
    .likelihood, .rounds). A module-level function: worker processes import it by name."""
    return fedavgm(hparams.lr, hparams.epochs, hparams.batch_size, hparams.server_lr, hparams.momentum)


SPEC = register(
    MethodSpec(
        name="fedavgm",
        hparams=Hparams,
        build=build,
        summary="FedAvg with server momentum",
        presets={"diabetes-iid5": {"lr": 1e-3, "epochs": 2}},  # the values `bayesadmm run diabetes-iid5` starts from
        # `bayesadmm tune`'s: lr ten times either side of the scenario's (1e-4 to 1e-2 where a run sets none)
        search_space={"lr": {"around": [0.1, 10], "log": [1e-4, 1e-2]}, "momentum": {"choices": [0.0, 0.5, 0.9]}},
        example={"lr": 0.05, "epochs": 1, "batch_size": 8},
    )
)
