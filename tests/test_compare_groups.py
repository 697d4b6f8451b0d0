"""`compare` averages only runs that are seeds of one setting, counts a folder once, and says what it dropped; it
tabulates the metrics of the runs' likelihood."""

import json
from pathlib import Path

import pytest

from bayesadmm.evaluation.reports import compare


def _run(directory: Path, acc: float, **config):
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"method": "fedavg", "scenario": "toy", "seed": 0, **config}))
    lines = [{"round": r, "test_acc": acc, "test_nll": 1 - acc, "test_ece": 0.1} for r in (1, 2, 3)]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def _rows(table: str) -> dict[str, list[str]]:
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| fedavg")]
    return {row[0].lstrip("| "): row[1:] for row in rows}


def test_runs_of_different_settings_are_separate_rows(tmp_path):
    _run(tmp_path / "a", 0.5, seed=0)
    _run(tmp_path / "b", 0.7, seed=1, workers=2, out="elsewhere")  # a seed of the same setting
    _run(tmp_path / "c", 0.9, seed=0, data_fraction=0.5)  # not a seed: another setting
    _run(tmp_path / "d", 0.3, seed=0, scenario="other")
    rows = _rows(compare([tmp_path / n for n in "abcd"], [3]))
    assert rows["fedavg [data_fraction=1.0, scenario=toy] (m_g)"][:2] == ["2", "60.0 ± 14.1"]
    assert rows["fedavg [data_fraction=0.5, scenario=toy] (m_g)"][:2] == ["1", "90.0"]
    assert rows["fedavg [data_fraction=1.0, scenario=other] (m_g)"][:2] == ["1", "30.0"]


def test_a_folder_given_twice_counts_once_and_dropped_runs_are_named(tmp_path):
    _run(tmp_path / "a", 0.5)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps({"method": "fedavg", "seed": 1}))
    text = compare([tmp_path / "a", tmp_path / "a", tmp_path / "empty"], [3])
    assert _rows(text)["fedavg (m_g)"][0] == "1"
    assert "counted once: 1 run(s) given more than once" in text
    assert f"dropped: {tmp_path / 'empty'} (no finished round in metrics.jsonl)" in text


def test_the_runs_behind_a_table_are_kept_as_one_file_that_rebuilds_the_table(tmp_path):
    sweep = tmp_path / "sweep"
    _run(sweep / "seed=0", 0.5, seed=0)
    _run(sweep / "seed=1", 0.7, seed=1)
    _run(tmp_path / "other", 0.9, seed=0, data_fraction=0.5)
    table = compare([sweep, tmp_path / "other"], [3], out_dir=tmp_path / "table")  # a sweep's folder is its runs
    kept = tmp_path / "table" / "runs.jsonl"
    assert len(kept.read_text().splitlines()) == 3
    rebuilt = compare([kept], [3], out_dir=tmp_path / "table")  # read and rewritten in place
    assert _rows(rebuilt) == _rows(table)
    assert _rows(table)["fedavg [data_fraction=1.0] (m_g)"][:2] == ["2", "60.0 ± 14.1"]
    # a run given as a folder and inside the file is one run
    assert "counted once: 1 run(s)" in compare([kept, tmp_path / "other"], [3])


def test_a_damaged_runs_file_is_refused_naming_its_line(tmp_path):
    bad = tmp_path / "runs.jsonl"
    bad.write_text('{"name": "a"}\n')
    with pytest.raises(ValueError, match=r"runs.jsonl:1 is not a run"):
        compare([bad], [3])
    with pytest.raises(FileNotFoundError, match="holds no runs"):
        compare([tmp_path], [3])


def test_only_the_runs_asked_for_are_compared(tmp_path, capsys):
    from bayesadmm import cli

    _run(tmp_path / "a", 0.5, seed=0)
    _run(tmp_path / "b", 0.9, seed=0, method="feddyn")
    _run(tmp_path / "c", 0.7, seed=1, method="feddyn")
    table = compare([tmp_path], [3], only={"method": ["fedavg"]})
    assert set(_rows(table)) == {"fedavg (m_g)"} and "feddyn" not in table
    assert cli.main(["compare", str(tmp_path), "--rounds", "3", "--only", "method=feddyn", "--only", "seed=1"]) == 0
    assert "| feddyn (m_g) | 1 | 70.0 |" in capsys.readouterr().out
    assert cli.main(["compare", str(tmp_path), "--only", "method"]) == 2
    assert "--only takes KEY=a,b,c" in capsys.readouterr().err


def _regression_run(directory, method: str, seed: int, line: dict, noise: float | None = None) -> None:
    """A run whose metrics are `line` times the round number, with a Gaussian likelihood of `noise` if given."""
    directory.mkdir(parents=True)
    config = {"method": method, "seed": seed, "scenario": "toy"}
    if noise is not None:
        config.update(likelihood="gaussian", likelihood_params={"noise": noise})
    (directory / "config.json").write_text(json.dumps(config))
    rounds = [{"round": r, **{k: v * r for k, v in line.items()}} for r in (1, 2, 3)]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rounds))


def test_compare_tabulates_regression_metrics_labels_noise_and_refuses_mixed_runs(tmp_path):
    regression = {
        "test_rmse": 0.25,
        "test_nll": 0.5,
        "test_coverage90": 0.3,
        "test_calibration_error": 0.05,
        "ens_test_rmse": 0.2,
        "ens_test_nll": 0.4,
        "ens_test_coverage90": 0.3,
        "ens_test_calibration_error": 0.04,
    }
    _regression_run(tmp_path / "a", "ivon-admm", 0, regression, noise=0.7)
    _regression_run(tmp_path / "b", "ivon-admm", 1, regression, noise=0.7)
    _regression_run(tmp_path / "c", "ivon-admm", 0, regression, noise=0.5)
    table = compare([tmp_path / "a", tmp_path / "b", tmp_path / "c"], [3])
    header = "| method | runs | RMSE @3 | NLL @3 | 90 % coverage (%) @3 | calibration error @3 | s/round |"
    assert table.splitlines()[0] == header
    cells = "| 0.500 ± 0.000 | 1.000 ± 0.000 | 60.0 ± 0.0 | 0.100 ± 0.000 |"  # calibration error: 2 × 0.05 at r = 2
    assert "| ivon-admm [likelihood.noise=0.7] (m_g) | 2 " + cells in table
    assert "| ivon-admm [likelihood.noise=0.7] (predictive) | 2 | 0.400 ± 0.000 |" in table
    assert "| ivon-admm [likelihood.noise=0.5] (m_g) | 1 |" in table
    _regression_run(tmp_path / "d", "fedavg", 0, {"test_acc": 0.25, "test_nll": 0.5, "test_ece": 0.1})
    with pytest.raises(ValueError, match="measured different metrics"):
        compare([tmp_path / "a", tmp_path / "d"], [3])


@pytest.mark.parametrize(
    "damage, named",
    [
        (
            lambda d: (d / "metrics.jsonl").write_text('{"round": 1, "test_acc": 0.5}\n{"round": 2, "te'),
            "metrics.jsonl:2",
        ),
        (lambda d: (d / "config.json").write_text('{"method": "fedav'), "config.json is not valid JSON"),
        (lambda d: (d / "config.json").write_text("[1, 2]"), "config.json holds a list, not a JSON object"),
        (lambda d: (d / "status.json").write_text("{"), "status.json is not valid JSON"),
    ],
)
def test_a_damaged_run_file_is_one_line_naming_it(tmp_path, capsys, damage, named):
    from bayesadmm import cli

    _run(tmp_path / "a", 0.5)
    damage(tmp_path / "a")
    assert cli.main(["compare", str(tmp_path / "a"), "--rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert named in err and str(tmp_path / "a") in err and err.count("\n") == 1


def test_an_out_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    from bayesadmm import cli

    _run(tmp_path / "a", 0.5)
    (tmp_path / "file").write_text("")
    assert cli.main(["compare", str(tmp_path / "a"), "--rounds", "3", "--out", str(tmp_path / "file" / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--out {tmp_path / 'file' / 'out'} cannot be created" in err and err.count("\n") == 1


@pytest.mark.parametrize("rounds", ["banana", "0", ","])
def test_table_rounds_that_are_not_round_numbers_are_one_line(tmp_path, capsys, rounds):
    from bayesadmm import cli

    _run(tmp_path / "a", 0.5)
    assert cli.main(["compare", str(tmp_path / "a"), "--rounds", rounds]) == 2
    assert f"--at (the table's rounds) takes round numbers >= 1 separated by commas (e.g. 10,25,50), got {rounds!r}" in (
        capsys.readouterr().err
    )


def test_a_single_run_shows_its_value_and_a_validation_table_says_so(tmp_path):
    """One run has no spread: its cells show the value alone, never "± 0.000"; runs evaluated on a validation
    split (val_* metrics) get a table whose header says so, in Markdown and LaTeX."""
    _run(tmp_path / "test", 0.8, seed=0)
    table = compare([tmp_path / "test"], [3])
    cells = [line for line in table.splitlines() if line.startswith("|")]  # the footnote says "mean ± std"
    assert cells[0].startswith("| method | runs |") and "±" not in "".join(cells)
    val = tmp_path / "val"
    val.mkdir()
    (val / "config.json").write_text(json.dumps({"method": "fedavg", "scenario": "toy", "seed": 0}))
    lines = [{"round": r, "val_acc": 0.5, "val_nll": 1.0, "val_ece": 0.1} for r in (1, 2, 3)]
    (val / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = compare([val], [3], out_dir=tmp_path / "out")
    assert table.splitlines()[0].startswith("| method (validation split) | runs |")
    assert "| fedavg (m_g) | 1 | 50.0 | 1.000 | 0.100 |" in table
    assert (tmp_path / "out" / "table.tex").read_text().splitlines()[2].startswith("method (validation split) &")


def test_the_table_says_what_its_cells_are_and_why_a_cell_is_a_dash(tmp_path):
    _run(tmp_path / "a", 0.5)  # rounds 1-3
    table = compare([tmp_path / "a"], [2, 3, 5])
    assert "@R: a run's mean over rounds R−2, R−1 and R (@5: rounds 3–5), then mean ± std over the row's runs" in table
    assert "(m_g) rows: the posterior's mean m_g as a point estimate; (predictive): the posterior predictive." in table
    assert "s/round: the median seconds of a round's training" in table
    row = _rows(table)["fedavg (m_g)"]
    assert row[1:4] == ["—", "—", "—"] and row[4] == "50.0" and row[7:10] == ["—", "—", "—"]
    assert "—: @2 needs rounds 0–2, from before round 1: @3 is the first with values." in table
    assert "—: @5: the runs end at round 3 (`--at 3` shows their last rounds)." in table
    assert "—:" not in compare([tmp_path / "a"], [3])  # no dash, no reason


def test_the_tables_rounds_are_at_and_the_old_rounds_option_still_works(tmp_path, capsys):
    from bayesadmm import cli

    _run(tmp_path / "a", 0.5)
    for option in ("--at", "--rounds"):
        assert cli.main(["compare", str(tmp_path / "a"), option, "3"]) == 0
        assert _rows(capsys.readouterr().out)["fedavg (m_g)"][1] == "50.0"
    for command in ("compare", "sweep"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        help_text = " ".join(capsys.readouterr().out.split())
        assert "--at R,R,..., --rounds R,R,..." in help_text
        assert "Not the rounds the runs train (rounds=N); --rounds is an older name of this option" in help_text
