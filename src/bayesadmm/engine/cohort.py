"""Cohort training: a round's clients trained together, their local solves as one batched computation.

`CohortClients` keeps the states of its clients like `LocalClients` (same start, restore, states and checkpoints) but
trains the chosen clients of a round in cohorts of at most `cohort_size`: for each cohort it asks the algorithm for
each client's local problem (`LocalStep.prepare`, the algorithm's own terms), solves them all with the local solver's
`solve_cohort` (parameters stacked as rows, one batched gradient per step; `solvers.cohort`), and finishes each client
(`LocalStep.finish`: its new state, reply and info). Each client draws on its own generator of (seed, round, client)
exactly what `train_client` draws, in the same order, so the replies are the per-client ones up to the rounding of the
batched products. An algorithm whose local solver does not batch (no `solve_cohort`: curvature or MCMC steps) is
trained by `LocalClients`; `engine.pool.client_runner` chooses.

Which clients train together: the run's blocks of clients (`policy.cohort_blocks`, fixed for the run; a worker of a
pool holds whole blocks) and, each round, each block's participants as its cohorts (`policy.round_cohorts`). At full
participation a block is a cohort of `cohort_size` clients (`policy.fixed_cohorts`). At a participation p < 1 a
block holds about `cohort_size` / p clients, so that a round's participants are batched about `cohort_size` at a
time, not one or two to a fixed cohort. The grouping depends on the clients' sizes, the cohort size, the
participation and the cores this process may use (`usable_cores`), never on the number of workers or on which
worker holds which client: a run gives the same bits for any number of workers.

Threads: like `LocalClients`, the cohorts run on one torch thread unless told otherwise (`single_thread=False`:
torch's setting). On a CPU shared with other processes torch's threads wait on each other at every kernel, and a
cohort round on several threads of busy cores can take many times as long as on one (compare
`python benchmarks/cohort.py` with and without --threads 1).

Results equal `LocalClients`'s up to rounding, not bit for bit, so a run with cohorts does not reproduce the bits of
one without; `client_runner` uses cohorts when asked (`cohort_size`; the engine's `cohort=0` asks for
`automatic_cohort`'s size).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm, CohortSolver, LocalStep, Message, info_scalars, trains_in_cohorts
from bayesadmm.engine.federation import participants
from bayesadmm.engine.policy import cohort_blocks, default_workers, round_cohorts, usable_cores
from bayesadmm.engine.runners import LocalClients
from bayesadmm.engine.simulate import generator_for
from bayesadmm.engine.store import StoreSpec
from bayesadmm.solvers.cohort import ClientRows, Workspace, client_rows
from bayesadmm.threads import one_thread

# clients per batched computation: bounds the memory of the stacked states (about 10 model-sized vectors per client
# for IVON); in benchmarks/cohort.py cohorts of 64 were faster than of 256 at 100 and 1000 clients on a CPU (and 32
# than 64 for the papers' MLP, whose (64, d) matrices pass glibc's 32 MB limit above which every allocation is fresh
# pages from the kernel)
DEFAULT_COHORT = 64

# the bytes of a cohort's stacked model-sized rows (parameters, gradients and Adam's two moments: 4 per client) that
# the automatic size keeps a round's cohorts within at partial participation: above the processor's cache every step
# streams them from memory, and for clients of a few examples a step is that traffic. For 100 of 1000 clients of
# fmnist-xdevice (the papers' MLP, ~6 examples each) cohorts of 4 (11 MB) trained a round fastest, of 16 (46 MB)
# slower than one or two at a time (`python benchmarks/round_cohorts.py`, docs/performance.md)
COHORT_BYTES = 16 << 20


def automatic_cohort(
    clients: int,
    workers: int,
    device: str = "cpu",
    algorithm: Algorithm | None = None,
    participation: float = 1.0,
    row_bytes: int = 0,
) -> int:
    """The cohort size of `cohort=0` for rounds of `clients` participants. On a CPU, for an algorithm whose local
    solver batches: the participants spread over the cores this process may use (`usable_cores`), at most the
    solver's `cpu_cohort` (16 for Adam, 1 for IVON: `benchmarks/cohort.py` measured cohorts of Adam steps 1.7-2.4x
    faster than one client at a time, and IVON's hardly faster), so that each core's worker gets at least one
    cohort; at a `participation` below 1, where a round's participants are batched (`policy.round_cohorts`), also at
    most `COHORT_BYTES` of four rows of `row_bytes` (one model-sized vector's bytes) per client. The size depends on
    the participants and the machine, not on `workers`: the same clients are batched together, and a run gives the
    same bits, for any number of workers. Without an algorithm (or one that does not batch) 1. On another device
    each worker's share of the participants as one cohort, at most `DEFAULT_COHORT`: small per-client computations
    leave a GPU idle, a batched one does not."""
    if torch.device(device).type != "cpu":
        return max(1, min(DEFAULT_COHORT, math.ceil(clients / max(workers, 1))))
    if algorithm is None or algorithm.local is None or not trains_in_cohorts(algorithm):
        return 1
    limit = int(getattr(algorithm.local.solver, "cpu_cohort", 1))
    if participation < 1.0 and row_bytes > 0:
        limit = min(limit, COHORT_BYTES // (4 * row_bytes))
    return max(1, min(limit, math.ceil(clients / usable_cores())))


def run_layout(settings: Any, ids: list[int], algorithm: Algorithm, theta0: Tensor) -> tuple[int, int]:
    """The workers and the cohort size of a run of the clients `ids` under `settings` (`Settings`): workers=0 is one
    per core on the CPU and one on a GPU (where every worker process would hold a CUDA context and a copy of the
    training set, and the processes would take turns on the one device), never more than a round's participants;
    cohort=0 is `automatic_cohort`'s size for a round's participants."""
    per_round = len(participants(ids, settings.participation, settings.seed, 1))
    workers = settings.workers or (default_workers() if torch.device(settings.device).type == "cpu" else 1)
    workers = min(workers, per_round)
    row_bytes = theta0.numel() * torch.empty((), dtype=settings.torch_dtype).element_size()
    cohort = settings.cohort or automatic_cohort(
        per_round, workers, settings.device, algorithm, settings.participation, row_bytes
    )
    return workers, cohort


def cohort_rows(algorithm: Algorithm, clients: Mapping[int, Any], source: Any = None) -> ClientRows | None:
    """The clients' examples stacked for cohort training, or None where `algorithm` (its local solver: `batches`) or
    the clients do not batch."""
    if not trains_in_cohorts(algorithm):
        return None
    return client_rows(clients, source)


class CohortClients(LocalClients):
    """The states and updates of `clients` (id → data), trained cohort by cohort in this process: each round, each of
    the `blocks` (lists of ids; `cohort_blocks` of the clients at `participation` where not given) as its
    participants' cohorts of at most `cohort_size` (`round_cohorts`); `rows` are their examples stacked
    (`cohort_rows`; made here if not given)."""

    def __init__(
        self,
        algorithm: Algorithm,
        clients: Mapping[int, Any],
        seed: int,
        cohort_size: int = DEFAULT_COHORT,
        rows: ClientRows | None = None,
        single_thread: bool = True,
        blocks: Sequence[Sequence[int]] | None = None,
        store: StoreSpec | None = None,
        participation: float = 1.0,
    ):
        super().__init__(algorithm, clients, seed, store)
        if algorithm.local is None or not trains_in_cohorts(algorithm):
            raise ValueError(f"{algorithm.name}: its local solver does not batch (no solve_cohort); use LocalClients")
        if cohort_size < 1:
            raise ValueError(f"cohort_size must be >= 1, got {cohort_size}")
        rows = rows if rows is not None else client_rows(self.clients)
        if rows is None:
            raise ValueError("cohort training needs supervised clients of one model and likelihood")
        self.local: LocalStep = algorithm.local
        self.rows, self.cohort_size = rows, cohort_size
        self.sizes = {k: int(d.num_examples) for k, d in self.clients.items()}
        if blocks is None:
            blocks = cohort_blocks(self.sizes, cohort_size, participation)
        self.blocks = [list(b) for b in blocks]
        if sorted(k for b in self.blocks for k in b) != sorted(self.clients):
            raise ValueError("blocks must hold each client once")
        self.workspace = Workspace()  # the solvers' scratch matrices, reused by every cohort
        self.single_thread = single_thread

    def units(self, chosen: Sequence[int]) -> list[list[int]]:
        """The `chosen` clients grouped as they train: each block's chosen members as their cohorts
        (`round_cohorts`), block by block."""
        wanted = set(chosen)
        return [
            cohort
            for block in self.blocks
            for cohort in round_cohorts([k for k in block if k in wanted], self.sizes, self.cohort_size)
        ]

    def train(
        self, round_: int, message: Message, chosen: Sequence[int], on_done: Callable[[int], None] | None = None
    ) -> dict[int, Message]:
        """Update the `chosen` clients' states, cohort by cohort (`units`); returns their replies in the order of
        `chosen`. After an exception the states of the cohorts already done are updated (as `LocalClients`)."""
        replies: dict[int, Message] = {}
        self.last_info = {}
        with one_thread() if self.single_thread else contextlib.nullcontext():
            for cohort in self.units(chosen):
                self._train(round_, message, cohort, replies, on_done)
        return {k: replies[k] for k in chosen}

    def _train(self, round_: int, message: Message, cohort: list[int], replies: dict, on_done) -> None:
        datas = [self.clients[k] for k in cohort]
        problems = [self.local.prepare(self._states[k], message, d) for k, d in zip(cohort, datas, strict=True)]
        generators = [generator_for(self.seed, round_, k) for k in cohort]
        results = cast(CohortSolver, self.local.solver).solve_cohort(  # (it batches: checked in __init__)
            problems, self.rows.cohort(cohort, self.clients, self.workspace), generators
        )
        for k, data, problem, result in zip(cohort, datas, problems, results, strict=True):
            self._states[k], replies[k], info = self.local.finish(self._states[k], message, data, problem, result)
            self.last_info[k] = info_scalars(info)
            if on_done is not None:
                on_done(k)


def local_runner(
    algorithm: Algorithm,
    clients: Mapping[int, Any],
    source,
    seed: int,
    cohort_size: int,
    blocks: list[list[int]] | None = None,
    store: StoreSpec | None = None,
    participation: float = 1.0,
) -> LocalClients:
    """`CohortClients` where `cohort_size` > 0 and the algorithm and clients batch (in `blocks` where given: a
    worker's share of the run's; `cohort_blocks` at `participation` otherwise), `LocalClients` otherwise."""
    rows = cohort_rows(algorithm, clients, source) if cohort_size > 0 else None
    if rows is None:
        return LocalClients(algorithm, clients, seed, store)
    return CohortClients(
        algorithm, clients, seed, cohort_size, rows, blocks=blocks, store=store, participation=participation
    )


__all__ = [
    "CohortClients",
    "automatic_cohort",
    "run_layout",
    "cohort_rows",
    "local_runner",
    "DEFAULT_COHORT",
    "COHORT_BYTES",
]
