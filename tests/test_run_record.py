"""A run records every hyperparameter, defaults included, so that a resume or a load never takes a later version's
defaults for an earlier run; a record written before that (only the hyperparameters that were set) is read with the
others at their defaults, by one rule (`engine.identity.completed`)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import bayesadmm
from bayesadmm.algorithms import spec
from bayesadmm.cli import main
from bayesadmm.engine.identity import check_same_run, completed
from bayesadmm.engine.rundir import RunDirError
from bayesadmm.experiments.config import load


def _blobs(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.cat([torch.randn(n, 2, generator=g) + 2, torch.randn(n, 2, generator=g) - 2])
    y = torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=torch.long)])
    order = torch.randperm(2 * n, generator=g)
    X, y = X[order], y[order]
    return [(X[:30], y[:30]), (X[30:60], y[30:60])], (X[60:], y[60:])


def _net():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 2)


def _with_default(monkeypatch, method: str, key: str, value):
    """Register `method` again with the default of `key` changed to `value`: a later version of the library."""
    old = spec.get(method)
    later = dataclasses.make_dataclass(
        old.hparams.__name__, [(key, type(value), dataclasses.field(default=value))], bases=(old.hparams,), frozen=True
    )
    monkeypatch.setitem(spec._SPECS, method, dataclasses.replace(old, hparams=later))


def test_bayesadmm_run_records_every_hyperparameter_with_its_default(tmp_path):
    clients, test = _blobs()
    given = {"lr": 0.05, "rho": 1.0, "gamma": 0.1, "delta": 1.0, "epochs": 1, "batch_size": 8}
    bayesadmm.run(_net(), clients, test, algorithm="ivon-admm", hparams=given, rounds=1, progress=False,
                  out=tmp_path / "run")  # fmt: skip
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["hparams"]
    assert set(recorded) == {f.name for f in dataclasses.fields(spec.get("ivon-admm").hparams) if f.init}
    assert recorded.items() >= given.items()
    # IVON's defaults (Shen et al. 2024): β1 0.9, one Monte Carlo sample; no clipping
    assert recorded["beta1"] == 0.9 and recorded["mc_samples"] == 1 and recorded["clip_radius"] == float("inf")


def test_a_changed_default_does_not_change_a_resumed_or_loaded_run(tmp_path, monkeypatch):
    args = ["run", "diabetes-iid5", "method=fedavg", "rounds=2", "workers=1", "epochs=1", "--quiet"]
    assert main([*args, f"out={tmp_path / 'whole'}"]) == 0
    assert main([*args, f"out={tmp_path / 'split'}", "stop_at=1"]) == 0
    assert json.loads((tmp_path / "split" / "config.json").read_text())["hparams"]["weighted"] is False

    _with_default(monkeypatch, "fedavg", "weighted", True)  # a later version weighs the clients by their sizes
    assert load(tmp_path / "split").hparams["weighted"] is False  # the run's own value, not today's default
    assert main(["resume", str(tmp_path / "split"), "--quiet"]) == 0

    def metrics(name):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if not k.endswith(("seconds", "time"))} for line in lines]

    assert metrics("split") == metrics("whole")
    # a fresh run with the later default is another run: its numbers differ (the check above has teeth)
    assert main([*args, f"out={tmp_path / 'later'}"]) == 0
    assert metrics("later") != metrics("whole")


def test_bayesadmm_run_refuses_to_resume_under_a_changed_default(tmp_path, monkeypatch):
    clients, test = _blobs()
    kwargs = dict(algorithm="fedavg", hparams={"lr": 0.05}, rounds=2, progress=False, out=tmp_path / "run")
    bayesadmm.run(_net(), clients, test, stop_at=1, **kwargs)
    _with_default(monkeypatch, "fedavg", "epochs", 3)
    with pytest.raises(RunDirError, match=r"configuration differs .*\(hparams.epochs 1 → 3\)"):
        bayesadmm.run(_net(), clients, test, resume=True, **kwargs)
    result = bayesadmm.run(_net(), clients, test, resume=True, **{**kwargs, "hparams": {"lr": 0.05, "epochs": 1}})
    assert result.status == "completed"


def test_an_older_record_reads_with_the_defaults_it_ran_at():
    older = {"method": "fedavg", "hparams": {"lr": 0.05}, "rounds": 2}
    assert completed(older) == {"method": "fedavg", "hparams": {"lr": 0.05, "epochs": 1, "batch_size": 32,
                                                                 "weighted": False}, "rounds": 2}  # fmt: skip
    nested = {"flower-strategy": {"algorithm": "fedavg", "hparams": {}}, "parameters": 6}
    assert completed(nested)["flower-strategy"]["hparams"]["batch_size"] == 32
    own = {"algorithm": "mymodule.factory", "hparams": {"lr": 1}}  # not registered: as it is
    assert completed(own) == own


def _identity(hparams):
    return {"method": "FedAvg", "config": {"method": "fedavg", "hparams": hparams}, "data": {"sizes": {"0": 16}}}


def test_the_resume_check_reads_an_older_record_with_its_defaults(tmp_path):
    path = tmp_path / "checkpoint.pt"
    whole = {"lr": 0.05, "epochs": 1, "batch_size": 32, "weighted": False}
    check_same_run(path, {"run": _identity({"lr": 0.05})}, _identity(whole))  # the older record: the same run
    with pytest.raises(RunDirError, match=r"hparams.batch_size 32 → 8"):
        check_same_run(path, {"run": _identity({"lr": 0.05})}, _identity({**whole, "batch_size": 8}))


def test_the_three_doors_write_the_same_run_record_for_the_same_choices(tmp_path):
    """bayesadmm.run, the command line and the Flower strategy, given the same method, hyperparameters, likelihood,
    settings and differential privacy, write the same run record (config.json's "run", `runspec.RunSpec`), each
    value spelt out: the record is compared with one written here by hand, not with the library's own output."""
    pytest.importorskip("flwr")
    from bayesadmm.flower import strategy

    given = {"lr": 0.01, "epochs": 2, "batch_size": 16}
    dp = bayesadmm.DPSettings(level="client", clip=1.0, noise_multiplier=0.5)
    settings = {"rounds": 2, "seed": 3, "participation": 1.0, "eval_samples": 4, "device": "cpu", "workers": 1,
                "checkpoint_every": 1, "stop_at": 0, "cohort": 1, "dtype": "float32", "compile": "off",
                "client_store": "auto"}  # fmt: skip
    expected = {
        "method": "fedavg",
        "hparams": {**given, "weighted": False},
        "likelihood": {"name": "gaussian", "params": {"noise": 0.5}},
        "settings": settings,
        "dp": {"level": "client", "clip": 1.0, "dp_noise": 0.5, "dp_epsilon": None, "delta": 1e-5,
               "accountant": "rdp"},  # fmt: skip
        "personal": None,
    }
    torch.set_default_dtype(torch.float32)  # restored by tests/conftest.py
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(60, 10, generator=g), torch.randn(60, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 1), torch.nn.Flatten(0))
    likelihood = bayesadmm.GaussianRegression(0.5)
    choices = {k: v for k, v in settings.items() if k not in ("rounds", "participation")}
    bayesadmm.run(model, [(X[:20], y[:20]), (X[20:40], y[20:40])], (X[40:], y[40:]), algorithm="fedavg",
                  hparams=given, likelihood=likelihood, rounds=2, participation=1.0, dp=dp, progress=False,
                  out=tmp_path / "api", **choices)  # fmt: skip
    api = json.loads((tmp_path / "api" / "config.json").read_text())["run"]
    keys = [f"{k}={v}" for k, v in {**given, **settings}.items()]
    dp_keys = ["dp=client", "dp_clip=1.0", "dp_noise=0.5"]
    assert main(["run", "diabetes-iid5", "method=fedavg", "likelihood.noise=0.5", *keys, *dp_keys,
                 f"out={tmp_path / 'cli'}", "--quiet"]) == 0  # fmt: skip
    cli = json.loads((tmp_path / "cli" / "config.json").read_text())["run"]
    flower = strategy("fedavg", model=model, likelihood=likelihood, rounds=2, fraction_train=1.0, seed=3,
                      eval_samples=4, checkpoint_every=1, compile="off", dp=dp, out=tmp_path / "flower",
                      **given).config["run"]  # fmt: skip
    assert api == expected
    assert cli == expected
    assert flower == expected


def test_a_run_record_reads_back_and_refuses_a_wrong_value():
    """`RunSpec.from_json(spec.to_json())` is the same record; a record with a wrong value is refused naming it."""
    from bayesadmm.runspec import LikelihoodSpec, Personal, RunSpec

    made = RunSpec.of("fedavg", {"lr": 0.1}, likelihood=bayesadmm.Poisson(), personal=Personal(0.2, 2),
                      settings=bayesadmm.Settings(rounds=4), dp=bayesadmm.DPSettings(epsilon=3.0))  # fmt: skip
    assert RunSpec.from_json(json.loads(json.dumps(made.to_json()))) == made
    assert made.hparams == spec.get("fedavg").resolved(lr=0.1) and made.likelihood == LikelihoodSpec("poisson", {})
    record = made.to_json()
    for edit, said in [
        (lambda r: r["settings"].update(rounds=0), "settings: rounds must be an integer >= 1"),
        (lambda r: r["hparams"].update(speed=2), "fedavg has no hyperparameters speed"),
        (lambda r: r["hparams"].pop("lr"), "not whole|needs lr"),
        (lambda r: r.update(likelihood={"name": "laplace", "params": {}}), "likelihood: likelihood 'laplace'"),
        (lambda r: r.update(personal={"split": 1.5}), "personal: personal split must be in"),
        (lambda r: r.update(method="fedavgg"), "fedavgg"),
    ]:
        edited = json.loads(json.dumps(record))
        edit(edited)
        with pytest.raises(ValueError, match=said):
            RunSpec.from_json(edited)


def test_load_refuses_a_run_record_that_contradicts_the_tables_beside_it(tmp_path):
    """config.json's "run" and the door's own tables are written together: an edit of one of them is refused naming
    the record's key, an unreadable record naming the file."""
    clients, test = _blobs()
    bayesadmm.run(_net(), clients, test, algorithm="fedavg", hparams={"lr": 0.05}, rounds=1, progress=False,
                  out=tmp_path / "run")  # fmt: skip
    path = tmp_path / "run" / "config.json"
    config = json.loads(path.read_text())
    assert config["run"]["hparams"] == spec.get("fedavg").resolved(lr=0.05)
    assert bayesadmm.load(tmp_path / "run", model=_net()).round == 1
    for edit, said in [
        (lambda c: c["run"]["hparams"].update(lr=0.5), "run.hparams is not what the rest of the file says"),
        (lambda c: c["run"]["settings"].update(seed=4), "run.seed is not what the rest of the file says"),
        (lambda c: c["run"].update(likelihood={"name": "poisson", "params": {}}), "run.likelihood is not what"),
        (lambda c: c["run"]["settings"].update(rounds="2"), "its run record is not a RunSpec's .settings: rounds"),
    ]:
        edited = json.loads(json.dumps(config))
        edit(edited)
        path.write_text(json.dumps(edited))
        with pytest.raises(RunDirError, match=said):
            bayesadmm.load(tmp_path / "run", model=_net())
