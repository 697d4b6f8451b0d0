"""examples/flower/ on a real loopback deployment with TLS (SuperLink, 3 SuperNodes, `flwr run`): each SuperNode is
given only its own file; a SuperNode killed and started again within the run is picked up again with its client
state; a run stopped after round 2 and resumed with `resume=true` gives the numbers of the local engine's run;
a registered extra node claiming a client another node holds is refused and the run completes."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from helpers import assert_same_metrics, lines

import bayesadmm
from bayesadmm.flower.app_config import parse_hparams
from bayesadmm.flower.demo import CONNECTION, Deployment, DeploymentError, run_deployment
from bayesadmm.flower.loaders import load_tensors

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower"
sys.path.insert(0, str(EXAMPLE))
from prepare import prepare  # noqa: E402


def _setup(tmp_path):
    files, test = prepare(tmp_path / "data", clients=3)
    node_configs = [f'partition-id={k} data="{path}"' for k, path in enumerate(files)]
    return files, test, node_configs


def _wait(out: Path, states: tuple, runner, deployment, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = json.loads((out / "status.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            status = {}
        if status.get("status") in states:
            return status
        if runner.poll() is not None:   # ended: its final status is written before it ends
            deadline = min(deadline, time.monotonic() + 10)
        time.sleep(0.5)
    raise DeploymentError(f"no status {states} within {timeout} s; logs in {deployment.workdir}")


@pytest.mark.slow
def test_a_restarted_supernode_is_picked_up_again_with_its_state(tmp_path):
    files, test, node_configs = _setup(tmp_path)
    out = tmp_path / "run"
    # 8 rounds: the restarted node gets in only once the SuperLink has marked the killed one offline (up to a minute,
    # `Deployment.restart`), and the rounds without it take seconds
    run_config = {"eval-data": str(test), "out": str(out), "clients": 3, "num-server-rounds": 8, "round-timeout": 60.0}
    result = run_deployment(EXAMPLE, run_config, node_configs, tmp_path / "deployment", kill_after_round=1,
                            restart=True, timeout=300.0, echo=lambda text: None)
    assert result["killed"] and result["status"]["status"] == "completed"
    log = (out / "flower.log").read_text()
    # which line says so depends on timing: "is back" where the SuperLink marked the killed node offline before the
    # restarted one got in; otherwise "get their state" (the node lacked the state version the server expects) or
    # "replies again" (it had it: a node trains only from the version the server names, client_app.py)
    back = re.search(
        r"round (\d+): (client 2 is back on node|clients \[2\] get their state|client 2 replies again)", log
    )
    assert back, log
    metrics = lines(out)
    assert [line["round"] for line in metrics] == list(range(1, 9))
    # from the round it is back in, client 2 takes part again (the new node is waited for)
    assert all(line["participants"] == 3 for line in metrics[int(back.group(1)) - 1:]), log
    # TLS: the SuperNodes were given the CA, nothing ran with --insecure
    config = (tmp_path / "deployment" / "flwr-home" / "config.toml").read_text()
    assert "root-certificates" in config and "insecure" not in config


@pytest.mark.slow
def test_a_stopped_deployment_resumes_with_the_numbers_of_the_local_engine(tmp_path):
    files, test, node_configs = _setup(tmp_path)
    out = tmp_path / "run"
    with Deployment(tmp_path / "deployment", 3, node_configs) as deployment:
        deployment.start()
        first = deployment.flwr_run(EXAMPLE, {"eval-data": str(test), "out": str(out), "clients": 3, "num-server-rounds": 4, "stop-at": 2, "round-timeout": 120.0})
        assert _wait(out, ("stopped", "failed"), first, deployment, 300)["status"] == "stopped"
        first.wait(timeout=60)
        deployment.processes.pop("flwr-run")
        second = deployment.flwr_run(EXAMPLE, {"out": str(out), "resume": True})
        assert _wait(out, ("completed", "failed"), second, deployment, 300)["status"] == "completed"
    assert [line["round"] for line in lines(out)] == [1, 2, 3, 4]
    # the same run on the local engine, from the same files
    import mymodel

    torch.set_default_dtype(torch.float32)   # the example's dtype (tests/conftest.py restores the default)
    torch.manual_seed(0)
    model = mymodel.make_model()
    hparams = parse_hparams("lr=0.02 rho=0.5 gamma=1.0 delta=1.0 epochs=2 batch_size=16 hess_init=1.0")
    local = bayesadmm.run(model, clients=[load_tensors(f) for f in files], test=load_tensors(test),
                          algorithm="ivon-admm", hparams=hparams, rounds=4, eval_samples=16, out=tmp_path / "local",
                          progress=False)
    assert local.status == "completed"
    assert_same_metrics(lines(tmp_path / "local"), lines(out), tol=1e-4)


def _online(deployment) -> int:
    """How many SuperNodes the SuperLink counts as online (`flwr supernode ls`)."""
    done = subprocess.run([str(deployment.bin / "flwr"), "supernode", "ls", CONNECTION, "--format", "json"],
                          env=deployment.env, cwd=deployment.workdir, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return sum(node["status"] == "online" for node in json.loads(done.stdout)["nodes"])


@pytest.mark.slow   # about 70 s on 2 busy cores: a SuperLink, three SuperNodes, two rounds, the local engine
def test_a_registered_node_claiming_a_held_client_is_refused_and_the_run_completes(tmp_path):
    # two clients on their nodes, and a third node whose key is registered (so it connects) but whose node config
    # names client 0 again, with client 0's file (a misconfigured second node): one of the two nodes holding client 0
    # is refused, the run completes with two clients and the numbers of the local engine's run without the extra node
    files, test = prepare(tmp_path / "data", clients=2)
    node_configs = [f'partition-id={k} data="{path}"' for k, path in enumerate(files)]
    node_configs.append(node_configs[0])
    out = tmp_path / "run"
    with Deployment(tmp_path / "deployment", 3, node_configs) as deployment:
        deployment.start()
        deadline = time.monotonic() + 120
        while _online(deployment) < 3:   # the extra node is connected before the run starts, so it is asked
            assert time.monotonic() < deadline, "the SuperNodes did not all connect"
            time.sleep(1)
        runner = deployment.flwr_run(EXAMPLE, {"eval-data": str(test), "out": str(out), "clients": 2, "num-server-rounds": 2,
                                               "round-timeout": 120.0})
        assert _wait(out, ("completed", "failed"), runner, deployment, 300)["status"] == "completed"
        assert all(process.poll() is None for name, process in deployment.processes.items() if name != "flwr-run")
    log = (out / "flower.log").read_text()
    assert re.search(r"node \d+ also claims client 0, held by node \d+: refused", log), log
    assert "also claims client 1" not in log
    metrics = lines(out)
    assert [(line["round"], line["participants"]) for line in metrics] == [(1, 2), (2, 2)]
    assert not any("absent_clients" in line for line in metrics)
    import mymodel

    torch.set_default_dtype(torch.float32)   # the example's dtype (tests/conftest.py restores the default)
    torch.manual_seed(0)
    hparams = parse_hparams("lr=0.02 rho=0.5 gamma=1.0 delta=1.0 epochs=2 batch_size=16 hess_init=1.0")
    local = bayesadmm.run(mymodel.make_model(), clients=[load_tensors(f) for f in files], test=load_tensors(test),
                          algorithm="ivon-admm", hparams=hparams, rounds=2, eval_samples=16, out=tmp_path / "local",
                          progress=False)
    assert local.status == "completed"
    assert_same_metrics(lines(tmp_path / "local"), metrics, tol=1e-4)
