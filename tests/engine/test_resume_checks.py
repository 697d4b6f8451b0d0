"""What a resume checks besides the checkpoint's method, configuration and clients: a private run's accountant
history against the checkpoint's rounds; and how a run that diverged says so."""

from __future__ import annotations

import json
import math
import re

import pytest
from tests.engine.test_rundir import _run  # the same tiny federation (fedavg, 2 clients, a classifier)

from bayesadmm.engine import run as engine_run
from bayesadmm.engine import rundir
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
