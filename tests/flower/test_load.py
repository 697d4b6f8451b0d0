"""`bayesadmm.load` on the run directories of Flower runs: a strategy in a ServerApp of one's own
(`bayesadmm.flower.strategy`, private or not), the run-config app with a model of one's own, and the preset app; and
its one-line refusals of a Flower run's config.json of another shape."""

import json
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

import user_app
from flwr.app import ArrayRecord
from helpers import LoopbackGrid, flower_run_dir, lines, user_client_app

import bayesadmm
from bayesadmm.algorithms import spec
from bayesadmm.engine.rundir import RunDirError
from bayesadmm.flower import strategy
from bayesadmm.posterior import Posterior
from bayesadmm.trees import flatten

IVON = {"lr": 0.05, "rho": 0.1, "gamma": 1.0, "delta": 1.0, "epochs": 1, "batch_size": 8}


def _same_states(a: dict, b: dict) -> bool:
    if sorted(a) != sorted(b):
        return False
    for k in a:
        (mine, mine_tensors), (theirs, their_tensors) = flatten(a[k]), flatten(b[k])
        if mine != theirs or not all(torch.equal(x, y) for x, y in zip(mine_tensors, their_tensors, strict=True)):
            return False
    return True


def _same_mean(loaded, result) -> None:
    assert torch.equal(loaded.posterior.mean, result.posterior.mean)
    assert loaded.posterior.layout == result.posterior.layout


def test_load_reads_back_a_flower_strategy_run(tmp_path):
    """A run stopped after round 2 of 3: the round, status, metrics, posterior (Flower's final arrays are its mean) and
    client states the run ended with; the clients' sizes come from the checkpoint (config.json has none)."""
    torch.set_default_dtype(torch.float64)  # restored by tests/conftest.py
    parts, test = user_app.tensors(seed=3)
    torch.manual_seed(7)
    model = user_app.make_model()
    out = tmp_path / "flower"
    s = strategy("ivon-admm", model=model, rounds=3, stop_at=2, seed=7, eval_samples=4, dtype="float64",
                 eval_data=test, fraction_evaluate=0.0, out=out, **IVON)
    flower = s.start(grid=LoopbackGrid(user_client_app(parts, test), len(parts)),
                     initial_arrays=ArrayRecord(model.state_dict()))
    assert "clients" not in json.loads((out / "config.json").read_text())
    loaded = bayesadmm.load(out, model=user_app.make_model())
    assert (loaded.status, loaded.exit_code, loaded.round) == ("stopped", 0, 2) == (s.result.status, 0, s.result.round)
    assert loaded.history == lines(out) and len(loaded.history) == 2
    _same_mean(loaded, s.result)
    named = loaded.model.unflatten(loaded.posterior.mean)
    assert set(flower.arrays) == set(named)
    for name, value in named.items():
        assert np.array_equal(flower.arrays[name].numpy(), value.numpy())
    assert _same_states(loaded.client_states(), s.result.client_states())
    assert loaded.algorithm.name == "ivon-admm"


@pytest.mark.parametrize("dp", [
    bayesadmm.DPSettings(level="client", clip=1.0, noise_multiplier=0.5),
    bayesadmm.DPSettings(level="example", clip=1.0, epsilon=30.0),  # the noise calibrated by the run
], ids=["client", "example"])
def test_load_reads_back_a_private_flower_strategy_run(tmp_path, monkeypatch, dp):
    from bayesadmm import privacy

    # the calibration takes seconds: a stand-in noise, which config.json must record for load to use
    monkeypatch.setattr(privacy, "example_noise", lambda *args: 0.7)
    returned = []
    out = flower_run_dir(tmp_path, "fedavg", returned=returned, dp=dp)
    (result,) = returned
    assert json.loads((out / "config.json").read_text())["dp"]["dp_noise"] == (dp.noise_multiplier or 0.7)

    def calibrated(*args):
        raise AssertionError("load calibrated the noise again instead of reading the run's")

    monkeypatch.setattr(privacy, "example_noise", calibrated)
    torch.set_default_dtype(torch.float64)
    loaded = bayesadmm.load(out, model=user_app.make_model())
    assert (loaded.status, loaded.round, len(loaded.history)) == (result.status, result.round, 2)
    assert type(loaded.server) is type(result.server)  # the private wrapper's server state
    _same_mean(loaded, result)
    assert _same_states(loaded.client_states(), result.client_states())


class _Mine:
    """A likelihood of one's own (a strategy spells it own:_Mine)."""

    def __init__(self):
        self.inner = bayesadmm.Classification()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_load_of_a_strategy_run_checks_the_model_and_the_likelihood(tmp_path):
    out = flower_run_dir(tmp_path, "fedavg")
    torch.set_default_dtype(torch.float64)
    with pytest.raises(RunDirError, match=r"a Flower strategy with your own model \(Sequential\( \(0\).*: pass it"):
        bayesadmm.load(out)
    with pytest.raises(RunDirError, match="model= is not the run's model .*67 parameters"):
        bayesadmm.load(out, model=torch.nn.Linear(4, 3))
    with pytest.raises(RunDirError, match="was run with the likelihood classification, not GaussianRegression"):
        bayesadmm.load(out, model=user_app.make_model(), likelihood=bayesadmm.GaussianRegression(0.5))
    config = json.loads((out / "config.json").read_text())
    config["flower-strategy"]["likelihood"] = "own:_Mine"  # as a strategy given a likelihood of one's own spells it
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(RunDirError, match=r"your own likelihood _Mine: pass it, bayesadmm.load\(run_dir, model=..., l"):
        bayesadmm.load(out, model=user_app.make_model())
    loaded = bayesadmm.load(out, model=user_app.make_model(), likelihood=_Mine())
    assert loaded.round == 2 and isinstance(loaded.posterior, bayesadmm.PointPosterior)


@pytest.mark.parametrize("method, options", [
    ("ivon-admm", {}),  # hparams as the run config's "key=value ..." string
    ("fedavg", {"hparams": "", "fedavg.lr": 0.05, "fedavg.epochs": 1, "fedavg.batch-size": 8}),  # as its table
])
def test_load_reads_back_a_flower_run_config_run_of_ones_own_model(tmp_path, method, options):
    returned = []
    out = flower_run_dir(tmp_path, method, kind="run-config", returned=returned, **options)
    (result,) = returned
    torch.set_default_dtype(torch.float64)
    with pytest.raises(RunDirError, match=r"a Flower run of your own model user_app:make_model: pass it, bayesadmm"):
        bayesadmm.load(out)  # the entry point named in the run config is never imported
    loaded = bayesadmm.load(out, model=user_app.make_model())
    assert (loaded.status, loaded.round, len(loaded.history)) == ("completed", 2, 2)
    assert loaded.history == result.history == lines(out)
    _same_mean(loaded, result)
    assert _same_states(loaded.client_states(), result.client_states())
    with pytest.raises(RunDirError, match="posterior does not fit model= .*; pass the run's own"):
        bayesadmm.load(out, model=torch.nn.Linear(4, 3))


def test_load_refuses_a_run_config_run_of_an_algorithm_factory_saying_how_to_load_instead(tmp_path):
    out = flower_run_dir(tmp_path, "fedavg", kind="run-config")
    config = json.loads((out / "config.json").read_text())
    config["flower"]["algorithm"] = "user_app:make_algorithm"
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(RunDirError, match="algorithm factory user_app:make_algorithm, which bayesadmm.load does not "
                                          "import: .*register yours as a MethodSpec") as caught:
        bayesadmm.load(out, model=user_app.make_model())
    assert "\n" not in str(caught.value)


def test_load_reads_back_a_preset_app_run_as_a_scenarios(tmp_path, data_dir):
    from bayesadmm.experiments.config import resolve
    from bayesadmm.flower.client_app import app as client_app
    from bayesadmm.flower.server_app import run_server

    out = tmp_path / "preset"
    config, _ = resolve("fmnist-heterog10", ["clients=3", "epochs=1", "rounds=1", "eval_samples=2", "cohort=1",
                                             "method=ivon-admm", f"data_dir={data_dir}", f"out={out}"])
    result = run_server(LoopbackGrid(client_app, config.clients), config)
    assert (out / "partition.json").exists() and (out / "flower.json").exists()
    loaded = bayesadmm.load(out)
    assert (loaded.status, loaded.round, len(loaded.history)) == ("completed", 1, 1)
    _same_mean(loaded, result)
    assert loaded.scenario == result.scenario
    assert torch.equal(loaded.posterior.mean, Posterior.load(out / "posterior.safetensors").mean)
    assert _same_states(loaded.client_states(), result.client_states())
    (out / "partition.json").unlink()
    with pytest.raises(RunDirError, match="partition.json is missing"):
        bayesadmm.load(out)


# ---- a Flower strategy's config.json of another shape: one line naming the file -------------------------------------


@pytest.fixture(scope="module")
def strategy_run(tmp_path_factory):
    dp = bayesadmm.DPSettings(level="client", clip=1.0, noise_multiplier=0.5)  # so that config.json has a dp record
    return flower_run_dir(tmp_path_factory.mktemp("strategy"), "fedavg", dp=dp)


def _setup(key, value):
    def edit(config):
        config["flower-strategy"][key] = value

    return edit


def _top(key, value):
    def edit(config):
        config[key] = value

    return edit


def _lr(config):
    config["flower-strategy"]["hparams"]["lr"] = "fast"


def _dp_keys(config):
    del config["dp"]["clip"]


@pytest.mark.parametrize("edit, said", [
    (_top("flower-strategy", ["fedavg"]), "config.json: flower-strategy is list ['fedavg'], not the strategy's"),
    (_setup("hparams", [0.05, 1, 8]), "config.json: flower-strategy.hparams is list [0.05, 1, 8], not a table"),
    (_lr, "config.json: flower-strategy.hparams.lr is str 'fast', not float"),
    (_setup("hparams", {"lr": 0.05, "speed": 2}), "config.json: it does not build the run's method (fedavg has no "
                                                  "hyperparameters speed"),
    (_setup("rounds", "2"), "config.json: flower-strategy: rounds must be an integer >= 1"),
    (_setup("participation", "all"), "config.json: flower-strategy: participation must be in (0, 1]"),
    (_setup("algorithm", ["fedavg"]), "config.json: flower-strategy.algorithm is list"),
    (_setup("model", 67), "config.json: flower-strategy.model is int 67, not the model's repr"),
    (_setup("likelihood", None), "config.json: flower-strategy.likelihood is NoneType None"),
    (_setup("likelihood", "student-t"), "flower-strategy.likelihood is not classification, regression:NOISE, poisson"),
    (_setup("likelihood", "regression:wide"), "flower-strategy.likelihood is not classification, regression:NOISE"),
    (_top("parameters", "67"), "config.json: parameters is str '67', not the model's number of parameters"),
    (_top("dp", "client"), "config.json: its dp record is not DPSettings.to_json()'s (a dp record is a table"),
    (_dp_keys, "config.json: its dp record is not DPSettings.to_json()'s (the dp record has no clip"),
])  # fmt: skip
def test_load_refuses_a_strategy_config_json_of_another_shape(strategy_run, tmp_path, edit, said):
    out = tmp_path / "run"
    shutil.copytree(strategy_run, out)
    torch.set_default_dtype(torch.float64)
    assert bayesadmm.load(out, model=user_app.make_model()).round == 2  # the copy loads as it is
    config = json.loads((out / "config.json").read_text())
    edit(config)
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(RunDirError) as caught:
        bayesadmm.load(out, model=user_app.make_model())
    assert said in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("line", ['{"test_acc": 0.5}', "[1, 2]", '"round 2"', '{"round": "2"}', '{"round'])
def test_load_refuses_a_metrics_line_of_another_shape_of_a_strategy_run(strategy_run, tmp_path, line):
    out = tmp_path / "run"
    shutil.copytree(strategy_run, out)
    metrics = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join([metrics[0], line, *metrics[1:]]) + "\n")
    torch.set_default_dtype(torch.float64)
    with pytest.raises(RunDirError, match=r"metrics.jsonl line 2 is not a round's metrics") as caught:
        bayesadmm.load(out, model=user_app.make_model())
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("kind, table", [("strategy", "flower-strategy"), ("run-config", "flower")])
def test_a_flower_run_records_every_hyperparameter_with_its_default(tmp_path, kind, table):
    """config.json of either Flower layout holds the method's whole record (tests/test_run_record.py: why)."""
    out = flower_run_dir(tmp_path, "fedavg", kind=kind, rounds=1)
    recorded = json.loads((out / "config.json").read_text())[table]["hparams"]
    assert recorded == {**spec.get("fedavg").example, "weighted": False} and len(recorded) == 4


def test_the_three_doors_record_the_same_hyperparameters_for_the_same_choices(tmp_path):
    """bayesadmm.run, the command line and the Flower strategy, given fedavg with the same hyperparameters, record
    the same whole record (the rest of their configuration is each door's own layout)."""
    from bayesadmm.cli import main

    given = dict(spec.get("fedavg").example)  # lr 0.05, epochs 2, batch size 8
    out = flower_run_dir(tmp_path, "fedavg", rounds=1)
    flower = json.loads((out / "config.json").read_text())["flower-strategy"]["hparams"]
    torch.set_default_dtype(torch.float32)
    parts, test = user_app.tensors(seed=3)
    bayesadmm.run(user_app.make_model().float(), [(X.float(), y) for X, y in parts], (test[0].float(), test[1]),
                  algorithm="fedavg", hparams=given, rounds=1, progress=False, out=tmp_path / "api")  # fmt: skip
    api = json.loads((tmp_path / "api" / "config.json").read_text())["hparams"]
    keys = [f"{k}={v}" for k, v in given.items()]
    assert main(["run", "diabetes-iid5", "method=fedavg", "rounds=1", "workers=1", *keys, f"out={tmp_path / 'cli'}",
                 "--quiet"]) == 0  # fmt: skip
    cli = json.loads((tmp_path / "cli" / "config.json").read_text())["hparams"]
    assert api == cli == flower == {**given, "weighted": False}
