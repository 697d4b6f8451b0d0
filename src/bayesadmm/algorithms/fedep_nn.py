"""FedEP and FedSEP on neural networks, as `bayesadmm run` methods: `fedep.make` with the diagonal family and the
scaled-identity (I) or Laplace (L) tilted inference of `solvers.ep_inference`.

Sites start at N(θ_0, (α n_k I)⁻¹) around the network's initialisation (`init_site_precision`, default α): the
FedEP code's hand-over from a FedAvg burn-in, which gives the first cavity a mean to train from (a network cannot
train from the improper uniform cavity's mean 0). FedPA and the SG-MCMC (M) and NGVI (V) inference methods are not
available here yet.
"""

from __future__ import annotations

from typing import Mapping

from bayesadmm.algorithms import fedep
from bayesadmm.algorithms.base import Algorithm
from bayesadmm.families import DiagonalGaussian
from bayesadmm.solvers.adam import LocalAdam
from bayesadmm.solvers.ep_inference import Laplace, ScaledIdentity

INFERENCE = ("identity", "laplace")


def make(*, dim: int, num_clients: int, client_sizes: Mapping[int, int], inference: str = "identity",
         alpha: float = 1e-2, fisher_samples: int = 1, lr: float = 1e-3, epochs: int = 1, batch_size: int = 32,
         damping: float | None = None, prior_precision: float | None = None,
         init_site_precision: float | None = None, stateless: bool = False, name: str | None = None) -> Algorithm:
    """inference: "identity" (tilted precision Λ_{−k} + α n_k) or "laplace" (+ the sampled-label diagonal Fisher).
    alpha: α, the per-example site precision. damping: δ (default 1/K). prior_precision: δ_0 (None: uniform).
    lr, epochs, batch_size: the local Adam run for the tilted mean. stateless: FedSEP."""
    if inference not in INFERENCE:
        raise ValueError(f"inference must be one of {INFERENCE}, got {inference!r}")
    solver = LocalAdam(lr=lr, epochs=epochs, batch_size=batch_size)
    local = (ScaledIdentity(alpha=alpha, solver=solver) if inference == "identity"
             else Laplace(alpha=alpha, fisher_samples=fisher_samples, solver=solver))
    sizes = [client_sizes[k] for k in sorted(client_sizes)]
    return fedep.make(DiagonalGaussian(dim), local, num_clients=num_clients, damping=damping,
                      prior_precision=prior_precision, stateless=stateless, client_sizes=sizes,
                      init_site_precision=alpha if init_site_precision is None else init_site_precision,
                      name=name or ("fedsep" if stateless else "fedep"))


def make_fedsep(*, dim: int, num_clients: int, client_sizes: Mapping[int, int], inference: str = "identity",
                alpha: float = 1e-2, fisher_samples: int = 1, lr: float = 1e-3, epochs: int = 1,
                batch_size: int = 32, damping: float | None = None, prior_precision: float | None = None,
                init_site_precision: float | None = None) -> Algorithm:
    """FedSEP: stateless clients with the shared-factor cavity; settings as `make`."""
    return make(dim=dim, num_clients=num_clients, client_sizes=client_sizes, inference=inference, alpha=alpha,
                fisher_samples=fisher_samples, lr=lr, epochs=epochs, batch_size=batch_size, damping=damping,
                prior_precision=prior_precision, init_site_precision=init_site_precision, stateless=True,
                name="fedsep")
