"""Federated algorithms, one module each, all implementing `base.Algorithm`.

A method that `bayesadmm run method=NAME` and `bayesadmm.run(algorithm=NAME)` can build is a `spec.MethodSpec`
declared and registered by its own module (its hyperparameters, search space and `build(hparams, context)`; the
built-in methods' presets and published numbers are data, in the scenario files, `experiments.scenario_data`);
importing this package imports every such module, so `spec.names()` lists them all. A user's method is registered
the same way, by importing the module that calls `spec.register`. The convex-problem
factories that take a family and a local solver object (`bayes_admm.make`, `bregman_admm.make`, `pvi.make`,
`admm.make`) are used directly by the paper experiments and tests.
"""

from typing import Any

from bayesadmm.algorithms import (  # noqa: F401 — each registers its methods' specs
    admm,
    fedavg,
    feddyn,
    fedep,
    fedlap,
    fedlap_cov,
    fedlap_func,
    fedpa,
    fedprox,
    fedsep,
    ivon_admm,
    smoothing_admm,
)
from bayesadmm.algorithms.base import Algorithm, DivergenceError, Message, PointEstimate
from bayesadmm.algorithms.spec import Context, MethodSpec, get, names, register, specs


def make(
    name: str,
    *,
    dim: int = 0,
    model: Any = None,
    client_sizes: Any = None,
    num_clients: int | None = None,
    likelihood: Any = None,
    rounds: int | None = None,
    compile: str = "auto",
    **hyperparameters: Any,
) -> Algorithm:
    """Build a registered method by name from keyword hyperparameters and what the engine would supply (`Context`):
    `num_clients=K` without `client_sizes` stands for K clients of one example each (for the methods that only count
    them); `compile`: the run's setting ("auto", "on", "off"; `Context.compile`)."""
    spec = get(name)
    if client_sizes is None:
        client_sizes = {k: 1 for k in range(num_clients or 0)}
    context = Context(dim, model, dict(client_sizes), likelihood, rounds, compile=compile)
    return spec.build(spec.make_hparams(**hyperparameters), context)


__all__ = [
    "make",
    "Algorithm",
    "Context",
    "DivergenceError",
    "Message",
    "MethodSpec",
    "PointEstimate",
    "get",
    "names",
    "register",
    "specs",
]
