r"""Gradients of many parameter vectors at once: what a cohort of clients needs at each local step.

Given ``S`` parameter vectors ``Θ (S, d)``, inputs ``X (S, B, ...)`` (row ``s``'s own minibatch) and a loss of one
row's outputs ``ℓ(F_s, *a_s)`` (with per-row arguments ``a``, e.g. the targets), ``F_s = f(X[s]; Θ[s])``, the
gradients are the ``(S, d)`` matrix whose row ``s`` is ``∂ℓ(F_s, *a_s)/∂Θ[s]``: each client's gradient of its own
loss.

Two routes. Any model: ``vmap`` of ``grad`` of the row's loss over the rows. A ``FlatModel`` run from its plan
(``Flatten``, ``Linear`` and elementwise activations, see ``models.functional``): the forward pass as batched matrix
products on views of ``Θ`` and the backward pass written out, each layer's weight gradient computed straight into its
block of the output matrix. Autograd is then used only for ``∂ℓ/∂F`` (any likelihood), or not at all where the caller
gives ``∂ℓ/∂F`` in closed form (``loss_grad``: a cohort of 5's gradients take 1.90 ms a call with it, 2.60 ms with
autograd of the cross-entropy), and the per-step costs of the generic route go: vmap's batching of every operation, and
the copy that assembles the flat gradient from the layers' pieces. For the papers' MLP in cohorts of 5 to 32 vmap's
route takes 1.37-2.00x the written-out one's time (``python benchmarks/batched_gradients.py``, docs/performance.md).
The two agree to rounding (tests/models/test_batched.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.func import grad, vmap

__all__ = ["plan_gradients", "vmap_gradients"]


def vmap_gradients(
    forward: Callable[[Tensor, Tensor], Tensor],
    thetas: Tensor,
    X: Tensor,
    loss: Callable[..., Tensor],
    *args: Tensor,
) -> Tensor:
    """Any model: ``vmap`` over the rows of ``grad`` of ``loss(forward(θ, x), *a)``, a new (S, d) tensor."""

    def row_loss(theta: Tensor, x: Tensor, *row_args: Tensor) -> Tensor:
        return loss(forward(theta, x), *row_args)

    return vmap(grad(row_loss))(thetas, X, *args)


@torch.no_grad()  # autograd only for the loss (thetas may require grad; out= products refuse autograd)
def plan_gradients(
    plan: Sequence[tuple],
    slots: Sequence[Any],
    thetas: Tensor,
    X: Tensor,
    loss: Callable[..., Tensor],
    args: Sequence[Tensor],
    out: Tensor,
    loss_grad: Callable[..., Tensor] | None = None,
) -> Tensor:
    """A plan-run FlatModel (its ``_plan`` and its parameters' ``_slots``: numel and shape of each): the gradients
    written into ``out`` (S, d), which is returned. ``loss_grad(outputs, *args)``, where given, is the gradient of
    the rows' summed losses with respect to the outputs (S, N, ...) in closed form, used instead of autograd."""
    count = thetas.shape[0]
    numels = [slot.numel for slot in slots]
    # every parameter of every row as a view (S, *shape): one split and a view each (a step's fixed cost is its
    # number of calls into torch, which for a client or two weighs as much as the products)
    params = [p.view(count, *slot.shape) for p, slot in zip(thetas.split_with_sizes(numels, 1), slots, strict=True)]
    grads = [g.view(count, *slot.shape) for g, slot in zip(out.split_with_sizes(numels, 1), slots, strict=True)]
    if X.is_floating_point() and X.dtype != thetas.dtype:
        X = X.to(thetas.dtype)
    h, trail = _forward(plan, params, X, count)
    if loss_grad is not None:
        delta = loss_grad(h, *args)
    else:
        outputs = h.detach().requires_grad_()
        with torch.enable_grad():
            (delta,) = torch.autograd.grad(vmap(loss)(outputs, *args).sum(), outputs)
    _backward(trail, delta, params, grads, count)
    return out


def _forward(plan: Sequence[tuple], params: list[Tensor], X: Tensor, count: int) -> tuple[Tensor, list[tuple]]:
    """`plan_gradients`' forward pass of the S = `count` rows: the outputs, and what the backward pass needs of each
    step (in forward order)."""
    trail: list[tuple] = []  # what the backward pass needs of each step, in forward order
    h = X
    for step in plan:
        if step[0] == "linear":
            flat_in = h if h.dim() == 3 else h.reshape(count, -1, h.shape[-1])
            z = torch.bmm(flat_in, params[step[1]].transpose(1, 2))
            if step[2] is not None:  # (a separate add_ is a little faster than baddbmm on a CPU)
                z.add_(params[step[2]].unsqueeze(1))
            trail.append((step, flat_in, h.shape))
            h = z if h.dim() == 3 else z.view(*h.shape[:-1], z.shape[-1])
        elif step[0] == "act":
            h = step[1](h)
            trail.append((step, h, None))
        else:  # flatten: the plan's dims are of one example's batch, one more leading dim here
            start, end = step[1], step[2]
            trail.append((step, None, h.shape))
            h = h.flatten(start + 1 if start >= 0 else start, end + 1 if end >= 0 else end)
    return h, trail


def _backward(trail: list[tuple], delta: Tensor, params: list[Tensor], grads: list[Tensor], count: int) -> None:
    """`plan_gradients`' backward pass from the outputs' gradient `delta`, writing each parameter's gradient into its
    view in `grads` (down to the first linear step: the inputs need no gradient)."""
    first_linear = next(i for i, (step, _, _) in enumerate(trail) if step[0] == "linear")
    for i in range(len(trail) - 1, first_linear - 1, -1):
        step, saved, shape = trail[i]
        if step[0] == "linear":
            flat_delta = delta if delta.dim() == 3 else delta.reshape(count, -1, delta.shape[-1])
            torch.bmm(flat_delta.transpose(1, 2), saved, out=grads[step[1]])
            if step[2] is not None:
                torch.sum(flat_delta, dim=1, out=grads[step[2]])
            if i > first_linear:  # the images need no gradient
                delta = torch.bmm(flat_delta, params[step[1]])
                if len(shape) != 3:
                    delta = delta.view(shape)
        elif step[0] == "act":
            if step[2] is not None:  # the activation's backward from its output (None: the identity)
                delta = step[2](delta, saved)
        else:
            delta = delta.reshape(shape)
