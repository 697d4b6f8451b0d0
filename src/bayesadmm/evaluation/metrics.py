r"""Test metrics of a model, at the posterior mean and under the posterior predictive, for any likelihood.

``evaluate`` scores a trained posterior ``q`` on held-out data ``(x_i, y_i)``, ``i = 1, …, N``, in two ways:

    mean prediction        the outputs f(x; m),                                m = E_q[θ]     (S = 1)
    posterior predictive   the outputs f(x; θ_s), s = 1, …, S,                 θ_s ~ q

each turned into metrics by a ``bayesadmm.likelihoods.Likelihood`` (classification by default).

Classification (``Classification``): predicted class probabilities
``p_i = (1/S) Σ_s softmax(f(x_i; θ_s)) ∈ Δ^{C−1}`` (probabilities averaged, not logits: the Monte-Carlo estimate of
``E_q[p(y | x, θ)]``), with top-1 prediction ``ŷ_i = argmax_c p_ic`` and confidence ``c_i = max_c p_ic``:

    acc   = (1/N) Σ_i 1[ŷ_i = y_i]
    nll   = (1/N) Σ_i −log p_{i y_i}
    brier = (1/N) Σ_i Σ_c (p_ic − 1[y_i = c])²
    ece   = Σ_b (|B_b| / N) |acc(B_b) − conf(B_b)|,     B_b = {i : c_i ∈ ((b−1)/B, b/B]},  b = 1, …, B

(Guo et al., 2017), where ``acc(B_b)`` and ``conf(B_b)`` are the mean correctness and mean confidence in bin ``b``.

Regression (``GaussianRegression``, ``y ~ N(f(x), σ²)``), with ``f_si = f(x_i; θ_s)``,
``f̄_i = (1/S) Σ_s f_si`` and ``v_i = σ² + (1/S) Σ_s (f_si − f̄_i)²`` (written for scalar targets; with ``D``
outputs the densities multiply over the dimensions and rmse and coverage average over them):

    rmse               = sqrt((1/N) Σ_i (f̄_i − y_i)²)
    nll                = −(1/N) Σ_i log (1/S) Σ_s N(y_i; f_si, σ²)                 (the exact mixture)
    coverage_α         = (1/N) Σ_i 1[|y_i − f̄_i| ≤ Φ⁻¹((1 + α)/2) √v_i]         (moment-matched N(f̄_i, v_i))
    coverage90         = coverage_0.9
    calibration_error  = mean_α |coverage_α − α|,     α ∈ {0.1, 0.2, …, 0.9, 0.95}

Custom (``NegLogLikelihood`` of a per-example ``ℓ(f, y) = −log p(y | f)``):

    nll                = −(1/N) Σ_i log (1/S) Σ_s exp(−ℓ(f_si, y_i))

Any further metric is a callable of the raw outputs ``(S, N, ...)`` and the targets (``extra``).

Uncertainty (classification, ``ood=`` out-of-distribution inputs; ``bayesadmm.evaluation.uncertainty`` defines
them): the OOD AUROCs of the predictive entropy and of the max probability, and the selective accuracies at
50/80/90 % coverage, from the same mean and draws; ``evaluate_uncertainty`` adds the reliability diagrams.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from bayesadmm.evaluation.uncertainty import reliability_diagram, uncertainty_metrics
from bayesadmm.likelihoods import Classification, Likelihood
from bayesadmm.likelihoods.classification import classification_metrics
from bayesadmm.models import FlatModel

__all__ = ["classification_metrics", "evaluate", "evaluate_uncertainty", "check_ood"]

_CLASSIFICATION = Classification()  # the default likelihood (frozen, so one shared instance is safe)


def evaluate(
    model: FlatModel,
    posterior,
    X: Tensor,
    y: Tensor,
    samples: int = 32,
    generator: torch.Generator | None = None,
    batch_size: int = 2048,
    *,
    likelihood: Likelihood = _CLASSIFICATION,
    extra: Mapping[str, Callable[[Tensor, Tensor], float]] | None = None,
    ood: Tensor | None = None,
) -> dict[str, float]:
    """Metrics of the mean prediction and, for a distribution, of the posterior predictive (keys prefixed ``ens_``).

    ``posterior`` is anything with a ``.mean`` (``θ``-vector); if it also has ``.sample(n, generator)`` (a
    ``bayesadmm.families.Posterior``) the predictive is estimated from ``samples`` draws made once, with
    ``generator``, and shared by all batches, so the result does not depend on ``batch_size``.  A point estimate
    (``bayesadmm.algorithms.PointEstimate``) gives only the mean metrics.

    The metrics are ``likelihood.metrics`` of the concatenated ``likelihood.predictive`` summaries (for the default
    ``Classification``, ``acc``, ``nll``, ``ece``, ``brier``; its ``bins`` sets the ECE
    bins), plus, for each ``name, fn`` in ``extra``, ``name = fn(outputs, y)`` with the whole set's outputs at the
    mean, shape ``(1, N, ...)``, and ``ens_name`` with those under the draws, ``(S, N, ...)``; ``fn`` returns a float.
    The outputs are kept in memory only when ``extra`` is given.

    ``ood``: out-of-distribution inputs (classification only), scored with the same mean and draws; adds the
    uncertainty metrics of ``bayesadmm.evaluation.uncertainty.uncertainty_metrics`` (``ood_auroc_entropy``,
    ``ood_auroc_maxprob``, ``sel_acc50``, ``sel_acc80``, ``sel_acc90``, and their ``ens_`` versions). Without it the
    result is what it is without the argument: the same keys and bits, no draw more.

    ``X`` is processed ``batch_size`` examples at a time; the predictive's activations take ``samples`` times the
    memory of the mean's, so lower ``batch_size`` for large models.
    """
    for name, value in (("samples", samples), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if X.shape[0] == 0 or y.dim() == 0 or y.shape[0] != X.shape[0]:
        raise ValueError(f"X must have N ≥ 1 rows and y shape (N, ...), got {tuple(X.shape)} and {tuple(y.shape)}")
    if not isinstance(likelihood, Likelihood):
        raise TypeError(
            "likelihood must implement mean_nll, predictive and metrics (see bayesadmm.likelihoods), "
            f"got {likelihood!r}"
        )
    extra = dict(extra or {})
    for name, fn in extra.items():
        if not isinstance(name, str) or not callable(fn):
            raise TypeError(f"extra must map metric names to callables fn(outputs, targets) -> float, got {name!r}")
        if name.startswith("ens_"):
            raise ValueError(f"extra metric {name!r}: the prefix ens_ is reserved for the predictive's metrics")

    if ood is not None:
        check_ood(likelihood, ood, X)

    result: dict[str, float] = {}
    with torch.inference_mode():
        mean = posterior.mean
        _score(lambda xb: model.forward(mean, xb)[None], likelihood, X, y, batch_size, extra, ood, "", result)
        if hasattr(posterior, "sample"):
            thetas = posterior.sample(samples, generator)
            _score(
                lambda xb: model.forward_batched(thetas, xb), likelihood, X, y, batch_size, extra, ood, "ens_", result
            )
    return result


def check_ood(likelihood: Likelihood, ood: Tensor, X: Tensor) -> None:
    """Refuse OOD inputs that the uncertainty metrics cannot score: a likelihood without class probabilities, or
    inputs shaped unlike the evaluation set's ``X`` (a ValueError naming the fix)."""
    if not isinstance(likelihood, Classification):
        raise ValueError(
            f"OOD detection and selective prediction score class probabilities, so they need likelihood="
            f"Classification(), not {likelihood!r}; leave ood unset for this likelihood"
        )
    if ood.dim() != X.dim() or ood.shape[1:] != X.shape[1:] or ood.shape[0] == 0:
        raise ValueError(
            f"ood must hold N ≥ 1 inputs shaped as the test inputs {tuple(X.shape[1:])}, got {tuple(ood.shape)}"
        )


def _score(outputs_of, likelihood, X, y, batch_size, extra, ood, prefix: str, result: dict[str, float]) -> None:
    """``result[prefix + name]``: the likelihood's metrics of ``outputs_of`` (``(S, n_b, ...)`` of a batch) on
    ``(X, y)``, the uncertainty metrics where ``ood`` is given, then the ``extra`` metrics."""
    summary, outputs = _in_batches(outputs_of, likelihood, X, batch_size, bool(extra))
    metrics = likelihood.metrics(summary, y)
    if ood is not None:
        metrics |= uncertainty_metrics(summary, y, _in_batches(outputs_of, likelihood, ood, batch_size, False)[0])
    result |= {prefix + k: v for k, v in metrics.items()}
    _add_extra(result, prefix, extra, outputs, y)


def _in_batches(
    outputs_of: Callable[[Tensor], Tensor], likelihood: Likelihood, X: Tensor, batch_size: int, keep: bool
) -> tuple[Tensor, Tensor | None]:
    """The predictive summaries of ``outputs_of(xb) (S, n_b, ...)`` over consecutive slices ``xb`` of ``batch_size``
    rows, concatenated along the examples, and (if ``keep``) the outputs themselves, concatenated along dim 1."""
    summaries, outputs = [], []
    for xb in X.split(batch_size):
        out = outputs_of(xb)
        summaries.append(likelihood.predictive(out))
        if keep:
            outputs.append(out)
    return torch.cat(summaries), torch.cat(outputs, dim=1) if keep else None


def _add_extra(
    result: dict[str, float], prefix: str, extra: dict[str, Callable], outputs: Tensor | None, y: Tensor
) -> None:
    """``result[prefix + name] = float(fn(outputs, y))`` for each user metric, refusing to overwrite a key."""
    for name, fn in extra.items():
        key = prefix + name
        if key in result:
            raise ValueError(f"extra metric {name!r} would overwrite the metric {key!r}; rename it")
        value = fn(outputs, y)
        try:
            result[key] = float(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"extra metric {name!r} must return a float, got {value!r}") from exc


def evaluate_uncertainty(
    model: FlatModel,
    posterior,
    X: Tensor,
    y: Tensor,
    ood: Tensor | None = None,
    *,
    samples: int = 32,
    generator: torch.Generator | None = None,
    batch_size: int = 2048,
    bins: int = 15,
) -> dict[str, dict]:
    """The uncertainty evaluation of a classifier's posterior on ``(X, y)`` (and OOD inputs ``ood``):
    ``{"mean": {"metrics": ..., "reliability": ...}, "predictive": {...}}``, the predictive only for a posterior
    with ``.sample``. ``metrics`` are ``evaluate``'s (with ``ood``: the OOD AUROCs and selective accuracies; without:
    the selective accuracies) and ``reliability`` the diagram of
    ``bayesadmm.evaluation.uncertainty.reliability_diagram``.

    The probabilities are those ``evaluate`` scores (the same draws from ``generator``, the same batches), so the
    diagrams' ECE is ``evaluate``'s ``ece`` and ``ens_ece`` bit for bit: a finished run's numbers, given the run's
    evaluation generator of its last round (``bayesadmm.engine.simulate.generator_for(seed, round, EVALUATION)``).
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    likelihood = Classification(bins)
    if ood is not None:
        check_ood(likelihood, ood, X)
    report: dict[str, dict] = {}
    with torch.inference_mode():
        mean = posterior.mean
        sides = [("mean", lambda xb: model.forward(mean, xb)[None])]
        if hasattr(posterior, "sample"):
            thetas = posterior.sample(samples, generator)
            sides.append(("predictive", lambda xb: model.forward_batched(thetas, xb)))
        for side, outputs_of in sides:
            probs = _in_batches(outputs_of, likelihood, X, batch_size, False)[0]
            probs_ood = None if ood is None else _in_batches(outputs_of, likelihood, ood, batch_size, False)[0]
            metrics = likelihood.metrics(probs, y) | uncertainty_metrics(probs, y, probs_ood)
            report[side] = {"metrics": metrics, "reliability": reliability_diagram(probs, y, bins)}
    return report
