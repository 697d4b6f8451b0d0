"""`bayesadmm sweep`: the grid is what was asked, a finished run is never repeated, a killed sweep started again
gives the numbers of an uninterrupted one, and a folder of another configuration is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bayesadmm import cli
from bayesadmm.experiments.config import ConfigError
from bayesadmm.experiments.sweep import Grid, grid, points, read_sweep_file, values


def _metrics(folder: Path) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [(line["round"], line["test_acc"]) for line in lines]


def test_values_and_grid():
    assert (
        values("a,b,c") == ["a", "b", "c"] and values("0:3") == ["0", "1", "2"] and values("1:6:2") == ["1", "3", "5"]
    )
    assert grid(["method=fedavg,feddyn", "seed=0:2"]) == {"method": ["fedavg", "feddyn"], "seed": ["0", "1"]}
    for bad, message in ((["seed=3:3"], "is empty"), (["seed=0:1", "seed=2"], "given twice"), (["lr"], "KEY=VALUES")):
        with pytest.raises(ConfigError, match=message):
            grid(bad)


def test_points_are_named_by_what_varies_and_checked(tmp_path):
    made = points([Grid(["fmnist-heterog10"], grid(["method=fedavg", "lr=0.1,0.01", "seed=0:2"]))], tmp_path)
    assert [p.name for p in made] == ["lr=0.1,seed=0", "lr=0.1,seed=1", "lr=0.01,seed=0", "lr=0.01,seed=1"]
    with pytest.raises(ConfigError, match="lr=nan: lr must be a number, got nan"):
        points([Grid(["fmnist-heterog10"], grid(["method=fedavg", "lr=0.1,nan"]))], tmp_path)


def _sweep(out: Path, data_dir: Path, *extra: str) -> list[str]:
    axes = ["method=fedavg", "lr=0.05", "batch_size=64", "seed=0:2", f"data_dir={data_dir}", *extra]
    return ["sweep", "fmnist-heterog10", *axes, "--out", str(out), "--quiet", "--rounds", "2"]


@pytest.mark.slow  # four sweeps, each starting its runs as child processes
def test_a_finished_sweep_repeats_nothing(tmp_path, data_dir, capsys):
    out = tmp_path / "sweep"
    assert cli.main(_sweep(out, data_dir, "rounds=2")) == 0
    printed = capsys.readouterr().out
    assert "runs: 2 completed" in printed and "| fedavg" in printed and (out / "table.md").exists()
    before = {p: p.stat().st_mtime_ns for p in out.glob("seed=*/metrics.jsonl")}
    assert cli.main(_sweep(out, data_dir, "rounds=2")) == 0
    assert "runs: 2 skipped" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in out.glob("seed=*/metrics.jsonl")} == before
    # the same folder with another setting is refused before anything runs
    assert cli.main(_sweep(out, data_dir, "rounds=3", "epochs=2")) == 2
    assert "holds a run of another configuration (differs in epochs, rounds)" in capsys.readouterr().err
    # runs shortened by stop_at (a selection on the validation split) are done once they reach it
    shortened = tmp_path / "shortened"
    assert cli.main(_sweep(shortened, data_dir, "rounds=3", "stop_at=2")) == 0
    assert "runs: 2 stopped" in capsys.readouterr().out
    assert cli.main(_sweep(shortened, data_dir, "rounds=3", "stop_at=2")) == 0
    assert "runs: 2 skipped" in capsys.readouterr().out


@pytest.mark.slow
def test_a_killed_sweep_goes_on_to_the_uninterrupted_numbers(tmp_path, data_dir):
    rounds = "rounds=10"
    reference = tmp_path / "reference"
    assert cli.main(_sweep(reference, data_dir, rounds, "workers=1")) == 0
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "bayesadmm", *_sweep(out, data_dir, rounds, "workers=1")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    status = out / "seed=0" / "status.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the first run is in the middle of its rounds
        if status.exists() and 2 <= json.loads(status.read_text())["round"] < 8:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 128 + signal.SIGTERM
    assert json.loads(status.read_text())["status"] == "interrupted"
    assert not (out / "seed=1" / "metrics.jsonl").exists() or _metrics(out / "seed=1") != _metrics(reference / "seed=1")
    assert cli.main(_sweep(out, data_dir, rounds, "workers=1")) == 0
    for seed in ("seed=0", "seed=1"):
        assert _metrics(out / seed) == _metrics(reference / seed)
    assert "resume" in (out / "logs" / "seed=0.log").read_text()


@pytest.mark.slow
def test_a_sweep_killed_with_9_takes_its_run_along_and_goes_on_at_once(tmp_path, data_dir, capsys):
    out = tmp_path / "killed"
    args = _sweep(out, data_dir, "rounds=20", "workers=1")
    sweep = subprocess.Popen([sys.executable, "-m", "bayesadmm", *args], stdout=subprocess.DEVNULL)
    status, lock = out / "seed=0" / "status.json", out / "seed=0" / ".lock"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sweep.poll() is None:  # until the run is in the middle of its rounds
        if status.exists() and 1 <= json.loads(status.read_text())["round"] < 15:
            break
        time.sleep(0.05)
    child = int(lock.read_text().split()[1])  # "process PID on HOST since ..."
    sweep.kill()
    sweep.wait()
    assert cli.main(args) == 0  # not refused as "in use" by the orphan
    assert "runs: 2 completed" in capsys.readouterr().out
    assert json.loads(status.read_text())["status"] == "completed"
    with pytest.raises(ProcessLookupError):  # the run of the killed sweep has ended
        os.kill(child, 0)


def test_a_user_error_in_a_run_stops_the_sweep(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "sweep"
    assert cli.main(_sweep(out, empty, "rounds=2")) == 2
    printed = capsys.readouterr().out
    assert "seed=0: refused" in printed and "seed=1" not in printed  # the second run was not started
    assert "bayesadmm:" in (out / "logs" / "seed=0.log").read_text()


def test_a_sweep_file_of_several_grids_names_each_point_by_what_varies_over_all(tmp_path):
    sweep_file = tmp_path / "table.json"
    sweep_file.write_text(
        json.dumps(
            [
                {"scenario": "fmnist-heterog10", "grid": {"seed": "0:2"}, "set": {"method": "ivon-admm", "lr": 1e-4}},
                {"scenario": "fmnist-homog10", "grid": {"seed": "0:2"}, "set": {"method": "ivon-admm", "lr": 5e-4}},
            ]
        )
    )
    made = points(read_sweep_file(sweep_file), tmp_path)
    assert [p.name for p in made] == [
        "fmnist-heterog10,seed=0,lr=0.0001",
        "fmnist-heterog10,seed=1,lr=0.0001",
        "fmnist-homog10,seed=0,lr=0.0005",
        "fmnist-homog10,seed=1,lr=0.0005",
    ]
    assert made[2].config.hparams["lr"] == 5e-4
    twice = [Grid(["fmnist-heterog10"], {"seed": ["0"]})] * 2
    with pytest.raises(ConfigError, match="has the point run twice"):
        points(twice, tmp_path)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"scenario": "fmnist-heterog10", "grid": {"seed": 3}}, r'grid.seed is a list .* goes in "set"'),
        ({"scenario": "fmnist-heterog10", "grid": [["seed", [0, 1]]]}, '"grid" is an object'),
        ({"scenario": "fmnist-heterog10", "grid": {"seed": []}}, "grid.seed has no values"),
        ({"scenario": "fmnist-heterog10", "grid": {"seed": ""}}, "grid.seed has no values"),
        ({"scenario": "fmnist-heterog10", "grid": {"seed": "3:3"}}, "grid.seed: the range '3:3' is empty"),
        ({"scenario": "fmnist-heterog10", "grid": {"seed": [[0, 1]]}}, "grid.seed is a list of values"),
        ({"scenario": [], "grid": {"seed": "0:2"}}, '"scenario" is a scenario or a non-empty list'),
        ({"scenario": "fmnist-heterog10", "set": {"lr": [0.1]}}, "set.lr is one value"),
        ([], "holds no grid"),
    ],
)
def test_a_malformed_sweep_file_is_one_line_naming_the_file_and_key(tmp_path, capsys, spec, message):
    sweep_file = tmp_path / "table.json"
    sweep_file.write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match=message):
        read_sweep_file(sweep_file)
    assert cli.main(["sweep", str(sweep_file), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(sweep_file) in err and not (tmp_path / "out").exists()


def test_the_committed_sweep_files_expand(tmp_path):
    expected = {
        "fmnist-heterog10.json": 8 * 3 + 3,
        "fmnist-homog10.json": 8 * 3,
        "fmnist-heterog100.json": 3 * 3,
        "mnist-heterog100.json": 3 * 5,
        "mnist-homog10.json": 3 * 6,
        "mnist-heterog10.json": 3 * 6,
        "fmnist-alg2-as-written.json": 2 * 2 * 3 + 3,
        "fmnist-chosen-lr.json": 2 * 3,
        "fmnist-fedlap-func-chosen.json": 2 * 3,
        "select-ivon-lr.json": 2 * 3,
        "select-fedlap-func.json": 3 * 2,
        "select-fedlap-func-tau.json": 2 * 3,
        "fmnist-heterog10-tuned.json": 5 * 3,
    }
    folder = Path(__file__).parents[1] / "sweeps"
    assert set(expected) <= {p.name for p in folder.glob("*.json")}
    for name, count in expected.items():
        made = points(read_sweep_file(folder / name), tmp_path / name)
        assert len(made) == count, name
        assert len({p.name for p in made}) == count


def test_shipped_sweep_files_are_named_with_an_at_sign(capsys):
    """`bayesadmm sweep @NAME` reads the package's sweeps/NAME.json (the repository's sweeps/ links there); a wrong
    name is refused with the list of shipped names, before anything runs."""
    from bayesadmm.experiments.grids import shipped_sweep, shipped_sweeps

    folder = Path(__file__).parents[1] / "sweeps"
    assert set(shipped_sweeps()) == {p.stem for p in folder.glob("*.json")}
    assert shipped_sweep("@diabetes-iid5-smoke").read_bytes() == (folder / "diabetes-iid5-smoke.json").read_bytes()
    with pytest.raises(ConfigError, match="@diabetes-iid5-smoke"):
        shipped_sweep("@fmnist-heterog10-nope")
    assert cli.main(["sweep", "@nope", "--out", "unused"]) == 2
    assert "no shipped sweep file '@nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("bayesadmm ")


def test_methods_given_on_the_command_line_leave_out_a_sweep_files_grids_written_for_another_method(tmp_path):
    """`bayesadmm sweep @fmnist-heterog10 method=ivon-admm,fedavg`: the file's FedEP and FedPA grids set `inference`,
    a hyperparameter neither method has; they are left out with a note instead of failing on a key the user never
    wrote, and the file's main grid runs the two methods over its seeds."""
    from bayesadmm.experiments.grids import shipped_sweep, with_axes

    grids = read_sweep_file(shipped_sweep("@fmnist-heterog10"))
    kept, notes = with_axes(grids, {"method": ["ivon-admm", "fedavg"]})
    assert notes == [f"left out grid {n} of the sweep file: it sets inference, which ivon-admm has not" for n in (2, 3)]
    made = points(kept, tmp_path)
    assert sorted((p.config.method, p.config.seed) for p in made) == [
        (m, s) for m in ("fedavg", "ivon-admm") for s in range(3)
    ]
    kept, notes = with_axes(grids, {"seed": ["5"]})  # no methods given: every grid, with the axis replaced
    assert len(kept) == 3 and not notes and all(g.axes["seed"] == ["5"] for g in kept)
    with pytest.raises(ConfigError, match="every grid of the sweep file sets a hyperparameter"):
        with_axes(grids[1:], {"method": ["fedavg"]})


def test_a_sweeps_progress_off_a_terminal_is_a_line_per_finished_run_and_at_most_50_round_lines():
    import io
    from types import SimpleNamespace

    from bayesadmm.cli.sweep import SweepBar, SweepLog, progress_display

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert isinstance(progress_display(2, Terminal()), SweepBar)
    stream = io.StringIO()
    log = progress_display(2, stream)
    assert isinstance(log, SweepLog)
    a, b = SimpleNamespace(name="method=a"), SimpleNamespace(name="method=b")
    finished: list = []
    for done in range(0, 1001):  # two runs of 500 rounds, one after the other, reported about twice a second
        if done == 500:
            finished.append(SimpleNamespace(point=a, state="completed", message=""))
        log.show(done, 1000, finished, [a] if done < 500 else [b])
    finished.append(SimpleNamespace(point=b, state="diverged", message="round 7: ..."))
    log.show(1000, 1000, finished, [])
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert "sweep: method=a completed (runs 1/2 done)" in lines and lines[-1] == "sweep: method=b diverged (runs 2/2 done)"
    rounds = [line for line in lines if line.startswith("sweep: round ")]
    assert len(rounds) <= 50 and rounds[0].startswith("sweep: round 21/1000 of the grid; now: method=a")
