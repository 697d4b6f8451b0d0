"""What a Flower run leaves in its run directory, made quickly by `helpers.flower_run_dir` (for the tests of
`bayesadmm.load` on every kind of run directory)."""

import json

import pytest

pytest.importorskip("flwr")

from helpers import flower_run_dir


@pytest.mark.parametrize("kind, key", [("strategy", "flower-strategy"), ("run-config", "flower")])
def test_a_flower_run_directory_is_made_in_seconds_with_its_files(tmp_path, kind, key):
    out = flower_run_dir(tmp_path, "fedavg", kind=kind)
    assert json.loads((out / "status.json").read_text())["status"] == "completed"
    for name in ("config.json", "metrics.jsonl", "checkpoint.pt", "posterior.safetensors", "flower.log",
                 "environment.json"):
        assert (out / name).exists(), name
    assert key in json.loads((out / "config.json").read_text())
    assert (out / "flower.json").exists() == (kind == "run-config")
