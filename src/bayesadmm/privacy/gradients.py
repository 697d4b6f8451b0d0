"""DP-SGD's private minibatch gradient (per-example clipping and Gaussian noise), for one client's solve
(`PrivateGradients`, the client's data seen through it) and for a cohort's step (`PrivateCohortGradients`, what a
cohort solver calls in place of `solvers.cohort.batch_gradients`).

A step's gradient of the mean loss becomes (Σ_i clip(g_i) + N(0, (σC)² I)) / B: every example's gradient g_i scaled
into the L2 ball of radius C, their sum noised, divided by B. With noise the minibatches are Poisson samples
(`solvers.cohort.poisson_minibatches`, what the accountant analyses) and B is their expected size min(batch size, N),
a public number, whatever the step drew (Opacus's way; a step that drew no example gives the noise / B); without
noise (ε infinite) the minibatches are the solver's shuffles and B is the minibatch's own size. Everything a solver
computes from it (Adam's moments, IVON's Hessian estimate ĝ∘ε/σ from its own weight noise ε) is post-processing.

The noise: each client's solve draws it from a noise generator of its own (`noise_generator`, seeded by one draw from
the client's generator before anything else of the solve), one N(0, I) vector per step in step order, so a cohort's
step draws every client's noise from that client's stream and the cohort's numbers are the per-client ones up to
rounding. The draws are torch's (`rng.randn`, on the CPU wherever the model runs), not the counter-based stream of
IVON's weight noise, whose 24-bit uniforms cut the Gaussian's tails.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.clients import scaled_nll_grad, take_rows
from bayesadmm.privacy.mechanism import gaussian_noise

__all__ = ["per_example_gradients", "clip_rows", "noise_generator", "PrivateGradients", "PrivateCohortGradients"]

# memory for one batched computation of per-example gradients in a cohort: a (rows, d) matrix and its intermediates
CHUNK_BYTES = 64 << 20


def per_example_gradients(data: Any, theta: Tensor, idx: Tensor) -> Tensor:
    """The (B, P) gradients of each example's loss `data.batch_loss(θ, [i])`: batched by the model's own
    `batched_gradients` (each example its own row) for a `SupervisedData` whose likelihood has `nll_grad`, else one
    example at a time through the data's `batch_grad` or autograd."""
    nll_grad = getattr(getattr(data, "likelihood", None), "nll_grad", None)
    if nll_grad is not None and getattr(getattr(data, "model", None), "written_out_backward", False):
        return _example_rows(data, theta.detach()[None], idx.reshape(1, -1), take_rows(data.y, idx)[None])
    rows = []
    for i in idx.reshape(-1):
        if hasattr(data, "batch_grad"):
            rows.append(data.batch_grad(theta, i.reshape(1)))
        else:
            leaf = theta.detach().requires_grad_(True)
            rows.append(torch.autograd.grad(data.batch_loss(leaf, i.reshape(1)), leaf)[0])
    return torch.stack(rows)


def clip_rows(grads: Tensor, clip: float) -> Tensor:
    """Each row scaled into the L2 ball of radius `clip` (a row of norm 0 stays 0), in place."""
    norms = torch.linalg.vector_norm(grads, dim=-1, keepdim=True)
    return grads.mul_((clip / norms).clamp_(max=1.0).nan_to_num_(1.0))


def noise_generator(generator: torch.Generator, noise_multiplier: float) -> torch.Generator | None:
    """A solve's noise stream: a CPU generator seeded by one draw from the client's `generator`; None (and no draw, so
    the solve is the non-private one's) without noise."""
    if noise_multiplier == 0:
        return None
    return torch.Generator().manual_seed(int(rng.stream_key(generator)))


def _noised(total: Tensor, std: float, generator: torch.Generator | None) -> Tensor:
    return total if generator is None else total.add_(gaussian_noise(total, std, generator))


@dataclass(frozen=True)
class PrivateGradients:
    """A client's data whose minibatch gradient (`batch_grad`) is DP-SGD's: per-example gradients clipped to `clip`,
    summed, noised with N(0, (noise_multiplier · clip)² I) from `generator` (None: no noise), divided by `expected`
    (Poisson minibatches' expected size; None: the minibatch's own size). `batch_loss` is the data's own (a solver
    that reads losses would see the data unprotected: the private solvers take gradients only)."""

    data: Any
    clip: float
    noise_multiplier: float
    generator: torch.Generator | None
    expected: int | None = None

    @property
    def num_examples(self) -> int:
        return self.data.num_examples

    @property
    def gradient_noise(self) -> float | None:
        """The variance (σC/B)² of each coordinate of `batch_grad`'s noise, a public number (DP-IVON removes its
        share of the Hessian update: `optim.ivon`, "Gradients with known noise"); None without noise, or where the
        divisor is each minibatch's own size."""
        if self.generator is None or self.expected is None:
            return None
        return (self.noise_multiplier * self.clip / self.expected) ** 2

    def batch_loss(self, theta: Tensor, idx: Tensor) -> Tensor:
        return self.data.batch_loss(theta, idx)

    def batch_grad(self, theta: Tensor, idx: Tensor) -> Tensor:
        if idx.numel() == 0:  # a Poisson minibatch that drew no example: the noise alone
            total = torch.zeros_like(theta.detach())
        else:
            total = clip_rows(per_example_gradients(self.data, theta, idx), self.clip).sum(dim=0)
        return _noised(total, self.noise_multiplier * self.clip, self.generator) / (self.expected or idx.numel())


@dataclass(frozen=True)
class PrivateCohortGradients:
    """`solvers.cohort.batch_gradients` made private: each active client's gradient of step t is `PrivateGradients`'
    for its minibatch, its noise from its own stream. `generators`: the noise generators in the order of the cohort
    (`StackedClients`), None each without noise. `batch_size`: the solver's, for Poisson minibatches, whose sum is
    divided by their expected size min(batch_size, N_k); None: by the minibatch's own size."""

    clip: float
    noise_multiplier: float
    generators: Sequence[torch.Generator | None]
    batch_size: int | None = None

    def gradient_noise(self, client: int, size: int) -> float | None:
        """`PrivateGradients.gradient_noise` of the cohort's client `client` (its index in the cohort), of `size`
        examples."""
        if self.generators[client] is None or self.batch_size is None:
            return None
        return (self.noise_multiplier * self.clip / min(self.batch_size, size)) ** 2

    def __call__(self, data: Any, plan: Any, t: int, thetas: Tensor) -> Tensor:
        """(A, 1, d): the private gradients of the A = plan.active[t] first clients of `plan` at thetas (A, 1, d)."""
        active, samples, dim = thetas.shape
        if samples != 1:
            raise ValueError("example-level DP takes one gradient per step (mc_samples=1)")
        cut = plan.longest[t]  # the step's largest minibatch (the others padded to it)
        counts = plan.counts[:active, t].tolist()
        out = torch.empty((active, dim), dtype=thetas.dtype, device=thetas.device)
        per_chunk = max(1, CHUNK_BYTES // max(1, cut * dim * thetas.element_size()))
        for start in range(0, active, per_chunk):
            stop = min(active, start + per_chunk)
            if cut > 0:
                rows = plan.rows[t, start:stop, :cut]
                grads = _example_rows(data, thetas[start:stop, 0], rows, plan.targets[t, start:stop, :cut])
                grads = clip_rows(grads, self.clip).view(stop - start, cut, dim)
            else:  # no client's Poisson minibatch drew an example this step
                grads = thetas.new_zeros((stop - start, 1, dim))
            for slot in range(start, stop):
                n = counts[slot]
                total = grads[slot - start, :n].sum(dim=0)  # zeros where the minibatch is empty
                client = plan.order[slot]
                noise = self.generators[client]
                size = n if self.batch_size is None else min(self.batch_size, data.sizes[client])
                out[slot] = _noised(total, self.noise_multiplier * self.clip, noise) / size
        return out.unsqueeze(1)


def _example_rows(data: Any, thetas: Tensor, rows: Tensor, targets: Tensor) -> Tensor:
    """(A·b, d): the gradient of each example of `rows` (A, b) of `data.X` (targets (A, b, ...)) at its client's θ
    (thetas (A, d)), by the model's `batched_gradients` with one example per row (a client's minibatch, or a
    cohort's)."""
    active, width = rows.shape
    x = take_rows(data.X, rows.reshape(-1)).unsqueeze(1)
    y = targets.reshape(active * width, 1, *targets.shape[2:])
    flat = thetas.repeat_interleave(width, dim=0)
    nll_grad = getattr(data.likelihood, "nll_grad", None)
    one = None if nll_grad is None else functools.partial(scaled_nll_grad, nll_grad, 1.0)
    return data.model.batched_gradients(flat, x, data.likelihood.mean_nll, y, loss_grad=one)
