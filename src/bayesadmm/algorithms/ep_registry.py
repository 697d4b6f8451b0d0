"""FedEP, FedSEP and FedPA on networks as `bayesadmm run` methods (`REGISTRY["fedep" | "fedsep" | "fedpa"]`): the
keyword hyperparameters of the command line and the presets, turned into a tilted-inference object of
`solvers.ep_inference` and the diagonal family for `fedep.make`, `fedsep.make` and `fedpa.make` (Guo et al. 2023,
Sec. 2.2.2). Only this module reads the inference names:

    inference="identity"  I, ScaledIdentity:  Λ̂ = Λ_{−k} + α n_k, mean by local Adam
    inference="laplace"   L, Laplace:         Λ̂ = Λ_{−k} + H_k + α n_k, H_k the sampled-target diagonal Fisher
    inference="mcmc"      M, SGMCMC:          mean and shrunk variance of one SGD(momentum) sample per epoch
    inference="ngvi"      V, NGVI:            Λ̂ = Λ_{−k} + n_k s + α n_k, s the running average Fisher

Laplace and NGVI draw targets from the clients' likelihood for their Fisher; a likelihood that cannot
(`NegLogLikelihood(fn)` without `sample_targets`) is refused when the method is built, with the likelihood the engine
supplies (`likelihood`), before any training.

FedEP/FedSEP: sites start at N(θ_0, (α n_k I)⁻¹) around the network's initialisation (`init_site_precision`,
default α): the FedEP code's hand-over from a FedAvg burn-in, which gives the first cavity a mean to train from (a
network cannot train from the improper uniform cavity's mean 0). Local training starts at the cavity mean. FedPA's
local search starts at the global mean (`fedpa`); with the scaled identity the global mean is then the n_k-weighted
average of the local means, with M, V or L a precision-weighted one.

The factories' signatures are the configuration's schema (`experiments.config.method_parameters` reads the
annotations and defaults), so each spells its keywords out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from bayesadmm.algorithms import fedep, fedpa, fedsep
from bayesadmm.algorithms.base import Algorithm
from bayesadmm.families import DiagonalGaussian
from bayesadmm.likelihoods import Likelihood, require
from bayesadmm.solvers.adam import local_adam
from bayesadmm.solvers.ep_inference import NGVI, SGMCMC, Laplace, ScaledIdentity, TiltedInference, likelihood_needs


class InferenceSettings(NamedTuple):
    """The registry's inference hyperparameters (see `make_fedep`); `owner` names the method in errors. The field
    defaults are the registry's defaults: `make_fedep` and `make_fedpa` take theirs from `DEFAULTS`."""

    owner: str
    alpha: float = 1e-2
    fisher_samples: int = 1
    lr: float = 1e-3
    epochs: int = 1
    batch_size: int = 32
    shrinkage: float = 1e-4
    mcmc_lr: float = 1e-2
    mcmc_momentum: float = 0.9
    ngvi_beta: float = 0.99
    # NGVI's T and N: the paper's 5 × 5 costs 25 times T = N = 1, and T = N = 1 about what Laplace's one Fisher pass
    # does, as every draw is one per-example-gradient pass over the minibatch (on the FashionMNIST MLP 12–30 times a
    # plain gradient step; docs/architecture.md)
    ngvi_epochs: int = 1
    ngvi_samples: int = 1
    ngvi_debias: bool = True


DEFAULTS = InferenceSettings("")


def _local_adam(settings: InferenceSettings):
    return local_adam(settings.owner, settings.lr, settings.epochs, settings.batch_size)


INFERENCE: dict[str, Callable[[InferenceSettings], TiltedInference]] = {
    "identity": lambda s: ScaledIdentity(alpha=s.alpha, solver=_local_adam(s)),
    "laplace": lambda s: Laplace(alpha=s.alpha, fisher_samples=s.fisher_samples, solver=_local_adam(s)),
    "mcmc": lambda s: SGMCMC(
        alpha=s.alpha,
        shrinkage=s.shrinkage,
        lr=s.mcmc_lr,
        momentum=s.mcmc_momentum,
        epochs=s.epochs,
        batch_size=s.batch_size,
    ),
    "ngvi": lambda s: NGVI(
        alpha=s.alpha,
        beta=s.ngvi_beta,
        epochs=s.ngvi_epochs,
        samples=s.ngvi_samples,
        batch_size=s.batch_size,
        fisher_samples=s.fisher_samples,
        debias=s.ngvi_debias,
        solver=_local_adam(s),
    ),
}


def tilted_inference(
    inference: str, settings: InferenceSettings, likelihood: Likelihood | None = None
) -> TiltedInference:
    """The inference object for its registry name, refused (TypeError) if it needs more of `likelihood` than it has
    (None: not checked here; the curvature then checks when it is computed)."""
    try:
        build = INFERENCE[inference]
    except (KeyError, TypeError):
        raise ValueError(f"{settings.owner}: inference must be one of {tuple(INFERENCE)}, got {inference!r}") from None
    local = build(settings)
    if likelihood is not None:
        require(likelihood, likelihood_needs(local), f"{settings.owner} with inference={inference!r}")
    return local


def _ep_sites(
    num_clients: int,
    client_sizes: Mapping[int, int],
    alpha: float,
    damping: float | None,
    prior_precision: float | None,
    init_site_precision: float | None,
) -> dict:
    """The keywords FedEP and FedSEP share: n_k in client order, initial sites of precision α n_k by default."""
    return {
        "num_clients": num_clients,
        "damping": damping,
        "prior_precision": prior_precision,
        "client_sizes": [client_sizes[k] for k in sorted(client_sizes)],
        "init_site_precision": alpha if init_site_precision is None else init_site_precision,
    }


def make_fedep(
    *,
    dim: int,
    num_clients: int,
    client_sizes: Mapping[int, int],
    inference: str = "identity",
    alpha: float = DEFAULTS.alpha,
    fisher_samples: int = DEFAULTS.fisher_samples,
    lr: float = DEFAULTS.lr,
    epochs: int = DEFAULTS.epochs,
    batch_size: int = DEFAULTS.batch_size,
    shrinkage: float = DEFAULTS.shrinkage,
    mcmc_lr: float = DEFAULTS.mcmc_lr,
    mcmc_momentum: float = DEFAULTS.mcmc_momentum,
    ngvi_beta: float = DEFAULTS.ngvi_beta,
    ngvi_epochs: int = DEFAULTS.ngvi_epochs,
    ngvi_samples: int = DEFAULTS.ngvi_samples,
    ngvi_debias: bool = DEFAULTS.ngvi_debias,
    damping: float | None = None,
    prior_precision: float | None = None,
    init_site_precision: float | None = None,
    stateless: bool = False,
    name: str | None = None,
    likelihood: Likelihood | None = None,
) -> Algorithm:
    """FedEP (`fedep.make`) with the diagonal family; `stateless=True` builds FedSEP (`fedsep.make`): the registry's
    `fedsep` is this factory with `stateless=True`.

    inference: "identity", "laplace", "mcmc" or "ngvi" (module docstring).
    alpha: α, the per-example site precision (I; the floor of L and V; the norm M's precision is rescaled to; and
        the initial sites). damping: δ (default 1/K). prior_precision: δ_0 (None: uniform).
    lr, epochs, batch_size: the local Adam run for the tilted mean (I, L, V). For M, `epochs` is the number of
        SG-MCMC samples (one per epoch, the paper's "client epochs") and the chain is SGD with `mcmc_lr` and
        `mcmc_momentum` (paper: 0.9) over minibatches of `batch_size`.
    fisher_samples: target draws per example for the sampled-target Fisher (L, V).
    shrinkage: ρ ∈ [0, 1] of M's variance ρ + (1 − ρ) Var_emp (paper: 1e-4 for CIFAR-100 and EMNIST).
    mcmc_lr: the chain's SGD step (default 0.01, the paper's client lr for CIFAR-100 and EMNIST).
    ngvi_beta, ngvi_epochs, ngvi_samples: β_NGVI, T_NGVI and N_NGVI of V; s is updated per minibatch of
        `batch_size`. The paper uses 0.99, 5, 5; the defaults draw fewer (`InferenceSettings` says why).
        ngvi_debias: Adam's bias correction of s.
    init_site_precision: the initial sites' α (default: alpha).
    likelihood: the clients' likelihood (the engine supplies it), checked for what `inference` reads of it."""
    factory, name = (fedsep.make, name or "fedsep") if stateless else (fedep.make, name or "fedep")
    local = tilted_inference(
        inference,
        InferenceSettings(
            name,
            alpha,
            fisher_samples,
            lr,
            epochs,
            batch_size,
            shrinkage,
            mcmc_lr,
            mcmc_momentum,
            ngvi_beta,
            ngvi_epochs,
            ngvi_samples,
            ngvi_debias,
        ),
        likelihood,
    )
    return factory(
        DiagonalGaussian(dim),
        local,
        name=name,
        **_ep_sites(num_clients, client_sizes, alpha, damping, prior_precision, init_site_precision),
    )


def make_fedpa(
    *,
    dim: int,
    inference: str = "mcmc",
    alpha: float = DEFAULTS.alpha,
    fisher_samples: int = DEFAULTS.fisher_samples,
    lr: float = DEFAULTS.lr,
    epochs: int = DEFAULTS.epochs,
    batch_size: int = DEFAULTS.batch_size,
    shrinkage: float = DEFAULTS.shrinkage,
    mcmc_lr: float = DEFAULTS.mcmc_lr,
    mcmc_momentum: float = DEFAULTS.mcmc_momentum,
    ngvi_beta: float = DEFAULTS.ngvi_beta,
    ngvi_epochs: int = DEFAULTS.ngvi_epochs,
    ngvi_samples: int = DEFAULTS.ngvi_samples,
    ngvi_debias: bool = DEFAULTS.ngvi_debias,
    prior_precision: float | None = None,
    likelihood: Likelihood | None = None,
) -> Algorithm:
    """FedPA (`fedpa.make`): each client approximates its own posterior (uniform cavity) with `inference` (default
    "mcmc", FedPA's SG-MCMC), starting from the global mean (θ_0 in round 1); the server multiplies the latest
    approximations with the prior N(0, δ_0⁻¹ I) (prior_precision; None: uniform). Other settings as `make_fedep`;
    alpha is the per-example site precision of I, the floor of L and V, and the norm M's precision is rescaled to."""
    local = tilted_inference(
        inference,
        InferenceSettings(
            "fedpa",
            alpha,
            fisher_samples,
            lr,
            epochs,
            batch_size,
            shrinkage,
            mcmc_lr,
            mcmc_momentum,
            ngvi_beta,
            ngvi_epochs,
            ngvi_samples,
            ngvi_debias,
        ),
        likelihood,
    )
    return fedpa.make(DiagonalGaussian(dim), local, prior_precision=prior_precision)
