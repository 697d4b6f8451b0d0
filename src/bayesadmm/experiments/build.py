"""A `RunConfig` (a preset, a config file, KEY=VALUE overrides) turned into the engine's objects, and run.

This layer, with config.py and the CLI, is the only one that reads dataset, partition, model, likelihood and method
names: data → subsample → validation split → (tabular data: standardisation with the training rows' statistics) →
partition → model → likelihood (`RunConfig.make_likelihood`) → algorithm factory → `Federation` and `Settings`, then
the engine's loop (`bayesadmm.engine.loop.run_federation`), the same one `bayesadmm.run` drives for a user's objects.
Everything is deterministic in the config: each set-up step draws from its own generator of (seed, 0, stream).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from bayesadmm.algorithms import Algorithm
from bayesadmm.clients import TensorClients
from bayesadmm.data import load_cifar, load_image_dataset
from bayesadmm.data.mnist_subset import MissingExtraError
from bayesadmm.data.ood import load_ood
from bayesadmm.data.partitions import make_partition, plot_label_distribution, subsample
from bayesadmm.data.synthetic import CLASSES, softmax_data
from bayesadmm.data.tabular import load_diabetes, split_rows, standardise
from bayesadmm.engine.federation import Federation, Result
from bayesadmm.engine.loop import run_federation
from bayesadmm.engine.personal import PERSONAL_SPLIT, FineTune, Personalisation, split_personal
from bayesadmm.engine.rundir import write_json
from bayesadmm.engine.settings import DTYPES, Settings
from bayesadmm.engine.settings import KEYS as SETTINGS_KEYS
from bayesadmm.engine.simulate import generator_for
from bayesadmm.evaluation import tracking
from bayesadmm.experiments.config import DATASETS, TARGETS, ConfigError, RunConfig, method_spec
from bayesadmm.experiments.privacy import dp_settings
from bayesadmm.federated import Assembled, assemble
from bayesadmm.likelihoods import Likelihood
from bayesadmm.models import MODELS, FlatModel, make_model
from bayesadmm.runspec import Personal, RunSpec

# The set-up streams, generator_for(seed, 0, <id>); 10⁹ + 3 and + 4 are the engine's (participants, evaluation), and
# 10⁹ + 7 (`engine.personal.PERSONAL_SPLIT`) the personal test split's.
SUBSAMPLE, PARTITION, INIT, VALIDATION, TEST_SPLIT = 10**9, 10**9 + 1, 10**9 + 2, 10**9 + 5, 10**9 + 6
DIABETES_TEST = 0.2  # the diabetes set's test rows, drawn per seed (it comes as one set of 442)
# dataset -> (numbers per input, classes; 0: the targets are not class labels), what `load_data` gives: a finished
# run's model is rebuilt from these without reading its data (`scenario_model`)
DATASET_SHAPES: dict[str, tuple[int, int]] = {
    "fashion-mnist": (784, 10),
    "mnist": (784, 10),
    "cifar10": (3072, 10),
    "cifar100": (3072, 100),
    "diabetes": (10, 0),
    "synthetic-softmax": (20, 5),  # bayesadmm.data.synthetic.SHAPE
}


@dataclass(frozen=True)
class Built:
    """What a config builds: the federation and its settings, and the split for the run directory's records."""

    federation: Federation
    settings: Settings
    spec: RunSpec  # the run's record, with the noise multiplier it uses (config.json's "run")
    parts: list[Tensor]  # client k's rows of the (subsampled) training set
    train_labels: Tensor  # the training targets (class labels, or real numbers or counts for regression)
    num_classes: int  # 0 where the targets are not class labels
    outputs: int  # the model's outputs: one per class, or 1 for a regression target
    personal_tests: list[Tensor] = field(default_factory=list)  # client k's personal test rows (personal_split > 0)

    def algorithm(self) -> Algorithm:
        return self.federation.make_algorithm()


class Data(NamedTuple):
    """A dataset's training and test sets as `load_data` gives them."""

    X: Tensor
    y: Tensor
    X_test: Tensor
    y_test: Tensor
    num_classes: int  # 0: the targets are not class labels
    tabular: bool = False  # features (and real targets) to standardise with the training rows' statistics


def load_data(config: RunConfig) -> Data:
    """Training and test inputs as floats (images: raw 0–255 or scaled to [0, 1]; tabular data: as recorded) and
    their targets: class labels, or for the diabetes set real numbers (likelihoods with real targets) or counts
    (likelihoods with count targets), split into training and test rows by the seed."""
    data_dir = config.data_dir or None
    if config.dataset == "diabetes":
        try:
            X, y = load_diabetes()
        except MissingExtraError as exc:
            raise ConfigError(str(exc)) from None
        train, test = split_rows(len(y), DIABETES_TEST, generator_for(config.seed, 0, TEST_SPLIT))
        X, y = X.float(), y.float()
        return Data(X[train], y[train], X[test], y[test], num_classes=0, tabular=True)
    if config.dataset == "synthetic-softmax":
        return Data(*softmax_data(), num_classes=CLASSES)
    if config.dataset in ("fashion-mnist", "mnist"):
        X, y = load_image_dataset(config.dataset, "train", data_dir=data_dir)
        X_test, y_test = load_image_dataset(config.dataset, "test", data_dir=data_dir)
        num_classes = 10
    elif config.dataset in ("cifar10", "cifar100"):
        X, y = load_cifar(config.dataset, "train", data_dir=data_dir)
        X_test, y_test = load_cifar(config.dataset, "test", data_dir=data_dir)
        num_classes = 10 if config.dataset == "cifar10" else 100
    else:
        raise ConfigError(f"unknown dataset {config.dataset!r}; valid: {', '.join(DATASETS)}")
    scale = 1.0 if config.preprocessing == "raw" else 1.0 / 255.0
    return Data(X.float() * scale, y, X_test.float() * scale, y_test, num_classes)


def load_ood_inputs(config: RunConfig) -> Tensor | None:
    """The configured out-of-distribution inputs (`ood`, `bayesadmm.data.ood`), preprocessed as `load_data`
    preprocesses the dataset's images (floats, raw or scaled to [0, 1]); None where `ood` is empty."""
    if not config.ood:
        return None
    try:
        images = load_ood(config.ood)
    except MissingExtraError as exc:
        raise ConfigError(f"ood={config.ood}: {exc}") from None
    scale = 1.0 if config.preprocessing == "raw" else 1.0 / 255.0
    return images.float() * scale


def settings_of(config: RunConfig) -> Settings:
    """The engine's `Settings` of a config: its keys of the same names (rounds, seed, ..., dtype)."""
    return Settings(**{key: getattr(config, key) for key in SETTINGS_KEYS})


def _in_precision(dtype: torch.dtype, *tensors: Tensor) -> list[Tensor]:
    """The floating tensors in `dtype` (the run's precision, made explicit), the others (labels) as they are."""
    return [t.to(dtype) if t.is_floating_point() else t for t in tensors]


def spec_of(config: RunConfig) -> RunSpec:
    """The run record of a configuration (`runspec.RunSpec`): its method with every hyperparameter, its likelihood,
    the engine's settings (`settings_of`), its differential privacy (`experiments.privacy`) and personalisation."""
    personal = None
    if config.personal_split:
        personal = Personal(config.personal_split, config.personal_every, config.finetune_epochs)
    return RunSpec.of(
        method_spec(config.method), config.hparams, likelihood=config.make_likelihood(), settings=settings_of(config),
        dp=dp_settings(config), personal=personal,
    )  # fmt: skip


def assembled(
    config: RunConfig, model: FlatModel, client_sizes: dict[int, int], likelihood: Likelihood | None = None
) -> tuple[Assembled, RunSpec]:
    """The configured run's algorithm (`federated.assemble` of `spec_of(config)` for `model`, the client sizes and
    `likelihood`, the clients' object, default the configuration's) and its record with the noise multiplier the
    run uses. A refusal of the privacy asked is a ConfigError (a setting of the configuration); the method's own
    refusals are raised as it raised them."""
    spec = spec_of(config)
    try:
        made = assemble(spec, model, client_sizes, likelihood)
    except ValueError as exc:
        if spec.dp is None or isinstance(exc, ConfigError):  # the method's own refusal, as it raised it
            raise
        raise ConfigError(str(exc)) from None  # the privacy asked of it: a setting of the configuration
    return made, dataclasses.replace(spec, dp=made.dp)


def make_algorithm_factory(
    config: RunConfig, model: FlatModel, client_sizes: dict[int, int], likelihood: Likelihood | None = None
):
    """The configured method's factory (`assembled`'s): its spec built with the configured hyperparameters and a
    context of the model, the client sizes, `likelihood` and the run's settings, private where it asks for it."""
    return assembled(config, model, client_sizes, likelihood)[0].make


def build(config: RunConfig) -> Built:
    """Everything a run needs, deterministically from the config."""
    X, y, X_test, y_test, num_classes, tabular = load_data(config)
    dtype = DTYPES[config.dtype]
    X, y, X_test, y_test = _in_precision(dtype, X, y, X_test, y_test)
    likelihood = config.make_likelihood()
    if config.data_fraction < 1.0:
        keep = subsample(len(y), config.data_fraction, generator_for(config.seed, 0, SUBSAMPLE))
        X, y = X[keep], y[keep]
    if config.validation > 0:
        # Hold out part of the training set and evaluate on it instead of the test set: for choosing
        # hyperparameters without looking at the test set. The metrics are then named val_* (not test_*).
        order = torch.randperm(len(y), generator=generator_for(config.seed, 0, VALIDATION))
        held = max(1, round(config.validation * len(y)))
        val_idx, train_idx = order[:held].sort().values, order[held:].sort().values
        X_test, y_test = X[val_idx], y[val_idx]
        X, y = X[train_idx], y[train_idx]
    if tabular:  # with the statistics of the rows the clients train on, so nothing of the evaluation set leaks in
        X, X_test = standardise(X, X_test)
        if TARGETS[config.likelihood] == "real":
            y, y_test = standardise(y, y_test)
    per_partition: dict[str, dict[str, float | int]] = {
        "two-level-dirichlet": {"alpha1": config.alpha1, "alpha2": config.alpha2},
        "per-class-dirichlet": {"alpha": config.alpha2},
        "sized-dirichlet": {"alpha1": config.alpha1, "alpha2": config.alpha2},
        "classes-per-client": {"classes": config.classes_per_client, "per_class": config.per_class},
        "shards": {"classes": config.classes_per_client, "per_class": config.per_class},
    }
    options = per_partition.get(config.partition, {})
    labels = y if num_classes else torch.zeros(len(y), dtype=torch.long)  # without classes, only the count matters
    parts = make_partition(
        config.partition, labels, config.clients, generator_for(config.seed, 0, PARTITION), **options
    )
    parts, tests = _personal_split(config, parts)
    outputs = num_classes or 1
    record = scenario_record(config, int(X[0].numel()), outputs)
    model = make_model(record["model"], **record["model_kwargs"])
    theta0 = model.initial_params(generator_for(config.seed, 0, INIT)).to(dtype)
    _check_fits(config, model, theta0, X[:1])
    X_ood = load_ood_inputs(config)
    # One client-ordered copy of the training set, each client a view of its rows: parallel workers then share
    # two tensors instead of two per client, and every execution path sees the same memory layout.
    order = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    bounds = torch.tensor([0] + [len(idx) for idx in parts]).cumsum(0).tolist()
    slices = {k: (bounds[k], bounds[k + 1]) for k in range(len(parts))}
    if config.exclude_client != -1:  # the federation without one client (e.g. retrained to compare with unlearning)
        if config.exclude_client not in slices or len(slices) == 1:
            raise ConfigError(f"exclude_client={config.exclude_client} must be -1 (none) or one of {sorted(slices)}")
        del slices[config.exclude_client]
    source = TensorClients(model, X[order], y[order], slices, likelihood, config.device)
    (make, _), spec = assembled(config, model, source.sizes, source.likelihood)
    federation = Federation(
        model,
        source,
        make,
        theta0,
        X_test.to(config.device),
        y_test.to(config.device),
        likelihood,
        eval_set="val" if config.validation > 0 else "test",
        scenario=record,
        personal=_personalisation(config, X, y, tests),
        ood_X=None if X_ood is None else X_ood.to(dtype).to(config.device),
    )
    return Built(federation, settings_of(config), spec, parts, y, num_classes, outputs, tests)


def _personal_split(config: RunConfig, parts: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """Each client's rows split into its training rows and its personal test rows (`personal_split` of them, drawn
    from their own stream, so that every other random choice stays as without it); none where it is 0."""
    if not config.personal_split:
        return parts, []
    generator = generator_for(config.seed, 0, PERSONAL_SPLIT)
    train, test = split_personal(dict(enumerate(parts)), config.personal_split, generator)
    return [train[k] for k in range(len(parts))], [test[k] for k in range(len(parts))]


def _personalisation(config: RunConfig, X: Tensor, y: Tensor, tests: list[Tensor]) -> Personalisation | None:
    """What the engine evaluates per client (`engine.personal`), or None without a personal split; the client that
    `exclude_client` leaves out has no test split either (it is not in the federation)."""
    if not tests:
        return None
    by_client = {
        k: (X[idx].to(config.device), y[idx].to(config.device))
        for k, idx in enumerate(tests)
        if k != config.exclude_client
    }
    return Personalisation(by_client, config.personal_every, FineTune(config.finetune_epochs))


def model_arguments(name: str, in_features: int, outputs: int) -> dict[str, int]:
    """The zoo model's size arguments: its outputs (`num_classes`), and its inputs where it takes flat ones."""
    arguments = {"num_classes": outputs}
    if "in_features" in inspect.signature(MODELS[name]).parameters:
        arguments["in_features"] = in_features
    return arguments


def scenario_record(config: RunConfig, in_features: int, outputs: int) -> dict:
    """What a scenario's posterior file records of its run (plain values, never code): the zoo model's name and
    keyword arguments, the data set and its preprocessing, the likelihood and its settings."""
    return {
        "name": config.scenario,
        "model": config.model,
        "model_kwargs": model_arguments(config.model, in_features, outputs),
        "dataset": config.dataset,
        "preprocessing": config.preprocessing,
        "likelihood": config.likelihood,
        "likelihood_params": dict(config.likelihood_params),
    }


def scenario_model(config: RunConfig) -> tuple[FlatModel, dict]:
    """The run's model and `scenario_record`, from the config alone (`DATASET_SHAPES`; no data is read)."""
    in_features, num_classes = DATASET_SHAPES[config.dataset]
    record = scenario_record(config, in_features, num_classes or 1)
    return make_model(record["model"], **record["model_kwargs"]), record


def _check_fits(config: RunConfig, model: FlatModel, theta0: Tensor, example: Tensor) -> None:
    """The model takes the dataset's inputs: found now, with both names, rather than as a shape error in round 1."""
    try:
        with torch.no_grad():
            model.forward(theta0, example)
    except RuntimeError as exc:
        raise ConfigError(
            f"model {config.model!r} does not take {config.dataset} inputs of shape {tuple(example.shape[1:])} "
            f"({str(exc).splitlines()[0]}); choose a model made for this dataset"
        ) from None


def run(
    config: RunConfig,
    resume: bool = False,
    progress: bool = True,
    overwrite: bool = False,
    built: Built | None = None,
    on_round: Callable[[dict], None] | None = None,
) -> Result:
    """Run (or resume) the configured experiment; the engine's `Result` (exit code 0 done, 3 diverged). `built`:
    the config's `build` if the caller has already made it (e.g. to check the settings before the run starts);
    `on_round(line)` is called with each round's metrics line, after the configured trackers (`log=`)."""
    built = built or build(config)
    title = f"{config.scenario} — {config.method} (seed {config.seed})"
    trackers: list[tracking.Trackers] = []  # made at the first round, once the run directory's checks have passed

    def each_round(line: dict) -> None:
        if config.trackers() and not trackers:
            trackers.append(tracking.for_run(config.trackers(), config.run_dir(), config.to_json(), title))
        if trackers:
            trackers[0](line)
        if on_round is not None:
            on_round(line)

    status = "FAILED"
    try:
        result = run_federation(
            built.federation,
            built.settings,
            config.run_dir(),
            config={**config.to_json(), "run": built.spec.to_json()},
            resume=resume,
            progress=progress,
            title=title,
            overwrite=overwrite,
            on_start=lambda run_dir: _write_split(config, built),
            on_round=each_round if config.trackers() or on_round is not None else None,
        )
        status = "FINISHED"
        return result
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if trackers:
            trackers[0].close(status)


PLOTTED_CLIENTS = 200  # labels.png shows the first this many clients


def _write_split(config: RunConfig, built: Built) -> None:
    """partition.json (each client's rows) and, for class labels, labels.png (the labels per client)."""
    split = {"clients": [idx.tolist() for idx in built.parts]}
    if built.personal_tests:  # each client's personal test rows, only where there are
        split["personal_test"] = [idx.tolist() for idx in built.personal_tests]
    write_json(config.run_dir() / "partition.json", split)
    if not built.num_classes:
        return
    shown = built.parts[:PLOTTED_CLIENTS]  # a bar per client: 10⁵ of them took minutes and showed nothing
    some = f" (the first {len(shown)} of {len(built.parts)})" if len(shown) < len(built.parts) else ""
    try:
        plot_label_distribution(
            built.train_labels,
            shown,
            built.num_classes,
            config.run_dir() / "labels.png",
            title=f"{config.scenario}: labels per client{some}",
        )
    except Exception as exc:  # noqa: BLE001 — a plot is never worth losing a run
        print(f"warning: could not plot the label distribution: {exc}", file=sys.stderr)


__all__ = [
    "Built",
    "build",
    "run",
    "Data",
    "load_data",
    "load_ood_inputs",
    "model_arguments",
    "scenario_model",
    "scenario_record",
    "DATASET_SHAPES",
    "settings_of",
    "make_algorithm_factory",
    "assembled",
    "spec_of",
    "SUBSAMPLE",
    "PARTITION",
    "INIT",
    "VALIDATION",
    "TEST_SPLIT",
]
