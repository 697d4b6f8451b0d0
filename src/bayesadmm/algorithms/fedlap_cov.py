"""FedLap-Cov (Swaroop, Khan & Doshi-Velez 2025, Eqs. 10–14, implemented form Eq. 21), diagonal: PVI with the
second-order delta method, Gaussian sites t_k(w) ∝ exp(v_kᵀw − ½wᵀV_k w) and q_g = N(w_g, S_g⁻¹).

Eq. 21 in summed-loss units, with diagonal V_k, S and H_k (as in all the paper's experiments), prior π_0 = N(0, I/δ):

    client mean:       w_k ← argmin_w ℓ_k(w) + v_kᵀw − ½Σ_j V_kj w_j² + ½Σ_j S_gj (w_j − w_gj)²
    client precision:  S_k ← H_k(w_k) − V_k + S_g
    duals:             v_k ← v_k + ρ (S_k w_k − S_g w_g),     V_k ← (1 − ρ) V_k + ρ H_k(w_k)   (= V_k + ρ(S_k − S_g))
    server:            S_g ← δ + Σ_k V_k,     w_g ← Σ_k v_k / S_g                                  (elementwise)

The client mean problem divided by N_k is `LocalAdam`'s shape ℓ̄_k + aᵀw + ½Σ_j b_j (w_j − c_j)² exactly, with

    b = (S_g − V_k)/N_k,    c = w_g,    a = (v_k − V_k∘w_g)/N_k                           (`cavity_problem`)

since ½(S_g − V)(w − w_g)² + (v − V w_g)w = vw − ½Vw² + ½S_g(w − w_g)² − ½V w_g² coordinatewise. The proximal weight
is the cavity precision over N_k: S_g − V_k = δ + Σ_{j≠k} V_j, positive because every V_j is a convex combination of
PSD curvatures (it starts at 0). The client starts at w_g with fresh Adam state (the paper's objective in its
minibatch form).

Curvature H_k (`curvature`, a `solvers.curvature.DiagonalCurvature`): the diagonal GGN of the SUMMED negative
log-likelihood, with the output Hessian of the clients' likelihood (softmax, Gaussian, Poisson, or a user's), recomputed
every round at the post-update w_k (the "most recent parameters"; our reading, which fits the paper's "additional
backward pass through the dataset"): exact (`GGN()`, the default; the method's curvature="ggn") or its one-label
Monte-Carlo estimate (`MonteCarloFisher()`, curvature="mc-fisher"), drawn with the client's generator. The client's
local solver is Adam then the curvature, one object (`TrainThenCurvature`), so the client step is prepare, solve, finish
like every other method's. `solvers/curvature.py` has the estimators and the data they accept. A likelihood without what
the estimator reads (`curvature.needs`: the output Hessian for "ggn", target draws for "mc-fisher") is refused when the
method is built with it (`likelihood`, which the engine supplies), before any training.

Fixed point: w_k = w_g = w* with Σ_k ∇ℓ_k(w*) + δw* = 0 (the MAP), V_k = H_k(w*), S_g = S_k = δ + Σ_k H_k(w*).

Initialisation (not stated in the paper). The Bayes-consistent start is v_k = V_k = 0, q_g = π_0 (w_g = 0), which a
network cannot train from. As in `fedlap`, the initial sites share a random θ_0 instead: v_k⁽⁰⁾ = δθ_0/K, V_k⁽⁰⁾ = 0,
so that the server identity w_g = Σ_k v_k / S_g already holds at round 0 (q_g⁽⁰⁾ = N(θ_0, I/δ)); round 1 then gives
w_g = [δθ_0 + ρΣ_k (S_k w_k − δθ_0)] / S_g, for ρ = 1/K the precision-weighted mean of the local models, instead of
a result that misses θ_0. For θ_0 = 0 this is the Bayes-consistent start, and the fixed point does not depend on it.
Clients that have not replied yet count with their initial sites.

ρ defaults to 1/K, the paper's choice for FedLap-Cov (App. E). The posterior is q_g = N(w_g, diag(S_g)⁻¹).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms.base import (
    Algorithm,
    DivergenceError,
    LocalStep,
    Message,
    ServerInfo,
    TrainingInfo,
    merge_replies,
)
from bayesadmm.algorithms.fedavg import LR_SPACE
from bayesadmm.algorithms.fedlap import DELTA_SPACE
from bayesadmm.algorithms.spec import Context, MethodSpec, choice
from bayesadmm.algorithms.spec import register as register_method
from bayesadmm.families import DiagonalGaussian, Posterior
from bayesadmm.likelihoods import Likelihood, require
from bayesadmm.solvers.adam import AdamProblem, LocalAdam, local_adam
from bayesadmm.solvers.curvature import CURVATURES, GGN, DiagonalCurvature
from bayesadmm.solvers.von import SubproblemError
from bayesadmm.trees import register


@register
class ServerState(NamedTuple):
    mean: Tensor  # w_g
    precision: Tensor  # S_g (diagonal)
    theta0: Tensor  # θ_0: the initial sites of clients that have not replied yet
    replies: Mapping[int, Message]


@register
class ClientState(NamedTuple):
    v: Tensor  # v_k
    V: Tensor  # V_k (diagonal)
    mean: Tensor | None  # w_k from the last local solve
    precision: Tensor | None  # S_k


def cavity_problem(
    v: Tensor, V: Tensor, mean_g: Tensor, precision_g: Tensor, num_examples: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(a, b, c) with aᵀw + ½Σ b(w − c)² = (1/N_k)[vᵀw − ½ΣV w² + ½ΣS_g(w − w_g)²] + const (see the docstring)."""
    linear = (v - V * mean_g) / num_examples
    weight = (precision_g - V) / num_examples
    return linear, weight, mean_g


class LaplaceResult(NamedTuple):
    """A FedLap-Cov client's local solve: the trained mean w_k, its Adam steps and the curvature H_k(w_k)."""

    mean: Tensor
    steps: int
    curvature: Tensor


@dataclass(frozen=True)
class TrainThenCurvature:
    """FedLap-Cov's local solver: `adam` on the client's mean problem (an `AdamProblem`, `cavity_problem`'s terms from
    w_g), then `curvature` at the trained w_k, both drawing on the client's generator in that order. It does not batch
    (no `solve_cohort`: the curvature pass is per client)."""

    adam: LocalAdam
    curvature: DiagonalCurvature
    needs_generator: ClassVar[bool] = True  # Adam shuffles the minibatches

    def solve_problem(self, problem: AdamProblem, data, generator: torch.Generator) -> LaplaceResult:
        mean, steps = self.adam.solve_problem(problem, data, generator)
        return LaplaceResult(mean, steps, self.curvature(data, mean, generator))


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _is_count(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and int(x) >= 1


def _checked_rho(name: str, num_clients: int, delta: float, rho: float | None) -> float:
    """`make`'s checks of K, δ and ρ (one ValueError naming every problem of δ and ρ); returns ρ (default 1/K)."""
    if not _is_count(num_clients):
        raise ValueError(f"{name}: num_clients must be a positive integer, got {num_clients!r}")
    rho = 1.0 / num_clients if rho is None else rho
    problems = []
    if not _is_real(delta) or not delta > 0:
        problems.append(f"delta must be a finite number > 0, got {delta!r}")
    if not _is_real(rho) or not 0 < rho <= 1:
        problems.append(f"rho must be a number in (0, 1], got {rho!r}")
    if problems:
        raise ValueError(f"{name}: " + "; ".join(problems))
    return float(rho)


_EXACT_GGN = GGN()


def make(
    *,
    delta: float,
    lr: float,
    num_clients: int,
    rho: float | None = None,
    epochs: int = 1,
    batch_size: int = 32,
    curvature: DiagonalCurvature = _EXACT_GGN,
    name: str = "fedlap-cov",
    likelihood: Likelihood | None = None,
    client_ids: Collection[int] | None = None,
) -> Algorithm:
    """FedLap-Cov (diagonal) with prior precision δ, damping ρ (default 1/K), local Adam (lr, epochs, batch_size) and
    the curvature estimator `curvature` (`GGN()`, the exact diagonal GGN, or `MonteCarloFisher()`). `likelihood`: the
    clients', checked for what the estimator reads (None: checked when the curvature is first computed). `client_ids`:
    the ids of the K clients (default range(K)).

    Its length is the algorithm's pure functions (init, broadcast, prepare, finish, server update, posterior) written
    as closures over the hyperparameters, in the optax/blackjax style; the checks are in `_checked_rho`.
    """
    if likelihood is not None:  # (a curvature of one's own without `needs` reads nothing of it)
        needs = getattr(curvature, "needs", ())
        require(likelihood, needs, f"{name} with curvature={getattr(curvature, 'name', type(curvature).__name__)!r}")
    solver = TrainThenCurvature(local_adam(name, lr, epochs, batch_size), curvature)
    rho = _checked_rho(name, num_clients, delta, rho)
    ids = frozenset(range(num_clients) if client_ids is None else client_ids)
    if len(ids) != num_clients:
        raise ValueError(f"{name}: {len(ids)} client ids for num_clients={num_clients}")

    def initial_site(theta0: Tensor) -> Tensor:
        return delta * theta0 / num_clients  # v_k⁽⁰⁾, Σ_k v_k⁽⁰⁾ = δθ_0

    def init_server(theta0: Tensor) -> ServerState:
        return ServerState(theta0, torch.full_like(theta0, delta), theta0, {})

    def init_client(server: ServerState, client_id: int) -> ClientState:
        if client_id not in ids:
            raise KeyError(f"{name}: client id {client_id} is not one of the {num_clients} clients {sorted(ids)}")
        return ClientState(initial_site(server.theta0), torch.zeros_like(server.theta0), None, None)

    def broadcast(server: ServerState) -> Message:
        return {"mean": server.mean, "precision": server.precision}

    def prepare(state: ClientState, message: Message, data) -> AdamProblem:
        mean_g, precision_g = message["mean"], message["precision"]
        linear, weight, center = cavity_problem(state.v, state.V, mean_g, precision_g, data.num_examples)
        if not bool((weight > 0).all()):
            raise SubproblemError(
                f"{name}: the cavity precision S_g − V_k is not positive; the broadcast S_g does "
                f"not contain this client's V_k"
            )
        return AdamProblem(mean_g, linear=linear, prox_weight=weight, prox_center=center)

    def finish(state: ClientState, message: Message, data, problem: AdamProblem, result: LaplaceResult):
        mean_g, precision_g = message["mean"], message["precision"]
        mean, H = result.mean, result.curvature
        precision = H - state.V + precision_g
        v = state.v + rho * (precision * mean - precision_g * mean_g)
        V = (1.0 - rho) * state.V + rho * H
        reply = {"v": v, "V": V, "mean": mean, "precision": precision}
        return ClientState(v, V, mean, precision), reply, TrainingInfo(result.steps)

    def server_update(server: ServerState, replies: Mapping[int, Message]):
        unknown = sorted(k for k in replies if k not in ids)
        if unknown:
            raise KeyError(f"{name}: replies from clients {unknown}, not among {sorted(ids)}")
        last = merge_replies(server.replies, replies)
        return server_from(server.theta0, last), ServerInfo(len(last))

    def server_from(theta0: Tensor, last: Mapping[int, Message]) -> ServerState:
        """S_g = δ + Σ_k V_k, w_g = Σ_k v_k / S_g over the recorded sites, the others' initial sites included."""
        precision = delta + sum((r["V"] for r in last.values()), torch.zeros_like(theta0))
        v_sum = sum((r["v"] for r in last.values()), torch.zeros_like(theta0))
        v_sum = v_sum + (num_clients - len(last)) * initial_site(theta0)
        if not bool(torch.isfinite(precision).all() and (precision > 0).all() and torch.isfinite(v_sum).all()):
            raise DivergenceError(f"{name}: the server's precision is not positive and finite")
        return ServerState(v_sum / precision, precision, theta0, last)

    def unlearn(server: ServerState, client_id: int, state: ClientState) -> ServerState:
        """q_g = π_0 Π_k t_k without t_j: client j's site becomes the uniform one (v_j = V_j = 0 in its record), so
        S_g = δ + Σ_{k≠j} V_k and w_g = Σ_{k≠j} v_k / S_g, and stays so when training continues. At the fixed point
        t_k is the Laplace site of ℓ_k at w* (V_k = H_k(w*), v_k = V_k w* − ∇ℓ_k(w*)): exact where ℓ_k is quadratic
        with the diagonal curvature the family holds, an approximation otherwise."""
        if client_id not in server.replies:
            raise ValueError(f"client {client_id} never replied to the server: it has no site to remove")
        reply = server.replies[client_id]
        uniform = {**reply, "v": torch.zeros_like(reply["v"]), "V": torch.zeros_like(reply["V"])}
        return server_from(server.theta0, {**server.replies, client_id: uniform})

    def posterior(server: ServerState) -> Posterior:
        return _gaussian(server.mean, server.precision)

    def personal(server: ServerState, state: ClientState) -> Posterior:
        # the local Laplace posterior N(w_k, diag(S_k)⁻¹) of the client's last solve; q_g before its first
        if state.mean is None or state.precision is None:
            return posterior(server)
        return _gaussian(state.mean, state.precision)

    local = LocalStep(solver, prepare, finish)
    return Algorithm.from_local(
        name, init_server, init_client, broadcast, local, server_update, posterior, personal=personal, unlearn=unlearn
    )


def _gaussian(mean: Tensor, precision: Tensor) -> Posterior:
    """N(mean, diag(precision)⁻¹) as a Posterior of the diagonal family."""
    family = DiagonalGaussian(mean.shape[0])
    return Posterior(family, family.from_moments(mean, precision))


@dataclass(frozen=True)
class Hparams:
    """FedLap-Cov's hyperparameters: δ, the damping ρ (None: the default of `make`), the local Adam run and the
    curvature estimator by name: "ggn" (exact) or "mc-fisher"."""

    delta: float
    lr: float
    rho: float | None = None
    epochs: int = 1
    batch_size: int = 32
    curvature: str = "ggn"

    def __post_init__(self) -> None:
        choice("curvature", self.curvature, tuple(CURVATURES), "fedlap-cov")


def build(hparams: Hparams, context: Context) -> Algorithm:
    """`make` with the curvature estimator by name; the likelihood from the engine, checked for what the estimator
    reads."""
    return make(
        delta=hparams.delta,
        lr=hparams.lr,
        num_clients=context.num_clients,
        rho=hparams.rho,
        epochs=hparams.epochs,
        batch_size=hparams.batch_size,
        curvature=CURVATURES[hparams.curvature](),
        name="fedlap-cov",
        likelihood=context.likelihood,
        client_ids=context.client_sizes.keys(),
    )


SPEC = register_method(
    MethodSpec(
        name="fedlap-cov",
        hparams=Hparams,
        build=build,
        summary="FedLap-Cov: FedLap with diagonal covariances",
        search_space={**LR_SPACE, "delta": DELTA_SPACE},
        example={"lr": 0.05, "epochs": 2, "batch_size": 8, "delta": 1.0, "rho": 0.5},
    )
)
