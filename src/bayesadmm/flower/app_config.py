"""What a Flower run is: `flwr run`'s run config turned into the engine's `Settings` and `Federation` (server side),
and the setup from which every SuperNode builds the same model, likelihood and algorithm (node side).

Two kinds of run, told apart by the run config:

* your own model (``model = "module:function"``): the server holds only the evaluation set (``eval-data``, a
  .npz/.pt file of X and y), each SuperNode only its own examples (`loaders`); ``algorithm`` is a registry name or
  a factory ``module:function`` (your own method), ``hparams`` its keyword arguments as ``"key=value ..."``;
  ``likelihood`` one of `bayesadmm run`'s names (classification, gaussian, poisson) with its settings as
  ``likelihood-KEY`` (``likelihood-noise = 0.5``);
* a preset (``scenario`` and ``overrides``, as `bayesadmm run`): the server builds the preset as a local run does
  (its evaluation set, and the client sizes that partition.json records); a node reads its own file if its node
  config names one, else takes its slice of the preset (simulations and tests).

The setup (a JSON dict sent with every message) holds what a node needs and nothing of anyone's data: the model and
likelihood, the algorithm and its hyperparameters, the seed, dtype and device; the clients' sizes travel beside it.

Every key of a run config is read or refused (`refusal`): a key the run does not read is named with where it goes
(a hyperparameter in its method's table, ``METHOD.KEY``; a preset's setting in ``overrides``), or the key it is
nearest to.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from bayesadmm.algorithms import Algorithm
from bayesadmm.algorithms.spec import get, names
from bayesadmm.engine.federation import Federation
from bayesadmm.engine.settings import KEYS as SETTINGS_KEYS
from bayesadmm.engine.settings import Settings
from bayesadmm.engine.simulate import generator_for
from bayesadmm.experiments.build import _write_split, build, make_algorithm_factory, model_arguments, settings_of
from bayesadmm.experiments.config import GENERAL_KEYS, RunConfig, make_likelihood, resolve, typed_likelihood
from bayesadmm.experiments.values import suggestion
from bayesadmm.federated import assemble
from bayesadmm.flower.loaders import entry_point, load_tensors
from bayesadmm.likelihoods import Classification, GaussianRegression, Likelihood, Poisson
from bayesadmm.models import FlatModel, make_model
from bayesadmm.runspec import OWN, LikelihoodSpec, RunSpec
from bayesadmm.userdata import as_tensors, check_data

APP_CONFIG = "flower.json"  # in the run directory: the run config a resume starts from
# what a resume may change besides out (the run directory, wherever it is now): given and not "" (an app's default
# "" keeps the run's own)
_TUNABLE = ("stop-at", "round-timeout", "discovery-timeout", "device")
# every key of a run config (a preset's: scenario, overrides; your model's: model ... eval-data; both: the rest)
KEYS = {
    *("scenario", "overrides", "model", "algorithm", "hparams", "likelihood", "clients", "rounds", "seed"),
    *("participation", "eval-samples", "device", "dtype", "eval-data", "out", "resume", "overwrite"),
    *("method", "num-server-rounds", "fraction-train", "compile", "loader"),
    *_TUNABLE,
}
# Flower's spelling of a run config's keys → this module's (either is accepted; Flower's apps declare Flower's)
FLOWER_SPELLING = {"num-server-rounds": "rounds", "fraction-train": "participation"}
# a likelihood's settings in a run config: likelihood-KEY (TOML cannot hold both likelihood = "gaussian" and a
# likelihood.noise); its name is `likelihood`, one of `bayesadmm run`'s (likelihoods.LIKELIHOODS)
LIKELIHOOD_SETTING = "likelihood-"
# the settings of a local run that mean nothing on Flower, refused by name where a run config or `strategy` gives
# them: the nodes train their clients (one each), and the server keeps its copy of every client's state (what a
# checkpoint and a resume need) in memory (`runner.FlowerClients`), not in the local engine's client store
LOCAL_ONLY = {
    "client_store": "a setting of local runs: on Flower each SuperNode holds its client's state, the server its copy "
    "in memory",
    "workers": "a setting of local runs: on Flower each SuperNode trains its own client",
    "cohort": "a setting of local runs: on Flower each SuperNode trains its own client",
}
INIT = 10**9 + 2  # the initial weights' stream, generator_for(seed, 0, INIT), as experiments.build's INIT


@dataclass(frozen=True)
class Timeouts:
    """Bounds on every wait, so a run with dead nodes still ends. Seconds."""

    discovery: float = 120.0  # for the run's SuperNodes to connect and say which client they hold
    round: float = 600.0  # for the replies of one round
    poll: float = 0.1  # between two pulls of replies


@dataclass(frozen=True)
class FlowerRun:
    """A Flower run as the ServerApp executes it: the engine's settings, the run directory, the setup the nodes
    build from, how many clients to wait for, and (a preset run) its RunConfig."""

    settings: Settings
    run_dir: Path
    setup: dict
    clients: int
    timeouts: Timeouts = Timeouts()
    resume: bool = False
    overwrite: bool = False
    preset: RunConfig | None = None
    eval_data: str = ""
    app_config: dict = field(default_factory=dict)  # the run config, for flower.json

    @property
    def dtype(self) -> torch.dtype:
        """The run's precision (`Settings.dtype`, which the setup's "dtype" names for the nodes)."""
        return self.settings.torch_dtype

    @property
    def title(self) -> str:
        if self.preset is not None:
            return f"{self.preset.scenario} — {self.preset.method} (seed {self.preset.seed}, Flower)"
        return f"{self.setup['algorithm']} (seed {self.settings.seed}, Flower)"

    def config_record(self, sizes: Mapping[int, int], spec: RunSpec | None = None) -> dict:
        """config.json: a preset's RunConfig (so `bayesadmm resume` reads it as a local run's), else the run config
        and the clients' sizes; beside it the run's record (`spec`, a preset's as its build made it; default the
        setup's: `setup_spec`)."""
        record = (spec or setup_spec(self.setup, self.settings)).to_json()
        if self.preset is not None:
            return {**self.preset.to_json(), "run": record}
        run_config = {**self.app_config, "hparams": self.setup["hparams"]}  # every hyperparameter, as the nodes got it
        return {"flower": run_config, "clients": {str(k): n for k, n in sorted(sizes.items())}, "run": record}


def preset_run(config: RunConfig, timeouts: Timeouts | None = None, resume: bool = False) -> FlowerRun:
    """The Flower run of a preset RunConfig, in its precision (`dtype=`, float32 by default). A setting that means
    nothing on Flower (`LOCAL_ONLY`) is refused by name."""
    if config.client_store == "disk":
        raise ValueError(f"client_store=disk is {LOCAL_ONLY['client_store']}; leave it auto (or memory)")

    setup = {
        "preset": config.to_json(),
        "seed": config.seed,
        "device": config.device,
        "dtype": config.dtype,
        "clients": config.clients,
    }
    return FlowerRun(
        settings_of(config), config.run_dir(), setup, config.clients, timeouts or Timeouts(), resume, preset=config
    )


def flower_run(run_config: Mapping[str, Any]) -> FlowerRun:
    """The run a `flwr run` run config describes; ``resume = true`` continues the run in ``out`` with the run config
    it was started with (only out, stop-at, the timeouts and the device may change). Errors name the key and the
    fix."""
    run_config = dict(run_config)
    preset = not run_config.get("model")
    method = str(run_config.get("method" if preset else "algorithm") or ("" if preset else "ivon-admm"))
    problem = refusal(run_config, KEYS, method, preset=preset)
    if problem:
        raise ValueError(problem)
    if str(run_config.get("likelihood") or "").startswith("regression:"):
        raise ValueError(_old_spelling(str(run_config["likelihood"])))
    run_config = _our_spelling(run_config)
    if run_config.get("resume"):
        run_config = _resumed(run_config)
    timeouts = Timeouts(
        discovery=float(run_config.get("discovery-timeout", Timeouts.discovery)),
        round=float(run_config.get("round-timeout", Timeouts.round)),
    )
    if not run_config.get("model"):
        return _preset_flower_run(run_config, timeouts)
    return _user_flower_run(run_config, timeouts)


def refusal(
    run_config: Mapping[str, Any], valid: Collection[str], method: str, preset: bool = False, own: Collection[str] = ()
) -> str:
    """The one-line refusal of the keys of `run_config` that the run does not read ("" where it reads them all), each
    named with where it goes: `valid` keys, ``likelihood-KEY``, ``METHOD.KEY`` of a registered method's
    hyperparameter (a table ``[tool.flwr.app.config.METHOD]``, kept for when that method is chosen), and `own` keys
    (an app's own, which it reads itself) are read. `method`: the run's ("" where a preset chooses it)."""
    wrong = []
    for key in sorted(run_config):
        if key in valid or key in own or key.startswith(LIKELIHOOD_SETTING):  # a likelihood's: checked where built
            continue
        table, dot, name = key.partition(".")
        if dot:
            if table not in names():
                wrong.append(f"{key} (no method {table}{suggestion(table, names())})")
                continue
            fields = [f.name for f in get(table).fields()]
            if name.replace("-", "_") not in fields:
                near = suggestion(name.replace("-", "_"), fields, f"{table}.{{}}")
                wrong.append(f"{key} ({table} has no hyperparameter {name}{near})")
            continue
        where = _where(key, valid, method, preset)
        wrong.append(f"{key} ({where})" if where else key)
    if not wrong:
        return ""
    valid = [*sorted(valid), "likelihood-KEY", "METHOD.KEY", *sorted(own)]
    return f"unknown run config key(s) {', '.join(wrong)}; valid: {', '.join(valid)}"


def _where(key: str, valid: Collection[str], method: str, preset: bool) -> str:
    """Where a top-level key the run does not read goes, or the key it is nearest to ("" where none is near)."""
    name = key.replace("-", "_")
    if name in LOCAL_ONLY:
        return LOCAL_ONLY[name]
    if method in names() and name in {f.name for f in get(method).fields()}:
        return f"a hyperparameter of {method}: set it as {method}.{key}, in a [tool.flwr.app.config.{method}] table"
    hyperparameters = {f.name for spec in map(get, names()) for f in spec.fields()}
    if preset and (name in GENERAL_KEYS or name in hyperparameters or name.startswith("likelihood.")):
        return f'a setting of the preset: put it in overrides, overrides = "{name}=VALUE"'
    fields = {f.name for f in get(method).fields()} if method in names() else set()
    hint = suggestion(name, fields, f"{method}.{{}}") or suggestion(key, valid)
    return hint.strip().removeprefix("(").removesuffix(")")


def _old_spelling(spelt: str) -> str:
    noise = spelt.split(":", 1)[1]
    return (
        f'likelihood = "{spelt}": the Gaussian likelihood is named gaussian, its noise likelihood-noise: '
        f'likelihood = "gaussian" and likelihood-noise = {noise}'
    )


def run_likelihood(run_config: Mapping[str, Any]) -> Likelihood:
    """The likelihood a run config names (``likelihood``, default classification) with its settings
    (``likelihood-KEY``); errors name the run config's keys."""
    name = str(run_config.get("likelihood") or "classification")
    if name.startswith("regression:"):
        raise ValueError(_old_spelling(name))
    given = {
        key.removeprefix(LIKELIHOOD_SETTING).replace("-", "_"): value
        for key, value in run_config.items()
        if key.startswith(LIKELIHOOD_SETTING)
    }
    return typed_likelihood(name, given, LIKELIHOOD_SETTING + "{}")


def _our_spelling(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Flower's keys (num-server-rounds, fraction-train; 0 or absent: not set) as this module's, and the run's
    method's hyperparameter table (``METHOD.NAME`` keys, dashes or underscores; other methods' tables are left out)
    as ``hparams`` entries."""
    found = dict(run_config)
    for flower, ours in FLOWER_SPELLING.items():
        value = found.pop(flower, None)
        if value in (None, 0, 0.0, ""):
            continue
        if found.get(ours) not in (None, 0, 0.0, "", value):
            raise ValueError(f"{flower}={value} and {ours}={found[ours]} disagree: give one of them")
        found[ours] = value
    method = str(found.get("algorithm") if found.get("model") else found.get("method") or "")
    table = {
        key.split(".", 1)[1].replace("-", "_"): found.pop(key)
        for key in [k for k in found if "." in k]
        if key.split(".", 1)[0] == method
    }
    for key in [k for k in found if "." in k]:
        found.pop(key)  # another method's table, declared in the app for when it is chosen
    if table:
        found["hparams"] = {**parse_hparams(str(found.get("hparams") or "")), **table}
    return found


def _resumed(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The run config a run in ``out`` was started with (flower.json), in ``out`` (the run directory may have been
    moved since), with this one's stop-at, timeouts and device where it gives them."""
    out = str(run_config.get("out") or "")
    path = Path(out) / APP_CONFIG
    if not out or not path.exists():
        raise ValueError(
            f"resume=true needs out= naming a Flower run directory with {APP_CONFIG}; found none at {path}"
        )
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not readable as a Flower run's configuration ({exc}); restore it") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{path} is not a Flower run's configuration (a JSON table); restore it")
    tuned = {k: run_config[k] for k in _TUNABLE if run_config.get(k) not in (None, "")}
    spelt = str(saved.get("likelihood") or "")
    if spelt.startswith("regression:") and saved.get("model"):  # as `_app_config` records a Gaussian likelihood
        saved = {**saved, "likelihood": "gaussian", LIKELIHOOD_SETTING + "noise": float(spelt.split(":", 1)[1])}
    return {**saved, "stop-at": 0, **tuned, "out": out, "resume": True}  # as `bayesadmm resume`: to the end unless told


def _preset_flower_run(run_config: Mapping[str, Any], timeouts: Timeouts) -> FlowerRun:
    """A preset's run: its RunConfig from ``scenario`` and ``overrides`` (with out, stop-at and dtype), as locally."""
    overrides = shlex.split(str(run_config.get("overrides", "")))
    for key in ("method", "rounds", "participation", "device", "likelihood"):
        if run_config.get(key):
            overrides.append(f"{key}={run_config[key]}")
    for key, value in run_config.items():  # likelihood-KEY: as `bayesadmm run`'s likelihood.KEY
        if key.startswith(LIKELIHOOD_SETTING):
            setting = key.removeprefix(LIKELIHOOD_SETTING).replace("-", "_")
            overrides.append(f"likelihood.{setting}={value if isinstance(value, str) else json.dumps(value)}")
    for key, value in dict(run_config.get("hparams") or {}).items():  # as `bayesadmm run`'s KEY=VALUE
        overrides.append(f"{key}={value if isinstance(value, str) else json.dumps(value)}")
    if run_config.get("out"):
        overrides.append(f"out={run_config['out']}")
    if run_config.get("stop-at"):
        overrides.append(f"stop_at={int(run_config['stop-at'])}")
    if run_config.get("dtype"):
        overrides.append(f"dtype={run_config['dtype']}")
    config, _ = resolve(str(run_config.get("scenario") or "fmnist-heterog10"), overrides)
    resume, overwrite = bool(run_config.get("resume")), bool(run_config.get("overwrite"))
    base = preset_run(config, timeouts, resume)
    return FlowerRun(
        base.settings,
        base.run_dir,
        base.setup,
        base.clients,
        timeouts,
        resume,
        overwrite,
        base.preset,
        app_config=_app_config(run_config),
    )


def _user_flower_run(run_config: Mapping[str, Any], timeouts: Timeouts) -> FlowerRun:
    """A run of your own model: its Settings, and the setup every node builds the model and algorithm from."""
    if int(run_config.get("clients") or 0) < 0:
        raise ValueError("clients= must be the number of SuperNodes (clients) of the run, or 0: their num-partitions")
    settings = _settings(run_config)
    spelt = likelihood_spelling(run_likelihood(run_config))
    setup: dict[str, Any] = {
        "model": str(run_config["model"]),
        "algorithm": str(run_config.get("algorithm") or "ivon-admm"),
        "hparams": _recorded(str(run_config.get("algorithm") or "ivon-admm"), _hparams(run_config.get("hparams"))),
        "likelihood": spelt,
        "seed": settings.seed,
        "rounds": settings.rounds,  # for a registered method's schedules over the run (e.g. cosine=true)
        "device": settings.device,
        "dtype": settings.dtype,
        "clients": int(run_config.get("clients") or 0) or None,  # None: the nodes' num-partitions
        "loader": str(run_config.get("loader") or ""),  # for nodes whose node config names no data (simulation)
        "participation": settings.participation,  # with rounds: the local steps `compile=auto` weighs
        "compile": settings.compile,
    }
    run_dir = Path(run_config.get("out") or Path("runs") / datetime.now().strftime("flower-%Y%m%d-%H%M%S"))
    return FlowerRun(
        settings,
        run_dir,
        setup,
        int(run_config.get("clients") or 0),
        timeouts,
        bool(run_config.get("resume")),
        bool(run_config.get("overwrite")),
        eval_data=str(run_config.get("eval-data") or ""),
        app_config=_app_config(run_config, spelt),
    )


# the run config's spelling of the engine's settings (the others are spelt as Settings' fields)
_SPELT = {"eval_samples": "eval-samples", "stop_at": "stop-at"}


def _settings(run_config: Mapping[str, Any]) -> Settings:
    """The engine's Settings of a run config of your own model (checked there; errors name the run config's keys)."""
    defaults = {"rounds": 10, "eval_samples": 32, "dtype": "float32"}
    values: dict[str, Any] = {"checkpoint_every": 1}
    for key in SETTINGS_KEYS:
        given = run_config.get(_SPELT.get(key, key))
        if given or key in defaults:
            values[key] = given or defaults.get(key)
    values = {k: _typed(k, v) for k, v in values.items()}
    try:
        return Settings(**values)
    except ValueError as exc:
        text = str(exc)
        for key, spelt in _SPELT.items():
            text = text.replace(key, spelt)
        raise ValueError(text) from None


def _typed(key: str, value: Any) -> Any:
    """A run config's value as the type of the Settings field (TOML gives numbers; the CLI's --run-config strings)."""
    kind = type(getattr(Settings(), key))
    try:
        return kind(value) if kind in (int, float) and not isinstance(value, bool) else str(value)
    except (TypeError, ValueError):
        return value  # Settings names the key and the value


def _app_config(run_config: Mapping[str, Any], likelihood: str | None = None) -> dict:
    """The run config as flower.json (and config.json's "flower") record it; a run of your own model's likelihood
    in the setup's spelling (`likelihood_spelling`), which `bayesadmm.load` reads and `_resumed` reads back."""
    kept = {k: v for k, v in run_config.items() if k not in ("resume", "overwrite")}
    if likelihood is None:
        return kept
    return {**{k: v for k, v in kept.items() if not k.startswith(LIKELIHOOD_SETTING)}, "likelihood": likelihood}


def _recorded(algorithm: str, hparams: dict[str, Any]) -> dict[str, Any]:
    """A registered method's hyperparameters whole (`MethodSpec.resolved`, checked now, not on the nodes); a factory
    ``module:function``'s as given."""
    return hparams if ":" in algorithm else get(algorithm).resolved(**hparams)


def _hparams(value: Any) -> dict[str, Any]:
    """A run config's hyperparameters: a ``"key=value ..."`` string, or the dict `_our_spelling` made."""
    return dict(value) if isinstance(value, Mapping) else parse_hparams(str(value or ""))


def parse_hparams(text: str) -> dict[str, Any]:
    """``"lr=0.1 epochs=2 name=x"`` → {"lr": 0.1, "epochs": 2, "name": "x"} (values read as JSON where they are)."""
    hparams: dict[str, Any] = {}
    for pair in shlex.split(text):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"hparams: {pair!r} is not KEY=VALUE")
        try:
            hparams[key] = json.loads(value)
        except json.JSONDecodeError:
            hparams[key] = value
    return hparams


# --- what both sides build from the setup ------------------------------------------------------------------------


def model_of(setup: Mapping[str, Any]) -> tuple[FlatModel, Callable[[], torch.Tensor]]:
    """The run's model and a function giving its initial parameters (the server's; deterministic in the seed)."""
    if "zoo" in setup:
        zoo = make_model(setup["zoo"]["name"], **setup["zoo"]["kwargs"])
        return zoo, lambda: zoo.initial_params(generator_for(int(setup["seed"]), 0, INIT))
    make = entry_point(setup["model"], "model")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(setup["seed"]))
        built = make()
    if isinstance(built, FlatModel):
        return built, lambda: built.initial_params(generator_for(int(setup["seed"]), 0, INIT))
    if isinstance(built, torch.nn.Module):
        flat = FlatModel.from_module(built)
        return flat, lambda: flat.flatten(dict(built.named_parameters())).detach().clone()
    raise TypeError(f"model {setup['model']} returned a {type(built).__name__}; it must return a torch.nn.Module")


def likelihood_of(setup: Mapping[str, Any]) -> Likelihood:
    """A preset run's likelihood is its RunConfig's (``likelihood=``, ``likelihood.KEY=`` in its overrides); a run of
    your own model's is spelt as `likelihood_spelling` spells it."""
    if "preset" in setup:
        return RunConfig(**setup["preset"]).make_likelihood()
    name = str(setup.get("likelihood", "classification"))
    if name.startswith("regression:"):
        return GaussianRegression(float(name.split(":", 1)[1]))
    if name.startswith("own:"):
        raise ValueError(
            f"the run's likelihood is your own {name[4:]}, which a message cannot carry: pass it to the node's "
            "bayesadmm.flower.client calls (likelihood=...)"
        )
    return make_likelihood(name, {})  # classification, poisson; another name: refused, naming the valid ones


def likelihood_spelling(likelihood: Likelihood) -> str:
    """The likelihood's name in a setup and in the run directory's records, which `likelihood_of` (and
    `bayesadmm.load`) read back: ``classification``, ``regression:NOISE`` (gaussian with that noise), ``poisson``, or
    ``own:ClassName`` for one of your own (the nodes must be given it: `bayesadmm.flower.client`'s likelihood=)."""
    if isinstance(likelihood, Classification):
        return "classification"
    if isinstance(likelihood, GaussianRegression):
        return f"regression:{likelihood.noise!r}"
    if isinstance(likelihood, Poisson):
        return "poisson"
    return f"own:{type(likelihood).__name__}"


def setup_spec(setup: Mapping[str, Any], settings: Settings) -> RunSpec:
    """The run record of a run of your own model (`runspec.RunSpec`) from its setup and the engine's `settings`: a
    registered method's name, or ``own:module:function`` for a factory of yours (named, never imported from the
    record); the likelihood by name, or ``own:Name`` for one of yours."""
    name = str(setup["algorithm"])
    spelt = str(setup.get("likelihood", "classification"))
    if spelt.startswith(OWN):
        likelihood = LikelihoodSpec(spelt)
    else:
        likelihood = LikelihoodSpec.of(likelihood_of(setup))
    return RunSpec(f"{OWN}{name}" if ":" in name else name, dict(setup["hparams"]), likelihood, settings)


def algorithm_of(
    setup: Mapping[str, Any], model: FlatModel, sizes: Mapping[int, int], likelihood: Likelihood | None = None
) -> Callable[[], Algorithm]:
    """The algorithm's factory: a preset's method, a registered method's name (`bayesadmm.algorithms.names()`), or a
    user's factory ``module:function``; `likelihood` (default: the setup's) for a node given one of its own. Built
    by `federated.assemble` from the setup's record (`setup_spec`, with the settings the method reads: the rounds,
    the participation, compile and the seed, which the setup carries to every node)."""
    if "preset" in setup:
        return make_algorithm_factory(RunConfig(**setup["preset"]), model, dict(sizes), likelihood_of(setup))
    name = str(setup["algorithm"])
    settings = Settings(
        rounds=int(setup["rounds"]), seed=int(setup.get("seed", 0)),
        participation=float(setup.get("participation", 1.0)), compile=str(setup.get("compile", "auto")),
    )  # fmt: skip
    likelihood = likelihood if likelihood is not None else likelihood_of(setup)
    spec = RunSpec(f"{OWN}{name}" if ":" in name else name, dict(setup["hparams"]), LikelihoodSpec.of(likelihood),
                   settings)  # fmt: skip
    factory = entry_point(name, "algorithm") if spec.own else None
    return assemble(spec, model, dict(sizes), likelihood, factory=factory).make


@dataclass(frozen=True)
class NodeClients:
    """The server's view of clients whose data stays on their SuperNodes: their sizes only."""

    sizes: dict[int, int]

    def __call__(self, client: int):
        raise RuntimeError(f"client {client}'s data is on its SuperNode; the server never reads it")


def preset_federation(run: FlowerRun) -> tuple[Federation, Callable[[Path], None], dict, RunSpec]:
    """A preset run's Federation (built as a local run builds it), what to record in the run directory on a fresh
    start (partition.json, labels.png), the setup completed with the preset model's arguments (so a node with a
    file of its own builds the model without the preset's data), and the run's record as the build made it."""
    preset = run.preset
    assert preset is not None
    built = build(preset)
    assert built.federation.eval_X is not None  # a scenario's federation has its test set
    kwargs = model_arguments(preset.model, int(built.federation.eval_X[0].numel()), built.outputs)
    setup = {**run.setup, "zoo": {"name": preset.model, "kwargs": kwargs}}
    return built.federation, lambda run_dir: _write_split(preset, built), setup, built.spec


def user_federation(run: FlowerRun, sizes: Mapping[int, int]) -> Federation:
    """The server's Federation of a run of your own model: the discovered clients' sizes, the server's evaluation
    set, the model's initial parameters."""
    model, initial = model_of(run.setup)
    theta0, likelihood = initial().to(run.dtype), likelihood_of(run.setup)  # in the run's precision
    X, y = None, None  # without eval-data the server scores nothing (the metrics line has no test_* keys)
    if run.eval_data:  # a file of X and y, or module:function returning them; checked as bayesadmm.run's test set
        is_file = Path(run.eval_data).suffix in (".npz", ".pt")
        found = load_tensors(run.eval_data) if is_file else entry_point(run.eval_data, "eval-data")()
        _, (X, y) = check_data(model, theta0, likelihood, {}, as_tensors(found, "eval-data"))
    device = run.settings.device
    return Federation(
        model,
        NodeClients(dict(sizes)),
        algorithm_of(run.setup, model, sizes),
        theta0.to(device),
        None if X is None else X.to(device),
        None if y is None else y.to(device),
        likelihood,
    )
