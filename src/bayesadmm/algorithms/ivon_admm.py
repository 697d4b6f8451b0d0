"""IVON-ADMM (Alg. 1) and IVON-PVI: BayesADMM with the diagonal Gaussian family and the IVON local solver.

    1. broadcast (m_g, s_g);
    2. client k: (m_k, s_k) ← IVON on (1/ρ)(ℓ_k/τ + θᵀv_k − ½θᵀdiag(u_k)θ) with prior N(m_g, diag(s_g)⁻¹)
       (App. D.4: ess = N_k/(ρτ), v = τv_k/N_k, u = τu_k/N_k; `solvers.ivon.IVONSolver`);
    3. v_k ← v_k + γ(s_k∘m_k − s_g∘m_g),  u_k ← u_k + γ(s_k − s_g)             (Eq. 16 with the dual step γ)
    4. s_g ← (1 − α) Mean(s_k) + α[δ + Sum(u_k)],
       m_g ← [(1 − α) Mean(s_k∘m_k) + α Sum(v_k)] / s_g,  α = 1/(1 + ρK)     (Eq. 54 for the diagonal family)

Steps 3–4 are `bayes_admm`'s dual and server updates for the diagonal family, unchanged. IVON-PVI (App. G.1) is the
same with ρ = 1 and α = 1 (no server proximal term), γ acting as PVI's damping.
The server starts at mean `theta0` (a network's random initialisation; Alg. 1's m_g = 0 would make a sigmoid MLP's
hidden units identical) and precision δ.

The keywords `cosine_rounds` (the method's `cosine: true` sets it to the run's length, `Context.rounds`) and
`restart_at_q_g` choose the solver's step-size schedule (`CosineLR` or `ConstantLR`) and round start (`RestartAtQg` or
`RestartAtHessInit`, Alg. 2 as written); see `solvers.ivon`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from bayesadmm.algorithms import bayes_admm
from bayesadmm.algorithms.base import Algorithm, Message
from bayesadmm.algorithms.client_update import ClientUpdate, RunningSum, participants
from bayesadmm.algorithms.spec import Context, MethodSpec
from bayesadmm.algorithms.spec import register as register_method
from bayesadmm.families import DiagonalGaussian
from bayesadmm.optim.compilation import decide
from bayesadmm.solvers.ivon import ConstantLR, CosineLR, IVONSolver, RestartAtHessInit, RestartAtQg


def make_solver(
    lr: float,
    tau: float = 1.0,
    epochs: int = 1,
    batch_size: int = 32,
    hess_init: float = 1e-3,
    beta1: float = 0.9,
    beta2: float = 0.99999,
    mc_samples: int = 1,
    clip_radius: float = float("inf"),
    cosine_rounds: int | None = None,
    restart_at_q_g: bool = False,
    compiled: bool = True,
) -> IVONSolver:
    """The IVON client solver `make` uses: cosine decay over `cosine_rounds` rounds (None: constant lr), rounds
    after the first starting at q_g with `restart_at_q_g` (else at h0 every round, Alg. 2), and the compiled kernels
    or (`compiled=False`) the eager maths."""
    schedule = ConstantLR() if cosine_rounds is None else CosineLR(cosine_rounds)
    start = RestartAtQg() if restart_at_q_g else RestartAtHessInit()
    return IVONSolver(
        lr=lr,
        epochs=epochs,
        batch_size=batch_size,
        tau=tau,
        hess_init=hess_init,
        beta1=beta1,
        beta2=beta2,
        mc_samples=mc_samples,
        clip_radius=clip_radius,
        schedule=schedule,
        start=start,
        compiled=compiled,
    )


def make(
    dim: int,
    rho: float,
    gamma: float,
    delta: float,
    lr: float,
    tau: float = 1.0,
    epochs: int = 1,
    batch_size: int = 32,
    hess_init: float = 1e-3,
    beta1: float = 0.9,
    beta2: float = 0.99999,
    mc_samples: int = 1,
    clip_radius: float = float("inf"),
    cosine_rounds: int | None = None,
    restart_at_q_g: bool = False,
    server_rho: float | None = None,
    name: str = "ivon-admm",
    compiled: bool = True,
    incremental: bool = False,
    proximal: str = "all",
) -> Algorithm:
    """IVON-ADMM over `dim` parameters: ρ = `rho`, dual step γ = `gamma`, prior precision δ = `delta`, server
    proximal weight ρ_s = `server_rho` (default ρ); the IVON settings as `make_solver` takes them; `incremental`:
    the server keeps the running sum of the clients' terms, not each client's; `proximal`: the server's proximal
    term over every client ("all", Eq. 54) or the round's participants ("participants") (`bayes_admm.make`)."""
    solver = make_solver(
        lr=lr, tau=tau, epochs=epochs, batch_size=batch_size, hess_init=hess_init, beta1=beta1, beta2=beta2,
        mc_samples=mc_samples, clip_radius=clip_radius, cosine_rounds=cosine_rounds, restart_at_q_g=restart_at_q_g,
        compiled=compiled,
    )  # fmt: skip
    return bayes_admm.make(
        DiagonalGaussian(dim), solver, rho=rho, delta=delta, gamma=gamma, server_rho=server_rho, name=name,
        incremental=incremental, proximal=proximal,
    )  # fmt: skip


def make_pvi(
    dim: int,
    damping: float,
    delta: float,
    lr: float,
    tau: float = 1.0,
    epochs: int = 1,
    batch_size: int = 32,
    hess_init: float = 1e-3,
    beta1: float = 0.9,
    beta2: float = 0.99999,
    mc_samples: int = 1,
    clip_radius: float = float("inf"),
    cosine_rounds: int | None = None,
    restart_at_q_g: bool = False,
    compiled: bool = True,
    incremental: bool = False,
) -> Algorithm:
    """IVON-PVI: ρ = 1, α = 1 (no server proximal term), dual step γ = `damping`; IVON settings and `incremental`
    as in `make`."""
    return make(
        dim,
        rho=1.0,
        gamma=damping,
        delta=delta,
        lr=lr,
        tau=tau,
        epochs=epochs,
        batch_size=batch_size,
        hess_init=hess_init,
        beta1=beta1,
        beta2=beta2,
        mc_samples=mc_samples,
        clip_radius=clip_radius,
        cosine_rounds=cosine_rounds,
        restart_at_q_g=restart_at_q_g,
        server_rho=0.0,
        name="ivon-pvi",
        compiled=compiled,
        incremental=incremental,
    )


@dataclass(frozen=True, kw_only=True)
class IVONSettings:
    """IVON's settings as the local solver of IVON-ADMM and IVON-PVI (`make_solver`), and `cosine`: a cosine
    learning-rate schedule over the whole run (`cosine_rounds` = the run's rounds)."""

    lr: float
    tau: float = 1.0
    epochs: int = 1
    batch_size: int = 32
    hess_init: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.99999
    mc_samples: int = 1
    clip_radius: float = float("inf")
    cosine: bool = False
    restart_at_q_g: bool = False

    def solver_keywords(self, context: Context, name: str) -> dict:
        """The keywords `make` and `make_pvi` take for the solver, the cosine schedule's length and the kernels'
        choice (`compiled`) from `context`."""
        keywords = {f.name: getattr(self, f.name) for f in dataclasses.fields(IVONSettings) if f.name != "cosine"}
        compiled = decide(context.compile, context.dim, self.local_steps(context))
        return keywords | {"cosine_rounds": cosine_rounds(self.cosine, context, name), "compiled": compiled}

    def local_steps(self, context: Context) -> float:
        """The IVON steps the run's clients take in all: epochs × ⌈N_k / batch_size⌉ per client and round, over the
        run's rounds (one where unknown) with its fraction of clients per round."""
        per_round = sum(self.epochs * math.ceil(n / self.batch_size) for n in context.client_sizes.values())
        return per_round * (context.rounds or 1) * context.participation


@dataclass(frozen=True, kw_only=True)
class Hparams(IVONSettings):
    """IVON-ADMM's hyperparameters (`make`): ρ, γ, δ, `server_rho` ρ_s (None: ρ), IVON's settings,
    `incremental` (the server's running sum: for many clients, a few per round) and `proximal` ("all", or
    "participants": the server's proximal term over the round's participants, for a few per cent of the clients a
    round; `bayes_admm.RoundProximal`)."""

    rho: float
    gamma: float
    delta: float
    server_rho: float | None = None
    incremental: bool = False
    proximal: str = "all"

    def __post_init__(self) -> None:
        bayes_admm.check_proximal(self.proximal, "ivon-admm")


@dataclass(frozen=True, kw_only=True)
class PVIHparams(IVONSettings):
    """IVON-PVI's hyperparameters (`make_pvi`): PVI's `damping`, δ, IVON's settings and `incremental`."""

    damping: float
    delta: float
    incremental: bool = False


def cosine_rounds(cosine: bool, context: Context, name: str) -> int | None:
    """The cosine schedule's length: the run's rounds where `cosine`, else None (a constant learning rate)."""
    if not cosine:
        return None
    if context.rounds is None:
        raise ValueError(f"{name}: cosine=True needs the run's number of rounds, which the context does not give")
    return context.rounds


def build(hparams: Hparams, context: Context) -> Algorithm:
    return make(
        context.dim,
        rho=hparams.rho,
        gamma=hparams.gamma,
        delta=hparams.delta,
        server_rho=hparams.server_rho,
        incremental=hparams.incremental,
        proximal=hparams.proximal,
        **hparams.solver_keywords(context, "ivon-admm"),
    )


def dp_update(hparams: Hparams) -> ClientUpdate:
    """Client-level DP's update: the reply η_k + ρ_s λ_k against ρ_s λ_g, i.e. η_k + ρ_s (λ_k − λ_g), both halves
    of the natural parameter (S·m and −S/2) as one vector (docs/guides/privacy.md). The default server sums every
    client's last reply, hence `every_round`; the running-sum server (`incremental`) takes the changes of the terms
    (`running_update`), at any participation; the participants' server (`proximal="participants"`) the sum of the
    round's steps λ_k − λ_g over the expected number of participants (`round_update`), at any participation."""
    server_rho = hparams.rho if hparams.server_rho is None else hparams.server_rho
    if hparams.proximal == "participants":
        released = functools.partial(
            round_update, delta=hparams.delta, server_rho=server_rho, gamma=hparams.gamma, name="ivon-admm"
        )
        return ClientUpdate(
            (("step", "lam"),), scale=0.0, running=RunningSum(None, released, participants), precision_half=True
        )
    return _update(hparams, server_rho, "ivon-admm")


def pvi_dp_update(hparams: PVIHparams) -> ClientUpdate:
    """Client-level DP's update of IVON-PVI: its site η_k (ρ_s = 0), both halves of the natural parameter."""
    return _update(hparams, 0.0, "ivon-pvi")


def _update(hparams: Hparams | PVIHparams, server_rho: float, name: str) -> ClientUpdate:
    if not hparams.incremental:
        return ClientUpdate((("contribution", "lam"),), scale=server_rho, every_round=True, precision_half=True)
    released = functools.partial(running_update, delta=hparams.delta, server_rho=server_rho, name=name)
    return ClientUpdate(
        (("change", "lam"),), scale=server_rho, running=RunningSum("first", released), precision_half=True
    )


def running_update(server, released: Message, new: float, *, delta: float, server_rho: float, name: str):
    """The running-sum server's update from client-level DP's released sum (`bayes_admm.RunningSums.released`)."""
    family = DiagonalGaussian(server.natural[0].numel())
    return bayes_admm.RunningSums(family, delta, server_rho, name).released(server, released, new)


def round_update(
    server, released: Message, expected: float, *, delta: float, server_rho: float, gamma: float, name: str
):
    """The participants' server update from client-level DP's released sum (`bayes_admm.RoundProximal.released`)."""
    family = DiagonalGaussian(server.natural[0].numel())
    return bayes_admm.RoundProximal(family, delta, server_rho, gamma, name).released(server, released, expected)


def build_pvi(hparams: PVIHparams, context: Context) -> Algorithm:
    return make_pvi(
        context.dim,
        damping=hparams.damping,
        delta=hparams.delta,
        incremental=hparams.incremental,
        **hparams.solver_keywords(context, "ivon-pvi"),
    )


SPEC = register_method(
    MethodSpec(
        name="ivon-admm",
        hparams=Hparams,
        build=build,
        summary="IVON-ADMM: BayesADMM with diagonal Gaussians, clients trained by IVON",
        # The BayesADMM paper gives no values for its coarse grid over rho, gamma, delta (and tau): the ranges span
        # ten times either side of the scenario's values (its preset's, or those the tune is given; every one is
        # required, so a run always has them). IVON's lr is no absolute scale: 5e-5 on FashionMNIST, 0.1 on diabetes.
        search_space={
            "lr": {"around": [0.1, 10]},
            "rho": {"around": [0.1, 10]},
            "gamma": {"around": [0.1, 10]},
            "delta": {"around": [0.1, 10]},
        },
        example={"lr": 0.05, "epochs": 2, "batch_size": 8, "rho": 0.5, "gamma": 0.5, "delta": 1.0, "hess_init": 0.1},
        dp_update=dp_update,
    )
)
PVI_SPEC = register_method(
    MethodSpec(
        name="ivon-pvi",
        hparams=PVIHparams,
        build=build_pvi,
        summary="PVI with IVON clients (BayesADMM with α = ρ = 1)",
        # lr and delta as IVON-ADMM's; damping, a fraction of a step in (0, 1], over its whole range
        search_space={"lr": {"around": [0.1, 10]}, "damping": {"log": [0.01, 1]}, "delta": {"around": [0.1, 10]}},
        example={"lr": 0.05, "epochs": 2, "batch_size": 8, "damping": 0.5, "delta": 1.0, "hess_init": 0.1},
        dp_update=pvi_dp_update,
    )
)
