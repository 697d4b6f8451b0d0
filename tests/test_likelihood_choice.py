"""The likelihood is chosen by the config (`likelihood=NAME`, `likelihood.KEY=VALUE`), built once by the config layer,
recorded in config.json and kept by `resume`; the diabetes regression scenario runs end to end."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from bayesadmm import likelihoods
from bayesadmm.cli import main
from bayesadmm.data.tabular import split_rows, standardise
from bayesadmm.experiments.build import build, load_data
from bayesadmm.experiments.config import ConfigError, RunConfig, load, resolve
from bayesadmm.likelihoods import LIKELIHOODS, Classification, GaussianRegression

pytest.importorskip("sklearn")


def test_the_default_is_classification_and_a_preset_sets_its_own():
    config, _ = resolve("fmnist-heterog10", [])
    assert config.likelihood == "classification" and config.likelihood_params == {}
    assert config.make_likelihood() == Classification()
    config, _ = resolve("diabetes-iid5", [])
    assert (config.likelihood, config.likelihood_params) == ("gaussian", {"noise": 0.7})
    assert config.make_likelihood() == GaussianRegression(0.7)


def test_likelihood_settings_are_typed_from_the_class():
    config, changed = resolve("diabetes-iid5", ["likelihood=gaussian", "likelihood.noise=1"])
    assert config.likelihood_params == {"noise": 1.0} and isinstance(config.likelihood_params["noise"], float)
    assert changed == ["likelihood=gaussian", "likelihood.noise=1"]
    config, _ = resolve("fmnist-heterog10", ["likelihood.bins=10"])
    assert config.make_likelihood() == Classification(bins=10)


@pytest.mark.parametrize(
    "source, overrides, message",
    [
        ("diabetes-iid5", ["likelihood=bogus"], "unknown likelihood 'bogus'; valid: classification, gaussian"),
        ("diabetes-iid5", ["likelihood.noise=-1"], "likelihood gaussian: noise must be a finite positive float"),
        ("diabetes-iid5", ["likelihood.noise=abc"], "likelihood.noise must be float, got 'abc'"),
        ("diabetes-iid5", ["likelihood.bins=3"], "likelihood gaussian has no setting likelihood.bins; valid: likelihood.noise"),
        ("diabetes-iid5", ["noise=0.5"], "a setting of likelihood gaussian is set as likelihood.noise="),
        ("fmnist-heterog10", ["likelihood=gaussian"], "likelihood gaussian needs noise: set it as likelihood.noise="),
        ("fmnist-heterog10", ["likelihood=gaussian", "likelihood.noise=1"], "dataset fashion-mnist does not have"),
        ("diabetes-iid5", ["likelihood=classification"], "likelihood classification models class labels"),
        ("diabetes-iid5", ["partition=shards"], "partition shards splits by class labels"),
    ],
)
def test_a_bad_likelihood_is_a_config_error_naming_the_fix(source, overrides, message):
    with pytest.raises(ConfigError) as caught:
        resolve(source, overrides)
    assert message in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


def test_a_config_file_holds_the_likelihood_and_another_one_named_drops_its_settings(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"dataset": "diabetes", "partition": "iid", "model": "small-mlp", "method": "fedavg",
                                "hparams": {"lr": 0.001}, "likelihood": "gaussian",
                                "likelihood_params": {"noise": 0.3}}))
    assert resolve(str(path), [])[0].make_likelihood() == GaussianRegression(0.3)
    assert resolve(str(path), ["likelihood.noise=0.4"])[0].likelihood_params == {"noise": 0.4}
    other, _ = resolve(str(path), ["likelihood=classification", "dataset=mnist", "partition=iid", "model=mlp"])
    assert other.likelihood_params == {}  # the file's noise was its gaussian's, not classification's
    path.write_text(json.dumps({"likelihood_params": [1]}))
    with pytest.raises(ConfigError, match='"likelihood_params" in'):
        resolve(str(path), [])


def test_build_gives_the_configured_likelihood_to_clients_and_evaluation():
    config, _ = resolve("diabetes-iid5", ["likelihood.noise=0.5", "method=fedavg"])
    built = build(config)
    assert built.federation.likelihood == GaussianRegression(0.5)
    assert built.federation.clients(0).likelihood == GaussianRegression(0.5)
    assert (built.num_classes, built.outputs) == (0, 1)
    theta0 = built.federation.theta0
    assert built.federation.model.forward(theta0, built.federation.eval_X[:3].to(theta0.dtype)).shape == (3, 1)
    direct = build(RunConfig(dataset="diabetes", partition="iid", likelihood="gaussian",
                                     likelihood_params={"noise": 1.0}, model="small-mlp", clients=3, method="fedavg"))
    assert direct.federation.likelihood == GaussianRegression(1.0)  # a RunConfig made in Python, not resolved


def test_the_diabetes_split_is_seeded_and_standardised_with_training_statistics_only():
    config, _ = resolve("diabetes-iid5", [])
    data = load_data(config)
    assert (len(data.y), len(data.y_test)) == (354, 88) and data.X.shape[1] == 10 and data.tabular
    again = load_data(config)
    other = load_data(resolve("diabetes-iid5", ["seed=1"])[0])
    assert torch.equal(data.y_test, again.y_test) and not torch.equal(data.y_test, other.y_test)
    built = build(config)
    X, y = built.federation.clients.X.double(), built.federation.clients.y.double()
    assert torch.allclose(X.mean(0), torch.zeros(10), atol=1e-5) and torch.allclose(X.std(0), torch.ones(10))
    assert abs(y.mean().item()) < 1e-5 and y.std().item() == pytest.approx(1.0, abs=1e-5)
    _, expected = standardise(data.y, data.y_test)  # the test targets with the training rows' mean and std
    assert torch.equal(built.federation.eval_y, expected)
    assert sorted(torch.cat(built.parts).tolist()) == list(range(354))  # every training row, once


def test_split_rows_is_disjoint_and_complete():
    rest, held = split_rows(10, 0.2, torch.Generator().manual_seed(0))
    assert len(held) == 2 and sorted(torch.cat([rest, held]).tolist()) == list(range(10))
    with pytest.raises(ValueError, match="fraction"):
        split_rows(10, 1.0, torch.Generator())


def test_a_two_round_diabetes_run_records_the_likelihood_and_resume_keeps_it(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "diabetes-iid5", "method=fedavg", "rounds=3", "stop_at=2", "likelihood.noise=0.6",
                 "workers=1", f"out={out}", "--quiet"])
    assert code == 0, capsys.readouterr().err
    saved = json.loads((out / "config.json").read_text())
    assert (saved["likelihood"], saved["likelihood_params"]) == ("gaussian", {"noise": 0.6})
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [1, 2]
    assert {"test_rmse", "test_nll", "test_coverage90", "test_calibration_error"} <= set(lines[0])
    assert "test_acc" not in lines[0] and not (out / "labels.png").exists()
    assert load(out).make_likelihood() == GaussianRegression(0.6)
    assert main(["resume", str(out), "--quiet"]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [1, 2, 3] and lines[-1]["test_rmse"] < 1.0
    assert json.loads((out / "config.json").read_text())["likelihood_params"] == {"noise": 0.6}
    capsys.readouterr()
    assert main(["compare", str(out), "--rounds", "3"]) == 0
    table = capsys.readouterr().out
    assert "| method | runs | RMSE @3 | NLL @3 | 90 % coverage (%) @3 | calibration error @3 | s/round |" in table


def test_a_bad_likelihood_on_the_command_line_is_exit_2_before_the_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "diabetes-iid5", "likelihood=bogus", f"out={out}", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "unknown likelihood 'bogus'; valid: classification, gaussian" in err and "Traceback" not in err
    assert not out.exists()


def test_an_old_run_without_a_likelihood_reads_as_classification(tmp_path):
    config = RunConfig().to_json()
    del config["likelihood"], config["likelihood_params"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load(tmp_path).make_likelihood() == Classification()


def test_poisson_is_chosen_by_name():
    poisson = likelihoods.Poisson
    assert LIKELIHOODS["poisson"] is poisson
    config, _ = resolve("diabetes-iid5", ["likelihood=poisson", "method=fedavg"])
    assert config.likelihood_params == {}
    built = build(config)
    assert isinstance(built.federation.likelihood, poisson)
    y = built.federation.clients.y  # the progression scores as counts, not standardised
    assert torch.equal(y, y.round()) and y.min() >= 25


def test_a_flower_run_of_a_preset_builds_the_presets_likelihood_and_model():
    pytest.importorskip("flwr")
    from bayesadmm.flower.app_config import likelihood_of, preset_federation, preset_run

    config, _ = resolve("diabetes-iid5", ["method=fedavg", "likelihood.noise=0.9"])
    run = preset_run(config)
    assert likelihood_of(run.setup) == GaussianRegression(0.9)  # what every node builds its clients with
    federation, _, setup, _ = preset_federation(run)
    assert federation.likelihood == GaussianRegression(0.9)
    assert setup["zoo"] == {"name": "small-mlp", "kwargs": {"num_classes": 1, "in_features": 10}}


def test_without_scikit_learn_the_diabetes_scenario_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # as if scikit-learn were not installed
    out = tmp_path / "run"
    assert main(["run", "diabetes-iid5", "method=fedavg", f"out={out}", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'bayesadmm[tabular]'" in err and "Traceback" not in err and not out.exists()


def test_tune_scores_trials_by_the_likelihoods_metric_unless_told(tmp_path):
    from bayesadmm.experiments.tune import Tuning, space_for

    space = space_for("fedavg", [])
    regression = Tuning("diabetes-iid5", ("method=fedavg",), space, tmp_path)
    assert regression.metric == "val_rmse" and not regression.maximise
    assert Tuning("fmnist-heterog10", ("method=fedavg",), space, tmp_path).metric == "val_acc"
    assert Tuning("diabetes-iid5", ("method=fedavg",), space, tmp_path, metric="val_nll").metric == "val_nll"
