"""Splits that ignore the labels: :func:`iid` and :func:`subsample`."""

from __future__ import annotations

import math

import torch

from bayesadmm.data.partitions._checks import (
    _check_enough_examples,
    _check_generator,
    _check_positive_int,
    _check_split,
)


def iid(labels, num_clients: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Uniformly random split into sizes that differ by at most one.

    A random permutation of all N indices is cut into ``num_clients``
    consecutive pieces; the first ``N mod K`` clients get one extra example.
    Labels are only used for N.

    Raises:
        ValueError: fewer examples than clients, or bad arguments.
    """
    labels, num_clients, generator = _check_split(labels, num_clients, generator)
    _check_enough_examples(labels.numel(), num_clients)
    perm = torch.randperm(labels.numel(), generator=generator)
    return [torch.sort(chunk)[0] for chunk in torch.tensor_split(perm, num_clients)]


def subsample(num_examples: int, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """A uniformly random subset of ``round(fraction * num_examples)`` indices (at least 1), sorted.

    For the "10 % of the training set" scenarios: ``labels[idx]`` is then
    split among clients, and client indices map back through ``idx``.

    Raises:
        ValueError: ``num_examples`` not a positive int, or ``fraction`` not
            in (0, 1].
    """
    num_examples = _check_positive_int(num_examples, "num_examples")
    generator = _check_generator(generator)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
    # floor(x + 0.5) rather than round(): no banker's rounding at .5.
    size = max(1, min(num_examples, math.floor(fraction * num_examples + 0.5)))
    return torch.sort(torch.randperm(num_examples, generator=generator)[:size])[0]
