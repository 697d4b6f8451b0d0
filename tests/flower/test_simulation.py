"""Equivalence: the same scenario and seed through Flower's Simulation Runtime (Ray, virtual SuperNodes) and through
the local engine give the same per-round metrics (to 1e-4; in float64 they agree far closer)."""

import json

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

from helpers import SMALL, assert_same_metrics, lines

from bayesadmm.experiments.build import run
from bayesadmm.experiments.config import resolve
from bayesadmm.flower.server_app import Timeouts
from bayesadmm.flower.simulation import run_simulation
from conftest import needs_fmnist


@pytest.mark.slow
@needs_fmnist
def test_flower_simulation_matches_the_local_engine(tmp_path):
    # IVON-ADMM: each client keeps its dual and local posterior in its Context.state across rounds
    overrides = SMALL + ["rounds=3", "method=ivon-admm", "cosine=true"]
    local, _ = resolve("fmnist-heterog10", overrides + [f"out={tmp_path / 'local'}"])
    flower, _ = resolve("fmnist-heterog10", overrides + [f"out={tmp_path / 'flower'}"])
    assert run(local, progress=False).exit_code == 0
    run_simulation(flower, Timeouts(discovery=120, round=300), cpus=2)
    assert json.loads((tmp_path / "flower" / "status.json").read_text())["status"] == "completed"
    assert_same_metrics(lines(tmp_path / "local"), lines(tmp_path / "flower"), tol=1e-4)


@pytest.mark.slow
def test_a_simulation_on_a_ray_cluster_of_two_nodes_gives_the_local_engines_numbers(tmp_path):
    """Beyond one machine: a Ray cluster of two nodes (started here, one CPU each, as `ray start` starts them on two
    machines) runs the ClientApps; the numbers are the single-process engine's."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        cluster.wait_for_nodes()
        overrides = ["clients=2", "rounds=2", "method=ivon-admm", "epochs=1", "eval_samples=4", "cohort=1"]
        local, _ = resolve("diabetes-iid5", overrides + [f"out={tmp_path / 'local'}"])
        flower, _ = resolve("diabetes-iid5", overrides + [f"out={tmp_path / 'flower'}"])
        assert run(local, progress=False).exit_code == 0
        run_simulation(flower, Timeouts(discovery=120, round=300), address=cluster.address)
        assert len(cluster.list_all_nodes()) == 2
        assert json.loads((tmp_path / "flower" / "status.json").read_text())["status"] == "completed"
        assert_same_metrics(lines(tmp_path / "local"), lines(tmp_path / "flower"), tol=1e-4)
    finally:
        ray.shutdown()
        cluster.shutdown()
