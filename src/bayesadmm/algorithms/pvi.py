"""Partitioned variational inference (Ashman et al. 2022, Alg. 1), in the site form of App. C.3.

Sites t_k(θ) = exp⟨η_k, T(θ)⟩ start at 1 (η_k = 0) and q_g at the prior π_0 = N(0, δ⁻¹I):

    client (36):  q_k ← argmin_q E_q[ℓ_k + log t_k] + KL(q ‖ q_g)
    site   (37):  t_k ← t_k (q_k / q_g)^ε        i.e. η_k ← η_k + ε (λ_k − λ_g)   (ε = 1: undamped; ε < 1: damped)
    server (38):  q_g ← q_g Π_k t_k^new / t_k^old   i.e. λ_g ← λ_g + Σ_k (η_k^new − η_k^old)

The server applies the clients' site changes multiplicatively, as Ashman et al. write it. BayesADMM with ρ = 1 and
no server proximal term (α = 1) is the same algorithm; a test checks the iterates agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from torch import Tensor

from bayesadmm.algorithms.base import (
    Algorithm,
    DivergenceError,
    LocalStep,
    Message,
    ServerInfo,
    SolveInfo,
    pack,
    unpack,
)
from bayesadmm.families import Posterior
from bayesadmm.families import natural as nat
from bayesadmm.solvers.von import VariationalProblem
from bayesadmm.trees import register

Natural = tuple[Tensor, ...]


@register
class ServerState(NamedTuple):
    natural: Natural  # λ_g


@register
class ClientState(NamedTuple):
    site: Natural  # η_k
    natural: Natural | None = None  # λ_k, the local q_k of the last solve (36): the client's personal posterior


def make(family, solver, delta: float, damping: float = 1.0, name: str = "pvi") -> Algorithm:
    """PVI over `family` with local `solver` (as `bayes_admm.make`'s, on the `VariationalProblem` with ρ = 1 and the
    site as the dual); damping ε in (0, 1]. The prior must lie in the family."""
    if not 0 < damping <= 1:
        raise ValueError(f"PVI damping must be in (0, 1], got {damping}")
    c, prior = family.prior_terms(delta)
    if c != 1.0:
        raise ValueError(
            f"PVI starts q_g at the prior N(0, {delta}⁻¹ I), which the {family.name} family does not "
            f"contain; use a family with a free covariance"
        )

    def init_server(theta0: Tensor) -> ServerState:
        # Ashman et al. start at the prior; theta0 only fixes shape, dtype and device.
        return ServerState(tuple(p.to(theta0) for p in prior))

    def init_client(server: ServerState, client_id: int) -> ClientState:
        return ClientState(nat.zeros_like(server.natural))

    def broadcast(server: ServerState) -> Message:
        return pack("lam", server.natural)

    def prepare(state: ClientState, message: Message, loss) -> VariationalProblem:
        # (36) is Eq. 15 with ρ = 1 and the site as the dual
        return VariationalProblem(family, unpack("lam", message), state.site, 1.0)

    def finish(state: ClientState, message: Message, loss, problem: VariationalProblem, result):
        change = nat.scale(nat.sub(result.natural, problem.lam_g), damping)
        return (
            ClientState(nat.add(state.site, change), result.natural),
            pack("site_change", change),
            SolveInfo(result.iterations, result.converged),
        )

    def server_update(server: ServerState, replies: Mapping[int, Message]):
        changes = [unpack("site_change", replies[k]) for k in sorted(replies)]
        lam_g = nat.add(server.natural, nat.total(changes))
        if not family.is_valid(lam_g):
            raise DivergenceError(f"{name}: q_g is no longer a valid Gaussian (undamped PVI can diverge)")
        return ServerState(lam_g), ServerInfo(len(replies))

    def posterior(server: ServerState) -> Posterior:
        return Posterior(family, server.natural)

    def personal(server: ServerState, state: ClientState) -> Posterior:
        # the local q_k of (36); q_g before the client's first solve
        return posterior(server) if state.natural is None else Posterior(family, state.natural)

    def unlearn(server: ServerState, client_id: int, state: ClientState) -> ServerState:
        """q_g / t_j: the server applies every site change, so λ_g = λ_0 + Σ_k η_k after every round and the
        posterior without client j is λ_g − η_j (exact for a conjugate model once the sites have converged; the
        other sites need no change). A zero site is the uniform one of a client that never took part."""
        if all(not bool(x.any()) for x in state.site):
            raise ValueError(f"client {client_id}'s site is the uniform one (it never took part): nothing to remove")
        lam_g = nat.sub(server.natural, state.site)
        if not family.is_valid(lam_g):
            raise ValueError(f"removing client {client_id}'s site leaves no valid Gaussian: retrain without the client")
        return ServerState(lam_g)

    local = LocalStep(solver, prepare, finish)
    return Algorithm.from_local(
        name, init_server, init_client, broadcast, local, server_update, posterior, personal=personal, unlearn=unlearn
    )
