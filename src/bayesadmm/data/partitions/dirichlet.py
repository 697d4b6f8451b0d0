"""Dirichlet splits: :func:`two_level_dirichlet` (the papers') and :func:`per_class_dirichlet`."""

from __future__ import annotations

import torch

from bayesadmm.data.partitions._checks import _F64, _check_concentration, _check_enough_examples, _check_split
from bayesadmm.data.partitions.allocation import _assign_by_counts, _by_class, _counts_from_log_weights
from bayesadmm.data.partitions.sampling import _log_dirichlet


def two_level_dirichlet(
    labels,
    num_clients: int,
    generator: torch.Generator,
    alpha1: float = 1.0,
    alpha2: float = 0.5,
) -> list[torch.Tensor]:
    r"""The two-level Dirichlet split of the FedLap paper (App. E.1).

    With K clients and C classes (the distinct values in ``labels``):

    * client sizes s ~ Dir(alpha1 1_K) (how much data each client has);
    * class mixtures pi_k ~ Dir(alpha2 1_C) per client (what it has);
    * A_kc = s_k pi_kc, and class c's n_c examples, shuffled, are divided
      among the clients in proportion A_kc / sum_k' A_k'c, rounded by largest
      remainder so that the counts add up to n_c exactly.

    Small alpha1 concentrates the data on few clients, small alpha2 the
    classes within a client.  With the defaults on a balanced 10-class set
    and 10 clients, a couple of clients typically hold half of the data and a
    client's top 4 classes most of its examples (the statistics the paper
    quotes; see :func:`describe`).

    Empty clients: a client whose shares round to no examples at all (common
    for many clients, small alpha1 or few examples) is given one example
    from the currently largest client, of its own largest-A_kc class among
    those the donor holds.  This moves at most K examples, uses no further
    random draws (the split stays a function of the seed), and is needed
    because a federated client without data cannot run.

    Returns:
        A partition: every index in exactly one client, none empty.

    Raises:
        ValueError: fewer examples than clients, or bad arguments.
    """
    labels, num_clients, generator = _check_split(labels, num_clients, generator)
    alpha1 = _check_concentration(alpha1, "alpha1")
    alpha2 = _check_concentration(alpha2, "alpha2")
    _check_enough_examples(labels.numel(), num_clients)
    classes, members = _by_class(labels)

    log_s = _log_dirichlet(torch.full((num_clients,), alpha1, dtype=_F64), generator)
    log_pi = _log_dirichlet(torch.full((num_clients, classes.numel()), alpha2, dtype=_F64), generator)
    # log A_kc; _apportion normalises each class's column over the clients.
    return _split_by_log_weights(members, log_s[:, None] + log_pi, labels.numel(), generator)


def per_class_dirichlet(
    labels,
    num_clients: int,
    generator: torch.Generator,
    alpha: float = 0.5,
) -> list[torch.Tensor]:
    r"""Per-class Dirichlet split: class c goes to the clients by p_c ~ Dir(alpha 1_K).

    Each class's examples, shuffled, are divided among the K clients in
    proportion to its own p_c (largest-remainder rounding).  Client sizes are
    then whatever the classes add up to (about N/K on average).

    Empty clients are repaired as in :func:`two_level_dirichlet` (one
    example from the largest client, of the class with the largest p_ck).

    Returns:
        A partition: every index in exactly one client, none empty.

    Raises:
        ValueError: fewer examples than clients, or bad arguments.
    """
    labels, num_clients, generator = _check_split(labels, num_clients, generator)
    alpha = _check_concentration(alpha, "alpha")
    _check_enough_examples(labels.numel(), num_clients)
    classes, members = _by_class(labels)

    log_p = _log_dirichlet(torch.full((classes.numel(), num_clients), alpha, dtype=_F64), generator)
    return _split_by_log_weights(members, log_p.T, labels.numel(), generator)


def _split_by_log_weights(
    members: list[torch.Tensor], log_w: torch.Tensor, num_examples: int, generator: torch.Generator
) -> list[torch.Tensor]:
    """Class j's examples over the clients in proportion to exp(log_w[:, j]), no client empty."""
    counts = _counts_from_log_weights([m.numel() for m in members], log_w)
    return _assign_by_counts(members, counts, num_examples, generator)
