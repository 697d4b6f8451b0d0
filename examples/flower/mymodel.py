"""Your model: any torch.nn.Module. The ServerApp calls `make_model()` under the run's seed for the initial
parameters; each ClientApp calls it for the architecture (its parameters come from the server)."""

from torch import nn


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
