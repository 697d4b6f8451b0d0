"""What FedEP, FedSEP and FedPA share (Guo et al., ICLR 2023): Gaussian sites
in a family's natural tuple, and the damped server of Alg. 3 with its ServerOptim (`solvers.natural_optimizers`).

A site q_k is stored as the family's natural tuple λ = (η, −½Λ) (DiagonalGaussian or FullGaussian); it need not be a
valid distribution, and the improper uniform site is the zero tuple. q_0 is the prior N(0, δ_0⁻¹ I)
(`prior_precision`) or, with `prior_precision=None`, the improper uniform prior (λ_0 = 0). "[CODE]" marks choices taken
from facts about the authors' public code where the paper is silent or garbled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms.base import DivergenceError, Message, ServerInfo, pack, unpack
from bayesadmm.algorithms.spec import choice
from bayesadmm.families import DiagonalGaussian, FullGaussian, Natural, Posterior
from bayesadmm.families import natural as nat
from bayesadmm.likelihoods import Likelihood, require
from bayesadmm.solvers.adam import local_adam
from bayesadmm.solvers.ep_inference import NGVI, SGMCMC, Laplace, ScaledIdentity, TiltedInference, likelihood_needs
from bayesadmm.solvers.natural_optimizers import Identity, NaturalOptimizer
from bayesadmm.trees import register

IDENTITY = Identity()  # the default ClientOptim / ServerOptim: plain damped EP

# ---------------------------------------------------------------------------
# sites
# ---------------------------------------------------------------------------


def check_family(family) -> None:
    if not isinstance(family, (DiagonalGaussian, FullGaussian)):
        raise TypeError(f"EP sites need a family with a free precision (diagonal or full), got {family!r}")


def prior_natural(family, precision: float | None, like: Tensor) -> Natural:
    """λ_0 of N(0, δ_0⁻¹ I), or the zero tuple (improper uniform) when `precision` is None."""
    zeros = family.zeros(dtype=like.dtype, device=like.device)
    if precision is None:
        return zeros
    _, b = family.prior_terms(precision, dtype=like.dtype, device=like.device)
    return b


def site_natural(family, mean: Tensor, precision: float) -> Natural:
    """A site N(mean, (precision·I)⁻¹) in the family's layout (precision = 0 gives (0, 0), the uniform site)."""
    eye = (
        torch.ones_like(mean)
        if isinstance(family, DiagonalGaussian)
        else torch.eye(family.dim, dtype=mean.dtype, device=mean.device)
    )
    return (precision * mean, -0.5 * precision * eye)


def clip_delta(delta: Natural, clip_norm: float | None) -> Natural:
    """Δ_k scaled down to global L2 norm `clip_norm` before damping ([CODE]); None = unclipped."""
    if clip_norm is None:
        return delta
    norm = float(nat.norm(delta))
    return nat.scale(delta, clip_norm / norm) if norm > clip_norm else delta


# ---------------------------------------------------------------------------
# the damped server of FedEP and FedSEP (Alg. 3)
# ---------------------------------------------------------------------------


@register
class ServerState(NamedTuple):
    natural: Natural  # λ_g (may be improper before the first round from a uniform start)
    optimizer: Any  # ServerOptim state
    anchor: Tensor  # θ_0, the mean of the initial sites (init_site_precision > 0)
    round: int = 0


@dataclass(frozen=True)
class DampedServer:
    """Alg. 3: λ_g ← λ_g + δ · ServerOptim(Σ_{k∈𝒦} Δ_k), from λ_g = λ_0 (+ the initial sites).

    The server keeps no per-client memory: the Δ_k are increments, and re-adding an absent client's last one would
    count it twice. `initial_site_precision` is α Σ_k n_k, the precision of the product of the initial sites
    N(θ_0, (α n_k I)⁻¹) (None: uniform sites).
    """

    family: Any
    damping: float
    prior_precision: float | None
    initial_site_precision: float | None
    optimizer: NaturalOptimizer
    name: str

    def init(self, theta0: Tensor) -> ServerState:
        lam = prior_natural(self.family, self.prior_precision, theta0)
        if self.initial_site_precision is not None:
            lam = nat.add(lam, site_natural(self.family, theta0, self.initial_site_precision))
        return ServerState(lam, self.optimizer.init(lam), theta0.clone(), 0)

    def broadcast(self, server: ServerState) -> Message:
        return {**pack("lam", server.natural), "round": torch.tensor(server.round + 1)}

    def update(self, server: ServerState, replies: Mapping[int, Message]) -> tuple[ServerState, ServerInfo]:
        if not replies:
            return server, ServerInfo(0)
        total = nat.total([unpack("delta", replies[k]) for k in sorted(replies)])
        step, opt = self.optimizer.step(total, server.optimizer)
        lam_g = nat.add(server.natural, nat.scale(step, self.damping))
        if not all(bool(torch.isfinite(x).all()) for x in lam_g):
            raise DivergenceError(f"{self.name}: the global natural parameter is not finite")
        return ServerState(lam_g, opt, server.anchor, server.round + 1), ServerInfo(len(replies))

    def posterior(self, server: ServerState) -> Posterior:
        if not self.family.is_valid(server.natural):
            raise DivergenceError(
                f"{self.name}: q_g is not a valid Gaussian (improper start before any round, "
                f"or EP produced a negative precision)"
            )
        return Posterior(self.family, server.natural)


def damped_server(
    family,
    num_clients: int | None,
    client_sizes: Sequence[int] | None,
    damping: float | None,
    prior_precision: float | None,
    init_site_precision: float,
    optimizer: NaturalOptimizer,
    name: str,
) -> DampedServer:
    """The server of FedEP / FedSEP from their factories' arguments, validated: damping δ ∈ (0, 1] with default 1/K
    ([CODE]; K = num_clients, default len(client_sizes)); initial sites of total precision α Σ_k n_k (n_k = 1
    without client_sizes)."""
    check_family(family)
    if num_clients is None and client_sizes is not None:
        num_clients = len(client_sizes)
    if damping is None:
        if num_clients is None:
            raise ValueError("give damping or num_clients (the default damping is 1/num_clients)")
        damping = 1.0 / num_clients
    if not 0 < damping <= 1:
        raise ValueError(f"damping must be in (0, 1], got {damping}")
    if init_site_precision < 0:
        raise ValueError(f"init_site_precision must be >= 0, got {init_site_precision}")
    total_precision = None
    if init_site_precision > 0:
        if client_sizes is not None:
            total_precision = init_site_precision * float(sum(client_sizes))
        elif num_clients is not None:
            total_precision = init_site_precision * float(num_clients)
        else:
            raise ValueError("init_site_precision > 0 needs num_clients or client_sizes")
    return DampedServer(family, damping, prior_precision, total_precision, optimizer, name)


# ---------------------------------------------------------------------------
# tilted inference on networks, by name (the methods fedep, fedsep, fedpa)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TiltedSettings:
    """The tilted inference of `fedep`, `fedsep` and `fedpa` on networks: its name and settings, with the three
    methods' defaults (FedPA's `inference` default is "mcmc", `fedpa.Hparams`).

    inference: "identity", "laplace", "mcmc" or "ngvi" (module docstring).
    alpha: α, the per-example site precision (I; the floor of L and V; the norm M's precision is rescaled to; and
        FedEP's and FedSEP's initial sites).
    lr, epochs, batch_size: the local Adam run for the tilted mean (I, L, V). For M, `epochs` is the number of
        SG-MCMC samples (one per epoch, the paper's "client epochs") and the chain is SGD with `mcmc_lr` and
        `mcmc_momentum` (paper: 0.9) over minibatches of `batch_size`.
    fisher_samples: target draws per example for the sampled-target Fisher (L, V).
    shrinkage: ρ ∈ [0, 1] of M's variance ρ + (1 − ρ) Var_emp (paper: 1e-4 for CIFAR-100 and EMNIST).
    mcmc_lr: the chain's SGD step (default 0.01, the paper's client lr for CIFAR-100 and EMNIST).
    ngvi_beta, ngvi_epochs, ngvi_samples: β_NGVI, T_NGVI and N_NGVI of V; s is updated per minibatch of
        `batch_size`. The paper uses 0.99, 5, 5; the defaults draw fewer (below). ngvi_debias: Adam's bias
        correction of s."""

    inference: str = "identity"
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

    def __post_init__(self) -> None:
        choice("inference", self.inference, tuple(INFERENCE))


def _local_adam(settings: TiltedSettings, owner: str):
    return local_adam(owner, settings.lr, settings.epochs, settings.batch_size)


INFERENCE: dict[str, Callable[[TiltedSettings, str], TiltedInference]] = {
    "identity": lambda s, owner: ScaledIdentity(alpha=s.alpha, solver=_local_adam(s, owner)),
    "laplace": lambda s, owner: Laplace(alpha=s.alpha, fisher_samples=s.fisher_samples, solver=_local_adam(s, owner)),
    "mcmc": lambda s, owner: SGMCMC(
        alpha=s.alpha,
        shrinkage=s.shrinkage,
        lr=s.mcmc_lr,
        momentum=s.mcmc_momentum,
        epochs=s.epochs,
        batch_size=s.batch_size,
    ),
    "ngvi": lambda s, owner: NGVI(
        alpha=s.alpha,
        beta=s.ngvi_beta,
        epochs=s.ngvi_epochs,
        samples=s.ngvi_samples,
        batch_size=s.batch_size,
        fisher_samples=s.fisher_samples,
        debias=s.ngvi_debias,
        solver=_local_adam(s, owner),
    ),
}


def tilted_inference(settings: TiltedSettings, owner: str, likelihood: Likelihood | None = None) -> TiltedInference:
    """The inference object `settings` name, refused (TypeError) if it needs more of `likelihood` than it has (None:
    not checked here; the curvature then checks when it is computed); `owner` names the method in errors."""
    try:
        build = INFERENCE[settings.inference]
    except (KeyError, TypeError):
        raise ValueError(f"{owner}: inference must be one of {tuple(INFERENCE)}, got {settings.inference!r}") from None
    local = build(settings, owner)
    if likelihood is not None:
        require(likelihood, likelihood_needs(local), f"{owner} with inference={settings.inference!r}")
    return local
