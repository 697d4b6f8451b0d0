"""The sequential round loop: broadcast, client updates, server update, callback.

Randomness: each (seed, round, client) gets its own generator, derived with numpy's SeedSequence, so a client's
noise does not depend on which other clients ran, in which order, or in which process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from bayesadmm.algorithms.base import Algorithm


def generator_for(seed: int, round_: int, client: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator seeded from (seed, round, client) alone."""
    return generator_of(seed, round_, client, device=device)


def generator_of(*keys: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator seeded from the integers `keys` alone (NumPy's SeedSequence of them): `generator_for`'s
    (seed, round, client), or a longer key such as the personalisation's (seed, round, stream, client)."""
    state = np.random.SeedSequence(list(keys)).generate_state(2, dtype=np.uint32)
    gen = torch.Generator(device=device)
    gen.manual_seed(int(state[0]) << 32 | int(state[1]))
    return gen


def run_rounds(
    algorithm: Algorithm,
    client_data: Sequence[Any] | Mapping[int, Any],
    theta0: Tensor,
    rounds: int,
    seed: int = 0,
    on_round: Callable[[int, Any, dict], None] | None = None,
) -> tuple[Any, dict]:
    """Run `rounds` rounds with full participation and return the final (server state, client states).

    `on_round(round, server_state, client_states)` is called after every server update (round 0 = initial state).
    """
    data = dict(enumerate(client_data)) if not isinstance(client_data, Mapping) else dict(client_data)
    server = algorithm.init_server(theta0)
    clients = {k: algorithm.init_client(server, k) for k in data}
    if on_round is not None:
        on_round(0, server, clients)
    for r in range(1, rounds + 1):
        message = algorithm.broadcast(server)
        replies = {}
        for k in data:
            clients[k], replies[k], _ = algorithm.client_update(clients[k], message, data[k], generator_for(seed, r, k))
        server, _ = algorithm.server_update(server, replies)
        if on_round is not None:
            on_round(r, server, clients)
    return server, clients
