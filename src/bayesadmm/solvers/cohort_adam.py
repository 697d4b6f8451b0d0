"""`LocalAdam.train` for a cohort of clients at once: their parameters as the rows of one (K, d) matrix, each step's
minibatch gradients by `solvers.cohort.batch_gradients`, and Adam's update (defaults β = (0.9, 0.999), ε = 1e-8) on
the rows of the clients that take that step, seen as one vector, by torch's fused Adam: the ATen operation
`torch._fused_adam_` that `torch.optim.Adam(fused=True)` runs, one pass over the vectors, called directly: without
torch.optim's Python wrapper (its grouping of the tensors and its checks, at every step) and without a torch.compile'd
kernel's guards, a step's fixed cost is a few calls into torch.

Each client keeps its own problem (a, b, c of `solvers.adam`), its own shuffles (drawn from its generator by
`plan_batches`) and its own step count; a client that has taken all its steps leaves the active set (the rows are
ordered so that the active clients are a prefix). The extra terms' gradient is summed as `LocalAdam.train` sums it
(weight decay, linear, proximal: `ExtraTerms`), in scratch matrices kept from step to step, so the results are
`train`'s up to the rounding of the batched products.

Why the terms are not folded into fewer passes, e.g. b⊙θ into the fused Adam's weight decay and −b⊙c into a shift
made once: b⊙θ − b⊙c is not b⊙(θ − c) in floating point. A weight whose data gradient is exactly zero (a pixel that is
zero in every image) then gets the rounding residue, about 1e-11, as its gradient instead of exactly zero, and Adam's
normalised step turns that into a full step of the learning rate in a random direction; in float32 it doubled the
number of weights that drift more than 1e-3 from the per-client results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from bayesadmm.checks import all_finite
from bayesadmm.solvers.cohort import CohortGradients, StackedClients, Workspace, batch_gradients, plan_batches

if TYPE_CHECKING:
    from bayesadmm.solvers.adam import AdamProblem, LocalAdam

BETA1, BETA2, EPS = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults, which LocalAdam.train uses


def _stacked(values: Sequence[Tensor | float], like: Tensor) -> Tensor:
    """Per-client numbers or vectors as a (K, 1) or (K, d) tensor in the dtype and device of `like`, one client's
    vector (d,)."""
    if all(not torch.is_tensor(v) or v.dim() == 0 for v in values):
        return torch.tensor([float(v) for v in values], dtype=like.dtype, device=like.device)[:, None]
    return torch.stack([torch.as_tensor(v, dtype=like.dtype, device=like.device).expand_as(like) for v in values])


class ExtraTerms(NamedTuple):
    """The chosen problems' extra terms, whose gradient wd·θ + a + b⊙(θ − c) each step adds to the active clients'
    minibatch gradients, summed as `LocalAdam.train` sums them (the same elementwise operations in the same order,
    so the same bits) in scratch rows of the workspace instead of fresh temporaries. A b or c that every client
    shares (FedProx's μ and θ_g) is kept once, not stacked per client."""

    decay: float  # wd
    linear: Tensor | None  # (K, d) a_k, None where no client has one
    weight: Tensor | float  # b: one number for all, or (K, 1) / (K, d) per client; 0.0: no proximal term
    center: Tensor | None  # (1, d) c for all, or (K, d) per client
    scratch: Workspace

    @classmethod
    def of(cls, adam: LocalAdam, chosen: Sequence[AdamProblem], scratch: Workspace, like: Tensor) -> ExtraTerms:
        linear = None
        if any(p.linear is not None for p in chosen):
            zero = torch.zeros((), dtype=like.dtype, device=like.device)
            linear = scratch.stack("linear", [zero if p.linear is None else p.linear for p in chosen], like)
        weights = [p.prox_weight for p in chosen]
        if not any(torch.is_tensor(w) or w != 0.0 for w in weights):
            return cls(adam.weight_decay, linear, 0.0, None, scratch)
        numbers = [float(w) if not torch.is_tensor(w) or w.dim() == 0 else None for w in weights]
        first = numbers[0]
        weight = first if first is not None and all(n == first for n in numbers) else _stacked(weights, like)
        centers = [(p.theta0 if p.prox_center is None else p.prox_center).detach() for p in chosen]
        if all(c is centers[0] for c in centers):
            center = centers[0][None]
        else:
            center = scratch.stack("center", centers, like)
        return cls(adam.weight_decay, linear, weight, center, scratch)

    def add_to(self, grads: Tensor, params: Tensor) -> None:
        """Add the terms' gradient at `params` (A, d), the first A clients', to their `grads`."""
        active = params.shape[0]
        linear = extra = None if self.linear is None else self.linear[:active]
        if self.decay:
            extra = torch.mul(params, self.decay, out=self.scratch.rows("extra", active, params[0]))
            if linear is not None:
                extra.add_(linear)
        if self.center is not None:
            pull = self.scratch.rows("pull", active, params[0])
            center = self.center if self.center.shape[0] == 1 else self.center[:active]
            torch.sub(params, center, out=pull).mul_(
                self.weight if isinstance(self.weight, float) else self.weight[:active]
            )
            extra = pull if extra is None else pull.add_(extra)
        if extra is not None:
            grads.add_(extra)


def adam_cohort(
    adam: LocalAdam,
    problems: Sequence[AdamProblem],
    data: StackedClients,
    generators: Sequence[torch.Generator],
    gradients: CohortGradients = batch_gradients,
) -> list[tuple[Tensor, int]]:
    """(θ_k, steps) of each client's problem, in the order of `problems`, as `adam.train` gives them; `gradients`
    computes each step's minibatch gradients (`batch_gradients`, or example-level DP's private ones)."""
    plan = plan_batches(data, adam.batch_size, adam.epochs, generators, adam.poisson)
    chosen = [problems[i] for i in plan.order]
    like, scratch = chosen[0].theta0, data.workspace
    theta = scratch.stack("theta", [p.theta0.detach() for p in chosen], like)
    terms = ExtraTerms.of(adam, chosen, scratch, like)
    first, second = scratch.rows("first", len(chosen), like).zero_(), scratch.rows("second", len(chosen), like).zero_()

    # flat views of the state: the active clients' rows are a prefix, so each step's operands are one slice each
    flat_theta, flat_first, flat_second = theta.view(-1), first.view(-1), second.view(-1)
    width = theta.shape[1]
    step = torch.zeros((), dtype=torch.float32, device=like.device)  # as torch.optim.Adam(fused=True) keeps it
    for t, active in enumerate(plan.active):
        rows, flat = slice(0, active), slice(0, active * width)
        params = theta[rows]
        grads = gradients(data, plan, t, params.unsqueeze(1)).squeeze(1)
        terms.add_to(grads, params)
        # Adam's step t + 1 for every active client, on their rows as one vector: the one fused pass that
        # torch.optim.adam.adam(..., fused=True) runs after counting the step, called without its Python wrapper (its
        # weight decay is 0: the terms' gradient has it)
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
