"""Differential privacy of a run (docs/guides/privacy.md): `DPSettings`, client-level DP of the server's sum
(`client_level`), the accounting by Opacus (`accountant`) and the budget (`BudgetExhausted`).

`private_factory` turns a method's factory into that of its private version, for `bayesadmm.run(dp=...)` and the
command line's `dp=client` keys.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from bayesadmm.algorithms.base import Algorithm
from bayesadmm.privacy.accountant import calibrated_noise, epsilon
from bayesadmm.privacy.client_level import DP_NOISE, BudgetExhausted, PrivateServer, private, privatize
from bayesadmm.privacy.mechanism import clip_factor, gaussian_noise, noised_sum
from bayesadmm.privacy.message import ClientUpdate
from bayesadmm.privacy.settings import DPSettings

__all__ = [
    "DPSettings",
    "ClientUpdate",
    "BudgetExhausted",
    "PrivateServer",
    "private",
    "private_factory",
    "privatize",
    "sampling_rate",
    "epsilon",
    "calibrated_noise",
    "clip_factor",
    "gaussian_noise",
    "noised_sum",
    "DP_NOISE",
]


def sampling_rate(participation: float, clients: int) -> float:
    """The accountant's sampling rate: the clients the engine draws per round (`engine.federation.participants`:
    all, or ⌈participation · K⌉) over the K clients."""
    if participation >= 1.0:
        return 1.0
    return max(1, math.ceil(participation * clients)) / clients


def private_factory(
    make: Callable[[], Algorithm],
    spec: Any,
    hparams: Any,
    dp: DPSettings,
    *,
    participation: float,
    clients: int,
    rounds: int,
    seed: int,
) -> Callable[[], Algorithm]:
    """The zero-argument factory of `make`'s algorithm with the DP of `dp` (picklable where `make` is): `spec` is
    the method's `MethodSpec` (its `dp_update` says what a reply's update is; None for an algorithm given as an
    object or factory, which has none), `hparams` its hyperparameters. The noise multiplier is `dp`'s, or the one
    with which `rounds` rounds spend `dp.epsilon`. A ValueError naming the fix where the method cannot be private
    in the way asked."""
    name = getattr(spec, "name", "this algorithm")
    if dp.level == "example":
        raise ValueError(
            "dp level 'example' (per-example clipping in the local solver) is not available yet; use level='client'"
        )
    if spec is None or spec.dp_update is None:
        raise ValueError(
            f"{name} has no client-level DP (its replies are not an update the server sums); "
            "use fedavg, fedprox, ivon-admm or ivon-pvi, or declare the method's MethodSpec.dp_update"
        )
    update = spec.dp_update(hparams)
    rate = sampling_rate(participation, clients)
    if update.every_round and rate < 1:
        raise ValueError(
            f"{name} with client-level DP needs participation=1: its server sums every client's last reply, which "
            "would reuse a reply's share of an old round's noise; use fedavg or fedprox for partial participation"
        )
    sigma = dp.noise_multiplier
    if sigma is None:
        assert dp.epsilon is not None  # DPSettings requires one of the two
        sigma = calibrated_noise(dp.epsilon, dp.delta, rate, rounds, dp.accountant)
    return functools.partial(_build, make, update, dp, sigma, rate, seed)


def _build(
    make: Callable[[], Algorithm], update: ClientUpdate, dp: DPSettings, sigma: float, rate: float, seed: int
) -> Algorithm:
    return private(make(), update, dp, sigma, rate, seed)
