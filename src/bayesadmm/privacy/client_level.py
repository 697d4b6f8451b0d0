"""Client-level (user-level) differential privacy of the server's sum, as a wrapper over an `Algorithm`.

Each round the server measures every participant's update against what it broadcast (`ClientUpdate`: FedAvg's
θ_k − θ_g, BayesADMM's η_k + ρ_s (λ_k − λ_g)), scales it into the L2 ball of radius C (`clip`), and adds Gaussian
noise N(0, (σC)² I) to the sum of the clipped updates (σ the noise multiplier); the method's own server update then
runs on replies rebuilt from that noised sum (base + clipped update + noise / participants), which it aggregates by
their sum or unweighted mean, so it releases a function of the noised sum alone. The clients train as they would
(their `client_update` and `local` are the method's own, so cohorts batch as before); the server is trusted with
the replies (central DP), and what it publishes, each round's server state, is (ε, δ)-DP with respect to adding or
removing one client's data (`accountant.epsilon` over the rounds at sampling rate participants / clients).

The noise of round t comes from `generator_of(seed, t, DP_NOISE)` alone. With σ = 0 a reply whose update lies in the
ball passes unchanged, so a run with σ = 0 and a large clip gives the bits of the method's own run.

Before each round the wrapper checks the budget: where the round would take ε past `DPSettings.epsilon`, its
broadcast raises `BudgetExhausted`, and the engine ends the run with status "budget" (resumable with a larger one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, Message
from bayesadmm.engine.simulate import generator_of
from bayesadmm.privacy.accountant import Step, epsilon
from bayesadmm.privacy.mechanism import clip_factor, gaussian_noise
from bayesadmm.privacy.message import ClientUpdate
from bayesadmm.privacy.settings import DPSettings
from bayesadmm.trees import register

__all__ = ["PrivateServer", "BudgetExhausted", "private", "privatize", "DP_NOISE"]

DP_NOISE = 10**9 + 10  # the noise's stream: generator_of(seed, round, DP_NOISE)


class BudgetExhausted(RuntimeError):
    """The next round would spend more than the privacy budget; the run ends before it."""


@register
class PrivateInfo(NamedTuple):
    """A private round's server info: the method's own, and the accounting."""

    server: tuple  # the method's info record
    dp_epsilon: float  # ε spent so far (δ of the settings)
    dp_noise_multiplier: float  # σ of this round
    dp_clipped: float  # the fraction of this round's updates that were clipped
    dp_median_norm: float  # the median L2 norm of this round's updates (before clipping): a guide for the clip


@register
class PrivateServer(NamedTuple):
    inner: Any  # the method's server state
    steps: tuple[Step, ...]  # the accountant's history: (σ, q) of every noised round so far


def privatize(
    replies: Mapping[int, Message],
    base: Message,
    update: ClientUpdate,
    clip: float,
    noise_multiplier: float,
    generator: torch.Generator,
) -> tuple[dict[int, Message], list[float]]:
    """The replies rebuilt from the noised sum of their clipped updates, and the updates' L2 norms (client order).

    Client k's update u_k (`update`'s keys, flattened) is scaled into the ball of radius `clip`; its new reply is
    base + clipped u_k + z / m, with z ~ N(0, (noise_multiplier · clip)² I) and m the number of replies, so the
    replies' sum is m · base + Σ clipped u_k + z. A reply whose update is in the ball (and with no noise) is
    passed as it is, bit for bit."""
    ids = sorted(replies)
    keys = update.keys(replies[ids[0]], base)
    shapes = [base[b].shape for _, b in keys]
    anchor = torch.cat([(update.scale * base[b]).reshape(-1) for _, b in keys])
    out, norms = {}, []
    for k in ids:
        delta = _flat(replies[k], keys) - anchor
        norms.append(float(torch.linalg.vector_norm(delta.double())))
        factor = clip_factor(delta, clip)
        out[k] = dict(replies[k]) if factor == 1.0 else _with(replies[k], keys, shapes, anchor + delta * factor)
    if noise_multiplier > 0:
        share = gaussian_noise(anchor, noise_multiplier * clip, generator) / len(ids)
        out = {
            k: _with(r, keys, shapes, torch.cat([r[key].reshape(-1) for key, _ in keys]) + share)
            for k, r in out.items()
        }
    return out, norms


def _flat(reply: Message, keys: list[tuple[str, str]]) -> Tensor:
    """The reply's update entries as one flat vector, in `keys`' order."""
    return torch.cat([reply[key].reshape(-1) for key, _ in keys])


def _with(reply: Message, keys: list[tuple[str, str]], shapes: list, flat: Tensor) -> Message:
    """`reply` with its update entries read from the flat vector `flat` (in `keys`' order)."""
    new, start = dict(reply), 0
    for (key, _), shape in zip(keys, shapes, strict=True):
        size = shape.numel()
        new[key] = flat[start : start + size].reshape(shape)
        start += size
    return new


def private(
    algorithm: Algorithm, update: ClientUpdate, dp: DPSettings, noise_multiplier: float, rate: float, seed: int
) -> Algorithm:
    """`algorithm` with client-level DP (module docstring): updates clipped to `dp.clip`, noise multiplier
    `noise_multiplier`, accounted at sampling rate `rate` with δ = `dp.delta`, budget `dp.epsilon`, the noise's
    stream derived from `seed`."""
    step: Step = (float(noise_multiplier), float(rate))

    def init_server(theta0: Tensor) -> PrivateServer:
        return PrivateServer(algorithm.init_server(theta0), ())

    def broadcast(server: PrivateServer) -> Message:
        if dp.epsilon is not None:
            after = epsilon((*server.steps, step), dp.delta, dp.accountant)
            if after > dp.epsilon:
                spent = epsilon(server.steps, dp.delta, dp.accountant)
                raise BudgetExhausted(
                    f"privacy budget: round {len(server.steps) + 1} would take ε from {spent:.4g} to {after:.4g}, "
                    f"past the budget ε = {dp.epsilon:g} (δ = {dp.delta:g}); resume with a larger dp_epsilon to go on"
                )
        return algorithm.broadcast(server.inner)

    def server_update(server: PrivateServer, replies: Mapping[int, Message]) -> tuple[PrivateServer, PrivateInfo]:
        generator = generator_of(seed, len(server.steps) + 1, DP_NOISE)
        base = algorithm.broadcast(server.inner)
        noised, norms = privatize(replies, base, update, dp.clip, noise_multiplier, generator)
        inner, info = algorithm.server_update(server.inner, noised)
        steps = (*server.steps, step)
        report = PrivateInfo(
            info,
            epsilon(steps, dp.delta, dp.accountant),
            noise_multiplier,
            sum(n > dp.clip for n in norms) / len(norms),
            float(torch.tensor(norms).median()),
        )
        return PrivateServer(inner, steps), report

    def posterior(server: PrivateServer) -> Any:
        return algorithm.posterior(server.inner)

    def init_client(server: PrivateServer, client_id: int) -> Any:
        return algorithm.init_client(server.inner, client_id)

    inner_personal = algorithm.personal
    personal = None if inner_personal is None else (lambda server, state: inner_personal(server.inner, state))
    return algorithm._replace(
        init_server=init_server,
        init_client=init_client,
        broadcast=broadcast,
        server_update=server_update,
        posterior=posterior,
        personal=personal,
        unlearn=None,  # the server's sum is noised: there is no client term to take out of it
    )
