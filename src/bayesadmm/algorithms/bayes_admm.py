"""BayesADMM: federated ADMM generalised to exponential-family posteriors (Möllenhoff et al., Eqs. 15–17, 54).

With q_k = family(λ_k), q_g = family(λ_g), duals η_k (same layout as λ, need not be valid) and the prior
π_0 = N(0, δ⁻¹I):

    client (15):  μ_k ← argmin_μ  E_q[ℓ_k] + ⟨η_k, μ⟩ + ρ KL(q_k ‖ q_g)          (the local `solver`)
    dual   (16):  η_k ← η_k + γ (λ_k − λ_g)                                     (γ = ρ is the derived step)
    server (17):  μ_g ← argmin  KL(q_g ‖ π_0) − Σ_k ⟨η_k, μ_g⟩ + ρ_s Σ_k KL(q_g ‖ q_k)

The server problem has a closed form. Its stationarity (Eq. 53) is ∇_μ KL(q_g‖π_0) − Σ η_k + ρ_s Σ (λ_g − λ_k) = 0,
and writing ∇_μ KL(q_g‖π_0) = c λ_g − b (`family.prior_terms`: c = 1 and b = the prior's natural parameter η_0 for
the diagonal and full families) gives

    λ_g = (b + Σ_k η_k + ρ_s Σ_k λ_k) / (c + ρ_s K),

which for c = 1 is Eq. 54, λ_g = (1 − α) Mean_k λ_k + α Σ_{k=0..K} η_k with α = 1/(1 + ρ_s K).
For the full family this is Eqs. 55–56 and for the diagonal family lines 10–11 of Alg. 1.

Special cases (all checked by tests):
- isotropic family + delta method = federated ADMM (Eqs. 5–7); App. D.1;
- ρ = 1, ρ_s = 0 (α = 1) = PVI, with γ the damping (App. C.3);
- ρ = 1/K, server at the prior, quadratic losses, full family: exact posterior after one round (Prop. D.1).

ρ_s (`server_rho`) defaults to ρ as in the paper; ρ_s = 0 drops the server's proximal term (AMA / PVI form).

Two servers compute this closed form. By default (`incremental=False`) the server keeps every client's last term
r_k = η_k + ρ_s λ_k and sums them all each round: its memory and its work per round grow with the number of clients
that ever replied, participants or not. With `incremental=True` it keeps only their running sum Σ_k r_k (in
float64) and how many clients it holds: a client replies with the change of its term, r_k − r_k^old (its old term
recomputed from its state, with the same operations that made it), and whether it is new, so the server's memory is
two vectors and its work per round follows the participants (for 10⁴–10⁵ clients with a few per round). The sum then
adds the same terms in another order, so the numbers equal the default's up to rounding, not bit for bit.

Under partial participation both servers hold every client's last λ_k, most of them computed many rounds ago against
an older q_g: with 1 % of 10⁴ clients a round, the round's participants are a few per cent of the clients the mean
(1 − α) Mean_k λ_k averages, so q_g moves by that fraction of their progress (docs/guides/many-clients.md).
`proximal="participants"` (`RoundProximal`) keeps the server's proximal term over the round's participants
P only, ρ_s Σ_{k∈P} KL(q_g ‖ q_k), and the duals of every client: the closed form becomes

    λ_g = (b + Σ_k η_k + ρ_s Σ_{k∈P} λ_k) / (c + ρ_s |P|),

the absent clients counted as at consensus (q_k = q_g, no proximal pull), as FedDyn's server averages the round's
models and subtracts the dual sum of all clients (Acar et al., 2021). With every client in every round it is Eq. 54.
A client replies with d_k = λ_k − λ_g; the server needs no client's term, only the dual sum, which the natural dual
step moves by γ Σ_{k∈P} d_k, so its memory is two vectors and its work per round follows the participants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms.base import (
    Algorithm,
    DivergenceError,
    LocalStep,
    Message,
    PartlyInvalidRemoval,
    ServerInfo,
    SolveInfo,
    merge_replies,
    pack,
    unpack,
)
from bayesadmm.families import GaussianFamily, Posterior
from bayesadmm.families import natural as nat
from bayesadmm.solvers.von import VariationalProblem
from bayesadmm.trees import register

Natural = tuple[Tensor, ...]


@register
class ServerState(NamedTuple):
    natural: Natural  # λ_g
    # η_k + ρ_s λ_k of every client that has replied (its reply, `client_contribution`): all the server update reads
    # of a client (it sums them), kept so that absent clients still count under partial participation. 2 vectors per
    # client for the diagonal family.
    replies: Mapping[int, Natural]
    round: int = 0  # completed rounds (local solvers may schedule on it, e.g. cosine lr)


@register
class RunningServerState(NamedTuple):
    natural: Natural  # λ_g
    total: Natural  # Σ_k (η_k + ρ_s λ_k) over the clients that have replied, in float64
    clients: float  # how many clients that is (K of the closed form; under client-level DP its expectation)
    round: int = 0


@register
class RoundServerState(NamedTuple):
    natural: Natural  # λ_g
    duals: Natural  # Σ_k η_k over the clients that have replied, in float64
    round: int = 0


@register
class ReleasedInfo(NamedTuple):
    """A client-level-DP round of the running-sum server (`RunningSums.released`)."""

    clients: float  # the clients the sum counts: their expected number (public), so fractional
    floored: float  # the fraction of the server's coordinates the noise took below precision δ (`released`)


@register
class ClientState(NamedTuple):
    dual: Natural  # η_k
    natural: Natural | None  # λ_k from the last local solve (None before the first)


def natural_dual_step(family, dual: Natural, lam_k: Natural, lam_g: Natural, gamma: float) -> Natural:
    """Eq. 16: η_k ← η_k + γ (λ_k − λ_g). After an exact client solve with γ = ρ this is −∇_μ L_k(μ_k) (App. C.1)."""
    return nat.add_scaled(dual, gamma, nat.sub(lam_k, lam_g))


def client_contribution(lam_k: Natural, eta_k: Natural, server_rho: float) -> Natural:
    """η_k + ρ_s λ_k: client k's term in the server's sum (Eq. 54), all the server needs of it."""
    return nat.add_scaled(eta_k, server_rho, lam_k)


def server_natural(family, delta: float, server_rho: float, contributions: Mapping[int, Natural]) -> Natural:
    """The closed-form server update (Eq. 54 generalised, see the module docstring) from the clients'
    η_k + ρ_s λ_k (`client_contribution`): λ_g = (b + Σ_k (η_k + ρ_s λ_k)) / (c + ρ_s K)."""
    total = nat.total(list(contributions.values()))
    c, b = family.prior_terms(delta, dtype=total[0].dtype, device=total[0].device)
    return nat.scale(nat.add(b, total), 1.0 / (c + server_rho * len(contributions)))


def unlearned_server(family, delta: float, server_rho: float, server: ServerState, client_id: int, dual: Natural):
    """The server state without client `client_id`, whose dual is η_j (`dual`, from its client state).

    At a fixed point λ_k = λ_g for every k (the dual steps stop), so the server update (module docstring) reads
    (c + ρ_s K) λ_g = b + Σ_k η_k + ρ_s K λ_g, i.e. c λ_g = b + Σ_k η_k: q_g is the prior times one dual term
    exp⟨η_k, T(θ)⟩ per client (η_k = −∇_μ L_k, App. C.1). Without client j, with the other duals as they are,

        λ_g' = λ_g − η_j / c        (c = 1 for the diagonal and full families; δ/s for the isotropic one).

    The server's own record of j, r_j = η_j + ρ_s λ_j, gives η_j only where λ_j = λ_g exactly, hence the client's
    state. For a conjugate model in the full family (and the diagonal one where the posterior is diagonal) η_k is the
    likelihood's natural parameter, independent of q_g, so λ_g' is the exact posterior without j and the other
    clients are already at the fixed point of the federation without j. Otherwise (isotropic family, networks) η_k is
    a linearisation at the old q_g and λ_g' an approximation from which training continues. Far from a fixed point
    the duals hold little (IVON-ADMM's presets take γ ≪ ρ) and q_g is mostly the average of the local posteriors
    (Eq. 54's (1 − α) Mean_k λ_k), so removing η_j removes little of client j; removing r_j − ρ_s λ_g instead
    (the server state alone) agrees at a fixed point but away from one subtracts j's whole curvature from an average
    that does not hold it, and can leave no valid Gaussian. The other clients' records move with λ_g
    (λ_k → λ_k + λ_g' − λ_g, duals kept), so at a fixed point λ_g' is what the server update gives from them (away
    from one it gives λ_g' − ρ_s(λ_j − λ_g)/(c + ρ_s(K − 1)), until their next replies replace them); their client
    states are kept. Where λ_g' is no valid Gaussian on some weights of a diagonal family (η_j's precision above
    λ_g's there), those weights keep λ_g's value and the state is handed back inside a `PartlyInvalidRemoval`
    (`_without_dual`, `bayesadmm.unlearn(..., keep_invalid=True)`)."""
    if client_id not in server.replies:
        raise ValueError(f"client {client_id} never replied to the server: it has no term to remove")
    lam_g, kept = _without_dual(family, delta, server.natural, client_id, dual)
    shift = nat.scale(nat.sub(lam_g, server.natural), server_rho)
    replies = {k: nat.add(r, shift) for k, r in server.replies.items() if k != client_id}
    return _removed(ServerState(lam_g, replies, server.round), client_id, kept, lam_g)


def _without_dual(family, delta: float, lam_g: Natural, client_id: int, dual: Natural) -> tuple[Natural, int]:
    """λ_g − η_j / c (`unlearned_server`) and 0 where that is a valid Gaussian. Where it is not, a diagonal family's
    coordinates left without a positive precision keep λ_g's value (`kept_where_invalid`), and their number is
    returned for `_removed` to report; the other families refuse (a ValueError)."""
    c, _ = family.prior_terms(delta, dtype=lam_g[0].dtype, device=lam_g[0].device)
    lam = nat.add_scaled(lam_g, -1.0 / c, dual)
    if family.is_valid(lam):
        return lam, 0
    try:
        return family.kept_where_invalid(lam, lam_g)
    except NotImplementedError:
        raise ValueError(
            f"removing client {client_id}'s dual leaves no valid Gaussian (its term outweighs the rest of the "
            "posterior, as can happen far from a fixed point): retrain without the client"
        ) from None


def _removed(state, client_id: int, kept: int, lam_g: Natural):
    """The unlearned server `state`, or a `PartlyInvalidRemoval` holding it where `kept` coordinates keep the
    original's value."""
    if kept:
        total = lam_g[0].numel()
        raise PartlyInvalidRemoval(
            f"removing client {client_id}'s dual leaves {kept} of {total} weights without a positive precision (its "
            "term outweighs the rest of the posterior there, as can happen far from a fixed point)",
            state,
            kept,
            total,
        )
    return state


PROXIMAL = ("all", "participants")  # the clients the server's proximal term is over (module docstring)


def _wide(parts: Natural) -> Natural:
    return tuple(x.to(torch.float64) for x in parts)


def _floored(family, delta: float, lam64: Natural, previous: Natural, name: str) -> tuple[Natural, float]:
    """A client-level-DP server's new λ_g from the float64 closed form `lam64`: where the noise took a precision below
    δ, the `previous` λ_g's mean at precision δ (`family.floored`), in `previous`'s dtype; and the fraction floored.
    A DivergenceError where it is not finite."""
    before = _wide(previous)
    lam64, floored = family.floored(lam64, delta, before[0] / (-2.0 * before[1]))
    lam_g = tuple(x.to(was.dtype) for x, was in zip(lam64, previous, strict=True))
    if not family.is_valid(lam_g):
        raise DivergenceError(f"{name}: the server's natural parameter is not finite")
    return lam_g, floored


def check_proximal(proximal: str, name: str) -> None:
    """A ValueError unless `proximal` is one of `PROXIMAL`."""
    if proximal not in PROXIMAL:
        raise ValueError(f"{name}: proximal must be one of {', '.join(PROXIMAL)}, got {proximal!r}")


class RunningSums:
    """The server of `make(incremental=True)`: the running sum of the clients' terms and their number, and the
    clients' replies of its change (module docstring). Its work per round is over the replies only."""

    def __init__(self, family: GaussianFamily, delta: float, server_rho: float, name: str):
        self.family, self.delta, self.server_rho, self.name = family, delta, server_rho, name

    def init_server(self, theta0: Tensor) -> RunningServerState:
        lam = self.family.initial_natural(theta0, self.delta)
        return RunningServerState(lam, nat.zeros_like(_wide(lam)), 0, 0)

    def reply(self, state: ClientState, dual: Natural, lam_k: Natural) -> Message:
        """The change of the client's term r_k = η_k + ρ_s λ_k (in float64, so that the server's sum does not drift)
        and whether the server has counted the client yet (its first reply)."""
        new = _wide(client_contribution(lam_k, dual, self.server_rho))
        first = state.natural is None
        if state.natural is not None:  # the old term, as `client_contribution` made it last time
            new = nat.sub(new, _wide(client_contribution(state.natural, state.dual, self.server_rho)))
        return {**pack("change", new), "first": torch.tensor(float(first), dtype=torch.float64)}

    def server_update(self, server: RunningServerState, replies: Mapping[int, Message]):
        total, count = server.total, server.clients
        if replies:
            total = nat.add(total, nat.total([unpack("change", replies[k]) for k in sorted(replies)]))
            count += sum(int(replies[k]["first"]) for k in replies)
        if count == 0:
            raise ValueError(f"{self.name}: server_update needs at least one client's reply")
        c, b = self.family.prior_terms(self.delta, dtype=torch.float64, device=total[0].device)
        lam64 = nat.scale(nat.add(b, total), 1.0 / (c + self.server_rho * count))
        lam_g = tuple(x.to(old.dtype) for x, old in zip(lam64, server.natural, strict=True))
        if not self.family.is_valid(lam_g):
            raise DivergenceError(f"{self.name}: the server's natural parameter is no longer a valid Gaussian")
        return RunningServerState(lam_g, total, count, server.round + 1), ServerInfo(int(count))

    def released(self, server: RunningServerState, released: Message, new: float):
        """The server update of client-level DP (`privacy.client_level`, `ClientUpdate.running`): the running sum
        moves by the released change (the noised sum of the participants' clipped updates plus ρ_s λ_g for each new
        client, in the reply's layout), the count of clients by `new`, their expected number (public: the flags of
        first replies would tell who took part), and λ_g is the closed form of that sum, except where the noise took
        a precision below δ: there q_g keeps its previous mean and takes the prior's precision δ
        (`DiagonalGaussian.floored`). Its mean there would be λ₁ / s, the noise over a precision that is small by
        noise. The floor is post-processing of the released sums and of the previous (public) q_g, so the guarantee
        holds; it keeps q_g a valid Gaussian, at least as precise as the prior, where the noise alone would leave
        none."""
        change = tuple(x.to(torch.float64) for x in unpack("change", released))
        total, count = nat.add(server.total, change), server.clients + new
        c, b = self.family.prior_terms(self.delta, dtype=torch.float64, device=total[0].device)
        lam64 = nat.scale(nat.add(b, total), 1.0 / (c + self.server_rho * count))
        lam_g, floored = _floored(self.family, self.delta, lam64, server.natural, self.name)
        return RunningServerState(lam_g, total, count, server.round + 1), ReleasedInfo(count, floored)

    def unlearn(self, server: RunningServerState, client_id: int, state: ClientState) -> RunningServerState:
        """`unlearned_server` on the running sum: λ_g' = λ_g − η_j / c, and client j's term (from its state) leaves
        the sum. The other terms stay as their clients last sent them: a client's next reply is the change from its
        own record of its term, so a shift of its term here (the default server moves its records by ρ_s (λ_g' −
        λ_g)) would stay in the sum for good and pull every later λ_g off the fixed point without client j."""
        if state.natural is None:
            raise ValueError(f"client {client_id} never replied to the server: it has no term to remove")
        lam_g, kept = _without_dual(self.family, self.delta, server.natural, client_id, state.dual)
        total = nat.sub(server.total, _wide(client_contribution(state.natural, state.dual, self.server_rho)))
        return _removed(RunningServerState(lam_g, total, server.clients - 1, server.round), client_id, kept, lam_g)


class RoundProximal:
    """The server of `make(proximal="participants")` (module docstring): λ_g from the dual sum and the round's
    replies d_k = λ_k − λ_g. It holds λ_g and Σ_k η_k; the dual step must be the natural one (η_k moves by γ d_k)."""

    def __init__(self, family: GaussianFamily, delta: float, server_rho: float, gamma: float, name: str):
        self.family, self.delta, self.server_rho, self.gamma, self.name = family, delta, server_rho, gamma, name

    def init_server(self, theta0: Tensor) -> RoundServerState:
        lam = self.family.initial_natural(theta0, self.delta)
        return RoundServerState(lam, nat.zeros_like(_wide(lam)), 0)

    def reply(self, lam_k: Natural, lam_g: Natural) -> Message:
        """d_k = λ_k − λ_g, the client's step from the broadcast (its dual moved by γ d_k)."""
        return pack("step", nat.sub(lam_k, lam_g))

    def server_update(self, server: RoundServerState, replies: Mapping[int, Message]):
        if not replies:
            raise ValueError(f"{self.name}: server_update needs at least one client's reply")
        steps = nat.total([_wide(unpack("step", replies[k])) for k in sorted(replies)])
        lam64, duals = self._closed_form(server, steps, len(replies))
        lam_g = tuple(x.to(old.dtype) for x, old in zip(lam64, server.natural, strict=True))
        if not self.family.is_valid(lam_g):
            raise DivergenceError(f"{self.name}: the server's natural parameter is no longer a valid Gaussian")
        return RoundServerState(lam_g, duals, server.round + 1), ServerInfo(len(replies))

    def released(self, server: RoundServerState, released: Message, participants: float):
        """The server update of client-level DP (`privacy.client_level`, `ClientUpdate.running`): the closed form
        from the released Σ_{k∈P} clip(d_k) + z, with `participants` the expected number of participants (public;
        the number drawn would tell who took part); where the noise took a precision below δ, q_g keeps its
        previous mean at precision δ, as `RunningSums.released` does."""
        steps = tuple(x.to(torch.float64) for x in unpack("step", released))
        lam64, duals = self._closed_form(server, steps, participants)
        lam_g, floored = _floored(self.family, self.delta, lam64, server.natural, self.name)
        return RoundServerState(lam_g, duals, server.round + 1), ReleasedInfo(participants, floored)

    def _closed_form(self, server: RoundServerState, steps: Natural, participants: float) -> tuple[Natural, Natural]:
        """λ_g = (b + Σ_k η_k + ρ_s Σ_P λ_k) / (c + ρ_s |P|) with Σ_P λ_k = Σ_P d_k + |P| λ_g and the dual sum
        moved by γ Σ_P d_k; both in float64."""
        duals = nat.add_scaled(server.duals, self.gamma, steps)
        proximal = nat.add(steps, nat.scale(_wide(server.natural), participants))
        c, b = self.family.prior_terms(self.delta, dtype=torch.float64, device=steps[0].device)
        numerator = nat.add(nat.add(b, duals), nat.scale(proximal, self.server_rho))
        return nat.scale(numerator, 1.0 / (c + self.server_rho * participants)), duals

    def unlearn(self, server: RoundServerState, client_id: int, state: ClientState) -> RoundServerState:
        """`unlearned_server` for this server: λ_g' = λ_g − η_j / c, and η_j leaves the dual sum."""
        if state.natural is None:
            raise ValueError(f"client {client_id} never replied to the server: it has no term to remove")
        lam_g, kept = _without_dual(self.family, self.delta, server.natural, client_id, state.dual)
        unlearned = RoundServerState(lam_g, nat.sub(server.duals, _wide(state.dual)), server.round)
        return _removed(unlearned, client_id, kept, lam_g)


def make(
    family: GaussianFamily,
    solver,
    rho: float,
    delta: float,
    gamma: float | None = None,
    server_rho: float | None = None,
    dual_step: Callable = natural_dual_step,
    name: str = "bayes-admm",
    incremental: bool = False,
    proximal: str = "all",
) -> Algorithm:
    """BayesADMM over `family` with local `solver` (ExactQuadratic, VON, IVONSolver, ...: a `LocalSolver` of the
    client's `VariationalProblem`, i.e. `solver.solve_problem(problem, loss, generator) -> SolveResult`).

    rho: ρ > 0, client proximal weight (the KL term in Eq. 15). delta: prior precision δ.
    gamma: dual step γ (default ρ). server_rho: ρ_s ≥ 0 in the server problem (default ρ).
    dual_step: Eq. 16 by default; BregmanADMM swaps in the expectation-parameter step.
    incremental: keep the running sum of the clients' terms instead of each client's term (module docstring).
    proximal: "all" (Eq. 54: the server's proximal term over every client's last q_k) or "participants" (over the
    round's participants, `RoundProximal`; its server is as small as the running sum's, whatever `incremental`).
    """
    gamma = rho if gamma is None else gamma
    server_rho = rho if server_rho is None else server_rho
    if not (0 < rho < math.inf and 0 < gamma < math.inf and 0 <= server_rho < math.inf and 0 < delta < math.inf):
        raise ValueError(
            f"need finite rho > 0, gamma > 0, server_rho >= 0, delta > 0; got rho={rho}, gamma={gamma}, "
            f"server_rho={server_rho}, delta={delta}"
        )
    check_proximal(proximal, name)
    if proximal == "participants" and dual_step is not natural_dual_step:
        raise ValueError(
            f"{name}: proximal='participants' keeps the dual sum from the clients' steps, which only the natural "
            "dual step moves by γ (λ_k − λ_g); use proximal='all'"
        )

    def init_server(theta0: Tensor) -> ServerState:
        # mean θ_0 and the prior's precision δ (the isotropic family keeps its own)
        return ServerState(family.initial_natural(theta0, delta), {}, 0)

    def init_client(server: ServerState, client_id: int) -> ClientState:
        return ClientState(nat.zeros_like(server.natural), None)

    def broadcast(server: ServerState) -> Message:
        return {**pack("lam", server.natural), "round": torch.tensor(server.round + 1)}

    def prepare(state: ClientState, message: Message, loss) -> VariationalProblem:
        return VariationalProblem(family, unpack("lam", message), state.dual, rho, int(message["round"]))

    def finish(state: ClientState, message: Message, loss, problem: VariationalProblem, result):
        dual = dual_step(family, state.dual, result.natural, problem.lam_g, gamma)
        if round_server is not None:
            reply = round_server.reply(result.natural, problem.lam_g)
        else:
            reply = (sums.reply if sums is not None else reply_of)(state, dual, result.natural)
        return ClientState(dual, result.natural), reply, SolveInfo(result.iterations, result.converged)

    def reply_of(state: ClientState, dual: Natural, lam_k: Natural) -> Message:
        # The reply is the client's term of the server's sum, not λ_k and η_k apart: half the numbers to send, and
        # the arithmetic is done by the clients (in parallel) rather than by the server.
        return pack("contribution", client_contribution(lam_k, dual, server_rho))

    def server_update(server: ServerState, replies: Mapping[int, Message]):
        last = merge_replies(server.replies, {k: unpack("contribution", r) for k, r in replies.items()})
        lam_g = server_natural(family, delta, server_rho, last)
        if not family.is_valid(lam_g):
            raise DivergenceError(f"{name}: the server's natural parameter is no longer a valid Gaussian")
        return ServerState(lam_g, last, server.round + 1), ServerInfo(len(last))

    def posterior(server: ServerState) -> Posterior:
        return Posterior(family, server.natural)

    def personal(server: ServerState, state: ClientState) -> Posterior:
        # q_k = family(λ_k) of the client's last local solve (Eq. 15); q_g before its first
        return posterior(server) if state.natural is None else Posterior(family, state.natural)

    def unlearn(server: ServerState, client_id: int, state: ClientState) -> ServerState:
        return unlearned_server(family, delta, server_rho, server, client_id, state.dual)

    # the same closed form from the running sum, where asked (module docstring)
    sums = RunningSums(family, delta, server_rho, name) if incremental else None
    round_server = RoundProximal(family, delta, server_rho, gamma, name) if proximal == "participants" else None
    server: tuple[Callable, Callable, Callable] = (init_server, server_update, unlearn)
    if round_server is not None:
        server = (round_server.init_server, round_server.server_update, round_server.unlearn)
    elif sums is not None:
        server = (sums.init_server, sums.server_update, sums.unlearn)

    # Only the natural-parameter dual step keeps η_k = −∇_μ L_k (App. C.1), the client's term of the posterior;
    # BregmanADMM's expectation-parameter step loses it (App. C.2, and it need not reach consensus), so it refuses.
    local = LocalStep(solver, prepare, finish)
    return Algorithm.from_local(
        name, server[0], init_client, broadcast, local, server[1], posterior,
        personal=personal, unlearn=server[2] if dual_step is natural_dual_step else None,
    )  # fmt: skip
