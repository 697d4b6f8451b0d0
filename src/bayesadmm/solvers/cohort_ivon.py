"""`IVONSolver.solve` for a cohort of clients at once.

Each client's solve starts as `solve` starts it (`IVONSolver.setup`: its moments, terms and the noise key drawn from its
generator), its shuffles are drawn next from the same generator (`plan_batches`), and its posterior is read off as
`solve` reads it (`IVONSolver.result`). In between, the clients' IVON states are the rows of (K, d) matrices and every
step is batched: the minibatch gradients at the clients' samples (`batch_gradients`), IVON's update by the fused
kernel `update_step_` on the rows of the active clients seen as one long vector (every per-client quantity, ess
included, laid out per coordinate), and the next samples by `sample_rows_step` with each client's own noise block
(`rng.block_key` of its key and its step); both of the solver's kernels (`IVONSolver.kernels`: compiled or eager).
The arithmetic per coordinate is `solve`'s, so the results are its results up to the rounding of the batched
products.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.optim import ivon
from bayesadmm.solvers.cohort import CohortGradients, StackedClients, batch_gradients, plan_batches
from bayesadmm.solvers.von import SolveResult, SubproblemError, VariationalProblem

if TYPE_CHECKING:
    from bayesadmm.solvers.ivon import IVONSolver


def ivon_cohort(
    solver: IVONSolver,
    problems: Sequence[VariationalProblem],
    data: StackedClients,
    generators: Sequence[torch.Generator],
    gradients: CohortGradients = batch_gradients,
) -> list[SolveResult]:
    """`solver.solve`'s result for each client's problem, in the order of `problems`; `gradients` computes each
    step's minibatch gradients at the samples (`batch_gradients`, or example-level DP's private ones).

    The step loop stays in this function: it updates the (K, d) row matrices in place and reads the noise keys and
    flat views set up just above it, which a helper would take as a dozen arguments."""
    setups = [solver.setup(p, data.clients[i], generators[i]) for i, p in enumerate(problems)]
    plan = plan_batches(data, solver.batch_size, solver.epochs, generators, solver.poisson)
    ordered = [setups[i] for i in plan.order]
    first = ordered[0]
    if any(s.state.step != first.state.step for s in ordered):
        raise ValueError("cohort IVON needs every client's solve to start at the same step count")
    like, scratch = first.state.mean, data.workspace

    def rows(name: str, source: str) -> Tensor:  # every client's scalar or vector `name` of `source` as one matrix
        return scratch.stack(name, [getattr(getattr(s, source), name).to(like.dtype) for s in ordered], like)

    mean, hess, momentum = (rows(f, "state") for f in ("mean", "hess", "momentum"))
    fixed = {f: rows(f, "terms") for f in ("delta", "prior_mean", "v", "u", "lr")}
    ess = rows("ess", "terms")
    # example-level DP's private gradients: each client's known noise variance, per coordinate (`IVONSolver.setup`
    # reads it off a single client's private data; a cohort's clients see their data through `gradients`)
    known = getattr(gradients, "gradient_noise", None)
    noises = [] if known is None else [known(i, data.sizes[i]) for i in plan.order]
    grad_noise = None
    if noises and all(n is not None for n in noises):
        grad_noise = scratch.stack("grad_noise", [torch.as_tensor(n, dtype=like.dtype) for n in noises], like)
    keys = [s.noise_key for s in ordered]
    k, d, samples, base = len(ordered), like.numel(), solver.mc_samples, first.state.step

    def block_keys(count: int, step: int) -> Tensor:
        return torch.stack([rng.block_key(key, step) for key in keys[:count]]).to(like.device)

    def flat(x: Tensor, count: int) -> Tensor:
        return x[:count].view(count * d)

    kernels = solver.kernels  # compiled or eager, as the solver's `compiled` says
    try:
        thetas, eps = kernels.sample_rows_step(
            mean, hess, fixed["delta"], ess, block_keys(k, base), samples
        )  # (K, S, d) each
        for t, active in enumerate(plan.active):
            grads = gradients(data, plan, t, thetas[:active])
            debias = 1.0 - first.terms.beta1_value ** (base + t + 1) if first.terms.debias else 1.0
            kernels.update_step_(
                flat(mean, active),
                flat(hess, active),
                flat(momentum, active),
                grads.transpose(0, 1).reshape(samples, active * d),
                eps[:active].transpose(0, 1).reshape(samples, active * d),
                *(flat(fixed[f], active) for f in ("delta", "prior_mean", "v", "u", "lr")),
                flat(ess, active),
                first.terms.beta1,
                first.terms.beta2,
                torch.as_tensor(debias, dtype=like.dtype, device=like.device),
                first.terms.clip_radius,
                None if grad_noise is None else flat(grad_noise, active),
            )
            following = plan.active[t + 1] if t + 1 < len(plan.active) else 0
            if following:  # the next step's samples of the clients that take it
                thetas, eps = kernels.sample_rows_step(
                    mean[:following],
                    hess[:following],
                    fixed["delta"][:following],
                    ess[:following],
                    block_keys(following, base + t + 1),
                    samples,
                )
    except ValueError as exc:  # as `solve`: IVON's precision stopped being positive
        raise SubproblemError(f"IVON's precision stopped being positive in a cohort solve: {exc}") from exc
    return _results(solver, problems, data, setups, plan.order, plan.steps, (mean, hess, momentum), base)


def _results(solver, problems, data, setups, order, steps, rows: tuple[Tensor, Tensor, Tensor], base: int):
    """Each client's `solver.result`, in the order of `problems`, from its row (slot) of the (K, d) mean, hessian and
    momentum after its `steps[slot]` steps."""
    mean, hess, momentum = rows
    results: list[SolveResult | None] = [None] * len(problems)
    for slot, i in enumerate(order):
        state = ivon.IVONState(mean[slot].clone(), hess[slot].clone(), momentum[slot].clone(), base + steps[slot])
        results[i] = solver.result(problems[i], data.clients[i], state, setups[i], steps[slot])
    return [r for r in results if r is not None]
