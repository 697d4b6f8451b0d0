"""FedEP: federated expectation propagation with stateful clients (Guo et al., ICLR 2023, Alg. 1, Alg. 4 client,
Alg. 3 server). Written from the paper; "[CODE]" marks choices taken from facts about the authors' public code
where the paper is silent or garbled.

The posterior p(θ|D) ∝ p_0(θ) Π_k p_k(θ) is approximated by q_g ∝ q_0 Π_k q_k with Gaussian sites q_k in a
`family` (DiagonalGaussian or FullGaussian), stored as natural tuples λ (`ep_common`). One round, with damping δ
(default 1/K, [CODE]):

    cavity   (2):  λ_{−k} = λ_g − λ_k
    tilted   (3):  λ̂_k   = inference(family, data_k, λ_{−k}, generator)    (≈ proj[p_k q_{−k}])
    delta    (4):  Δ_k   = λ̂_k − λ_g                                        (Δq_k ∝ q̂^{\\k} / q_g)
    client   (5):  λ_k  ← λ_k + δ · ClientOptim(Δ_k)
    server (Alg.3): λ_g ← λ_g + δ · ServerOptim(Σ_{k∈𝒦} Δ_k)

With identity optimizers this is damped EP, q_k^new ∝ q_k (Δq_k)^δ and q_g^new ∝ q_g Π_k (Δq_k)^δ (App. A.1), and
the invariant λ_g = λ_0 + Σ_k λ_k holds after every round with full participation. From the uniform start, round 1
of undamped FedEP is FedPA (footnote 2; `fedpa`). `fedsep` is the stateless variant (Sec. 2.2.4).

The tilted inference is a `solvers.ep_inference.TiltedInference`: `ExactGaussian` for Gaussian likelihoods (the toy
of Sec. 3.1), or one of the network methods I, L, M, V of Sec. 2.2.2.

The method `fedep` (and `fedsep`, which shares its hyperparameters and `build_sites`) runs on networks with the
diagonal family and the inference chosen by name (`ep_common.TiltedSettings`). Its sites start at N(θ_0, (α n_k I)⁻¹)
around the network's initialisation (`init_site_precision`, default α): the FedEP code's hand-over from a FedAvg
burn-in, which gives the first cavity a mean to train from (a network cannot train from the improper uniform cavity's
mean 0). Local training starts at the cavity mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from bayesadmm.algorithms.base import Algorithm, LocalStep, Message, NoInfo, pack, unpack
from bayesadmm.algorithms.ep_common import (
    IDENTITY,
    ServerState,
    TiltedSettings,
    clip_delta,
    damped_server,
    site_natural,
    tilted_inference,
)
from bayesadmm.algorithms.spec import Context, MethodSpec
from bayesadmm.algorithms.spec import register as register_method
from bayesadmm.families import DiagonalGaussian, Natural, Posterior
from bayesadmm.families import natural as nat
from bayesadmm.solvers.ep_inference import TiltedInference, TiltedProblem, TiltedSolver
from bayesadmm.solvers.natural_optimizers import Identity, NaturalOptimizer
from bayesadmm.trees import register


@register
class ClientState(NamedTuple):
    site: Natural  # λ_k
    optimizer: Any  # ClientOptim state
    tilted: Natural | None = None  # λ̂_k of the last tilted inference (3): the client's personal posterior


def make(
    family,
    inference: TiltedInference,
    num_clients: int | None = None,
    damping: float | None = None,
    prior_precision: float | None = None,
    client_sizes: Sequence[int] | None = None,
    server_optimizer: NaturalOptimizer = IDENTITY,
    client_optimizer: NaturalOptimizer = IDENTITY,
    init_site_precision: float = 0.0,
    clip_norm: float | None = None,
    name: str = "fedep",
) -> Algorithm:
    """FedEP over `family` with tilted `inference`.

    num_clients: K (default len(client_sizes)). damping: δ in (0, 1]; default 1/K ([CODE]: 1/clients per round);
        1.0 = undamped parallel EP.
    prior_precision: δ_0 of the prior N(0, δ_0⁻¹ I); None = improper uniform prior (q_g starts at the zero tuple).
    client_sizes: n_k, for the site initialisation (default n_k = 1).
    server_optimizer / client_optimizer: Identity() (plain damping), Momentum(lr, beta) or Adam(lr, ...) of
        `solvers.natural_optimizers`, on the natural tuple (Sec. 2.2.3).
    init_site_precision: α ≥ 0; sites start at N(θ_0, (α n_k I)⁻¹), the [CODE] switch from a FedAvg burn-in
        (θ_0 = its model); 0 = uniform sites.
    clip_norm: clip each client's Δ_k by its global L2 norm before damping ([CODE]); None = no clipping.
    """
    server = damped_server(
        family, num_clients, client_sizes, damping, prior_precision, init_site_precision, server_optimizer, name
    )
    size = (lambda k: float(client_sizes[k])) if client_sizes is not None else (lambda k: 1.0)

    def init_client(server_state: ServerState, client_id: int) -> ClientState:
        if init_site_precision > 0:
            site = site_natural(family, server_state.anchor, init_site_precision * size(client_id))
        else:
            site = nat.zeros_like(server_state.natural)
        return ClientState(site, client_optimizer.init(site))

    def prepare(state: ClientState, message: Message, data) -> TiltedProblem:
        return TiltedProblem(family, nat.sub(unpack("lam", message), state.site))  # (2)

    # (3): the tilted inference is the local solve
    def finish(
        state: ClientState, message: Message, data, problem: TiltedProblem, tilted: Natural
    ) -> tuple[ClientState, Message, NoInfo]:
        delta = clip_delta(nat.sub(tilted, unpack("lam", message)), clip_norm)  # (4)
        step, optimizer = client_optimizer.step(delta, state.optimizer)
        site = nat.add(state.site, nat.scale(step, server.damping))  # (5)
        return ClientState(site, optimizer, tilted), pack("delta", delta), NoInfo()

    def personal(server_state: ServerState, state: ClientState) -> Posterior:
        # q̂_k ≈ proj[p_k q_{−k}]: the cavity (q_g without the client's site) times the client's own likelihood, as
        # the client's last tilted inference (3) found it; q_g before its first
        return server.posterior(server_state) if state.tilted is None else Posterior(family, state.tilted)

    def unlearn(server_state: ServerState, client_id: int, state: ClientState) -> ServerState:
        """q_g / q_j: with identity optimizers λ_g = λ_0 + Σ_k λ_k (initial sites included) after every round, so
        the server without client j is λ_g − λ_j, the EP state of the other clients with their sites as they are
        (exact for a conjugate model with exact tilted inference once the sites have converged)."""
        if not (isinstance(server_optimizer, Identity) and isinstance(client_optimizer, Identity)):
            raise ValueError(
                f"{name} with a momentum or Adam optimizer keeps no λ_g = λ_0 + Σ_k λ_k, so client {client_id}'s "
                "site cannot be divided out: use the identity optimizers, or retrain without the client"
            )
        if nat.allclose(state.site, init_client(server_state, client_id).site, rtol=0.0, atol=0.0):
            raise ValueError(f"client {client_id}'s site is its initial one (it never took part): nothing to remove")
        lam_g = nat.sub(server_state.natural, state.site)
        if not family.is_valid(lam_g):
            raise ValueError(f"removing client {client_id}'s site leaves no valid Gaussian: retrain without the client")
        return server_state._replace(natural=lam_g)

    local = LocalStep(TiltedSolver(inference), prepare, finish)
    return Algorithm.from_local(
        name,
        server.init,
        init_client,
        server.broadcast,
        local,
        server.update,
        server.posterior,
        personal=personal,
        unlearn=unlearn,
    )


@dataclass(frozen=True)
class Hparams(TiltedSettings):
    """FedEP's (and FedSEP's) hyperparameters on networks: the tilted inference (`ep_common.TiltedSettings`), the
    damping δ (None: 1/K), the prior precision δ_0 (None: uniform) and the initial sites' α (None: alpha)."""

    damping: float | None = None
    prior_precision: float | None = None
    init_site_precision: float | None = None


def build_sites(factory: Callable[..., Algorithm], owner: str, hparams: Hparams, context: Context) -> Algorithm:
    """FedEP (`factory` = `make`) or FedSEP (`fedsep.make`) with the diagonal family, the inference `hparams` name
    (checked against the context's likelihood), the clients' sizes n_k by client id and initial sites of
    precision α n_k by default."""
    local = tilted_inference(hparams, owner, context.likelihood)
    sizes = context.client_sizes
    return factory(
        DiagonalGaussian(context.dim),
        local,
        name=owner,
        num_clients=context.num_clients,
        damping=hparams.damping,
        prior_precision=hparams.prior_precision,
        # indexed by client id; 0 for an id the run leaves out (`exclude_client`), which counts in no sum
        client_sizes=[sizes.get(k, 0) for k in range(max(sizes) + 1)],
        init_site_precision=hparams.alpha if hparams.init_site_precision is None else hparams.init_site_precision,
    )


def build(hparams: Hparams, context: Context) -> Algorithm:
    return build_sites(make, "fedep", hparams, context)


# toy values: a 3-class problem of 4 features
EXAMPLE = {"lr": 0.05, "epochs": 2, "batch_size": 8, "alpha": 0.01}

SPEC = register_method(
    MethodSpec(
        name="fedep",
        hparams=Hparams,
        build=build,
        summary="FedEP: Gaussian expectation propagation, stateful clients",
        example={**EXAMPLE, "damping": 0.5},
    )
)
