"""The interface every federated algorithm implements, and the message helpers they share.

An algorithm is a NamedTuple of pure functions over explicit state (in the style of optax/blackjax):

    init_server(theta0)                                   -> server state
    init_client(server_state, client_id)                  -> client state
    broadcast(server_state)                               -> Message
    client_update(client_state, message, data, generator) -> (client state, reply Message, info record)
    server_update(server_state, {client_id: reply})       -> (server state, info record)
    posterior(server_state)                               -> Posterior (Gaussian) or PointEstimate

Messages are flat dicts of tensors (they map one-to-one onto a Flower ArrayRecord). Info records are NamedTuples of
scalars (int, float, bool or 0-d tensors) for the logs, read as `info._asdict()`: `SolveInfo`, `TrainingInfo`,
`ServerInfo` below, an algorithm's own, or `NoInfo` when there is nothing to report. Functions never mutate their
inputs, and all randomness comes from the generator passed to `client_update`, so sequential, parallel and
remote execution give the same answer.

A client update is written one way, as a `LocalStep`: prepare the client's problem, solve it with the local solver
(`LocalSolver.solve_problem(problem, data, generator)`, the one call shape of every solver), finish; `client_update` is
derived from it (`update_from`, `Algorithm.from_local`). Batching a cohort of clients is a capability of the solver
(`CohortSolver.solve_cohort`, tested by `batches`), not of the algorithm.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

from bayesadmm.optim.kernels import compile_enabled
from bayesadmm.threads import one_thread
from bayesadmm.trees import register

Message = dict[str, Tensor]
"""What the server broadcasts and a client replies: a flat dict of named tensors (one Flower ArrayRecord)."""
Info = tuple  # an info record: a NamedTuple of scalars


class Algorithm(NamedTuple):
    """A federated algorithm: the pure functions of the module docstring, built by a factory (`make`)."""

    name: str
    init_server: Callable[[Tensor], Any]
    init_client: Callable[[Any, int], Any]
    broadcast: Callable[[Any], Message]
    client_update: Callable[[Any, Message, Any, torch.Generator], tuple[Any, Message, Info]]
    server_update: Callable[[Any, Mapping[int, Message]], tuple[Any, Info]]
    posterior: Callable[[Any], Any]
    # client_update split around its local solve (`LocalStep`): every algorithm of this package has one and derives
    # client_update from it (`from_local`); None only in an Algorithm whose client_update is written by hand (a
    # user's), which the engine then trains one client at a time
    local: LocalStep | None = None
    # personal(server_state, client_state) -> client k's own posterior (or PointEstimate), as the method defines it
    # (BayesADMM: q_k); None where the method keeps no client posterior (`bayesadmm.personal` then fine-tunes)
    personal: Callable[[Any, Any], Any] | None = None
    # unlearn(server_state, client_id, client_state) -> the server state without client_id's term in the server's
    # sum (a ValueError where it cannot be removed; `PartlyInvalidRemoval` where it can except on some coordinates);
    # None where the server is no sum of client terms (`bayesadmm.unlearn` then refuses)
    unlearn: Callable[[Any, int, Any], Any] | None = None
    # how the engine draws a round's clients at participation < 1 (`engine.federation.participants`): "fixed" (a
    # fixed-size subset) or "poisson" (each client independently: client-level DP's sampling, which its accountant
    # analyses; `privacy.client_level`)
    client_sampling: str = "fixed"

    @classmethod
    def from_local(
        cls,
        name: str,
        init_server: Callable[[Tensor], Any],
        init_client: Callable[[Any, int], Any],
        broadcast: Callable[[Any], Message],
        local: LocalStep,
        server_update: Callable[[Any, Mapping[int, Message]], tuple[Any, Info]],
        posterior: Callable[[Any], Any],
        *,
        personal: Callable[[Any, Any], Any] | None = None,
        unlearn: Callable[[Any, int, Any], Any] | None = None,
    ) -> Algorithm:
        """The algorithm whose client_update is `local`'s prepare, solve, finish (`update_from`)."""
        client_update = update_from(name, local)
        return cls(
            name, init_server, init_client, broadcast, client_update, server_update, posterior, local, personal, unlearn
        )


class PartlyInvalidRemoval(ValueError):
    """An `Algorithm.unlearn` hook's answer where removing the client's term leaves `coordinates` of the server's
    `total` without a valid Gaussian (a diagonal posterior's weights whose precision the term outweighs, as can
    happen far from a fixed point). `kept` is the server state with the term removed everywhere else and the
    original's value kept on those coordinates: `bayesadmm.unlearn` refuses the removal unless asked for it
    (`keep_invalid=True`), since those coordinates still hold the client's term until training moves them. A hook
    answers it only where training on does move them: BayesADMM's servers compute λ_g from the clients' terms each
    round, so the kept values are gone after a round without the client; PVI's and FedEP's servers add up site changes,
    where a kept value would stay for good, and refuse."""

    def __init__(self, message: str, kept: Any, coordinates: int, total: int):
        super().__init__(message)
        self.kept, self.coordinates, self.total = kept, coordinates, total


class LocalStep(NamedTuple):
    """A client update split around its local solve, so that a runner can solve a cohort's problems together:

        problem = prepare(state, message, data)          the algorithm's own terms of the client's local problem
        result  = solver.solve_problem(problem, data, generator)   (or `solve_cohort` over many clients at once,
                                                                    where the solver `batches`)
        finish(state, message, data, problem, result)    -> (new state, reply, info), as client_update returns

    `client_update` is exactly this composition (`update_from`), so both routes share the algorithm's code."""

    solver: LocalSolver
    prepare: Callable[[Any, Message, Any], Any]
    finish: Callable[[Any, Message, Any, Any, Any], tuple[Any, Message, Info]]


@runtime_checkable
class LocalSolver(Protocol):
    """What an algorithm's client step calls: `solve_problem(problem, data, generator) -> result`, the one call shape
    of every local solver. `problem` is a small NamedTuple of the algorithm's terms of the client's problem
    (`solvers.von.VariationalProblem`, `solvers.newton.ProxProblem`, `solvers.adam.AdamProblem`, ...), `data` the
    client's data and `generator` the client's torch.Generator, the only source of randomness. Optional:
    `needs_generator` (True: the solver draws from the generator, and `update_from` refuses None with an error that
    names the algorithm; default False)."""

    def solve_problem(self, problem: Any, data: Any, generator: torch.Generator) -> Any: ...


@runtime_checkable
class CohortSolver(LocalSolver, Protocol):
    """A local solver that also solves a cohort's problems as one batched computation (`solve_cohort`: the problems,
    stacked data (`solvers.cohort.StackedClients`) and generators of several clients; results in the same order, each
    as `solve_problem` gives it up to rounding). Optional: `cpu_cohort`, the most clients a cohort holds on a CPU
    where the run leaves the size to the engine (`engine.cohort.automatic_cohort`; 1, the default, where batching
    the clients is not faster there)."""

    def solve_cohort(self, problems: Sequence[Any], data: Any, generators: Sequence[torch.Generator]) -> list: ...


def batches(solver: Any) -> bool:
    """Whether `solver` solves cohorts (has `solve_cohort`, the `CohortSolver` capability): the engine batches an
    algorithm's clients only then. None (an algorithm without a `LocalStep`) does not."""
    return callable(getattr(solver, "solve_cohort", None))


def trains_in_cohorts(algorithm: Algorithm) -> bool:
    """Whether the engine can train `algorithm`'s clients in batched cohorts: its client step is a `LocalStep` whose
    solver `batches`."""
    return algorithm.local is not None and batches(algorithm.local.solver)


def compiled_kernels(algorithm: Algorithm) -> bool | None:
    """Whether `algorithm`'s client solves call compiled kernels: its local solver's `compiled` choice (IVON's,
    `optim.compilation`), False where BAYESADMM_COMPILE=0 overrides it; None for a solver without that choice."""
    compiled = getattr(algorithm.local.solver, "compiled", None) if algorithm.local is not None else None
    return None if compiled is None else bool(compiled) and compile_enabled()


def update_from(name: str, local: LocalStep) -> Callable[[Any, Message, Any, torch.Generator], tuple]:
    """The client_update that `local` splits: prepare, solve, finish."""
    needs_generator = bool(getattr(local.solver, "needs_generator", False))

    def client_update(state, message: Message, data, generator: torch.Generator):
        if generator is None and needs_generator:
            raise ValueError(f"{name}: client_update needs the client's torch.Generator (it shuffles the minibatches)")
        problem = local.prepare(state, message, data)
        return local.finish(state, message, data, problem, local.solver.solve_problem(problem, data, generator))

    return client_update


@register
class NoInfo(NamedTuple):
    """Nothing to report."""


@register
class SolveInfo(NamedTuple):
    """A client's local solve by a solver object (`SolveResult`, `PointResult`)."""

    iterations: int  # iterations (or optimizer steps) taken
    converged: bool  # tolerance met; fixed-budget solvers (IVON, Adam) report True


@register
class TrainingInfo(NamedTuple):
    """A client's local training with a fixed budget of epochs (Adam)."""

    iterations: int  # optimizer steps taken


@register
class ServerInfo(NamedTuple):
    clients: int  # clients whose replies the server update counted


@register
@dataclass(frozen=True)
class PointEstimate:
    """The 'posterior' of a point-estimate method (FedAvg, ADMM, ...): a point mass at `mean`."""

    mean: Tensor


class DivergenceError(RuntimeError):
    """The server state stopped being valid (non-finite, or not a valid distribution)."""


def pack(prefix: str, parts: tuple[Tensor, ...]) -> Message:
    """('lam', (a, b)) -> {'lam.0': a, 'lam.1': b}."""
    return {f"{prefix}.{i}": t for i, t in enumerate(parts)}


def unpack(prefix: str, message: Mapping[str, Tensor]) -> tuple[Tensor, ...]:
    parts: list[Tensor] = []
    while f"{prefix}.{len(parts)}" in message:
        parts.append(message[f"{prefix}.{len(parts)}"])
    if not parts:
        raise KeyError(f"message has no '{prefix}.*' entries (keys: {sorted(message)})")
    return tuple(parts)


def seen_clients(previous: tuple[int, ...], replies: Mapping[int, Message]) -> tuple[int, ...]:
    """The ids of every client that has replied so far, sorted: what a server keeps when it needs no old replies.
    `previous` is sorted, so each reply is looked up by bisection and the work per round follows the replies (with
    10⁵ clients, a set of them all every round cost more than the round's server update)."""
    new = sorted(k for k in set(replies) if not _holds(previous, k))
    if not new:
        return previous
    return tuple(sorted(previous + tuple(new)))  # two sorted runs: merged in linear time


def _holds(ordered: tuple[int, ...], k: int) -> bool:
    i = bisect.bisect_left(ordered, k)
    return i < len(ordered) and ordered[i] == k


def merge_replies(previous: Mapping[int, Any], replies: Mapping[int, Any]) -> dict[int, Any]:
    """The server's memory of each client's last reply (or of what it needs of it), so that absent clients still count
    (partial participation).

    Sorted by client id, so that sums over clients do not depend on the order in which replies arrived.
    """
    merged = {**previous, **replies}
    return {k: merged[k] for k in sorted(merged)}


def change_reply(change: Tensor, first: bool) -> Message:
    """A client's reply to a running-sum server (`incremental=True`): the change of its term in the server's sum,
    and whether this is its first reply (the server then counts it)."""
    return {"change": change, "first": torch.tensor(float(first), dtype=torch.float64)}


def add_changes(total: Tensor, clients: int, replies: Mapping[int, Message]) -> tuple[Tensor, int]:
    """A running sum and its count of clients after `replies` (`change_reply`'s), added in client-id order so that
    the sum does not depend on the order in which replies arrived."""
    for k in sorted(replies):
        total = total + replies[k]["change"]
    return total, clients + sum(int(replies[k]["first"]) for k in replies)


class StackBuffer:
    """`torch.stack(vectors)`, written into a buffer that this object reuses for the next stack of the same shape:
    reduce the result (or change it in place) but do not keep it. A server makes its own in its factory, so the
    buffer lives as long as the algorithm and nothing is shared between algorithms.

    For servers that reduce the replies over clients: the K × P matrix of 1000 replies of the papers' MLP is 712 MB,
    and a fresh one every round costs ~0.3 s of page faults (more on a loaded machine) for ~0.03 s of copying. Same
    operation, same shape, so the same bits as stacking into a new tensor, whatever the number of threads (blocks of
    columns would not be: torch reduces a column differently depending on where it falls in its vector groups).
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._buffer: Tensor | None = None  # one buffer at a time: the shape is fixed within a run

    def __call__(self, vectors: Sequence[Tensor]) -> Tensor:
        if not vectors:
            raise ValueError("stacking needs at least one tensor")
        first = vectors[0]
        if any(v.requires_grad or v.dtype != first.dtype or v.shape != first.shape for v in vectors):
            # what stacking into a buffer cannot do (autograd, type promotion, errors)
            return torch.stack(list(vectors))
        key = (len(vectors), tuple(first.shape), first.dtype, first.device)
        if key != self._key:
            self._buffer = None  # free the old one before allocating its successor
            self._buffer = torch.empty((len(vectors), *first.shape), dtype=first.dtype, device=first.device)
            self._key = key
        # the copy on one thread: the same bytes on any number, and memory-bound, so a second thread gains little,
        # while on a machine whose other cores are busy torch's threads wait for each other (a 71 MB stack of 100
        # replies of the papers' MLP took 0.5 s a round on 2 threads of a loaded 2-core machine, 10-20 ms on one)
        with one_thread():
            return torch.stack(list(vectors), out=self._buffer)


def info_scalars(info: Any) -> dict[str, float]:
    """The scalar fields of an algorithm's info record (a NamedTuple, dataclass or mapping), and those of an info
    record it holds (a wrapper's, e.g. `privacy.private`'s, of the wrapped method's); other fields skipped."""
    if hasattr(info, "_asdict"):
        items = info._asdict().items()
    elif dataclasses.is_dataclass(info) and not isinstance(info, type):
        items = dataclasses.asdict(info).items()
    elif isinstance(info, Mapping):
        items = info.items()
    else:
        return {}
    scalars = {}
    for key, value in items:
        if hasattr(value, "_asdict"):  # a wrapper's record of the wrapped method's info: its scalars, as they are
            scalars.update(info_scalars(value))
            continue
        if isinstance(value, Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, (bool, int, float)):
            scalars[str(key)] = float(value)
    return scalars
