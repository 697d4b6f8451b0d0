"""FedLap (Swaroop, Khan & Doshi-Velez 2025, Eqs. 7–9; mean-loss form App. A, Eq. 18): PVI with the delta method and
q_g = q_k = π_0-shaped isotropic Gaussians N(·, I/δ), i.e. federated ADMM whose proximal weight is the prior precision.

In the paper's summed-loss form, with sites t_k(w) ∝ exp(δ v_kᵀw) and the prior π_0 = N(0, I/δ),

    client (7):  w_k ← argmin_w ℓ_k(w) + δ v_kᵀw + ½δ‖w − w_g‖²
    site   (8):  v_k ← v_k + ρ_k (w_k − w_g)
    server (9):  w_g ← Σ_k v_k                         (no 1/K, no w_k term: q_g = π_0 Π_k t_k)

Dividing the client problem by N_k and writing ṽ_k = δ v_k / N_k gives the form a minibatch optimiser uses (Eq. 18),
which is what this module implements (`solvers.adam.LocalAdam` with linear term ṽ_k, proximal weight δ/N_k around
w_g, starting at w_g, fresh Adam state every round):

    client:  w_k ← argmin_w ℓ̄_k(w) + ṽ_kᵀw + ½(δ/N_k)‖w − w_g‖²
    dual:    ṽ_k ← ṽ_k + ρ_k (δ/N_k)(w_k − w_g)
    server:  w_g ← Σ_k (N_k/δ) ṽ_k

Fixed point (digest §1.7): w_k = w_g = w*, ṽ_k = −∇ℓ̄_k(w*) and Σ_k ∇ℓ_k(w*) + δw* = 0, the MAP with weight decay δ on
the summed loss (FedDyn and FedADMM target δ = 0). With ρ_k = 1 the dual equals −∇ℓ̄_k(w_k) after every client step;
for ρ_k < 1 the client's stationarity gives ṽ_k^new + (1 − ρ_k)(δ/N_k)(w_k − w_g) = −∇ℓ̄_k(w_k) (both tested).

Damping ρ (a `Damping`, which gives every client its ρ_k once, at construction): `SizeDamping()` is ρ_k = N_k/N, the
paper's App. E choice for FedLap (the method's `rho="size"`); `ConstantDamping(ρ)` is one ρ for every client (§3.2
says 1/K; the two agree for equal client sizes). The factory needs `client_sizes` in both cases (for N and for the
initialisation below), and checks each client's data against it.

Initialisation (the paper does not state it). The Bayes-consistent start is ṽ_k = 0 and w_g = Σ_k (N_k/δ)ṽ_k = 0
(q_g = π_0), but a network cannot be trained from all-zero weights. Broadcasting a random θ_0 with ṽ_k = 0 instead
breaks the server identity: round 1 would give w_g = Σ_k ρ_k (w_k − θ_0), which misses θ_0 (with ρ_k = N_k/N it is
the weighted mean of the local models minus θ_0 — close to zero, i.e. the network is mostly reset). Here the initial
sites are chosen so that the identity already holds at round 0:

    ṽ_k⁽⁰⁾ = δ θ_0 / N      so that      Σ_k (N_k/δ) ṽ_k⁽⁰⁾ = θ_0 = w_g⁽⁰⁾,

i.e. q_g⁽⁰⁾ = N(θ_0, I/δ) = π_0 Π_k t_k⁽⁰⁾ with each site holding the share N_k/N of θ_0. Round 1 then gives
w_g = θ_0 + Σ_k ρ_k (w_k − θ_0), which for ρ_k = N_k/N is the N_k-weighted mean of the local models (FedAvg's first
round). For θ_0 = 0 this is exactly the Bayes-consistent start. The initial sites are overwritten by the dual steps,
so the fixed point above does not depend on θ_0. A client that has not replied yet still counts with its initial
site (the server keeps θ_0), so partial participation sees the same identity.

Two servers compute w_g. By default the server keeps every client's last reply and sums every client's site each
round (absent clients at their last or initial site): work in the number of clients. With `incremental=True` it
keeps the running sum Σ_k (N_k/δ) ṽ_k in float64, starting at θ_0 (the initial sites' sum), and each client replies
with the change of its site, so the server's work follows the round's replies (for 10⁴–10⁵ clients with a few per
round); the same sum in another order, equal to the default's up to rounding.

The posterior is the point estimate w_g: q_g = N(w_g, I/δ) has the prior's variance, which is not a useful
predictive for small δ.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from bayesadmm.algorithms.base import (
    Algorithm,
    DivergenceError,
    LocalStep,
    Message,
    PointEstimate,
    ServerInfo,
    TrainingInfo,
    add_changes,
    change_reply,
    merge_replies,
)
from bayesadmm.algorithms.fedavg import LR_SPACE
from bayesadmm.algorithms.spec import Context, MethodSpec
from bayesadmm.algorithms.spec import register as register_method
from bayesadmm.solvers.adam import AdamProblem, local_adam
from bayesadmm.trees import register


@register
class ServerState(NamedTuple):
    theta: Tensor  # w_g
    theta0: Tensor  # θ_0: the initial sites of clients that have not replied yet
    replies: Mapping[int, Message]  # last reply of every client that has replied


@register
class RunningServerState(NamedTuple):
    theta: Tensor  # w_g
    theta0: Tensor  # θ_0: a new client's initial site is δθ_0/N
    total: Tensor  # Σ_k (N_k/δ) ṽ_k over every client (initial sites included), float64
    clients: int  # how many clients have replied


@register
class ClientState(NamedTuple):
    client_id: int
    dual: Tensor  # ṽ_k = δ v_k / N_k (mean-loss units)
    theta: Tensor | None  # w_k from the last local solve


# --- damping: every client's ρ_k ----------------------------------------------------------------------------------


class Damping(Protocol):
    def per_client(self, sizes: Mapping[int, int]) -> dict[int, float]:
        """ρ_k ∈ (0, 1] of every client, from the clients' sizes N_k."""


@dataclass(frozen=True)
class SizeDamping:
    """ρ_k = N_k/N, the FedLap paper's choice (App. E)."""

    def per_client(self, sizes: Mapping[int, int]) -> dict[int, float]:
        total = sum(sizes.values())
        return {k: n / total for k, n in sizes.items()}


@dataclass(frozen=True)
class ConstantDamping:
    """One ρ ∈ (0, 1] for every client (§3.2 of the FedLap paper: 1/K)."""

    rho: float

    def __post_init__(self) -> None:
        if not _is_real(self.rho) or not 0 < self.rho <= 1:
            raise ValueError(f"rho must be a number in (0, 1], got {self.rho!r}")

    def per_client(self, sizes: Mapping[int, int]) -> dict[int, float]:
        return {k: float(self.rho) for k in sizes}


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


# --- what FedLap-Func shares: the sizes, the initial sites and the server's site sum --------------------------------


def client_sizes_of(client_sizes, name: str) -> dict[int, int]:
    """{client id: N_k} as ints, or ValueError naming the algorithm."""
    if client_sizes is None:
        raise ValueError(f"{name} needs client_sizes (client id -> number of examples N_k)")
    sizes = {int(k): int(n) for k, n in client_sizes.items()}
    if not sizes or any(n <= 0 for n in sizes.values()):
        raise ValueError(f"{name}: client_sizes must be a non-empty mapping to positive sizes, got {client_sizes!r}")
    return sizes


def damping_of(rho: Damping, sizes: Mapping[int, int], name: str) -> dict[int, float]:
    """Every client's ρ_k, checked to lie in (0, 1]."""
    rhos = rho.per_client(sizes)
    bad = {k: r for k, r in rhos.items() if not (_is_real(r) and 0 < r <= 1)}
    if bad or set(rhos) != set(sizes):
        raise ValueError(f"{name}: rho must give every client a number in (0, 1], got {rhos!r}")
    return rhos


def site_sum(sizes: Mapping[int, int], delta: float, theta0: Tensor, last: Mapping[int, Message]) -> Tensor:
    """Σ_k v_k = Σ_k (N_k/δ) ṽ_k over every client in client-id order, a client that has not replied yet counting with
    its initial site (its share (N_k/N) θ_0)."""
    total = sum(sizes.values())
    theta = torch.zeros_like(theta0)
    for k in sorted(sizes):
        if k in last:
            theta = theta + (sizes[k] / delta) * last[k]["dual"]  # (N_k/δ) ṽ_k = v_k
        else:
            theta = theta + (sizes[k] / total) * theta0  # its initial site
    return theta


def check_client(name: str, sizes: Mapping[int, int], client_id: int, data) -> None:
    n = data.num_examples
    if n != sizes[client_id]:
        raise ValueError(f"{name}: client {client_id} has {n} examples but client_sizes says {sizes[client_id]}")


def check_known(name: str, sizes: Mapping[int, int], replies: Mapping[int, Message]) -> None:
    unknown = sorted(set(replies) - set(sizes))
    if unknown:
        raise KeyError(f"{name}: replies from clients {unknown} that are not in client_sizes")


# --- the algorithm ------------------------------------------------------------------------------------------------


def make(
    *,
    delta: float,
    lr: float,
    client_sizes: Mapping[int, int],
    rho: Damping = SizeDamping(),
    epochs: int = 1,
    batch_size: int = 32,
    name: str = "fedlap",
    incremental: bool = False,
) -> Algorithm:
    """FedLap with prior precision (global weight decay) δ, damping ρ (`SizeDamping()`: ρ_k = N_k/N, or
    `ConstantDamping(ρ)`), and local Adam (lr, epochs, batch_size); `incremental`: the server keeps the running sum
    of the sites instead of every client's reply (module docstring)."""
    sizes = client_sizes_of(client_sizes, name)
    total = sum(sizes.values())
    solver = local_adam(name, lr, epochs, batch_size)
    if not _is_real(delta) or not delta > 0:
        raise ValueError(f"{name}: delta must be a finite number > 0, got {delta!r}")
    rhos = damping_of(rho, sizes, name)

    def init_server(theta0: Tensor) -> ServerState | RunningServerState:
        if incremental:  # the initial sites sum to θ_0
            return RunningServerState(theta0, theta0, theta0.to(torch.float64), 0)
        return ServerState(theta0, theta0, {})

    def init_client(server: ServerState, client_id: int) -> ClientState:
        if client_id not in sizes:
            raise KeyError(f"{name}: client {client_id} is not in client_sizes {sorted(sizes)}")
        return ClientState(client_id, delta * server.theta0 / total, None)  # ṽ_k⁽⁰⁾ = δθ_0/N

    def broadcast(server: ServerState) -> Message:
        return {"theta": server.theta}

    def prepare(state: ClientState, message: Message, data) -> AdamProblem:
        check_client(name, sizes, state.client_id, data)
        theta_g = message["theta"]
        return AdamProblem(theta_g, linear=state.dual, prox_weight=delta / data.num_examples, prox_center=theta_g)

    def finish(state: ClientState, message: Message, data, problem: AdamProblem, result: tuple[Tensor, int]):
        theta, steps = result
        dual = state.dual + rhos[state.client_id] * problem.prox_weight * (theta - problem.theta0)
        reply = {"theta": theta, "dual": dual}
        if incremental:  # the change of the client's site (N_k/δ) ṽ_k, and whether the server counts it yet
            weight = sizes[state.client_id] / delta
            change = weight * dual.to(torch.float64) - weight * state.dual.to(torch.float64)
            reply = change_reply(change, state.theta is None)
        return ClientState(state.client_id, dual, theta), reply, TrainingInfo(steps)

    local = LocalStep(solver, prepare, finish)

    def server_update(server: ServerState, replies: Mapping[int, Message]):
        check_known(name, sizes, replies)
        last = merge_replies(server.replies, replies)
        theta = site_sum(sizes, delta, server.theta0, last)
        if not torch.isfinite(theta).all():
            raise DivergenceError(f"{name}: the server parameters are not finite")
        return ServerState(theta, server.theta0, last), ServerInfo(len(last))

    def running_update(server: RunningServerState, replies: Mapping[int, Message]):
        """`server_update` on the running sum: the work is over the replies only."""
        check_known(name, sizes, replies)
        total, count = add_changes(server.total, server.clients, replies)
        theta = total.to(server.theta.dtype)
        if not torch.isfinite(theta).all():
            raise DivergenceError(f"{name}: the server parameters are not finite")
        return RunningServerState(theta, server.theta0, total, count), ServerInfo(count)

    def posterior(server: ServerState | RunningServerState) -> PointEstimate:
        return PointEstimate(server.theta)

    def personal(server: ServerState, state: ClientState) -> PointEstimate:
        # the mean w_k of the client's last local Laplace solve (its covariance is the prior's, like q_g's)
        return posterior(server) if state.theta is None else PointEstimate(state.theta)

    def unlearn(server: ServerState, client_id: int, state: ClientState) -> ServerState:
        """q_g = π_0 Π_k t_k without t_j: client j's site becomes the uniform one (its recorded dual 0), so
        w_g = Σ_{k≠j} v_k, and stays so when training continues. The sites are first-order (t_k ∝ exp(δ v_kᵀw), v_k =
        −∇ℓ_k(w*)/δ at the fixed point), so this is an approximation even for a quadratic loss."""
        if client_id not in server.replies:
            raise ValueError(f"client {client_id} never replied to the server: it has no site to remove")
        reply = server.replies[client_id]
        last = {**server.replies, client_id: {**reply, "dual": torch.zeros_like(reply["dual"])}}
        return ServerState(site_sum(sizes, delta, server.theta0, last), server.theta0, last)

    def running_unlearn(server: RunningServerState, client_id: int, state: ClientState) -> RunningServerState:
        """`unlearn` on the running sum: client j's site (from its state) leaves it."""
        if state.theta is None:
            raise ValueError(f"client {client_id} never replied to the server: it has no site to remove")
        total = server.total - (sizes[client_id] / delta) * state.dual.to(torch.float64)
        return RunningServerState(total.to(server.theta.dtype), server.theta0, total, server.clients)

    return Algorithm.from_local(
        name, init_server, init_client, broadcast, local, running_update if incremental else server_update,
        posterior, personal=personal, unlearn=running_unlearn if incremental else unlearn,
    )  # fmt: skip


def damping_for(rho: float | str, name: str) -> Damping:
    """rho "size": ρ_k = N_k/N; a number in (0, 1]: that ρ for every client."""
    if isinstance(rho, str):
        if rho == "size":
            return SizeDamping()
    elif isinstance(rho, numbers.Real) and not isinstance(rho, bool) and math.isfinite(rho) and 0 < float(rho) <= 1:
        return ConstantDamping(float(rho))
    raise ValueError(f"{name}: rho must be 'size' or a number in (0, 1], got {rho!r}")


@dataclass(frozen=True)
class Hparams:
    """FedLap's hyperparameters: the prior precision δ, the damping `rho` ("size": ρ_k = N_k/N, or one number in
    (0, 1]), the local Adam run and `incremental` (the server's running sum: for many clients, a few per round)."""

    delta: float
    lr: float
    rho: float | str = "size"
    epochs: int = 1
    batch_size: int = 32
    incremental: bool = False

    def __post_init__(self) -> None:
        damping_for(self.rho, "fedlap")


def build(hparams: Hparams, context: Context) -> Algorithm:
    return make(
        delta=hparams.delta,
        lr=hparams.lr,
        client_sizes=context.client_sizes,
        rho=damping_for(hparams.rho, "fedlap"),
        epochs=hparams.epochs,
        batch_size=hparams.batch_size,
        name="fedlap",
        incremental=hparams.incremental,
    )


# the prior precision (required: every run has one) a hundred times either side of the scenario's: the span of the
# FedLap paper's grid {1, 0.1, ..., 1e-4}, which it is about FashionMNIST's 0.01
DELTA_SPACE = {"around": [0.01, 100]}

SPEC = register_method(
    MethodSpec(
        name="fedlap",
        hparams=Hparams,
        build=build,
        summary="FedLap: a Laplace version of PVI",
        search_space={**LR_SPACE, "delta": DELTA_SPACE},
        example={"lr": 0.05, "epochs": 2, "batch_size": 8, "delta": 1.0, "rho": 0.5},
    )
)
