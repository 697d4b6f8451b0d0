"""The contract every registered algorithm keeps, checked over the whole registry on a small synthetic problem.

For each method of `bayesadmm.algorithms.REGISTRY`: no function mutates its inputs; the same generator gives the same
client update; the order in which replies arrive does not change the server state; states survive a checkpoint
(the engine's pickle-free format) and the run goes on with the same numbers; and the method learns a toy problem. A new
method is picked up by registering it; its required hyperparameters must be among `TOY_VALUES` (or be added there).
Compiled kernels run eagerly here (`torch.compiler.set_stance("force_eager")`): the compiled and eager maths are
tested equal in tests/optim/test_kernels.py.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from torch import nn

from bayesadmm.algorithms import REGISTRY
from bayesadmm.clients import SupervisedData
from bayesadmm.engine.rundir import load_state, save_state
from bayesadmm.engine.simulate import generator_for
from bayesadmm.federated import algorithm_factory
from bayesadmm.models import FlatModel

# Toy values for hyperparameters, used where a factory names them: a 3-class problem of 4 features, 3 clients.
TOY_VALUES = {"lr": 0.05, "epochs": 2, "batch_size": 8, "mu": 0.01, "alpha": 0.01, "rho": 0.5, "gamma": 0.5,
              "delta": 1.0, "damping": 0.5, "precision": 10.0, "hess_init": 0.1}
# FedPA's SG-MCMC keeps one sample per epoch: two samples give no usable covariance
TOY_OVERRIDES = {"fedpa": {"epochs": 10}}


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _problem():
    gen = torch.Generator().manual_seed(0)
    centres = 3.0 * torch.randn(3, 4, generator=gen)
    model = FlatModel(_net)
    clients = {}
    for k in range(3):
        y = torch.cat([torch.full((16,), k), torch.randint(0, 3, (8,), generator=gen)])   # label skew
        clients[k] = SupervisedData(model, centres[y] + torch.randn(len(y), 4, generator=gen), y)
    y_test = torch.arange(90) % 3
    test = (centres[y_test] + torch.randn(90, 4, generator=gen), y_test)
    return model, clients, test


def _algorithm(name: str, model: FlatModel, sizes: dict[int, int]):
    parameters = inspect.signature(REGISTRY[name]).parameters
    hparams = {k: v for k, v in TOY_VALUES.items() if k in parameters} | TOY_OVERRIDES.get(name, {})
    missing = [k for k, p in parameters.items() if p.default is p.empty and k not in hparams
               and k not in ("dim", "model", "num_clients", "client_sizes")]
    assert not missing, f"{name} requires {missing}: add toy values for them to TOY_VALUES"
    return algorithm_factory(REGISTRY[name], hparams, model, sizes)()


def _leaves(tree) -> list:
    """Every tensor and scalar in a state or message (tuples, NamedTuples, lists, dicts, dataclasses)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [leaf for key in sorted(tree, key=str) for leaf in [key, *_leaves(tree[key])]]
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in _leaves(item)]
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return [leaf for f in dataclasses.fields(tree) for leaf in _leaves(getattr(tree, f.name))]
    if isinstance(tree, (int, float, str, bool, type(None))):
        return [tree]
    return [type(tree).__name__]   # an opaque object: its type must at least agree


def _same(a, b) -> bool:
    left, right = _leaves(a), _leaves(b)
    return len(left) == len(right) and all(
        (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype
         and torch.equal(x, y)) or (not isinstance(x, torch.Tensor) and x == y) for x, y in zip(left, right))


def _snapshot(tree) -> list:
    return [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in _leaves(tree)]


def _round(algorithm, server, states, clients, round_):
    message = algorithm.broadcast(server)
    replies, new_states = {}, {}
    for k in clients:
        new_states[k], replies[k], _ = algorithm.client_update(states[k], message, clients[k],
                                                               generator_for(0, round_, k))
    server, _ = algorithm.server_update(server, replies)
    return server, new_states, replies


@pytest.fixture(autouse=True)
def _eager():
    with torch.compiler.set_stance("force_eager"):
        yield


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_contract(name, tmp_path):
    model, clients, _ = _problem()
    algorithm = _algorithm(name, model, {k: d.num_examples for k, d in clients.items()})
    theta0 = model.initial_params(torch.Generator().manual_seed(1))
    server = algorithm.init_server(theta0)
    states = {k: algorithm.init_client(server, k) for k in clients}
    server, states, _ = _round(algorithm, server, states, clients, 1)   # states past their initial form

    # inputs are never mutated, and the same generator gives the same update
    message = algorithm.broadcast(server)
    before = [_snapshot(x) for x in (server, states, message, [(d.X, d.y) for d in clients.values()])]
    updates = {k: algorithm.client_update(states[k], message, clients[k], generator_for(0, 2, k)) for k in clients}
    again = {k: algorithm.client_update(states[k], message, clients[k], generator_for(0, 2, k)) for k in clients}
    replies = {k: update[1] for k, update in updates.items()}
    new_server, _ = algorithm.server_update(server, replies)
    after = [_snapshot(x) for x in (server, states, message, [(d.X, d.y) for d in clients.values()])]
    assert _same(before, after), f"{name} changed its inputs"
    for k in clients:
        assert _same(updates[k][:2], again[k][:2]), f"{name}: client {k}'s update differs with the same generator"

    # the order in which replies arrive does not matter
    reversed_replies = {k: replies[k] for k in sorted(replies, reverse=True)}
    assert _same(algorithm.server_update(server, reversed_replies)[0], new_server), f"{name}: reply order matters"

    # states round-trip through a checkpoint, and the run goes on with the same numbers
    new_states = {k: updates[k][0] for k in clients}
    save_state(tmp_path / "checkpoint.pt", {"server": new_server, "clients": new_states})   # the engine's format
    loaded = load_state(tmp_path / "checkpoint.pt")
    assert _same(loaded["server"], new_server) and _same(loaded["clients"], new_states)
    continued = _round(algorithm, new_server, new_states, clients, 3)
    resumed = _round(algorithm, loaded["server"], loaded["clients"], clients, 3)
    assert _same(continued, resumed), f"{name}: a checkpointed state goes on differently"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_method_learns_a_toy_problem(name):
    model, clients, (X_test, y_test) = _problem()
    algorithm = _algorithm(name, model, {k: d.num_examples for k, d in clients.items()})
    theta0 = model.initial_params(torch.Generator().manual_seed(1))
    server = algorithm.init_server(theta0)
    states = {k: algorithm.init_client(server, k) for k in clients}

    def accuracy(theta) -> float:
        with torch.no_grad():
            return (model.forward(theta, X_test).argmax(1) == y_test).float().mean().item()

    for round_ in range(1, 6):
        server, states, _ = _round(algorithm, server, states, clients, round_)
    # (from θ₀, not the initial posterior: FedPA's starts with no precision at all, a flat prior)
    start, end = accuracy(theta0), accuracy(algorithm.posterior(server).mean)
    assert end >= 0.85 > start, f"{name}: accuracy {start:.2f} -> {end:.2f}"
