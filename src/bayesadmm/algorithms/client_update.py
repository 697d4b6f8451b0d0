"""`ClientUpdate`: what of a method's reply is the client's update, the part that client-level DP clips and noises.

A method declares it in its `MethodSpec` (`client_update(hparams) -> ClientUpdate`): FedAvg's and FedProx's reply
θ_k against the broadcast θ_g; BayesADMM's (IVON-ADMM's) reply η_k + ρ_s λ_k against ρ_s λ_g, or, from its
running-sum server, the change of that term (`RunningSum`). A method without one has no client-level DP, and a run
asking for it is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

__all__ = ["ClientUpdate", "RunningSum", "new_clients", "participants"]


def new_clients(clients: int, rate: float, round_: int) -> float:
    """The expected number of clients round `round_` (from 1) draws for the first time: K q (1 − q)^(t−1)."""
    return clients * rate * (1 - rate) ** (round_ - 1)


def participants(clients: int, rate: float, round_: int) -> float:
    """The expected number of participants of a round: K q."""
    return clients * rate


@dataclass(frozen=True)
class RunningSum:
    """How a running-sum server (`incremental=True`) takes client-level DP. Its replies are changes of the clients'
    terms in its sum and a flag, the reply entry `first`, set in a client's first reply, whose change is the whole
    term; the server adds the changes and counts the flags. Under DP a reply's update is its change, measured in a
    client's first reply against `ClientUpdate.scale` × the broadcast (the term the server then holds for the
    client), so that every update is small; the server releases the noised sum of the clipped updates as it is (a
    sum, not over a number of participants) plus scale × broadcast for each new client, and counts new clients by
    their public expectation, never by the flags, which would tell who took part. `update(server_state, released,
    new) -> (server_state, info)`: the method's server update given the released change of its sum (in the reply's
    layout) and the (expected, so fractional) number of new clients; a module-level function or a partial of one
    (it travels to worker processes).

    A server that takes the sum of the round's updates themselves (IVON-ADMM's `proximal="participants"`: the
    participants' steps λ_k − λ_g) has `first` None (its updates are the replies, measured against 0: its
    `ClientUpdate.scale` is 0) and `count` `participants`, the expected number of participants, in place of the new
    clients'. `count(clients, rate, round)`: that public number, from the federation's size, the sampling rate and
    the round (from 1)."""

    first: str | None
    update: Callable[[Any, dict[str, Tensor], float], tuple[Any, Any]]
    count: Callable[[int, float, int], float] = new_clients


@dataclass(frozen=True)
class ClientUpdate:
    """A client's update: for each (reply prefix, broadcast prefix) of `pairs`, the reply's entries under the first
    (the key itself, or `prefix.0`, `prefix.1`, ...) minus `scale` times the broadcast's entries of the same suffix
    under the second. The server must aggregate the replies by their unweighted sum or mean, so that the noised sum
    of the clipped updates is all it releases; at participation < 1 (Poisson sampling) by their mean, which the
    replies are rebuilt to make the noised sum over the expected number of participants. `every_round`: the server
    sums every client's last reply, so a client's noised reply would be reused after its round; such a method needs
    every client in every round (participation 1), where the sum is over this round's replies alone.
    `empty_round(server_state, reply) -> (server_state, info)`: the method's server update for a round that no
    client took part in (Poisson sampling may draw none), given the one reply whose update entries are the
    broadcast's moved by the noise (the noised sum of no updates, over the expected number of participants); a
    module-level function (it travels to worker processes). None: the method needs participation 1, unless it has
    `running` (a running-sum server, whose update also serves a round without participants).
    `precision_half`: the update is a diagonal Gaussian's natural-parameter change (Δλ₁, Δλ₂), its two keys in that
    order against the broadcast's λ_g, so that `DPSettings.precision_clip` can bound its halves apart
    (`privacy.client_level`)."""

    pairs: tuple[tuple[str, str], ...]
    scale: float = 1.0
    every_round: bool = False
    empty_round: Callable[[Any, dict[str, Tensor]], tuple[Any, Any]] | None = None
    running: RunningSum | None = None
    precision_half: bool = False

    def anchor_weight(self, reply: Mapping[str, Tensor]) -> float:
        """How many times scale × broadcast the reply's update is measured against: 1, or for a running-sum server's
        reply 1 in a client's first reply and 0 after (its change is then the update itself)."""
        if self.running is None or self.running.first is None:
            return 1.0
        return float(reply[self.running.first])

    def keys(self, reply: Mapping[str, Tensor], message: Mapping[str, Tensor]) -> list[tuple[str, str]]:
        """The (reply key, broadcast key) pairs of the update, in a fixed order; a KeyError naming what is missing."""
        found = []
        for reply_prefix, message_prefix in self.pairs:
            keys = sorted(k for k in reply if k == reply_prefix or k.startswith(reply_prefix + "."))
            if not keys:
                raise KeyError(f"the reply has no '{reply_prefix}' entries (keys: {sorted(reply)})")
            for key in keys:
                partner = message_prefix + key[len(reply_prefix) :]
                if partner not in message:
                    raise KeyError(f"the broadcast has no '{partner}' for the reply's '{key}'")
                found.append((key, partner))
        return found

    def broadcast_keys(self, message: Mapping[str, Tensor]) -> list[tuple[str, str]]:
        """The (reply key, broadcast key) pairs of the update read from the broadcast alone (a round without
        replies), in `keys`' order; a KeyError naming what is missing."""
        found = []
        for reply_prefix, message_prefix in self.pairs:
            keys = sorted(k for k in message if k == message_prefix or k.startswith(message_prefix + "."))
            if not keys:
                raise KeyError(f"the broadcast has no '{message_prefix}' entries (keys: {sorted(message)})")
            found += [(reply_prefix + key[len(message_prefix) :], key) for key in keys]
        return found
