"""A cross-device split: many clients of Dirichlet sizes above a floor, each with its own label skew."""

from __future__ import annotations

import numpy as np
import torch

from bayesadmm.data.partitions._checks import _F64, _check_concentration, _check_split
from bayesadmm.data.partitions.allocation import _assign_by_counts, _by_class
from bayesadmm.data.partitions.sampling import _log_dirichlet

__all__ = ["sized_dirichlet"]


def sized_dirichlet(
    labels,
    num_clients: int,
    generator: torch.Generator,
    alpha1: float = 1.0,
    alpha2: float = 0.5,
    floor: int = 2,
) -> list[torch.Tensor]:
    r"""A natural-style split for many clients: Dirichlet sizes with a floor, and per-client label skew.

    * sizes: every client gets `floor` examples, and the other N − K·floor are shared by s ~ Dir(alpha1 1_K)
      (largest-remainder rounding, so the sizes add up to N exactly and none is below the floor);
    * labels: client k's classes follow π_k ~ Dir(alpha2 1_C): its n_k examples are apportioned over the classes
      by π_k among the classes that still have examples, clients in id order (a class that runs out is shared among
      the client's other classes in proportion to π_k). The last clients can therefore be less skewed than π_k.

    Each class's examples are shuffled once and handed out in client order (`_assign_by_counts`), so the split is
    a function of the generator.

    Returns:
        A partition: every index in exactly one client, each client at least `floor` examples.

    Raises:
        ValueError: fewer than K·floor examples, or bad arguments.
    """
    labels, num_clients, generator = _check_split(labels, num_clients, generator)
    alpha1 = _check_concentration(alpha1, "alpha1")
    alpha2 = _check_concentration(alpha2, "alpha2")
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 1:
        raise ValueError(f"floor must be an int >= 1 (every client's fewest examples), got {floor!r}")
    n = labels.numel()
    if n < num_clients * floor:
        raise ValueError(f"cannot give {num_clients} clients {floor} examples each from {n} examples")
    classes, members = _by_class(labels)
    shares = torch.exp(_log_dirichlet(torch.full((num_clients,), alpha1, dtype=_F64), generator)).numpy()
    sizes = floor + _apportion(n - num_clients * floor, shares)
    mixtures = torch.exp(_log_dirichlet(torch.full((num_clients, classes.numel()), alpha2, dtype=_F64), generator))
    remaining = np.array([m.numel() for m in members], dtype=np.int64)
    counts = np.zeros((num_clients, classes.numel()), dtype=np.int64)
    for k in range(num_clients):
        counts[k] = _classes_of(int(sizes[k]), mixtures[k].numpy(), remaining)
        remaining -= counts[k]
    return _assign_by_counts(members, torch.from_numpy(counts), n, generator)


def _apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """`total` items in proportion to `weights` (largest remainder, ties to the lower index), summing exactly."""
    quotas = total * weights / weights.sum()
    counts = np.floor(quotas).astype(np.int64)
    left = total - int(counts.sum())
    if left > 0:
        order = np.argsort(-(quotas - counts), kind="stable")
        counts[order[:left]] += 1
    return counts


def _classes_of(size: int, mixture: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """A client's class counts: `size` examples by `mixture` among the classes with examples left, none above
    what is left (the excess goes to the classes with room, by `mixture`, or by their room where it has none)."""
    counts = np.zeros_like(remaining)
    left = size
    while left > 0:
        room = remaining - counts
        weights = mixture * (room > 0)
        if weights.sum() <= 0:
            weights = room.astype(np.float64)
        counts += np.minimum(_apportion(left, weights), room)
        left = size - int(counts.sum())
    return counts
