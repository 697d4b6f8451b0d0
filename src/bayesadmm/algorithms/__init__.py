"""Federated algorithms, one module each, all implementing `base.Algorithm`. Only the CLI and configs read names."""

from functools import partial

from bayesadmm.algorithms import admm, bayes_admm, bregman_admm, ivon_admm, pvi
from bayesadmm.algorithms.base import Algorithm, DivergenceError, Message, PointEstimate

REGISTRY = {
    "admm": admm.make,
    "ama": partial(admm.make, server_rho=0.0, name="ama"),
    "bayes-admm": bayes_admm.make,
    "bregman-admm": bregman_admm.make,
    "ivon-admm": ivon_admm.make,
    "ivon-pvi": ivon_admm.make_pvi,
    "pvi": pvi.make,
}


def make(name: str, **hyperparameters) -> Algorithm:
    """Build a registered algorithm by name."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(sorted(REGISTRY))}") from None
    return factory(**hyperparameters)


__all__ = ["REGISTRY", "make", "Algorithm", "DivergenceError", "Message", "PointEstimate"]
