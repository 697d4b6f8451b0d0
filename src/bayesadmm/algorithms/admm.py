"""Federated ADMM (Möllenhoff et al., Eqs. 5–7 and 27; Boyd et al. 2011, §7.1.1), in parameter space.

With the regulariser ℓ_0 = δ/2 ‖θ‖²:

    client (5):  θ_k ← argmin_θ ℓ_k(θ) + v_kᵀθ + ρ/2 ‖θ − θ_g‖²
    dual   (6):  v_k ← v_k + ρ (θ_k − θ_g)              (afterwards v_k = −∇ℓ_k(θ_k), Eq. 8)
    server (7):  θ_g ← argmin δ/2‖θ‖² − Σ_k v_kᵀθ + ρ_s/2 Σ_k ‖θ − θ_k‖²
                     = (Σ_k v_k + ρ_s Σ_k θ_k) / (δ + ρ_s K)

which for δ = 1, ρ_s = ρ is Eq. 27, θ_g = α Σ v_k + (1 − α) Mean θ_k with α = 1/(1 + ρK).
ρ_s = 0 removes the server's proximal term: that is AMA (Tseng 1991; Eqs. 39–41).

The fixed point (Eqs. 8, 13): θ_k = θ_g = θ*, v_k = −∇ℓ_k(θ*), and the server's stationarity δθ* = Σ_k v_k gives
Σ_k ∇ℓ_k(θ*) + δθ* = 0, the MAP of the prior N(0, δ⁻¹I) (for ρ_s > 0; AMA has the same fixed point).

Units. The algorithm does not care whether `loss` is a client's SUMMED loss ℓ_k (the convex experiments, solved
exactly by `ProxNewton`) or its MEAN loss ℓ̄_k = ℓ_k/N_k (`make_nn`, solved by `LocalAdamProx`): the solver decides.
In mean-loss units everything above holds with ℓ̄_k in place of ℓ_k, so v_k = −∇ℓ̄_k(θ_k) and the fixed point solves
Σ_k ∇ℓ̄_k(θ) + δθ = 0 (ρ and δ are then on the mean-loss scale; for K clients of equal size n this is the MAP of
Σ_k ℓ_k + nδ/2‖θ‖²).

FedADMM (Gong et al. 2022; Wang et al. 2022; Zhou & Li 2023; the FedLap paper's Eq. 2, `fedlap-digest.md` §1.1) is
the mean-loss form with no prior, δ = 0, and ρ_s = ρ: the server above becomes
θ_g = (Σ_k v_k + ρ Σ_k θ_k)/(ρK) = (1/K) Σ_k (θ_k + v_k/ρ), which is the digest's w_g ← (1/K) Σ_k [w_k + v_k/α].
δ = 0 is therefore allowed whenever ρ_s > 0 (with δ = ρ_s = 0 the server problem has no unique solution).
`make_nn` builds it with the Adam local solver (`solvers.adam.LocalAdamProx`, squared proximal term, fresh
optimizer state every round).

Two servers compute θ_g. By default (`incremental=False`) the server keeps every client's last reply and sums them
all each round: its memory and work grow with the clients that ever replied. With `incremental=True` it keeps the
running sum Σ_k (v_k + ρ_s θ_k) in float64 and how many clients it holds; a client replies with the change of its
term (its old term recomputed from its state) and whether it is new, so the server's work follows the participants
(for 10⁴–10⁵ clients with a few per round). The sum adds the same terms in another order: the numbers equal the
default's up to rounding, not bit for bit.

This module is written in θ-space on purpose: the tests check that BayesADMM with the isotropic family and the
delta method reproduces these iterates (App. D.1), which is only a check if the two are computed independently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms.base import (
    Algorithm,
    DivergenceError,
    LocalStep,
    Message,
    PointEstimate,
    ServerInfo,
    SolveInfo,
    add_changes,
    change_reply,
    merge_replies,
)
from bayesadmm.algorithms.fedavg import LR_SPACE
from bayesadmm.algorithms.spec import Context, MethodSpec
from bayesadmm.algorithms.spec import register as register_method
from bayesadmm.solvers.adam import LocalAdamProx, local_adam
from bayesadmm.solvers.newton import ProxNewton, ProxProblem
from bayesadmm.trees import register


@register
class ServerState(NamedTuple):
    theta: Tensor  # θ_g
    replies: Mapping[int, Message]


@register
class RunningServerState(NamedTuple):
    theta: Tensor  # θ_g
    total: Tensor  # Σ_k (v_k + ρ_s θ_k) over the clients that replied, float64
    clients: int  # how many clients that is


@register
class ClientState(NamedTuple):
    dual: Tensor  # v_k
    theta: Tensor | None  # θ_k from the last local solve


_NEWTON = ProxNewton()


def make(
    rho: float,
    delta: float,
    solver=_NEWTON,
    server_rho: float | None = None,
    name: str = "admm",
    incremental: bool = False,
) -> Algorithm:
    """Federated ADMM with client proximal weight ρ, prior precision δ and server proximal weight ρ_s (default ρ).

    δ = 0 (no prior) needs ρ_s > 0. `solver.solve_problem(ProxProblem(v, ρ, θ_g), loss, generator)` solves Eq. 5
    (`ProxNewton`, `LocalAdamProx`). `incremental`: the server keeps the running sum of the clients' terms instead of
    their replies (module docstring).
    """
    server_rho = rho if server_rho is None else server_rho
    if (
        not all(math.isfinite(x) for x in (rho, delta, server_rho))
        or rho <= 0
        or delta < 0
        or server_rho < 0
        or (delta == 0 and server_rho == 0)
    ):
        raise ValueError(
            f"need finite rho > 0, delta >= 0, server_rho >= 0, and delta > 0 or server_rho > 0; "
            f"got rho={rho}, delta={delta}, server_rho={server_rho}"
        )

    def init_server(theta0: Tensor) -> ServerState | RunningServerState:
        if incremental:
            return RunningServerState(theta0, torch.zeros_like(theta0, dtype=torch.float64), 0)
        return ServerState(theta0, {})

    def init_client(server: ServerState, client_id: int) -> ClientState:
        return ClientState(torch.zeros_like(server.theta), None)

    def broadcast(server: ServerState) -> Message:
        return {"theta": server.theta}

    def term(dual: Tensor, theta: Tensor) -> Tensor:  # a client's share of the server's sum, in float64
        return dual.double() + server_rho * theta.double()

    def finish(state: ClientState, message: Message, loss, problem, result):
        theta_g = message["theta"]
        dual = state.dual + rho * (result.theta - theta_g)
        reply = {"theta": result.theta, "dual": dual}
        if incremental:  # the change of the client's term, and whether the server counts it yet
            change = term(dual, result.theta)
            if state.theta is not None:
                change = change - term(state.dual, state.theta)
            reply = change_reply(change, state.theta is None)
        return ClientState(dual, result.theta), reply, SolveInfo(result.iterations, result.converged)

    def prepare(state: ClientState, message: Message, loss) -> ProxProblem:
        return ProxProblem(state.dual, rho, message["theta"])

    local = LocalStep(solver, prepare, finish)

    def server_update(server: ServerState, replies: Mapping[int, Message]):
        last = merge_replies(server.replies, replies)
        dual_sum = sum(r["dual"] for r in last.values())
        theta_sum = sum(r["theta"] for r in last.values())
        theta = (dual_sum + server_rho * theta_sum) / (delta + server_rho * len(last))
        if not torch.isfinite(theta).all():
            raise DivergenceError(f"{name}: the server parameters are not finite")
        return ServerState(theta, last), ServerInfo(len(last))

    def running_update(server: RunningServerState, replies: Mapping[int, Message]):
        """`server_update` on the running sum: the work is over the replies only."""
        total, count = add_changes(server.total, server.clients, replies)
        if count == 0:
            raise ValueError(f"{name}: server_update needs at least one client's reply")
        theta = (total / (delta + server_rho * count)).to(server.theta.dtype)
        if not torch.isfinite(theta).all():
            raise DivergenceError(f"{name}: the server parameters are not finite")
        return RunningServerState(theta, total, count), ServerInfo(count)

    def posterior(server: ServerState) -> PointEstimate:
        return PointEstimate(server.theta)

    update = running_update if incremental else server_update
    return Algorithm.from_local(name, init_server, init_client, broadcast, local, update, posterior)


def make_nn(
    *,
    rho: float,
    delta: float = 0.0,
    lr: float = 1e-3,
    epochs: int = 1,
    batch_size: int = 32,
    server_rho: float | None = None,
    name: str = "fedadmm",
    incremental: bool = False,
) -> Algorithm:
    """Federated ADMM for neural networks: mean-loss client problems solved by `epochs` epochs of Adam.

    rho: ρ > 0 (the FedLap paper's α), on the mean-loss scale. delta: prior precision δ ≥ 0 on the same scale;
    the default δ = 0 is FedADMM (server θ_g = Mean_k(θ_k + v_k/ρ)). lr, epochs, batch_size: the local Adam run,
    which starts from θ_g with fresh optimizer state every round. server_rho: ρ_s (default ρ). incremental: the
    server's running sum (`make`).
    """
    local_adam(name, lr, epochs, batch_size)  # errors name the algorithm
    solver = LocalAdamProx(lr=lr, epochs=epochs, batch_size=batch_size)
    return make(rho=rho, delta=delta, solver=solver, server_rho=server_rho, name=name, incremental=incremental)


@dataclass(frozen=True)
class Hparams:
    """Federated ADMM's hyperparameters on networks (`make_nn`): ρ, the prior precision δ, the local Adam run, the
    server's ρ_s (None: ρ) and `incremental` (the server's running sum: for many clients, a few per round)."""

    rho: float
    delta: float = 0.0
    lr: float = 1e-3
    epochs: int = 1
    batch_size: int = 32
    server_rho: float | None = None
    incremental: bool = False


@dataclass(frozen=True)
class AMAHparams:
    """AMA's hyperparameters: ADMM's without ρ_s, which is 0 (no server proximal term)."""

    rho: float
    delta: float = 0.0
    lr: float = 1e-3
    epochs: int = 1
    batch_size: int = 32
    incremental: bool = False


def _build_nn(hparams: Hparams | AMAHparams, server_rho: float | None, name: str) -> Algorithm:
    return make_nn(
        rho=hparams.rho,
        delta=hparams.delta,
        lr=hparams.lr,
        epochs=hparams.epochs,
        batch_size=hparams.batch_size,
        server_rho=server_rho,
        name=name,
        incremental=hparams.incremental,
    )


def build(hparams: Hparams, context: Context) -> Algorithm:
    return _build_nn(hparams, hparams.server_rho, "fedadmm")


def build_ama(hparams: AMAHparams, context: Context) -> Algorithm:
    return _build_nn(hparams, 0.0, "ama")


SPEC = register_method(
    MethodSpec(
        name="admm",
        hparams=Hparams,
        build=build,
        summary="federated ADMM",
        search_space={**LR_SPACE, "rho": {"around": [0.1, 10]}},  # rho ten times either side of the scenario's
        example={"lr": 0.05, "epochs": 2, "batch_size": 8, "rho": 0.5, "delta": 1.0},
    )
)
AMA_SPEC = register_method(
    MethodSpec(
        name="ama",
        hparams=AMAHparams,
        build=build_ama,
        summary="alternating minimisation algorithm (ADMM without the server's proximal term)",
        example={"lr": 0.05, "epochs": 2, "batch_size": 8, "rho": 0.5, "delta": 1.0},
    )
)
