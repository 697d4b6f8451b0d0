"""Flower with each node's own data: a SuperNode reads only its own file, the server only the evaluation set; the
ServerApp runs the engine's loop (the numbers of `bayesadmm.run` on the same data), a user's own method with its own
state classes runs through the records, a run resumes from its checkpoint with the numbers of an uninterrupted run,
and a restarted node gets its client state back."""

import pytest
import torch

pytest.importorskip("flwr")

import user_app
from flwr.app import Context, RecordDict
from helpers import LocalDataGrid, assert_same_metrics, lines

import bayesadmm
from bayesadmm.engine.rundir import load_state
from bayesadmm.flower.app_config import flower_run, parse_hparams
from bayesadmm.flower.client_app import app as client_app
from bayesadmm.flower.loaders import load_tensors, save_tensors
from bayesadmm.flower.server_app import run_server

IVON = "lr=0.05 rho=0.1 gamma=1.0 delta=1.0 epochs=1 batch_size=8"


@pytest.fixture
def deployment(tmp_path):
    """Each client's file in a folder of its own (as on its machine), the test set on the server."""
    torch.set_default_dtype(torch.float64)   # restored by tests/conftest.py
    parts, test = user_app.tensors(seed=3)
    files = {k: save_tensors(tmp_path / f"node-{k}" / f"client-{k}.npz", X, y) for k, (X, y) in enumerate(parts)}
    eval_file = save_tensors(tmp_path / "server" / "test.pt", *test)
    return parts, test, files, eval_file


def _app_config(tmp_path, eval_file, out, **extra):
    return {"model": "user_app:make_model", "algorithm": "ivon-admm", "hparams": IVON, "clients": 3, "rounds": 3,
            "seed": 7, "eval-samples": 4, "dtype": "float64", "eval-data": str(eval_file), "out": str(out),
            "round-timeout": 30.0, "discovery-timeout": 5.0, **extra}


def _grid(files, eval_file, **options):
    configs = {k: {"partition-id": k, "data": str(f)} for k, f in files.items()}
    return LocalDataGrid(client_app, configs, files, [eval_file], **options)


def _local(parts, test, out, algorithm, hparams, rounds=3):
    torch.manual_seed(7)   # the ServerApp builds the model under the run's seed
    model = user_app.make_model()
    return bayesadmm.run(model, clients=parts, test=test, algorithm=algorithm, hparams=hparams, rounds=rounds,
                         seed=7, eval_samples=4, out=out, progress=False)


def test_tensor_files_round_trip(tmp_path):
    X, y = torch.randn(5, 2, dtype=torch.float64), torch.arange(5)
    for name in ("a.npz", "a.pt"):
        back = load_tensors(save_tensors(tmp_path / name, X, y))
        assert torch.equal(back[0], X) and torch.equal(back[1], y) and back[0].dtype == torch.float64
    with pytest.raises(FileNotFoundError, match="no data file"):
        load_tensors(tmp_path / "missing.npz")


def test_each_node_reads_only_its_own_file_and_the_run_is_the_local_engines(deployment, tmp_path):
    parts, test, files, eval_file = deployment
    grid = _grid(files, eval_file)
    result = run_server(grid, flower_run(_app_config(tmp_path, eval_file, tmp_path / "flower")))
    assert result.status == "completed" and all(grid.reads[n] >= 4 for n in grid.contexts)   # query + 3 rounds
    local = _local(parts, test, tmp_path / "local", "ivon-admm", parse_hparams(IVON))
    assert local.status == "completed"
    assert_same_metrics(lines(tmp_path / "local"), lines(tmp_path / "flower"), tol=1e-9)
    assert (tmp_path / "flower" / "checkpoint.pt").exists() and (tmp_path / "flower" / "flower.json").exists()


def test_a_node_may_load_its_data_with_its_own_loader(deployment, tmp_path):
    parts, test, files, eval_file = deployment
    grid = _grid(files, eval_file)
    node = grid.contexts[1001].node_config
    node["loader"], node["my-file"] = "user_app:load_client", node.pop("data")
    result = run_server(grid, flower_run(_app_config(tmp_path, eval_file, tmp_path / "flower", rounds=1)))
    assert result.status == "completed"
    whole = run_server(_grid(files, eval_file), flower_run(_app_config(tmp_path, eval_file, tmp_path / "b", rounds=1)))
    assert whole.status == "completed"
    assert_same_metrics(lines(tmp_path / "b"), lines(tmp_path / "flower"), tol=0.0)


def test_a_node_without_data_is_told_how_to_give_it(deployment, tmp_path):
    parts, test, files, eval_file = deployment
    grid = _grid(files, eval_file)
    del grid.contexts[1001].node_config["data"]
    with pytest.raises(RuntimeError, match=r"no SuperNode holds client\(s\) \[1\]"):
        run_server(grid, flower_run(_app_config(tmp_path, eval_file, tmp_path / "flower", **{"discovery-timeout": 1})))
    assert "this SuperNode has no data: start it with --node-config" in (tmp_path / "flower" / "flower.log").read_text()


def test_a_user_algorithm_with_its_own_state_classes_runs_on_flower(deployment, tmp_path):
    parts, test, files, eval_file = deployment
    config = _app_config(tmp_path, eval_file, tmp_path / "flower", algorithm="user_app:make_algorithm",
                         hparams="lr=0.2 steps=3")
    result = run_server(_grid(files, eval_file), flower_run(config))
    assert result.status == "completed" and type(result.server) is user_app.Server and result.server.rounds == 3
    assert _local(parts, test, tmp_path / "local", user_app.make_algorithm, {"lr": 0.2, "steps": 3}).status == "completed"
    assert_same_metrics(lines(tmp_path / "local"), lines(tmp_path / "flower"), tol=1e-9)
    states = load_state(tmp_path / "flower" / "checkpoint.pt")["clients"]   # the nodes' states, in the user's class
    local_states = load_state(tmp_path / "local" / "checkpoint.pt")["clients"]
    assert all(type(s) is user_app.Client and s.updates == 3 for s in states.values())
    assert all(torch.allclose(states[k].dual, local_states[k].dual, rtol=0, atol=1e-12) for k in states)


def test_a_stopped_flower_run_resumes_with_the_numbers_of_an_uninterrupted_one(deployment, tmp_path):
    parts, test, files, eval_file = deployment
    whole = run_server(_grid(files, eval_file), flower_run(_app_config(tmp_path, eval_file, tmp_path / "whole")))
    assert whole.status == "completed"
    out = tmp_path / "resumed"
    first = run_server(_grid(files, eval_file), flower_run(_app_config(tmp_path, eval_file, out, **{"stop-at": 1})))
    assert first.status == "stopped" and [line["round"] for line in lines(out)] == [1]
    # a new `flwr run` (new Contexts: the nodes hold no state) with only out= and resume=true
    resumed = run_server(_grid(files, eval_file), flower_run({"out": str(out), "resume": True}))
    assert resumed.status == "completed" and [line["round"] for line in lines(out)] == [1, 2, 3]
    assert_same_metrics(lines(tmp_path / "whole"), lines(out), tol=0.0)
    assert "get their state from the server" not in (out / "flower.log").read_text()   # sent with the first message


def test_a_run_config_resume_may_move_the_run_directory_and_change_the_device_and_timeouts(deployment, tmp_path):
    """Only out (where the directory is now), stop-at, the timeouts and the device may differ from flower.json; an
    app's default "" (device) keeps the run's own."""
    import json
    import shutil

    parts, test, files, eval_file = deployment
    whole = run_server(_grid(files, eval_file), flower_run(_app_config(tmp_path, eval_file, tmp_path / "whole")))
    before = tmp_path / "before"
    first = run_server(_grid(files, eval_file), flower_run(_app_config(tmp_path, eval_file, before, **{"stop-at": 1})))
    assert whole.status == "completed" and first.status == "stopped"
    moved = tmp_path / "moved"
    shutil.move(before, moved)
    again = {"out": str(moved), "resume": True, "device": "cpu:0", "round-timeout": 20.0, "stop-at": 2}
    assert run_server(_grid(files, eval_file), flower_run(again)).status == "stopped"
    from bayesadmm.flower.app_config import _resumed

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "flower.json").write_text(json.dumps({"model": "m:f", "device": "cuda", "out": "/elsewhere"}))
    assert _resumed({"out": str(kept), "device": ""}) == {"model": "m:f", "device": "cuda", "out": str(kept),
                                                          "stop-at": 0, "resume": True}   # "": the run's own
    assert _resumed({"out": str(kept), "device": "cpu"})["device"] == "cpu"
    resumed = run_server(_grid(files, eval_file), flower_run({"out": str(moved), "resume": True}))
    assert resumed.status == "completed" and [line["round"] for line in lines(moved)] == [1, 2, 3]
    assert not before.exists()
    assert_same_metrics(lines(tmp_path / "whole"), lines(moved), tol=0.0)
    (moved / "flower.json").write_text(json.dumps(["not", "a", "table"]))
    with pytest.raises(ValueError, match="flower.json is not a Flower run's configuration"):
        flower_run({"out": str(moved), "resume": True})


USER = {"algorithm": "user_app:make_algorithm", "hparams": "lr=0.2 steps=3"}


class RestartingGrid(LocalDataGrid):
    """Client 2's node dies once round `die` is over and is started again (its node id, an empty Context.state):
    at once (`miss=False`), or after missing round die + 1 (`miss=True`)."""

    def __init__(self, files, eval_file, die: int, miss: bool):
        configs = {k: {"partition-id": k, "data": str(f)} for k, f in files.items()}
        super().__init__(client_app, configs, files, [eval_file])
        self.die, self.miss, self.round, self.configs = die, miss, 0, configs

    def restart(self, k):
        self.contexts.setdefault(self.node_ids[k], Context(run_id=1, node_id=self.node_ids[k],
                                                           node_config=dict(self.configs[k]), state=RecordDict(),
                                                           run_config={}))
        return super().restart(k)

    def push_messages(self, messages):
        self.round = max([self.round] + [int(m.metadata.group_id) for m in messages if m.metadata.group_id.isdigit()])
        return super().push_messages(messages)

    def get_node_ids(self):
        if self.round == self.die and 1002 in self.contexts:
            if self.miss:
                del self.contexts[1002]   # gone: not connected during round die + 1
            else:
                self.restart(2)
        if self.miss and self.round == self.die + 1 and self.node_ids[2] not in self.contexts:
            self.restart(2)
        return list(self.contexts)


def test_a_restarted_node_gets_its_client_state_back_and_the_numbers_are_unchanged(deployment, tmp_path):
    parts, test, files, eval_file = deployment
    whole = run_server(_grid(files, eval_file), flower_run(_app_config(tmp_path, eval_file, tmp_path / "whole", **USER)))
    grid = RestartingGrid(files, eval_file, die=1, miss=False)
    out = tmp_path / "churn"
    result = run_server(grid, flower_run(_app_config(tmp_path, eval_file, out, **USER)))
    assert whole.status == result.status == "completed" and grid.node_ids[2] == 1002
    assert_same_metrics(lines(tmp_path / "whole"), lines(out), tol=0.0)   # the state came back whole
    assert "round 2: clients [2] get their state from the server" in (out / "flower.log").read_text()


def test_a_node_that_misses_a_round_is_logged_leaving_and_coming_back_with_its_state(deployment, tmp_path):
    parts, test, files, eval_file = deployment
    grid = RestartingGrid(files, eval_file, die=1, miss=True)
    out = tmp_path / "churn"
    result = run_server(grid, flower_run(_app_config(tmp_path, eval_file, out, **USER, **{"round-timeout": 0.5})))
    assert result.status == "completed"
    metrics = lines(out)
    assert [line["participants"] for line in metrics] == [3, 2, 3]
    assert metrics[1]["absent_clients"] == [2] and "absent_clients" not in metrics[2]
    log = (out / "flower.log").read_text()
    assert "round 2: client 2 did not reply (node 1002 is no longer connected to the SuperLink)" in log
    assert "round 3: client 2 is back on node 1002" in log
    # client 2 came back with the state of its round-1 update and made one more: 2 updates, the others 3
    states = load_state(out / "checkpoint.pt")["clients"]
    assert [states[k].updates for k in range(3)] == [3, 3, 2]


def test_flower_resume_builds_the_flwr_run_command_and_checks_the_run_directory(deployment, tmp_path, capsys):
    from bayesadmm.cli import main
    from bayesadmm.flower.resume import resume_argv

    parts, test, files, eval_file = deployment
    out = tmp_path / "run"
    config = _app_config(tmp_path, eval_file, out, **USER, **{"stop-at": 1})
    assert run_server(_grid(files, eval_file), flower_run(config)).status == "stopped"
    argv = resume_argv(out, "mylink", tmp_path / "app", stop_at=2)
    assert argv[1:] == ["run", str(tmp_path / "app"), "mylink", "--run-config",
                        f'out="{out.resolve()}" resume=true stop-at=2', "--stream"]
    with pytest.raises(ValueError, match="name its Flower app with --app"):
        resume_argv(out, "mylink")
    assert main(["flower", "resume", str(tmp_path / "nothing"), "mylink"]) == 2
    assert "not a Flower run with a checkpoint" in capsys.readouterr().err


def test_a_run_config_with_a_mistake_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"unknown run config key\(s\) round \(did you mean rounds\?\); valid: .*rounds"):
        flower_run({"model": "user_app:make_model", "round": 3})
    with pytest.raises(ValueError, match="clients= must be"):
        flower_run({"model": "user_app:make_model", "clients": -1})
    with pytest.raises(ValueError, match="resume=true needs out="):
        flower_run({"resume": True, "out": str(tmp_path)})
    with pytest.raises(ValueError, match="model=nomodule:f: cannot import nomodule"):
        from bayesadmm.flower.app_config import model_of
        model_of({"model": "nomodule:f", "seed": 0})


def test_a_run_config_names_its_likelihood_as_the_command_line_does_and_the_nodes_rebuild_it(deployment, tmp_path):
    """likelihood = "gaussian" and likelihood-noise: the nodes train with it (bayesadmm.run's numbers), flower.json
    records it as the setup spells it, which a resume and `bayesadmm.load` read back."""
    parts, test, _, _ = deployment
    g = torch.Generator().manual_seed(5)
    real = [(X, X[:, :3] + 0.1 * torch.randn(X.shape[0], 3, generator=g)) for X, _ in parts]
    test = (test[0], test[0][:, :3])
    files = {k: save_tensors(tmp_path / f"real-{k}.npz", X, y) for k, (X, y) in enumerate(real)}
    eval_file = save_tensors(tmp_path / "real-test.pt", *test)
    out = tmp_path / "flower"
    config = _app_config(tmp_path, eval_file, out, rounds=2, likelihood="gaussian", **{"likelihood-noise": 0.5})
    run = flower_run(config)
    assert run.setup["likelihood"] == "regression:0.5"
    assert run.app_config["likelihood"] == "regression:0.5" and "likelihood-noise" not in run.app_config
    result = run_server(_grid(files, eval_file), run)
    assert result.exit_code == 0
    torch.manual_seed(7)
    local = bayesadmm.run(user_app.make_model(), clients=real, test=test, algorithm="ivon-admm",
                          hparams=parse_hparams(IVON), rounds=2, seed=7, eval_samples=4, out=tmp_path / "local",
                          progress=False, likelihood=bayesadmm.GaussianRegression(0.5))
    assert_same_metrics(local.history, lines(out), tol=1e-9)
    resumed = flower_run({"out": str(out), "resume": True})  # flower.json's spelling read back
    assert resumed.setup["likelihood"] == "regression:0.5"
    loaded = bayesadmm.load(out, model=user_app.make_model())
    assert loaded.history == lines(out)


@pytest.mark.parametrize("entries, said", [
    ({"likelihood": "regression:0.5"}, 'likelihood = "regression:0.5": the Gaussian likelihood is named gaussian, its '
                                       'noise likelihood-noise: likelihood = "gaussian" and likelihood-noise = 0.5'),
    ({"likelihood": "poison"}, "unknown likelihood 'poison' (did you mean poisson?)"),
    ({"lr": 0.1}, "lr (a hyperparameter of ivon-admm: set it as ivon-admm.lr, in a [tool.flwr.app.config.ivon-admm] "
                  "table)"),
    ({"ivon-admm.lrr": 0.1}, "ivon-admm.lrr (ivon-admm has no hyperparameter lrr (did you mean ivon-admm.lr?))"),
    ({"client-store": "disk"}, "client-store (a setting of local runs: on Flower each SuperNode holds its client's"),
    ({"workers": 4}, "workers (a setting of local runs: on Flower each SuperNode trains its own client)"),
    ({"cohort": 8}, "cohort (a setting of local runs: on Flower each SuperNode trains its own client)"),
])
def test_a_run_config_key_the_app_does_not_read_is_refused_naming_where_it_goes(tmp_path, entries, said):
    with pytest.raises(ValueError) as refused:
        flower_run({"model": "user_app:make_model", "algorithm": "ivon-admm", "out": str(tmp_path / "r"), **entries})
    assert said in str(refused.value) and "\n" not in str(refused.value)
