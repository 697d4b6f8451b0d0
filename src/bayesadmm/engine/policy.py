"""Where the clients go: how many worker processes (`default_workers`, `usable_cores`), which clients train together
(`fixed_cohorts`; at partial participation `cohort_blocks` and `round_cohorts`) and which worker keeps which clients
for the whole run (`assign`: longest processing time first on the clients' numbers of examples)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

__all__ = ["default_workers", "usable_cores", "fixed_cohorts", "cohort_blocks", "round_cohorts", "assign"]


def default_workers() -> int:
    """The number of cores this process may use (or $BAYESADMM_WORKERS)."""
    if os.environ.get("BAYESADMM_WORKERS"):
        return max(1, int(os.environ["BAYESADMM_WORKERS"]))
    return usable_cores()


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system has one (a container's share, not the
    host's count), `os.cpu_count()` elsewhere."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def fixed_cohorts(sizes: Mapping[int, int], cohort_size: int, spread: int | None = None) -> list[list[int]]:
    """The clients' cohorts for the whole run, from their numbers of examples `sizes`: the clients, largest first
    (ties: lower id first), are taken a band of `spread` cohorts at a time (`spread` × `cohort_size` clients of
    similar sizes), and each band's clients are dealt to its cohorts back and forth (1, 2, …, n, n, …, 2, 1, 1, …).
    A cohort takes about a fixed time per step of its largest client plus a time per client step
    (`python benchmarks/cohort.py`): cohorts of similar clients waste few steps, and the cohorts of a band, of nearly
    equal work, keep `spread` workers equally busy. `spread` defaults to the cores this process may use
    (`usable_cores`), where `bayesadmm run` starts one worker each. Each cohort's ids in order.

    A round trains each cohort's chosen members together (`engine.cohort`), so what is batched with what depends
    neither on the round's order of clients nor on how many workers share them (`assign` gives each worker whole
    cohorts)."""
    if cohort_size < 1:
        raise ValueError(f"cohort_size must be >= 1, got {cohort_size}")
    spread = max(1, spread if spread is not None else usable_cores())
    ordered = sorted(sizes, key=lambda k: (-sizes[k], k))
    cohorts: list[list[int]] = []
    for start in range(0, len(ordered), spread * cohort_size):
        band = ordered[start : start + spread * cohort_size]
        dealt: list[list[int]] = [[] for _ in range(math.ceil(len(band) / cohort_size))]
        for position, k in enumerate(band):
            turn, index = divmod(position, len(dealt))
            dealt[index if turn % 2 == 0 else len(dealt) - 1 - index].append(k)
        cohorts.extend(sorted(cohort) for cohort in dealt)
    return cohorts


def cohort_blocks(
    sizes: Mapping[int, int], cohort_size: int, participation: float = 1.0, spread: int | None = None
) -> list[list[int]]:
    """The run's blocks of clients, fixed for the whole run, from which each round's cohorts are made
    (`round_cohorts`): `fixed_cohorts` of `cohort_size` clients at full participation (a block is a cohort, with
    `spread`), and at a `participation` p < 1 bands of ⌈cohort_size / p⌉ clients of similar sizes (`fixed_cohorts`
    with `spread` 1, not dealt: a cohort's steps are padded to its largest client's minibatch, `solvers.cohort`), so
    that a round draws about `cohort_size` of each block's clients, and those train together (fixed cohorts of
    `cohort_size` would train ~cohort_size × p participants each). `assign` balances the workers' examples.

    The blocks depend on the clients' sizes, the cohort size, the participation and `spread` (the cores), not on the
    number of workers: `assign` gives each worker whole blocks, so each round's cohorts, and a run's bits, are the
    same for any number of workers. As with cohorts, a block of every client leaves all workers but one idle."""
    if cohort_size < 1:
        raise ValueError(f"cohort_size must be >= 1, got {cohort_size}")
    if participation >= 1.0:
        return fixed_cohorts(sizes, cohort_size, spread)
    return fixed_cohorts(sizes, math.ceil(cohort_size / participation), spread=1)


def round_cohorts(members: Sequence[int], sizes: Mapping[int, int], cohort_size: int) -> list[list[int]]:
    """A block's clients that take part in a round (`members`, any order), as the cohorts they train in: all of them
    together where they are at most `cohort_size`, otherwise `fixed_cohorts` of them with `spread` 1 (the largest
    `cohort_size` together, then the next). Each cohort's ids in order; a function of the members alone, so the same
    in any worker."""
    if len(members) <= cohort_size:
        return [sorted(members)] if members else []
    return fixed_cohorts({k: sizes[k] for k in members}, cohort_size, spread=1)


def assign(sizes: Mapping[int, int], workers: int, cohorts: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Clients per worker, with balanced numbers of examples: longest processing time first (Graham 1969), i.e. each
    of `cohorts` (`fixed_cohorts`; one client each by default), from the largest down (ties: lower first id first),
    goes to the worker with the fewest examples so far (ties: fewer cohorts, then lower index). No worker is left
    without a cohort while there are enough. Each worker's clients in id order, whole cohorts."""
    cohorts = [[k] for k in sorted(sizes)] if cohorts is None else [list(c) for c in cohorts]
    load = {c[0]: sum(sizes[k] for k in c) for c in cohorts}
    groups: list[list[int]] = [[] for _ in range(max(1, min(workers, len(cohorts))))]
    counts, loads = [0] * len(groups), [0] * len(groups)
    for cohort in sorted(cohorts, key=lambda c: (-load[c[0]], c[0])):
        emptiest = min(range(len(groups)), key=lambda i: (loads[i], counts[i], i))
        groups[emptiest].extend(cohort)
        loads[emptiest] += load[cohort[0]]
        counts[emptiest] += 1
    return [sorted(group) for group in groups]
