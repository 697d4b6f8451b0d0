"""A method is one module: its `MethodSpec` (hyperparameters, search space, build) is registered where it is defined,
the built-in methods' presets and published numbers are the scenario files' (tests/experiments/test_scenario_data.py);
the config, the CLI and the reports read both, and a user's module registers its own method the same way, presets
included (examples/my_methods.py), loaded by `--methods` on the command line."""

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import torch

import bayesadmm
from bayesadmm.algorithms import Context, MethodSpec, fedavg, get, names, register, spec, specs
from bayesadmm.cli import main
from bayesadmm.experiments import scenario_data
from bayesadmm.experiments.config import ConfigError, presets, resolve

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "my_methods.py"


def test_every_method_module_registers_its_spec():
    assert {
        "admm",
        "ama",
        "bayes-admm-iso",
        "fedavg",
        "feddyn",
        "fedep",
        "fedlap",
        "fedlap-cov",
        "fedlap-func",
        "fedpa",
        "fedprox",
        "fedsep",
        "ivon-admm",
        "ivon-pvi",
    } <= set(names())  # (and any a test registered)
    scenarios = set(scenario_data.scenarios())
    references = scenario_data.references()
    assert set(references) <= scenarios
    for s in specs():
        assert s.summary, f"{s.name} has no summary for the docs' table"
        presets = scenario_data.presets_of(s)
        assert set(presets) <= scenarios, f"{s.name} has presets for unknown scenarios"
        published = {scenario for scenario, rows in references.items() if s.name in rows}
        assert published <= set(presets) | {"fmnist-heterog100"}
    assert get("fedsep").hparams is get("fedep").hparams  # FedSEP shares FedEP's hyperparameters and build


def test_register_refuses_a_second_spec_under_a_taken_name_unless_replace():
    original = get("fedavg")
    register(original)  # the same spec again: nothing changes
    other = dataclasses.replace(original, summary="another FedAvg")
    with pytest.raises(ValueError, match="already registered.*replace=True"):
        register(other)
    try:
        assert register(other, replace=True) is other and get("fedavg") is other
    finally:
        register(original, replace=True)
    with pytest.raises(ValueError, match="unknown method 'nope'; valid: admm, ama"):
        get("nope")
    with pytest.raises(ValueError, match="preset x sets unknown hyperparameters bogus"):
        MethodSpec("m", fedavg.Hparams, fedavg.build, presets={"x": {"bogus": 1}})


@pytest.mark.parametrize(
    ("method", "values", "message"),
    [
        ("fedavg", {"weighted": "yes"}, "weighted must be True or False"),
        ("fedlap", {"delta": 1.0, "lr": 0.1, "rho": "half"}, "rho must be 'size' or a number in"),
        ("fedlap-cov", {"delta": 1.0, "lr": 0.1, "curvature": "kfac"}, "curvature must be one of ggn, mc-fisher"),
        ("fedep", {"inference": "gibbs"}, "inference must be one of identity, laplace, mcmc, ngvi"),
        ("fedprox", {}, "fedprox needs mu; starting values: the presets, `bayesadmm methods show fedprox`"),
        ("fedavg", {"momentum": 0.9}, "fedavg has no hyperparameters momentum; valid: lr, epochs"),
    ],
)
def test_hyperparameters_are_checked_naming_the_field_and_the_valid_values(method, values, message):
    with pytest.raises(ValueError, match=message):
        get(method).make_hparams(**values)


def test_a_method_without_a_preset_for_a_builtin_scenario_does_not_fall_back_on_its_defaults():
    with pytest.raises(
        ConfigError,
        match=r"fedep has no preset for scenario fmnist-homog10 \(it has presets for "
        r"diabetes-iid5, fmnist-heterog10\); set its hyperparameters explicitly",
    ):
        resolve("fmnist-homog10", ["method=fedep"])
    config, _ = resolve("fmnist-homog10", ["method=fedep", "lr=0.001", "epochs=2", "batch_size=32", "alpha=0.01"])
    assert config.hparams.items() >= {"lr": 0.001, "epochs": 2, "batch_size": 32, "alpha": 0.01}.items()
    assert set(config.hparams) == {f.name for f in get("fedep").fields()}  # the others at their defaults
    # AMA's one preset is diabetes-iid5's: elsewhere every value it sets is given
    given = ["method=ama", "rho=0.1", "lr=0.001", "epochs=1", "batch_size=32", "delta=0.01"]
    assert resolve("fmnist-heterog10", given)[0].hparams["rho"] == 0.1
    assert presets()["fmnist-heterog10"]["methods"]["ivon-admm"]["cosine"] is True


def test_cosine_is_a_schedule_over_the_contexts_rounds():
    hparams = get("ivon-admm").make_hparams(**get("ivon-admm").example, cosine=True)
    with pytest.raises(ValueError, match="cosine=True needs the run's number of rounds"):
        get("ivon-admm").build(hparams, Context(dim=3))
    assert get("ivon-admm").build(hparams, Context(dim=3, rounds=5)).local.solver.schedule.rounds == 5


def _readme_methods() -> list[str]:
    """The registered names in the first column of the README's table of methods."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| name | method | paper | equations |") :].split("\n\n")[0]
    return sorted(name for row in table.splitlines()[2:] for name in re.findall(r"`([a-z-]+)`", row.split("|")[1]))


def test_the_readmes_table_lists_exactly_the_registered_methods():
    builtin = [s.name for s in specs() if s.build.__module__.startswith("bayesadmm.")]
    assert _readme_methods() == sorted(builtin)


def test_a_users_method_module_runs_by_name_from_python_and_from_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(spec.ENVIRONMENT, "")
    module = spec.load(EXAMPLE)
    assert spec.load(EXAMPLE) is module and get("fedavgm") is module.SPEC  # loading it again changes nothing
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(60, 4, generator=gen)
    y = (X[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    result = bayesadmm.run(
        model,
        [(X[:30], y[:30]), (X[30:], y[30:])],
        (X, y),
        algorithm="fedavgm",
        hparams={"momentum": 0.5},
        rounds=2,
        progress=False,
        out=tmp_path / "py",
    )
    assert result.status == "completed" and "server_step_norm" in result.history[-1]

    out = tmp_path / "cli"
    args = ["run", "diabetes-iid5", "method=fedavgm", "rounds=1", "workers=1", f"out={out}", "--quiet"]
    assert main([*args, "--methods", str(EXAMPLE)]) == 0
    assert json.loads((out / "config.json").read_text())["hparams"] == {
        "lr": 1e-3, "epochs": 2, "batch_size": 32, "momentum": 0.9, "server_lr": 1.0
    }  # its preset, and the module's defaults: every hyperparameter is recorded
    assert str(EXAMPLE.resolve()) in os.environ[spec.ENVIRONMENT].split(os.pathsep)  # a sweep's runs load it too

    # a resume whose method is not registered says how to register it
    monkeypatch.setenv(spec.ENVIRONMENT, "")
    monkeypatch.delitem(spec._SPECS, "fedavgm")
    capsys.readouterr()
    assert main(["resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'fedavgm'" in err and "--methods" in err


def test_a_methods_file_that_is_not_python_is_a_one_line_error(tmp_path, capsys):
    assert main(["run", "diabetes-iid5", "--methods", str(tmp_path / "nope.txt")]) == 2
    assert "not a Python file" in capsys.readouterr().err
