"""The categorical likelihood of classifiers (``Classification``) and its metrics (``classification_metrics``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from bayesadmm import rng
from bayesadmm.likelihoods.base import _check_draws


def confidence_bins(confidence: Tensor, bins: int) -> Tensor:
    """The bin ``b − 1`` (0-based) of each confidence ``c``, with ``B_b = ((b−1)/B, b/B]``: the ECE's bins, shared
    by the reliability diagram (``bayesadmm.evaluation.uncertainty``) so that its ECE is the logged one."""
    # bucketize(right=False) puts c in bin b iff edge_{b−1} < c ≤ edge_b, the half-open bins of the definition.
    inner_edges = torch.linspace(0.0, 1.0, bins + 1, dtype=confidence.dtype, device=confidence.device)[1:-1]
    return torch.bucketize(confidence, inner_edges)


def classification_metrics(probs: Tensor, y: Tensor, bins: int = 15) -> dict[str, float]:
    """``acc``, ``nll``, ``ece`` (``bins`` equal-width confidence bins, top-1) and ``brier`` of ``probs (N, C)``.

    ``nll`` clamps ``p_{i y_i}`` at the dtype's smallest normal number, so a confidently wrong prediction costs a
    large finite amount instead of making the average infinite.
    """
    if probs.dim() != 2 or y.shape != probs.shape[:1] or probs.shape[0] == 0:
        raise ValueError(
            f"probs must have shape (N, C) and y shape (N,) with N ≥ 1, got {tuple(probs.shape)} and {tuple(y.shape)}"
        )
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    y = y.to(device=probs.device, dtype=torch.long)
    n = probs.shape[0]

    confidence, prediction = probs.max(dim=1)
    correct = (prediction == y).to(probs.dtype)
    p_true = probs.gather(1, y[:, None]).squeeze(1)
    nll = -torch.log(p_true.clamp_min(torch.finfo(probs.dtype).tiny))
    onehot = torch.nn.functional.one_hot(y, probs.shape[1]).to(probs.dtype)
    brier = (probs - onehot).square().sum(dim=1)

    bin_index = confidence_bins(confidence, bins)
    # |B_b| (acc(B_b) − conf(B_b)) = Σ_{i ∈ B_b} (correct_i − c_i), so one scatter-add gives every bin's gap.
    gap = probs.new_zeros(bins).index_add_(0, bin_index, correct - confidence)

    return {
        "acc": correct.mean().item(),
        "nll": nll.mean().item(),
        "ece": (gap.abs().sum() / n).item(),
        "brier": brier.mean().item(),
    }


@dataclass(frozen=True)
class Classification:
    """Categorical ``p(y | f) = softmax(f)_y`` over logits ``f (N, C)`` and integer labels ``y (N,)``.

    The predictive averages probabilities, not logits (the Monte-Carlo estimate of ``E_q[softmax(f(x; θ))]``), and
    is scored by ``classification_metrics`` (also exported by ``bayesadmm.evaluation.metrics``): ``acc``, ``nll``,
    ``ece`` (``bins`` equal-width confidence bins) and ``brier``.
    """

    bins: int = 15

    def __post_init__(self) -> None:
        if isinstance(self.bins, bool) or not isinstance(self.bins, int) or self.bins < 1:
            raise ValueError(f"bins must be a positive integer, got {self.bins!r}")

    def mean_nll(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """``(1/N) Σ_i −log softmax(f_i)_{y_i}`` by ``F.cross_entropy`` (fused log-softmax, no probabilities)."""
        return F.cross_entropy(outputs, targets)

    def nll_grad(self, outputs: Tensor, targets: Tensor, weights: Tensor | float) -> Tensor:
        """``∂/∂F Σ_i w_i (−log softmax(f_i)_{y_i}) = w_i (softmax(f_i) − onehot(y_i))`` for logits ``(..., C)``,
        labels ``(...)`` and weights broadcastable to ``(...)``: a new tensor. Computed by the operation autograd runs
        for ``mean_nll`` (aten's log-softmax backward of −w at the label), so a weight of ``1/N`` gives the bits of
        ``mean_nll``'s backward pass."""
        if isinstance(weights, float) and not targets.is_floating_point():  # one weight: scattered as a number
            outer = torch.zeros_like(outputs).scatter_(-1, targets.unsqueeze(-1), -weights)
        else:
            weights = torch.as_tensor(weights, dtype=outputs.dtype, device=outputs.device)
            weights = weights.expand(outputs.shape[:-1]).unsqueeze(-1)
            if targets.is_floating_point():  # class probabilities, as F.cross_entropy takes them
                outer = targets * weights.neg()
            else:
                outer = torch.zeros_like(outputs).scatter_(-1, targets.unsqueeze(-1), weights.neg())
        log_probs = torch.log_softmax(outputs, dim=-1)
        return torch._log_softmax_backward_data(outer, log_probs, -1, outputs.dtype)

    def output_hessian(self, outputs: Tensor) -> Tensor:
        """``diag(p_i) − p_i p_iᵀ`` with ``p_i = softmax(f_i)``, shape ``(N, C, C)`` for logits ``(N, C)``."""
        p = torch.softmax(outputs, dim=-1)
        return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)

    def sample_targets(self, outputs: Tensor, generator: torch.Generator | None) -> Tensor:
        """One label per example drawn from ``softmax(f_i)``, shape ``(N,)``."""
        return rng.multinomial(torch.softmax(outputs, dim=-1), generator)

    def output_hessian_factor(self, outputs: Tensor) -> Tensor:
        """``L_i`` with ``L_i L_iᵀ = diag(p_i) − p_i p_iᵀ``, shape ``(N, C, C)``: column c is ``√p_ic (p_i − e_c)``,
        since ``Σ_c p_c (p − e_c)(p − e_c)ᵀ = diag(p) − ppᵀ``."""
        p = torch.softmax(outputs, dim=-1)
        eye = torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)
        return (p.unsqueeze(-1) - eye) * p.sqrt().unsqueeze(-2)

    def soft_targets(self, outputs: Tensor) -> Tensor:
        """The class probabilities ``softmax(f_i)``, shape ``(N, C)`` (``mean_nll`` takes probabilities as targets)."""
        return torch.softmax(outputs, dim=-1)

    def classes(self, targets: Tensor) -> Tensor:
        """The class of each target, ``(N,)``: the label, or the most probable class of probability targets ``(N, C)``
        (what FedLap-Func draws its memory within)."""
        return targets.argmax(dim=-1) if targets.is_floating_point() else targets

    def predictive(self, outputs: Tensor) -> Tensor:
        """``(1/S) Σ_s softmax(f_s)``, shape ``(N, C)``; for ``S = 1`` the same bits as ``softmax(f_1)``."""
        _check_draws(outputs)
        return torch.softmax(outputs, dim=-1).mean(dim=0)

    def metrics(self, summary: Tensor, targets: Tensor) -> dict[str, float]:
        """``acc``, ``nll``, ``ece``, ``brier`` of the predictive probabilities ``summary (N, C)``."""
        return classification_metrics(summary, targets, self.bins)
