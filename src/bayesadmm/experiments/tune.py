"""Choosing a method's hyperparameters on the validation split (never the test set) with Optuna.

    bayesadmm tune fmnist-heterog10 method=fedprox rounds=20 --trials 20 --out runs/tune-fedprox

Each trial is a run (`experiments.build.run`) with `validation=` a held-out part of the training set (0.1 unless
set), scored by its validation metric at its last round (by default the likelihood's `config.TUNING_METRIC`:
`val_acc`, maximised, for classification; `val_rmse`, minimised, for Gaussian regression). A coverage metric
(`val_coverage90`) is tuned towards its nominal level: |coverage − 0.90| is minimised, since an interval that covers
everything is as wrong as one that covers too little. The posterior predictive's metrics (`ens_val_nll`,
`ens_val_coverage90`, ...) are tuned the same way, for a method whose posterior has draws (a point estimate's runs
report none, which its first round refuses). A trial reports its score every round, and Optuna's median
pruner stops a trial whose curve is below the median of the earlier trials' at the same round (after a few rounds and
trials), so hopeless settings cost little.

The search space of each method is declared in its spec (`MethodSpec.search_space`; the method's module says where
each comes from), per parameter: {"around": [low, high]} (log-uniform from low to high times the run's own value:
the scenario's preset, or NAME=VALUE given to the tune, so the search is where that scenario's good values are),
optionally with an absolute range for runs that set no value (the method's default is no centre), {"log": [low,
high]} (log-uniform), {"range": [low, high]} (uniform) or {"choices": [...]}. A relative entry without an absolute
one, in a run that sets no positive value, is refused, naming the fix. The first trial of a new study runs the run's
own values where the space holds them, so the chosen setting is never worse on the validation split than the preset.
Local epochs and batch size stay at the preset's, so every method gets the same compute per round. `space` entries
NAME=around:LOW:HIGH, NAME=log:LOW:HIGH, NAME=range:LOW:HIGH or NAME=a,b,c add or replace parameters.

The study lives in a SQLite file in the output folder (study.db; inspect it with Optuna's own tools, e.g.
optuna-dashboard sqlite:///.../study.db), and each trial's run in trial-NNNN/. A tune killed at any moment and
started again goes on: a trial cut off by the kill (found by its stopped heartbeat) is tried again with the same
values, from its run's last checkpoint; finished trials count toward the budget (`trials`, or `round_budget` rounds
over all trials). `report` writes report.md (the chosen values, every trial, and the command that runs the chosen
setting on the test set with several seeds) and curves.png (each trial's validation curve).
"""

from __future__ import annotations

import contextlib
import math
import re
import shlex
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bayesadmm.evaluation.diagrams import round_ticks
from bayesadmm.evaluation.results import read_run
from bayesadmm.experiments.build import run
from bayesadmm.experiments.config import (
    TUNING_METRIC,
    ConfigError,
    RunConfig,
    method_parameters,
    method_spec,
    resolve,
    set_hparams,
)
from bayesadmm.experiments.values import unknown
from bayesadmm.likelihoods import Classification

STUDY = "tune"


@dataclass(frozen=True)
class Param:
    """One searched hyperparameter: log-uniform or uniform in [low, high], or one of `choices`; or, before it is
    centred on the run's value (`centred`), "around": log-uniform in [low · value, high · value], with the absolute
    `fallback` for a run that sets no value."""

    name: str
    kind: str  # log, range, choices or around
    low: float = 0.0
    high: float = 0.0
    choices: tuple = ()
    fallback: Param | None = None  # around only: the absolute range of a run that sets no value
    centre: float | None = None  # a log range made of an around: the run's value it is centred on

    def suggest(self, trial) -> Any:
        if self.kind == "around":
            raise ValueError(f"search space of {self.name}: around a value, not yet centred on the run's (centred)")
        if self.kind == "choices":
            return trial.suggest_categorical(self.name, list(self.choices))
        return trial.suggest_float(self.name, self.low, self.high, log=self.kind == "log")

    def describe(self) -> str:
        """As --space spells it (an around with its fallback: both, "around:0.1:10 else log:0.0001:0.01")."""
        if self.kind == "choices":
            return ",".join(str(c) for c in self.choices)
        text = f"{self.kind}:{self.low:g}:{self.high:g}"
        return text + (f" else {self.fallback.describe()}" if self.fallback is not None else "")

    def summary(self) -> str:
        """`describe`, and for a range centred on the run's value, that value."""
        return self.describe() + (f" (around {self.centre:g})" if self.centre is not None else "")

    def contains(self, value: Any) -> bool:
        if self.kind == "choices":
            return value in self.choices
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return self.kind != "around" and number and self.low <= value <= self.high

    def centred(self, value: Any, where: str = "") -> Param:
        """This parameter for a run whose value of it is `value` (None: the run sets none): an around made a log range
        about a positive value, else its fallback, else a ConfigError naming the fix; any other kind as it is."""
        if self.kind != "around":
            return self
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            return Param(self.name, "log", self.low * value, self.high * value, centre=float(value))
        if self.fallback is not None:
            return self.fallback
        has = "sets no" if value is None else f"sets {value!r}, no positive"
        raise ConfigError(
            f"search space of {self.name}: around:{self.low:g}:{self.high:g} times the run's value, but "
            f"{where or 'the run'} {has} {self.name} to centre on; give {self.name}=VALUE to centre the search on "
            f"VALUE, or --space {self.name}=log:LOW:HIGH"
        )


ABSOLUTE = ("log", "range", "choices")


def _param(name: str, spec: Mapping[str, Any]) -> Param:
    kinds = [k for k in ABSOLUTE if k in spec]
    if set(spec) - {"around", *ABSOLUTE} or len(kinds) > 1 or not (kinds or "around" in spec):
        raise ConfigError(
            f"search space of {name}: one of log, range or choices, or around (optionally with one of them), "
            f"got {', '.join(map(str, spec)) or 'nothing'}"
        )
    fallback = _absolute(name, kinds[0], spec[kinds[0]]) if kinds else None
    if "around" not in spec:
        assert fallback is not None
        return fallback
    low, high = _bounds(name, "around", spec["around"])
    if not (0 < low <= 1 <= high and low < high):
        raise ConfigError(
            f"search space of {name}: around takes factors 0 < low <= 1 <= high (the run's value inside), "
            f"got {low:g}, {high:g}"
        )
    return Param(name, "around", low, high, fallback=fallback)


def _absolute(name: str, kind: str, value: Any) -> Param:
    if kind == "choices":
        return Param(name, "choices", choices=tuple(value))
    low, high = _bounds(name, kind, value)
    if not (low < high and (kind == "range" or low > 0)):
        raise ConfigError(
            f"search space of {name}: need finite numbers low < high (and low > 0 for log), got {low}, {high}"
        )
    return Param(name, kind, low, high)


def _bounds(name: str, kind: str, value: Any) -> tuple[float, float]:
    try:
        low, high = (float(x) for x in value)
    except (TypeError, ValueError):
        raise ConfigError(f"search space of {name}: {kind} takes two numbers [low, high], got {value!r}") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ConfigError(
            f"search space of {name}: need finite numbers low < high (and low > 0 for log), got {low}, {high}"
        )
    return low, high


def parse_param(text: str) -> Param:
    """NAME=around:LOW:HIGH, NAME=log:LOW:HIGH, NAME=range:LOW:HIGH or NAME=a,b,c (numbers where they parse)."""
    name, sep, value = text.partition("=")
    if not sep or not value or not name.strip():
        raise ConfigError(
            f"--space takes NAME=around:LOW:HIGH, NAME=log:LOW:HIGH, NAME=range:LOW:HIGH or NAME=a,b,c; got {text!r}"
        )
    kind, _, bounds = value.partition(":")
    if kind in ("around", "log", "range"):
        try:
            low, high = (float(x) for x in bounds.split(":"))
        except ValueError:
            raise ConfigError(f"--space {name}: {kind}:LOW:HIGH with two numbers, got {value!r}") from None
        try:
            return _param(name.strip(), {kind: [low, high]})
        except ConfigError as exc:
            raise ConfigError(f"--space {text}: {exc}") from None
    choices = tuple(_number(v) for v in value.split(",") if v.strip())
    if not choices:
        raise ConfigError(f"--space {name}: no values in {value!r}; give a,b,c")
    return Param(name.strip(), "choices", choices=choices)


def _number(text: str):
    try:
        return int(text) if text.strip().lstrip("-").isdigit() else float(text)
    except ValueError:
        return text.strip()


def space_for(method: str, extra: Sequence[str] = ()) -> dict[str, Param]:
    """The declared search space of `method` with `extra` entries (NAME=...) added or replacing its own; its around
    entries are centred on a run's values by `Tuning` (`centre_space`)."""
    declared = method_spec(method).search_space
    space = {name: _param(name, spec) for name, spec in declared.items()}
    space.update({p.name: p for p in map(parse_param, extra)})
    if not space:
        raise ConfigError(f"{method} has no declared search space; give one with --space NAME=log:LOW:HIGH")
    valid = method_parameters(method)
    extra = sorted(set(space) - set(valid))
    if extra:
        raise ConfigError(unknown(f"{method} has no hyperparameters", extra, sorted(valid)))
    return space


def centre_space(space: Mapping[str, Param], values: Mapping[str, Any], where: str = "") -> dict[str, Param]:
    """`space` for a run whose hyperparameters are `values` (only those its scenario's preset, config file or command
    line set, not the method's defaults): each around entry made a log range about the run's value (`Param.centred`;
    `where` names the run in its refusal)."""
    return {name: param.centred(values.get(name), where) for name, param in space.items()}


def level_of(metric: str) -> float | None:
    """The nominal level of a coverage metric (val_coverage90 or the predictive's ens_val_coverage90: 0.9), which
    tuning aims at; None for another metric."""
    found = re.fullmatch(r"(?:ens_)?val_coverage(\d+)", metric)
    return int(found[1]) / 100 if found else None


def _probes(param: Param) -> list[Any]:
    """Values of `param` a trial may draw, to check before the study starts: each choice; for a range its ends and
    a number between them that is not a whole one (a range draws real numbers, which an integer setting refuses)."""
    if param.kind == "choices":
        return list(param.choices)
    inside = math.exp(math.log(param.low) * 0.63 + math.log(param.high) * 0.37) if param.kind == "log" else None
    return [param.low, param.high, inside if inside is not None else param.low + 0.37 * (param.high - param.low)]


def reported_metrics(config: RunConfig) -> list[str]:
    """The validation metrics that the runs of `config` may report: its likelihood's, read off one evaluation of two
    made-up examples (class labels for classification, numbers for the others), at the posterior's mean (val_*) and
    of the posterior predictive (ens_val_*, reported where the method's posterior has draws)."""
    import torch

    likelihood = config.make_likelihood()
    if isinstance(likelihood, Classification):
        outputs, targets = torch.zeros(1, 2, 2), torch.zeros(2, dtype=torch.long)
    else:
        outputs, targets = torch.zeros(1, 2, 1), torch.zeros(2)
    names = likelihood.metrics(likelihood.predictive(outputs), targets)
    return [f"{prefix}val_{name}" for prefix in ("", "ens_") for name in sorted(names)]


@contextlib.contextmanager
def _stable(optuna: Any) -> Iterator[None]:
    """Optuna's ExperimentalWarning silenced within: the heartbeat that retries a trial a kill cut off is "experimental"
    there (since v2.9), which a user of `tune` cannot act on. Only within, not for the process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ImportError("tuning needs Optuna: pip install -e '.[tune]'") from None
    return optuna


@dataclass
class Tuning:
    """A tune of one method on one scenario: `fixed` are KEY=VALUE settings of every trial (method= among them).
    `space` may hold around entries (`space_for`): they are centred on the run's values here, and `start` holds the
    run's own values of the searched parameters, the first trial of a new study, where the space holds them all."""

    scenario: str
    fixed: tuple[str, ...]
    space: dict[str, Param]
    out: Path
    trials: int = 20
    round_budget: int = 0  # > 0: stop once the trials have run this many rounds in all
    metric: str = ""  # "": the likelihood's (config.TUNING_METRIC), e.g. val_acc for classification
    heartbeat: int = 5  # seconds; a trial silent for three of them is taken as killed and tried again
    on_trial: Callable[[Any], None] | None = None  # called with each finished Optuna trial
    base: RunConfig = field(init=False)
    start: dict[str, Any] = field(init=False)  # the run's own values of the searched parameters ({}: not all held)

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        given = dict(o.split("=", 1) for o in self.fixed)
        self.fixed = tuple(self.fixed) + (() if "validation" in given else ("validation=0.1",))
        self.base, _ = resolve(self.scenario, self.fixed)
        if self.base.validation <= 0:
            raise ConfigError("tuning chooses on a validation split: set validation= in (0, 1), e.g. 0.1")
        own = {key: self.base.hparams[key] for key in set_hparams(self.scenario, self.fixed)}
        self.space = centre_space(self.space, own, f"{self.base.method} on {self.scenario}")
        held = {name: own[name] for name, param in self.space.items() if name in own and param.contains(own[name])}
        self.start = held if len(held) == len(self.space) else {}
        self.metric = self.metric or f"val_{TUNING_METRIC[self.base.likelihood]}"
        reported = reported_metrics(self.base)
        if self.metric not in reported:
            choose = ", ".join(reported)
            raise ConfigError(f"--metric {self.metric}: the runs report no such validation metric; choose {choose}")
        for param in self.space.values():  # every value a trial may draw must make a valid run, before study.db
            for value in _probes(param):
                try:
                    resolve(self.scenario, (*self.fixed, f"{param.name}={value}"))
                except ConfigError as exc:
                    hint = " (a range draws real numbers: list whole ones, a,b,c)" if param.kind != "choices" else ""
                    raise ConfigError(f"--space {param.name}={param.describe()}: {exc}{hint}") from None

    @property
    def level(self) -> float | None:
        """The nominal level a coverage metric is tuned towards (`level_of`); None for another metric."""
        return level_of(self.metric)

    @property
    def maximise(self) -> bool:
        if self.level is not None:
            return False  # |coverage − level|
        return not any(word in self.metric for word in ("nll", "ece", "brier", "rmse", "error"))

    @property
    def objective(self) -> str:
        """What the study optimises, in words: the metric, or a coverage metric's distance to its level."""
        return self.metric if self.level is None else f"|{self.metric} − {self.level:g}|"

    def score(self, value: float) -> float:
        """The study's value of a trial whose metric is `value`."""
        return value if self.level is None else abs(value - self.level)

    def study(self):
        optuna = _optuna()
        self.out.mkdir(parents=True, exist_ok=True)
        with _stable(optuna):
            storage = optuna.storages.RDBStorage(
                f"sqlite:///{(self.out / 'study.db').resolve()}",
                heartbeat_interval=self.heartbeat,
                grace_period=3 * self.heartbeat,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=2),
            )
        return optuna.create_study(
            study_name=STUDY,
            storage=storage,
            load_if_exists=True,
            direction="maximize" if self.maximise else "minimize",
            sampler=optuna.samplers.TPESampler(seed=self.base.seed),
            pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=2),
        )

    def run(self):
        """Run trials until the budget is spent; returns the Optuna study."""
        study = self.study()
        with _stable(_optuna()):
            _optuna().storages.fail_stale_trials(study)  # a trial cut off by a kill is retried before the budget counts
        if self.start and not study.trials:  # the preset's own values first: the chosen one is never worse than it
            study.enqueue_trial(self.start, user_attrs={"start": True})
        while not self._spent(study):
            study.optimize(self._objective, n_trials=1, catch=())
            if self.on_trial is not None:
                self.on_trial(study.trials[-1])
        return study

    def _spent(self, study) -> bool:
        counted = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED") or t.user_attrs.get("diverged")]
        rounds = sum(int(t.user_attrs.get("rounds", 0)) for t in study.trials)
        return len(counted) >= self.trials or (self.round_budget > 0 and rounds >= self.round_budget)

    def _objective(self, trial) -> float:
        optuna = _optuna()
        frozen = next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)
        # a trial cut off by a kill (retried by Optuna) or an interrupt (enqueued again, below) carries its folder
        # and goes on from that run's checkpoint, with the same values
        continued = frozen.user_attrs.get("run_dir")
        run_dir = self.out / (continued or f"trial-{trial.number:04d}")
        values = {name: param.suggest(trial) for name, param in self.space.items()}
        config, _ = resolve(self.scenario, (*self.fixed, *(f"{k}={v}" for k, v in values.items()), f"out={run_dir}"))
        trial.set_user_attr("run_dir", run_dir.name)
        history: list[float] = []

        def on_round(line: dict) -> None:
            value = line.get(self.metric)
            if value is None:
                point = " (ens_ metrics are the posterior predictive's; this method's posterior has no draws)"
                hint = point if self.metric.startswith("ens_") else ""
                raise ConfigError(f"the runs report no {self.metric}{hint}; metrics: {', '.join(sorted(line))}")
            history.append(value)
            trial.set_user_attr("rounds", int(line["round"]))
            trial.set_user_attr("metric", value)
            trial.report(self.score(value), int(line["round"]))
            if trial.should_prune():
                raise optuna.TrialPruned(f"round {line['round']}: {self.objective} worse than the median")

        resume = continued is not None and (run_dir / "checkpoint.pt").exists()
        try:
            result = run(config, resume=resume, progress=False, overwrite=not resume, on_round=on_round)
        except KeyboardInterrupt:
            trial.study.enqueue_trial(values, user_attrs={"run_dir": run_dir.name})
            raise
        if result.status == "diverged":
            trial.set_user_attr("diverged", result.message)
            return math.nan  # a failed trial: Optuna never chooses it
        value = float(result.history[-1][self.metric])
        trial.set_user_attr("metric", value)
        return self.score(value)

    def test_command(self, values: Mapping[str, Any], seeds: str = "0:3") -> str:
        """The command that runs `values` on the test set (no validation split) with several seeds, to the end of
        the schedule (a trial's `stop_at`, which shortens a tune, is dropped)."""
        settings = [o for o in self.fixed if not o.startswith(("validation=", "out=", "seed=", "stop_at="))]
        chosen = [f"{k}={v}" for k, v in values.items()]
        words = [
            "bayesadmm",
            "sweep",
            self.scenario,
            *settings,
            *chosen,
            f"seed={seeds}",
            "--out",
            str(self.out / "test"),
        ]
        return shlex.join(words)


def report(tuning: Tuning, study) -> str:
    """report.md and curves.png in the tune's folder; returns the report's text."""
    coverage = tuning.level is not None  # the metric and its distance to the level, in two columns
    rows, curves = [], {}
    for t in study.trials:
        folder = tuning.out / t.user_attrs.get("run_dir", f"trial-{t.number:04d}")
        state = "diverged" if t.user_attrs.get("diverged") else t.state.name.lower()
        state += " (the run's own values)" if t.user_attrs.get("start") else ""
        params = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in t.params.items())
        cells = [_metric_cell(t), _number_cell(t.value)] if coverage else [_metric_cell(t)]
        rows.append(f"| {t.number} | {state} | {params} | {t.user_attrs.get('rounds', 0)} | {' | '.join(cells)} |")
        if (folder / "metrics.jsonl").exists():
            history = read_run(folder)[1]
            curves[t.number] = [(line["round"], line[tuning.metric]) for line in history if tuning.metric in line]
    done = [t for t in study.trials if t.state.name == "COMPLETE" and t.value is not None and not math.isnan(t.value)]
    lines = [f"# Tuning {tuning.base.method} on {tuning.scenario} (validation split {tuning.base.validation})", ""]
    if done:
        best = study.best_trial
        raw = f" ({tuning.metric} = {_metric_cell(best)})" if coverage else ""
        lines += [
            f"Chosen: trial {best.number}, {tuning.objective} = {best.value:.4f}{raw} at round "
            f"{best.user_attrs.get('rounds')}",
            "",
            "    " + ", ".join(f"{k}={v}" for k, v in best.params.items()),
            "",
            "On the test set with several seeds:",
            "",
            "    " + tuning.test_command(best.params),
            "",
        ]
    else:
        lines += ["No trial has finished yet.", ""]
    space = ", ".join(f"{p.name}={p.summary()}" for p in tuning.space.values())
    header = f"{tuning.metric} | {tuning.objective}" if coverage else tuning.metric
    lines += [
        f"Search space: {space}",
        "",
        f"| trial | state | values | rounds | {header} |",
        "|---|---|---|---|---|" + ("---|" if coverage else ""),
    ]
    text = "\n".join(lines + rows) + "\n"
    (tuning.out / "report.md").write_text(text)
    _plot(curves, study.best_trial.number if done else None, tuning, tuning.out / "curves.png")
    return text


def _number_cell(value: Any) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.4f}"


def _metric_cell(trial) -> str:
    """A finished trial's metric at its last round ("—" for a pruned, failed or diverged one); a study written before
    trials kept it as "metric" holds it as the trial's value."""
    if trial.value is None or math.isnan(trial.value):
        return "—"
    return _number_cell(trial.user_attrs.get("metric", trial.value))


def _plot(curves: Mapping[int, list[tuple[int, float]]], best: int | None, tuning: Tuning, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for number, points in sorted(curves.items()):
        if points:
            rounds, values = zip(*points, strict=True)
            chosen = number == best
            axes.plot(
                rounds,
                values,
                color="C3" if chosen else "0.6",
                lw=2.2 if chosen else 0.9,
                zorder=3 if chosen else 1,
                label=f"trial {number} (chosen)" if chosen else None,
            )
    if tuning.level is not None:
        axes.axhline(tuning.level, color="k", lw=0.8, ls="--", label=f"nominal level {tuning.level:g}")
    axes.set_xlabel("round")
    round_ticks(axes)
    axes.set_ylabel(tuning.metric)
    axes.set_title(f"{tuning.base.method} on {tuning.scenario}: each trial's validation curve")
    if best is not None or tuning.level is not None:
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


__all__ = ["Param", "Tuning", "parse_param", "space_for", "centre_space", "level_of", "report"]
