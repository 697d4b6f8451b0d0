"""FedPA as the Remark of Sec. 2.1 of Guo et al. (ICLR 2023) defines it: EP with a uniform cavity.

Each client approximates its own posterior, λ̂_k = inference(family, data_k, 0) ≈ proj[p_k], and the server
multiplies the latest approximations with the prior:

    q_g = q_0 Π_k q̂_k,   λ_g = λ_0 + Σ_k λ̂_k

The Remark's one-shot product, repeated every round; not the original FedPA's server-optimizer step on
Σ̂_k⁻¹(θ_g − μ̂_k) (Al-Shedivat et al. 2021). From the uniform start it equals round 1 of undamped FedEP (footnote 2).

Nothing regularises the local problem towards the global model, so a search (an optimizer or an SG-MCMC chain on a
network) STARTS at the global mean, θ_0 in round 1: a network cannot train from the uniform cavity's mean 0, and it is
where FedPA's clients start (Al-Shedivat et al. 2021). The target stays p_k; inference that does not search
(`ExactGaussian`) ignores the start.

The method `fedpa` runs on networks with the diagonal family and the inference chosen by name (default "mcmc",
FedPA's SG-MCMC; `ep_common.TiltedSettings`): with the scaled identity the global mean is then the n_k-weighted
average of the local means, with M, V or L a precision-weighted one.
"""

from __future__ import annotations

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
    NoInfo,
    ServerInfo,
    merge_replies,
    pack,
    unpack,
)
from bayesadmm.algorithms.ep_common import TiltedSettings, check_family, prior_natural, tilted_inference
from bayesadmm.algorithms.fedep import EXAMPLE
from bayesadmm.algorithms.spec import Context, MethodSpec
from bayesadmm.algorithms.spec import register as register_method
from bayesadmm.families import DiagonalGaussian, Natural, Posterior
from bayesadmm.families import natural as nat
from bayesadmm.solvers.ep_inference import TiltedInference, TiltedProblem, TiltedSolver
from bayesadmm.trees import register


@register
class ServerState(NamedTuple):
    natural: Natural  # λ_g = λ_0 + Σ_k λ̂_k
    replies: Mapping[int, Message]  # last local approximation of every client
    round: int = 0
    anchor: Tensor | None = None  # θ_0, where local searches start before the first server update


@register
class ClientState(NamedTuple):
    pass


def make(family, inference: TiltedInference, prior_precision: float | None = None, name: str = "fedpa") -> Algorithm:
    """FedPA over `family` with local `inference`, under the prior N(0, δ_0⁻¹ I) (prior_precision; None: uniform).

    The server keeps each client's last approximation (`merge_replies`), so absent clients still count.
    """
    check_family(family)

    def init_server(theta0: Tensor) -> ServerState:
        return ServerState(prior_natural(family, prior_precision, theta0), {}, 0, theta0.clone())

    def init_client(server: ServerState, client_id: int) -> ClientState:
        return ClientState()

    def broadcast(server: ServerState) -> Message:
        if server.round == 0:
            if server.anchor is None:
                raise ValueError(f"{name}: the first broadcast needs the server's θ_0 (init_server)")
            start = server.anchor
        else:
            start = family.to_moments(server.natural)[0]
        return {**pack("lam", server.natural), "round": torch.tensor(server.round + 1), "start": start}

    def prepare(state: ClientState, message: Message, data) -> TiltedProblem:
        # the uniform cavity, and the search starting at the global mean
        return TiltedProblem(family, nat.zeros_like(unpack("lam", message)), message["start"])

    def finish(
        state: ClientState, message: Message, data, problem: TiltedProblem, approximation: Natural
    ) -> tuple[ClientState, Message, NoInfo]:
        return state, pack("local", approximation), NoInfo()

    def server_update(server: ServerState, replies: Mapping[int, Message]) -> tuple[ServerState, ServerInfo]:
        last = merge_replies(server.replies, replies)
        lam0 = prior_natural(family, prior_precision, server.natural[0])
        lam_g = nat.add(lam0, nat.total([unpack("local", r) for r in last.values()]))
        if not family.is_valid(lam_g):
            raise DivergenceError(f"{name}: the product of the local approximations is not a valid Gaussian")
        return ServerState(lam_g, last, server.round + 1, server.anchor), ServerInfo(
            len(last)
        )  # the absent clients too

    def posterior(server: ServerState) -> Posterior:
        return Posterior(family, server.natural)

    local = LocalStep(TiltedSolver(inference), prepare, finish)
    return Algorithm.from_local(name, init_server, init_client, broadcast, local, server_update, posterior)


@dataclass(frozen=True)
class Hparams(TiltedSettings):
    """FedPA's hyperparameters on networks: the tilted inference (`ep_common.TiltedSettings`; here "mcmc" by
    default) and the prior precision δ_0 of N(0, δ_0⁻¹ I) (None: uniform). alpha is the per-example site precision
    of I, the floor of L and V, and the norm M's precision is rescaled to."""

    inference: str = "mcmc"
    prior_precision: float | None = None


def build(hparams: Hparams, context: Context) -> Algorithm:
    local = tilted_inference(hparams, "fedpa", context.likelihood)
    return make(DiagonalGaussian(context.dim), local, prior_precision=hparams.prior_precision)


SPEC = register_method(
    MethodSpec(
        name="fedpa",
        hparams=Hparams,
        build=build,
        summary="FedPA: federated posterior averaging",
        # SG-MCMC keeps one sample per epoch: two samples give no usable covariance
        example={**EXAMPLE, "epochs": 10},
    )
)
