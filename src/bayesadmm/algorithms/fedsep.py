"""FedSEP: FedEP with stateless clients, by stochastic EP (Guo et al., ICLR 2023, Sec. 2.2.4; Li et al. 2015).

One shared factor stands for an average client, q_g ∝ q_0 q̄^K, so a client keeps no site: Alg. 4 without step 5,
with the cavity that removes client k's share n_k/N of the likelihood part q_g/q_0 and keeps the prior q_0:

    cavity:  q_{−k} = q_g (q_g/q_0)^{−n_k/N},  i.e.  λ_{−k} = λ_g − (n_k/N)(λ_g − λ_0)

n_k/N from `client_sizes` (default 1/K). The printed formula q_g/q_k is the stateful one, garbled; with equal sizes
this is q_g/q̄ for the average factor q̄ = (q_g/q_0)^{1/K}, and with the uniform prior (λ_0 = 0) it is the authors'
code's q_g^{1 − n_k/N} ([CODE]). As the shares sum to 1, exact tilted inference in the full family, λ̂_k = λ_{−k} + λ_k
with λ_k the natural parameters of the likelihood p_k, gives Σ_k Δ_k = λ_0 + Σ_k λ_k − λ_g: the fixed point is the
exact posterior, prior included. Tilted inference, delta and the damped server are FedEP's (`fedep`,
`ep_common.DampedServer`). The method `fedsep` takes FedEP's hyperparameters and is built as FedEP is
(`fedep.build_sites`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from bayesadmm.algorithms.base import Algorithm, LocalStep, Message, NoInfo, pack, unpack
from bayesadmm.algorithms.ep_common import IDENTITY, ServerState, clip_delta, damped_server, prior_natural
from bayesadmm.algorithms.fedep import EXAMPLE, Hparams, build_sites
from bayesadmm.algorithms.spec import Context, MethodSpec
from bayesadmm.algorithms.spec import register as register_method
from bayesadmm.families import Natural
from bayesadmm.families import natural as nat
from bayesadmm.solvers.ep_inference import TiltedInference, TiltedProblem, TiltedSolver
from bayesadmm.solvers.natural_optimizers import NaturalOptimizer
from bayesadmm.trees import register


@register
class ClientState(NamedTuple):
    fraction: float  # n_k / N, client k's share of the likelihood part of q_g (configuration, not learnt)


def cavity_fractions(num_clients: int | None, client_sizes: Sequence[int] | None) -> Callable[[int], float]:
    """k ↦ n_k / N (client_sizes), else 1/K."""
    if client_sizes is not None:
        total = float(sum(client_sizes))
        return lambda k: client_sizes[k] / total
    if num_clients is None:
        raise ValueError("FedSEP needs num_clients or client_sizes for its cavity exponent n_k / N")
    return lambda k: 1.0 / num_clients


def make(
    family,
    inference: TiltedInference,
    num_clients: int | None = None,
    damping: float | None = None,
    prior_precision: float | None = None,
    client_sizes: Sequence[int] | None = None,
    server_optimizer: NaturalOptimizer = IDENTITY,
    init_site_precision: float = 0.0,
    clip_norm: float | None = None,
    name: str = "fedsep",
) -> Algorithm:
    """FedSEP over `family` with tilted `inference`; the arguments are `fedep.make`'s (there is no client optimizer:
    there is no client state). client_sizes: n_k, for the cavity exponent n_k/N and the initial global precision
    α Σ_k n_k (`init_site_precision` = α)."""
    server = damped_server(
        family, num_clients, client_sizes, damping, prior_precision, init_site_precision, server_optimizer, name
    )
    fraction = cavity_fractions(num_clients, client_sizes)

    def init_client(server_state: ServerState, client_id: int) -> ClientState:
        return ClientState(fraction(client_id))

    def prepare(state: ClientState, message: Message, data) -> TiltedProblem:
        lam_g = unpack("lam", message)
        lam_0 = prior_natural(family, prior_precision, lam_g[0])
        return TiltedProblem(family, nat.sub(lam_g, nat.scale(nat.sub(lam_g, lam_0), state.fraction)))

    def finish(
        state: ClientState, message: Message, data, problem: TiltedProblem, tilted: Natural
    ) -> tuple[ClientState, Message, NoInfo]:
        delta = clip_delta(nat.sub(tilted, unpack("lam", message)), clip_norm)
        return state, pack("delta", delta), NoInfo()

    local = LocalStep(TiltedSolver(inference), prepare, finish)
    return Algorithm.from_local(
        name, server.init, init_client, server.broadcast, local, server.update, server.posterior
    )


def build(hparams: Hparams, context: Context) -> Algorithm:
    return build_sites(make, "fedsep", hparams, context)


SPEC = register_method(
    MethodSpec(
        name="fedsep",
        hparams=Hparams,
        build=build,
        summary="FedSEP: stochastic EP for stateless clients",
        example={**EXAMPLE, "damping": 0.5},
    )
)
