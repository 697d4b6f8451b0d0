"""`bayesadmm.load(run_dir)`: a run's `Result` read back from its directory, validated, without training.

Works for any run that wrote a checkpoint, however it ended (completed, stopped, diverged, interrupted): the server
state and the round come from checkpoint.pt (read without unpickling, its checksum verified: `rundir.load_state`), the
status from status.json and the metrics up to that round from metrics.jsonl. The algorithm is rebuilt from
config.json, as a resume rebuilds it, but nothing runs. The kinds of run directory, told apart by config.json:

- a run of `bayesadmm run SCENARIO`, or of the Flower presets' app (config.json is the resolved `RunConfig`): the
  scenario's zoo model is rebuilt from the config (`experiments.build.scenario_model`, no data is read), the client
  sizes from partition.json;
- a run of `bayesadmm.run` (config.json records the method's name, its hyperparameters, the settings, the clients'
  sizes and the reprs of the model and the likelihood): the caller passes the same `model=` (and `likelihood=` where
  it was not the default), which are checked against config.json;
- a run of a Flower strategy, `bayesadmm.flower.strategy` (config.json's "flower-strategy" table: the method, its
  hyperparameters, the settings, the model's repr, the likelihood's spelling, `app_config.likelihood_spelling`; its
  "parameters" and "dp"): `model=` as for `bayesadmm.run`, `likelihood=` for one of the user's own ("own:Name"); the
  clients' sizes, which the nodes reported, from the checkpoint's record of its run (`clients.fingerprint`);
- a run of the Flower run-config app with the user's own model (config.json: the run config under "flower", the
  clients' sizes under "clients"): the model's entry point is never imported, `model=` is the caller's (its size
  checked against the checkpoint's posterior); the method must be a registered one (a "module:function" factory is
  refused: nothing read from a file is imported).

Each kind also holds the run's record under "run" (`runspec.RunSpec`, the same from every door; a directory written
before it has none): it is checked against the tables beside it, and one that says otherwise is refused.

A value of config.json, status.json or metrics.jsonl of another shape than the library writes (a list for a table, a
string for a number, a dp record without its keys) is a one-line RunDirError naming the file and the key or line.
Files are read without following symbolic links (`rundir.read_bytes`); no lock is taken, since checkpoints are renamed
into place whole. The server state is loaded onto the CPU, whatever device the run trained on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from bayesadmm.algorithms import Algorithm
from bayesadmm.algorithms.spec import get, names
from bayesadmm.engine.federation import EXIT_DIVERGED, EXIT_FAILED, EXIT_OK, Result
from bayesadmm.engine.history import read_metrics
from bayesadmm.engine.rundir import RUN_FILES, RunDirError, load_state, read_bytes
from bayesadmm.engine.settings import KEYS, Settings, problems
from bayesadmm.experiments.build import make_algorithm_factory, scenario_model
from bayesadmm.experiments.config import ConfigError
from bayesadmm.experiments.config import load as load_config
from bayesadmm.federated import assemble
from bayesadmm.flower.app_config import _settings as app_settings
from bayesadmm.flower.app_config import likelihood_of, likelihood_spelling, parse_hparams
from bayesadmm.likelihoods import Classification, Likelihood
from bayesadmm.models import FlatModel
from bayesadmm.posterior.artefact import layout_of
from bayesadmm.privacy import DPSettings
from bayesadmm.runspec import RunSpec

__all__ = ["load"]

EXIT_CODES = {"completed": EXIT_OK, "stopped": EXIT_OK, "diverged": EXIT_DIVERGED}


def load(
    run_dir: str | Path, *, model: nn.Module | FlatModel | None = None, likelihood: Likelihood | None = None
) -> Result:
    """The `Result` of the run in `run_dir` as its last checkpoint has it: `status`, `round` (the checkpoint's),
    `history`, `server`, `algorithm`, `model`, `run_dir` (and `unlearned`, the clients a run written by
    `bayesadmm.unlearn(..., out=)` removed), so `.posterior` and `.client_states()` work as on the
    Result `bayesadmm.run` returned. `model=` (and `likelihood=`, unless it was `Classification()`) are needed for a
    run with your own model (`bayesadmm.run`, a Flower strategy or the Flower run-config app); a scenario's run (also
    through the Flower presets' app) rebuilds its own. A RunDirError (a ValueError) says in one line what is wrong: no
    run there, no or a damaged checkpoint, a method that is not registered, a model that does not fit, a file of
    another shape than the library writes."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not any(os.path.lexists(run_dir / name) for name in RUN_FILES):
        raise RunDirError(f"{run_dir} holds no run (no config.json, checkpoint.pt or status.json); give a run's out=")
    if model is not None and not isinstance(model, (nn.Module, FlatModel)):
        raise TypeError(f"model= must be the run's torch.nn.Module or FlatModel, got {type(model).__name__}")
    config = _read_json(run_dir / "config.json")
    checkpoint = _checkpoint(run_dir)
    scenario = None
    if "dataset" in config and "scenario" in config:  # `bayesadmm run SCENARIO`, or the Flower preset app's run
        make, flat, scenario = _scenario_run(run_dir, model, likelihood)
    elif "flower-strategy" in config:
        make, flat = _strategy_run(run_dir, config, checkpoint, model, likelihood)
    elif "flower" in config:
        make, flat = _flower_app_run(run_dir, config, model, likelihood)
    else:
        make, flat = _api_run(run_dir, config, model, likelihood)
    with _refused(run_dir / "config.json", "it does not build the run's method"):
        algorithm = make()
    method = checkpoint.get("run", {}).get("method") if isinstance(checkpoint.get("run"), Mapping) else None
    if method is not None and method != algorithm.name:
        raise RunDirError(f"{run_dir}: the checkpoint is of method {method!r}, config.json builds {algorithm.name!r}")
    round_ = checkpoint["round"]
    status = _status(run_dir)
    history = read_metrics(run_dir / "metrics.jsonl", round_)
    result = Result(
        status["status"], EXIT_CODES.get(status["status"], EXIT_FAILED), round_, history, checkpoint["server"],
        algorithm, run_dir, str(status.get("message", "")), flat, scenario,
        unlearned=_unlearned(run_dir / "config.json", config.get("unlearned", [])),
    )  # fmt: skip
    _check_posterior_fits(result, run_dir)
    return result


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(read_bytes(path))
    except FileNotFoundError:
        raise RunDirError(f"{path} is missing: {path.parent} is not a whole run directory") from None
    except (OSError, ValueError) as exc:  # RunDirError (a link, a FIFO) is a ValueError too
        raise RunDirError(f"{path} cannot be read ({exc}); restore it from the run's copy") from None
    if not isinstance(data, dict):
        raise RunDirError(f"{path} is not a run's file (a JSON table); restore it")
    return data


def _checkpoint(run_dir: Path) -> dict:
    path = run_dir / "checkpoint.pt"
    if not os.path.lexists(path):
        raise RunDirError(f"{run_dir} has no checkpoint.pt: the run ended before its first checkpoint; run it again")
    # checksum verified (a tampered or truncated file is a RunDirError); on the CPU, so a GPU run loads anywhere
    checkpoint = load_state(path, map_location="cpu")
    round_ = checkpoint.get("round") if isinstance(checkpoint, dict) else None
    if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 0 or "server" not in checkpoint:
        raise RunDirError(f"{path} is not a bayesadmm checkpoint (no round and server state); run it again")
    return checkpoint


def _unlearned(path: Path, clients: Any) -> tuple[int, ...]:
    """config.json's record of the clients `bayesadmm.unlearn(..., out=)` removed from the run (none: [])."""
    if not isinstance(clients, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in clients):
        raise RunDirError(f"{path}: unlearned is {_shown(clients)}, not a list of client ids; restore the run's file")
    return tuple(clients)


def _status(run_dir: Path) -> dict:
    """status.json; a run that has none yet is reported as running (it was stopped before writing it)."""
    path = run_dir / "status.json"
    if not os.path.lexists(path):
        return {"status": "running"}
    status = _read_json(path)
    _expect(path, "status", status.get("status", "unknown"), str, "a run's status (completed, stopped, ...)")
    return {"status": "unknown", **status}


def _scenario_run(
    run_dir: Path, model: Any, likelihood: Likelihood | None
) -> tuple[Callable[[], Algorithm], FlatModel, dict]:
    """The algorithm factory, model and scenario record of a `bayesadmm run` directory."""
    try:
        config = load_config(run_dir)
    except ConfigError as exc:  # also a method that no module registered here (it names --methods)
        raise RunDirError(str(exc)) from None
    flat, record = scenario_model(config)
    own = config.make_likelihood()
    if model is not None and layout_of(model) != flat.layout:
        raise RunDirError(f"{run_dir} is a run of {config.scenario!r} with model {config.model!r}: leave model= out")
    if likelihood is not None and likelihood != own:
        raise RunDirError(f"{run_dir} was run with likelihood {own!r}, not {likelihood!r}; leave likelihood= out")
    return make_algorithm_factory(config, flat, scenario_sizes(run_dir, config), own), flat, record


def scenario_sizes(run_dir: Path, config: Any) -> dict[int, int]:
    """Each client's number of training rows in a scenario's run, as `experiments.build` counts them for the
    algorithm: partition.json's rows per client (the personal test rows are listed apart), without `exclude_client`."""
    partition = _read_json(run_dir / "partition.json").get("clients")
    if not isinstance(partition, list):
        raise RunDirError(f"{run_dir / 'partition.json'} lists no clients; restore it")
    return {k: len(rows) for k, rows in enumerate(partition) if k != config.exclude_client}


def _unregistered(run_dir: Path, method: str) -> str:
    return (
        f"{run_dir} is a run of method {method}, which is not registered here: import the module that registers it "
        "(bayesadmm.algorithms.spec.load('its_file.py'); on the command line --methods FILE) and load again"
    )


def _api_run(
    run_dir: Path, config: dict, model: Any, likelihood: Likelihood | None
) -> tuple[Callable[[], Algorithm], FlatModel]:
    """The algorithm factory and model of a `bayesadmm.run` directory, `model` and `likelihood` checked against its
    config.json."""
    path = run_dir / "config.json"
    needed = {"algorithm", "hparams", "parameters", "clients", "likelihood", "model", "settings"}
    if not needed <= set(config):
        raise RunDirError(f"{path} is not a run's configuration; restore it")
    recorded = _expect(path, "model", config["model"], str, "the model's repr")
    flat = _given_model(run_dir, "bayesadmm.run", model, config["parameters"], recorded)
    spelt = _expect(path, "likelihood", config["likelihood"], str, "the likelihood's repr")
    likelihood = _run_likelihood(run_dir, spelt, likelihood)
    method = _method(run_dir, path, "algorithm", config["algorithm"])
    hparams = _hparams(path, "hparams", method, config["hparams"])
    settings = _settings(path, "settings", config["settings"])
    sizes = _sizes(path, "clients", config["clients"])
    # the run's compile choice: "on" for a run written before the setting (its kernels were compiled)
    spec = _spec(path, config, method, hparams, {"compile": "on", **settings}, likelihood)
    return _factory(path, spec, flat, sizes, likelihood), flat


def _strategy_run(
    run_dir: Path, config: dict, checkpoint: dict, model: Any, likelihood: Likelihood | None
) -> tuple[Callable[[], Algorithm], FlatModel]:
    """The algorithm factory and model of the run of a Flower strategy (`bayesadmm.flower.strategy`): its settings
    from config.json's "flower-strategy" table, the clients' sizes (which the nodes reported) from the checkpoint's
    record of its run; `model` and `likelihood` checked against them."""
    path = run_dir / "config.json"
    setup = _expect(path, "flower-strategy", config["flower-strategy"], Mapping, "the strategy's settings (a table)")
    needed = {"algorithm", "hparams", "likelihood", "model", "rounds"}
    missing = sorted(needed - set(setup) | {"parameters"} - set(config))
    if missing:
        raise RunDirError(f"{path} is not a Flower strategy's configuration (no {', '.join(missing)}); restore it")
    recorded = _expect(path, "flower-strategy.model", setup["model"], str, "the model's repr")
    flat = _given_model(run_dir, "a Flower strategy", model, config["parameters"], recorded)
    likelihood = _spelt_likelihood(run_dir, path, "flower-strategy.likelihood", setup["likelihood"], likelihood)
    method = _method(run_dir, path, "flower-strategy.algorithm", setup["algorithm"])
    hparams = _hparams(path, "flower-strategy.hparams", method, setup["hparams"])
    settings = _settings(path, "flower-strategy", setup)
    record = checkpoint.get("run")
    data = record.get("data") if isinstance(record, Mapping) else None  # `clients.fingerprint`: the nodes' sizes
    found = data.get("sizes") if isinstance(data, Mapping) else None
    sizes = _sizes(run_dir / "checkpoint.pt", "run.data.sizes", found)
    spec = _spec(path, config, method, hparams, settings, likelihood)
    return _factory(path, spec, flat, sizes, likelihood), flat


def _flower_app_run(
    run_dir: Path, config: dict, model: Any, likelihood: Likelihood | None
) -> tuple[Callable[[], Algorithm], FlatModel]:
    """The algorithm factory and model of a run of the Flower run-config app with a model of your own (config.json:
    the run config, under "flower", and the clients' sizes). The run config names the model as an entry point, which
    is never imported here: `model` is the caller's (its size checked against the checkpoint's posterior)."""
    path = run_dir / "config.json"
    run_config = _expect(path, "flower", config["flower"], Mapping, "the Flower run config (a table)")
    name = run_config.get("model")
    if not isinstance(name, str) or ":" not in name:
        raise RunDirError(f"{path}: flower.model is {_shown(name)}, not the model's module:function; restore it")
    if model is None:
        raise RunDirError(
            f"{run_dir} is a Flower run of your own model {_brief(name)}: pass it, bayesadmm.load(run_dir, model=...) "
            "(the model that function returns)"
        )
    flat = _own_model(path, model, None, None)
    algorithm = run_config.get("algorithm") or "ivon-admm"
    if isinstance(algorithm, str) and ":" in algorithm:
        raise RunDirError(
            f"{run_dir} is a run of the algorithm factory {_brief(algorithm)}, which bayesadmm.load does not import: "
            "it rebuilds registered methods (register yours as a MethodSpec, docs/guides/own-algorithm.md, and name it "
            "in the run config's algorithm=); this run's state is bayesadmm.engine.rundir.load_state(checkpoint.pt)"
        )
    method = _method(run_dir, path, "flower.algorithm", algorithm)
    given = run_config.get("hparams")
    if isinstance(given, Mapping):
        found = dict(given)
    elif isinstance(given, str) or given is None:
        with _refused(path, "flower.hparams is not KEY=VALUE ..."):
            found = parse_hparams(given or "")
    else:
        raise RunDirError(f"{path}: flower.hparams is {_shown(given)}, not 'KEY=VALUE ...' or a table; restore it")
    hparams = _hparams(path, "flower.hparams", method, found)
    spelt = run_config.get("likelihood") or "classification"
    likelihood = _spelt_likelihood(run_dir, path, "flower.likelihood", spelt, likelihood)
    with _refused(path, "the Flower run config's settings are not a run's"):
        # as the ServerApp read them; the device aside (it need not exist on this machine: the state loads on the CPU)
        settings = app_settings({k: v for k, v in run_config.items() if k != "device"})
    sizes = _sizes(path, "clients", config.get("clients"))
    spec = _spec(path, {**config, "dp": None}, method, hparams, dataclasses.asdict(settings), likelihood)
    return _factory(path, spec, flat, sizes, likelihood), flat


def _spec(
    path: Path, config: Mapping, method: str, hparams: dict, settings: Mapping[str, Any], likelihood: Likelihood
) -> RunSpec:
    """The run's record as its layout's tables give it (the method, its hyperparameters, the rounds, seed,
    participation and compile of `settings`, the likelihood, "dp": the noise the run used, or calibrated from the
    same budget, sizes and rounds), checked against config.json's "run" (`runspec.RunSpec.to_json`, which every door
    writes beside its tables; a directory written before it has none): a record that disagrees is refused."""
    with _refused(path, "its dp record is not DPSettings.to_json()'s"):
        dp = None if config.get("dp") is None else DPSettings.from_json(config["dp"])
    with _refused(path, "it does not build the run's method"):
        schedule = {key: settings[key] for key in ("rounds", "seed", "participation", "compile") if key in settings}
        spec = RunSpec.of(method, hparams, likelihood=likelihood, settings=Settings(**schedule), dp=dp)
    if "run" in config:
        _check_record(path, config["run"], spec)
    return spec


def _check_record(path: Path, record: Any, spec: RunSpec) -> None:
    """A RunDirError where config.json's "run" is not a run record or says other than the tables beside it."""
    if isinstance(record, Mapping) and isinstance(record.get("settings"), Mapping):
        record = {**record, "settings": {**record["settings"], "device": "cpu"}}  # the state loads on the CPU
    with _refused(path, "its run record is not a RunSpec's"):
        recorded = RunSpec.from_json(record)
    mine, theirs = spec.to_json(), recorded.to_json()
    for key in ("rounds", "seed", "participation", "compile"):
        mine[key], theirs[key] = mine["settings"][key], theirs["settings"][key]
    if spec.likelihood.own or recorded.likelihood.own:
        theirs["likelihood"] = mine["likelihood"]  # named differently by each door; checked by the door's tables
    differ = [key for key in mine if key != "settings" and mine[key] != theirs[key]]
    if differ:
        raise RunDirError(f"{path}: run.{differ[0]} is not what the rest of the file says; restore the run's file")


def _factory(
    path: Path, spec: RunSpec, flat: FlatModel, sizes: dict[int, int], likelihood: Likelihood
) -> Callable[[], Algorithm]:
    """The factory of the run's method as the run built it (`federated.assemble` of its record `spec`), private as
    the record says; a value no check above refused but the method does is a RunDirError naming the file."""
    with _refused(path, "it does not build the run's method"):
        plain = assemble(dataclasses.replace(spec, dp=None), flat, sizes, likelihood).make
    if spec.dp is None:
        return plain
    with _refused(path, "it does not build the run's private method"):
        return assemble(spec, flat, sizes, likelihood).make


@contextlib.contextmanager
def _refused(path: Path, what: str) -> Iterator[None]:
    """A TypeError or ValueError raised within (a value of the file the checks let through, refused where it is
    used) as a one-line RunDirError naming `path`."""
    try:
        yield
    except RunDirError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RunDirError(f"{path}: {what} ({text[:200]}); restore the run's file") from None


def _brief(text: str, width: int = 60) -> str:
    """`text` on one line (a module's repr spans several), cut to `width` characters."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _shown(value: Any) -> str:
    """A value of a file as an error names it: its type and the start of its repr, on one line."""
    return f"{type(value).__name__} {_brief(repr(value), 40)}"


def _expect(path: Path, key: str, value: Any, kind: type, what: str) -> Any:
    """`value`, the file's `key`, if it is a `kind` (not a bool where a number is asked); else a one-line RunDirError
    naming the file and the key."""
    if isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool):
        return value
    raise RunDirError(f"{path}: {key} is {_shown(value)}, not {what}; restore the run's file")


def _given_model(run_dir: Path, kind: str, model: Any, parameters: Any, recorded: str) -> FlatModel:
    """The user's `model=` for a run of `kind` with its own model (which config.json names only by its repr), checked
    by `_own_model`; a RunDirError saying to pass it where it is missing."""
    if model is None:
        raise RunDirError(
            f"{run_dir} is a run of {kind} with your own model ({_brief(recorded)}): pass it, "
            "bayesadmm.load(run_dir, model=...)"
        )
    return _own_model(run_dir / "config.json", model, parameters, recorded)


def _own_model(path: Path, model: Any, parameters: Any, recorded: str | None) -> FlatModel:
    """`model` as a FlatModel, checked against the run's number of parameters and its module's repr (where the run
    recorded them)."""
    flat = model if isinstance(model, FlatModel) else FlatModel.from_module(model)
    if parameters is None:
        return flat
    count = _expect(path, "parameters", parameters, int, "the model's number of parameters")
    if flat.dim != count or (isinstance(model, nn.Module) and recorded is not None and repr(model) != recorded):
        raise RunDirError(
            f"model= is not the run's model (config.json records {count} parameters of {_brief(str(recorded))}; "
            f"given {flat.dim} of {_brief(repr(model))}): pass the run's own"
        )
    return flat


def _method(run_dir: Path, path: Path, key: str, method: Any) -> str:
    """The run's registered method's name."""
    _expect(path, key, method, str, "a method's name")
    if method not in names():
        raise RunDirError(_unregistered(run_dir, repr(method)))
    return method


# the JSON values a hyperparameter's annotation accepts (an annotation of other types: the method's own checks)
_JSON_KINDS: dict[str, tuple[type, ...]] = {
    "bool": (bool,), "int": (int,), "float": (int, float), "str": (str,), "None": (type(None),),
}  # fmt: skip


def _hparams(path: Path, key: str, method: str, hparams: Any) -> dict:
    """The run's hyperparameters of `method`, each of the JSON kind its field's annotation declares (a number for a
    float, ...); unknown, missing or invalid ones are the method's to refuse (`_factory`)."""
    _expect(path, key, hparams, Mapping, "a table of the method's hyperparameters")
    fields = {f.name: f for f in get(method).fields()}
    for name, value in hparams.items():
        field = fields.get(name)
        if field is None:
            continue
        declared = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
        parts = [part.strip() for part in declared.split("|")]
        if not all(part in _JSON_KINDS for part in parts):
            continue
        kinds = tuple(kind for part in parts for kind in _JSON_KINDS[part])
        if isinstance(value, kinds) and (not isinstance(value, bool) or "bool" in parts):
            continue
        raise RunDirError(f"{path}: {key}.{name} is {_shown(value)}, not {declared}; restore the run's file")
    return dict(hparams)


def _settings(path: Path, key: str, settings: Any) -> Mapping[str, Any]:
    """The run's settings (rounds, seed, participation, compile, ...) as `engine.settings` checks them (the device
    aside: the state loads on the CPU)."""
    _expect(path, key, settings, Mapping, "a table of the run's settings")
    if "rounds" not in settings:
        raise RunDirError(f"{path}: {key} has no rounds; restore the run's file")
    found = problems({k: v for k, v in settings.items() if k in KEYS and k != "device"}, check_machine=False)
    if found:
        raise RunDirError(f"{path}: {key}: {found[0]}; restore the run's file")
    return settings


def _sizes(path: Path, key: str, clients: Any) -> dict[int, int]:
    """Each client's number of examples, as the run recorded them (client id → N_k)."""
    sizes: dict[int, Any] = {}
    if isinstance(clients, Mapping):
        try:
            sizes = {int(k): n for k, n in clients.items()}
        except (TypeError, ValueError):
            sizes = {}
    if not sizes or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes.values()):
        raise RunDirError(f"{path}: {key} is not the clients' sizes (a table of client id → examples); restore it")
    return sizes


def _run_likelihood(run_dir: Path, recorded: str, given: Likelihood | None) -> Likelihood:
    """The run's likelihood: `given` if config.json records its repr, the default if it was the default."""
    likelihood = given if given is not None else Classification()
    if repr(likelihood) != recorded:
        fix = "pass likelihood=" if given is None else "pass the run's own likelihood="
        raise RunDirError(f"{run_dir} was run with the likelihood {recorded}; {fix}")
    return likelihood


def _spelt_likelihood(run_dir: Path, path: Path, key: str, spelt: Any, given: Likelihood | None) -> Likelihood:
    """A Flower run's likelihood from its spelling (`app_config.likelihood_spelling`): "classification",
    "regression:NOISE", "poisson" (rebuilt by `app_config.likelihood_of`; `given`, if any, must be spelt alike), or
    "own:Name" (the caller's, of that class)."""
    _expect(path, key, spelt, str, "a likelihood's name")
    if spelt.startswith("own:"):
        if given is None or likelihood_spelling(given) != spelt:
            raise RunDirError(
                f"{run_dir} was run with your own likelihood {_brief(spelt[4:])}: pass it, "
                "bayesadmm.load(run_dir, model=..., likelihood=...)"
            )
        return given
    with _refused(path, f"{key} is not classification, regression:NOISE, poisson or own:NAME"):
        own = likelihood_of({"likelihood": spelt})
    if given is None:
        return own
    if likelihood_spelling(given) != spelt:
        raise RunDirError(f"{run_dir} was run with the likelihood {spelt}, not {given!r}: pass the run's own, or none")
    return given


def _check_posterior_fits(result: Result, run_dir: Path) -> None:
    """The checkpoint's posterior has the model's number of parameters (a clear error instead of one in `predict`)."""
    try:
        _ = result.posterior
    except ValueError as exc:
        raise RunDirError(
            f"{run_dir}: the checkpoint's posterior does not fit model= ({_brief(str(exc), 120)}); pass the run's own"
        ) from None
