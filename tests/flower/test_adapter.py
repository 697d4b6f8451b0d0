"""The Flower adapter without Flower's runtimes: records are lossless, and every registry algorithm run through the
ServerApp/ClientApp message path gives the local engine's metrics (an in-process Grid stands in for the SuperLink)."""

import json
import math
from typing import NamedTuple

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import RecordDict
from helpers import EXTRA, SMALL, LoopbackGrid, assert_same_metrics, fast_data, lines  # noqa: F401 (fixture)

from bayesadmm import trees
from bayesadmm.algorithms import names
from bayesadmm.experiments.build import run
from bayesadmm.experiments.config import resolve
from bayesadmm.flower import records
from bayesadmm.flower.client_app import app as client_app
from bayesadmm.flower.server_app import Timeouts, config_from_run_config, run_server
from conftest import needs_fmnist


class Foreign(NamedTuple):
    x: int


class Unregistered(NamedTuple):
    x: int


trees.register(Foreign)


def test_messages_round_trip_with_keys_dtypes_and_shapes():
    message = {"theta": torch.randn(5, dtype=torch.float64), "lam.0": torch.randn(2, 3, dtype=torch.float32),
               "round": torch.tensor(4), "num-examples": torch.tensor(17.0), "mask": torch.tensor([True, False])}
    back = records.record_to_message(records.message_to_record(message))
    assert list(back) == list(message)
    for key in message:
        assert back[key].dtype == message[key].dtype and back[key].shape == message[key].shape
        assert torch.equal(back[key], message[key])
    with pytest.raises(records.RecordError, match="key 'x' holds float"):
        records.message_to_record({"x": 1.0})


def test_client_state_pytrees_round_trip_exactly():
    from bayesadmm.algorithms.fedlap_func import ClientState

    state = {"a": ClientState(3, torch.randn(4), None, torch.arange(3), None, torch.randn(2, 2)),
             7: (1.5, float("nan"), -math.inf, True, "text", [torch.tensor(2.0)]), "none": None}
    store = RecordDict()
    assert records.load_state(store) is None
    records.save_state(store, state)
    back = records.load_state(store)
    assert type(back["a"]) is ClientState and back["a"].client_id == 3 and back["a"].memory_x is None
    assert torch.equal(back["a"].dual, state["a"].dual) and torch.equal(back["a"].theta, state["a"].theta)
    assert back[7][0] == 1.5 and math.isnan(back[7][1]) and back[7][2] == -math.inf and back[7][3] is True
    assert back[7][4] == "text" and isinstance(back[7][5], list) and torch.equal(back[7][5][0], torch.tensor(2.0))
    assert back["none"] is None and list(back) == ["a", 7, "none"]


def test_messages_and_states_come_back_on_the_device_asked_for():
    """Records hold numpy arrays: a receiver computing on a GPU must get its tensors there. The meta device stands in
    for a GPU here (a CPU-only machine): every tensor, however nested, must arrive on it."""
    from bayesadmm.algorithms.fedlap_func import ClientState

    message = {"lam.0": torch.randn(3), "round": torch.tensor(2)}
    assert all(t.device.type == "cpu" for t in records.record_to_message(records.message_to_record(message)).values())
    back = records.record_to_message(records.message_to_record(message), "meta")
    assert all(t.device.type == "meta" and t.shape == message[k].shape for k, t in back.items())
    store = RecordDict()
    records.save_state(store, {"a": ClientState(3, torch.randn(4), None, torch.arange(3), None, torch.randn(2, 2)),
                               "b": [(torch.ones(2), 1.0)]})
    state = records.load_state(store, torch.device("meta"))
    tensors = [state["a"].dual, state["a"].memory_tau, state["a"].theta, state["b"][0][0]]
    assert all(t.device.type == "meta" for t in tensors) and state["a"].client_id == 3


def test_records_refuse_what_they_cannot_store_or_trust():
    # a user's own registered NamedTuple goes through; an unregistered class, or one a record names, does not
    arrays, structure = records.tree_to_records(Foreign(1))
    assert records.records_to_tree(arrays, structure) == Foreign(1)
    with pytest.raises(records.RecordError, match="not a registered state class"):
        records.tree_to_records(Unregistered(1))
    structure["tree"] = json.dumps({"namedtuple": "not_imported_anywhere:Thing", "items": []})
    with pytest.raises(records.RecordError, match="not_imported_anywhere"):
        records.records_to_tree(arrays, structure)
    structure["tree"] = json.dumps({"namedtuple": "bayesadmm.__main__:X", "items": []})  # once re-ran the CLI
    with pytest.raises(records.RecordError, match="not a registered state class"):
        records.records_to_tree(arrays, structure)
    structure["tree"] = json.dumps({"namedtuple": f"{Foreign.__module__}:Foreign", "items": []})  # a field short
    with pytest.raises(records.RecordError, match="does not decode"):
        records.records_to_tree(arrays, structure)
    with pytest.raises(records.RecordError, match="cannot store a object"):
        records.tree_to_records((object(),))
    arrays, structure = records.tree_to_records(torch.zeros(1))
    structure["tree"] = json.dumps({"namedtuple": "os:PathLike", "items": []})
    with pytest.raises(records.RecordError, match="os:PathLike"):
        records.records_to_tree(arrays, structure)


def test_flwr_run_config_resolves_like_the_command_line(tmp_path):
    config, timeouts = config_from_run_config({"scenario": "fmnist-heterog10",
                                               "overrides": "method=fedavg rounds=3 lr=0.01", "out": str(tmp_path),
                                               "round-timeout": 5})
    assert (config.method, config.rounds, config.hparams["lr"], config.out) == ("fedavg", 3, 0.01, str(tmp_path))
    assert timeouts.round == 5.0
    from bayesadmm.experiments.config import ConfigError
    with pytest.raises(ConfigError, match="unknown key 'gama'"):
        config_from_run_config({"scenario": "fmnist-heterog10", "overrides": "gama=0.1"})


def test_flowers_run_config_conventions_are_read_beside_the_librarys_own(tmp_path):
    """num-server-rounds, fraction-train, method and the method's typed hyperparameter table (other methods' tables
    are declared for when they are chosen, and left out)."""
    from bayesadmm.flower.app_config import flower_run

    config, _ = config_from_run_config({"scenario": "diabetes-iid5", "method": "fedavg", "num-server-rounds": 2,
                                        "fraction-train": 0.6, "fedavg.lr": 0.05, "fedavg.batch-size": 8,
                                        "ivon-admm.lr": 1.0, "out": str(tmp_path)})
    assert (config.method, config.rounds, config.participation) == ("fedavg", 2, 0.6)
    assert (config.hparams["lr"], config.hparams["batch_size"]) == (0.05, 8)
    own = flower_run({"model": "user_app:make_model", "algorithm": "ivon-admm", "eval-data": "test.npz", "clients": 3,
                      "num-server-rounds": 4, "hparams": "rho=0.1 gamma=1.0 delta=1.0", "ivon-admm.lr": 0.02,
                      "ivon-admm.batch-size": 16, "out": str(tmp_path / "own")})
    assert own.settings.rounds == 4
    given = {"rho": 0.1, "gamma": 1.0, "delta": 1.0, "lr": 0.02, "batch_size": 16}
    assert own.setup["hparams"].items() >= given.items()
    assert own.setup["hparams"]["beta1"] == 0.9 and len(own.setup["hparams"]) == 17  # every one, defaults included
    with pytest.raises(ValueError, match="num-server-rounds=4 and rounds=3 disagree"):
        flower_run({"scenario": "diabetes-iid5", "num-server-rounds": 4, "rounds": 3})


def test_a_preset_run_config_takes_the_likelihood_and_refuses_what_a_flower_run_does_not_use(tmp_path):
    """likelihood and likelihood-KEY as the command line's likelihood= and likelihood.KEY=; a preset's setting at the
    top level is pointed to overrides; client_store=disk (the server keeps its copy of the states in memory) is
    refused by name, in a run config and in a RunConfig given to the ServerApp (a simulation's)."""
    from bayesadmm.flower.app_config import preset_run

    base = {"scenario": "diabetes-iid5", "overrides": "clients=2", "out": str(tmp_path)}
    config, _ = config_from_run_config({**base, "likelihood": "poisson"})
    assert (config.likelihood, config.likelihood_params) == ("poisson", {})
    config, _ = config_from_run_config({**base, "likelihood": "gaussian", "likelihood-noise": 0.3})
    assert (config.likelihood, config.likelihood_params) == ("gaussian", {"noise": 0.3})
    with pytest.raises(ValueError, match=r'validation \(a setting of the preset: put it in overrides, overrides = '
                                         r'"validation=VALUE"\)'):
        config_from_run_config({**base, "validation": 0.1})
    with pytest.raises(ValueError, match="client_store=disk is a setting of local runs: on Flower each SuperNode"):
        config_from_run_config({**base, "overrides": "clients=2 client_store=disk"})
    disk, _ = resolve("diabetes-iid5", ["clients=2", "client_store=disk"])
    with pytest.raises(ValueError, match="client_store=disk is a setting of local runs"):
        preset_run(disk)


def _local_and_flower(tmp_path, method, extra=(), grid_options=None, timeouts=Timeouts(discovery=5, round=60)):
    overrides = SMALL + ["rounds=2", f"method={method}", *EXTRA.get(method, []), *extra]
    local, _ = resolve("fmnist-heterog10", overrides + [f"out={tmp_path / 'local'}"])
    flower, _ = resolve("fmnist-heterog10", overrides + [f"out={tmp_path / 'flower'}"])
    assert run(local, progress=False).exit_code == 0
    code = run_server(LoopbackGrid(client_app, flower.clients, **(grid_options or {})), flower, timeouts).exit_code
    return code, lines(tmp_path / "local"), lines(tmp_path / "flower")


@needs_fmnist
@pytest.mark.parametrize("method", names())
def test_every_registry_algorithm_through_the_flower_message_path_matches_the_local_engine(fast_data, tmp_path, method):
    code, local, flower = _local_and_flower(tmp_path, method)
    assert code == 0
    assert_same_metrics(local, flower, tol=1e-9)
    for name in ("config.json", "metrics.jsonl", "status.json", "curves.png", "partition.json", "flower.log"):
        assert (tmp_path / "flower" / name).exists(), name
    assert json.loads((tmp_path / "flower" / "status.json").read_text())["status"] == "completed"
    (environment,) = json.loads((tmp_path / "flower" / "environment.json").read_text())
    assert environment["from_round"] == 0 and environment["torch"] == torch.__version__


@needs_fmnist
def test_partial_participation_matches_the_local_engine(fast_data, tmp_path):
    code, local, flower = _local_and_flower(tmp_path, "feddyn", ["participation=0.6", "rounds=3"])
    assert code == 0 and [line["participants"] for line in flower] == [2, 2, 2]
    assert_same_metrics(local, flower, tol=1e-9)


def _crafted(app, bad_clients):
    """A ClientApp whose replies from `bad_clients` carry a state record naming `bayesadmm.__main__` (which, when
    records imported what they named, re-ran the command line inside the ServerApp)."""

    def crafted(message, context):
        reply = app(message, context)
        if context.node_config["partition-id"] in bad_clients and records.STATE_TREE in reply.content:
            reply.content[records.STATE_TREE]["tree"] = json.dumps({"namedtuple": "bayesadmm.__main__:X", "items": []})
        return reply

    return crafted


@needs_fmnist
def test_a_reply_that_does_not_decode_is_refused_and_logged_and_the_run_goes_on(fast_data, tmp_path):
    config, _ = resolve("fmnist-heterog10", SMALL + ["rounds=2", "method=fedavg", f"out={tmp_path / 'one'}"])
    assert run_server(LoopbackGrid(_crafted(client_app, {1}), config.clients), config).exit_code == 0
    assert [line["participants"] for line in lines(tmp_path / "one")] == [2, 2]
    log = (tmp_path / "one" / "flower.log").read_text()
    assert "client 1 (node 1001) sent a reply that is refused" in log and "bayesadmm.__main__:X" in log
    assert json.loads((tmp_path / "one" / "status.json").read_text())["status"] == "completed"
    # every client's reply refused: the run ends with a final "failed" status
    config, _ = resolve("fmnist-heterog10", SMALL + ["rounds=2", "method=fedavg", f"out={tmp_path / 'all'}"])
    with pytest.raises(RuntimeError, match="no client replied"):
        run_server(LoopbackGrid(_crafted(client_app, {0, 1, 2}), config.clients), config)
    assert json.loads((tmp_path / "all" / "status.json").read_text())["status"] == "failed"


@needs_fmnist
def test_a_client_that_stops_answering_is_logged_and_the_run_completes(fast_data, tmp_path):
    overrides = SMALL + ["rounds=3", "method=ivon-admm", "epochs=1", f"out={tmp_path}"]
    config, _ = resolve("fmnist-heterog10", overrides)
    grid = LoopbackGrid(client_app, config.clients, dead=(2,), dies_after=1)
    assert run_server(grid, config, Timeouts(discovery=5, round=0.5)).exit_code == 0
    metrics = lines(tmp_path)
    assert [line["participants"] for line in metrics] == [3, 2, 2]
    assert "absent_clients" not in metrics[0] and metrics[1]["absent_clients"] == [2] == metrics[2]["absent_clients"]
    log = (tmp_path / "flower.log").read_text()
    assert "round 2: client 2 did not reply (node 1002 did not answer within 0.5 s)" in log
    assert "round 3: client 2 did not reply (node 1002 has not answered since an earlier round" in log
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "completed"


@needs_fmnist
def test_a_node_with_a_wrong_partition_config_is_a_clear_error(fast_data, tmp_path):
    config, _ = resolve("fmnist-heterog10", SMALL + ["rounds=1", "method=fedavg", f"out={tmp_path}"])
    grid = LoopbackGrid(client_app, config.clients)
    grid.contexts[1001].node_config["num-partitions"] = 5
    assert run_server(grid, config, Timeouts(discovery=0.5, round=5)).exit_code == 0   # runs with the two valid nodes
    log = (tmp_path / "flower.log").read_text()
    assert "cannot take part" in log and "num-partitions=5 but the run has clients=3" in log
    assert "no SuperNode holds client(s) [1]" in log


@needs_fmnist
def test_a_preset_run_whose_nodes_read_only_their_own_files_matches_the_local_engine(fast_data, tmp_path,
                                                                                    monkeypatch):
    """Each node's slice of the preset written to a file of its own (what a deployment's preparation does); the node
    builds the preset's model from what the server sends and never builds the preset (its other files are hidden)."""
    from helpers import LocalDataGrid

    from bayesadmm.experiments.build import build
    from bayesadmm.flower.loaders import save_tensors

    overrides = SMALL + ["rounds=2", "method=ivon-admm", *EXTRA["ivon-admm"]]
    local, _ = resolve("fmnist-heterog10", overrides + [f"out={tmp_path / 'local'}"])
    flower, _ = resolve("fmnist-heterog10", overrides + [f"out={tmp_path / 'flower'}"])
    assert run(local, progress=False).exit_code == 0
    clients = build(local).federation.clients
    files = {k: save_tensors(tmp_path / f"node-{k}" / "data.pt", clients(k).X, clients(k).y) for k in range(3)}
    grid = LocalDataGrid(client_app, {k: {"partition-id": k, "data": str(f)} for k, f in files.items()}, files)
    from bayesadmm.flower import client_app as node

    def refuse(*args):
        raise AssertionError("a node with a file of its own built the preset")

    monkeypatch.setattr(node, "preset_slice", refuse)
    assert run_server(grid, flower, Timeouts(discovery=5, round=60)).exit_code == 0
    assert_same_metrics(lines(tmp_path / "local"), lines(tmp_path / "flower"), tol=1e-9)
