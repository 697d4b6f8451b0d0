"""Small synthetic federated problems (heterogeneous clients) for tests, examples and sanity checks."""

from __future__ import annotations

import torch

from bayesadmm.problems.losses import LogisticLoss, QuadraticLoss, SoftmaxLoss, ridge_loss


def _client_inputs(num_clients: int, per_client: int, dim: int, generator: torch.Generator, dtype) -> list:
    # Each client's inputs are shifted by its own offset, so the clients disagree (heterogeneity).
    return [
        torch.randn(per_client, dim, generator=generator, dtype=dtype)
        + 1.5 * torch.randn(dim, generator=generator, dtype=dtype)
        for _ in range(num_clients)
    ]


def ridge_clients(
    num_clients: int = 4, per_client: int = 20, dim: int = 5, seed: int = 0, dtype=torch.float64
) -> list[QuadraticLoss]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, generator=gen, dtype=dtype)
    return [
        ridge_loss(X, X @ w + 0.5 * torch.randn(per_client, generator=gen, dtype=dtype))
        for X in _client_inputs(num_clients, per_client, dim, gen, dtype)
    ]


def logistic_clients(
    num_clients: int = 4, per_client: int = 30, dim: int = 3, seed: int = 0, dtype=torch.float64
) -> list[LogisticLoss]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, generator=gen, dtype=dtype)
    out = []
    for X in _client_inputs(num_clients, per_client, dim, gen, dtype):
        y = (torch.rand(per_client, generator=gen, dtype=dtype) < torch.sigmoid(X @ w)).to(dtype)
        out.append(LogisticLoss(X, y))
    return out


def softmax_clients(
    num_clients: int = 3, per_client: int = 30, dim: int = 3, num_classes: int = 3, seed: int = 0, dtype=torch.float64
) -> list[SoftmaxLoss]:
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(num_classes, dim, generator=gen, dtype=dtype)
    out = []
    for X in _client_inputs(num_clients, per_client, dim, gen, dtype):
        y = torch.multinomial(torch.softmax(X @ W.T, dim=1), 1, generator=gen).squeeze(1)
        out.append(SoftmaxLoss(X, y, num_classes))
    return out


def pooled(losses):
    """The centralised problem: all clients' data in one loss of the same kind."""
    first = losses[0]
    if isinstance(first, QuadraticLoss):
        return QuadraticLoss(
            A=sum(loss.A for loss in losses),
            b=sum(loss.b for loss in losses),
            c=sum(loss.c for loss in losses),
            num_examples=sum(loss.num_examples for loss in losses),
        )
    X = torch.cat([loss.X for loss in losses])
    y = torch.cat([loss.y for loss in losses])
    if isinstance(first, LogisticLoss):
        return LogisticLoss(X, y)
    if isinstance(first, SoftmaxLoss):
        return SoftmaxLoss(X, y, first.num_classes)
    raise TypeError(f"cannot pool {type(first).__name__}")
