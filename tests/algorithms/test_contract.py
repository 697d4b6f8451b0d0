"""The contract every registered algorithm keeps, checked over the whole registry on a small synthetic problem.

For each registered method (`bayesadmm.algorithms.names()`), with its spec's `example` hyperparameters: no function
mutates its inputs; the same generator gives the same client update, which is its `LocalStep`'s prepare,
solve_problem, finish; the order in which replies arrive does not change the server state; states survive a
checkpoint (the engine's pickle-free format) and the run goes on with the same numbers; and the method learns a toy
problem. A new method is picked up by registering it; its spec's `example` must give its required hyperparameters.
Compiled kernels run eagerly here (`torch.compiler.set_stance("force_eager")`): the compiled and eager maths are
tested equal in tests/optim/test_kernels.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import MISSING

import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm.algorithms import get, names
from bayesadmm.clients import SupervisedData
from bayesadmm.engine.rundir import load_state, save_state
from bayesadmm.engine.simulate import generator_for
from bayesadmm.federated import algorithm_factory
from bayesadmm.likelihoods import GaussianRegression, MissingCurvatureError, NegLogLikelihood, Poisson
from bayesadmm.models import FlatModel

# Each method's toy hyperparameters are its spec's `example`: a 3-class problem of 4 features, 3 clients.


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
    spec = get(name)
    missing = [f.name for f in spec.fields() if f.default is MISSING and f.name not in spec.example]
    assert not missing, f"{name} requires {missing}: give toy values for them in its spec's example"
    return algorithm_factory(name, dict(spec.example), model, sizes)()


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


@pytest.mark.parametrize("name", names())
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

    # the client update is its local step's prepare, solve_problem, finish (`base.LocalStep`, the one way to define it)
    assert algorithm.local is not None, f"{name} has no LocalStep"
    for k in clients:
        problem = algorithm.local.prepare(states[k], message, clients[k])
        result = algorithm.local.solver.solve_problem(problem, clients[k], generator_for(0, 2, k))
        step = algorithm.local.finish(states[k], message, clients[k], problem, result)
        assert _same(step[:2], updates[k][:2]), f"{name}: client {k}'s update is not its LocalStep's"

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


@pytest.mark.parametrize("name", names())
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


# --- any likelihood, through bayesadmm.run (issue #38) ----------------------------------------------------------------
#
# Every method, and every variant that reads the likelihood's curvature, runs a few rounds of `bayesadmm.run` on a small
# regression and a small count problem: it must learn, and what it takes from the likelihood must not be silently zero
# (as the softmax's curvature of a one-output head was). Given a likelihood without that curvature, it must refuse
# before the run directory exists.

SIGMA = 0.5
VARIANTS = [(name, {}) for name in names()] + [
    ("fedlap-cov", {"curvature": "mc-fisher"}),
    *[(method, {"inference": inference}) for method in ("fedep", "fedsep") for inference in ("laplace", "ngvi")],
    *[("fedpa", {"inference": inference}) for inference in ("identity", "laplace", "ngvi")],
]


def _variant_id(name: str, extra: dict) -> str:
    return name + "".join(f"[{k}={v}]" for k, v in extra.items())


# What each variant reads of the likelihood beyond its loss; a new method that needs curvature must be listed here.
NEEDS = {
    "fedlap-cov": "output_hessian",
    "fedlap-cov[curvature=mc-fisher]": "sample_targets",
    "fedlap-func": "soft_targets",
    **{f"{m}[inference={i}]": "sample_targets" for m in ("fedep", "fedsep", "fedpa") for i in ("laplace", "ngvi")},
}
# Regression's loss is steeper than the toy classification's: IVON's first steps need a larger initial Hessian, and
# FedDyn's iterates oscillate at lr 0.05 (its NLL goes up and down from round to round; at 0.01 it falls steadily);
# FedLap-Func's server needs far fewer than its default 5000 Adam steps on these few memory points.
REGRESSION_OVERRIDES = {"ivon-admm": {"hess_init": 1.0}, "ivon-pvi": {"hess_init": 1.0}, "feddyn": {"lr": 0.01},
                        "fedlap-func": {"server_iterations": 200, "server_lr": 0.01, "points_per_class": 4}}


def _regression_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _regression_problem(counts: bool):
    """3 clients with shifted inputs (heterogeneous) and a test set: y = 2 g(x) + 0.3 ε, or y ~ Poisson(exp(g(x)
    + 0.5)), with g(x) = tanh(wᵀx) + 0.3·[x_0 > 0]."""
    gen = torch.Generator().manual_seed(0)
    w = torch.tensor([0.6, -0.4, 0.3, 0.2])

    def draw(n, shift):
        X = torch.randn(n, 4, generator=gen) + shift
        g = torch.tanh(X @ w) + 0.3 * (X[:, 0] > 0)
        y = torch.poisson((g + 0.5).exp(), generator=gen) if counts else 2 * g + 0.3 * torch.randn(n, generator=gen)
        return X, y

    return [draw(24, 0.5 * k) for k in range(3)], draw(90, 0.5)


def _run(name, extra, likelihood, out, rounds=4):
    hparams = dict(get(name).example) | REGRESSION_OVERRIDES.get(name, {}) | extra
    clients, test = _regression_problem(isinstance(likelihood, Poisson))
    return bayesadmm.run(_regression_net(), clients, test, algorithm=name, hparams=hparams, likelihood=likelihood,
                         rounds=rounds, eval_samples=4, progress=False, out=out)


@pytest.fixture
def _no_plots(monkeypatch):
    """The run directory's plot is not what is tested here, and costs more than these runs."""
    monkeypatch.setattr("bayesadmm.evaluation.diagrams.try_plot_run", lambda *args, **kwargs: None)


@pytest.mark.usefixtures("_no_plots")
@pytest.mark.parametrize("kind", ["gaussian", "poisson"])
@pytest.mark.parametrize(("name", "extra"), VARIANTS, ids=[_variant_id(*v) for v in VARIANTS])
def test_every_method_learns_regression_and_counts_with_the_likelihoods_own_curvature(name, extra, kind, tmp_path):
    likelihood = GaussianRegression(SIGMA) if kind == "gaussian" else Poisson()
    _, (X_test, y_test) = _regression_problem(kind == "poisson")
    with torch.no_grad():
        initial = likelihood.mean_nll(_regression_net()(X_test), y_test).item()
    result = _run(name, extra, likelihood, tmp_path / "run")
    assert result.status == "completed", result.reason
    final = result.history[-1]["test_nll"]
    assert final < initial, f"{_variant_id(name, extra)} on {kind}: test NLL {initial:.3f} -> {final:.3f}"

    needs = NEEDS.get(_variant_id(name, extra))
    if name == "fedlap-cov":          # S_g = δ + Σ_k V_k: every coordinate gained curvature from the likelihood
        assert bool((result.posterior.precision > get(name).example["delta"]).all())
    elif name == "fedlap-func":       # the function-space terms were there, on the server and on the clients
        assert result.history[-1]["server_memory"] > 0 and result.history[-1]["client_memory_terms"] > 0
    elif needs is not None:           # Laplace/NGVI: the Fisher adds to the precision of the inference without it
        plain = _run(name, {"inference": "identity"}, likelihood, tmp_path / "identity")
        gained = result.posterior.precision / plain.posterior.precision
        assert gained.median() > 3, f"{_variant_id(name, extra)} on {kind}: precision × {gained.median():.2f}"


def _gaussian_nll(outputs, targets):
    """A user's Gaussian NLL with σ = SIGMA, per example (module level: it pickles), for (N,) targets and for the
    (N, 1) outputs and drawn targets of the curvature."""
    residual = ((targets - outputs) / SIGMA).reshape(outputs.shape[0], -1)
    return (0.5 * residual.square() + math.log(SIGMA * math.sqrt(2 * math.pi))).sum(1)


@pytest.mark.usefixtures("_no_plots")
@pytest.mark.parametrize(("name", "extra"), VARIANTS, ids=[_variant_id(*v) for v in VARIANTS])
def test_a_likelihood_without_curvature_is_refused_before_the_run_directory_or_serves(name, extra, tmp_path):
    """NegLogLikelihood(fn) alone: the variants that need its curvature refuse in bayesadmm.run, naming themselves,
    the likelihood and what to supply, and nothing is written; the others train on it."""
    bare = NegLogLikelihood(_gaussian_nll)
    needs = NEEDS.get(_variant_id(name, extra))
    out = tmp_path / "run"
    if needs is None:
        result = _run(name, extra, bare, out, rounds=2)
        assert result.status == "completed" and math.isfinite(result.history[-1]["test_nll"])
        return
    with pytest.raises(MissingCurvatureError) as refusal:
        _run(name, extra, bare, out)
    message = str(refusal.value)
    assert name in message and "NegLogLikelihood" in message and f"{needs}=" in message, message
    assert not out.exists()


def _gaussian_hessian(outputs):
    return torch.full((outputs.shape[0], 1, 1), SIGMA**-2, dtype=outputs.dtype)


def _gaussian_draws(outputs, generator):
    return outputs + SIGMA * torch.randn(outputs.shape, generator=generator, dtype=outputs.dtype)


@pytest.mark.usefixtures("_no_plots")
@pytest.mark.parametrize("curvature", ["ggn", "mc-fisher"])
def test_a_user_likelihood_given_its_curvature_runs_fedlap_cov_as_the_built_in_one(curvature, tmp_path):
    """The same Gaussian written by the user with its output Hessian and its draws: FedLap-Cov's posterior equals the
    one with GaussianRegression (the square root of the user's Hessian against the closed-form factor; the same
    normal draws from the client's generator)."""
    user = NegLogLikelihood(_gaussian_nll, output_hessian=_gaussian_hessian, sample_targets=_gaussian_draws,
                            soft_targets=torch.clone)
    mine = _run("fedlap-cov", {"curvature": curvature}, user, tmp_path / "user")
    built_in = _run("fedlap-cov", {"curvature": curvature}, GaussianRegression(SIGMA), tmp_path / "built-in")
    torch.testing.assert_close(mine.posterior.precision, built_in.posterior.precision, rtol=1e-5, atol=0)
    torch.testing.assert_close(mine.posterior.mean, built_in.posterior.mean, rtol=1e-5, atol=1e-6)
