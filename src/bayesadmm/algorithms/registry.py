"""The registry's factories for the algorithms whose variants are objects: keyword hyperparameters as the CLI and the
configs give them (numbers, words and flags; `experiments.config` reads the names, annotations and defaults below),
mapped onto the objects the algorithm factories take.

    fedavg, fedprox   weighted: bool          → fedavg.UnweightedMean() / fedavg.WeightedMean()
    fedlap            rho: "size" | number     → fedlap.SizeDamping() / fedlap.ConstantDamping(ρ)
    fedlap-func       rho: "size" | number     → the same
    fedlap-cov        curvature: name          → solvers.curvature.GGN() / MonteCarloFisher()

The remaining registry entries take plain numbers already (their module's `make`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

from bayesadmm.algorithms import fedavg as _fedavg
from bayesadmm.algorithms import fedlap as _fedlap
from bayesadmm.algorithms import fedlap_cov as _fedlap_cov
from bayesadmm.algorithms import fedlap_func as _fedlap_func
from bayesadmm.algorithms import fedprox as _fedprox
from bayesadmm.algorithms.base import Algorithm
from bayesadmm.likelihoods import Likelihood
from bayesadmm.solvers.curvature import CURVATURES


def average_for(weighted: bool, name: str) -> _fedavg.Average:
    """A new server average (each with its own stacking buffer): N_k-weighted if `weighted`."""
    if weighted is not True and weighted is not False:
        raise ValueError(f"{name}: weighted must be True or False, got {weighted!r}")
    return _fedavg.WeightedMean() if weighted else _fedavg.UnweightedMean()


def damping_for(rho: float | str, name: str) -> _fedlap.Damping:
    """rho "size": ρ_k = N_k/N; a number in (0, 1]: that ρ for every client."""
    if isinstance(rho, str):
        if rho == "size":
            return _fedlap.SizeDamping()
    elif isinstance(rho, numbers.Real) and not isinstance(rho, bool) and math.isfinite(rho) and 0 < float(rho) <= 1:
        return _fedlap.ConstantDamping(float(rho))
    raise ValueError(f"{name}: rho must be 'size' or a number in (0, 1], got {rho!r}")


def fedavg(
    *, lr: float = 1e-3, epochs: int = 1, batch_size: int = 32, weighted: bool = False, name: str = "fedavg"
) -> Algorithm:
    """`fedavg.make`, the server's mean unweighted or (`weighted`) weighted by the clients' sizes."""
    return _fedavg.make(lr=lr, epochs=epochs, batch_size=batch_size, average=average_for(weighted, name), name=name)


def fedprox(
    *, mu: float, lr: float = 1e-3, epochs: int = 1, batch_size: int = 32, weighted: bool = False, name: str = "fedprox"
) -> Algorithm:
    """`fedprox.make`, the server's mean as in `fedavg`."""
    return _fedprox.make(
        mu=mu, lr=lr, epochs=epochs, batch_size=batch_size, average=average_for(weighted, name), name=name
    )


def fedlap(
    *,
    delta: float,
    lr: float,
    client_sizes: Mapping[int, int],
    rho: float | str = "size",
    epochs: int = 1,
    batch_size: int = 32,
    name: str = "fedlap",
) -> Algorithm:
    """`fedlap.make` with rho "size" (ρ_k = N_k/N) or one number in (0, 1]."""
    return _fedlap.make(
        delta=delta,
        lr=lr,
        client_sizes=client_sizes,
        rho=damping_for(rho, name),
        epochs=epochs,
        batch_size=batch_size,
        name=name,
    )


def fedlap_cov(
    *,
    delta: float,
    lr: float,
    num_clients: int,
    rho: float | None = None,
    epochs: int = 1,
    batch_size: int = 32,
    curvature: str = "ggn",
    name: str = "fedlap-cov",
    likelihood: Likelihood | None = None,
) -> Algorithm:
    """`fedlap_cov.make` with the curvature estimator by name: "ggn" (exact) or "mc-fisher"; `likelihood` from the
    engine, checked for what the estimator reads."""
    if not (isinstance(curvature, str) and curvature in CURVATURES):
        raise ValueError(f"{name}: curvature must be one of {', '.join(CURVATURES)}, got {curvature!r}")
    return _fedlap_cov.make(
        delta=delta,
        lr=lr,
        num_clients=num_clients,
        rho=rho,
        epochs=epochs,
        batch_size=batch_size,
        curvature=CURVATURES[curvature](),
        name=name,
        likelihood=likelihood,
    )


def fedlap_func(
    *,
    model,
    delta: float,
    lr: float,
    client_sizes: Mapping[int, int],
    tau_f: float = 1.0,
    rho: float | str = "size",
    epochs: int = 1,
    batch_size: int = 32,
    points_per_class: int = 1,
    server_iterations: int = 5000,
    server_lr: float = 1e-3,
    name: str = "fedlap-func",
    likelihood: Likelihood | None = None,
) -> Algorithm:
    """`fedlap_func.make` with rho "size" (ρ_k = N_k/N) or one number in (0, 1]; `likelihood` from the engine."""
    return _fedlap_func.make(
        model=model,
        delta=delta,
        lr=lr,
        client_sizes=client_sizes,
        tau_f=tau_f,
        rho=damping_for(rho, name),
        epochs=epochs,
        batch_size=batch_size,
        points_per_class=points_per_class,
        server_iterations=server_iterations,
        server_lr=server_lr,
        name=name,
        likelihood=likelihood,
    )
