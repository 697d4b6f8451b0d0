"""`bayesadmm.unlearn`: a finished run's posterior without one client's contribution, with no training.

    result = bayesadmm.run(model, clients, test, algorithm="ivon-admm", ...)
    forgotten = bayesadmm.unlearn(result, client_id=3)      # or bayesadmm.unlearn("runs/mine", 3, model=model)
    forgotten.posterior                                     # q_g without client 3's term

A method whose server's posterior is a sum of per-client terms removes client j's term as its own mathematics defines it
(`Algorithm.unlearn`, written in each method's module): BayesADMM in every family, IVON-ADMM and IVON-PVI subtract the
client's dual η_j (`bayes_admm.unlearned_server`; BregmanADMM's dual step keeps no such term), PVI and FedEP divide out
its site, FedLap and FedLap-Cov replace its site by the uniform one. For a conjugate model whose family holds the exact
posterior, once training has converged, the result is the posterior of the other clients' data; otherwise it is the
method's own approximation, a state from which training without the client can continue. Every other method refuses,
and so does a run with client-level differential privacy (its server state is built from noised sums, which hold no
client's term); a run with example-level DP unlearns as the method does (its server sums the clients' private
replies exactly).
"""

from __future__ import annotations

import dataclasses
import numbers
from os import PathLike
from pathlib import Path
from typing import Any

from torch import nn

from bayesadmm.engine.federation import Result, StaleResult
from bayesadmm.likelihoods import Likelihood
from bayesadmm.loading import load
from bayesadmm.models import FlatModel
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
    read with `bayesadmm.load(run_dir, model=model, likelihood=likelihood)` (a run of `bayesadmm.run` needs them)."""
    result = _as_result(result_or_run_dir, model, likelihood)
    client_id = _check(result, client_id)
    try:
        state = result.client_states([client_id])[client_id]
    except StaleResult as exc:  # the run directory moved on: its client states are not of this Result's round
        raise UnlearningError(f"cannot unlearn client {client_id}: {exc}") from None
    except ValueError as exc:
        raise UnlearningError(f"client {client_id} is not a client of the run in {result.run_dir} ({exc})") from None
    hook = result.algorithm.unlearn
    assert hook is not None  # (_check refused a method without it)
    try:
        server = hook(result.server, client_id, state)
    except ValueError as exc:
        raise UnlearningError(f"{result.algorithm.name}: {exc}") from None
    removed = (*result.unlearned, client_id)
    clients = f"client{'s' if len(removed) > 1 else ''} {', '.join(map(str, removed))}"
    message = f"{clients} unlearned from round {result.round} of {result.run_dir}"
    return dataclasses.replace(result, server=server, message=message, unlearned=removed)


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
