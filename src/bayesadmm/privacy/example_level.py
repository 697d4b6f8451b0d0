"""Example-level differential privacy of local training: DP-SGD's per-example clipping and Gaussian noise in Adam's
local solver (DP-Adam), so that everything a client sends is post-processing of its private training.

Each minibatch step's gradient of the mean loss becomes (Σ_i clip(g_i) + N(0, (σC)² I)) / B: every example's
gradient g_i (`per_example_gradients`) scaled into the L2 ball of radius C, their sum noised, divided by the
minibatch size B (the last minibatch of an epoch may be smaller: its own size). The noise is drawn from the client's
generator, after the epoch's shuffle, in a fixed order. The method's extra terms (FedProx's proximal pull, FedDyn's
linear term) depend on the broadcast only and are added as before.

Accounting, per client: a round is ⌈N_k / B⌉ · epochs steps at sampling rate B / N_k (the client's minibatches are
shuffled fixed-size batches, which the accountant analyses as Poisson sampling at that rate: the usual DP-SGD
approximation); a client's ε counts the rounds it trained. The run reports, and budgets, the largest ε of any
client. N_k (the clients' sizes) is taken as public.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, LocalStep, Message, update_from
from bayesadmm.clients import scaled_nll_grad, take_rows
from bayesadmm.privacy.accountant import Step, calibrated_noise, epsilon
from bayesadmm.privacy.client_level import BudgetExhausted
from bayesadmm.privacy.mechanism import gaussian_noise
from bayesadmm.solvers.adam import LocalAdam
from bayesadmm.trees import register

__all__ = [
    "per_example_gradients",
    "PrivateGradients",
    "PrivateAdam",
    "ExampleServer",
    "example_private",
    "example_noise",
]


def per_example_gradients(data: Any, theta: Tensor, idx: Tensor) -> Tensor:
    """The (B, P) gradients of each example's loss `data.batch_loss(θ, [i])`: batched by the model's own
    `batched_gradients` (each example its own row) for a `SupervisedData` whose likelihood has `nll_grad`, else one
    example at a time through the data's `batch_grad` or autograd."""
    nll_grad = getattr(getattr(data, "likelihood", None), "nll_grad", None)
    if nll_grad is not None and getattr(getattr(data, "model", None), "written_out_backward", False):
        model = data.model
        x, y = take_rows(data.X, idx).unsqueeze(1), take_rows(data.y, idx).unsqueeze(1)
        thetas = theta.detach().unsqueeze(0).expand(idx.numel(), -1).contiguous()
        one = functools.partial(scaled_nll_grad, nll_grad, 1.0)
        return model.batched_gradients(thetas, x, data.likelihood.mean_nll, y, loss_grad=one)
    rows = []
    for i in idx.reshape(-1):
        if hasattr(data, "batch_grad"):
            rows.append(data.batch_grad(theta, i.reshape(1)))
        else:
            leaf = theta.detach().requires_grad_(True)
            rows.append(torch.autograd.grad(data.batch_loss(leaf, i.reshape(1)), leaf)[0])
    return torch.stack(rows)


@dataclass(frozen=True)
class PrivateGradients:
    """A client's data whose minibatch gradient (`batch_grad`) is DP-SGD's: per-example gradients clipped to `clip`,
    summed, noised with N(0, (noise_multiplier · clip)² I) from `generator`, divided by the minibatch size."""

    data: Any
    clip: float
    noise_multiplier: float
    generator: torch.Generator

    @property
    def num_examples(self) -> int:
        return self.data.num_examples

    def batch_loss(self, theta: Tensor, idx: Tensor) -> Tensor:
        return self.data.batch_loss(theta, idx)

    def batch_grad(self, theta: Tensor, idx: Tensor) -> Tensor:
        grads = per_example_gradients(self.data, theta, idx)
        norms = torch.linalg.vector_norm(grads, dim=1, keepdim=True)
        clipped = grads * (self.clip / norms).clamp(max=1.0).nan_to_num(1.0)
        total = clipped.sum(dim=0)
        if self.noise_multiplier > 0:
            total = total + gaussian_noise(total, self.noise_multiplier * self.clip, self.generator)
        return total / idx.numel()


@dataclass(frozen=True)
class PrivateAdam:
    """`LocalAdam` on `PrivateGradients` of the client's data: DP-Adam. No `solve_cohort`: the engine trains the
    clients one at a time."""

    adam: LocalAdam
    clip: float
    noise_multiplier: float
    needs_generator: ClassVar[bool] = True

    def solve_problem(self, problem: Any, data: Any, generator: torch.Generator) -> Any:
        private = PrivateGradients(data, self.clip, self.noise_multiplier, generator)
        return self.adam.solve_problem(problem, private, generator)


def round_step(adam: LocalAdam, size: int, noise_multiplier: float) -> tuple[Step, int]:
    """A client's round as the accountant sees it: ((σ, sampling rate B / N_k), its number of steps)."""
    rate = min(1.0, adam.batch_size / size)
    return (noise_multiplier, rate), math.ceil(size / adam.batch_size) * adam.epochs


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
def client_epsilon(adam: LocalAdam, size: int, noise_multiplier: float, rounds: int, dp: Any) -> float:
    """Client ε after `rounds` rounds of training on `size` examples (cached: clients of one size share it, and the
    budget asks again each round)."""
    step, count = round_step(adam, size, noise_multiplier)
    return epsilon([step] * (count * rounds), dp.delta, dp.accountant) if rounds else 0.0


def example_noise(algorithm: Algorithm, dp: Any, sizes: Mapping[int, int], rounds: int) -> float:
    """The noise multiplier with which no client spends more than `dp.epsilon` in `rounds` rounds: the largest of
    the clients' calibrated ones (Opacus's `get_noise_multiplier` for each distinct size)."""
    adam = _adam(algorithm)
    found = 0.0
    for size in sorted(set(sizes.values())):
        (_, rate), count = round_step(adam, size, 0.0)
        found = max(found, calibrated_noise(dp.epsilon, dp.delta, rate, count * rounds, dp.accountant))
    return found


def _adam(algorithm: Algorithm) -> LocalAdam:
    """The algorithm's local Adam; a ValueError naming the fix for a method trained otherwise."""
    local = algorithm.local
    if local is None or not isinstance(local.solver, LocalAdam):
        raise ValueError(
            f"{algorithm.name}: example-level DP is available for the methods trained by Adam's local solver "
            "(fedavg, fedprox, feddyn, fedlap); use dp level 'client' for the others"
        )
    return local.solver


def example_private(algorithm: Algorithm, dp: Any, noise_multiplier: float, sizes: Mapping[int, int]) -> Algorithm:
    """`algorithm` whose local Adam is DP-Adam (module docstring), clip `dp.clip`, noise `noise_multiplier`, with
    the clients' sizes `sizes` for the accounting and the budget `dp.epsilon` (the largest client ε)."""
    adam, local = _adam(algorithm), algorithm.local
    assert local is not None
    private_local = LocalStep(PrivateAdam(adam, dp.clip, noise_multiplier), local.prepare, local.finish)

    def worst(trained: Mapping[int, int], extra: int = 0, who: Any = ()) -> float:
        return max(
            client_epsilon(adam, sizes[k], noise_multiplier, trained.get(k, 0) + (extra if k in who else 0), dp)
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
    return algorithm._replace(
        init_server=init_server, init_client=init_client, broadcast=broadcast, server_update=server_update,
        posterior=posterior, client_update=update_from(algorithm.name, private_local), local=private_local,
        personal=personal, unlearn=None,
    )  # fmt: skip
