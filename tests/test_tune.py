"""`bayesadmm tune`: trials are scored on the validation split only, the study resumes after a kill (a trial cut off
goes on from its run's checkpoint with the same values), and every declared search space fits its method."""

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
from bayesadmm.experiments.config import ConfigError
from bayesadmm.experiments.tune import Tuning, parse_param, report, space_for

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
