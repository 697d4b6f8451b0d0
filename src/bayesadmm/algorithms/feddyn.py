"""FedDyn (Acar et al. 2021, Alg. 1; `fedlap-digest.md` §1.2 [external]) with a local weight decay, in MEAN-loss units.

With K = `num_clients` clients in total, P the clients that replied this round, g_k and h starting at 0:

    client k ∈ P:  θ_k ← argmin_θ  ℓ̄_k(θ) − ⟨g_k, θ⟩ + α/2 ‖θ − θ_g‖² + wd/2 ‖θ‖²
                                     (E epochs of Adam from θ_g, fresh optimizer state; `solvers.adam.LocalAdam`)
                   g_k ← g_k − α (θ_k − θ_g)
    server:        h   ← h − (α/K) Σ_{k∈P} (θ_k − θ_g)
                   θ_g ← (1/|P|) Σ_{k∈P} θ_k − h/α

ℓ̄_k = ℓ_k/N_k is the client's mean loss (Acar et al.'s empirical risk L_k) and g_k plays the role of Acar's
∇L_k(θ_k^{t−1}); it is kept as client state (keyed by client id through the engine, never shared) and updated by
the rule above, not recomputed. wd is the local weight decay the FedLap paper adds (§1.2; not in Acar's theory,
wd = 0 is plain Alg. 1). The proximal term is the SQUARED norm α/2‖·‖², whose gradient α(θ − θ_g) is added to each
minibatch gradient (the authors' code used the un-squared norm, a defect listed in bayesadmm-spec.md §5).

Absent clients follow Acar's algorithm: their g_k do not change, h is updated with the participants' drift but
divided by the TOTAL number of clients K, and θ_g averages the participants only. The server records which clients
have replied (`seen_clients`; no old replies, which it would never read) and rejects more distinct clients than K.

Identities (g_k and h start at 0; all checked by tests):
- g_k = −α Σ_{rounds r in which k took part} (θ_k^r − θ_g^{r−1});
- h = −(α/K) Σ_r Σ_{k∈P_r} (θ_k^r − θ_g^{r−1}) = (1/K) Σ_k g_k, for any participation pattern;
- after an exact client solve, g_k = ∇ℓ̄_k(θ_k) + wd θ_k (the client problem's stationarity condition).
Fixed point with full participation: g_k stationary ⇒ θ_k = θ_g = θ*, then θ_g = Mean θ_k − h/α forces h = 0, i.e.
Σ_k g_k = 0:

    Σ_k ∇ℓ̄_k(θ*) + K·wd·θ* = 0,    θ* = argmin Σ_k ℓ̄_k(θ) + (K·wd/2) ‖θ‖².

So FedDyn targets the SUM of the mean losses (each client counts equally, whatever its N_k) with an effective global
weight decay K·wd on that sum; with wd = 0 it targets δ = 0, as the FedLap paper says (§1.7, App. D.2). For K
equal-sized clients (N_k = n) this is Σ_k ℓ_k + (N·wd/2)‖θ‖² in summed-loss units, a prior precision δ = N·wd.

Relation to FedADMM: with wd = 0 and full participation, g_k = −v_k and h = −(1/K) Σ_k v_k, so θ_g = Mean(θ_k +
v_k/α): FedDyn is then FedADMM (`admm.make_nn(rho=α, delta=0)`) iterate for iterate (tested). They differ with
wd > 0 and under partial participation (FedDyn's h is divided by K and θ_g averages the participants; ADMM's server
uses every client's last reply). The FedLap paper's "FedADMM is slower and worse than FedDyn" (App. D.2: full
participation, no wd) must therefore come from something else in their implementations, e.g. the per-client α_k.

Units and the FedLap paper's α grid. α here is Acar's α on the mean-loss scale, the scale of FedProx's μ and of
ADMM's ρ in `admm.make_nn`. The FedLap paper runs FedDyn with "a client-specific α_k ∝ α/N_k" from FedDyn's codebase
and sweeps α over {1e-3, 1e-4, 1e-5} (UCI Credit, CIFAR10), {1e-4, 1e-5, 1e-6} (MNIST), {1e-2, …, 1e-6} (FMNIST),
{10, …, 1e-3} (FLamby-Heart). [reading] The constant in "∝" is not stated: with α_k = α·(N/K)/N_k their α equals
ours for equal-sized clients; with α_k = α/N_k (the scaling FedLap's δ/N_k has) ours is α_paper/N_k. Moreover their
code's un-squared proximal norm has a gradient of size α whatever ‖θ − θ_g‖ is, so the grid values do not carry over
exactly either way: sweep α on a log grid. One α serves all clients here (Acar's Alg. 1 as written). Note that the
server's correction h/α = −(1/K) Σ (accumulated drift) does not depend on α.

Messages: broadcast {"theta": θ_g}; reply {"theta": θ_k}.
"""

from __future__ import annotations

import math
import numbers
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
    StackBuffer,
    TrainingInfo,
    seen_clients,
)
from bayesadmm.algorithms.fedavg import LR_SPACE
from bayesadmm.algorithms.spec import Context, MethodSpec
from bayesadmm.algorithms.spec import register as register_method
from bayesadmm.solvers.adam import AdamProblem, local_adam
from bayesadmm.trees import register


@register
class ServerState(NamedTuple):
    theta: Tensor  # θ_g
    h: Tensor  # h (Acar's server state; = (1/K) Σ_k g_k)
    clients: tuple[int, ...]  # ids of the clients that have replied so far (at most num_clients)
    round: int = 0  # completed rounds


@register
class ClientState(NamedTuple):
    grad: Tensor  # g_k (Acar's ∇L_k(θ_k^{t−1})): all a FedDyn client carries over


def _checked(name: str, alpha: float, num_clients: int) -> tuple[float, int]:
    """`make`'s checks of α and K (one ValueError naming every problem); returns them as a float and an int."""
    problems = []
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha) or alpha <= 0:
        problems.append(f"alpha must be a finite number > 0, got {alpha!r}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, numbers.Integral) or num_clients <= 0:
        problems.append(f"num_clients must be a positive integer, got {num_clients!r}")
    if problems:
        raise ValueError(f"{name}: " + "; ".join(problems))
    return float(alpha), int(num_clients)


def make(
    *,
    alpha: float,
    num_clients: int,
    lr: float = 1e-3,
    epochs: int = 1,
    batch_size: int = 32,
    weight_decay: float = 0.0,
    name: str = "feddyn",
) -> Algorithm:
    """FedDyn with penalty α > 0 (mean-loss units), K = `num_clients` clients in total and local weight decay wd ≥ 0;
    the local solve is `epochs` epochs of Adam (learning rate `lr`, minibatches of `batch_size`).

    Its length is the algorithm's pure functions written as closures over the hyperparameters, in the optax/blackjax
    style; the checks are in `_checked`."""
    adam = local_adam(name, lr, epochs, batch_size, weight_decay)
    alpha, num_clients = _checked(name, alpha, num_clients)
    stack = StackBuffer()  # the server's, reused every round

    def init_server(theta0: Tensor) -> ServerState:
        return ServerState(theta0, torch.zeros_like(theta0), (), 0)

    def init_client(server: ServerState, client_id: int) -> ClientState:
        return ClientState(torch.zeros_like(server.theta))

    def broadcast(server: ServerState) -> Message:
        return {"theta": server.theta}

    def prepare(state: ClientState, message: Message, data) -> AdamProblem:
        theta_g = message["theta"]
        return AdamProblem(theta_g, linear=-state.grad, prox_weight=alpha, prox_center=theta_g)

    def finish(state: ClientState, message: Message, data, problem: AdamProblem, result: tuple[Tensor, int]):
        theta, steps = result
        grad = state.grad - alpha * (theta - problem.theta0)
        return ClientState(grad), {"theta": theta}, TrainingInfo(steps)

    local = LocalStep(adam, prepare, finish)

    def server_update(server: ServerState, replies: Mapping[int, Message]):
        if not replies:
            raise ValueError(f"{name}: server_update needs at least one reply")
        last = seen_clients(server.clients, replies)
        if len(last) > num_clients:
            raise ValueError(f"{name}: {len(last)} distinct clients have replied but num_clients={num_clients}")
        thetas = stack([replies[k]["theta"] for k in sorted(replies)])  # a reused buffer, changed in place below
        mean = thetas.mean(dim=0)
        drift = thetas.sub_(server.theta).sum(dim=0)  # Σ_k (θ_k − θ_g) without a second K × P matrix
        h = server.h - (alpha / num_clients) * drift
        theta = mean - h / alpha
        if not bool(torch.isfinite(theta).all()):
            raise DivergenceError(f"{name}: the server parameters are not finite")
        return ServerState(theta, h, last, server.round + 1), ServerInfo(len(replies))

    def posterior(server: ServerState) -> PointEstimate:
        return PointEstimate(server.theta)

    return Algorithm.from_local(name, init_server, init_client, broadcast, local, server_update, posterior)


@dataclass(frozen=True)
class Hparams:
    """FedDyn's hyperparameters: the regulariser `alpha`, the local Adam run and its `weight_decay`."""

    alpha: float
    lr: float = 1e-3
    epochs: int = 1
    batch_size: int = 32
    weight_decay: float = 0.0


def build(hparams: Hparams, context: Context) -> Algorithm:
    return make(
        alpha=hparams.alpha,
        num_clients=context.num_clients,
        lr=hparams.lr,
        epochs=hparams.epochs,
        batch_size=hparams.batch_size,
        weight_decay=hparams.weight_decay,
        name="feddyn",
    )


SPEC = register_method(
    MethodSpec(
        name="feddyn",
        hparams=Hparams,
        build=build,
        summary="FedDyn: dynamic regularisation of each client's loss by its linear term",
        search_space={
            **LR_SPACE,
            # a hundred (alpha, required) and ten (weight decay) times either side of the scenario's: the spans of
            # the FedLap paper's grids; its weight-decay grid for a run that leaves it at 0
            "alpha": {"around": [0.01, 100]},
            "weight_decay": {"around": [0.1, 10], "choices": [0.0001, 0.00001, 0.000001]},
        },
        example={"lr": 0.05, "epochs": 2, "batch_size": 8, "alpha": 0.01},
    )
)
