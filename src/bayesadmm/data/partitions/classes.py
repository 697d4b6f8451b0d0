"""Label-skew splits with a fixed number of classes per client: :func:`classes_per_client` and :func:`shards`."""

from __future__ import annotations

import torch

from bayesadmm.data.partitions._checks import _F64, _check_positive_int, _check_split
from bayesadmm.data.partitions.allocation import _assign_by_counts, _by_class


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
    labels, num_clients, generator = _check_split(labels, num_clients, generator)
    m = _check_positive_int(classes, "classes")
    per_class = _check_positive_int(per_class, "per_class")
    present, members = _by_class(labels)
    if m > present.numel():
        raise ValueError(f"classes={m} but the labels hold only {present.numel()} distinct classes")
    sizes = torch.tensor([idx.numel() for idx in members], dtype=torch.int64)
    capacity = torch.clamp(sizes // per_class, max=num_clients)
    needed = num_clients * m
    if int(capacity.sum()) < needed:
        raise ValueError(_not_enough_blocks(present, sizes, capacity, num_clients, m, per_class))

    open_slots = _class_slots(capacity, needed, generator)
    holds = _pick_classes(open_slots, num_clients, m, generator)
    return _assign_by_counts(members, holds * per_class, labels.numel(), generator)


def _not_enough_blocks(
    present: torch.Tensor, sizes: torch.Tensor, capacity: torch.Tensor, num_clients: int, m: int, per_class: int
) -> str:
    """Why :func:`classes_per_client` does not fit, and the largest ``per_class`` that would."""
    needed = num_clients * m
    fits = next(
        (p for p in range(per_class - 1, 0, -1) if int(torch.clamp(sizes // p, max=num_clients).sum()) >= needed),
        None,
    )
    hint = f"per_class <= {fits} would fit" if fits else "even per_class=1 does not fit: use fewer clients"
    return (
        f"not enough examples: {num_clients} clients x {m} distinct classes need {needed} blocks of "
        f"{per_class} examples of one class (each class on at most one block per client), but the class "
        f"sizes {dict(zip(present.tolist(), sizes.tolist(), strict=True))} give only {int(capacity.sum())} "
        f"such blocks; {hint}"
    )


def _pick_classes(open_slots: torch.Tensor, num_clients: int, m: int, generator: torch.Generator) -> torch.Tensor:
    """(K, C) 0/1 matrix of which classes each client holds, drawn client after client.

    Client k takes every class whose open slots equal the clients still to pick (it must be taken now), then
    the rest of its ``m`` classes at random, weighted by open slots.  ``open_slots`` is used up in place.
    """
    holds = torch.zeros(num_clients, open_slots.numel(), dtype=torch.int64)
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
    return holds


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
    labels, num_clients, generator = _check_split(labels, num_clients, generator)
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
