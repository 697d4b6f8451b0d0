"""The interface every federated algorithm implements, and the message helpers they share.

An algorithm is a NamedTuple of pure functions over explicit state (in the style of optax/blackjax):

    init_server(theta0)                                   -> server state
    init_client(server_state, client_id)                  -> client state
    broadcast(server_state)                               -> Message
    client_update(client_state, message, data, generator) -> (client state, reply Message, info dict)
    server_update(server_state, {client_id: reply})       -> (server state, info dict)
    posterior(server_state)                               -> Posterior (Gaussian) or PointEstimate

Messages are flat dicts of tensors (they map one-to-one onto a Flower ArrayRecord). Functions never mutate their
inputs, and all randomness comes from the generator passed to `client_update`, so sequential, parallel and
remote execution give the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

import torch
from torch import Tensor

Message = dict[str, Tensor]


class Algorithm(NamedTuple):
    name: str
    init_server: Callable[[Tensor], Any]
    init_client: Callable[[Any, int], Any]
    broadcast: Callable[[Any], Message]
    client_update: Callable[[Any, Message, Any, torch.Generator], tuple[Any, Message, dict]]
    server_update: Callable[[Any, Mapping[int, Message]], tuple[Any, dict]]
    posterior: Callable[[Any], Any]


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
    parts = []
    while f"{prefix}.{len(parts)}" in message:
        parts.append(message[f"{prefix}.{len(parts)}"])
    if not parts:
        raise KeyError(f"message has no '{prefix}.*' entries (keys: {sorted(message)})")
    return tuple(parts)


def seen_clients(previous: tuple[int, ...], replies: Mapping[int, Message]) -> tuple[int, ...]:
    """The ids of every client that has replied so far, sorted: what a server keeps when it needs no old replies."""
    return tuple(sorted(set(previous) | set(replies)))


def merge_replies(previous: Mapping[int, Any], replies: Mapping[int, Any]) -> dict[int, Any]:
    """The server's memory of each client's last reply (or of what it needs of it), so that absent clients still count
    (partial participation).

    Sorted by client id, so that sums over clients do not depend on the order in which replies arrived.
    """
    merged = {**previous, **replies}
    return {k: merged[k] for k in sorted(merged)}
