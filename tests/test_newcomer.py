"""A newcomer's method, defined in this file alone: FedAvgM (FedAvg with server momentum, Hsu et al. 2019), the path
docs/guides/own-algorithm.md teaches, run through everything a built-in method goes through, with no other file of
the library or of the tests naming it:

1. the method: FedAvg's client step (its `LocalStep`, so it trains in batched cohorts) and a server of its own;
2. its spec (hyperparameters, build, example values), registered with `bayesadmm.algorithms.register`;
3. the registry's contract test, `bayesadmm.run`, the command line with `--methods`, cohort training (batched equal to
   one client at a time) and the Flower message path (equal to the local engine).

It is registered as "newcomer-fedavgm" (examples/my_methods.py, loaded by tests/algorithms/test_spec.py, is "fedavgm").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import NamedTuple

import pytest
import torch
from torch import Tensor

import bayesadmm
from bayesadmm.algorithms import Context, MethodSpec, fedavg, register
from bayesadmm.algorithms.base import DivergenceError, PointEstimate, ServerInfo, seen_clients
from conftest import needs_fmnist

NAME = "newcomer-fedavgm"

# --- the method: what a newcomer writes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Hparams:
    """FedAvgM's hyperparameters: FedAvg's local Adam, and the server's learning rate η_s and momentum β."""

    lr: float = 1e-3
    epochs: int = 1
    batch_size: int = 32
    server_lr: float = 1.0
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if not 0 <= self.momentum < 1:
            raise ValueError(f"{NAME}: momentum must be in [0, 1), got {self.momentum!r}")
        if not self.server_lr > 0:
            raise ValueError(f"{NAME}: server_lr must be > 0, got {self.server_lr!r}")


class ServerState(NamedTuple):
    theta: Tensor  # θ_g
    velocity: Tensor  # the momentum buffer v
    clients: tuple[int, ...]  # the clients that have replied so far
    round: int = 0


bayesadmm.trees.register(ServerState)  # a state class: allowed in checkpoints


def fedavgm(hparams: Hparams) -> bayesadmm.Algorithm:
    """FedAvg's clients; the server steps along Δ = θ_g − mean_k θ_k with heavy-ball momentum:
    v ← βv + Δ, θ_g ← θ_g − η_s v (η_s = 1, β = 0 is FedAvg)."""
    client = fedavg.make(lr=hparams.lr, epochs=hparams.epochs, batch_size=hparams.batch_size)
    average = fedavg.WeightedMean()

    def init_server(theta0: Tensor) -> ServerState:
        return ServerState(theta0, torch.zeros_like(theta0), ())

    def broadcast(server: ServerState) -> dict[str, Tensor]:
        return {"theta": server.theta}

    def server_update(server: ServerState, replies) -> tuple[ServerState, ServerInfo]:
        velocity = hparams.momentum * server.velocity + (server.theta - average(replies))
        theta = server.theta - hparams.server_lr * velocity
        if not bool(torch.isfinite(theta).all()):
            raise DivergenceError(f"{NAME}: the server parameters are not finite")
        clients = seen_clients(server.clients, replies)
        return ServerState(theta, velocity, clients, server.round + 1), ServerInfo(len(replies))

    def posterior(server: ServerState) -> PointEstimate:
        return PointEstimate(server.theta)

    # FedAvg's client (init_client, client_update and its LocalStep) with this server
    return client._replace(
        name=NAME, init_server=init_server, broadcast=broadcast, server_update=server_update, posterior=posterior
    )


def build(hparams: Hparams, context: Context) -> bayesadmm.Algorithm:
    return fedavgm(hparams)


SPEC = register(
    MethodSpec(
        name=NAME,
        hparams=Hparams,
        build=build,
        summary="FedAvg with server momentum (a newcomer's method)",
        search_space={"lr": {"log": [1e-4, 1e-2]}, "momentum": {"choices": [0.0, 0.5, 0.9]}},
        example={"lr": 0.05, "epochs": 2, "batch_size": 8, "momentum": 0.5},
    )
)

# --- everything a built-in method goes through ----------------------------------------------------------------------


def test_the_registry_contract(tmp_path):
    from tests.algorithms import test_contract

    with torch.compiler.set_stance("force_eager"):
        test_contract.test_contract(NAME, tmp_path)
        test_contract.test_every_method_learns_a_toy_problem(NAME)


def test_zero_momentum_and_unit_server_lr_is_fedavg():
    """A check of the method itself: with β = 0 and η_s = 1 the server is FedAvg's weighted mean."""
    from tests.algorithms.test_contract import _problem, _round

    model, clients, _ = _problem()
    theta0 = model.initial_params(torch.Generator().manual_seed(1))
    mine = fedavgm(Hparams(lr=0.05, epochs=1, batch_size=8, momentum=0.0, server_lr=1.0))
    plain = fedavg.make(lr=0.05, epochs=1, batch_size=8, average=fedavg.WeightedMean())
    states = {k: mine.init_client(None, k) for k in clients}
    server, _, _ = _round(mine, mine.init_server(theta0), states, clients, 1)
    expected, _, _ = _round(plain, plain.init_server(theta0), states, clients, 1)
    assert torch.allclose(server.theta, expected.theta, rtol=1e-12, atol=1e-12)


def test_bayesadmm_run_and_resume(tmp_path):
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(90, 4, generator=gen)
    y = (X[:, 0] + X[:, 1] > 0).long()
    clients = [(X[:30], y[:30]), (X[30:60], y[30:60])]
    common = dict(algorithm=NAME, hparams={"lr": 0.1, "epochs": 3, "momentum": 0.5}, rounds=3, progress=False)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    whole = bayesadmm.run(model, clients, (X[60:], y[60:]), out=tmp_path / "whole", **common)
    assert whole.status == "completed" and whole.history[-1]["test_acc"] > 0.8
    bayesadmm.run(model, clients, (X[60:], y[60:]), out=tmp_path / "resumed", stop_at=1, **common)
    resumed = bayesadmm.run(model, clients, (X[60:], y[60:]), out=tmp_path / "resumed", resume=True, **common)
    assert torch.equal(resumed.server.velocity, whole.server.velocity)
    assert [h["test_nll"] for h in resumed.history] == [h["test_nll"] for h in whole.history]


def test_the_command_line_with_methods(tmp_path):
    pytest.importorskip("sklearn")
    from bayesadmm.cli import main

    out = tmp_path / "cli"
    args = ["run", "diabetes-iid5", f"method={NAME}", "rounds=2", "momentum=0.5", "workers=1", f"out={out}"]
    assert main([*args, "--quiet", "--methods", __file__]) == 0
    recorded = json.loads((out / "config.json").read_text())["hparams"]
    assert recorded["momentum"] == 0.5 and recorded["server_lr"] == 1.0  # every hyperparameter, defaults included
    assert set(recorded) == {f.name for f in dataclasses.fields(Hparams)}
    assert json.loads((out / "status.json").read_text())["status"] == "completed"


@pytest.mark.parametrize("cohort_size", [2, 5])
def test_cohort_training_equals_one_client_at_a_time(cohort_size):
    from tests.engine import test_cohort

    from bayesadmm.engine.cohort import CohortClients
    from bayesadmm.engine.runners import LocalClients

    model, clients = test_cohort._clients(torch.float64)
    theta0 = model.initial_params(torch.Generator().manual_seed(1))
    algorithm = test_cohort._algorithm(NAME, model)
    assert algorithm.local is not None  # FedAvg's client step batches
    sequential = test_cohort._run(LocalClients(algorithm, clients, seed=5), algorithm, theta0, 3)
    batched = test_cohort._run(CohortClients(algorithm, clients, seed=5, cohort_size=cohort_size), algorithm, theta0, 3)
    for a, b in zip(test_cohort._flat(sequential[:2]), test_cohort._flat(batched[:2]), strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10)


@needs_fmnist
def test_the_flower_message_path_equals_the_local_engine(tmp_path):
    pytest.importorskip("flwr")
    from tests.flower import helpers

    from bayesadmm.experiments.build import run
    from bayesadmm.experiments.config import resolve
    from bayesadmm.flower.client_app import app as client_app
    from bayesadmm.flower.server_app import Timeouts, run_server

    overrides = [*helpers.SMALL, "rounds=2", f"method={NAME}", "momentum=0.5"]
    local, _ = resolve("fmnist-heterog10", [*overrides, f"out={tmp_path / 'local'}"])
    flower, _ = resolve("fmnist-heterog10", [*overrides, f"out={tmp_path / 'flower'}"])
    assert run(local, progress=False).exit_code == 0
    grid = helpers.LoopbackGrid(client_app, flower.clients)
    assert run_server(grid, flower, Timeouts(discovery=5, round=60)).exit_code == 0
    helpers.assert_same_metrics(helpers.lines(tmp_path / "local"), helpers.lines(tmp_path / "flower"), tol=1e-9)
