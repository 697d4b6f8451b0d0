"""Federated ADMM (Möllenhoff et al., Eqs. 5–7 and 27; Boyd et al. 2011, §7.1.1), in parameter space.

With the regulariser ℓ_0 = δ/2 ‖θ‖²:

    client (5):  θ_k ← argmin_θ ℓ_k(θ) + v_kᵀθ + ρ/2 ‖θ − θ_g‖²
    dual   (6):  v_k ← v_k + ρ (θ_k − θ_g)              (afterwards v_k = −∇ℓ_k(θ_k), Eq. 8)
    server (7):  θ_g ← argmin δ/2‖θ‖² − Σ_k v_kᵀθ + ρ_s/2 Σ_k ‖θ − θ_k‖²
                     = (Σ_k v_k + ρ_s Σ_k θ_k) / (δ + ρ_s K)

which for δ = 1, ρ_s = ρ is Eq. 27, θ_g = α Σ v_k + (1 − α) Mean θ_k with α = 1/(1 + ρK).
ρ_s = 0 removes the server's proximal term: that is AMA (Tseng 1991; Eqs. 39–41).

This module is written in θ-space on purpose: the tests check that BayesADMM with the isotropic family and the
delta method reproduces these iterates (App. D.1), which is only a check if the two are computed independently.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, DivergenceError, Message, PointEstimate, merge_replies
from bayesadmm.solvers.newton import ProxNewton


class ServerState(NamedTuple):
    theta: Tensor                       # θ_g
    replies: Mapping[int, Message]


class ClientState(NamedTuple):
    dual: Tensor                        # v_k
    theta: Tensor | None                # θ_k from the last local solve


def make(rho: float, delta: float, solver=ProxNewton(), server_rho: float | None = None,
         name: str = "admm") -> Algorithm:
    """Federated ADMM with client proximal weight ρ, prior precision δ and server proximal weight ρ_s (default ρ)."""
    server_rho = rho if server_rho is None else server_rho
    if rho <= 0 or delta <= 0 or server_rho < 0:
        raise ValueError(f"need rho > 0, delta > 0, server_rho >= 0; got rho={rho}, delta={delta}, "
                         f"server_rho={server_rho}")

    def init_server(theta0: Tensor) -> ServerState:
        return ServerState(theta0, {})

    def init_client(server: ServerState, client_id: int) -> ClientState:
        return ClientState(torch.zeros_like(server.theta), None)

    def broadcast(server: ServerState) -> Message:
        return {"theta": server.theta}

    def client_update(state: ClientState, message: Message, loss, generator: torch.Generator):
        theta_g = message["theta"]
        result = solver.minimize(loss, state.dual, rho, theta_g)
        dual = state.dual + rho * (result.theta - theta_g)
        reply = {"theta": result.theta, "dual": dual}
        return ClientState(dual, result.theta), reply, {"iterations": result.iterations,
                                                         "converged": result.converged}

    def server_update(server: ServerState, replies: Mapping[int, Message]):
        last = merge_replies(server.replies, replies)
        dual_sum = sum(r["dual"] for r in last.values())
        theta_sum = sum(r["theta"] for r in last.values())
        theta = (dual_sum + server_rho * theta_sum) / (delta + server_rho * len(last))
        if not torch.isfinite(theta).all():
            raise DivergenceError(f"{name}: the server parameters are not finite")
        return ServerState(theta, last), {"clients": len(last)}

    def posterior(server: ServerState) -> PointEstimate:
        return PointEstimate(server.theta)

    return Algorithm(name, init_server, init_client, broadcast, client_update, server_update, posterior)
