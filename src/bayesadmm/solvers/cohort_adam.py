"""`LocalAdam.train` for a cohort of clients at once: their parameters as the rows of one (K, d) matrix, each step's
minibatch gradients by `solvers.cohort.batch_gradients`, and Adam's update (defaults β = (0.9, 0.999), ε = 1e-8) on
the rows of the clients that take that step, seen as one vector, by torch's fused Adam: the ATen operation
`torch._fused_adam_` that `torch.optim.Adam(fused=True)` runs, one pass over the vectors, called directly: without
torch.optim's Python wrapper (its grouping of the tensors and its checks, at every step) and without a torch.compile'd
kernel's guards, a step's fixed cost is a few calls into torch.

Each client keeps its own problem (a, b, c of `solvers.adam`), its own shuffles (drawn from its generator by
`plan_batches`) and its own step count; a client that has taken all its steps leaves the active set (the rows are
ordered so that the active clients are a prefix). The extra terms' gradient is added in `LocalAdam.train`'s order
(weight decay, linear, proximal), so the results are `train`'s up to the rounding of the batched products.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from bayesadmm.checks import all_finite
from bayesadmm.solvers.cohort import StackedClients, batch_gradients, plan_batches

if TYPE_CHECKING:
    from bayesadmm.solvers.adam import AdamProblem, LocalAdam

BETA1, BETA2, EPS = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults, which LocalAdam.train uses


def _stacked(values: Sequence[Tensor | float], like: Tensor) -> Tensor:
    """Per-client numbers or vectors as a (K, 1) or (K, d) tensor in `like`'s dtype and device."""
    if all(not torch.is_tensor(v) or v.dim() == 0 for v in values):
        return torch.tensor([float(v) for v in values], dtype=like.dtype, device=like.device)[:, None]
    return torch.stack([torch.as_tensor(v, dtype=like.dtype, device=like.device).expand_as(like[0]) for v in values])


def adam_cohort(
    adam: LocalAdam, problems: Sequence[AdamProblem], data: StackedClients, generators: Sequence[torch.Generator]
) -> list[tuple[Tensor, int]]:
    """(θ_k, steps) of each client's problem, in the order of `problems`, as `adam.train` gives them."""
    plan = plan_batches(data, adam.batch_size, adam.epochs, generators)
    chosen = [problems[i] for i in plan.order]
    like, scratch = chosen[0].theta0, data.workspace
    theta = scratch.stack("theta", [p.theta0.detach() for p in chosen], like)
    linear = None
    if any(p.linear is not None for p in chosen):
        zero = torch.zeros((), dtype=like.dtype, device=like.device)
        linear = scratch.stack("linear", [zero if p.linear is None else p.linear for p in chosen], like)
    has_prox = any(torch.is_tensor(p.prox_weight) or p.prox_weight != 0.0 for p in chosen)
    weight = center = None
    if has_prox:
        weight = _stacked([p.prox_weight for p in chosen], theta)
        centers = [(p.theta0 if p.prox_center is None else p.prox_center).detach() for p in chosen]
        center = scratch.stack("center", centers, like)
    first, second = scratch.rows("first", len(chosen), like).zero_(), scratch.rows("second", len(chosen), like).zero_()

    # flat views of the state: the active clients' rows are a prefix, so each step's operands are one slice each
    flat_theta, flat_first, flat_second = theta.view(-1), first.view(-1), second.view(-1)
    width = theta.shape[1]
    step = torch.zeros((), dtype=torch.float32, device=like.device)  # as torch.optim.Adam(fused=True) keeps it
    for t, active in enumerate(plan.active):
        rows, flat = slice(0, active), slice(0, active * width)
        params = theta[rows]
        grads = batch_gradients(data, plan, t, params.unsqueeze(1)).squeeze(1)
        extra = adam.weight_decay * params if adam.weight_decay else None
        if linear is not None:
            extra = linear[rows] if extra is None else extra + linear[rows]
        if weight is not None and center is not None:
            pull = weight[rows] * (params - center[rows])
            extra = pull if extra is None else extra + pull
        if extra is not None:
            grads.add_(extra)
        # Adam's step t + 1 for every active client, on their rows as one vector: the one fused pass that
        # torch.optim.adam.adam(..., fused=True) runs after counting the step, called without its Python wrapper
        step.fill_(t + 1)
        torch._fused_adam_(
            [flat_theta[flat]],
            [grads.view(-1)],
            [flat_first[flat]],
            [flat_second[flat]],
            [],
            [step],
            lr=adam.lr,
            beta1=BETA1,
            beta2=BETA2,
            weight_decay=0.0,
            eps=EPS,
            amsgrad=False,
            maximize=False,
        )
    if not all_finite(theta):
        raise FloatingPointError("local training diverged (non-finite parameters); lower the learning rate")
    results: list[tuple[Tensor, int]] = [(torch.empty(0), 0)] * len(problems)
    for slot, i in enumerate(plan.order):
        results[i] = (theta[slot].clone(), plan.steps[slot])
    return results
