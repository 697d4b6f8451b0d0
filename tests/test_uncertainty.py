"""The uncertainty metrics (bayesadmm.evaluation.uncertainty) against independent computations: AUROC against
scikit-learn and hand-made cases, the selective accuracies and the reliability diagram against brute force in plain
Python; the evaluation's `ood` (same draws, no draw more) and the comparison table's uncertainty columns."""

import json
import math

import pytest
import torch
from sklearn.metrics import roc_auc_score

from bayesadmm.evaluation.metrics import evaluate, evaluate_uncertainty
from bayesadmm.evaluation.uncertainty import (
    auroc,
    ood_auroc,
    predictive_entropy,
    reliability_diagram,
    selective_accuracy,
)
from bayesadmm.families import DiagonalGaussian, Posterior
from bayesadmm.likelihoods import Classification, GaussianRegression
from bayesadmm.likelihoods.classification import classification_metrics
from bayesadmm.models import FlatModel


def _probs(n: int, classes: int, seed: int, sharpness: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharpness * torch.randn(n, classes, generator=g), dim=1)


@pytest.mark.parametrize(
    ("negatives", "positives", "expected"),
    [
        ([0.1, 0.4], [0.35, 0.8], 3 / 4),  # 3 of the 4 pairs ordered
        ([0.5], [0.5, 1.0], (0.5 + 1) / 2),  # a tie counts a half
        ([1.0, 2.0], [3.0, 4.0], 1.0),
        ([3.0, 4.0], [1.0, 2.0], 0.0),
        ([2.0, 2.0, 2.0], [2.0], 0.5),
    ],
)
def test_auroc_of_hand_made_scores(negatives, positives, expected):
    assert auroc(torch.tensor(negatives), torch.tensor(positives)) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("decimals", [1, 2, 6])  # coarse rounding makes many ties
def test_auroc_equals_scikit_learn_with_ties(decimals):
    g = torch.Generator().manual_seed(decimals)
    negatives = torch.round(torch.rand(700, generator=g), decimals=decimals)
    positives = torch.round(torch.rand(300, generator=g) * 0.8 + 0.2, decimals=decimals)
    labels = [0] * 700 + [1] * 300
    expected = roc_auc_score(labels, torch.cat([negatives, positives]).numpy())
    assert auroc(negatives, positives) == pytest.approx(expected, abs=1e-12)


def test_ood_aurocs_equal_scikit_learn_of_entropy_and_max_probability():
    probs_in, probs_ood = _probs(400, 10, 0, sharpness=4.0), _probs(250, 10, 1, sharpness=1.0)
    labels = [0] * 400 + [1] * 250
    both = torch.cat([probs_in, probs_ood]).numpy()
    entropy = [-sum(p * math.log(p) for p in row if p > 0) for row in both.tolist()]
    result = ood_auroc(probs_in, probs_ood)
    assert result["ood_auroc_entropy"] == pytest.approx(roc_auc_score(labels, entropy), abs=1e-12)
    assert result["ood_auroc_maxprob"] == pytest.approx(roc_auc_score(labels, -both.max(axis=1)), abs=1e-12)
    assert predictive_entropy(torch.eye(3)).tolist() == [0.0, 0.0, 0.0]  # 0 log 0 = 0


def test_selective_accuracy_equals_brute_force():
    probs = _probs(333, 5, 2)
    probs[10:20] = probs[0]  # tied confidences: kept in input order
    y = torch.randint(0, 5, (333,), generator=torch.Generator().manual_seed(3))
    rows = probs.tolist()
    confidence = [max(r) for r in rows]
    correct = [r.index(max(r)) == label for r, label in zip(rows, y.tolist(), strict=True)]
    order = sorted(range(len(rows)), key=lambda i: -confidence[i])  # Python's sort is stable
    result = selective_accuracy(probs, y, (50, 80, 90, 100))
    for k in (50, 80, 90, 100):
        kept = math.ceil(k * len(rows) / 100)
        assert result[f"sel_acc{k}"] == pytest.approx(sum(correct[i] for i in order[:kept]) / kept, abs=1e-15)
    assert result["sel_acc100"] == pytest.approx(sum(correct) / len(rows), abs=1e-15)
    with pytest.raises(ValueError, match="integer per cents"):
        selective_accuracy(probs, y, (0.5,))


def test_reliability_diagram_equals_brute_force_and_its_ece_is_the_metric():
    probs = _probs(500, 4, 4, sharpness=2.0).to(torch.float32)
    probs[0] = torch.tensor([0.5, 0.2, 0.2, 0.1])  # a confidence on a bin edge: in the lower bin, (1/4, 2/4]
    y = torch.randint(0, 4, (500,), generator=torch.Generator().manual_seed(5))
    bins = 4  # edges exact in binary, so that the brute force below bins exactly as the diagram must
    diagram = reliability_diagram(probs, y, bins)
    members: list[list[tuple[float, bool]]] = [[] for _ in range(bins)]
    for row, label in zip(probs.tolist(), y.tolist(), strict=True):
        c = max(row)
        b = next(b for b in range(bins) if c <= (b + 1) / bins)  # B_b = (b/B, (b+1)/B]
        members[b].append((c, row.index(c) == label))
    assert diagram["count"] == [len(m) for m in members] and diagram["edges"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    for b, m in enumerate(members):
        if m:
            assert diagram["confidence"][b] == pytest.approx(sum(c for c, _ in m) / len(m), abs=1e-6)
            assert diagram["accuracy"][b] == pytest.approx(sum(ok for _, ok in m) / len(m), abs=1e-12)
        else:
            assert diagram["confidence"][b] is None and diagram["accuracy"][b] is None
    ece = sum(len(m) / 500 * abs(sum(ok for _, ok in m) / len(m) - sum(c for c, _ in m) / len(m)) for m in members if m)
    assert diagram["ece"] == pytest.approx(ece, abs=1e-6)
    for bins in (4, 15):  # the same bits as the logged metric
        assert reliability_diagram(probs, y, bins)["ece"] == classification_metrics(probs, y, bins)["ece"]


def _model_and_posterior():
    model = FlatModel.from_module(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)))
    g = torch.Generator().manual_seed(6)
    family = DiagonalGaussian(model.dim)
    mean, precision = torch.randn(model.dim, generator=g), 4 + torch.rand(model.dim, generator=g)
    return model, Posterior(family, family.from_moments(mean, precision))


def test_evaluate_with_ood_adds_the_metrics_and_changes_nothing_else():
    model, posterior = _model_and_posterior()
    g = torch.Generator().manual_seed(7)
    X, y, ood = torch.randn(60, 3, generator=g), torch.randint(0, 3, (60,), generator=g), 5 * torch.randn(40, 3)
    plain_gen, ood_gen = torch.Generator().manual_seed(8), torch.Generator().manual_seed(8)
    plain = evaluate(model, posterior, X, y, samples=5, generator=plain_gen, batch_size=16)
    scored = evaluate(model, posterior, X, y, samples=5, generator=ood_gen, batch_size=16, ood=ood)
    assert torch.equal(plain_gen.get_state(), ood_gen.get_state())  # no draw more
    assert {k: scored[k] for k in plain} == plain  # the same bits
    uncertainty = ["sel_acc50", "sel_acc80", "sel_acc90", "ood_auroc_entropy", "ood_auroc_maxprob"]
    assert set(scored) - set(plain) == {p + k for p in ("", "ens_") for k in uncertainty}
    # the predictive's OOD AUROC, from the same draws, recomputed here
    thetas = posterior.sample(5, torch.Generator().manual_seed(8))
    p_in = torch.softmax(model.forward_batched(thetas, X), -1).mean(0)
    p_out = torch.softmax(model.forward_batched(thetas, ood), -1).mean(0)
    labels = [0] * 60 + [1] * 40
    maxprob = -torch.cat([p_in, p_out]).amax(1)
    assert scored["ens_ood_auroc_maxprob"] == pytest.approx(roc_auc_score(labels, maxprob.numpy()), abs=1e-12)
    report = evaluate_uncertainty(model, posterior, X, y, ood, samples=5, generator=torch.Generator().manual_seed(8))
    assert report["predictive"]["metrics"]["ece"] == plain["ens_ece"]
    assert report["mean"]["reliability"]["ece"] == plain["ece"]
    assert report["predictive"]["metrics"]["ood_auroc_entropy"] == scored["ens_ood_auroc_entropy"]


def test_ood_is_refused_for_regression_and_for_inputs_of_another_shape():
    model, posterior = _model_and_posterior()
    X, y = torch.randn(10, 3), torch.randint(0, 3, (10,))
    with pytest.raises(ValueError, match="need likelihood=Classification"):
        evaluate(model, posterior, X, torch.randn(10, 3), likelihood=GaussianRegression(1.0), ood=torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"shaped as the test inputs \(3,\)"):
        evaluate(model, posterior, X, y, likelihood=Classification(), ood=torch.randn(4, 5))


def test_compare_tabulates_the_uncertainty_metrics_where_the_runs_have_them(tmp_path):
    from bayesadmm.evaluation.reports import compare

    for name, extra in (("with", {"test_ood_auroc_entropy": 0.8, "test_sel_acc90": 0.9}), ("without", {})):
        folder = tmp_path / name
        folder.mkdir()
        method = "fedavg" if name == "with" else "feddyn"
        (folder / "config.json").write_text(json.dumps({"method": method, "scenario": "toy", "seed": 0}))
        lines = [{"round": r, "test_acc": 0.5, "test_nll": 1.0, "test_ece": 0.1, **extra} for r in (1, 2, 3)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = compare([tmp_path / "with", tmp_path / "without"], [3])
    header = table.splitlines()[0]
    assert "OOD AUROC (entropy) @3" in header and "acc. @90 % (%) @3" in header and "max p" not in header
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in table.splitlines()[2:]}
    assert rows["fedavg (m_g)"][5:7] == ["0.800", "90.0"]  # one run each
    assert rows["feddyn (m_g)"][5:7] == ["—", "—"]
    only_plain = compare([tmp_path / "without"], [3])
    assert "OOD" not in only_plain.splitlines()[0]
