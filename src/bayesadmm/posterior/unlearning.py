"""`bayesadmm.unlearn`: a finished run's posterior without one client's contribution, with no training.

    result = bayesadmm.run(model, clients, test, algorithm="ivon-admm", ...)
    forgotten = bayesadmm.unlearn(result, client_id=3)      # or bayesadmm.unlearn("runs/mine", 3, model=model)
    forgotten.posterior                                     # q_g without client 3's term
    bayesadmm.unlearn(result, 3, out="runs/mine-without-3", rounds=30)  # also a run directory to resume without it

A method whose server's posterior is a sum of per-client terms removes client j's term as its own mathematics defines it
(`Algorithm.unlearn`, written in each method's module): BayesADMM in every family, IVON-ADMM and IVON-PVI subtract the
client's dual η_j (`bayes_admm.unlearned_server`; BregmanADMM's dual step keeps no such term), PVI and FedEP divide out
its site, FedLap and FedLap-Cov replace its site by the uniform one (where BayesADMM's removal would leave a few
weights of a diagonal posterior without a positive precision, `keep_invalid=True` keeps the original there and
removes the rest). For a conjugate model whose family holds the exact posterior, once training has converged, the
result is the posterior of the other clients' data; otherwise it is the method's own approximation, a state from
which training without the client can continue. Every other method refuses,
and so does a run with client-level differential privacy (its server state is built from noised sums, which hold no
client's term); a run with example-level DP unlearns as the method does (its server sums the clients' private
replies exactly).

With `out=DIR` the unlearned run is also written as a run directory (`posterior.unlearned_run`): the unlearned
server state and the other clients' states in a checkpoint of the same round, the removal recorded in config.json
and in the checkpoint's record of the data, the history, status "stopped". A resume goes on from it without the
client ("repair rounds", up to `rounds=`): `bayesadmm resume DIR` for a scenario's run (config.json's
`exclude_client` leaves the client out), `bayesadmm.run(model, clients_without_j, ..., rounds=N, out=DIR,
resume=True)` for one of `bayesadmm.run` (the clients as a mapping that keeps their ids, the other arguments as the
run had them); a resume with the client's data is refused, naming it. For a conjugate model with the full family the
unlearned state is already the fixed point of the federation without the client, and the repair rounds keep it.
"""

from __future__ import annotations

import dataclasses
import numbers
from os import PathLike
from pathlib import Path
from typing import Any

from torch import nn

from bayesadmm.algorithms.base import PartlyInvalidRemoval
from bayesadmm.engine.federation import Result, StaleResult
from bayesadmm.engine.rundir import RunDirError
from bayesadmm.likelihoods import Likelihood
from bayesadmm.loading import load
from bayesadmm.models import FlatModel
from bayesadmm.posterior.unlearned_run import OutError, check_out, write_run
from bayesadmm.privacy.client_level import PrivateServer

__all__ = ["unlearn", "UnlearningError"]


class UnlearningError(ValueError):
    """A client that cannot be removed from a run: the method keeps no per-client term (or the run's client-level DP
    noised the sum that held it), the id is not one of the run's clients, the client never took part, or removing its
    term leaves no valid posterior."""


def unlearn(
    result_or_run_dir: Result | str | PathLike,
    client_id: int,
    *,
    model: nn.Module | FlatModel | None = None,
    likelihood: Likelihood | None = None,
    out: str | PathLike | None = None,
    rounds: int | None = None,
    keep_invalid: bool = False,
) -> Result:
    """The run's `Result` with client `client_id`'s term removed from its server state, by the method's
    `Algorithm.unlearn` hook and the client's state in the run's last checkpoint (`Result.client_states`).

    The returned Result's `posterior` is the unlearned one; `server` the unlearned server state; `unlearned` the
    clients removed so far (a Result can be unlearned again, client by client); `round`, `history`, `status`,
    `exit_code` and `run_dir` are the original run's (nothing was trained, and the run directory still holds the
    original checkpoint, client included); `message` says "client J unlearned". Raises `UnlearningError` for a method
    without the hook, an unknown client, one that never took part or was already unlearned, and a server state of
    another round than the checkpoint's client states (a run that diverged between checkpoints), and a Result whose
    run directory has moved on since (resumed or run again: its checkpoint is of another round). A run directory is
    read with `bayesadmm.load(run_dir, model=model, likelihood=likelihood)` (a run of `bayesadmm.run` needs them).

    Far from a fixed point a client's term can outweigh the rest of a diagonal posterior on a few weights (IVON-ADMM on
    a network), where removing it leaves no positive precision: refused by default, naming how many. With
    `keep_invalid=True` those weights keep the original's value (the client's term included) and the term is removed
    everywhere else; `message` says how many were kept. Meant to be followed by repair rounds (`out=`, `rounds=`),
    which move those weights with the rest; a family whose precision is one number or one matrix still refuses.

    `out=DIR` also writes the unlearned run as a run directory that a resume continues without the clients removed
    (module docstring), of `rounds` rounds (default: the run's own; more rounds train on, "repair rounds"; a schedule
    over the rounds, as IVON's `cosine`, then spans the new number), and returns the Result of DIR: `run_dir` DIR,
    status "stopped", `message` saying what a resume does. Refused before anything is written (`UnlearningError`):
    DIR the run's own directory or a folder that is not empty, a scenario's run without two clients (its
    `exclude_client` holds one), a Flower run, a run with example-level DP (its accountant counts the rounds of the
    federation that drew each client)."""
    result = _as_result(result_or_run_dir, model, likelihood)
    client_id = _check(result, client_id)
    if not isinstance(keep_invalid, bool):
        raise TypeError(f"keep_invalid must be True or False, got {keep_invalid!r}")
    if rounds is not None and out is None:
        raise UnlearningError("rounds= is the number of rounds of the run written to out=: give out= too")
    try:
        target = None if out is None else check_out(out, result.run_dir)
    except OutError as exc:
        raise UnlearningError(str(exc)) from None
    try:
        state = result.client_states([client_id])[client_id]
    except StaleResult as exc:  # the run directory moved on: its client states are not of this Result's round
        raise UnlearningError(f"cannot unlearn client {client_id}: {exc}") from None
    except ValueError as exc:
        raise UnlearningError(f"client {client_id} is not a client of the run in {result.run_dir} ({exc})") from None
    hook = result.algorithm.unlearn
    assert hook is not None  # (_check refused a method without it)
    kept = ""
    try:
        server = hook(result.server, client_id, state)
    except PartlyInvalidRemoval as exc:
        if not keep_invalid:
            raise UnlearningError(
                f"{result.algorithm.name}: {exc}: retrain without the client, or unlearn with keep_invalid=True (those "
                "weights keep the original's value, the client's term included, until repair rounds move them: out=, "
                "rounds=)"
            ) from None
        server = exc.kept
        kept = (
            f" (the original's value kept on {exc.coordinates} of {exc.total} weights, which its removal left invalid)"
        )
    except ValueError as exc:
        raise UnlearningError(f"{result.algorithm.name}: {exc}") from None
    removed = (*result.unlearned, client_id)
    clients = f"client{'s' if len(removed) > 1 else ''} {', '.join(map(str, removed))}"
    message = f"{clients} unlearned from round {result.round} of {result.run_dir}{kept}"
    unlearned = dataclasses.replace(result, server=server, message=message, unlearned=removed)
    if target is None:
        return unlearned
    try:
        return write_run(unlearned, target, rounds)
    except (OutError, RunDirError) as exc:
        raise UnlearningError(f"cannot write the run without {clients} to {out}: {exc}") from None


def _check(result: Result, client_id: Any) -> int:
    """`client_id` as an int, once the method has the hook, the client is not already removed and the server state is
    of the checkpoint's round; else `UnlearningError` saying which."""
    if isinstance(client_id, bool) or not isinstance(client_id, numbers.Integral):
        raise UnlearningError(f"client_id must be an int, got {client_id!r}")
    client_id = int(client_id)
    if isinstance(result.server, PrivateServer):
        raise UnlearningError(
            f"{result.algorithm.name} ran with client-level differential privacy: its server state is built from "
            "noised sums of the clients' updates, and no client's term can be taken out of a noised sum; retrain "
            f"without the client (exclude_client={client_id} in a scenario, or leave its data out of `bayesadmm.run`)"
        )
    if result.algorithm.unlearn is None:
        raise UnlearningError(
            f"{result.algorithm.name} keeps no per-client term in its server state: retrain without the client "
            f"(exclude_client={client_id} in a scenario, or leave its data out of `bayesadmm.run`)"
        )
    if client_id in result.unlearned:
        raise UnlearningError(f"client {client_id} is already unlearned from this result")
    server_round = getattr(result.server, "round", result.round)
    if server_round != result.round:  # a divergence between checkpoints: the clients' states are of another round
        raise UnlearningError(
            f"the server state is of round {server_round} but the run's last checkpoint of round {result.round}: "
            "unlearn from a run that ended normally, or with checkpoint_every=1"
        )
    return client_id


def _as_result(result_or_run_dir: Any, model: Any, likelihood: Likelihood | None) -> Result:
    """A `Result` as given, or the one `bayesadmm.load` reads from a run directory."""
    if isinstance(result_or_run_dir, Result):
        return result_or_run_dir
    if isinstance(result_or_run_dir, (str, PathLike)):
        return load(Path(result_or_run_dir), model=model, likelihood=likelihood)
    raise TypeError(f"unlearn takes a Result or a run directory, got {type(result_or_run_dir).__name__}")
