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
* :func:`sized_dirichlet` -- many clients (cross-device): Dirichlet sizes
  above a floor, and each client's own Dirichlet label mixture.
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

The package holds one module per partition family (:mod:`.uniform`,
:mod:`.dirichlet`, :mod:`.classes`), the sampling (:mod:`.sampling`) and
allocation (:mod:`.allocation`) they share, and the summaries (:mod:`.summary`,
:mod:`.plot`); every public name is importable from here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

# The largest-remainder rounding and the empty-client repair are re-exported for their tests.
from bayesadmm.data.partitions.allocation import _apportion as _apportion
from bayesadmm.data.partitions.allocation import _counts_from_log_weights as _counts_from_log_weights
from bayesadmm.data.partitions.classes import classes_per_client, shards
from bayesadmm.data.partitions.dirichlet import per_class_dirichlet, two_level_dirichlet
from bayesadmm.data.partitions.natural import sized_dirichlet
from bayesadmm.data.partitions.plot import plot_label_distribution
from bayesadmm.data.partitions.sampling import sample_dirichlet, sample_gamma
from bayesadmm.data.partitions.summary import describe, heterogeneity, label_counts
from bayesadmm.data.partitions.uniform import iid, subsample

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
    "shards",
    "sized_dirichlet",
    "subsample",
    "two_level_dirichlet",
]

#: Split name -> function ``(labels, num_clients, generator, **settings)``.
PARTITIONS: dict[str, Callable[..., list[torch.Tensor]]] = {
    "iid": iid,
    "two-level-dirichlet": two_level_dirichlet,
    "per-class-dirichlet": per_class_dirichlet,
    "classes-per-client": classes_per_client,
    "shards": shards,
    "sized-dirichlet": sized_dirichlet,
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
