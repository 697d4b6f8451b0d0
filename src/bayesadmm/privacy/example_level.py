"""Example-level differential privacy of local training: DP-SGD's per-example clipping and Gaussian noise in the
local solver (DP-Adam for the methods trained by Adam, DP-IVON for IVON-ADMM and the other IVON-trained methods), so
that everything a client sends is post-processing of its private training.

`PrivateSolver` wraps the method's local solver: the solver sees the client's data through `privacy.gradients`'
`PrivateGradients`, whose minibatch gradient is (Σ_i clip(g_i) + N(0, (σC)² I)) / B, and a cohort's steps through
`PrivateCohortGradients`, the same per client. The method's extra terms (FedProx's proximal pull, FedDyn's linear
term, IVON-ADMM's dual and prior terms) depend on the broadcast and the client's own messages only and are added as
before; IVON's Hessian estimate is its private gradient times its own weight noise. The solvers that qualify declare
it (`private_gradients`: the data's only use is one minibatch gradient per step, `batch_size` examples a step over
`epochs` epochs); IVON with several weight samples a step (mc_samples > 1) is refused, as each sample's gradient
would spend privacy of its own.

Accounting, per client: a round is ⌈N_k / B⌉ · epochs steps at sampling rate q = min(1, B / N_k), and with noise
the solver samples exactly that (its `poisson` minibatches: each example in each step independently with
probability q, `solvers.cohort.poisson_minibatches`), the noised sum divided by the expected size qN_k (Opacus's
DP-SGD); a client's ε counts the rounds it trained. The run reports, and budgets, the largest ε of any client.
N_k (the clients' sizes) is taken as public. Without noise (ε infinite) the solver keeps its shuffles.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, LocalStep, Message, update_from
from bayesadmm.privacy.accountant import Step, calibrated_noise, epsilon
from bayesadmm.privacy.client_level import BudgetExhausted
from bayesadmm.privacy.gradients import PrivateCohortGradients, PrivateGradients, noise_generator
from bayesadmm.trees import register

__all__ = ["PrivateSolver", "ExampleServer", "example_private", "example_noise"]


@dataclass(frozen=True)
class PrivateSolver:
    """`solver` (one that declares `private_gradients`, with its `poisson` minibatches where there is noise) trained
    on the client's data through `PrivateGradients` (clip `clip`, noise multiplier `noise_multiplier`); a cohort
    solver's steps through `PrivateCohortGradients`.
    Each solve first draws its noise stream's seed from the client's generator (`noise_generator`; nothing without
    noise), so a cohort's clients draw what each draws alone."""

    solver: Any
    clip: float
    noise_multiplier: float
    needs_generator: ClassVar[bool] = True

    @property
    def cpu_cohort(self) -> int:
        return int(getattr(self.solver, "cpu_cohort", 1))

    @property
    def compiled(self) -> bool | None:  # the wrapped solver's kernels (`algorithms.base.compiled_kernels`)
        return getattr(self.solver, "compiled", None)

    def solve_problem(self, problem: Any, data: Any, generator: torch.Generator) -> Any:
        noise = noise_generator(generator, self.noise_multiplier)
        expected = min(self.solver.batch_size, data.num_examples) if self.solver.poisson else None
        private = PrivateGradients(data, self.clip, self.noise_multiplier, noise, expected)
        return self.solver.solve_problem(problem, private, generator)

    def solve_cohort(self, problems: Sequence[Any], data: Any, generators: Sequence[torch.Generator]) -> list:
        noises = [noise_generator(g, self.noise_multiplier) for g in generators]
        batch_size = self.solver.batch_size if self.solver.poisson else None
        gradients = PrivateCohortGradients(self.clip, self.noise_multiplier, noises, batch_size)
        return self.solver.solve_cohort(problems, data, generators, gradients=gradients)


def round_step(solver: Any, size: int, noise_multiplier: float) -> tuple[Step, int]:
    """A client's round as the accountant sees it: ((σ, sampling rate B / N_k), its number of steps), for a local
    `solver` of `batch_size` and `epochs`."""
    rate = min(1.0, solver.batch_size / size)
    return (noise_multiplier, rate), math.ceil(size / solver.batch_size) * solver.epochs


@register
class ExampleServer(NamedTuple):
    inner: Any  # the method's server state
    trained: tuple[tuple[int, int], ...]  # (client id, rounds it trained so far), by client id


@register
class ExampleInfo(NamedTuple):
    server: tuple  # the method's info record
    dp_epsilon: float  # the largest ε of any client so far
    dp_noise_multiplier: float


@functools.lru_cache(maxsize=4096)
def client_epsilon(solver: Any, size: int, noise_multiplier: float, rounds: int, dp: Any) -> float:
    """Client ε after `rounds` rounds of training on `size` examples (cached: clients of one size share it, and the
    budget asks again each round)."""
    step, count = round_step(solver, size, noise_multiplier)
    return epsilon([step] * (count * rounds), dp.delta, dp.accountant) if rounds else 0.0


def example_noise(algorithm: Algorithm, dp: Any, sizes: Mapping[int, int], rounds: int) -> float:
    """The noise multiplier with which no client spends more than `dp.epsilon` in `rounds` rounds: the largest of
    the clients' calibrated ones (Opacus's `get_noise_multiplier` for each distinct size)."""
    solver = _private_solver(algorithm)
    found = 0.0
    for size in sorted(set(sizes.values())):
        (_, rate), count = round_step(solver, size, 0.0)
        found = max(found, calibrated_noise(dp.epsilon, dp.delta, rate, count * rounds, dp.accountant))
    return found


def _private_solver(algorithm: Algorithm) -> Any:
    """The algorithm's local solver where example-level DP can replace its gradients; a ValueError naming the fix
    otherwise."""
    local = algorithm.local
    solver = None if local is None else local.solver
    if not getattr(solver, "private_gradients", False):
        raise ValueError(
            f"{algorithm.name}: example-level DP is available for the methods trained by Adam's or IVON's local solver "
            "(fedavg, fedprox, feddyn, fedlap, admm, ivon-admm, ...); use dp level 'client' for the others"
        )
    if not (dataclasses.is_dataclass(solver) and "poisson" in {f.name for f in dataclasses.fields(solver)}):
        raise ValueError(
            f"{algorithm.name}: example-level DP needs a local solver that draws Poisson minibatches (a `poisson` "
            "field, as LocalAdam's: solvers.cohort.poisson_minibatches); use dp level 'client'"
        )
    if getattr(solver, "mc_samples", 1) != 1:
        raise ValueError(
            f"{algorithm.name}: example-level DP takes one gradient per step; set mc_samples=1 (IVON's weight samples "
            "per step)"
        )
    return solver


def example_private(algorithm: Algorithm, dp: Any, noise_multiplier: float, sizes: Mapping[int, int]) -> Algorithm:
    """`algorithm` whose local solver is private (module docstring), clip `dp.clip`, noise `noise_multiplier`, with
    the clients' sizes `sizes` for the accounting and the budget `dp.epsilon` (the largest client ε)."""
    solver, local = _private_solver(algorithm), algorithm.local
    assert local is not None
    # with noise, the minibatches the accountant analyses (Poisson); without, ε is infinite and the shuffles stay
    sampling = dataclasses.replace(solver, poisson=True) if noise_multiplier > 0 else solver
    private_local = LocalStep(PrivateSolver(sampling, dp.clip, noise_multiplier), local.prepare, local.finish)

    def worst(trained: Mapping[int, int], extra: int = 0, who: Any = ()) -> float:
        return max(
            client_epsilon(solver, sizes[k], noise_multiplier, trained.get(k, 0) + (extra if k in who else 0), dp)
            for k in sizes
        )

    def init_server(theta0: Tensor) -> ExampleServer:
        return ExampleServer(algorithm.init_server(theta0), ())

    def broadcast(server: ExampleServer) -> Message:
        if dp.epsilon is not None:
            trained = dict(server.trained)
            after = worst(trained, 1, sizes)  # any client may be drawn
            if after > dp.epsilon:
                raise BudgetExhausted(
                    f"privacy budget: the next round would take a client's ε from {worst(trained):.4g} to "
                    f"{after:.4g}, past the budget ε = {dp.epsilon:g} (δ = {dp.delta:g}); resume with a larger "
                    "dp_epsilon to go on"
                )
        return algorithm.broadcast(server.inner)

    def server_update(server: ExampleServer, replies: Mapping[int, Message]) -> tuple[ExampleServer, ExampleInfo]:
        inner, info = algorithm.server_update(server.inner, replies)
        trained = dict(server.trained)
        for k in replies:
            trained[k] = trained.get(k, 0) + 1
        record = tuple(sorted(trained.items()))
        return ExampleServer(inner, record), ExampleInfo(info, worst(trained), noise_multiplier)

    def init_client(server: ExampleServer, client_id: int) -> Any:
        return algorithm.init_client(server.inner, client_id)

    def posterior(server: ExampleServer) -> Any:
        return algorithm.posterior(server.inner)

    inner_personal = algorithm.personal
    personal = None if inner_personal is None else (lambda server, state: inner_personal(server.inner, state))
    inner_unlearn = algorithm.unlearn  # the server sums the clients' private replies exactly: the method's own
    unlearn = None
    if inner_unlearn is not None:
        unlearn = lambda server, k, state: server._replace(inner=inner_unlearn(server.inner, k, state))  # noqa: E731
    return algorithm._replace(
        init_server=init_server, init_client=init_client, broadcast=broadcast, server_update=server_update,
        posterior=posterior, client_update=update_from(algorithm.name, private_local), local=private_local,
        personal=personal, unlearn=unlearn,
    )  # fmt: skip
