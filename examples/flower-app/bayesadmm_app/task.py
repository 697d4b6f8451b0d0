"""The model and each node's data: scikit-learn's 8×8 digits, split into `num-partitions` parts, one per node."""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import nn


class Net(nn.Module):
    """A small MLP on the 64 pixels of a digit."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@lru_cache(maxsize=1)
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    return torch.tensor(X, dtype=torch.float32)[order] / 16.0, torch.tensor(y)[order]


def load_data(partition_id: int, num_partitions: int) -> tuple[tuple, tuple]:
    """This node's (train, test) examples: its part of the digits, 80 % / 20 %."""
    X, y = _digits()
    part = torch.arange(partition_id, len(y), num_partitions)
    cut = int(0.8 * len(part))
    return (X[part[:cut]], y[part[:cut]]), (X[part[cut:]], y[part[cut:]])
