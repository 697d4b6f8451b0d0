"""Optimizers over natural parameters: FedEP's ServerOptim and ClientOptim (Guo et al., ICLR 2023, Sec. 2.2.3).

A damped EP update adds δ·Δ to a natural tuple λ = (η, −½Λ) (a site or the global approximation), with Δ the change
the clients' tilted distributions ask for (Guo et al. 2023 read damping as adaptive optimization). These objects turn
Δ, seen as an ascent direction, into the step that is added instead, in the style of optax: `init(like)` gives the
optimizer state for a tuple laid out like `like`, `step(delta, state)` returns (step, new state); both are pure.

    Identity()          step = Δ                                    (plain damped EP)
    Momentum(lr, β)     m ← βm + Δ,  step = lr·m                     (heavy-ball SGD; the paper's server SGD m = 0.9)
    Adam(lr, β1, β2, ε) step = lr · m̂ / (√v̂ + ε), elementwise       (Kingma & Ba 2015, bias-corrected moments)

They act on the tuple as it is stored (λ₂ = −½Λ, not Λ; for Adam, which is invariant to a fixed per-coordinate scale
up to ε, this only matters for the learning rate).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from bayesadmm.families import natural as nat
from bayesadmm.trees import register

Natural = tuple[Tensor, ...]


class NaturalOptimizer(Protocol):
    def init(self, like: Natural) -> Any:
        """The state before the first step, for tuples laid out like `like`."""

    def step(self, delta: Natural, state: Any) -> tuple[Natural, Any]:
        """(the step to add, the new state) for the ascent direction `delta`."""


class Identity(NamedTuple):
    """step = Δ: plain damped EP."""

    def init(self, like: Natural) -> tuple:
        return ()

    def step(self, delta: Natural, state: tuple) -> tuple[Natural, tuple]:
        return delta, state


@register
class MomentumState(NamedTuple):
    trace: Natural


class Momentum(NamedTuple):
    """Heavy-ball SGD treating Δ as the (ascent) gradient: m ← βm + Δ, step = lr·m (the paper's server SGD m=0.9)."""

    lr: float = 1.0
    beta: float = 0.9

    def init(self, like: Natural) -> MomentumState:
        return MomentumState(nat.zeros_like(like))

    def step(self, delta: Natural, state: MomentumState) -> tuple[Natural, MomentumState]:
        trace = nat.add(nat.scale(state.trace, self.beta), delta)
        return nat.scale(trace, self.lr), MomentumState(trace)


@register
class AdamState(NamedTuple):
    count: Tensor  # type: ignore[assignment]   # steps taken (0-d int64); shadows tuple.count
    m: Natural  # first moment
    v: Natural  # second moment


class Adam(NamedTuple):
    """Adam on the natural parameters, Δ as the ascent direction: step = lr · m̂ / (√v̂ + ε), elementwise."""

    lr: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def init(self, like: Natural) -> AdamState:
        return AdamState(torch.zeros((), dtype=torch.int64), nat.zeros_like(like), nat.zeros_like(like))

    def step(self, delta: Natural, state: AdamState) -> tuple[Natural, AdamState]:
        count = state.count + 1
        m = tuple(self.beta1 * a + (1 - self.beta1) * d for a, d in zip(state.m, delta, strict=True))
        v = tuple(self.beta2 * a + (1 - self.beta2) * d * d for a, d in zip(state.v, delta, strict=True))
        c1 = 1 - self.beta1 ** int(count)
        c2 = 1 - self.beta2 ** int(count)
        step = tuple(self.lr * (a / c1) / (torch.sqrt(b / c2) + self.eps) for a, b in zip(m, v, strict=True))
        return step, AdamState(count, m, v)
