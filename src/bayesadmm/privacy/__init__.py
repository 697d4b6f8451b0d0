"""Differential privacy of a run (docs/guides/privacy.md): `DPSettings`, client-level DP of the server's sum
(`client_level`), example-level DP of Adam's local training (`example_level`), the accounting by Opacus
(`accountant`) and the budget (`BudgetExhausted`).

`private_factory` turns a method's factory into that of its private version, with the noise `noised` chooses, for
`bayesadmm.assemble`, which every entry point builds a run's algorithm with.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from bayesadmm.algorithms.base import Algorithm
from bayesadmm.algorithms.client_update import ClientUpdate
from bayesadmm.privacy.accountant import calibrated_noise, epsilon
from bayesadmm.privacy.client_level import DP_NOISE, BudgetExhausted, PrivateServer, private, privatize
from bayesadmm.privacy.example_level import example_noise, example_private
from bayesadmm.privacy.mechanism import clip_factor, gaussian_noise, noised_sum
from bayesadmm.privacy.settings import DPSettings

__all__ = [
    "DPSettings",
    "ClientUpdate",
    "BudgetExhausted",
    "PrivateServer",
    "private",
    "private_factory",
    "noised",
    "privatize",
    "sampling_rate",
    "epsilon",
    "calibrated_noise",
    "clip_factor",
    "gaussian_noise",
    "noised_sum",
    "DP_NOISE",
    "example_private",
    "example_noise",
]


def sampling_rate(participation: float) -> float:
    """Client-level DP's sampling rate q: each client takes part in a round with probability `participation`
    (Poisson sampling, `engine.federation.participants`), every client at 1."""
    return min(1.0, float(participation))


def noised(
    make: Callable[[], Algorithm],
    spec: Any,
    hparams: Any,
    dp: DPSettings,
    *,
    participation: float,
    sizes: Mapping[int, int],
    rounds: int,
) -> DPSettings:
    """`dp` with the noise multiplier the run uses: its own, or the one with which `rounds` rounds spend
    `dp.epsilon` (at level "example", the largest of the clients': `example_level.example_noise`). `make`, `spec`,
    `hparams`, `sizes` as `private_factory`'s; a ValueError naming the fix where the method cannot be private in the
    way asked, before any noise is calibrated."""
    if dp.level == "example":
        sigma = dp.noise_multiplier
        if sigma is None:
            sigma = example_noise(make(), dp, sizes, rounds)  # refuses a method not trained by Adam or IVON
        return dataclasses.replace(dp, noise_multiplier=sigma)
    name = getattr(spec, "name", "this algorithm")
    if spec is None or spec.dp_update is None:
        raise ValueError(
            f"{name} has no client-level DP (its replies are not an update the server sums); "
            "use fedavg, fedprox, ivon-admm or ivon-pvi, or declare the method's MethodSpec.dp_update"
        )
    rate = sampling_rate(participation)
    if spec.dp_update(hparams).every_round and rate < 1:
        raise ValueError(
            f"{name} with client-level DP needs participation=1: its server sums every client's last reply, which "
            "would reuse a reply's share of an old round's noise; set incremental=true (the running-sum server, "
            "which releases each round's noised changes; for ivon-admm also proximal=participants, the round's "
            "noised steps), or use fedavg or fedprox"
        )
    sigma = dp.noise_multiplier
    if sigma is None:
        assert dp.epsilon is not None  # DPSettings requires one of the two
        sigma = calibrated_noise(dp.epsilon, dp.delta, rate, rounds, dp.accountant)
    return dataclasses.replace(dp, noise_multiplier=sigma)


def private_factory(
    make: Callable[[], Algorithm],
    spec: Any,
    hparams: Any,
    dp: DPSettings,
    *,
    participation: float,
    sizes: Mapping[int, int],
    rounds: int,
    seed: int,
) -> Callable[[], Algorithm]:
    """The zero-argument factory of `make`'s algorithm with the DP of `dp` (picklable where `make` is): `spec` is
    the method's `MethodSpec` (its `dp_update` says what a reply's update is; None for an algorithm given as an
    object or factory, which has none), `hparams` its hyperparameters, `sizes` the clients' sizes (client id → N_k).
    The noise multiplier is `dp`'s, or calibrated to its budget (`noised`). A ValueError naming the fix where the
    method cannot be private in the way asked."""
    dp = noised(make, spec, hparams, dp, participation=participation, sizes=sizes, rounds=rounds)
    sigma = dp.noise_multiplier
    assert sigma is not None  # `noised` chose it
    if dp.level == "example":
        example_private(make(), dp, sigma, sizes)  # refuses a method whose solver cannot take private gradients
        return functools.partial(_build_example, make, dp, sigma, dict(sizes))
    update = spec.dp_update(hparams)
    rate = sampling_rate(participation)
    private(make(), update, dp, sigma, rate, seed, len(sizes))  # refuses a method without an empty round at q < 1
    return functools.partial(_build, make, update, dp, sigma, rate, seed, len(sizes))


def _build_example(make: Callable[[], Algorithm], dp: DPSettings, sigma: float, sizes: dict[int, int]) -> Algorithm:
    return example_private(make(), dp, sigma, sizes)


def _build(
    make: Callable[[], Algorithm],
    update: ClientUpdate,
    dp: DPSettings,
    sigma: float,
    rate: float,
    seed: int,
    clients: int,
) -> Algorithm:
    return private(make(), update, dp, sigma, rate, seed, clients)
