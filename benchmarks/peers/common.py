"""What the three contenders share: the scenario (partition, initial weights, settings), the model, the evaluation,
and the arithmetic limit of a round. bayesadmm is imported here only for the scenario's data and settings."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

TIMED = (2, 3)  # the timed rounds of each 3-round run (round 1 is warm-up)
ROUNDS = max(TIMED)


@dataclass
class Scenario:
    """One scenario and method: each client's (X_k, y_k), the test set, the initial flat weights and the settings."""

    name: str
    method: str
    clients: list[tuple[Tensor, Tensor]]
    X_test: Tensor
    y_test: Tensor
    theta0: Tensor
    hparams: dict  # the preset's hyperparameters of `method` (lr, epochs, batch_size, ...)
    seed: int
    schedule_rounds: int  # the scenario's length: the cosine schedule spans it (the runs stop after ROUNDS)
    extra: dict = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.hparams["batch_size"])

    @property
    def steps_per_round(self) -> int:
        """Local optimizer steps of a round, all clients together (the last minibatch of an epoch may be short)."""
        return sum(math.ceil(len(y) / self.batch_size) for _, y in self.clients) * int(self.hparams["epochs"])


def load_scenario(name: str, method: str, overrides: tuple[str, ...] = ()) -> Scenario:
    """The partition, test set and initial weights exactly as `bayesadmm run NAME method=METHOD [KEY=VALUE ...]` makes
    them (`overrides`: the KEY=VALUE settings)."""
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import resolve

    config, _ = resolve(name, [f"method={method}", *overrides])
    federation = build(config).federation
    source = federation.clients  # TensorClients: client k owns rows slices[k] of X, y
    clients = [
        (source.X[a:b].clone(), source.y[a:b].clone()) for a, b in (source.slices[k] for k in sorted(source.slices))
    ]
    return Scenario(
        name,
        method,
        clients,
        federation.eval_X,
        federation.eval_y,
        federation.theta0.clone(),
        dict(config.hparams),
        config.seed,
        config.rounds,
    )


def make_mlp() -> nn.Sequential:
    """The scenarios' MLP 784-200-100-10 with sigmoid activations (178,110 weights), written out."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 200),
        nn.Sigmoid(),
        nn.Linear(200, 100),
        nn.Sigmoid(),
        nn.Linear(100, 10),
    )


def mlp_with(theta: Tensor) -> nn.Sequential:
    """The MLP holding the flat weights `theta` (bayesadmm's layout: the parameters in order, flattened)."""
    model = make_mlp()
    nn.utils.vector_to_parameters(theta.detach().clone(), model.parameters())
    return model


def flat(model: nn.Module) -> Tensor:
    return nn.utils.parameters_to_vector(model.parameters()).detach().clone()


@torch.no_grad()
def accuracy(theta: Tensor, X: Tensor, y: Tensor, precision: Tensor | None = None, samples: int = 32) -> float:
    """Test accuracy at the weights `theta`; with `precision`, of the posterior predictive of N(theta, 1/precision)
    averaged over `samples` draws (softmax probabilities averaged)."""
    model = mlp_with(theta)
    if precision is None:
        return float((model(X).argmax(-1) == y).float().mean())
    gen = torch.Generator().manual_seed(0)
    probs = torch.zeros(len(y), 10)
    for _ in range(samples):
        draw = theta + torch.randn(theta.shape, generator=gen) / precision.sqrt()
        nn.utils.vector_to_parameters(draw, model.parameters())
        probs += model(X).softmax(-1)
    return float((probs.argmax(-1) == y).float().mean())


def cosine_lr(lr: float, round_: int, rounds: int) -> float:
    """lr cosine-decayed to 0 over `rounds` rounds, stepped once per round (round 1 at lr)."""
    t = min(max(round_ - 1, 0), rounds)
    return 0.5 * lr * (1.0 + math.cos(math.pi * t / rounds))


def median_timed(seconds: list[float]) -> float:
    """The median of a run's timed rounds (`seconds[r - 1]` is round r)."""
    return statistics.median(seconds[r - 1] for r in TIMED)


# --- the limit: a round's arithmetic at this machine's matrix-product throughput -----------------------------------


def mlp_flops_per_example() -> tuple[int, int]:
    """(P, P_first): the MLP's weights, and those of its first layer (which needs no input gradient)."""
    model = make_mlp()
    total = sum(p.numel() for p in model.parameters())
    first = sum(p.numel() for p in model[1].parameters())
    return total, first


def round_flops(scenario: Scenario) -> tuple[float, int]:
    """(floating-point operations of one round, local steps): per step 2·B·P forward + 2·B·P weight gradients
    + 2·B·(P − P_first) input gradients, B the minibatch size (the short last minibatches counted at their size)."""
    total, first = mlp_flops_per_example()
    examples = sum(len(y) for _, y in scenario.clients) * int(scenario.hparams["epochs"])
    return examples * (2 * total + 2 * total + 2 * (total - first)), scenario.steps_per_round


def matmul_throughput(n: int = 2048, seconds: float = 2.0, device: str = "cpu") -> float:
    """float32 flop/s of torch.mm of n×n matrices on `device` (the CPU: all threads; the best of repeated timings)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    out = torch.empty(n, n, device=device)
    sync = torch.cuda.synchronize if out.is_cuda else (lambda: None)
    torch.mm(a, b, out=out)
    sync()
    best, began = math.inf, time.perf_counter()
    while time.perf_counter() - began < seconds:
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best
