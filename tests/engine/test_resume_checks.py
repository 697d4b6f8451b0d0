"""What a resume checks besides the checkpoint's method, configuration and clients: the data the run is scored on, a
private run's accountant history against the checkpoint's rounds; what it may change; and how a run that diverged
says so."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from tests.engine.test_rundir import FEDAVG, _data, _run  # the same tiny federation (fedavg, 2 clients)
from torch import nn

import bayesadmm
from bayesadmm.engine import run as engine_run
from bayesadmm.engine import rundir
from bayesadmm.engine.identity import check_same_run
from bayesadmm.privacy import DPSettings
from bayesadmm.privacy.client_level import PrivateServer
from bayesadmm.privacy.example_level import ExampleServer

pytest.importorskip("opacus")


@pytest.mark.parametrize(
    ("dp", "participation", "emptied"),
    [
        (DPSettings(clip=0.5, noise_multiplier=1.0), 1.0, lambda s: PrivateServer(s.inner, s.steps[:-1])),
        (DPSettings(clip=0.5, noise_multiplier=1.0), 1.0, lambda s: PrivateServer(s.inner, ())),
        (DPSettings(level="example", clip=1.0, noise_multiplier=1.0), 0.5, lambda s: ExampleServer(s.inner, ())),
    ],
    ids=["client-one-step-short", "client-emptied", "example-emptied"],
)
def test_a_private_checkpoint_whose_accountant_history_does_not_match_its_rounds_is_refused(
    tmp_path, dp, participation, emptied
):
    """A history emptied (or cut) and the checkpoint sealed again would report less ε than was spent, and client-level
    DP's noise stream, keyed on the history's length, would repeat a round's: refused, naming the file."""
    out = tmp_path / "r"
    options = {"rounds": 3, "dp": dp, "participation": participation}
    assert _run(out, stop_at=2, **options).status == "stopped"
    assert _run(tmp_path / "honest", stop_at=2, **options).status == "stopped"
    assert _run(tmp_path / "honest", resume=True, **options).status == "completed"  # the history as written resumes
    path = out / "checkpoint.pt"
    checkpoint = rundir.load_state(path)
    rundir.save_state(path, {**checkpoint, "server": emptied(checkpoint["server"])})  # sealed again: checksum fine
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(rundir.RunDirError, match=f"{path} is of round 2 but its privacy accountant's history"):
        _run(out, resume=True, **options)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # refused before any write


@pytest.mark.parametrize(
    ("options", "advice"),
    [
        ({}, "try a smaller lr, a larger damping"),
        ({"dp": DPSettings(clip=0.5, noise_multiplier=1.0)}, "try a larger clip .* more clients a round .* example"),
    ],
    ids=["plain", "private"],
)
def test_a_diverged_run_says_so_with_what_to_try(tmp_path, monkeypatch, capsys, options, advice):
    """Status diverged, the round, the reason and what to try: in the Result's message, status.json and one line on
    the terminal (a private run's advice is about its noise and clipping)."""
    monkeypatch.setattr(engine_run, "evaluate", lambda *args, **kwargs: {"test_nll": math.nan})  # breaks down
    result = _run(tmp_path / "r", **options)
    assert result.status == "diverged" and result.round == 0 and result.history == []
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert result.message.startswith("round 1: non-finite test metrics") and result.message == status["message"]
    assert re.search(advice, result.message), result.message
    printed = capsys.readouterr().err.strip().splitlines()
    assert printed == [f"bayesadmm: diverged in {result.message} (the state of round 0 is in {tmp_path / 'r'})"]


def _scored(out, test=None, ood=None, **kwargs):
    """The tiny federation of `_run` (its clients), scored on `test` and `ood`."""
    torch.manual_seed(0)
    clients, own = _data()
    options = {"algorithm": "fedavg", "hparams": FEDAVG, "rounds": 2, "progress": False, "out": out, **kwargs}
    return bayesadmm.run(nn.Linear(3, 2), clients, test or own, ood=ood, **options)


def test_a_resume_scored_on_other_data_is_refused_naming_it(tmp_path):
    """The test set and the OOD inputs are part of the run's identity: other values of the same shape are refused."""
    _, (X, y) = _data()
    ood = torch.randn(10, 3, generator=torch.Generator().manual_seed(5))
    assert _scored(tmp_path / "r", ood=ood, stop_at=1).status == "stopped"
    with pytest.raises(rundir.RunDirError, match=r"the data of the evaluation set \(test=\) differ from those .*"):
        _scored(tmp_path / "r", test=(X + 1, y), ood=ood, resume=True)
    with pytest.raises(rundir.RunDirError, match=r"the data of the OOD inputs \(ood=\) differ from those .*"):
        _scored(tmp_path / "r", ood=ood * 2, resume=True)
    assert _scored(tmp_path / "r", ood=ood, resume=True).status == "completed"


def test_a_checkpoint_written_before_the_evaluation_data_were_recorded_resumes(tmp_path):
    path = tmp_path / "r" / "checkpoint.pt"
    _scored(tmp_path / "r", stop_at=1)
    checkpoint = rundir.load_state(path)
    data = {k: v for k, v in checkpoint["run"]["data"].items() if k != "evaluation"}
    rundir.save_state(path, {**checkpoint, "run": {**checkpoint["run"], "data": data}})  # as an older bayesadmm wrote
    assert _scored(tmp_path / "r", resume=True).status == "completed"
    assert "evaluation" in rundir.load_state(path)["run"]["data"]  # recorded from then on


def test_what_a_resume_may_change_is_accepted_with_the_same_numbers(tmp_path):
    """docs/reliability.md: workers, checkpoint interval, stop_at, device and client store may change on resume."""
    whole = _scored(tmp_path / "whole", rounds=3)
    assert _scored(tmp_path / "r", rounds=3, stop_at=1).status == "stopped"
    changed = {"checkpoint_every": 2, "workers": 2, "client_store": "disk", "device": "cpu"}
    resumed = _scored(tmp_path / "r", rounds=3, resume=True, **changed)
    assert resumed.status == "completed"
    strip = lambda h: [{k: v for k, v in line.items() if not k.endswith("seconds")} for line in h]  # noqa: E731
    assert strip(resumed.history) == strip(whole.history)


@pytest.mark.parametrize(
    ("key", "old", "new"),
    [
        ("out", "runs/a", "runs/b"),
        ("data_dir", "/data", "/elsewhere"),
        ("workers", 1, 4),
        ("checkpoint_every", 1, 2),
        ("stop_at", 2, 0),
        ("log", "", "tensorboard"),
        ("device", "cpu", "cuda"),
        ("client_store", "memory", "disk"),
        ("stop-at", 2, 0),  # a Flower run config's spelling
    ],
)
def test_what_a_resume_may_change_passes_the_checkpoints_identity_check(tmp_path, key, old, new):
    """The check `bayesadmm resume` (config.json) and the Flower strategy (their run config) meet: the settings
    docs/reliability.md lists may differ, at the top level or in a table; anything else is refused."""
    data = {"sizes": {"0": 16}}
    saved = {"method": "fedavg", "config": {"rounds": 3, key: old, "settings": {key: old}}, "data": data}
    mine = {"method": "fedavg", "config": {"rounds": 3, key: new, "settings": {key: new}}, "data": data}
    check_same_run(tmp_path / "checkpoint.pt", {"run": saved}, mine)
    with pytest.raises(rundir.RunDirError, match="rounds 3 → 4"):
        check_same_run(tmp_path / "checkpoint.pt", {"run": saved}, {**mine, "config": {**mine["config"], "rounds": 4}})


def _metric_lines(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in ("seconds", "eval_seconds")} for line in lines]


def test_the_cli_resume_changes_what_a_resume_may_change_with_the_uninterrupted_numbers(tmp_path, capsys):
    """`bayesadmm resume DIR workers=2 checkpoint_every=2 device=cpu client_store=memory` continues the same run with
    the numbers of an uninterrupted one; a setting that would make another run is refused before anything is written."""
    from bayesadmm.cli import main

    pytest.importorskip("sklearn")
    common = ["diabetes-iid5", "method=fedavg", "rounds=3", "workers=1", "--quiet"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["run", *common, f"out={whole}"]) == 0
    assert main(["run", *common, "stop_at=1", f"out={cut}"]) == 0
    status = (cut / "status.json").read_bytes()
    code = main(["resume", str(cut), "method=fedprox", "--quiet"])
    assert code == 2 and "may not change 'method'" in capsys.readouterr().err
    assert main(["resume", str(cut), "workers=two"]) == 2 and "workers" in capsys.readouterr().err
    assert main(["resume", str(cut), "worker=2"]) == 2
    assert "unknown key 'worker' (did you mean workers?); a resume may change: workers" in capsys.readouterr().err
    assert (cut / "status.json").read_bytes() == status  # refused before anything was written
    changes = ["workers=2", "checkpoint_every=2", "device=cpu", "client_store=memory"]
    assert main(["resume", str(cut), "--quiet", *changes]) == 0, capsys.readouterr().err
    assert _metric_lines(cut) == _metric_lines(whole)
    assert json.loads((cut / "status.json").read_text())["status"] == "completed"
