"""`synthetic-softmax`: a made-up classification set for cross-device scale (the `logreg-100k` scenario), drawn
from a softmax model so that a linear softmax model fits it.

Inputs x ~ N(0, I_d); labels y ~ Categorical(softmax(x W / √d · SHARPNESS)) with W ~ N(0, 1)^{d×C}. Everything is
drawn from one fixed stream (`STREAM`, not the run's seed): like a downloaded data set, it is the same for every run,
and the run's seed chooses the split and the model's start.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bayesadmm.engine.simulate import generator_for

__all__ = ["softmax_data", "SHAPE", "TRAIN", "TEST"]

FEATURES, CLASSES = 20, 5
SHAPE = (FEATURES, CLASSES)  # (numbers per input, classes), as `experiments.build.DATASET_SHAPES` has them
TRAIN, TEST = 1_000_000, 10_000  # ten examples per client on average for 100,000 clients
SHARPNESS = 3.0  # the logits' scale: the Bayes classifier is right on about three quarters of the inputs
STREAM = 10**9 + 20  # the data's own stream (seed 0, round 0)


def softmax_data(train: int = TRAIN, test: int = TEST) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(X, y, X_test, y_test): float32 inputs and int64 labels, the same on every call."""
    generator = generator_for(0, 0, STREAM)
    weights = torch.randn(FEATURES, CLASSES, generator=generator, dtype=torch.float64)
    X = torch.randn(train + test, FEATURES, generator=generator, dtype=torch.float64)
    probabilities = torch.softmax(X @ weights * (SHARPNESS / FEATURES**0.5), dim=1)
    y = torch.multinomial(probabilities, 1, generator=generator).squeeze(1)
    X = X.float()
    return X[:train], y[:train], X[train:], y[train:]
