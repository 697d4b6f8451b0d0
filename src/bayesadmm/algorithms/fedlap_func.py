r"""FedLap-Func (Swaroop, Khan & Doshi-Velez, ICLR 2025, Eq. 17; derivation App. C): FedLap plus soft labels.

FedLap (Eqs. 7–9) is PVI with isotropic Gaussians N(·, I/δ), the site t̂_k ∝ exp(δ v_kᵀw) and the delta method.
FedLap-Func adds function-space information: every client k keeps a small memory M_k of its own inputs and sends
the predictions ŷ_i = E[y | f_{w_k}(x_i)] of its latest model on them (the likelihood's `soft_targets`: softmax
probabilities, a Gaussian's mean f, a Poisson's rate exp f). With ℓ_k the SUMMED loss of client k, ℓ(ŷ, w) =
nll(f_w(x), ŷ) the likelihood's negative log-likelihood at the soft target (for the softmax the soft-label
cross-entropy −Σ_c ŷ_c log softmax(f_w(x))_c; for a Gaussian (f_w(x) − ŷ)²/2σ² + const) and ŷ_{i,g} =
E[y | f_{w_g}(x_i)]:

    client:  w_k ← argmin_w ℓ_k(w) + δ v_kᵀw + ½δ‖w − w_g‖²                       (the FedLap part)
                            − Σ_{i∈M_k} τ_i ℓ(ŷ_i, w) + Σ_{k'} Σ_{i∈M_k'} τ_i ℓ(ŷ_{i,g}, w)
    site:    v_k ← v_k + ρ_k (w_k − w_g)
    server:  w_g ← argmin_w Σ_k [Σ_{i∈M_k} τ_i ℓ(ŷ_i, w) − δ v_kᵀw] + ½δ‖w‖²

The sign of the client's function-space terms is garbled in the paper; this follows the reading under which its claim
holds: the client minimises against the cavity q_g/t̂_k, and the global posterior carries every memory term at the
global predictions (Eq. 25 with all Hessians 0) while client k's own site carries its terms at its own ŷ_i (Eq. 24),
which the cavity removes. Under this reading the paper's claim holds: when w_k = w_g and ŷ_i, ŷ_{i,g} are the
predictions of that same w, every function-space term has zero gradient (for a canonical-link likelihood, −log p(y|f)
= A(f) − yᵀf + c(y), the gradient of ℓ(ŷ, w) in the outputs is E[y | f_w] − ŷ: softmax(f_w) − ŷ for the softmax), so
the fixed points are FedLap's. App. C derives ℓ(ŷ, w) from the Laplace/GGN approximation with the output Hessian Λ_i
(Khan et al. 2019), which for these likelihoods is the curvature of ℓ(ŷ, ·) in the outputs: I/σ² for a Gaussian, so
the terms are exactly the quadratic the derivation adds. The likelihood must therefore give `soft_targets`
(`likelihoods.CurvatureLikelihood`); one that does not is refused when the method is built. With no memory
(`points_per_class=0`) or `tau_f=0` the algorithm is FedLap exactly: the server problem is then ½δ‖w‖² − δ(Σ v_k)ᵀw
with the closed-form minimiser w_g = Σ_k v_k, which is used directly.

Implementation choices (none stated by the paper unless cited):
- The FedLap part is `fedlap.py`'s, operation for operation, so that without function-space terms the iterates are
  the same (tested): clients train on the objective divided by N_k (LocalAdam, App. A / Eq. 18) with the dual in
  mean-loss units ṽ_k = δv_k/N_k, so the minibatch objective is
      batch-mean CE + ṽ_kᵀw + ½(δ/N_k)‖w − w_g‖² + (1/N_k)[Σ_all τ_i ℓ(ŷ_{i,g}, w) − Σ_own τ_i ℓ(ŷ_i, w)],
  ṽ_k ← ṽ_k + ρ_k(δ/N_k)(w_k − w_g), and the server works with Σ_k v_k = Σ_k (N_k/δ) ṽ_k. The memory terms (a few
  dozen points) are evaluated in full at every minibatch step by wrapping the client's data, so their gradient is
  exact. Initial sites, ρ and `client_sizes` are also fedlap.py's: ṽ_k⁽⁰⁾ = δθ_0/N, so Σ_k v_k⁽⁰⁾ = θ_0 = w_g⁽⁰⁾ and
  the first server step does not forget θ_0; a client that has not replied counts with its initial site; ρ_k = N_k/N
  (`fedlap.SizeDamping()`, the method's `rho="size"`, App. E) or one number in (0, 1] (`fedlap.ConstantDamping`).
- Memory. At its first update each client picks `points_per_class` random inputs of every class it holds (fewer if
  it holds fewer), with the generator, after local training so that the minibatch stream is FedLap's; the memory is
  then fixed. The classes are the likelihood's (`classes(targets)`, which `Classification` has); a likelihood
  without classes (regression, counts) has one stratum, so `points_per_class` random inputs of all the client's.
  τ_i = τ_f N_{k,c}/M_{k,c} (App. E), so Σ_{i∈M_k} τ_i = τ_f N_k: at τ_f = 1 the memory stands for the client's
  whole data set. ŷ_i come from the w_k just trained; the client keeps them and subtracts exactly those in
  the next round, which is what the server holds for it (its last reply).
- Round 1's clients have no function-space terms (no memory has been sent yet and they have no earlier ŷ_i); round
  1's server already fits the memories its clients just sent.
- Server. Adam (fresh state) on the summed-units server objective above, full batch over all memories,
  `server_iterations` steps at `server_lr` from the previous w_g (FMNIST in the paper: 5000 steps at 1e-3; MNIST 3000
  at 5e-4; CIFAR10 500 at 5e-4). It needs the model to evaluate f_w, hence the `model` argument. It is deterministic,
  so it needs no generator; the server's `ServerInfo.grad_norm` reports how far from stationary it stopped.

Privacy. A memory point is a raw training input, sent to the server and rebroadcast to every other client (each
client's objective needs all memories), so every participant sees K·C·points_per_class real examples; the paper admits
this "breaks the strictest requirement" of federated learning and does not run FedLap-Func on the medical FLamby data.
The soft labels of a model fitted to the client's data nearly reveal each point's label, and the broadcast weights
τ_i = τ_f N_{k,c}/M_{k,c} reveal each client's class histogram N_{k,c} to everyone. None of this is covered by any
formal guarantee (no clipping, no noise, no secure aggregation). The paper's suggested way out, public unlabelled
inputs shared by all (as in federated distillation), is not implemented here.

Communication per round, with P parameters, D input features, C classes and M = Σ_k M_k memory points: a client
sends ṽ_k (P; not w_k, which the server does not need), its soft labels (M_k·C), weights (M_k) and inputs (M_k·D);
the server sends w_g (P) and all memories with their global soft labels, M·(D + C + 1). The paper counts P + C²,
assuming the inputs are already available to everyone; here the inputs travel in every message so that messages stay
self-contained and the server can keep only each client's last reply. Sending them once and caching them would
restore the paper's count. The inputs are not small: for FMNIST with K = 10, C = 10 and one point per class,
M·D = 78 400 floats against P = 178 110.
Compute: clients O((N_k + M)·P·E), the server O(M·P·server_iterations) instead of FedLap's vector sum.

The function-space machinery (the memory, the soft-label loss, the server's Adam) is in `function_space.py`; its
names are re-exported here, where they were first defined.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, cast

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, DivergenceError, LocalStep, Message, PointEstimate, merge_replies
from bayesadmm.algorithms.fedavg import LR_SPACE
from bayesadmm.algorithms.fedlap import (
    DELTA_SPACE,
    Damping,
    SizeDamping,
    check_client,
    check_known,
    client_sizes_of,
    damping_for,
    damping_of,
    site_sum,
)
from bayesadmm.algorithms.function_space import MEMORY_KEYS as MEMORY_KEYS
from bayesadmm.algorithms.function_space import (
    Memory,
    WithMemory,
    client_function_terms,
    memory_strata,
    minimize_server,
    predict,
    select_memory,
    server_memory,
)
from bayesadmm.algorithms.function_space import per_example_nll as per_example_nll
from bayesadmm.algorithms.function_space import soft_label_loss as soft_label_loss
from bayesadmm.algorithms.spec import Context, MethodSpec
from bayesadmm.algorithms.spec import register as register_method
from bayesadmm.likelihoods import Classification, CurvatureLikelihood, Likelihood, require
from bayesadmm.solvers.adam import AdamProblem, LocalAdam, local_adam
from bayesadmm.trees import register


@register
class ServerState(NamedTuple):
    theta: Tensor  # w_g
    theta0: Tensor  # θ_0: the initial sites of clients that have not replied yet
    replies: Mapping[int, Message]  # last reply of every client: ṽ_k and its memory (inputs, ŷ_i, τ_i)


@register
class ClientState(NamedTuple):
    client_id: int
    dual: Tensor  # ṽ_k = δ v_k / N_k (mean-loss units, as in fedlap.py)
    memory_x: Tensor | None  # inputs of M_k (None until the first update)
    memory_tau: Tensor | None  # τ_i
    memory_soft: Tensor | None  # ŷ_i from the latest w_k (what the server holds for this client)
    theta: Tensor | None  # w_k from the last local training


@register
class ClientInfo(NamedTuple):
    iterations: int  # local Adam steps
    memory_terms: int  # function-space terms in the client's objective (0: a FedLap round)


@register
class ServerInfo(NamedTuple):
    clients: int  # clients whose last reply the server counted
    memory: int  # memory points the server problem fitted (0: FedLap's closed form)
    grad_norm: float  # ‖∇‖ of the server objective where its Adam stopped (0.0 for the closed form)


class FuncProblem(NamedTuple):
    """A FedLap-Func client's local problem: FedLap's (an `AdamProblem`: linear ṽ_k, proximal weight δ/N_k around
    w_g, from w_g), the function-space terms its objective carries (`client_function_terms`; None: a FedLap round)
    and whether to draw its memory after training (its first update)."""

    train: AdamProblem
    memory: Memory | None
    select_memory: bool


class FuncResult(NamedTuple):
    """w_k, its Adam steps, and the memory drawn after training ((inputs, τ_i), or None where none was drawn)."""

    theta: Tensor
    steps: int
    chosen: tuple[Tensor, Tensor] | None


@dataclass(frozen=True)
class TrainWithMemory:
    """FedLap-Func's local solver: `adam` on the client's data, through `WithMemory` where the problem carries
    function-space terms, then (on the first update) `points_per_class` memory points of every class drawn with
    `select_memory`, both on the client's generator in that order (so the minibatch stream is FedLap's). It does not
    batch (no `solve_cohort`)."""

    adam: LocalAdam
    model: Any
    likelihood: Likelihood
    points_per_class: int
    tau_f: float
    needs_generator: ClassVar[bool] = True  # Adam shuffles the minibatches

    def solve_problem(self, problem: FuncProblem, data, generator: torch.Generator) -> FuncResult:
        objective = data if problem.memory is None else WithMemory(data, self.model, self.likelihood, problem.memory)
        theta, steps = self.adam.solve_problem(problem.train, objective, generator)
        chosen = None
        if problem.select_memory:
            strata = memory_strata(self.likelihood, data.y)
            idx, tau = select_memory(strata, self.points_per_class, self.tau_f, generator)
            chosen = (data.X[idx], tau.to(theta.dtype))
        return FuncResult(theta, steps, chosen)


def _check_settings(
    name: str, delta: float, tau_f: float, points_per_class: int, server_iterations: int, server_lr: float
) -> None:
    """`make`'s checks of its numbers: one ValueError naming every problem."""
    problems = []
    if not (math.isfinite(delta) and delta > 0):
        problems.append(f"delta must be > 0, got {delta}")
    if not (math.isfinite(tau_f) and tau_f >= 0):
        problems.append(f"tau_f must be >= 0, got {tau_f}")
    if points_per_class < 0:
        problems.append(f"points_per_class must be >= 0, got {points_per_class}")
    if server_iterations < 0 or server_lr <= 0:
        problems.append(f"need server_iterations >= 0 and server_lr > 0, got {server_iterations}, {server_lr}")
    if problems:
        raise ValueError(f"{name}: " + "; ".join(problems))


_BY_SIZE = SizeDamping()


def make(
    *,
    model,
    delta: float,
    lr: float,
    client_sizes: Mapping[int, int],
    tau_f: float = 1.0,
    rho: Damping = _BY_SIZE,
    epochs: int = 1,
    batch_size: int = 32,
    points_per_class: int = 1,
    server_iterations: int = 5000,
    server_lr: float = 1e-3,
    name: str = "fedlap-func",
    likelihood: Likelihood | None = None,
) -> Algorithm:
    """FedLap-Func with prior precision δ, function-space weight τ_f, damping ρ (`fedlap.SizeDamping()`: ρ_k = N_k/N,
    or `fedlap.ConstantDamping(ρ)`), local Adam (lr, epochs, batch_size) and a server Adam (server_iterations,
    server_lr).

    `model` is the FlatModel f_w and `likelihood` the clients' likelihood (the engine supplies both; None:
    `Classification()`, the default of `SupervisedData`): the server evaluates the function-space terms with them on
    the memories, without the clients' data. The likelihood must give `soft_targets` (refused here otherwise), and a
    client whose data carries another likelihood is refused at its update.

    Its length is the algorithm's pure functions (init, broadcast, prepare, finish, server update, posterior) written
    as closures over the hyperparameters, in the optax/blackjax style; the checks are in `_check_settings`.
    """
    likelihood = Classification() if likelihood is None else likelihood
    require(likelihood, ("soft_targets",), name)
    predictive = cast(CurvatureLikelihood, likelihood)  # its soft_targets, checked by require
    sizes = client_sizes_of(client_sizes, name)
    _check_settings(name, delta, tau_f, points_per_class, server_iterations, server_lr)
    rhos = damping_of(rho, sizes, name)
    solver = TrainWithMemory(local_adam(name, lr, epochs, batch_size), model, likelihood, points_per_class, tau_f)
    total = sum(sizes.values())

    def init_server(theta0: Tensor) -> ServerState:
        return ServerState(theta0, theta0, {})

    def init_client(server: ServerState, client_id: int) -> ClientState:
        if client_id not in sizes:
            raise KeyError(f"{name}: client {client_id} is not in client_sizes {sorted(sizes)}")
        return ClientState(client_id, delta * server.theta0 / total, None, None, None, None)  # ṽ_k⁽⁰⁾ = δθ_0/N

    def broadcast(server: ServerState) -> Message:
        message = {"theta": server.theta}
        memory = server_memory(server.replies)
        if memory is not None:
            x, _, tau = memory
            message.update(
                {"memory.x": x, "memory.soft": predict(model, predictive, server.theta, x), "memory.tau": tau}
            )
        return message

    def prepare(state: ClientState, message: Message, data) -> FuncProblem:
        check_client(name, sizes, state.client_id, data)
        own = getattr(data, "likelihood", likelihood)
        if own != likelihood:
            raise ValueError(
                f"{name} was built for the likelihood {likelihood!r}, but client {state.client_id}'s data has "
                f"{own!r}: its function-space terms would be those of another model; build it with the clients' one"
            )
        n = data.num_examples
        theta_g = message["theta"]
        train = AdamProblem(theta_g, linear=state.dual, prox_weight=delta / n, prox_center=theta_g)
        select = state.memory_x is None and points_per_class > 0
        return FuncProblem(train, client_function_terms(state, message, n), select)

    def finish(state: ClientState, message: Message, data, problem: FuncProblem, result: FuncResult):
        theta_g, prox, theta = message["theta"], problem.train.prox_weight, result.theta
        dual = state.dual + rhos[state.client_id] * prox * (theta - theta_g)
        memory_x, memory_tau = (state.memory_x, state.memory_tau) if result.chosen is None else result.chosen
        reply, soft = {"dual": dual}, None
        if memory_x is not None and memory_tau is not None:  # (set together)
            soft = predict(model, predictive, theta, memory_x)
            reply.update({"memory.x": memory_x, "memory.soft": soft, "memory.tau": memory_tau})
        info = ClientInfo(result.steps, 0 if problem.memory is None else len(problem.memory.weight))
        return ClientState(state.client_id, dual, memory_x, memory_tau, soft, theta), reply, info

    def server_update(server: ServerState, replies: Mapping[int, Message]):
        check_known(name, sizes, replies)
        last = merge_replies(server.replies, replies)
        dual_sum = site_sum(sizes, delta, server.theta0, last)  # Σ_k v_k
        memory = server_memory(last)
        if memory is not None and bool((memory[2] != 0).any()):
            theta, gradient = minimize_server(
                model, likelihood, server.theta, dual_sum, delta, Memory(*memory), server_iterations, server_lr
            )
            info = ServerInfo(len(last), len(memory[2]), float(gradient.norm()))
        else:
            theta = dual_sum  # FedLap's closed form
            info = ServerInfo(len(last), 0, 0.0)
        if not torch.isfinite(theta).all():
            raise DivergenceError(f"{name}: the server parameters are not finite")
        return ServerState(theta, server.theta0, last), info

    def posterior(server: ServerState) -> PointEstimate:
        return PointEstimate(server.theta)

    def personal(server: ServerState, state: ClientState) -> PointEstimate:
        # the local mean w_k of the last training, as FedLap's (the covariance is the prior's)
        return posterior(server) if state.theta is None else PointEstimate(state.theta)

    local = LocalStep(solver, prepare, finish)
    return Algorithm.from_local(
        name, init_server, init_client, broadcast, local, server_update, posterior, personal=personal
    )


@dataclass(frozen=True)
class Hparams:
    """FedLap-Func's hyperparameters: δ, the function-space weight `tau_f`, the damping `rho` ("size" or a number in
    (0, 1]), the local Adam run, the memory's `points_per_class` and the server's Adam run (`server_iterations`,
    `server_lr`)."""

    delta: float
    lr: float
    tau_f: float = 1.0
    rho: float | str = "size"
    epochs: int = 1
    batch_size: int = 32
    points_per_class: int = 1
    server_iterations: int = 5000
    server_lr: float = 1e-3

    def __post_init__(self) -> None:
        damping_for(self.rho, "fedlap-func")


def build(hparams: Hparams, context: Context) -> Algorithm:
    """`make` with the engine's model, client sizes and likelihood."""
    return make(
        model=context.model,
        delta=hparams.delta,
        lr=hparams.lr,
        client_sizes=context.client_sizes,
        tau_f=hparams.tau_f,
        rho=damping_for(hparams.rho, "fedlap-func"),
        epochs=hparams.epochs,
        batch_size=hparams.batch_size,
        points_per_class=hparams.points_per_class,
        server_iterations=hparams.server_iterations,
        server_lr=hparams.server_lr,
        name="fedlap-func",
        likelihood=context.likelihood,
    )


SPEC = register_method(
    MethodSpec(
        name="fedlap-func",
        hparams=Hparams,
        build=build,
        summary="FedLap-Func: FedLap with function-space memory points",
        search_space={
            **LR_SPACE,
            "delta": DELTA_SPACE,
            # as delta; the FedLap paper's grid for a run that leaves tau_f at its default
            "tau_f": {"around": [0.01, 100], "choices": [1, 0.1, 0.01, 0.001, 0.0001]},
        },
        # the toy problems' few memory points need far fewer server steps than the paper's 5000
        example={
            "lr": 0.05,
            "epochs": 2,
            "batch_size": 8,
            "delta": 1.0,
            "rho": 0.5,
            "server_iterations": 200,
            "server_lr": 0.01,
        },
    )
)
