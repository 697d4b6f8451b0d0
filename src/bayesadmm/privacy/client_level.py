"""Client-level (user-level) differential privacy of the server's sum, as a wrapper over an `Algorithm`.

Each round the server measures every participant's update against what it broadcast (`ClientUpdate`: FedAvg's
θ_k − θ_g, BayesADMM's η_k + ρ_s (λ_k − λ_g)), scales it into the L2 ball of radius C (`clip`), and adds Gaussian
noise N(0, (σC)² I) to the sum of the clipped updates (σ the noise multiplier); the method's own server update then
runs on replies rebuilt from that noised sum, which it aggregates by their sum or unweighted mean, so it releases a
function of the noised sum alone. The clients train as they would (their `client_update` and `local` are the
method's own, so cohorts batch as before); the server is trusted with the replies (central DP), and what it
publishes, each round's server state, is (ε, δ)-DP with respect to adding or removing one client's data.

Sampling, as the accountant analyses it (`accountant.epsilon` over the rounds, one (σ, q) each): with every client
in every round (participation 1), q = 1 and a rebuilt reply is base + clipped update + noise / participants. At
participation q < 1 the engine draws each client independently with probability q (`Algorithm.client_sampling`
"poisson", `engine.federation.participants`), the subsampled Gaussian mechanism of the accountant, and the noised
sum is divided by the expected number of participants qK, a public number, not by the number m drawn (which depends
on who was drawn): reply k is base + (m / qK) · clipped update + noise / qK, so that the replies' mean is
base + (Σ clipped updates + noise) / qK. A round that drew no client still releases the noise (base + noise / qK,
through the method's `ClientUpdate.empty_round`) and counts for the accountant.

A running-sum server (`ClientUpdate.running`: IVON-ADMM's and IVON-PVI's `incremental=true`) sums its replies,
the changes of the clients' terms, round after round. Under noise it is given the release itself,
Σ clip(u_k) + z + N_t · scale · broadcast (`released_sum`), at any participation: u_k a reply's change (in a
client's first reply, against scale × broadcast), N_t = K q (1 − q)^(t−1) the expected number of new clients (the
public count that replaces the replies' flags). IVON-ADMM's `proximal="participants"` server takes the sum of the
participants' steps Σ clip(d_k) + z the same way, with the expected number of participants Kq (`RunningSum.count`).
With `DPSettings.precision_clip` an update with a precision half is clipped and noised per half in the coordinates
of `Geometry`.

The noise of round t comes from `generator_of(seed, t, DP_NOISE)` alone. With σ = 0 (ε infinite) the clients are
drawn as without DP and a reply whose update lies in the ball passes unchanged, so a run with σ = 0 and a large clip
gives the bits of the method's own run.

Before each round the wrapper checks the budget: where the round would take ε past `DPSettings.epsilon`, its
broadcast raises `BudgetExhausted`, and the engine ends the run with status "budget" (resumable with a larger one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, Message
from bayesadmm.algorithms.client_update import ClientUpdate
from bayesadmm.engine.simulate import generator_of
from bayesadmm.privacy.accountant import Step, epsilon
from bayesadmm.privacy.mechanism import gaussian_noise
from bayesadmm.privacy.settings import DPSettings
from bayesadmm.trees import register

__all__ = ["PrivateServer", "BudgetExhausted", "private", "privatize", "noise_reply", "DP_NOISE"]

DP_NOISE = 10**9 + 10  # the noise's stream: generator_of(seed, round, DP_NOISE)


class BudgetExhausted(RuntimeError):
    """The next round would spend more than the privacy budget; the run ends before it."""


@register
class PrivateInfo(NamedTuple):
    """A private round's server info: the method's own, and the accounting."""

    server: tuple  # the method's info record
    dp_epsilon: float  # ε spent so far (δ of the settings)
    dp_noise_multiplier: float  # σ of this round
    dp_clipped: float  # the fraction of this round's updates that were clipped (0 in a round without participants)
    dp_median_norm: float  # the median L2 norm of what `clip` bounds of this round's updates (before clipping; 0
    # without participants): the whole update, or with a precision_clip its mean half (`Geometry`)
    dp_median_precision_norm: float  # the median L2 norm of the updates' precision half (0 where they have none)


@register
class PrivateServer(NamedTuple):
    inner: Any  # the method's server state
    steps: tuple[Step, ...]  # the accountant's history: (σ, q) of every noised round so far


class Geometry(NamedTuple):
    """Where a round's updates are clipped and noised. Without `precision_clip`: the L2 ball of radius `clip`, noise
    σ·clip on every coordinate. With it, for an update with a precision half (`ClientUpdate.precision_half`: a
    diagonal Gaussian's (u1, u2) = (Δλ₁, Δλ₂) against λ_g = (s_g∘m_g, −s_g/2)), in the coordinates
    (v1, v2) = (u1 + 2 m_g∘u2, u2): for the change from q_g to q_k, v1 = s_k∘(m_k − m_g), the precision-weighted
    change of the mean, small where the mean moves little, while u1 = s_k∘m_k − s_g∘m_g also holds m_g∘(s_k − s_g),
    the precision's change, which would take the mean half's clip. The update is scaled into the ellipsoid
    ‖v1‖²/C² + ‖v2‖²/C_p² ≤ 1 and the sum gets noise σC on v1's coordinates and σC_p on v2's: the Gaussian mechanism
    of sensitivity 1 and noise multiplier σ in the coordinates (v1/C, v2/C_p), accounted as the one ball is. The
    map is linear and fixed by the broadcast (public), so the server maps the noised sum back exactly."""

    clip: float
    precision_clip: float | None
    half: int  # where the precision half starts in the flat update (0: it has none)
    mix: Tensor | None  # 2 m_g, with a precision_clip

    @staticmethod
    def of(update: ClientUpdate, base: Message, keys: list[tuple[str, str]], clip: float, precision_clip: float | None):
        """The geometry of `update` against the broadcast `base` (`keys`: its (reply, broadcast) key pairs)."""
        half = base[keys[0][1]].numel() if update.precision_half else 0
        if precision_clip is None or not half:
            return Geometry(clip, None, half, None)
        lam1, lam2 = (base[b].reshape(-1) for _, b in keys)
        return Geometry(clip, precision_clip, half, -lam1 / lam2)  # 2 m_g = 2 λ₁ / s_g, s_g = −2λ₂

    def norms(self, u: Tensor) -> tuple[float, float]:
        """The L2 norms of what `clip` bounds of the flat update `u` and of its precision half (0 without one)."""
        u = u.double()
        precision = float(torch.linalg.vector_norm(u[self.half :])) if self.half else 0.0
        if self.mix is None:
            return float(torch.linalg.vector_norm(u)), precision
        return float(torch.linalg.vector_norm(u[: self.half] + self.mix.double() * u[self.half :])), precision

    def factor(self, norms: tuple[float, float]) -> float:
        """The factor that scales an update of these `norms` into the ball or the ellipsoid (1 inside it)."""
        return clip_scale(norms, self.clip, self.precision_clip)

    def noise(self, like: Tensor, noise_multiplier: float, generator: torch.Generator) -> Tensor:
        """The noise of the sum in the update's own coordinates (the mechanism's noise mapped back), `like`'s
        shape and dtype, drawn as `gaussian_noise` draws it."""
        if self.mix is None:
            return gaussian_noise(like, noise_multiplier * self.clip, generator)
        assert self.precision_clip is not None
        z = gaussian_noise(like, 1.0, generator)
        v1 = z[: self.half] * (noise_multiplier * self.clip)
        v2 = z[self.half :] * (noise_multiplier * self.precision_clip)
        return torch.cat([v1 - self.mix.to(like.dtype) * v2, v2])


def privatize(
    replies: Mapping[int, Message],
    base: Message,
    update: ClientUpdate,
    clip: float,
    noise_multiplier: float,
    generator: torch.Generator,
    expected: float | None = None,
    precision_clip: float | None = None,
) -> tuple[dict[int, Message], list[tuple[float, float]]]:
    """The replies rebuilt from the noised sum of their clipped updates, and the updates' norms (client order: of
    what `clip` bounds and of the precision half, `Geometry.norms`).

    Client k's update u_k (`update`'s keys, flattened) is scaled into the ball of radius `clip` (with
    `precision_clip`, the `Geometry`'s ellipsoid); its new reply is base + clipped u_k + z / m, with
    z ~ N(0, (noise_multiplier · clip)² I) (per half with `precision_clip`) and m the number of replies, so the
    replies' sum is m · base + Σ clipped u_k + z. With `expected` (Poisson sampling's expected number of replies,
    qK) it is base + (m / expected) · clipped u_k + z / expected instead, so that the replies' mean is
    base + (Σ clipped u_k + z) / expected whatever m. A reply whose update is in the ball (and with no noise, at
    `expected` None) is passed as it is, bit for bit."""
    ids = sorted(replies)
    keys = update.keys(replies[ids[0]], base)
    shapes = [base[b].shape for _, b in keys]
    geometry = Geometry.of(update, base, keys, clip, precision_clip)
    anchor = torch.cat([(update.scale * base[b]).reshape(-1) for _, b in keys])
    stretch = 1.0 if expected is None else len(ids) / expected
    out, norms = {}, []
    for k in ids:
        own = _anchor_of(replies[k], update, anchor)
        delta = _flat(replies[k], keys) - own
        norms.append(geometry.norms(delta))
        factor = geometry.factor(norms[-1]) * stretch
        out[k] = dict(replies[k]) if factor == 1.0 else _with(replies[k], keys, shapes, own + delta * factor)
    if noise_multiplier > 0:
        share = geometry.noise(anchor, noise_multiplier, generator) / (expected or len(ids))
        out = {
            k: _with(r, keys, shapes, torch.cat([r[key].reshape(-1) for key, _ in keys]) + share)
            for k, r in out.items()
        }
    return out, norms


def released_sum(
    replies: Mapping[int, Message],
    base: Message,
    update: ClientUpdate,
    clip: float,
    noise_multiplier: float,
    generator: torch.Generator,
    new: float,
    precision_clip: float | None = None,
) -> tuple[Message, list[tuple[float, float]]]:
    """What a running-sum server releases (`ClientUpdate.running`), in the reply's layout: Σ_k clip(u_k) + z +
    `new` · scale · broadcast, z ~ N(0, (noise_multiplier · clip)² I) (clip and noise per half with `precision_clip`,
    `Geometry`), and the updates' norms as `privatize` gives them. u_k is reply k's change, less scale × broadcast in
    a client's first reply (`anchor_weight`); `new` the expected number of new clients, so that the sum gains
    scale × broadcast for each without saying who. With no replies it is the noise and the new clients' terms
    alone. Its float64 sum (the server's running sum's precision) over the replies in client-id order."""
    keys = update.broadcast_keys(base)
    geometry = Geometry.of(update, base, keys, clip, precision_clip)
    anchor = torch.cat([(update.scale * base[b]).reshape(-1) for _, b in keys])
    anchor64 = anchor.double()
    total, norms = new * anchor64, []
    for k in sorted(replies):
        delta = _flat(replies[k], keys).double() - _anchor_of(replies[k], update, anchor64)
        norms.append(geometry.norms(delta))
        total = total + delta * geometry.factor(norms[-1])
    total = total + geometry.noise(anchor, noise_multiplier, generator).double()
    return _with({}, keys, [base[b].shape for _, b in keys], total), norms


def clip_scale(norms: tuple[float, float], clip: float, precision_clip: float | None) -> float:
    """min(1, 1/size) for an update of `norms` (`Geometry.norms`): size = ‖u‖/clip for the ball (`clip_factor`'s
    factor), √((‖v1‖/clip)² + (‖v2‖/precision_clip)²) for the ellipsoid of a `precision_clip`."""
    bound, precision = norms
    if precision_clip is None:
        return 1.0 if bound <= clip else clip / bound
    size = math.hypot(bound / clip, precision / precision_clip)
    return 1.0 if size <= 1 else 1.0 / size


def _anchor_of(reply: Message, update: ClientUpdate, anchor: Tensor) -> Tensor:
    """What reply's update is measured against: `anchor` (scale × broadcast), or for a running-sum server's reply
    `anchor` in a client's first reply and 0 after (`ClientUpdate.anchor_weight`)."""
    weight = update.anchor_weight(reply)
    return anchor if weight == 1.0 else anchor * weight


def noise_reply(
    base: Message,
    update: ClientUpdate,
    clip: float,
    noise_multiplier: float,
    expected: float,
    generator: torch.Generator,
) -> Message:
    """The reply of a round that drew no client: the update's entries of the broadcast `base` (times the update's
    scale) plus z / `expected`, z ~ N(0, (noise_multiplier · clip)² I), drawn as `privatize` draws it: the noised sum
    of no updates over the expected number of replies."""
    keys = update.broadcast_keys(base)
    anchor = torch.cat([(update.scale * base[b]).reshape(-1) for _, b in keys])
    noised = anchor + gaussian_noise(anchor, noise_multiplier * clip, generator) / expected
    return _with({}, keys, [base[b].shape for _, b in keys], noised)


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
    algorithm: Algorithm,
    update: ClientUpdate,
    dp: DPSettings,
    noise_multiplier: float,
    rate: float,
    seed: int,
    clients: int,
) -> Algorithm:
    """`algorithm` with client-level DP (module docstring): updates clipped to `dp.clip`, noise multiplier
    `noise_multiplier`, the `clients` clients sampled at rate `rate` (Poisson below 1) and accounted so with
    δ = `dp.delta`, budget `dp.epsilon`, the noise's stream derived from `seed`."""
    step: Step = (float(noise_multiplier), float(rate))
    poisson = rate < 1 and noise_multiplier > 0  # without noise ε is infinite: the clients are drawn as without DP
    expected = rate * clients if poisson else None  # the public denominator of the noised mean
    if dp.precision_clip is not None and not update.precision_half:
        raise ValueError(
            f"dp precision_clip bounds the precision half of a Bayesian method's update, which {algorithm.name}'s "
            "update has none of: leave it unset (one clip, dp_clip)"
        )
    if poisson and update.empty_round is None and update.running is None:
        raise ValueError(
            f"{algorithm.name} with client-level DP at participation < 1 needs its ClientUpdate.empty_round (a round "
            "may draw no client); give it one, or run with participation=1"
        )

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
        if update.running is not None and noise_multiplier > 0:  # a running sum: the noised sum released as it is
            new = update.running.count(clients, rate, len(server.steps) + 1)  # public: new clients, participants
            released, norms = released_sum(
                replies, base, update, dp.clip, noise_multiplier, generator, new, dp.precision_clip
            )
            inner, info = update.running.update(server.inner, released, new)
        elif replies or expected is None:
            noised, norms = privatize(
                replies, base, update, dp.clip, noise_multiplier, generator, expected, dp.precision_clip
            )
            inner, info = algorithm.server_update(server.inner, noised)
        else:  # Poisson sampling drew no client: the noise is released all the same, and the round counts
            assert update.empty_round is not None  # checked above
            reply = noise_reply(base, update, dp.clip, noise_multiplier, expected, generator)
            (inner, info), norms = update.empty_round(server.inner, reply), []
        steps = (*server.steps, step)
        report = PrivateInfo(
            info,
            epsilon(steps, dp.delta, dp.accountant),
            noise_multiplier,
            sum(clip_scale(n, dp.clip, dp.precision_clip) < 1 for n in norms) / max(1, len(norms)),
            float(torch.tensor([n for n, _ in norms]).median()) if norms else 0.0,
            float(torch.tensor([p for _, p in norms]).median()) if norms else 0.0,
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
        client_sampling="poisson" if poisson else algorithm.client_sampling,
    )
