"""Run configuration: defaults < scenario preset < config file < command line, every key checked.

A run is described by a `RunConfig` (what data, split, model, likelihood, method, schedule) plus the method's
hyperparameters (`hparams`), whose valid names, types and defaults are the fields of the method's `MethodSpec.hparams`
dataclass (`bayesadmm.algorithms.spec`), so a new algorithm needs no config code, and the likelihood's parameters
(`likelihood_params`, set as `likelihood.KEY=VALUE`), read off its dataclass likewise (the names:
`likelihoods.LIKELIHOODS`). Unknown keys and values of the wrong type are errors that list the valid keys; the
resolved configuration is saved with the run, beside the run's record (`runspec.RunSpec`, which `build.spec_of` makes
of it).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

from bayesadmm.data.ood import ood_problems
from bayesadmm.data.partitions import PARTITIONS
from bayesadmm.engine import settings as engine_settings
from bayesadmm.engine.identity import completed
from bayesadmm.engine.rundir import read_bytes
from bayesadmm.evaluation.tracking import TRACKERS, available
from bayesadmm.experiments import scenario_data
from bayesadmm.experiments.methods import method_parameters, method_spec, preset_for
from bayesadmm.experiments.privacy import DP_DEFAULTS, dp_problems
from bayesadmm.experiments.values import ConfigError, convert, kinds, suggestion, unknown
from bayesadmm.likelihoods import LIKELIHOODS, Likelihood
from bayesadmm.models import MODELS


@dataclass(frozen=True)
class RunConfig:
    scenario: str = "custom"
    dataset: str = "fashion-mnist"
    data_fraction: float = 1.0  # the "10 %" scenarios use 0.1 of the training set, drawn per seed
    validation: float = 0.0  # > 0: hold out this fraction of it and report val_* metrics on it, not test_*
    preprocessing: str = "raw"  # raw: pixels 0–255 (as the authors); scaled: [0, 1]
    partition: str = "two-level-dirichlet"
    clients: int = 10
    exclude_client: int = -1  # >= 0: the scenario without this client (its data unused), the others keep their ids
    alpha1: float = 1.0  # two-level Dirichlet: client sizes ~ Dir(alpha1)
    alpha2: float = 0.5  # two-level Dirichlet: class mix ~ Dir(alpha2)
    classes_per_client: int = 2
    per_class: int = 300
    model: str = "mlp"
    likelihood: str = "classification"  # the observation model p(y | f): a name of LIKELIHOODS
    method: str = "ivon-admm"
    rounds: int = 50
    stop_at: int = 0  # stop after this round (0: after `rounds`); schedules still span `rounds`
    seed: int = 0
    participation: float = 1.0  # fraction of clients per round
    eval_samples: int = 32  # posterior-predictive samples
    device: str = "cpu"
    workers: int = 0  # client updates in parallel processes (0: one per core on a CPU, 1 on a GPU; same results)
    checkpoint_every: int = 1  # write checkpoint.pt every this many rounds (and after the last)
    cohort: int = 0  # clients trained at a time as one batched computation (0: automatic; 1: one; engine.cohort)
    dtype: str = "float32"  # the precision the run computes in: float32 or float64
    compile: str = "auto"  # IVON's kernels compiled: auto (where the run wins the compilation back), on or off
    client_store: str = "auto"  # where client states live: memory, disk, or auto (disk above 2000 clients)
    personal_split: float = 0.0  # > 0: hold out this fraction of every client's data as its own test split
    personal_every: int = 0  # evaluate the personal models every N rounds too (0: after the last round only)
    finetune_epochs: int = 3  # local Adam epochs of the personal model of methods without client posteriors
    ood: str = ""  # out-of-distribution inputs for the uncertainty metrics: "mnist" (FashionMNIST; bayesadmm.data.ood)
    data_dir: str = ""
    out: str = ""  # run directory (default runs/<scenario>-<method>-s<seed>)
    log: str = ""  # also send each round's metrics to: tensorboard, mlflow or both ("tensorboard,mlflow")
    dp: str = ""  # differential privacy: "" none, "client" (experiments.privacy: the dp_* keys)
    dp_clip: float = 1.0  # the L2 bound of a client's update
    dp_noise: float = -1.0  # the noise multiplier (-1: calibrated from dp_epsilon)
    dp_epsilon: float = 0.0  # the privacy budget ε (0: none)
    dp_delta: float = 1e-5  # the δ of (ε, δ)-DP
    dp_precision_clip: float = 0.0  # the L2 bound of a Bayesian update's precision half (0: one clip, dp_clip)
    hparams: dict = field(default_factory=dict)
    likelihood_params: dict = field(default_factory=dict)  # the likelihood's settings, e.g. {"noise": 0.5}

    def run_dir(self) -> Path:
        return Path(self.out) if self.out else Path("runs") / f"{self.scenario}-{self.method}-s{self.seed}"

    def trackers(self) -> list[str]:
        """The trackers named by `log`."""
        return [name.strip() for name in self.log.split(",") if name.strip()]

    def to_json(self) -> dict:
        """config.json's content; keys added later (dtype, ood, exclude_client, personal_*, dp_*) only where set."""
        data = dataclasses.asdict(self)
        defaults = (("dtype", "float32"), ("ood", ""), ("exclude_client", -1), ("client_store", "auto"))
        for key, default in (*defaults, *DP_DEFAULTS.items()):
            if data[key] == default:
                del data[key]
        for key in ("personal_split", "personal_every", "finetune_epochs") if not data["personal_split"] else ():
            del data[key]
        return data

    def make_likelihood(self) -> Likelihood:
        """The configured likelihood object, e.g. `GaussianRegression(noise=0.5)` for likelihood "gaussian"."""
        return make_likelihood(self.likelihood, self.likelihood_params)


GENERAL_KEYS = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name not in ("hparams", "likelihood_params"))
PREPROCESSING = ("raw", "scaled")
# dataset -> the kinds of targets it can give: class labels ("classes"), standardised real numbers ("real") or
# non-negative integer counts ("counts"); the likelihood chooses among them (`TARGETS`)
DATASETS: dict[str, tuple[str, ...]] = {
    "fashion-mnist": ("classes",),
    "mnist": ("classes",),
    "cifar10": ("classes",),
    "cifar100": ("classes",),
    "diabetes": ("real", "counts"),  # scikit-learn's diabetes regression set: progression scores 25-346
    "synthetic-softmax": ("classes",),  # bayesadmm.data.synthetic: 10⁶ draws of a softmax model, 20 features
}
# likelihood name -> the targets it models (a kind of DATASETS)
TARGETS = {"classification": "classes", "gaussian": "real", "poisson": "counts"}
# likelihood name -> the metric `bayesadmm tune` scores trials by unless told (as val_<metric>)
TUNING_METRIC = {"classification": "acc", "gaussian": "rmse", "poisson": "nll"}


def presets() -> dict:
    """The built-in scenarios (the scenario files' settings: data, split, model and schedule), by name, each with
    "methods": every registered method's settings for it (`scenario_data.presets_by_method`)."""
    table = scenario_data.scenarios()
    by_method = scenario_data.presets_by_method()
    for scenario, values in table.items():
        values["methods"] = {method: dict(p[scenario]) for method, p in by_method.items() if scenario in p}
    return table


def likelihood_parameters(name: str) -> dict[str, inspect.Parameter]:
    """The settings of a likelihood: its dataclass's fields (e.g. GaussianRegression's `noise`)."""
    if name not in LIKELIHOODS:
        raise ConfigError(unknown("unknown likelihood", [name], LIKELIHOODS, quote=True))
    return dict(inspect.signature(LIKELIHOODS[name]).parameters)


def make_likelihood(name: str, params: typing.Mapping[str, object], spelt: str = "likelihood.{}") -> Likelihood:
    """The likelihood `name` with the settings `params` (already typed); a bad value is a `ConfigError`. `spelt`:
    how the caller's door spells a setting's key (`bayesadmm run`: likelihood.noise; a Flower run config:
    likelihood-noise), for the messages."""
    valid = likelihood_parameters(name)
    extra = sorted(set(params) - set(valid))
    if extra:
        raise ConfigError(unknown(f"likelihood {name} has no setting", extra, valid, spelt=spelt))
    missing = [k for k, p in valid.items() if p.default is inspect.Parameter.empty and k not in params]
    if missing:
        example = " ".join(f"{spelt.format(k)}=VALUE" for k in missing)
        raise ConfigError(f"likelihood {name} needs {', '.join(missing)}: set it as {example}")
    try:
        return LIKELIHOODS[name](**params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"likelihood {name}: {exc}") from None


def typed_likelihood(name: str, given: typing.Mapping[str, object], spelt: str = "likelihood.{}") -> Likelihood:
    """`make_likelihood` of settings not yet typed (strings of a command line, numbers of a TOML file), each converted
    to the type its field declares."""
    valid = likelihood_parameters(name)
    typed = {k: convert(spelt.format(k), v, kinds(valid[k], v)) if k in valid else v for k, v in given.items()}
    return make_likelihood(name, typed, spelt)


def resolve(source: str, overrides: typing.Sequence[str] = ()) -> tuple[RunConfig, list[str]]:
    """Build the config from a preset name or a JSON config file plus KEY=VALUE overrides; returns the config and a
    list of human-readable lines saying which values the command line changed."""
    table = presets()
    base = _read_source(source, table)
    pairs = _pairs(overrides)
    method, hparams, file_likelihood_params = _method_tables(base, source, table, pairs)
    hparam_specs = method_parameters(method)
    file_likelihood = str(base.get("likelihood", RunConfig.likelihood))
    likelihood = str(dict(pairs).get("likelihood", file_likelihood))
    likelihood_specs = likelihood_parameters(likelihood)
    # the file's likelihood settings belong to the file's likelihood: another one named here starts from its own
    likelihood_params = dict(file_likelihood_params) if likelihood == file_likelihood else {}

    general = {}
    for key, value in base.items():
        if key not in GENERAL_KEYS:
            raise ConfigError(unknown("unknown key", [key], GENERAL_KEYS, quote=True, where=f" in {source}"))
        general[key] = value
    sorted_into = {"general": general, "hparams": hparams, "likelihood": likelihood_params}
    changed = _sort_overrides(pairs, sorted_into, method, hparam_specs, likelihood, likelihood_specs)

    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.name != "hparams"}
    typed = {k: convert(k, v, (type(defaults[k]),)) for k, v in general.items()}
    _type_hparams(method, hparams, hparam_specs)
    for key, value in likelihood_params.items():
        if key in likelihood_specs:
            likelihood_params[key] = convert(f"likelihood.{key}", value, kinds(likelihood_specs[key], value))
    config = RunConfig(**typed, hparams=hparams, likelihood_params=likelihood_params)
    config.make_likelihood()  # its settings: known, complete and valid
    validate(config)
    return config, changed


def set_hparams(source: str, overrides: typing.Sequence[str] = ()) -> set[str]:
    """The names of the method's hyperparameters that the scenario's preset (or the config file) or `overrides` set:
    every one but those a run leaves at the method's defaults (`bayesadmm tune` centres its ranges on these)."""
    table = presets()
    pairs = _pairs(overrides)
    method, hparams, _ = _method_tables(_read_source(source, table), source, table, pairs)
    return set(hparams) | {key for key, _ in pairs if key in method_parameters(method)}


def _method_tables(base: dict, source: str, table: dict, pairs: list[tuple[str, str]]) -> tuple[str, dict, dict]:
    """The run's method, its hyperparameters from the scenario's preset or the config file (not yet typed, without
    the defaults), and the file's likelihood settings; `base` (the source's settings) loses its tables."""
    method_table, file_hparams, file_likelihood_params = _file_tables(base, source)
    method = str(dict(pairs).get("method", base.get("method", RunConfig.method)))
    if source in table:
        method_table = {method: preset_for(method_spec(method), source, {key for key, _ in pairs})}
    return method, {**method_table.get(method, {}), **file_hparams}, file_likelihood_params


def _read_source(source: str, table: dict) -> dict:
    """The settings of a scenario preset (with its name as `scenario`) or of a JSON config file."""
    if source in table:
        return {**table[source], "scenario": source}
    if not Path(source).is_file():
        raise ConfigError(
            f"{source!r} is neither a scenario{suggestion(source, table)} nor a config file; "
            f"the scenarios: {', '.join(sorted(table))}"
        )
    try:
        base = json.loads(Path(source).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {source}: {exc.strerror}") from None
    if not isinstance(base, dict):
        raise ConfigError(
            f"{source} holds a JSON {type(base).__name__}; a config file is one object of KEY: VALUE pairs, "
            'e.g. {"method": "fedavg", "rounds": 10}'
        )
    base.setdefault("scenario", Path(source).stem)
    return base


def _file_tables(base: dict, source: str) -> tuple[dict, dict, dict]:
    """The tables "methods" (name -> hyperparameters), "hparams", "likelihood_params" of `base`, taken out, checked."""
    method_table = base.pop("methods", {})
    file_hparams = base.pop("hparams", {})
    file_likelihood_params = base.pop("likelihood_params", {})
    if not isinstance(method_table, dict) or not all(isinstance(v, dict) for v in method_table.values()):
        raise ConfigError(f'"methods" in {source} must map a method name to an object of its hyperparameters')
    if not isinstance(file_hparams, dict):
        raise ConfigError(f'"hparams" in {source} must be an object of hyperparameters, e.g. {{"lr": 0.001}}')
    if not isinstance(file_likelihood_params, dict):
        raise ConfigError(f'"likelihood_params" in {source} must be an object of the likelihood\'s settings')
    return method_table, file_hparams, file_likelihood_params


def _pairs(overrides: typing.Sequence[str]) -> list[tuple[str, str]]:
    pairs = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"overrides are KEY=VALUE, got {item!r}")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _sort_overrides(
    pairs: list[tuple[str, str]],
    into: dict[str, dict],
    method: str,
    hparam_specs: typing.Mapping[str, inspect.Parameter],
    likelihood: str,
    likelihood_specs: typing.Mapping[str, inspect.Parameter],
) -> list[str]:
    """Each KEY=VALUE into the general keys, the method's hyperparameters or the likelihood's settings (`into`'s
    "general", "hparams", "likelihood"); an unknown key lists the valid ones. Returns the changes as KEY=VALUE."""
    changed = []
    for key, value in pairs:
        if key in GENERAL_KEYS:
            into["general"][key] = value
        elif key in hparam_specs:
            into["hparams"][key] = value
        elif key.startswith("likelihood."):
            into["likelihood"][key.removeprefix("likelihood.")] = value
        elif key in likelihood_specs:
            raise ConfigError(f"unknown key {key!r}: a setting of likelihood {likelihood} is set as likelihood.{key}=")
        elif owners := [name for name in LIKELIHOODS if key in likelihood_parameters(name)]:
            raise ConfigError(
                f"unknown key {key!r}: a setting of likelihood {' and '.join(owners)}, not of this run's "
                f"{likelihood}; set it as likelihood={owners[0]} likelihood.{key}=VALUE"
            )
        else:
            settings = [f"likelihood.{k}" for k in likelihood_specs]
            hint = suggestion(key, [*GENERAL_KEYS, *hparam_specs, *settings])
            raise ConfigError(
                f"unknown key {key!r}{hint}; valid keys: {', '.join(GENERAL_KEYS)}; "
                f"{method} hyperparameters: {', '.join(sorted(hparam_specs)) or '(none)'}; "
                f"likelihood settings: {', '.join(settings) or '(none)'}"
            )
        changed.append(f"{key}={value}")
    return changed


def _type_hparams(method: str, hparams: dict, hparam_specs: typing.Mapping[str, inspect.Parameter]) -> None:
    """Convert `hparams` in place to the spec's types; check none is unknown or missing and each passes the spec; then
    complete it with the defaults of those not set (`MethodSpec.resolved`: the run records every one)."""
    for key, spec in hparam_specs.items():
        if key in hparams:
            hparams[key] = convert(key, hparams[key], kinds(spec, hparams[key]))
    extra = sorted(set(hparams) - set(hparam_specs))
    if extra:
        raise ConfigError(unknown(f"{method} has no hyperparameters", extra, sorted(hparam_specs)))
    missing = sorted(k for k, p in hparam_specs.items() if p.default is inspect.Parameter.empty and k not in hparams)
    if missing:
        raise ConfigError(
            f"{method} needs {', '.join(missing)} (not in the preset; set them as KEY=VALUE; "
            f"`bayesadmm methods show {method}` lists the presets of the built-in scenarios)"
        )
    try:
        hparams.update(method_spec(method).resolved(**hparams))
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


_TARGET_WORDS = {"classes": "class labels", "real": "real-valued targets", "counts": "count targets"}


def validate(config: RunConfig) -> None:
    problems = ood_problems(config.ood, config.dataset, config.likelihood)
    for key, valid in (("dataset", tuple(DATASETS)), ("partition", tuple(PARTITIONS)), ("model", tuple(MODELS))):
        if getattr(config, key) not in valid:
            problems.append(unknown(f"unknown {key}", [getattr(config, key)], valid, quote=True))
    targets = TARGETS[config.likelihood]
    if config.dataset in DATASETS and targets not in DATASETS[config.dataset]:
        fitting = [name for name in LIKELIHOODS if TARGETS[name] in DATASETS[config.dataset]]
        problems.append(
            f"likelihood {config.likelihood} models {_TARGET_WORDS[targets]}, which dataset {config.dataset} does "
            f"not have; use likelihood={' or likelihood='.join(fitting)}, or another dataset"
        )
    if "classes" not in DATASETS.get(config.dataset, ("classes",)) and config.partition != "iid":
        problems.append(
            f"partition {config.partition} splits by class labels, which dataset {config.dataset} does not have; "
            "use partition=iid"
        )
    for key in ("alpha1", "alpha2"):
        if not 0 < getattr(config, key) < math.inf:
            problems.append(f"{key} must be a finite number > 0, got {getattr(config, key)}")
    if config.preprocessing not in PREPROCESSING:
        problems.append(f"preprocessing must be one of {PREPROCESSING}, got {config.preprocessing!r}")
    if not 0 < config.data_fraction <= 1:
        problems.append(f"data_fraction must be in (0, 1], got {config.data_fraction}")
    for key in ("validation", "personal_split"):
        if not 0 <= getattr(config, key) < 1:
            problems.append(f"{key} must be in [0, 1), got {getattr(config, key)}")
    if config.personal_every < 0:
        problems.append(f"personal_every must be >= 0 (0: after the last round only), got {config.personal_every}")
    for name in config.trackers():
        if name not in TRACKERS:
            problems.append(unknown("unknown tracker", [name], TRACKERS, quote=True, where=" in log"))
        elif available(name):
            problems.append(str(available(name)))
    # the run's schedule and execution (rounds, seed, participation, device, workers, dtype, ...): the engine's
    # Settings check them, with the same messages for every entry point
    problems.extend(engine_settings.problems({key: getattr(config, key) for key in engine_settings.KEYS}))
    problems.extend(dp_problems(config))
    for key in ("clients", "classes_per_client", "per_class", "finetune_epochs"):
        if getattr(config, key) < 1:
            problems.append(f"{key} must be >= 1, got {getattr(config, key)}")
    if problems:
        raise ConfigError("; ".join(problems))


def load(run_dir: Path) -> RunConfig:
    """The config saved with a run; a missing, unreadable or foreign config.json is a `ConfigError` naming it."""
    path = Path(run_dir) / "config.json"

    try:
        data = json.loads(read_bytes(path))  # not through a link, nor from a FIFO
    except FileNotFoundError:
        raise ConfigError(f"{path} is missing: {run_dir} is not a run directory of `bayesadmm run`") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} cannot be read ({exc}); is {run_dir} a run's folder?") from None
    # "run": the record `build.spec_of` made; "unlearned": the clients `bayesadmm.unlearn(..., out=)` removed (the
    # run leaves them out by exclude_client)
    records = {"run", "unlearned"}
    fields = {f.name for f in dataclasses.fields(RunConfig)} | records
    if not isinstance(data, dict) or not set(data) <= fields:
        extra = sorted(set(data) - fields) if isinstance(data, dict) else [type(data).__name__]
        raise ConfigError(f"{path} is not a bayesadmm run configuration (unexpected: {', '.join(extra)})")
    data = {k: v for k, v in data.items() if k not in records}
    # validated as a new configuration is: an edited config.json must not slip past the checks a command line meets
    tables = ("hparams", "likelihood_params")  # tables of settings, typed by what they configure
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.name not in tables}
    try:
        typed = {k: convert(k, v, (type(defaults[k]),)) for k, v in data.items() if k not in tables}
        for name in tables:
            if not isinstance(data.get(name, {}), dict):
                raise ConfigError(f"{name} must be a table of settings")
        config = RunConfig(**typed, **{name: data[name] for name in tables if name in data})
        validate(dataclasses.replace(config, device="cpu"))  # the device is the machine's, checked by the caller
        # an older record holds only the hyperparameters that were set: the others ran at their defaults
        config = dataclasses.replace(
            config, hparams=completed({"method": config.method, "hparams": config.hparams})["hparams"]
        )
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}; restore the file, or start a new run") from None
    return config if "compile" in data else dataclasses.replace(config, compile="on")  # older runs compiled
