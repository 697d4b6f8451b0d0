"""The Flower strategy finishes a run whose end was cut short, as the engine's loop does: a resume of a checkpoint of
the last round whose status is not final writes the posterior file, plots and final status without training."""

import json

import pytest
import torch

pytest.importorskip("flwr")

from safetensors.torch import load_file
from test_local_data import _app_config, _grid, deployment  # noqa: F401 (the fixture)

from bayesadmm.engine.rundir import POSTERIOR
from bayesadmm.flower.app_config import flower_run
from bayesadmm.flower.server_app import run_server


def test_a_flower_run_whose_end_was_cut_short_is_finished_by_a_resume(deployment, tmp_path):  # noqa: F811
    _, _, files, eval_file = deployment
    out = tmp_path / "r"
    whole = run_server(_grid(files, eval_file), flower_run(_app_config(tmp_path, eval_file, out, rounds=2)))
    assert whole.status == "completed"
    posterior, lines = load_file(out / POSTERIOR), (out / "metrics.jsonl").read_text()
    # what a kill while the run wrote its end leaves: the last round's checkpoint, status running, no posterior file
    (out / POSTERIOR).unlink()
    (out / "status.json").write_text(json.dumps({"status": "running", "round": 2}))
    resumed = run_server(_grid(files, eval_file), flower_run({"out": str(out), "resume": True}))
    assert resumed.status == "completed" and resumed.round == 2
    assert json.loads((out / "status.json").read_text()) == {"status": "completed", "round": 2}
    again = load_file(out / POSTERIOR)
    assert again.keys() == posterior.keys() and all(torch.equal(again[k], posterior[k]) for k in again)
    assert (out / "metrics.jsonl").read_text() == lines and not (out / ".lock").exists()
