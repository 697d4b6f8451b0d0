"""Turning per-client weights into disjoint index lists: the helpers the splits share."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from bayesadmm.data.partitions._checks import _F64


def _apportion(total: int, log_weights: torch.Tensor) -> torch.Tensor:
    """Split ``total`` items in proportion to exp(log_weights), summing exactly.

    Largest-remainder (Hamilton) rounding: every share gets the floor of its
    quota total * w_k / sum(w), and the items left over go, one each, to the
    shares with the largest fractional parts (ties to the lower index, so the
    result is deterministic).
    """
    quotas = total * torch.softmax(log_weights.to(_F64), dim=0)
    counts = torch.floor(quotas).to(torch.int64)
    left = total - int(counts.sum())
    # Floors of quotas that sum to `total` leave between 0 and K - 1 items;
    # the clamp guards against rounding in the quotas' last bit.
    left = max(0, min(left, counts.numel()))
    if left:
        order = torch.argsort(quotas - counts.to(_F64), descending=True, stable=True)
        counts[order[:left]] += 1
    return counts


def _by_class(labels: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The distinct labels (sorted) and, for each, the increasing indices of its examples.

    One stable argsort instead of a scan of all labels per class.
    """
    order = torch.argsort(labels, stable=True)
    classes, sizes = torch.unique_consecutive(labels[order], return_counts=True)
    return classes, list(torch.split(order, sizes.tolist()))


def _assign_by_counts(
    members: Sequence[torch.Tensor], counts: torch.Tensor, num_examples: int, generator: torch.Generator
) -> list[torch.Tensor]:
    """Give client k ``counts[k, j]`` random examples from ``members[j]``.

    Each class's examples are shuffled once and cut into consecutive chunks
    in client order, so the chunks are disjoint.  The clients' index lists
    are then read off an owner vector with one stable sort, which returns
    each client's indices in increasing order.
    """
    num_clients = counts.shape[0]
    owner = torch.full((num_examples,), -1, dtype=torch.int64)
    clients = torch.arange(num_clients)
    for j, idx in enumerate(members):
        take = counts[:, j]
        shuffled = idx[torch.randperm(idx.numel(), generator=generator)]
        owner[shuffled[: int(take.sum())]] = torch.repeat_interleave(clients, take)
    order = torch.argsort(owner, stable=True)
    sizes = torch.bincount(owner[owner >= 0], minlength=num_clients)
    unassigned = num_examples - int(sizes.sum())
    return list(torch.split(order[unassigned:], sizes.tolist()))


def _counts_from_log_weights(sizes: Sequence[int], log_w: torch.Tensor) -> torch.Tensor:
    """(K, C) example counts from log weights log_w[k, j], no client left empty.

    Class j's n_j examples are apportioned over the clients in proportion to
    exp(log_w[:, j]) (largest remainder).  Then every client that got
    nothing receives one example from the currently largest client, of the
    class it weights most among the classes that client holds.

    Why a repair and not a redraw: a client whose share is below about
    1/(2 N) rounds to zero examples, and with many clients this happens in
    almost every draw (two-level Dirichlet with K = 100, N = 1000: nearly
    always), so redrawing until no client is empty would be slow and would
    condition on a rare event.  The repair moves at most one example per
    empty client, uses no random draws, and never empties the donor: while
    some client is empty and N >= K, the largest client has at least two
    examples.
    """
    counts = torch.stack([_apportion(n, log_w[:, j]) for j, n in enumerate(sizes)], dim=1)
    for k in (counts.sum(dim=1) == 0).nonzero().flatten().tolist():
        donor = int(torch.argmax(counts.sum(dim=1)))  # first of the largest
        held = counts[donor] > 0
        j = int(torch.argmax(torch.where(held, log_w[k], torch.full_like(log_w[k], -math.inf))))
        counts[donor, j] -= 1
        counts[k, j] += 1
    return counts
