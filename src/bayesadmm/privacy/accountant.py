"""ε(δ) of a run's noised releases, by Opacus's accountants (the `dp` extra: `pip install bayesadmm[dp]`).

A run's accounting state is its history: one (noise multiplier, sampling rate) pair per noised round, kept in the
server state (so in the checkpoint: a resume gives the same ε). Nothing here computes a privacy loss itself: the
history is handed to Opacus's `RDPAccountant` or `PRVAccountant` in their own history format, and the noise for a
target ε is Opacus's `get_noise_multiplier`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["Step", "epsilon", "calibrated_noise", "opacus_history"]

Step = tuple[float, float]  # (noise multiplier σ, sampling rate q) of one noised release


def _accountants() -> Any:
    try:
        from opacus import accountants
    except ImportError:
        raise ImportError(
            "differential privacy needs Opacus's accountants: pip install 'bayesadmm[dp]' (or opacus==1.6.0)"
        ) from None
    return accountants


def opacus_history(steps: Sequence[Step]) -> list[tuple[float, float, int]]:
    """`steps` in Opacus's history format: runs of equal (σ, q) as (σ, q, count)."""
    history: list[tuple[float, float, int]] = []
    for sigma, rate in steps:
        if history and history[-1][:2] == (sigma, rate):
            history[-1] = (sigma, rate, history[-1][2] + 1)
        else:
            history.append((float(sigma), float(rate), 1))
    return history


def epsilon(steps: Sequence[Step], delta: float, accountant: str = "rdp") -> float:
    """The ε of (ε, δ)-DP after the releases `steps`: 0 for none, infinite where one had no noise."""
    if not steps:
        return 0.0
    if any(sigma == 0 for sigma, _ in steps):
        return math.inf
    tracker = _accountants().create_accountant(accountant)
    tracker.history = opacus_history(steps)
    return float(tracker.get_epsilon(delta=delta))


def calibrated_noise(target_epsilon: float, delta: float, rate: float, rounds: int, accountant: str = "rdp") -> float:
    """The noise multiplier with which `rounds` releases at sampling rate `rate` spend at most `target_epsilon`
    (Opacus's `get_noise_multiplier`, which searches to within its tolerance of 0.01 below the target)."""
    from opacus.accountants.utils import get_noise_multiplier

    _accountants()
    return float(
        get_noise_multiplier(
            target_epsilon=target_epsilon, target_delta=delta, sample_rate=rate, steps=rounds, accountant=accountant
        )
    )
