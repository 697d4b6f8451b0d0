"""Classification metrics on hand-computed examples, and evaluation of posteriors and point estimates."""

import math

import pytest
import torch
from torch import nn

from bayesadmm.algorithms import PointEstimate
from bayesadmm.evaluation.metrics import classification_metrics, evaluate
from bayesadmm.families import DiagonalGaussian, Posterior
from bayesadmm.likelihoods import Classification
from bayesadmm.models import FlatModel, logistic, mlp


def _two_class(confidence, correct):
    """Rows (c, 1 − c) predicting class 0; label 0 where correct, else 1."""
    probs = torch.tensor([[c, 1 - c] for c in confidence])
    y = torch.tensor([0 if ok else 1 for ok in correct])
    return probs, y


def test_perfectly_calibrated_predictions():
    # Ten predictions at confidence 0.8, eight of them right: accuracy equals confidence in the only occupied bin.
    probs, y = _two_class([0.8] * 10, [True] * 8 + [False] * 2)
    m = classification_metrics(probs, y)
    assert m["acc"] == pytest.approx(0.8)
    assert m["ece"] == pytest.approx(0.0, abs=1e-12)
    assert m["nll"] == pytest.approx(-(8 * math.log(0.8) + 2 * math.log(0.2)) / 10)
    # right: 0.2² + 0.2² = 0.08, wrong: 0.8² + 0.8² = 1.28
    assert m["brier"] == pytest.approx((8 * 0.08 + 2 * 1.28) / 10)


def test_ece_of_over_and_under_confident_bins():
    # 4 predictions at 0.9 with 2 right (gap 0.4), 6 at 0.6 all right (gap 0.4 the other way).
    probs, y = _two_class([0.9] * 4 + [0.6] * 6, [True, True, False, False] + [True] * 6)
    assert classification_metrics(probs, y)["ece"] == pytest.approx(0.4 * 0.4 + 0.6 * 0.4)
    # With one bin the two gaps cancel partly: |0.8 − (4·0.9 + 6·0.6)/10| = 0.08.
    assert classification_metrics(probs, y, bins=1)["ece"] == pytest.approx(0.08)


def test_over_confident_predictions():
    probs, y = _two_class([0.95] * 4, [True, False, True, False])
    m = classification_metrics(probs, y)
    assert m["acc"] == pytest.approx(0.5)
    assert m["ece"] == pytest.approx(0.45)


def test_multiclass_values_and_confidence_one_lands_in_the_last_bin():
    probs = torch.tensor([[0.65, 0.25, 0.1], [0.1, 0.35, 0.55], [0.0, 1.0, 0.0]])
    y = torch.tensor([0, 1, 1])
    m = classification_metrics(probs, y, bins=10)
    assert m["acc"] == pytest.approx(2 / 3)
    assert m["nll"] == pytest.approx(-(math.log(0.65) + math.log(0.35) + 0.0) / 3)
    brier = [(0.35**2 + 0.25**2 + 0.1**2), (0.1**2 + 0.65**2 + 0.55**2), 0.0]
    assert m["brier"] == pytest.approx(sum(brier) / 3)
    # bins (0.6, 0.7] (0.5, 0.6] (0.9, 1.0], each with one example: |1 − 0.65| + |0 − 0.55| + |1 − 1|
    assert m["ece"] == pytest.approx((0.35 + 0.55 + 0.0) / 3)


def test_nll_stays_finite_for_a_zero_probability():
    m = classification_metrics(torch.tensor([[1.0, 0.0]]), torch.tensor([1]))
    assert math.isfinite(m["nll"]) and m["nll"] > 700
    assert m["acc"] == 0.0 and m["brier"] == pytest.approx(2.0) and m["ece"] == pytest.approx(1.0)


def test_metric_input_errors():
    with pytest.raises(ValueError, match="shape"):
        classification_metrics(torch.ones(3, 2) / 2, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="bins"):
        classification_metrics(torch.ones(3, 2) / 2, torch.zeros(3, dtype=torch.long), bins=0)


def _problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    model = mlp(in_features=6, hidden=(8,), num_classes=4)
    mean = model.initial_params(g)
    X, y = torch.randn(50, 6, generator=g), torch.randint(0, 4, (50,), generator=g)
    return model, mean, X, y


def _diagonal(mean, precision):
    family = DiagonalGaussian(mean.shape[0])
    return Posterior(family, family.from_moments(mean, torch.full_like(mean, precision)))


def test_point_estimate_gives_only_the_mean_metrics():
    model, mean, X, y = _problem()
    result = evaluate(model, PointEstimate(mean), X, y)
    assert set(result) == {"acc", "nll", "ece", "brier"}
    expected = classification_metrics(torch.softmax(model.forward(mean, X), -1), y)
    assert result == pytest.approx(expected)


def test_near_point_mass_posterior_predictive_equals_the_mean_prediction():
    model, mean, X, y = _problem()
    result = evaluate(model, _diagonal(mean, 1e16), X, y, samples=4, generator=torch.Generator().manual_seed(0))
    assert set(result) == {"acc", "nll", "ece", "brier", "ens_acc", "ens_nll", "ens_ece", "ens_brier"}
    for key in ("acc", "nll", "ece", "brier"):
        assert result[f"ens_{key}"] == pytest.approx(result[key], rel=1e-6, abs=1e-9)


def test_predictive_averages_probabilities_over_the_same_samples():
    model, mean, X, y = _problem()
    posterior = _diagonal(mean, 4.0)
    result = evaluate(model, posterior, X, y, samples=8, generator=torch.Generator().manual_seed(5))

    thetas = posterior.sample(8, torch.Generator().manual_seed(5))
    probs = torch.stack([torch.softmax(model.forward(t, X), -1) for t in thetas]).mean(0)
    expected = classification_metrics(probs, y)
    assert {k: result[f"ens_{k}"] for k in expected} == pytest.approx(expected)

    # Averaging logits instead is a different (wrong) predictive, so the check above can tell them apart.
    logits = torch.stack([model.forward(t, X) for t in thetas]).mean(0)
    assert classification_metrics(torch.softmax(logits, -1), y)["nll"] != pytest.approx(result["ens_nll"])


def test_batching_does_not_change_the_result():
    model, mean, X, y = _problem()
    posterior = _diagonal(mean, 4.0)
    whole = evaluate(model, posterior, X, y, samples=5, generator=torch.Generator().manual_seed(1))
    batched = evaluate(model, posterior, X, y, samples=5, generator=torch.Generator().manual_seed(1), batch_size=7)
    assert batched == pytest.approx(whole)


def test_float32_data_with_a_float64_posterior():
    model = logistic(3, 2)
    g = torch.Generator().manual_seed(0)
    mean = model.initial_params(g)
    X, y = torch.randn(10, 3, generator=g).float(), torch.randint(0, 2, (10,), generator=g)
    point = PointEstimate(mean)
    assert evaluate(model, point, X, y) == pytest.approx(evaluate(model, point, X.double(), y))


def test_evaluate_input_errors():
    model, mean, X, y = _problem()
    with pytest.raises(ValueError, match="samples"):
        evaluate(model, _diagonal(mean, 1.0), X, y, samples=0)
    with pytest.raises(ValueError, match="batch_size"):
        evaluate(model, PointEstimate(mean), X, y, batch_size=0)
    with pytest.raises(ValueError, match="rows"):
        evaluate(model, PointEstimate(mean), X, y[:-1])


def _classifier():
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def test_default_likelihood_gives_the_same_bits_as_softmax_batches():
    g = torch.Generator().manual_seed(3)
    model = FlatModel(_classifier)
    mean = model.initial_params(g)
    X, y = torch.randn(45, 5, generator=g), torch.randint(0, 3, (45,), generator=g)
    posterior = _diagonal(mean, 9.0)
    result = evaluate(model, posterior, X, y, samples=6, generator=torch.Generator().manual_seed(4), batch_size=16)

    # the classification-only evaluation, written out: softmax per batch, draws made once and shared by the batches
    probs = torch.cat([torch.softmax(model.forward(posterior.mean, xb), dim=-1) for xb in X.split(16)])
    thetas = posterior.sample(6, torch.Generator().manual_seed(4))
    ens = torch.cat([torch.softmax(model.forward_batched(thetas, xb), dim=-1).mean(dim=0) for xb in X.split(16)])
    expected = classification_metrics(probs, y) | {f"ens_{k}": v for k, v in classification_metrics(ens, y).items()}
    assert result == expected   # exact equality of every float
    assert evaluate(model, posterior, X, y, samples=6, generator=torch.Generator().manual_seed(4), batch_size=16,
                    likelihood=Classification(bins=15)) == expected


def test_classification_bins_reach_the_ece():
    model, mean, X, y = _problem()
    result = evaluate(model, PointEstimate(mean), X, y, likelihood=Classification(bins=1))
    probs = torch.softmax(model.forward(mean, X), -1)
    assert result["ece"] == pytest.approx(classification_metrics(probs, y, bins=1)["ece"])


def test_extra_metrics_see_the_whole_sets_outputs():
    model, mean, X, y = _problem()
    posterior = _diagonal(mean, 4.0)
    seen = {}

    def top_logit(outputs, targets):
        seen.setdefault("shapes", []).append((tuple(outputs.shape), tuple(targets.shape)))
        return outputs.max(dim=-1).values.mean().item()

    result = evaluate(model, posterior, X, y, samples=3, generator=torch.Generator().manual_seed(2), batch_size=16,
                      extra={"top_logit": top_logit})
    assert seen["shapes"] == [((1, 50, 4), (50,)), ((3, 50, 4), (50,))]
    assert set(result) == {"acc", "nll", "ece", "brier", "top_logit"} | {
        f"ens_{k}" for k in ("acc", "nll", "ece", "brier", "top_logit")}
    assert result["top_logit"] == pytest.approx(model.forward(mean, X).max(-1).values.mean().item())
    thetas = posterior.sample(3, torch.Generator().manual_seed(2))
    expected = torch.stack([model.forward(t, X) for t in thetas]).max(-1).values.mean().item()
    assert result["ens_top_logit"] == pytest.approx(expected)
    # a point estimate gives only the mean's value
    assert set(evaluate(model, PointEstimate(mean), X, y, extra={"top_logit": top_logit})) == {
        "acc", "nll", "ece", "brier", "top_logit"}


def test_extra_metric_errors():
    model, mean, X, y = _problem()
    point = PointEstimate(mean)
    with pytest.raises(ValueError, match="overwrite the metric 'acc'"):
        evaluate(model, point, X, y, extra={"acc": lambda o, t: 0.0})
    with pytest.raises(ValueError, match="reserved"):
        evaluate(model, point, X, y, extra={"ens_x": lambda o, t: 0.0})
    with pytest.raises(ValueError, match="must return a float"):
        evaluate(model, point, X, y, extra={"logits": lambda o, t: o})
    with pytest.raises(TypeError, match="callables"):
        evaluate(model, point, X, y, extra={"acc2": 1.0})
    with pytest.raises(TypeError, match="likelihood"):
        evaluate(model, point, X, y, likelihood="classification")
