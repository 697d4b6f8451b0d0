r"""Test metrics of a classifier, at the posterior mean and under the posterior predictive.

For predicted class probabilities ``p_i ∈ Δ^{C−1}`` and labels ``y_i`` (``i = 1, …, N``), with top-1 prediction
``ŷ_i = argmax_c p_ic`` and confidence ``c_i = max_c p_ic``:

    acc   = (1/N) Σ_i 1[ŷ_i = y_i]
    nll   = (1/N) Σ_i −log p_{i y_i}
    brier = (1/N) Σ_i Σ_c (p_ic − 1[y_i = c])²
    ece   = Σ_b (|B_b| / N) |acc(B_b) − conf(B_b)|,     B_b = {i : c_i ∈ ((b−1)/B, b/B]},  b = 1, …, B

(Guo et al., 2017), where ``acc(B_b)`` and ``conf(B_b)`` are the mean correctness and mean confidence in bin ``b``.

:func:`evaluate` scores a trained posterior ``q`` on held-out data in two ways:

    mean prediction        p(y | x) = softmax(f(x; m)),                       m = E_q[θ]
    posterior predictive   p(y | x) = (1/S) Σ_s softmax(f(x; θ_s)),         θ_s ~ q

The predictive averages probabilities, not logits: it is the Monte-Carlo estimate of ``E_q[p(y | x, θ)]``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from bayesadmm.models import FlatModel

__all__ = ["classification_metrics", "evaluate"]


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

    # bucketize(right=False) puts c in bin b iff edge_{b−1} < c ≤ edge_b, the half-open bins of the definition.
    inner_edges = torch.linspace(0.0, 1.0, bins + 1, dtype=probs.dtype, device=probs.device)[1:-1]
    bin_index = torch.bucketize(confidence, inner_edges)
    # |B_b| (acc(B_b) − conf(B_b)) = Σ_{i ∈ B_b} (correct_i − c_i), so one scatter-add gives every bin's gap.
    gap = probs.new_zeros(bins).index_add_(0, bin_index, correct - confidence)

    return {
        "acc": correct.mean().item(),
        "nll": nll.mean().item(),
        "ece": (gap.abs().sum() / n).item(),
        "brier": brier.mean().item(),
    }


def evaluate(
    model: FlatModel,
    posterior,
    X: Tensor,
    y: Tensor,
    samples: int = 32,
    generator: torch.Generator | None = None,
    batch_size: int = 2048,
    bins: int = 15,
) -> dict[str, float]:
    """Metrics of the mean prediction and, for a distribution, of the posterior predictive (keys prefixed ``ens_``).

    ``posterior`` is anything with a ``.mean`` (``θ``-vector); if it also has ``.sample(n, generator)`` (a
    :class:`bayesadmm.families.Posterior`) the predictive is estimated from ``samples`` draws made once, with
    ``generator``, and shared by all batches, so the result does not depend on ``batch_size``.  A point estimate
    (:class:`bayesadmm.algorithms.PointEstimate`) gives only the mean metrics.

    ``X`` is processed ``batch_size`` examples at a time; the predictive's activations take ``samples`` times the
    memory of the mean's, so lower ``batch_size`` for large models.
    """
    for name, value in (("samples", samples), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if X.shape[0] == 0 or y.shape != X.shape[:1]:
        raise ValueError(f"X must have N ≥ 1 rows and y shape (N,), got {tuple(X.shape)} and {tuple(y.shape)}")

    with torch.inference_mode():
        mean = posterior.mean
        probs = _in_batches(lambda xb: torch.softmax(model.forward(mean, xb), dim=-1), X, batch_size)
        result = classification_metrics(probs, y, bins)
        if hasattr(posterior, "sample"):
            thetas = posterior.sample(samples, generator)
            predictive = _in_batches(
                lambda xb: torch.softmax(model.forward_batched(thetas, xb), dim=-1).mean(dim=0), X, batch_size
            )
            result |= {f"ens_{k}": v for k, v in classification_metrics(predictive, y, bins).items()}
    return result


def _in_batches(probs_of: Callable[[Tensor], Tensor], X: Tensor, batch_size: int) -> Tensor:
    """``probs_of(X)`` computed on consecutive slices of ``batch_size`` rows and concatenated."""
    return torch.cat([probs_of(xb) for xb in X.split(batch_size)])
