"""Tracking: the metrics a run sends to TensorBoard and MLflow are read back from what they wrote, equal to
metrics.jsonl, and a resumed run shows each round once."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm import cli
from bayesadmm.evaluation import tracking

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")

FEDAVG = {"lr": 0.05, "epochs": 1, "batch_size": 8}


def _data():
    gen = torch.Generator().manual_seed(0)
    clients = [(torch.randn(16, 3, generator=gen), torch.randint(0, 2, (16,), generator=gen)) for _ in range(2)]
    return clients, (torch.randn(20, 3, generator=gen), torch.randint(0, 2, (20,), generator=gen))


def _tensorboard_scalars(log_dir, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _mlflow_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key))


def _same(read: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """Same rounds, same values (TensorBoard keeps float32)."""
    steps_match = [step for step, _ in read] == [step for step, _ in expected]
    return steps_match and [v for _, v in read] == pytest.approx([v for _, v in expected], rel=1e-6)


def test_the_library_sends_every_round_to_both(tmp_path):
    clients, test = _data()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tb = tracking.TensorBoard(tmp_path / "tb")
    ml = tracking.MLflow(uri, "tests", "fedavg", {"algorithm": "fedavg", "hparams": FEDAVG})
    trackers = tracking.Trackers([tb, ml])
    options = {"algorithm": "fedavg", "hparams": FEDAVG, "rounds": 3, "progress": False, "on_round": trackers}
    result = bayesadmm.run(nn.Linear(3, 2), clients, test, out=tmp_path / "run", **options)
    trackers.close()
    expected = [(line["round"], line["test_acc"]) for line in result.history]
    assert len(expected) == 3
    assert _same(_tensorboard_scalars(tmp_path / "tb", "test_acc"), expected)
    assert _same(_mlflow_history(uri, ml.run_id, "test_acc"), expected)


def test_the_cli_logs_and_a_resume_shows_each_round_once(tmp_path, capsys, data_dir):
    out = tmp_path / "run"
    common = [f"--data-dir={data_dir}", "--quiet"]
    args = ["run", "fmnist-heterog10", "method=fedavg", "rounds=3", "stop_at=2", f"out={out}", *common]
    assert cli.main([*args, "--log", "tensorboard,mlflow"]) == 0
    assert cli.main(["resume", str(out), "--quiet"]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    expected = [(line["round"], line["test_acc"]) for line in lines]
    assert [step for step, _ in expected] == [1, 2, 3]
    assert _same(_tensorboard_scalars(out / "tensorboard", "test_acc"), expected)
    known = json.loads((out / "mlflow-run.json").read_text())  # the resume logged into the same MLflow run
    assert _same(_mlflow_history(known["tracking_uri"], known["run_id"], "test_acc"), expected)


def test_an_unknown_tracker_is_a_config_error(capsys):
    assert cli.main(["run", "fmnist-heterog10", "method=fedavg", "log=wandb", "--quiet"]) == 2
    assert "unknown tracker 'wandb' in log; valid: tensorboard, mlflow" in capsys.readouterr().err
