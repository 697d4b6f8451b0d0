"""`bayesadmm.load(run_dir)`: a run's `Result` read back from its directory, validated, without training.

Works for any run that wrote a checkpoint, however it ended (completed, stopped, diverged, interrupted): the server
state and the round come from checkpoint.pt (read without unpickling, its checksum verified: `rundir.load_state`), the
status from status.json and the metrics up to that round from metrics.jsonl. The algorithm is rebuilt from
config.json, as `bayesadmm resume` rebuilds it, but nothing runs:

- a run of `bayesadmm run SCENARIO` (config.json is the resolved `RunConfig`): the scenario's zoo model is rebuilt
  from the config (`experiments.build.scenario_model`, no data is read), the client sizes from partition.json;
- a run of `bayesadmm.run` (config.json records the method's name, its hyperparameters, the clients' sizes and the
  reprs of the model and the likelihood): the caller passes the same `model=` (and `likelihood=` where it was not the
  default), which are checked against config.json.

Files are read without following symbolic links (`rundir.read_bytes`); no lock is taken, since checkpoints are renamed
into place whole. The server state is loaded onto the CPU, whatever device the run trained on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from bayesadmm.algorithms import Algorithm
from bayesadmm.engine.federation import EXIT_DIVERGED, EXIT_FAILED, EXIT_OK, Result
from bayesadmm.engine.history import read_metrics
from bayesadmm.engine.rundir import RUN_FILES, RunDirError, load_state, read_bytes
from bayesadmm.likelihoods import Classification, Likelihood
from bayesadmm.models import FlatModel
from bayesadmm.posterior import layout_of

__all__ = ["load"]

EXIT_CODES = {"completed": EXIT_OK, "stopped": EXIT_OK, "diverged": EXIT_DIVERGED}


def load(
    run_dir: str | Path, *, model: nn.Module | FlatModel | None = None, likelihood: Likelihood | None = None
) -> Result:
    """The `Result` of the run in `run_dir` as its last checkpoint has it: `status`, `round` (the checkpoint's),
    `history`, `server`, `algorithm`, `model`, `run_dir`, so `.posterior` and `.client_states()` work as on the
    Result `bayesadmm.run` returned. `model=` (and `likelihood=`, unless it was `Classification()`) are needed for a
    run of `bayesadmm.run` with your own model; a scenario's run rebuilds its own. A RunDirError (a ValueError) says
    what is wrong: no run there, no or a damaged checkpoint, a method that is not registered, a model that does not
    fit."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not any(os.path.lexists(run_dir / name) for name in RUN_FILES):
        raise RunDirError(f"{run_dir} holds no run (no config.json, checkpoint.pt or status.json); give a run's out=")
    config = _read_json(run_dir / "config.json")
    checkpoint = _checkpoint(run_dir)
    if "dataset" in config and "scenario" in config:
        make, flat, scenario = _scenario_run(run_dir, model, likelihood)
    else:
        make, flat = _api_run(run_dir, config, model, likelihood)
        scenario = None
    algorithm = make()
    method = checkpoint.get("run", {}).get("method") if isinstance(checkpoint.get("run"), Mapping) else None
    if method is not None and method != algorithm.name:
        raise RunDirError(f"{run_dir}: the checkpoint is of method {method!r}, config.json builds {algorithm.name!r}")
    round_ = checkpoint["round"]
    status = _status(run_dir)
    history = read_metrics(run_dir / "metrics.jsonl", round_)
    code = EXIT_CODES.get(status.get("status", ""), EXIT_FAILED)
    result = Result(
        str(status.get("status", "unknown")), code, round_, history, checkpoint["server"], algorithm, run_dir,
        str(status.get("message", "")), flat, scenario,
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


def _status(run_dir: Path) -> dict:
    """status.json; a run that has none yet is reported as running (it was stopped before writing it)."""
    if not os.path.lexists(run_dir / "status.json"):
        return {"status": "running"}
    return _read_json(run_dir / "status.json")


def _scenario_run(
    run_dir: Path, model: Any, likelihood: Likelihood | None
) -> tuple[Callable[[], Algorithm], FlatModel, dict]:
    """The algorithm factory, model and scenario record of a `bayesadmm run` directory."""
    from bayesadmm.experiments.build import make_algorithm_factory, scenario_model
    from bayesadmm.experiments.config import ConfigError
    from bayesadmm.experiments.config import load as load_config

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
    from bayesadmm.algorithms.spec import names
    from bayesadmm.federated import algorithm_factory

    needed = {"algorithm", "hparams", "parameters", "clients", "likelihood", "model", "settings"}
    if not needed <= set(config):
        raise RunDirError(f"{run_dir / 'config.json'} is not a run's configuration; restore it")
    if model is None:
        raise RunDirError(
            f"{run_dir} is a run of bayesadmm.run with your own model ({str(config['model'])[:60]}...): pass it, "
            "bayesadmm.load(run_dir, model=...)"
        )
    flat = model if isinstance(model, FlatModel) else FlatModel.from_module(model)
    if flat.dim != config["parameters"] or (isinstance(model, nn.Module) and repr(model) != config["model"]):
        raise RunDirError(
            f"model= is not the run's model (config.json records {config['parameters']} parameters of "
            f"{str(config['model'])[:60]}...; given {flat.dim} of {repr(model)[:60]}...): pass the run's own"
        )
    likelihood = _run_likelihood(run_dir, config["likelihood"], likelihood)
    method = config["algorithm"]
    if method not in names():
        raise RunDirError(_unregistered(run_dir, repr(method)))
    sizes = _client_sizes(run_dir, config["clients"])
    settings = config["settings"] if isinstance(config["settings"], Mapping) else {}
    # the run's compile choice: "on" for a run written before the setting (its kernels were compiled)
    schedule = (settings.get("rounds"), settings.get("participation", 1.0), settings.get("compile", "on"))
    make = algorithm_factory(method, dict(config["hparams"]), flat, sizes, likelihood, *schedule)
    if isinstance(config.get("dp"), Mapping):  # a private run: its server state is the private wrapper's
        from bayesadmm.algorithms.spec import get
        from bayesadmm.privacy import DPSettings, private_factory

        spec = get(method)
        make = private_factory(
            make, spec, spec.make_hparams(**config["hparams"]), DPSettings.from_json(config["dp"]),
            participation=settings.get("participation", 1.0), sizes=sizes, rounds=settings.get("rounds", 1),
            seed=settings.get("seed", 0),
        )  # fmt: skip
    return make, flat


def _run_likelihood(run_dir: Path, recorded: str, given: Likelihood | None) -> Likelihood:
    """The run's likelihood: `given` if config.json records its repr, the default if it was the default."""
    likelihood = given if given is not None else Classification()
    if repr(likelihood) != recorded:
        fix = "pass likelihood=" if given is None else "pass the run's own likelihood="
        raise RunDirError(f"{run_dir} was run with the likelihood {recorded}; {fix}")
    return likelihood


def _client_sizes(run_dir: Path, clients: Any) -> dict[int, int]:
    try:
        return {int(k): int(n) for k, n in dict(clients).items()}
    except (TypeError, ValueError):
        raise RunDirError(f"{run_dir / 'config.json'} records no client sizes; restore it") from None


def _check_posterior_fits(result: Result, run_dir: Path) -> None:
    """The checkpoint's posterior has the model's number of parameters (a clear error instead of one in `predict`)."""
    try:
        _ = result.posterior
    except ValueError as exc:
        raise RunDirError(f"{run_dir}: the checkpoint's posterior does not fit the model ({exc})") from None
