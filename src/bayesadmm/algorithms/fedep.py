"""FedEP, FedSEP and FedPA: federated expectation propagation (Guo et al., ICLR 2023, Algs. 1, 3, 4).

Written from the paper and docs/spec (shared/spec/fedep-digest.md); "[CODE]" marks choices the digest takes from the
authors' code where the paper is silent or garbled.

The posterior p(θ|D) ∝ p_0(θ) Π_k p_k(θ) is approximated by q_g ∝ q_0 Π_k q_k with Gaussian sites q_k in a
`family` (DiagonalGaussian or FullGaussian) stored as the family's natural tuple λ = (η, −½Λ). A site need not be a
valid distribution; the improper uniform site is the zero tuple. q_0 is the prior N(0, δ_0⁻¹ I) (`prior_precision`)
or, with `prior_precision=None`, the improper uniform prior (λ_0 = 0).

FedEP (stateful clients, Alg. 4 client / Alg. 3 server), with damping δ (default 1/K, [CODE]):

    cavity   (2):  λ_{−k} = λ_g − λ_k
    tilted   (3):  λ̂_k   = inference(family, data_k, λ_{−k}, generator)    (≈ proj[p_k q_{−k}])
    delta    (4):  Δ_k   = λ̂_k − λ_g                                        (Δq_k ∝ q̂^{\\k} / q_g)
    client   (5):  λ_k  ← λ_k + δ · ClientOptim(Δ_k)
    server (Alg.3): λ_g ← λ_g + δ · ServerOptim(Σ_{k∈𝒦} Δ_k)

With identity optimizers this is damped EP, q_k^new ∝ q_k (Δq_k)^δ and q_g^new ∝ q_g Π_k (Δq_k)^δ, and the invariant
λ_g = λ_0 + Σ_k λ_k holds after every round with full participation. The optimizers act on the natural tuple as it is
stored (λ₂ = −½Λ, not Λ; for Adam, which is invariant to a fixed per-coordinate scale up to ε, this only matters for
the learning rate). The server keeps no per-client memory: deltas are increments, re-adding an absent client's last
delta would count it twice.

FedSEP (stateless, Sec. 2.2.4): Alg. 4 without step 5, and the cavity q_{−k} = q_g^{1 − n_k/N}, i.e.
λ_{−k} = (1 − n_k/N) λ_g ([CODE] reading; the printed formula q_g/q_k is the stateful one, garbled). n_k/N comes from
`client_sizes` (default 1/K).

FedPA (Remark in Sec. 2.1): cavity uniform, λ̂_k = inference(family, data_k, 0), q_g = q_0 Π_k q̂_k. From the
uniform start round 1 of undamped FedEP is FedPA (footnote 2; tested). For inference that searches (an optimizer or
an SG-MCMC chain on a network) `start_at_global=True` starts the search at the mean of q_g (θ_0 in round 1); the
target stays p_k.

`GaussianLikelihood` + `ExactGaussian` give the exact tilted distributions of the paper's toy (Sec. 3.1): p_k Gaussian
makes p_k q_{−k} Gaussian in closed form, which is then projected onto the family (KL(p‖q) projection: keep the mean
and the diagonal of Σ for the diagonal family).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, DivergenceError, Message, merge_replies, pack, unpack
from bayesadmm.families import DiagonalGaussian, FullGaussian, Posterior
from bayesadmm.families import natural as nat

Natural = tuple[Tensor, ...]
# inference(family, data, cavity_natural, generator) -> tilted natural (a valid member of `family`)
Inference = Callable[[Any, Any, Natural, torch.Generator], Natural]


# ---------------------------------------------------------------------------
# natural-parameter optimizers (the ClientOptim / ServerOptim hook)
# ---------------------------------------------------------------------------


class Identity(NamedTuple):
    """step = Δ: plain damped EP."""

    def init(self, like: Natural) -> tuple:
        return ()

    def step(self, delta: Natural, state: tuple) -> tuple[Natural, tuple]:
        return delta, state


class MomentumState(NamedTuple):
    trace: Natural


class Momentum(NamedTuple):
    """Heavy-ball SGD treating Δ as the (ascent) gradient: m ← βm + Δ, step = lr·m (the paper's server SGD m=0.9)."""

    lr: float = 1.0
    beta: float = 0.9

    def init(self, like: Natural) -> MomentumState:
        return MomentumState(nat.zeros_like(like))

    def step(self, delta: Natural, state: MomentumState) -> tuple[Natural, MomentumState]:
        trace = nat.add(nat.scale(state.trace, self.beta), delta)
        return nat.scale(trace, self.lr), MomentumState(trace)


class AdamState(NamedTuple):
    count: Tensor
    m: Natural
    v: Natural


class Adam(NamedTuple):
    """Adam on the natural parameters, Δ as the ascent direction: step = lr · m̂ / (√v̂ + ε), elementwise."""

    lr: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def init(self, like: Natural) -> AdamState:
        return AdamState(torch.zeros((), dtype=torch.int64), nat.zeros_like(like), nat.zeros_like(like))

    def step(self, delta: Natural, state: AdamState) -> tuple[Natural, AdamState]:
        count = state.count + 1
        m = tuple(self.beta1 * a + (1 - self.beta1) * d for a, d in zip(state.m, delta))
        v = tuple(self.beta2 * a + (1 - self.beta2) * d * d for a, d in zip(state.v, delta))
        c1 = 1 - self.beta1 ** int(count)
        c2 = 1 - self.beta2 ** int(count)
        step = tuple(self.lr * (a / c1) / (torch.sqrt(b / c2) + self.eps) for a, b in zip(m, v))
        return step, AdamState(count, m, v)


# ---------------------------------------------------------------------------
# (η, Λ) views of the family's natural tuple
# ---------------------------------------------------------------------------


def _check_family(family) -> None:
    if not isinstance(family, (DiagonalGaussian, FullGaussian)):
        raise TypeError(f"EP sites need a family with a free precision (diagonal or full), got {family!r}")


def precision_matrix(family, lam: Natural) -> Tensor:
    """Λ = −2λ₂ as a (d, d) matrix (diagonal family: diag(−2λ₂)); λ need not be valid."""
    if isinstance(family, DiagonalGaussian):
        return torch.diag(-2.0 * lam[1])
    return -(lam[1] + lam[1].mT)


def prior_natural(family, precision: float | None, like: Tensor) -> Natural:
    """λ_0 of N(0, δ_0⁻¹ I), or the zero tuple (improper uniform) when `precision` is None."""
    zeros = family.zeros(dtype=like.dtype, device=like.device)
    if precision is None:
        return zeros
    _, b = family.prior_terms(precision, dtype=like.dtype, device=like.device)
    return b


def site_natural(family, mean: Tensor, precision: float) -> Natural:
    """A site N(mean, (precision·I)⁻¹) in the family's layout (precision = 0 gives (0, 0), the uniform site)."""
    eye = torch.ones_like(mean) if isinstance(family, DiagonalGaussian) else torch.eye(
        family.dim, dtype=mean.dtype, device=mean.device)
    return (precision * mean, -0.5 * precision * eye)


# ---------------------------------------------------------------------------
# exact tilted inference for Gaussian likelihoods (the toy of Sec. 3.1)
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class GaussianLikelihood:
    """A client whose likelihood is the Gaussian site p_k(θ) = N(θ; mean, covariance) (unnormalised in θ)."""

    mean: Tensor
    covariance: Tensor

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    @property
    def precision(self) -> Tensor:
        return torch.linalg.inv(self.covariance)

    @property
    def natural(self) -> tuple[Tensor, Tensor]:
        """(η_k, Λ_k) = (Σ_k⁻¹ μ_k, Σ_k⁻¹)."""
        precision = self.precision
        return precision @ self.mean, precision


@dataclass(frozen=True)
class ExactGaussian:
    """Tilted inference in closed form: p_k q_{−k} = N(η_k + η_{−k}, Λ_k + Λ_{−k}), projected onto the family.

    Full family: the tilted distribution itself. Diagonal family: KL(p‖q) projection, i.e. keep the mean and diag Σ.
    `scaled_identity=α` replaces the projected precision by Λ_{−k} + α I, keeping the exact tilted mean: the
    "scaled identity" client of Sec. 2.2.2 in its [CODE] form (site precision α per data point; the toy uses α = 1,
    Λ̂ = diag(Λ_{−k}) + I), which sends no covariance information of its own.
    """

    scaled_identity: float | None = None

    def __call__(self, family, data: GaussianLikelihood, cavity: Natural, generator=None) -> Natural:
        from bayesadmm.solvers.von import SubproblemError

        eta_k, lam_k = data.natural
        cav_prec = precision_matrix(family, cavity)
        precision = lam_k + cav_prec
        precision = 0.5 * (precision + precision.mT)
        factor, info = torch.linalg.cholesky_ex(precision)
        if int(info) != 0:
            raise SubproblemError("the tilted distribution p_k q_{-k} is not normalisable "
                                  "(Λ_k + Λ_{-k} is not positive definite)")
        h = eta_k + cavity[0]
        mean = torch.cholesky_solve(h.unsqueeze(-1), factor).squeeze(-1)
        if self.scaled_identity is not None:
            if isinstance(family, DiagonalGaussian):
                s = torch.diagonal(cav_prec) + self.scaled_identity
                if not bool((s > 0).all()):
                    raise SubproblemError("scaled-identity tilted precision is not positive")
                return (s * mean, -0.5 * s)
            s = cav_prec + self.scaled_identity * torch.eye(family.dim, dtype=mean.dtype, device=mean.device)
            return (s @ mean, -0.5 * s)
        if isinstance(family, FullGaussian):
            return (h, -0.5 * precision)
        variance = torch.diagonal(torch.cholesky_inverse(factor))
        return (mean / variance, -0.5 / variance)


# ---------------------------------------------------------------------------
# FedEP (stateful) and FedSEP (stateless)
# ---------------------------------------------------------------------------


class ServerState(NamedTuple):
    natural: Natural                    # λ_g (may be improper before the first round from a uniform start)
    optimizer: Any                      # ServerOptim state
    anchor: Tensor                      # θ_0, the mean of the initial sites (init_site_precision > 0)
    round: int = 0


class ClientState(NamedTuple):
    site: Natural                       # λ_k
    optimizer: Any                      # ClientOptim state


class StatelessClientState(NamedTuple):
    fraction: float                     # n_k / N, the exponent of the FedSEP cavity (configuration, not learnt)


def _clip(delta: Natural, clip_norm: float | None) -> Natural:
    if clip_norm is None:
        return delta
    norm = float(nat.norm(delta))
    return nat.scale(delta, clip_norm / norm) if norm > clip_norm else delta


def _fractions(num_clients: int | None, client_sizes: Sequence[int] | None) -> Callable[[int], float]:
    if client_sizes is not None:
        total = float(sum(client_sizes))
        return lambda k: client_sizes[k] / total
    if num_clients is None:
        raise ValueError("FedSEP needs num_clients or client_sizes for its cavity exponent n_k / N")
    return lambda k: 1.0 / num_clients


def make(family, inference: Inference, num_clients: int | None = None, damping: float | None = None,
         prior_precision: float | None = None, stateless: bool = False,
         client_sizes: Sequence[int] | None = None, server_optimizer=Identity(), client_optimizer=Identity(),
         init_site_precision: float = 0.0, clip_norm: float | None = None, name: str | None = None) -> Algorithm:
    """FedEP (stateless=False) or FedSEP (stateless=True) over `family` with tilted `inference`.

    num_clients: K (default len(client_sizes)). damping: δ in (0, 1]; default 1/K ([CODE]: 1/clients per round);
        1.0 = undamped parallel EP.
    prior_precision: δ_0 of the prior N(0, δ_0⁻¹ I); None = improper uniform prior (q_g starts at the zero tuple).
    client_sizes: n_k, for FedSEP's cavity exponent and the site initialisation (default equal sizes).
    server_optimizer / client_optimizer: Identity() (plain damping), Momentum(lr, beta) or Adam(lr, ...).
    init_site_precision: α ≥ 0; sites start at N(θ_0, (α n_k I)⁻¹) (n_k = 1 without client_sizes), the [CODE]
        switch from a FedAvg burn-in (θ_0 = its model); 0 = uniform sites.
    clip_norm: clip each client's Δ_k by its global L2 norm before damping ([CODE]); None = no clipping.
    """
    _check_family(family)
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
    name = name or ("fedsep" if stateless else "fedep")
    fraction = _fractions(num_clients, client_sizes) if stateless else None
    size = (lambda k: float(client_sizes[k])) if client_sizes is not None else (lambda k: 1.0)

    def init_server(theta0: Tensor) -> ServerState:
        lam = prior_natural(family, prior_precision, theta0)
        if init_site_precision > 0:
            if client_sizes is not None:
                total = float(sum(client_sizes))
            elif num_clients is not None:
                total = float(num_clients)
            else:
                raise ValueError("init_site_precision > 0 needs num_clients or client_sizes")
            lam = nat.add(lam, site_natural(family, theta0, init_site_precision * total))
        return ServerState(lam, server_optimizer.init(lam), theta0.clone(), 0)

    def init_client(server: ServerState, client_id: int):
        if stateless:
            return StatelessClientState(fraction(client_id))
        if init_site_precision > 0:
            site = site_natural(family, server.anchor, init_site_precision * size(client_id))
        else:
            site = nat.zeros_like(server.natural)
        return ClientState(site, client_optimizer.init(site))

    def broadcast(server: ServerState) -> Message:
        return {**pack("lam", server.natural), "round": torch.tensor(server.round + 1)}

    def client_update(state, message: Message, data, generator: torch.Generator):
        lam_g = unpack("lam", message)
        if stateless:
            cavity = nat.scale(lam_g, 1.0 - state.fraction)
        else:
            cavity = nat.sub(lam_g, state.site)
        tilted = inference(family, data, cavity, generator)
        delta = _clip(nat.sub(tilted, lam_g), clip_norm)
        if stateless:
            new_state = state
        else:
            step, opt = client_optimizer.step(delta, state.optimizer)
            new_state = ClientState(nat.add(state.site, nat.scale(step, damping)), opt)
        return new_state, pack("delta", delta), {}

    def server_update(server: ServerState, replies: Mapping[int, Message]):
        if not replies:
            return server, {"clients": 0}
        total = nat.total([unpack("delta", replies[k]) for k in sorted(replies)])
        step, opt = server_optimizer.step(total, server.optimizer)
        lam_g = nat.add(server.natural, nat.scale(step, damping))
        if not all(bool(torch.isfinite(x).all()) for x in lam_g):
            raise DivergenceError(f"{name}: the global natural parameter is not finite")
        return ServerState(lam_g, opt, server.anchor, server.round + 1), {"clients": len(replies)}

    def posterior(server: ServerState) -> Posterior:
        if not family.is_valid(server.natural):
            raise DivergenceError(f"{name}: q_g is not a valid Gaussian (improper start before any round, "
                                  f"or EP produced a negative precision)")
        return Posterior(family, server.natural)

    return Algorithm(name, init_server, init_client, broadcast, client_update, server_update, posterior)


def make_fedsep(family, inference: Inference, num_clients: int | None = None, **kw) -> Algorithm:
    """FedSEP = `make(..., stateless=True)`."""
    return make(family, inference, num_clients=num_clients, stateless=True, **kw)


# ---------------------------------------------------------------------------
# FedPA: uniform cavity, product of the local approximations
# ---------------------------------------------------------------------------


class FedPAServerState(NamedTuple):
    natural: Natural                    # λ_g = λ_0 + Σ_k λ̂_k
    replies: Mapping[int, Message]      # last local approximation of every client
    round: int = 0
    anchor: Tensor | None = None        # θ_0, where local chains start before the first server update


class FedPAClientState(NamedTuple):
    pass


def make_fedpa(family, inference: Inference, prior_precision: float | None = None, name: str = "fedpa",
               start_at_global: bool = False) -> Algorithm:
    """FedPA as the Remark of Sec. 2.1 defines it: λ̂_k = inference(family, data_k, 0), λ_g = λ_0 + Σ_k λ̂_k.

    The server keeps each client's last approximation (`merge_replies`), so absent clients still count.
    start_at_global: call `inference(..., start=θ_s)` with θ_s = θ_0 in round 1 and the mean of q_g afterwards, for
        local inference that runs a chain or an optimizer (a network cannot train from the uniform cavity's mean 0;
        FedPA's clients start from the server model, Al-Shedivat et al. 2021). The cavity stays uniform, so
        this only changes where the local search starts, not the distribution it targets.
    """
    _check_family(family)

    def init_server(theta0: Tensor) -> FedPAServerState:
        return FedPAServerState(prior_natural(family, prior_precision, theta0), {}, 0, theta0.clone())

    def init_client(server: FedPAServerState, client_id: int) -> FedPAClientState:
        return FedPAClientState()

    def broadcast(server: FedPAServerState) -> Message:
        message = {**pack("lam", server.natural), "round": torch.tensor(server.round + 1)}
        if start_at_global:
            if server.round == 0:
                if server.anchor is None:
                    raise ValueError(f"{name}: start_at_global needs the server's θ_0 (init_server)")
                message["start"] = server.anchor
            else:
                message["start"] = family.to_moments(server.natural)[0]
        return message

    def client_update(state, message: Message, data, generator: torch.Generator):
        lam_g = unpack("lam", message)
        uniform = nat.zeros_like(lam_g)
        if start_at_global:
            local = inference(family, data, uniform, generator, start=message["start"])
        else:
            local = inference(family, data, uniform, generator)
        return state, pack("local", local), {}

    def server_update(server: FedPAServerState, replies: Mapping[int, Message]):
        last = merge_replies(server.replies, replies)
        lam0 = prior_natural(family, prior_precision, server.natural[0])
        lam_g = nat.add(lam0, nat.total([unpack("local", r) for r in last.values()]))
        if not family.is_valid(lam_g):
            raise DivergenceError(f"{name}: the product of the local approximations is not a valid Gaussian")
        return FedPAServerState(lam_g, last, server.round + 1, server.anchor), {"clients": len(last)}

    def posterior(server: FedPAServerState) -> Posterior:
        return Posterior(family, server.natural)

    return Algorithm(name, init_server, init_client, broadcast, client_update, server_update, posterior)
