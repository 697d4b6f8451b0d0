"""Federated algorithms, one module each, all implementing `base.Algorithm`.

`REGISTRY` lists the methods `bayesadmm run` can build from keyword hyperparameters (the engine supplies `dim`,
`model`, `num_clients`, `client_sizes` and `cosine_rounds` where a factory asks for them). The convex-problem
factories that take a family and a local solver object (`bayes_admm.make`, `bregman_admm.make`, `pvi.make`,
`admm.make`) are used directly by the paper experiments and tests. Only the CLI and configs read names; where a
module's factory takes objects for its variants, the registry's entry is a wrapper in `registry.py` that maps the
names and flags onto them.
"""

from collections.abc import Callable
from functools import partial

from bayesadmm.algorithms import (
    admm,
    ep_registry,
    feddyn,
    ivon_admm,
    registry,
    smoothing_admm,
)
from bayesadmm.algorithms.base import Algorithm, DivergenceError, Message, PointEstimate

REGISTRY: dict[str, Callable[..., Algorithm]] = {
    "fedavg": registry.fedavg,
    "fedprox": registry.fedprox,
    "feddyn": feddyn.make,
    "admm": admm.make_nn,
    "ama": partial(admm.make_nn, server_rho=0.0, name="ama"),
    "fedlap": registry.fedlap,
    "fedlap-cov": registry.fedlap_cov,
    "fedlap-func": registry.fedlap_func,
    "ivon-admm": ivon_admm.make,
    "ivon-pvi": ivon_admm.make_pvi,
    "bayes-admm-iso": smoothing_admm.make,
    "fedep": ep_registry.make_fedep,
    "fedsep": partial(ep_registry.make_fedep, stateless=True),
    "fedpa": ep_registry.make_fedpa,
}


def make(name: str, **hyperparameters) -> Algorithm:
    """Build a registered algorithm by name."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(sorted(REGISTRY))}") from None
    return factory(**hyperparameters)


__all__ = ["REGISTRY", "make", "Algorithm", "DivergenceError", "Message", "PointEstimate"]
