"""`bayesadmm tune`: trials are scored on the validation split only, the study resumes after a kill (a trial cut off
goes on from its run's checkpoint with the same values), every declared search space fits its method, the ranges are
centred on the scenario's preset (or on a value the tune is given; an absolute range or a refusal without one), the
first trial runs the preset's own values so the chosen setting is at least as good on the validation split, and a
coverage metric is tuned towards its nominal level."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from bayesadmm import cli
from bayesadmm.experiments.build import run
from bayesadmm.experiments.config import ConfigError, resolve
from bayesadmm.experiments.tune import Param, Tuning, level_of, parse_param, report, space_for
from conftest import needs_fmnist

optuna = pytest.importorskip("optuna")


def _fixed(data_dir: Path, rounds: int) -> tuple[str, ...]:
    return ("method=fedavg", f"rounds={rounds}", f"data_dir={data_dir}", "workers=1", "batch_size=64")


def test_every_declared_search_space_fits_its_method():
    from bayesadmm.algorithms import specs

    declared = [spec.name for spec in specs() if spec.search_space]
    assert {"fedavg", "fedprox", "feddyn", "admm", "fedlap", "ivon-admm", "ivon-pvi"} <= set(declared)
    for method in declared:
        assert space_for(method)  # names checked against the method's hyperparameters
    assert parse_param("lr=log:1e-5:1e-2").kind == "log" and parse_param("mu=0.1,1").choices == (0.1, 1)
    with pytest.raises(ConfigError, match="fedavg has no hyperparameters mu"):
        space_for("fedavg", ["mu=0.1,1"])
    with pytest.raises(ConfigError, match="low < high"):
        parse_param("lr=log:1e-2:1e-5")


def test_trials_see_only_the_validation_split_and_a_tune_goes_on(tmp_path, data_dir):
    out = tmp_path / "tune"
    tuning = Tuning("fmnist-heterog10", _fixed(data_dir, 2), space_for("fedavg"), out, trials=2, heartbeat=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study = tuning.run()
    assert not [w for w in caught if issubclass(w.category, optuna.exceptions.ExperimentalWarning)]
    assert len(study.trials) == 2 and (out / "study.db").exists()
    for folder in out.glob("trial-*"):
        lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert lines and all("val_acc" in line and not any(k.startswith("test_") for k in line) for line in lines)
    text = report(tuning, study)
    assert "Chosen: trial" in text and "bayesadmm sweep fmnist-heterog10 method=fedavg" in text and "seed=0:3" in text
    assert "validation=" not in text.split("On the test set")[1]  # the test command runs on the test set
    more = Tuning("fmnist-heterog10", _fixed(data_dir, 2), space_for("fedavg"), out, trials=3, heartbeat=1).run()
    assert len(more.trials) == 3  # the two finished trials count: one more was run


def test_the_test_command_runs_the_whole_schedule_on_the_test_set(tmp_path, data_dir):
    # trials may stop early (stop_at) to save time; the chosen setting is run to the end of the same schedule
    tuning = Tuning("fmnist-heterog10", (*_fixed(data_dir, 4), "stop_at=2"), space_for("fedavg"), tmp_path)
    words = tuning.test_command({"lr": 0.01}).split()
    assert "lr=0.01" in words and "rounds=4" in words and "seed=0:3" in words
    assert not any(w.startswith(("stop_at=", "validation=")) for w in words)


@pytest.mark.slow  # a tune in a child process, killed and started again
def test_a_killed_tune_goes_on_from_the_cut_off_trials_checkpoint(tmp_path, data_dir):
    out = tmp_path / "tune"
    script = textwrap.dedent(
        f"""
        from bayesadmm.experiments.tune import Tuning, space_for
        Tuning("fmnist-heterog10", {_fixed(data_dir, 12)!r}, space_for("fedavg"), {str(out)!r}, trials=1,
               heartbeat=1).run()
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script])
    status = out / "trial-0000" / "status.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if status.exists() and 2 <= json.loads(status.read_text())["round"] < 10:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    cut_at = json.loads(status.read_text())["round"]
    time.sleep(6.5)  # well past the heartbeat's grace period (3 s): the trial is known to be dead
    study = Tuning("fmnist-heterog10", _fixed(data_dir, 12), space_for("fedavg"), out, trials=1, heartbeat=1).run()
    states = [t.state.name for t in study.trials]
    assert states == ["FAIL", "COMPLETE"] and study.trials[0].params == study.trials[1].params
    lines = [json.loads(line) for line in (out / "trial-0000" / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == list(range(1, 13)) and cut_at >= 2
    assert not (out / "trial-0001").exists()  # the retry went on in the cut-off trial's folder


def test_the_cli_refuses_a_tune_without_a_validation_split(tmp_path, capsys, data_dir):
    args = ["tune", "fmnist-heterog10", *_fixed(data_dir, 2), "validation=0", "--out", str(tmp_path / "t")]
    assert cli.main(args) == 2
    assert "tuning chooses on a validation split" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--space", "lr=banana"], "--space lr=banana: lr must be float, got 'banana'"),
        (["--space", "epochs=range:1:3"], "--space epochs=range:1:3: epochs must be int.*list whole ones"),
        (["--space", "lr=log:1e-3:inf"], "--space lr=log:1e-3:inf: .*need finite numbers"),
        (["--space", "lr=log:1e-1:1e-3"], "need finite numbers low < high"),
        (["--space", "lr=range:a:b"], "--space lr: range:LOW:HIGH with two numbers"),
        (["--space", "lr=,"], "--space lr: no values"),
        (["--metric", "val_foo"], "--metric val_foo: the runs report no such .*choose val_acc, val_brier"),
    ],
)
def test_the_cli_checks_the_space_and_metric_before_the_study_exists(tmp_path, capsys, data_dir, extra, message):
    out = tmp_path / "t"
    assert cli.main(["tune", "fmnist-heterog10", *_fixed(data_dir, 2), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1 and not out.exists()


# --- the search space about the scenario's preset ---------------------------------------------------------------------


def test_the_ranges_are_centred_on_the_scenarios_preset(tmp_path):
    # IVON-ADMM's lr is 0.1 on diabetes and 5e-5 on FashionMNIST: each tune searches ten times either side of its own
    for scenario, lr in (("diabetes-iid5", 0.1), ("fmnist-heterog10", 5e-5)):
        tuning = Tuning(scenario, ("method=ivon-admm",), space_for("ivon-admm"), tmp_path)
        preset = resolve(scenario, ("method=ivon-admm",))[0].hparams
        for name, param in tuning.space.items():
            assert param.kind == "log" and param.centre == preset[name], name
            assert param.low == pytest.approx(preset[name] / 10) and param.high == pytest.approx(preset[name] * 10)
        assert tuning.space["lr"].centre == lr
        assert tuning.start == {name: preset[name] for name in ("lr", "rho", "gamma", "delta")}
    # FedDyn's alpha a hundred times either side, its weight decay ten: the FedLap paper's spans about the preset
    feddyn = Tuning("diabetes-iid5", ("method=feddyn",), space_for("feddyn"), tmp_path).space
    assert (feddyn["alpha"].low, feddyn["alpha"].high) == pytest.approx((0.01, 100))  # its preset alpha is 1
    assert (feddyn["weight_decay"].low, feddyn["weight_decay"].high) == pytest.approx((1e-6, 1e-4))


def test_a_value_given_to_the_tune_is_the_centre(tmp_path):
    preset = Tuning("diabetes-iid5", ("method=ivon-admm",), space_for("ivon-admm"), tmp_path)
    assert _searched(preset).startswith("lr=log:0.01:1 (around 0.1), rho=log:0.02:2 (around 0.2)")
    tuning = Tuning("diabetes-iid5", ("method=ivon-admm", "lr=0.3"), space_for("ivon-admm"), tmp_path)
    assert tuning.space["lr"].centre == 0.3 and tuning.space["rho"].centre == 0.2 and tuning.start["lr"] == 0.3
    # a method with no preset for the scenario (IVON-PVI has FashionMNIST's and diabetes-iid5's): the values it must
    # be given are the centres
    ivon = ("epochs=1", "batch_size=32", "hess_init=1", "tau=1", "beta2=0.999", "cosine=true", "restart_at_q_g=false")
    given = ("method=ivon-pvi", "lr=0.05", "delta=2", "damping=0.1", *ivon)
    pvi = Tuning("mnist-heterog100", given, space_for("ivon-pvi"), tmp_path)
    assert (pvi.space["lr"].centre, pvi.space["delta"].centre) == (0.05, 2.0)
    assert pvi.space["damping"] == Param("damping", "log", 0.01, 1)  # a fraction in (0, 1]: its whole range


def test_a_run_without_a_value_takes_the_absolute_range_or_is_refused_naming_the_fix(tmp_path):
    # a config file that sets no lr: FedAvg's Adam lr falls back to its absolute range, and there is no preset trial
    config = tmp_path / "mine.json"
    settings = {"dataset": "diabetes", "partition": "iid", "clients": 3, "model": "small-mlp", "method": "fedavg"}
    config.write_text(json.dumps({**settings, "likelihood": "gaussian", "likelihood_params": {"noise": 0.7}}))
    tuning = Tuning(str(config), (), space_for("fedavg"), tmp_path / "t")
    assert tuning.space["lr"] == Param("lr", "log", 1e-4, 1e-2) and tuning.start == {}
    # a value of 0 is no centre either: FedDyn's weight decay takes the FedLap paper's grid
    feddyn = Tuning("diabetes-iid5", ("method=feddyn", "weight_decay=0"), space_for("feddyn"), tmp_path / "t")
    assert feddyn.space["weight_decay"].choices == (0.0001, 0.00001, 0.000001)
    assert feddyn.start == {}  # the preset's weight decay, 0, is not among them: no trial runs it as "the preset"
    # a config file whose AMA sets rho but not lr: a relative range of a hyperparameter left at its default is
    # refused, naming the fix
    ama_file = tmp_path / "ama.json"
    ama_settings = {**settings, "method": "ama", "hparams": {"rho": 0.5}}
    ama_file.write_text(json.dumps({**ama_settings, "likelihood": "gaussian", "likelihood_params": {"noise": 0.7}}))
    space = space_for("ama", ["lr=around:0.1:10", "rho=around:0.1:10"])
    with pytest.raises(ConfigError) as refused:
        Tuning(str(ama_file), ("epochs=1",), space, tmp_path / "t")
    message = str(refused.value)
    assert f"ama on {ama_file} sets no lr" in message and "give lr=VALUE" in message and "--space lr=log:" in message
    ama = Tuning(str(ama_file), ("lr=0.01",), space, tmp_path / "t")
    assert ama.space["rho"].centre == 0.5 and ama.space["lr"].centre == 0.01


def test_around_entries_parse_and_are_checked():
    assert parse_param("lr=around:0.1:10") == Param("lr", "around", 0.1, 10)
    assert Param("lr", "around", 0.1, 10).centred(0.2) == Param("lr", "log", 0.1 * 0.2, 10 * 0.2, centre=0.2)
    for bad in ("lr=around:2:10", "lr=around:0.1:0.5", "lr=around:0:10", "lr=around:1:1"):
        with pytest.raises(ConfigError, match="around takes factors 0 < low <= 1 <= high"):
            parse_param(bad)
    with pytest.raises(ConfigError, match="one of log, range or choices, or around"):
        from bayesadmm.experiments.tune import _param

        _param("lr", {"log": [1e-4, 1e-2], "range": [0, 1]})


def test_a_coverage_metric_is_tuned_towards_its_level_never_maximised(tmp_path):
    pytest.importorskip("sklearn")
    assert level_of("val_coverage90") == 0.9 and level_of("val_rmse") is None
    fixed = ("method=fedavg", "rounds=2", "epochs=1", "workers=1")
    tuning = Tuning("diabetes-iid5", fixed, space_for("fedavg"), tmp_path, trials=3, metric="val_coverage90")
    assert not tuning.maximise and tuning.score(0.95) == pytest.approx(0.05) == tuning.score(0.85)
    study = tuning.run()
    coverages = [t.user_attrs["metric"] for t in study.trials]
    assert [t.value for t in study.trials] == pytest.approx([abs(c - 0.9) for c in coverages])
    assert study.best_trial.user_attrs["metric"] == min(coverages, key=lambda c: abs(c - 0.9))
    text = report(tuning, study)
    assert "| val_coverage90 | |val_coverage90 − 0.9| |" in text and "Chosen: trial" in text


def test_the_predictives_metrics_are_tuned_and_a_point_estimate_is_refused_naming_them(tmp_path):
    pytest.importorskip("sklearn")
    assert level_of("ens_val_coverage90") == 0.9 and level_of("ens_val_nll") is None
    fixed = ("method=fedlap-cov", "rounds=2", "epochs=1", "workers=1")
    space = space_for("fedlap-cov", ["delta=around:0.1:10"])
    tuning = Tuning("diabetes-iid5", fixed, space, tmp_path / "cov", trials=2, metric="ens_val_nll")
    assert not tuning.maximise
    study = tuning.run()
    for trial in study.trials:  # the value is the predictive's NLL at the last round, read back from the run
        lines = (tmp_path / "cov" / trial.user_attrs["run_dir"] / "metrics.jsonl").read_text().splitlines()
        assert trial.value == pytest.approx(json.loads(lines[-1])["ens_val_nll"])
    fixed = ("method=fedavg", "rounds=1", "epochs=1", "workers=1")
    point = Tuning("diabetes-iid5", fixed, space_for("fedavg"), tmp_path / "avg", trials=1, metric="ens_val_coverage90")
    with pytest.raises(ConfigError, match="no ens_val_coverage90 \\(ens_ metrics are the posterior predictive's"):
        point.run()


# --- a small tune finds at least the preset's validation score --------------------------------------------------------


def _searched(tuning: Tuning) -> str:
    return ", ".join(f"{p.name}={p.summary()}" for p in tuning.space.values())


def _tune_against_the_preset(tmp_path: Path, scenario: str, fixed: tuple[str, ...], trials: int) -> None:
    method = fixed[0].removeprefix("method=")
    tuning = Tuning(scenario, fixed, space_for(method), tmp_path / "tune", trials=trials)
    study = tuning.run()
    # the preset, evaluated as the trials are: the same settings, split and seed
    config, _ = resolve(scenario, (*fixed, "validation=0.1", f"out={tmp_path / 'preset'}"))
    preset = run(config, progress=False).history[-1][tuning.metric]
    assert study.trials[0].params == tuning.start and study.trials[0].user_attrs["start"]
    assert study.trials[0].value == pytest.approx(preset, rel=1e-6)  # the first trial is the preset
    for trial in study.trials:  # every trial searched about the preset
        for name, value in trial.params.items():
            assert config.hparams[name] / 10 <= value * (1 + 1e-12) and value <= config.hparams[name] * 10 * (1 + 1e-12)
    best = study.best_value
    assert best >= preset if tuning.maximise else best <= preset
    assert "(the run's own values)" in report(tuning, study)


def test_a_small_tune_on_diabetes_is_at_least_as_good_as_the_preset(tmp_path):
    pytest.importorskip("sklearn")
    for method in ("ivon-admm", "fedavg"):
        _tune_against_the_preset(tmp_path / method, "diabetes-iid5", (f"method={method}", "rounds=4", "workers=1"), 4)


@pytest.mark.slow  # eight runs of the MLP on 10 % of FashionMNIST
@needs_fmnist
@pytest.mark.parametrize("method", ["ivon-admm", "fedavg"])
def test_a_small_tune_on_fashion_mnist_is_at_least_as_good_as_the_preset(tmp_path, method):
    fixed = (f"method={method}", "rounds=3", "epochs=1", "workers=1")
    _tune_against_the_preset(tmp_path, "fmnist-heterog10", fixed, 4)


def test_the_cli_prints_the_centred_ranges_and_refuses_a_range_without_a_centre(tmp_path, capsys):
    pytest.importorskip("sklearn")
    out = tmp_path / "t"
    fixed = ["method=ivon-admm", "rounds=1", "epochs=1", "workers=1"]
    assert cli.main(["tune", "diabetes-iid5", *fixed, "--trials", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("tuning ivon-admm on diabetes-iid5: lr=log:0.01:1 (around 0.1), rho=log:0.02:2 (around")
    assert "trial 0: complete" in printed and "(the run's own values)" in (out / "report.md").read_text()
    refused, ama_file = tmp_path / "refused", tmp_path / "ama.json"  # an AMA that sets rho but not lr
    settings = {"dataset": "diabetes", "partition": "iid", "clients": 3, "model": "small-mlp", "method": "ama"}
    ama_file.write_text(json.dumps({**settings, "hparams": {"rho": 0.5}, "likelihood": "gaussian",
                                    "likelihood_params": {"noise": 0.7}}))  # fmt: skip
    args = ["tune", str(ama_file), "--space", "lr=around:0.1:10", "--out", str(refused)]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "sets no lr to centre on; give lr=VALUE" in err and err.count("\n") == 1 and not refused.exists()


def test_the_guides_table_states_each_methods_declared_ranges():
    from bayesadmm.algorithms import specs

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "sweeps-and-tuning.md").read_text()
    rows = [line.split(" | ") for line in guide.splitlines() if line.startswith("| ") and "`" in line]
    words = {(0.1, 10): "a tenth to ten times", (0.01, 100): "a hundredth to a hundred times"}
    built_in = [spec for spec in specs() if spec.build.__module__.startswith("bayesadmm.")]  # not other tests' own
    for spec in built_in:
        for key, space in spec.search_space.items():
            row = next((r for r in rows if spec.name in r[0].replace(",", " ").split() and f"`{key}`" in r[1]), None)
            assert row is not None, (spec.name, key)
            if "around" in space:
                assert words[tuple(space["around"])] in row[1], (spec.name, key, row)
            else:
                low, high = space["log"]
                assert f"log-uniform over {low:g} to {high:g}" in row[1], (spec.name, key, row)
