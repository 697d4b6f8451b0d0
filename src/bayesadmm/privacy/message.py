"""`ClientUpdate`: what of a method's reply is the client's update, the part that client-level DP clips and noises.

A method declares it in its `MethodSpec` (`client_update(hparams) -> ClientUpdate`): FedAvg's and FedProx's reply
θ_k against the broadcast θ_g; BayesADMM's (IVON-ADMM's) reply η_k + ρ_s λ_k against ρ_s λ_g. A method without
one has no client-level DP, and a run asking for it is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor

__all__ = ["ClientUpdate"]


@dataclass(frozen=True)
class ClientUpdate:
    """A client's update: for each (reply prefix, broadcast prefix) of `pairs`, the reply's entries under the first
    (the key itself, or `prefix.0`, `prefix.1`, ...) minus `scale` times the broadcast's entries of the same suffix
    under the second. The server must aggregate the replies by their unweighted sum or mean, so that the noised sum
    of the clipped updates is all it releases. `every_round`: the server sums every client's last reply, so a
    client's noised reply would be reused after its round; such a method needs every client in every round
    (participation 1), where the sum is over this round's replies alone."""

    pairs: tuple[tuple[str, str], ...]
    scale: float = 1.0
    every_round: bool = False

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
