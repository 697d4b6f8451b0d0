"""FedEP, FedSEP and FedPA on neural networks, as `bayesadmm run` methods: `fedep.make` / `fedep.make_fedpa` with
the diagonal family and one of the four tilted-inference methods of `solvers.ep_inference` (Guo et al. 2023,
Sec. 2.2.2):

    inference="identity"  I, scaled identity:  Λ̂ = Λ_{−k} + α n_k, mean by local Adam
    inference="laplace"   L, Laplace:           Λ̂ = Λ_{−k} + H_k + α n_k, H_k the sampled-label diagonal Fisher
    inference="mcmc"      M, SG-MCMC moments:   mean and shrunk variance of one SGD(momentum) sample per epoch
    inference="ngvi"      V, NGVI:              Λ̂ = Λ_{−k} + n_k s + α n_k, s the running average Fisher

FedEP/FedSEP: sites start at N(θ_0, (α n_k I)⁻¹) around the network's initialisation (`init_site_precision`,
default α): the FedEP code's hand-over from a FedAvg burn-in, which gives the first cavity a mean to train from (a
network cannot train from the improper uniform cavity's mean 0). Local training starts at the cavity mean.

FedPA (the paper's Remark: uniform cavity, q_g = q_0 Π_k q̂_k with q̂_k the client's approximation of its own
posterior p_k): the cavity is uniform, so nothing regularises the local problem towards the global model; the local
chain (or optimizer) instead STARTS at the global mean, θ_0 in round 1 — our choice, as for FedEP a network cannot
start from the uniform cavity's mean 0, and it is where FedPA's clients start (Al-Shedivat et al. 2021). With the
scaled identity the global mean is the n_k-weighted average of the local means; with M, V or L a precision-weighted
one. The server multiplies the clients' latest approximations (the Remark's one-shot product, repeated every round),
not the original FedPA's server-optimizer step on Σ̂_k⁻¹(θ_g − μ̂_k).
"""

from __future__ import annotations

from typing import Mapping

from bayesadmm.algorithms import fedep
from bayesadmm.algorithms.base import Algorithm
from bayesadmm.families import DiagonalGaussian
from bayesadmm.solvers.adam import local_adam
from bayesadmm.solvers.ep_inference import NGVI, SGMCMC, Laplace, ScaledIdentity

INFERENCE = ("identity", "laplace", "mcmc", "ngvi")


def tilted_inference(owner: str, inference: str, *, alpha: float, fisher_samples: int, lr: float, epochs: int,
                     batch_size: int, shrinkage: float, mcmc_lr: float, mcmc_momentum: float, ngvi_beta: float,
                     ngvi_epochs: int, ngvi_samples: int, ngvi_debias: bool):
    """The `inference` callable for the method name, from the registry's keyword hyperparameters."""
    if inference not in INFERENCE:
        raise ValueError(f"{owner}: inference must be one of {INFERENCE}, got {inference!r}")
    if inference == "mcmc":
        return SGMCMC(alpha=alpha, shrinkage=shrinkage, lr=mcmc_lr, momentum=mcmc_momentum, epochs=epochs,
                      batch_size=batch_size)
    solver = local_adam(owner, lr, epochs, batch_size)
    if inference == "identity":
        return ScaledIdentity(alpha=alpha, solver=solver)
    if inference == "laplace":
        return Laplace(alpha=alpha, fisher_samples=fisher_samples, solver=solver)
    return NGVI(alpha=alpha, beta=ngvi_beta, epochs=ngvi_epochs, samples=ngvi_samples, batch_size=batch_size,
                fisher_samples=fisher_samples, debias=ngvi_debias, solver=solver)


def make(*, dim: int, num_clients: int, client_sizes: Mapping[int, int], inference: str = "identity",
         alpha: float = 1e-2, fisher_samples: int = 1, lr: float = 1e-3, epochs: int = 1, batch_size: int = 32,
         shrinkage: float = 1e-4, mcmc_lr: float = 1e-2, mcmc_momentum: float = 0.9, ngvi_beta: float = 0.99,
         ngvi_epochs: int = 1, ngvi_samples: int = 1, ngvi_debias: bool = True, damping: float | None = None,
         prior_precision: float | None = None, init_site_precision: float | None = None, stateless: bool = False,
         name: str | None = None) -> Algorithm:
    """inference: "identity", "laplace", "mcmc" or "ngvi" (module docstring).
    alpha: α, the per-example site precision (I; the floor of L and V; the norm M's precision is rescaled to; and
        the initial sites). damping: δ (default 1/K). prior_precision: δ_0 (None: uniform).
    lr, epochs, batch_size: the local Adam run for the tilted mean (I, L, V). For M, `epochs` is the number of
        SG-MCMC samples (one per epoch, the paper's "client epochs") and the chain is SGD with `mcmc_lr` and
        `mcmc_momentum` (paper: 0.9) over minibatches of `batch_size`.
    fisher_samples: label draws per example for the sampled-label Fisher (L, V).
    shrinkage: ρ ∈ [0, 1] of M's variance ρ + (1 − ρ) Var_emp (paper: 1e-4 for CIFAR-100 and EMNIST).
    mcmc_lr: the chain's SGD step (default 0.01, the paper's client lr for CIFAR-100 and EMNIST).
    ngvi_beta, ngvi_epochs, ngvi_samples: β_NGVI, T_NGVI and N_NGVI of V; s is updated per minibatch of
        `batch_size`. The paper uses 0.99, 5, 5; the defaults here are 0.99, 1, 1 because every draw costs one
        per-example-gradient pass over the minibatch (on the FashionMNIST MLP 12–30 times a plain gradient step),
        so T = N = 1 costs about what Laplace's one Fisher pass does and 5 × 5 costs 25 times that.
        ngvi_debias: Adam's bias correction of s (s_0 = 0).
    stateless: FedSEP."""
    local = tilted_inference(name or ("fedsep" if stateless else "fedep"), inference, alpha=alpha,
                             fisher_samples=fisher_samples, lr=lr, epochs=epochs, batch_size=batch_size,
                             shrinkage=shrinkage, mcmc_lr=mcmc_lr, mcmc_momentum=mcmc_momentum,
                             ngvi_beta=ngvi_beta, ngvi_epochs=ngvi_epochs, ngvi_samples=ngvi_samples,
                             ngvi_debias=ngvi_debias)
    sizes = [client_sizes[k] for k in sorted(client_sizes)]
    return fedep.make(DiagonalGaussian(dim), local, num_clients=num_clients, damping=damping,
                      prior_precision=prior_precision, stateless=stateless, client_sizes=sizes,
                      init_site_precision=alpha if init_site_precision is None else init_site_precision,
                      name=name or ("fedsep" if stateless else "fedep"))


def make_fedsep(*, dim: int, num_clients: int, client_sizes: Mapping[int, int], inference: str = "identity",
                alpha: float = 1e-2, fisher_samples: int = 1, lr: float = 1e-3, epochs: int = 1,
                batch_size: int = 32, shrinkage: float = 1e-4, mcmc_lr: float = 1e-2, mcmc_momentum: float = 0.9,
                ngvi_beta: float = 0.99, ngvi_epochs: int = 1, ngvi_samples: int = 1, ngvi_debias: bool = True,
                damping: float | None = None, prior_precision: float | None = None,
                init_site_precision: float | None = None) -> Algorithm:
    """FedSEP: stateless clients with the shared-factor cavity; settings as `make`."""
    return make(dim=dim, num_clients=num_clients, client_sizes=client_sizes, inference=inference, alpha=alpha,
                fisher_samples=fisher_samples, lr=lr, epochs=epochs, batch_size=batch_size, shrinkage=shrinkage,
                mcmc_lr=mcmc_lr, mcmc_momentum=mcmc_momentum, ngvi_beta=ngvi_beta, ngvi_epochs=ngvi_epochs,
                ngvi_samples=ngvi_samples, ngvi_debias=ngvi_debias, damping=damping,
                prior_precision=prior_precision, init_site_precision=init_site_precision, stateless=True,
                name="fedsep")


def make_fedpa(*, dim: int, inference: str = "mcmc", alpha: float = 1e-2, fisher_samples: int = 1,
               lr: float = 1e-3, epochs: int = 1, batch_size: int = 32, shrinkage: float = 1e-4,
               mcmc_lr: float = 1e-2, mcmc_momentum: float = 0.9, ngvi_beta: float = 0.99, ngvi_epochs: int = 5,
               ngvi_samples: int = 5, ngvi_debias: bool = True, prior_precision: float | None = None) -> Algorithm:
    """FedPA: each client approximates its own posterior (uniform cavity) with `inference` (default "mcmc", FedPA's
    SG-MCMC), starting from the global mean (θ_0 in round 1); the server multiplies the latest approximations with
    the prior N(0, δ_0⁻¹ I) (prior_precision; None: uniform). Other settings as `make`; alpha is the per-example
    site precision of I, the floor of L and V, and the norm M's precision is rescaled to."""
    local = tilted_inference("fedpa", inference, alpha=alpha, fisher_samples=fisher_samples, lr=lr, epochs=epochs,
                             batch_size=batch_size, shrinkage=shrinkage, mcmc_lr=mcmc_lr,
                             mcmc_momentum=mcmc_momentum, ngvi_beta=ngvi_beta, ngvi_epochs=ngvi_epochs,
                             ngvi_samples=ngvi_samples, ngvi_debias=ngvi_debias)
    return fedep.make_fedpa(DiagonalGaussian(dim), local, prior_precision=prior_precision, start_at_global=True)
