"""A client's classification data with a flat-parameter model: the `data` a stochastic local solver trains on."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ClassificationData:
    """Inputs X (n, ...) and integer labels y (n,) of one client, and the model that maps a flat θ and X to logits."""

    model: object        # a bayesadmm.models.FlatModel
    X: Tensor
    y: Tensor

    def __post_init__(self) -> None:
        if self.X.shape[0] != self.y.shape[0]:
            raise ValueError(f"X has {self.X.shape[0]} examples but y has {self.y.shape[0]}")

    @property
    def num_examples(self) -> int:
        return self.y.shape[0]

    def batch_loss(self, theta: Tensor, idx: Tensor) -> Tensor:
        """Mean cross-entropy over the examples `idx`."""
        return torch.nn.functional.cross_entropy(self.model.forward(theta, self.X[idx]), self.y[idx])
