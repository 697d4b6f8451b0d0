"""A small federation for the engine's tests: 4 features, 3 classes, each client skewed towards one class."""

from __future__ import annotations

import torch


def toy_clients(clients: int = 6) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]:
    """`clients` clients of 12 + 2k examples (half of client k's of class k mod 3) and a test set of 60."""
    gen = torch.Generator().manual_seed(0)
    centres = 3.0 * torch.randn(3, 4, generator=gen)

    def draw(n, k):
        y = torch.cat([torch.full((n // 2,), k % 3), torch.randint(0, 3, (n - n // 2,), generator=gen)])
        return centres[y] + torch.randn(len(y), 4, generator=gen), y

    return [draw(12 + 2 * k, k) for k in range(clients)], draw(60, 0)
