r"""Uncertainty evaluation of a classifier's predicted class probabilities: out-of-distribution detection, selective
prediction and the reliability diagram. Pure functions of probabilities ``p (N, C)`` (rows on the simplex) and labels.

With ``c_i = max_c p_ic`` the confidence, ``ŷ_i = argmax_c p_ic`` the prediction and
``H_i = −Σ_c p_ic log p_ic`` the predictive entropy (``0 log 0 = 0``):

    AUROC(s)       = P(s_o > s_i) + ½ P(s_o = s_i),  s_o a score of an OOD input, s_i of an in-distribution one
                     (the Mann–Whitney U statistic over n_in n_ood, from average ranks, so ties count a half)
    ood_auroc_entropy = AUROC(H)       ood_auroc_maxprob = AUROC(−c)   (OOD inputs are the positives)
    sel_acc<k>     = (1/m) Σ_{i ∈ top m} 1[ŷ_i = y_i],   m = ⌈k N / 100⌉, the m most confident examples
                     (sorted by confidence, ties kept in input order)
    reliability    per confidence bin B_b = {i : c_i ∈ ((b−1)/B, b/B]}: |B_b|, conf(B_b), acc(B_b) — the bins of the
                   ECE (``bayesadmm.likelihoods.classification.confidence_bins``), whose ECE this diagram reports

A random score has AUROC ½; a score that ranks every OOD input above every test input has 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from bayesadmm.likelihoods.classification import classification_metrics, confidence_bins

__all__ = [
    "COVERAGES",
    "auroc",
    "predictive_entropy",
    "ood_auroc",
    "selective_accuracy",
    "reliability_diagram",
    "uncertainty_metrics",
]

COVERAGES = (50, 80, 90)  # the coverages (per cent) of the selective accuracies a run reports


def _check_probs(probs: Tensor, what: str) -> None:
    if probs.dim() != 2 or probs.shape[0] == 0:
        raise ValueError(f"{what} must be class probabilities of shape (N, C) with N ≥ 1, got {tuple(probs.shape)}")


def auroc(negatives: Tensor, positives: Tensor) -> float:
    """The area under the ROC curve of a score that should be larger on ``positives`` than on ``negatives`` (1-D):
    ``P(s⁺ > s⁻) + ½ P(s⁺ = s⁻)``, from the average ranks of all scores together (ties share their mean rank)."""
    if negatives.dim() != 1 or positives.dim() != 1 or not len(negatives) or not len(positives):
        raise ValueError(
            f"auroc needs two non-empty 1-D score tensors, got {tuple(negatives.shape)} and {tuple(positives.shape)}"
        )
    # float64 for the ranks: their sums reach n² and must be exact for sets of 10⁴ examples
    scores = torch.cat([negatives, positives]).to(torch.float64)
    n_pos, n_neg = len(positives), len(negatives)
    is_positive = torch.cat([scores.new_zeros(n_neg), scores.new_ones(n_pos)])
    ordered, order = scores.sort()
    _, group, counts = torch.unique_consecutive(ordered, return_inverse=True, return_counts=True)
    counts = counts.to(torch.float64)
    ranks = (counts.cumsum(0) - (counts - 1) / 2)[group]  # a tie group's mean rank (1-based; cumsum: its last)
    rank_sum = (ranks * is_positive[order]).sum().item()
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def predictive_entropy(probs: Tensor) -> Tensor:
    """``H_i = −Σ_c p_ic log p_ic`` per row of ``probs (N, C)`` (``0 log 0 = 0``), in nats."""
    _check_probs(probs, "probs")
    return -torch.special.xlogy(probs, probs).sum(dim=1)


def ood_auroc(probs_in: Tensor, probs_ood: Tensor) -> dict[str, float]:
    """``ood_auroc_entropy`` and ``ood_auroc_maxprob``: how well the predictive entropy and the (negated) maximum
    probability separate the out-of-distribution inputs' probabilities ``probs_ood`` from the in-distribution
    ones ``probs_in`` (both ``(N, C)``, the same classes)."""
    _check_probs(probs_in, "probs_in")
    _check_probs(probs_ood, "probs_ood")
    if probs_in.shape[1] != probs_ood.shape[1]:
        raise ValueError(f"probs_in and probs_ood have {probs_in.shape[1]} and {probs_ood.shape[1]} classes")
    return {
        "ood_auroc_entropy": auroc(predictive_entropy(probs_in), predictive_entropy(probs_ood)),
        "ood_auroc_maxprob": auroc(-probs_in.amax(dim=1), -probs_ood.amax(dim=1)),
    }


def selective_accuracy(probs: Tensor, y: Tensor, coverages: Sequence[int] = COVERAGES) -> dict[str, float]:
    """``sel_acc<k>`` for each coverage ``k`` (an integer per cent in 1–100): the accuracy on the ``⌈kN/100⌉``
    examples of highest confidence ``max_c p_ic`` (ties in input order), the rest abstained on."""
    _check_probs(probs, "probs")
    if y.shape != probs.shape[:1]:
        raise ValueError(f"y must have shape (N,) = ({probs.shape[0]},), got {tuple(y.shape)}")
    for k in coverages:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 100:
            raise ValueError(f"coverages are integer per cents in 1–100, got {k!r}")
    confidence, prediction = probs.max(dim=1)
    correct = prediction == y.to(device=probs.device, dtype=torch.long)
    order = confidence.sort(descending=True, stable=True).indices
    ranked = correct[order].to(torch.float64).cumsum(0)  # correct answers among the m most confident, m = 1..N
    n = probs.shape[0]
    result = {}
    for k in coverages:
        kept = (k * n + 99) // 100  # ⌈kN/100⌉ in integers: no rounding of k/100
        result[f"sel_acc{k}"] = ranked[kept - 1].item() / kept
    return result


def reliability_diagram(probs: Tensor, y: Tensor, bins: int = 15) -> dict:
    """The reliability diagram of ``probs (N, C)``: per confidence bin (the ECE's ``bins`` equal-width bins) the
    ``count``, mean ``confidence`` and ``accuracy`` (None in an empty bin), the bin ``edges``, and the ``ece``
    exactly as ``classification_metrics`` computes it (the same bits as a run's logged ECE of these probabilities)."""
    _check_probs(probs, "probs")
    ece = classification_metrics(probs, y, bins)["ece"]  # checks y and bins too
    confidence, prediction = probs.max(dim=1)
    correct = (prediction == y.to(device=probs.device, dtype=torch.long)).to(torch.float64)
    index = confidence_bins(confidence, bins)
    count = torch.zeros(bins, dtype=torch.float64).index_add_(
        0, index.cpu(), torch.ones(len(index), dtype=torch.float64)
    )
    conf_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, index.cpu(), confidence.cpu().to(torch.float64))
    hits = torch.zeros(bins, dtype=torch.float64).index_add_(0, index.cpu(), correct.cpu())
    counts = [int(c) for c in count.tolist()]
    return {
        "bins": bins,
        "edges": torch.linspace(0.0, 1.0, bins + 1, dtype=torch.float64).tolist(),
        "count": counts,
        "confidence": [s / c if c else None for s, c in zip(conf_sum.tolist(), counts, strict=True)],
        "accuracy": [h / c if c else None for h, c in zip(hits.tolist(), counts, strict=True)],
        "ece": ece,
    }


def uncertainty_metrics(
    probs: Tensor, y: Tensor, probs_ood: Tensor | None = None, coverages: Sequence[int] = COVERAGES
) -> dict[str, float]:
    """The selective accuracies of ``probs`` and, with the OOD inputs' probabilities ``probs_ood``, the two OOD
    AUROCs: the scalar uncertainty metrics a run logs (``bayesadmm.evaluation.metrics.evaluate(..., ood=X_ood)``)."""
    result = selective_accuracy(probs, y, coverages)
    if probs_ood is not None:
        result |= ood_auroc(probs, probs_ood)
    return result
