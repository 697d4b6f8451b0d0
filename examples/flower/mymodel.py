"""Your model (any torch.nn.Module) and, for Flower's simulation, where its nodes' data comes from.

The ServerApp calls `make_model()` under the run's seed for the initial parameters; each ClientApp calls it for the
architecture (its parameters come from the server). On a deployment each SuperNode reads its own file
(--node-config "partition-id=K data=PATH", written by prepare.py); a simulated node has no file, so the app's
`loader` (`simulated_data`) draws its examples from its partition-id, and the server's `eval-data`
(`simulated_test`) its evaluation set.
"""

import torch
from torch import nn


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))


def draw(n: int, weights: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n examples of 10 features around three class centres (the same centres for every seed), the classes drawn
    with `weights`."""
    centres = 2.0 * torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    y = torch.multinomial(weights, n, replacement=True, generator=g)
    return centres[y] + torch.randn(n, 10, generator=g), y


def client_data(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client k's examples: 200 + 50 k of them, mostly of class k mod 3."""
    weights = torch.full((3,), 0.2)
    weights[k % 3] = 1.0
    return draw(200 + 50 * k, weights, seed=1 + k)


def simulated_data(node_config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A simulated node's examples, from its node config's partition-id (the app's `loader`)."""
    return client_data(int(node_config["partition-id"]))


def simulated_test() -> tuple[torch.Tensor, torch.Tensor]:
    """The server's evaluation set (the app's `eval-data`): 600 examples of all three classes."""
    return draw(600, torch.ones(3), seed=10_000)
