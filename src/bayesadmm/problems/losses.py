"""Convex client losses with closed-form gradients and Hessians.

Each loss is the SUM of per-example losses on one client, ℓ_k(θ) in the paper's notation (spec §1); the prior
ℓ_0 = δ/2‖θ‖² is never part of a client loss. Gradients and Hessians are written out rather than taken by autograd
because the local solvers (Newton, VON) call them in their inner loops; the tests check them against autograd.

All losses share one small interface:
    dim, num_examples, value(θ), grad(θ), hess(θ), hess_diag(θ)
and the per-example ones (logistic, softmax) also `batch_loss(θ, idx)`, the MEAN loss over the examples `idx`, which
is what stochastic local solvers (IVON) use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.functional import softplus


@dataclass(frozen=True)
class QuadraticLoss:
    """ℓ(θ) = ½ θᵀAθ − bᵀθ + c.

    In exponential-family form ℓ(θ) = −⟨(b, −½A), (θ, θθᵀ)⟩ + c, which is the assumption of Prop. D.1
    (one-round convergence of full-covariance BayesADMM).
    """

    A: Tensor
    b: Tensor
    c: Tensor | float = 0.0
    num_examples: int = 0

    def __post_init__(self) -> None:
        d = self.b.shape[0]
        if self.A.shape != (d, d) or self.b.dim() != 1:
            raise ValueError(
                f"QuadraticLoss needs A of shape (d, d) and b of shape (d,), got {tuple(self.A.shape)} "
                f"and {tuple(self.b.shape)}"
            )

    @property
    def dim(self) -> int:
        return self.b.shape[0]

    def value(self, theta: Tensor) -> Tensor:
        return 0.5 * theta @ self.A @ theta - self.b @ theta + self.c

    def grad(self, theta: Tensor) -> Tensor:
        return self.A @ theta - self.b

    def hess(self, theta: Tensor) -> Tensor:
        return self.A

    def hess_diag(self, theta: Tensor) -> Tensor:
        return torch.diagonal(self.A)


def ridge_loss(X: Tensor, Y: Tensor) -> QuadraticLoss:
    """½‖XΘ − Y‖² for inputs X (n, D) and targets Y (n,) or (n, C), with θ = vec(Θᵀ) (output-major: θ[c·D + j]).

    For C outputs the Hessian is block-diagonal, I_C ⊗ XᵀX, and b = vec((XᵀY)ᵀ).
    """
    Y2 = Y.reshape(Y.shape[0], -1)
    gram = X.T @ X
    num_outputs = Y2.shape[1]
    A = torch.block_diag(*([gram] * num_outputs))
    b = (X.T @ Y2).T.reshape(-1)
    return QuadraticLoss(A=A, b=b, c=0.5 * (Y2 * Y2).sum(), num_examples=X.shape[0])


@dataclass(frozen=True)
class LogisticLoss:
    """Binary logistic regression, ℓ(θ) = Σ_i softplus(x_iᵀθ) − y_i x_iᵀθ with y_i ∈ {0, 1}."""

    X: Tensor
    y: Tensor

    @property
    def dim(self) -> int:
        return self.X.shape[1]

    @property
    def num_examples(self) -> int:
        return self.X.shape[0]

    def value(self, theta: Tensor) -> Tensor:
        logits = self.X @ theta
        return (softplus(logits) - self.y * logits).sum()

    def grad(self, theta: Tensor) -> Tensor:
        return self.X.T @ (torch.sigmoid(self.X @ theta) - self.y)

    def batch_loss(self, theta: Tensor, idx: Tensor) -> Tensor:
        logits = self.X[idx] @ theta
        return (softplus(logits) - self.y[idx] * logits).mean()

    def _weights(self, theta: Tensor) -> Tensor:
        p = torch.sigmoid(self.X @ theta)
        return p * (1 - p)

    def hess(self, theta: Tensor) -> Tensor:
        return self.X.T @ (self._weights(theta)[:, None] * self.X)

    def hess_diag(self, theta: Tensor) -> Tensor:
        return self._weights(theta) @ (self.X * self.X)


@dataclass(frozen=True)
class SoftmaxLoss:
    """Multiclass logistic (softmax) regression, ℓ(θ) = Σ_i logsumexp(W x_i) − (W x_i)_{y_i}.

    θ = vec(W) with W of shape (C, D), class-major: θ[c·D + j] = W[c, j].
    Hessian: Σ_i (diag(p_i) − p_i p_iᵀ) ⊗ x_i x_iᵀ.
    """

    X: Tensor
    y: Tensor
    num_classes: int

    @property
    def dim(self) -> int:
        return self.num_classes * self.X.shape[1]

    @property
    def num_examples(self) -> int:
        return self.X.shape[0]

    def _W(self, theta: Tensor) -> Tensor:
        return theta.reshape(self.num_classes, self.X.shape[1])

    def _probs(self, theta: Tensor) -> Tensor:
        return torch.softmax(self.X @ self._W(theta).T, dim=1)

    def value(self, theta: Tensor) -> Tensor:
        logits = self.X @ self._W(theta).T
        return (torch.logsumexp(logits, dim=1) - logits.gather(1, self.y[:, None]).squeeze(1)).sum()

    def batch_loss(self, theta: Tensor, idx: Tensor) -> Tensor:
        return torch.nn.functional.cross_entropy(self.X[idx] @ self._W(theta).T, self.y[idx])

    def grad(self, theta: Tensor) -> Tensor:
        residual = self._probs(theta)
        residual[torch.arange(self.y.shape[0]), self.y] -= 1.0
        return (residual.T @ self.X).reshape(-1)

    def hess(self, theta: Tensor) -> Tensor:
        P = self._probs(theta)
        C, D = self.num_classes, self.X.shape[1]
        # Σ_i diag(p_i) ⊗ x_i x_iᵀ: one weighted Gram matrix per class on the diagonal blocks.
        diag_blocks = torch.einsum("nc,nd,ne->cde", P, self.X, self.X)
        # Σ_i (p_i ⊗ x_i)(p_i ⊗ x_i)ᵀ as one matrix product Zᵀ Z.
        Z = (P[:, :, None] * self.X[:, None, :]).reshape(self.X.shape[0], C * D)
        H = -(Z.T @ Z)
        H = H + torch.block_diag(*diag_blocks)
        return H

    def hess_diag(self, theta: Tensor) -> Tensor:
        P = self._probs(theta)
        return ((P * (1 - P)).T @ (self.X * self.X)).reshape(-1)
