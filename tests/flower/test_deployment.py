"""A real Flower deployment over loopback: SuperLink + 3 SuperNodes with TLS (certificates made here), IVON-ADMM for
three rounds through `flwr run`, one SuperNode killed after round 1; the run completes with the other two clients,
writes its run directory like a local run, and its log says which client stopped answering."""

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from conftest import needs_fmnist

from bayesadmm.flower.demo import Deployment, run_demo


@pytest.mark.slow
@needs_fmnist
def test_tls_deployment_survives_a_killed_supernode(tmp_path):
    # Rounds 2 and 3 each wait the whole round timeout for the killed node, so the timeout sets the test's length:
    # FedDyn (no kernels to compile in each SuperNode's first round) answers well within 45 s even on a loaded
    # machine (30 s once missed round 1 with two reproduction runs on the 2 cores). IVON-ADMM through the same
    # message path is tests/flower/test_adapter.py's.
    result = run_demo(overrides=("method=feddyn", "data_fraction=0.005", "epochs=1", "eval_samples=2"),
                      supernodes=3, rounds=3, workdir=tmp_path / "deployment", kill_after_round=1,
                      round_timeout=45.0, timeout=480.0, echo=lambda text: None)
    run_dir = result["run_dir"]
    assert result["killed"] and result["status"]["status"] == "completed"
    for name in ("config.json", "metrics.jsonl", "status.json", "curves.png", "partition.json", "flower.log"):
        assert (run_dir / name).exists(), name
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [1, 2, 3]
    assert lines[0]["participants"] == 3 and "absent_clients" not in lines[0]
    # the kill lands after round 1's line; client 2 may still have answered round 2 before it died
    assert lines[-1]["participants"] == 2 and lines[-1]["absent_clients"] == [2]
    log = (run_dir / "flower.log").read_text()
    assert "client 2 did not reply" in log and "server update with the 2 replies of clients [0, 1]" in log
    superlink_log = (tmp_path / "deployment" / "superlink.log").read_text()
    assert "bayesadmm: completed after round 3" in superlink_log or "completed" in log
    # TLS: the SuperLink was started with the certificate and no --insecure anywhere
    config = (tmp_path / "deployment" / "flwr-home" / "config.toml").read_text()
    assert "root-certificates" in config and "insecure" not in config


def _running_in_group(pgid: int) -> list[int]:
    """Processes of process group `pgid` that still run (zombies excluded: where PID 1 does not reap orphans, as in
    some containers, a killed orphan stays a zombie in its group)."""
    running = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            running.append(int(stat.parent.name))
    return running


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_deployment_stops_every_process_it_started(tmp_path):
    deployment = Deployment(tmp_path, supernodes=0)
    with deployment:
        sleeper = deployment._start("sleeper", ["sh", "-c", "sleep 300 & sleep 300"])
        deadline = time.monotonic() + 10
        while len(_running_in_group(sleeper.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_running_in_group(sleeper.pid)) >= 2   # sh and its sleeps
    assert sleeper.poll() is not None
    # SIGKILL is delivered asynchronously: on a loaded machine the group's members may take a moment to die
    deadline = time.monotonic() + 10
    while _running_in_group(sleeper.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running_in_group(sleeper.pid) == []   # the whole group (the background sleep too) is gone


def test_demo_command_checks_its_configuration_before_starting_anything(capsys):
    from bayesadmm.cli import main

    assert main(["flower", "demo", "gama=0.1", "--rounds", "2"]) == 2
    assert "unknown key 'gama'" in capsys.readouterr().err
    assert main(["flower", "demo", "--supernodes", "0"]) == 2
