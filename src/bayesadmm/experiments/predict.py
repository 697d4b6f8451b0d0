"""Predictions of a scenario's posterior on the scenarios' data sets: what `bayesadmm predict` prints and writes.

    prediction = predict("runs/fmnist-heterog10-ivon-admm-s0", "fashion-mnist-test")
    prediction.metrics["ens_acc"], prediction.probabilities   # (N, C): the posterior predictive

The source is a run directory of `bayesadmm run SCENARIO` (`bayesadmm.load`) or a posterior file such a run wrote
(`posterior.safetensors`), whose header records the scenario's zoo model, preprocessing and likelihood. A posterior of
your own model is used through the Python API instead: `Posterior.predict(model, x)`, `bayesadmm.evaluate`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

import bayesadmm
from bayesadmm.data import load_cifar, load_image_dataset
from bayesadmm.data.mnist_subset import MissingExtraError, load_mnist_subset
from bayesadmm.engine.rundir import read_bytes
from bayesadmm.evaluation.metrics import evaluate
from bayesadmm.experiments.build import build
from bayesadmm.experiments.config import ConfigError, RunConfig, make_likelihood
from bayesadmm.experiments.config import load as load_config
from bayesadmm.likelihoods import Likelihood
from bayesadmm.models import FlatModel, make_model
from bayesadmm.posterior.artefact import Posterior, layout_mismatch

__all__ = ["DATA_SETS", "Source", "Prediction", "source", "data_set", "predict"]


def _images(name: str, split: str) -> Callable[[str | None], tuple[Tensor, Tensor]]:
    def load(data_dir: str | None) -> tuple[Tensor, Tensor]:
        if name.startswith("cifar"):
            return load_cifar(name, split, data_dir=data_dir)

        return load_image_dataset(name, split, data_dir=data_dir)

    return load


def _mnist_subset(data_dir: str | None) -> tuple[Tensor, Tensor]:
    try:
        return load_mnist_subset()
    except MissingExtraError as exc:
        raise ConfigError(str(exc)) from None


# name -> (what it is, its loader of raw pixels 0-255 and labels; None: the run's own split, built from its config)
DATA_SETS: dict[str, tuple[str, Callable[[str | None], tuple[Tensor, Tensor]] | None]] = {
    "fashion-mnist-test": ("the FashionMNIST test set (10 000 images)", _images("fashion-mnist", "test")),
    "mnist-test": ("the MNIST test set (10 000 digits)", _images("mnist", "test")),
    "mnist-subset": ("the 5000 MNIST digits of the mnist-subset extra (out of distribution for FashionMNIST)",
                     _mnist_subset),
    "cifar10-test": ("the CIFAR-10 test set", _images("cifar10", "test")),
    "cifar100-test": ("the CIFAR-100 test set", _images("cifar100", "test")),
    "diabetes-test": ("the diabetes test rows of the run's seed, standardised as its training rows (run directory "
                      "only)", None),
}  # fmt: skip


class Source(NamedTuple):
    """A posterior with what it needs to predict: its model, likelihood, scenario record and (for a run directory)
    the run's config."""

    posterior: Any
    model: FlatModel
    likelihood: Likelihood
    scenario: dict
    config: RunConfig | None


class Prediction(NamedTuple):
    metrics: dict[str, float]  # at the mean and (ens_*) for the predictive, as `bayesadmm.evaluate` computes them
    predictive: Tensor  # likelihood.predictive under the draws: (N, C) class probabilities for classification
    targets: Tensor
    likelihood: Likelihood  # the scenario's: it decides what `predictive` holds


def _own_model(what: str) -> ConfigError:
    return ConfigError(
        f"{what} is not a scenario's (it records no zoo model); for your own model use the Python API: "
        "bayesadmm.load(run_dir, model=...).posterior.predict(model, x) or bayesadmm.Posterior.load(path)"
    )


def source(path: str | Path) -> Source:
    """The posterior of a scenario's run directory or posterior file, with its model and likelihood."""
    path = Path(path)
    if path.is_dir():
        result = bayesadmm.load(path) if _is_scenario_run(path) else None
        if result is None or result.model is None or result.scenario is None:
            raise _own_model(str(path))
        config = load_config(path)
        return Source(result.posterior, result.model, config.make_likelihood(), dict(result.scenario), config)
    posterior = Posterior.load(path)
    scenario = posterior.provenance.get("scenario")
    if not isinstance(scenario, dict) or not {"model", "model_kwargs", "likelihood"} <= set(scenario):
        raise _own_model(str(path))
    try:
        model = make_model(scenario["model"], **scenario["model_kwargs"])
        likelihood = make_likelihood(scenario["likelihood"], scenario.get("likelihood_params", {}))
    # RuntimeError: torch's, for arguments a layer cannot be made of (a negative size)
    except (TypeError, ValueError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path}: its scenario's model or likelihood cannot be built ({reason})") from None
    if model.layout != posterior.layout:
        raise ConfigError(
            f"{path}: its scenario's model ({scenario['model']} with {scenario['model_kwargs']}) does not fit its "
            f"posterior ({layout_mismatch(posterior.layout, model.layout)}); give the posterior file its run wrote"
        )
    return Source(posterior, model, likelihood, scenario, None)


def _is_scenario_run(run_dir: Path) -> bool:
    """Whether run_dir's config.json is a scenario's (`RunConfig`) rather than `bayesadmm.run`'s."""
    try:
        config = json.loads(read_bytes(run_dir / "config.json"))
    except (OSError, ValueError):
        return True  # `bayesadmm.load` says what is wrong with it
    return isinstance(config, dict) and "dataset" in config


def data_set(name: str, found: Source, data_dir: str | None = None) -> tuple[Tensor, Tensor]:
    """The inputs and targets of the data set `name` (`DATA_SETS`), preprocessed as the scenario's data was."""
    if name not in DATA_SETS:
        raise ConfigError(f"unknown data set {name!r}; valid: {', '.join(DATA_SETS)}")
    loader = DATA_SETS[name][1]
    if loader is None:
        return _run_split(name, found)
    X, y = loader(data_dir)
    scale = 1.0 if found.scenario.get("preprocessing", "raw") == "raw" else 1.0 / 255.0
    return X.float() * scale, y


def _run_split(name: str, found: Source) -> tuple[Tensor, Tensor]:
    """The run's own test rows, built as the run built them (tabular data standardised with the training rows)."""
    config = found.config
    if config is None or config.dataset != name.removesuffix("-test"):
        raise ConfigError(f"{name} is the test split of a run of that data set: give that run's directory")
    if config.validation > 0:
        raise ConfigError(f"the run held out validation={config.validation}; its {name} rows are not its test split")
    federation = build(config).federation
    assert federation.eval_X is not None and federation.eval_y is not None  # a scenario's federation has its test set
    return federation.eval_X, federation.eval_y


def predict(
    path: str | Path, data: str, *, data_dir: str | None = None, samples: int = 32, seed: int = 0
) -> Prediction:
    """The metrics (at the mean and for the predictive over `samples` draws from a generator seeded with `seed`) and
    the predictive of the posterior at `path` on the data set `data`."""
    found = source(path)
    X, y = data_set(data, found, data_dir)
    dtype = found.posterior.mean.dtype
    try:
        with torch.no_grad():
            found.model.forward(found.posterior.mean, X[:1].to(dtype))
    except RuntimeError as exc:
        raise ConfigError(
            f"the posterior's model ({found.scenario.get('model')}) does not take {data} inputs of shape "
            f"{tuple(X.shape[1:])} ({str(exc).splitlines()[0]}); choose a data set of its scenario"
        ) from None
    metrics = evaluate(
        found.model, found.posterior, X, y, samples, torch.Generator().manual_seed(seed), likelihood=found.likelihood
    )
    predictive = found.posterior.predict(
        found.model, X, samples, torch.Generator().manual_seed(seed), likelihood=found.likelihood
    )
    return Prediction(metrics, predictive, y, found.likelihood)
