"""Client splits of a labelled dataset for federated simulations.

Every split is a pure function of the labels, its settings and an explicit
:class:`torch.Generator`; the global RNG is never touched, so one seed gives
one split on every machine and run, whatever else the process does.  A split
is a ``list[Tensor]``: for each client the int64 indices (into ``labels``) of
its examples, in increasing order.

The splits:

* :func:`iid` -- a uniformly random split into (near-)equal sizes.
* :func:`two_level_dirichlet` -- the FedLap paper's App. E.1 split, used by
  both papers: Dirichlet client sizes *and* Dirichlet class mixtures.
* :func:`per_class_dirichlet` -- the common per-class Dirichlet split
  (each class spread over the clients by proportions ~ Dir(alpha)).
* :func:`classes_per_client` -- MNIST's "highly heterogeneous 100 clients":
  every client holds a few classes with a fixed number of examples each.
* :func:`subsample` -- a random fraction of a dataset ("10 % of the training
  set").

The first three assign every example to exactly one client and never leave a
client empty (the Dirichlet splits give an empty client one example of the
largest client, see :func:`two_level_dirichlet`); :func:`classes_per_client`
assigns each example to at most one client.  :func:`label_counts`,
:func:`heterogeneity`, :func:`describe` and :func:`plot_label_distribution`
summarise a split.

Randomness: Dirichlet vectors are normalised Gamma variates, and neither
``torch.distributions.Dirichlet.sample`` nor ``torch._standard_gamma`` takes a
generator, so :func:`sample_gamma` implements Marsaglia and Tsang's (2000)
rejection sampler on top of ``torch.randn``/``torch.rand(generator=...)``.
All sampling is done in float64 on the CPU, whatever the default dtype.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Sequence

import torch

__all__ = [
    "PARTITIONS",
    "classes_per_client",
    "describe",
    "heterogeneity",
    "iid",
    "label_counts",
    "make_partition",
    "per_class_dirichlet",
    "plot_label_distribution",
    "sample_dirichlet",
    "sample_gamma",
    "subsample",
    "two_level_dirichlet",
]

_F64 = torch.float64


# ---------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------


def _check_labels(labels) -> torch.Tensor:
    labels = torch.as_tensor(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {tuple(labels.shape)}")
    if labels.dtype == torch.bool or labels.dtype.is_floating_point or labels.dtype.is_complex:
        raise ValueError(f"labels must have an integer dtype, got {labels.dtype}")
    return labels.to(device="cpu", dtype=torch.int64)


def _check_generator(generator) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            "generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)); "
            f"got {type(generator).__name__}. Splits never use the global RNG."
        )
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU generator (all draws are on the CPU), got one on {generator.device}")
    return generator


def _check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _check_concentration(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _check_enough_examples(n: int, num_clients: int) -> None:
    if n < num_clients:
        raise ValueError(f"cannot give {num_clients} clients at least one example each from {n} examples")


# ---------------------------------------------------------------------------
# Generator-aware Gamma and Dirichlet sampling
# ---------------------------------------------------------------------------


def _log_gamma_variates(concentration: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    r"""log G with G ~ Gamma(a, 1) elementwise, by Marsaglia and Tsang (2000).

    For a >= 1, with d = a - 1/3 and c = 1/sqrt(9d): draw x ~ N(0, 1) and
    u ~ U(0, 1), set v = (1 + c x)^3, and accept d v when v > 0 and
    log u < x^2/2 + d (1 - v + log v); the density of accepted d v is exactly
    Gamma(a, 1) (acceptance rate > 0.95 for all a >= 1).  For a < 1 the
    sampler is run with a + 1 and "boosted": G_a = G_{a+1} U^{1/a},
    U ~ U(0, 1], since Beta(a, 1) x Gamma(a + 1) = Gamma(a).

    The result is returned as a logarithm because U^{1/a} underflows to 0 for
    small a (a = 0.01 and U = 1e-4 give 1e-400): in log space a Dirichlet is
    a softmax and stays well defined for any a > 0.

    Rejected elements are redrawn together in vectorised rounds until all are
    accepted; the number and order of draws depend only on the generator's
    state, so the result is reproducible.
    """
    a = concentration.to(_F64)
    boost = a < 1
    d = torch.where(boost, a + 1, a) - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    flat_d, flat_c = d.reshape(-1), c.reshape(-1)
    log_g = torch.empty_like(flat_d)
    pending = torch.arange(flat_d.numel())
    while pending.numel() > 0:
        dd, cc = flat_d[pending], flat_c[pending]
        x = torch.randn(pending.numel(), generator=generator, dtype=_F64)
        u = torch.rand(pending.numel(), generator=generator, dtype=_F64)
        v = (1.0 + cc * x) ** 3
        positive = v > 0
        log_v = torch.log(torch.where(positive, v, torch.ones_like(v)))
        accept = positive & (torch.log(u) < 0.5 * x * x + dd * (1.0 - v + log_v))
        log_g[pending[accept]] = torch.log(dd[accept]) + log_v[accept]
        pending = pending[~accept]
    log_g = log_g.reshape(a.shape)
    if bool(boost.any()):
        # 1 - rand() lies in (0, 1], so log U is finite.
        u = 1.0 - torch.rand(a.shape, generator=generator, dtype=_F64)
        log_g = torch.where(boost, log_g + torch.log(u) / a, log_g)
    return log_g


def _as_concentration(concentration) -> torch.Tensor:
    conc = torch.as_tensor(concentration, dtype=_F64)
    if not bool(torch.isfinite(conc).all()) or not bool((conc > 0).all()):
        raise ValueError("concentration parameters must be positive and finite")
    return conc


def sample_gamma(concentration, generator: torch.Generator) -> torch.Tensor:
    r"""Draw G ~ Gamma(a, 1) for every element a of ``concentration``.

    The density is p(g) = g^{a-1} e^{-g} / Gamma(a), with mean a and
    variance a.  Marsaglia and Tsang's rejection sampler (with the
    G_a = G_{a+1} U^{1/a} boost for a < 1) driven only by ``generator``, so
    unlike ``torch.distributions.Gamma`` it is reproducible without touching
    the global RNG.  Scale by theta for Gamma(a, theta).

    Args:
        concentration: positive shape parameters a (any shape).
        generator: the only source of randomness.

    Returns:
        float64 tensor of the shape of ``concentration``.  For very small a
        (below about 0.01) values may underflow to 0; :func:`sample_dirichlet`
        avoids this by working with logarithms.
    """
    return torch.exp(_log_gamma_variates(_as_concentration(concentration), _check_generator(generator)))


def _log_dirichlet(concentration: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Log of a Dirichlet draw along the last axis (a log-softmax of log-Gammas)."""
    return torch.log_softmax(_log_gamma_variates(concentration, generator), dim=-1)


def sample_dirichlet(concentration, generator: torch.Generator) -> torch.Tensor:
    r"""Draw p ~ Dir(a) along the last axis of ``concentration``.

    p_i = G_i / sum_j G_j with independent G_i ~ Gamma(a_i, 1), computed as a
    softmax of log G so that small a do not give 0/0.  Leading axes are
    independent draws.

    Returns:
        float64 tensor of the shape of ``concentration``, non-negative, summing
        to 1 along the last axis.
    """
    conc = _as_concentration(concentration)
    if conc.ndim == 0:
        raise ValueError("a Dirichlet concentration needs at least one axis")
    return torch.exp(_log_dirichlet(conc, _check_generator(generator)))


# ---------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------


def iid(labels, num_clients: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Uniformly random split into sizes that differ by at most one.

    A random permutation of all N indices is cut into ``num_clients``
    consecutive pieces; the first ``N mod K`` clients get one extra example.
    Labels are only used for N.

    Raises:
        ValueError: fewer examples than clients, or bad arguments.
    """
    labels = _check_labels(labels)
    num_clients = _check_positive_int(num_clients, "num_clients")
    generator = _check_generator(generator)
    _check_enough_examples(labels.numel(), num_clients)
    perm = torch.randperm(labels.numel(), generator=generator)
    return [torch.sort(chunk)[0] for chunk in torch.tensor_split(perm, num_clients)]


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
    labels = _check_labels(labels)
    num_clients = _check_positive_int(num_clients, "num_clients")
    generator = _check_generator(generator)
    alpha1 = _check_concentration(alpha1, "alpha1")
    alpha2 = _check_concentration(alpha2, "alpha2")
    _check_enough_examples(labels.numel(), num_clients)
    classes, members = _by_class(labels)

    log_s = _log_dirichlet(torch.full((num_clients,), alpha1, dtype=_F64), generator)
    log_pi = _log_dirichlet(torch.full((num_clients, classes.numel()), alpha2, dtype=_F64), generator)
    # log A_kc; _apportion normalises each class's column over the clients.
    counts = _counts_from_log_weights([m.numel() for m in members], log_s[:, None] + log_pi)
    return _assign_by_counts(members, counts, labels.numel(), generator)


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
    labels = _check_labels(labels)
    num_clients = _check_positive_int(num_clients, "num_clients")
    generator = _check_generator(generator)
    alpha = _check_concentration(alpha, "alpha")
    _check_enough_examples(labels.numel(), num_clients)
    classes, members = _by_class(labels)

    log_p = _log_dirichlet(torch.full((classes.numel(), num_clients), alpha, dtype=_F64), generator)
    counts = _counts_from_log_weights([m.numel() for m in members], log_p.T)
    return _assign_by_counts(members, counts, labels.numel(), generator)


def _class_slots(capacity: torch.Tensor, total: int, generator: torch.Generator) -> torch.Tensor:
    """How many clients hold each class: as equal as the capacities allow.

    Water-filling: the largest level t with sum_c min(cap_c, t) <= total sets
    r_c = min(cap_c, t); the few slots still missing go, one each, to random
    classes that can take one more.
    """
    level = 0
    while int(torch.clamp(capacity, max=level + 1).sum()) <= total and level + 1 <= int(capacity.max()):
        level += 1
    slots = torch.clamp(capacity, max=level)
    left = total - int(slots.sum())
    if left:
        room = (capacity > level).nonzero().flatten()
        chosen = room[torch.randperm(room.numel(), generator=generator)[:left]]
        slots[chosen] += 1
    return slots


def classes_per_client(
    labels,
    num_clients: int,
    generator: torch.Generator,
    classes: int = 2,
    per_class: int = 300,
) -> list[torch.Tensor]:
    r"""Every client gets ``classes`` distinct classes, ``per_class`` examples of each.

    The MNIST "highly heterogeneous 100 clients" scenario (2 classes x 300
    examples per client).  Examples are drawn without replacement, so no
    example is on two clients; examples left over are on none.

    Which clients hold which classes: class c can serve at most
    cap_c = min(n_c // per_class, K) clients.  First the number of clients
    r_c holding each class is made as equal as the capacities allow (so the
    data of all classes is used evenly, as in the usual shard construction),
    then clients pick their classes one after the other, each choosing
    ``classes`` distinct ones at random with probability proportional to the
    slots r_c still open.  A class with as many open slots as clients still
    to pick must be taken now; by the Gale-Ryser theorem (equal row sums m,
    column sums r_c <= remaining clients) this rule never gets stuck, and
    every choice stays random.

    Returns:
        K sorted index tensors of ``classes * per_class`` examples each,
        pairwise disjoint.

    Raises:
        ValueError: ``classes`` larger than the number of distinct labels, or
            not enough examples (the message says how many are missing and
            the largest ``per_class`` that would fit).
    """
    labels = _check_labels(labels)
    num_clients = _check_positive_int(num_clients, "num_clients")
    generator = _check_generator(generator)
    m = _check_positive_int(classes, "classes")
    per_class = _check_positive_int(per_class, "per_class")
    present, members = _by_class(labels)
    if m > present.numel():
        raise ValueError(f"classes={m} but the labels hold only {present.numel()} distinct classes")
    sizes = torch.tensor([idx.numel() for idx in members], dtype=torch.int64)
    capacity = torch.clamp(sizes // per_class, max=num_clients)
    needed = num_clients * m
    if int(capacity.sum()) < needed:
        fits = next(
            (p for p in range(per_class - 1, 0, -1) if int(torch.clamp(sizes // p, max=num_clients).sum()) >= needed),
            None,
        )
        hint = f"per_class <= {fits} would fit" if fits else "even per_class=1 does not fit: use fewer clients"
        raise ValueError(
            f"not enough examples: {num_clients} clients x {m} distinct classes need {needed} blocks of "
            f"{per_class} examples of one class (each class on at most one block per client), but the class "
            f"sizes {dict(zip(present.tolist(), sizes.tolist(), strict=True))} give only {int(capacity.sum())} "
            f"such blocks; {hint}"
        )

    open_slots = _class_slots(capacity, needed, generator)
    holds = torch.zeros(num_clients, present.numel(), dtype=torch.int64)
    for k in range(num_clients):
        remaining = num_clients - k
        forced = (open_slots == remaining).nonzero().flatten()
        free = ((open_slots > 0) & (open_slots < remaining)).nonzero().flatten()
        extra = m - forced.numel()
        if extra:
            # multinomial without replacement: distinct classes, weighted by open slots.
            pick = torch.multinomial(open_slots[free].to(_F64), extra, replacement=False, generator=generator)
            chosen = torch.cat([forced, free[pick]])
        else:
            chosen = forced
        holds[k, chosen] = 1
        open_slots[chosen] -= 1
    return _assign_by_counts(members, holds * per_class, labels.numel(), generator)


def shards(
    labels,
    num_clients: int,
    generator: torch.Generator,
    classes: int = 2,
    per_class: int = 300,
) -> list[torch.Tensor]:
    r"""Label-sorted shards (McMahan et al. 2017): sort the examples by label (randomly within a label), cut them
    into ``num_clients * classes`` shards of ``per_class`` consecutive examples, and give each client ``classes``
    shards drawn at random without replacement.

    This is how the "2 classes per client, 300 points each" MNIST scenario is usually built, and unlike
    :func:`classes_per_client` it always fits when K·classes·per_class ≤ N (MNIST: 200 × 300 = 60,000): a shard
    that straddles two labels, or two shards of the same label, leave a client with one or three classes.

    Returns:
        K sorted index tensors of ``classes * per_class`` examples each, pairwise disjoint.
    """
    labels = _check_labels(labels)
    num_clients = _check_positive_int(num_clients, "num_clients")
    generator = _check_generator(generator)
    count = num_clients * _check_positive_int(classes, "classes")
    per_class = _check_positive_int(per_class, "per_class")
    if count * per_class > labels.numel():
        raise ValueError(
            f"{num_clients} clients x {classes} shards x {per_class} examples need "
            f"{count * per_class} examples, but there are {labels.numel()}"
        )
    shuffled = torch.randperm(labels.numel(), generator=generator)
    by_label = shuffled[torch.argsort(labels[shuffled], stable=True)]  # sorted by label, random within a label
    pieces = by_label[: count * per_class].reshape(count, per_class)
    order = torch.randperm(count, generator=generator).reshape(num_clients, classes)
    return [torch.sort(pieces[row].reshape(-1)).values for row in order]


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


# ---------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------


def label_counts(labels, parts: Sequence[torch.Tensor], num_classes: int) -> torch.Tensor:
    """(K, C) int64 matrix: entry (k, c) is how many of client k's examples have label c.

    Raises:
        ValueError: a label outside [0, num_classes) among the clients'
            examples, or an index out of range.
    """
    labels = _check_labels(labels)
    num_classes = _check_positive_int(num_classes, "num_classes")
    rows = []
    for k, part in enumerate(parts):
        part = torch.as_tensor(part, dtype=torch.int64)
        if part.numel() and (int(part.min()) < 0 or int(part.max()) >= labels.numel()):
            raise ValueError(f"client {k} has indices outside [0, {labels.numel()})")
        ys = labels[part]
        if ys.numel() and (int(ys.min()) < 0 or int(ys.max()) >= num_classes):
            raise ValueError(f"client {k} has labels outside [0, {num_classes})")
        rows.append(torch.bincount(ys, minlength=num_classes))
    if not rows:
        return torch.zeros(0, num_classes, dtype=torch.int64)
    return torch.stack(rows)


def _clients_for_share(sizes: torch.Tensor, share: float) -> int:
    """The fewest clients that together hold at least ``share`` of the data."""
    cumulative = torch.cumsum(torch.sort(sizes, descending=True)[0].to(_F64), 0) / sizes.sum()
    return int((cumulative < share - 1e-12).sum()) + 1


def heterogeneity(labels, parts: Sequence[torch.Tensor], num_classes: int, top: int = 4) -> dict:
    """The statistics :func:`describe` prints, as numbers.

    Keys: ``num_clients``, ``assigned`` (examples on some client),
    ``num_examples`` (len(labels)), ``disjoint`` (no example on two
    clients), ``sizes`` (list), ``largest2_share`` (share of the assigned
    data on the 2 largest clients), ``clients_for_50`` / ``clients_for_90``
    (fewest clients holding 50 % / 90 % of it), ``top_class_share`` (per
    non-empty client, the share of its data in its ``top`` largest classes),
    ``classes_per_client`` (per client, the number of classes it has).
    """
    counts = label_counts(labels, parts, num_classes)
    sizes = counts.sum(dim=1)
    if sizes.numel() == 0 or int(sizes.sum()) == 0:
        raise ValueError("the split holds no examples")
    indices = torch.cat([torch.as_tensor(p, dtype=torch.int64) for p in parts])
    top_counts = torch.topk(counts, min(top, num_classes), dim=1)[0].sum(dim=1)
    nonempty = sizes > 0
    return {
        "num_clients": len(parts),
        "num_examples": int(torch.as_tensor(labels).numel()),
        "assigned": int(torch.unique(indices).numel()),
        "disjoint": bool(torch.unique(indices).numel() == indices.numel()),
        "sizes": sizes.tolist(),
        "largest2_share": float(torch.topk(sizes, min(2, sizes.numel()))[0].sum() / sizes.sum()),
        "clients_for_50": _clients_for_share(sizes, 0.5),
        "clients_for_90": _clients_for_share(sizes, 0.9),
        "top": top,
        "top_class_share": (top_counts[nonempty].to(_F64) / sizes[nonempty]).tolist(),
        "classes_per_client": (counts > 0).sum(dim=1).tolist(),
    }


def _spread(values: Sequence[float], fmt: str) -> str:
    t = torch.tensor(values, dtype=_F64)
    return (
        f"min {format(float(t.min()), fmt)}, median {format(float(t.median()), fmt)}, max {format(float(t.max()), fmt)}"
    )


def describe(labels, parts: Sequence[torch.Tensor], num_classes: int) -> str:
    """A few lines on how heterogeneous a split is.

    Sizes, the share of the data on the 2 largest clients, how many clients
    hold 50 % and 90 % of it, and the share of each client's data in its top
    4 classes -- the numbers the FedLap paper quotes for its split ("2 clients
    have 50 % of the data, 6 clients 90 %; 60-95 % of a client's data within
    4 classes").
    """
    s = heterogeneity(labels, parts, num_classes)
    total = sum(s["sizes"])
    coverage = "all" if s["assigned"] == s["num_examples"] else f"{s['assigned']} of {s['num_examples']}"
    overlap = "disjoint" if s["disjoint"] else "OVERLAPPING"
    return "\n".join(
        [
            f"{s['num_clients']} clients, {total} examples ({coverage} examples assigned, {overlap})",
            f"client sizes: {_spread(s['sizes'], '.0f')}",
            f"largest 2 clients hold {s['largest2_share']:.1%} of the data; "
            f"{s['clients_for_50']} clients hold 50 %, {s['clients_for_90']} hold 90 %",
            f"share of a client's data in its top {s['top']} classes: {_spread(s['top_class_share'], '.1%')}",
            f"classes per client: {_spread(s['classes_per_client'], '.0f')}",
        ]
    )


def plot_label_distribution(
    labels,
    parts: Sequence[torch.Tensor],
    num_classes: int,
    path: str | os.PathLike,
    title: str | None = None,
) -> None:
    """Write a PNG of the per-client label counts to ``path``.

    Up to 30 clients and 20 classes: one stacked bar per client, a colour per
    class, with a legend.  More clients or classes: a heatmap (classes x
    clients, colour = share of the client's examples in the class) under a
    bar chart of the client sizes, which stays readable for 100 clients or
    100 classes.  The description from :func:`describe` is printed under the
    plot.

    Uses matplotlib's object API with the Agg canvas (no pyplot state, no
    display needed).
    """
    import matplotlib
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = label_counts(labels, parts, num_classes).numpy()
    num_clients = counts.shape[0]
    if num_clients == 0:
        raise ValueError("no clients to plot")
    sizes = counts.sum(axis=1)
    clients = list(range(num_clients))
    summary = describe(labels, parts, num_classes)

    if num_clients <= 30 and num_classes <= 20:
        fig = Figure(figsize=(max(6.0, 0.45 * num_clients + 3.0), 5.5), layout="constrained")
        ax = fig.add_subplot()
        cmap = matplotlib.colormaps["tab10" if num_classes <= 10 else "tab20"]
        bottom = [0] * num_clients
        for c in range(num_classes):
            ax.bar(clients, counts[:, c], bottom=bottom, color=cmap(c), label=str(c), width=0.8)
            bottom = [b + v for b, v in zip(bottom, counts[:, c], strict=True)]
        ax.set_xticks(clients)
        ax.set_xlabel("client")
        ax.set_ylabel("examples")
        ax.legend(title="class", loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    else:
        fig = Figure(figsize=(min(16.0, max(7.0, 0.12 * num_clients + 3.0)), 7.5), layout="constrained")
        top_ax, heat_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 3]})
        top_ax.bar(clients, sizes, width=0.9, color="0.35")
        top_ax.set_ylabel("examples")
        # Colour = share of the client's own data, not the raw count: the
        # sizes are in the bar chart already, and raw counts would make the
        # class mix of small clients invisible.
        shares = counts / np.maximum(sizes, 1)[:, None]
        image = heat_ax.imshow(
            shares.T,
            aspect="auto",
            interpolation="nearest",
            cmap="viridis",
            vmin=0.0,
            vmax=max(float(shares.max()), 1e-12),
            extent=(-0.5, num_clients - 0.5, num_classes - 0.5, -0.5),
        )
        if num_classes <= 20:
            heat_ax.set_yticks(range(num_classes))
        if num_clients <= 30:
            heat_ax.set_xticks(clients)
        heat_ax.set_xlabel("client")
        heat_ax.set_ylabel("class")
        fig.colorbar(image, ax=heat_ax, label="share of the client's examples")
    fig.suptitle(title or f"Label distribution over {num_clients} clients")
    fig.text(0.01, 0.0, summary, fontsize=7, family="monospace", va="top", ha="left")
    FigureCanvasAgg(fig)
    fig.savefig(os.fspath(path), dpi=110, bbox_inches="tight")


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

#: Split name -> function ``(labels, num_clients, generator, **settings)``.
PARTITIONS: dict[str, Callable[..., list[torch.Tensor]]] = {
    "iid": iid,
    "two-level-dirichlet": two_level_dirichlet,
    "per-class-dirichlet": per_class_dirichlet,
    "classes-per-client": classes_per_client,
    "shards": shards,
}


def make_partition(name: str, labels, num_clients: int, generator: torch.Generator, **kw) -> list[torch.Tensor]:
    """Run the split ``name`` of :data:`PARTITIONS` with settings ``kw``.

    Raises:
        ValueError: unknown name (the message lists the valid ones) or a
            setting the split does not take (the message lists those it does).
    """
    try:
        split = PARTITIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown partition {name!r}; valid names: {', '.join(PARTITIONS)}") from None
    params = list(inspect.signature(split).parameters)[3:]  # after labels, num_clients, generator
    unknown = sorted(set(kw) - set(params))
    if unknown:
        valid = ", ".join(params) if params else "none"
        raise ValueError(f"partition {name!r} got unknown setting(s) {', '.join(unknown)}; it takes: {valid}")
    return split(labels, num_clients, generator, **kw)
