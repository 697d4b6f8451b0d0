"""Every method as a Flower strategy: a ServerApp of the user's own starts `bayesadmm.flower.strategy(...)` as it
starts Flower's FedAvg, a ClientApp of the user's own answers with `bayesadmm.flower.client`'s query, train and
evaluate on its model and data; the numbers are `bayesadmm.run`'s on the same data."""

import json

import pytest
import torch

pytest.importorskip("flwr")

import user_app
from flwr.app import ArrayRecord
from helpers import LoopbackGrid, assert_same_metrics, lines
from helpers import user_client_app as _user_client_app

import bayesadmm
from bayesadmm.algorithms import spec
from bayesadmm.engine.rundir import RunDirError
from bayesadmm.flower import strategy, strategy_from_config

QUICK = {"fedlap-func": {"server_iterations": 20}}  # the example's server solve takes minutes on the toy model
IVON = {"lr": 0.05, "rho": 0.1, "gamma": 1.0, "delta": 1.0, "epochs": 1, "batch_size": 8}


def _start(strategy_, parts, test, model, **options):
    grid = LoopbackGrid(_user_client_app(parts, test), len(parts), **options)
    return strategy_.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()))


@pytest.fixture
def data():
    torch.set_default_dtype(torch.float64)  # restored by tests/conftest.py
    return user_app.tensors(seed=3)


def _local(parts, test, out, method, hparams, rounds=3, participation=1.0):
    torch.manual_seed(7)
    model = user_app.make_model()
    return bayesadmm.run(model, clients=parts, test=test, algorithm=method, hparams=hparams, rounds=rounds, seed=7,
                         eval_samples=4, out=out, progress=False, cohort=1, participation=participation)


def test_a_strategy_in_a_users_own_apps_gives_the_local_engines_numbers(data, tmp_path):
    parts, test = data
    local = _local(parts, test, tmp_path / "local", "ivon-admm", IVON, participation=2 / 3)
    torch.manual_seed(7)
    model = user_app.make_model()
    s = strategy("ivon-admm", model=model, rounds=3, fraction_train=2 / 3, seed=7, eval_samples=4, dtype="float64",
                 eval_data=test, out=tmp_path / "flower", **IVON)
    result = _start(s, parts, test, model)
    assert_same_metrics(local.history, lines(tmp_path / "flower"), tol=1e-9)
    assert json.loads((tmp_path / "flower" / "status.json").read_text())["status"] == "completed"
    # Flower's Result holds the posterior's mean as the model's named arrays, every round's metrics
    mean = local.posterior.mean
    named = s.result.model.unflatten(mean)
    assert set(result.arrays) == set(named)
    for name, value in named.items():
        assert torch.allclose(torch.from_numpy(result.arrays[name].numpy()), value, atol=1e-9)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    # every node evaluated the global posterior and its personal one, on its data; weighted means logged
    evaluated = [json.loads(line) for line in (tmp_path / "flower" / "client-evaluation.jsonl").read_text().splitlines()]
    assert [e["round"] for e in evaluated] == [1, 2, 3]
    assert {"acc", "ens_acc", "personal_acc", "personal_ens_acc"} <= set(evaluated[-1])
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2, 3]
    assert (tmp_path / "flower" / "posterior.safetensors").exists()
    # with eval_data, the plots of a local run too (docs/deploy.md, "What a run leaves")
    assert all((tmp_path / "flower" / name).exists() for name in ("curves.png", "reliability.json", "reliability.png"))


def test_strategy_from_a_run_config_reads_flowers_conventions(data, tmp_path):
    parts, test = data
    torch.manual_seed(7)
    model = user_app.make_model()
    run_config = {"method": "fedavg", "num-server-rounds": 2, "fraction-train": 1.0, "fraction-evaluate": 0.0,
                  "seed": 7, "dtype": "float64", "eval-samples": 4, "out": str(tmp_path / "flower"),
                  "fedavg.lr": 0.01, "fedavg.epochs": 1, "fedavg.batch-size": 8, "batch-size-of-my-loader": 32}
    s = strategy_from_config(run_config, model=model, eval_data=test, app_keys=["batch-size-of-my-loader"])
    _start(s, parts, test, model)
    local = _local(parts, test, tmp_path / "local", "fedavg", {"lr": 0.01, "epochs": 1, "batch_size": 8}, rounds=2)
    assert_same_metrics(local.history, lines(tmp_path / "flower"), tol=1e-9)
    with pytest.raises(ValueError, match="fedavg has no hyperparameter rho"):
        strategy_from_config({**run_config, "fedavg.rho": 1.0}, model=model, app_keys=["batch-size-of-my-loader"])


@pytest.mark.parametrize("entries, said", [
    # a user's own top-level lr and local-epochs beside method = "fedavg" (once left alone: the run took the defaults)
    ({"lr": 0.05, "local-epochs": 3},
     "unknown run config key(s) local-epochs (did you mean fedavg.epochs?), lr (a hyperparameter of fedavg: set it as "
     "fedavg.lr, in a [tool.flwr.app.config.fedavg] table); valid: "),
    ({"batch-size-of-my-loader": 32}, "a key your app reads itself: name it in strategy_from_config(..., app_keys=[...])"),
    ({"fedavg.lrr": 0.1}, "fedavg.lrr (fedavg has no hyperparameter lrr (did you mean fedavg.lr?))"),
    ({"fedavgg.lr": 0.1}, "fedavgg.lr (no method fedavgg (did you mean fedavg?))"),
    ({"ivon-admm.lrr": 0.1}, "ivon-admm.lrr (ivon-admm has no hyperparameter lrr (did you mean ivon-admm.lr?))"),
    ({"num-server-round": 3}, "num-server-round (did you mean num-server-rounds?)"),
    ({"client-store": "disk"}, "client-store (a setting of local runs: on Flower each SuperNode holds its client's "
                               "state, the server its copy in memory)"),
    ({"likelihood": "gausian"}, "unknown likelihood 'gausian' (did you mean gaussian?); valid: classification, "
                                "gaussian, poisson"),
    ({"likelihood": "gaussian"}, "likelihood gaussian needs noise: set it as likelihood-noise=VALUE"),
    ({"likelihood-noise": 0.5}, "likelihood classification has no setting likelihood-noise; valid: likelihood-bins"),
])
def test_a_run_config_key_the_strategy_does_not_read_is_refused_naming_where_it_goes(tmp_path, entries, said):
    run_config = {"method": "fedavg", **{f"fedavg.{k}": v for k, v in FEDAVG.items()}, "out": str(tmp_path / "r"),
                  **entries}
    with pytest.raises(ValueError) as refused:
        strategy_from_config(run_config, model=user_app.make_model())
    assert said in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "r").exists()


def test_the_likelihood_is_named_in_a_run_config_as_on_the_command_line(tmp_path):
    """likelihood = "gaussian" with likelihood-noise, or "poisson", reach the nodes' setup; `likelihood=` wins."""
    run_config = {"method": "fedavg", **{f"fedavg.{k}": v for k, v in FEDAVG.items()}, "out": str(tmp_path / "r")}
    spelt = {}
    for name, extra in (("gaussian", {"likelihood-noise": 0.25}), ("poisson", {}), ("classification", {})):
        s = strategy_from_config({**run_config, "likelihood": name, **extra}, model=user_app.make_model())
        spelt[name] = s.setup["likelihood"]
        s.close()
    assert spelt == {"gaussian": "regression:0.25", "poisson": "poisson", "classification": "classification"}
    from bayesadmm.flower.app_config import likelihood_of

    assert likelihood_of({"likelihood": "poisson"}) == bayesadmm.Poisson()
    assert likelihood_of({"likelihood": "regression:0.25"}) == bayesadmm.GaussianRegression(0.25)
    s = strategy_from_config({**run_config, "likelihood": "poisson"}, model=user_app.make_model(),
                             likelihood=bayesadmm.GaussianRegression(0.5))
    assert s.setup["likelihood"] == "regression:0.5"
    s.close()


def test_a_local_runs_client_store_is_refused_by_a_strategy_by_name():
    with pytest.raises(ValueError, match="client_store is a setting of local runs: on Flower each SuperNode holds"):
        strategy("fedavg", model=user_app.make_model(), client_store="disk", **FEDAVG)
    with pytest.raises(ValueError, match=r"fedavg has no hyperparameters lrr \(did you mean lr\?\)"):
        strategy("fedavg", model=user_app.make_model(), lrr=0.1)
    with pytest.raises(ValueError, match=r"fraction_evalute \(did you mean fraction_evaluate\?\), nor is it an arg"):
        strategy("fedavg", model=user_app.make_model(), fraction_evalute=0.5, **FEDAVG)


def test_a_poisson_strategy_runs_on_the_nodes_with_bayesadmm_runs_numbers(tmp_path):
    """`poisson` reaches the nodes: they rebuild it from the setup's name, without being given it."""
    torch.set_default_dtype(torch.float64)  # restored by tests/conftest.py
    parts, test = user_app.tensors(seed=3)
    g = torch.Generator().manual_seed(5)
    counts = [(X, torch.poisson(torch.exp(0.3 * X[:, :3]), generator=g)) for X, _ in parts]
    test = (test[0], torch.poisson(torch.exp(0.3 * test[0][:, :3]), generator=g))
    torch.manual_seed(7)
    model = user_app.make_model()
    local = bayesadmm.run(model, clients=counts, test=test, algorithm="fedavg", hparams=FEDAVG, rounds=2, seed=7,
                          eval_samples=4, out=tmp_path / "local", progress=False, cohort=1,
                          likelihood=bayesadmm.Poisson())
    torch.manual_seed(7)
    model = user_app.make_model()
    s = strategy("fedavg", model=model, rounds=2, seed=7, eval_samples=4, dtype="float64", eval_data=test,
                 likelihood=bayesadmm.Poisson(), fraction_evaluate=0.0, out=tmp_path / "flower", **FEDAVG)
    assert s.setup["likelihood"] == "poisson"
    _start(s, counts, test, model)
    assert_same_metrics(local.history, lines(tmp_path / "flower"), tol=1e-9)
    loaded = bayesadmm.load(tmp_path / "flower", model=user_app.make_model())  # the likelihood read back by name
    assert torch.equal(loaded.posterior.mean, s.result.posterior.mean)


@pytest.mark.parametrize("method", [s.name for s in spec.specs() if s.build.__module__.startswith("bayesadmm.")])
def test_every_registry_method_runs_as_a_strategy(data, tmp_path, method):
    parts, test = data
    torch.manual_seed(7)
    model = user_app.make_model()
    hparams = {**spec.get(method).example, **QUICK.get(method, {})}
    s = strategy(method, model=model, rounds=2, seed=7, eval_samples=4, dtype="float64", eval_data=test,
                 fraction_evaluate=0.5, out=tmp_path / method, **hparams)
    _start(s, parts, test, model)
    local = _local(parts, test, tmp_path / "local", method, hparams, rounds=2)
    assert_same_metrics(local.history, lines(tmp_path / method), tol=1e-8)


def test_a_strategy_resumes_from_its_checkpoint_with_an_uninterrupted_runs_numbers(data, tmp_path):
    parts, test = data
    torch.manual_seed(7)
    model = user_app.make_model()
    options = dict(model=model, rounds=3, seed=7, eval_samples=4, dtype="float64", eval_data=test,
                   out=tmp_path / "flower", fraction_evaluate=0.0, **IVON)
    _start(strategy("ivon-admm", stop_at=1, **options), parts, test, model)
    assert json.loads((tmp_path / "flower" / "status.json").read_text())["status"] == "stopped"
    _start(strategy("ivon-admm", resume=True, **options), parts, test, model)
    local = _local(parts, test, tmp_path / "local", "ivon-admm", IVON)
    assert_same_metrics(local.history, lines(tmp_path / "flower"), tol=1e-9)


def test_flowers_central_dp_wrappers_do_not_apply_and_say_so(data, tmp_path):
    """Flower's central-DP wrappers noise the arrays aggregate_train returns, which are not these methods' server
    state: the strategy refuses the changed arrays (client-side clipping) or the wrapper fails on the method's
    replies (server-side clipping); docs/deploy.md says so."""
    from flwr.serverapp.strategy import (
        DifferentialPrivacyClientSideFixedClipping,
        DifferentialPrivacyServerSideFixedClipping,
    )

    parts, test = data
    torch.manual_seed(7)
    model = user_app.make_model()
    for wrapper, error, match in ((DifferentialPrivacyClientSideFixedClipping, RuntimeError, "bayesadmm's own DP"),
                                  (DifferentialPrivacyServerSideFixedClipping, ValueError, "")):
        s = strategy("fedavg", model=model, rounds=2, seed=7, dtype="float64", out=tmp_path / wrapper.__name__,
                     fraction_evaluate=0, lr=0.01, epochs=1, batch_size=8)
        wrapped = wrapper(s, noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=3)
        grid = LoopbackGrid(_user_client_app(parts, test), len(parts))
        with pytest.raises(error, match=match):
            wrapped.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2)
        s.close()


FEDAVG = {"lr": 0.01, "epochs": 1, "batch_size": 8}


# noise multipliers and budgets under which the run stops after round 3 (client level; ε of rounds 3 and 4:
# FedAvg 11.8, 14.1 at σ = 0.8, IVON-ADMM 16612, 22112 at σ = 0.01, whose precision half breaks under larger noise)
@pytest.mark.parametrize("level, method, hparams, sigma, budget", [("client", "fedavg", FEDAVG, 0.8, 12.0),
                                                                   ("client", "ivon-admm", IVON, 0.01, 2e4),
                                                                   ("example", "fedavg", FEDAVG, 0.8, 30.0),
                                                                   ("example", "ivon-admm", IVON, 0.8, 30.0)])
def test_a_private_strategy_gives_bayesadmm_runs_numbers_and_epsilon_and_stops_on_its_budget(data, tmp_path, level,
                                                                                            method, hparams, sigma,
                                                                                            budget):
    """Differential privacy through the strategy: the replies clipped and the sum noised on the server (client
    level) or DP-Adam and DP-IVON on the nodes (example level), ε per round as bayesadmm.run logs it, status "budget" before a
    round that would exceed it."""
    from bayesadmm import DPSettings

    parts, test = data
    dp = DPSettings(level=level, clip=1.0, noise_multiplier=sigma, epsilon=budget)
    torch.manual_seed(7)
    model = user_app.make_model()
    local = bayesadmm.run(model, clients=parts, test=test, algorithm=method, hparams=hparams, rounds=6, seed=7,
                          eval_samples=4, out=tmp_path / "local", progress=False, cohort=1, dp=dp)
    torch.manual_seed(7)
    model = user_app.make_model()
    s = strategy(method, model=model, rounds=6, seed=7, eval_samples=4, dtype="float64", eval_data=test, dp=dp,
                 fraction_evaluate=0.0, out=tmp_path / "flower", **hparams)
    _start(s, parts, test, model)
    flower = lines(tmp_path / "flower")
    assert_same_metrics(local.history, flower, tol=1e-9)
    assert [line["dp_epsilon"] for line in flower] == [line["dp_epsilon"] for line in local.history]
    status = json.loads((tmp_path / "flower" / "status.json").read_text())
    assert status["status"] == local.status
    if level == "client":
        assert status["status"] == "budget" and len(flower) == 3


@pytest.mark.parametrize("entry, said", [
    ({"clients": -3}, "run config key clients: the number of SuperNodes (0: as their num-partitions says), got -3"),
    ({"clients": "3"}, "run config key clients: the number of SuperNodes"),
    ({"num-server-rounds": -1}, "run config key num-server-rounds must be an integer >= 1"),
    ({"fraction-train": 1.5}, "run config key fraction-train must be in (0, 1]"),
    ({"fraction-evaluate": -0.5}, "run config key fraction-evaluate=-0.5 must be in [0, 1]"),
    ({"eval-samples": 0}, "run config key eval-samples must be an integer >= 1"),
    ({"stop-at": -1}, "run config key stop-at must be an integer >= 0"),
    ({"checkpoint-every": 0}, "run config key checkpoint-every must be an integer >= 1"),
    ({"seed": -2}, "run config key seed must be an integer >= 0"),
    ({"dp": "client", "dp-noise": 1.0, "dp-clip": "big"}, "run config key dp-clip: a number, got 'big'"),
])
def test_a_bad_number_in_a_run_config_is_refused_naming_its_key(tmp_path, entry, said):
    """Before anything is written or any node is asked (`clients = -3` once waited for no node and then said that
    none answered)."""
    run_config = {"method": "fedavg", "fedavg.lr": 0.01, "fedavg.epochs": 1, "fedavg.batch-size": 8,
                  "out": str(tmp_path / "run"), **entry}
    with pytest.raises(ValueError) as refused:
        strategy_from_config(run_config, model=user_app.make_model())
    assert said in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="clients must be the number of SuperNodes to wait for"):
        strategy("fedavg", model=user_app.make_model(), clients=0, **FEDAVG)


@pytest.mark.parametrize("dp, said", [
    ("client", "got str 'client'"),
    ({"level": "example"}, "got dict {'level': 'example'}"),
    (3.0, "got float 3.0"),
])
def test_a_strategys_dp_takes_a_dpsettings_and_refuses_anything_else_when_it_is_made(tmp_path, dp, said):
    """Refused by `strategy(...)` itself, not when a federation first reaches the settings."""
    with pytest.raises(TypeError) as refused:
        strategy("fedavg", model=user_app.make_model(), dp=dp, out=tmp_path / "run", **FEDAVG)
    assert str(refused.value) == f"dp= takes a bayesadmm.DPSettings(level=..., ...), {said}"
    assert not (tmp_path / "run").exists()


def test_an_out_that_holds_a_run_is_refused_before_any_node_is_asked_and_the_log_says_why_in_one_line(data, tmp_path):
    parts, test = data
    out = tmp_path / "taken"
    out.mkdir()
    (out / "status.json").write_text(json.dumps({"status": "completed", "round": 3}))
    model = user_app.make_model()
    grid = LoopbackGrid(_user_client_app(parts, test), len(parts))
    asked = []
    grid.push_messages = lambda messages: asked.extend(messages) or []
    s = strategy("fedavg", model=model, rounds=2, out=out, fraction_evaluate=0.0, **FEDAVG)
    with pytest.raises(RunDirError, match="holds a run already"):
        s.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()))
    assert asked == []
    (said,) = [line for line in (out / "flower.log").read_text().splitlines() if "failed" in line]
    assert said.endswith(f"the run failed: RunDirError: {out} holds a run already (status completed at round 3); "
                         "choose another out=, resume it, or overwrite it (--overwrite, or overwrite=True)")
    assert json.loads((out / "status.json").read_text()) == {"status": "completed", "round": 3}


def test_a_strategy_resumes_with_what_a_resume_may_change_changed(data, tmp_path):
    """docs/reliability.md: a resume may change the folder, the checkpoint interval, stop_at and the device (the
    strategy has no data folder, workers, trackers or client store: its clients are the nodes). The run directory
    moved, then resumed with another checkpoint interval, device spelling, round timeout and stop_at, then to the end:
    the numbers of an uninterrupted run."""
    import shutil

    from bayesadmm.flower.app_config import Timeouts

    parts, test = data
    torch.manual_seed(7)
    model = user_app.make_model()
    options = dict(model=model, rounds=3, seed=7, eval_samples=4, dtype="float64", eval_data=test,
                   fraction_evaluate=0.0, **IVON)
    _start(strategy("ivon-admm", stop_at=1, out=tmp_path / "before", **options), parts, test, model)
    moved = tmp_path / "moved"
    shutil.move(tmp_path / "before", moved)
    _start(strategy("ivon-admm", resume=True, out=moved, stop_at=2, checkpoint_every=2, device="cpu:0",
                    timeouts=Timeouts(discovery=30, round=30), **options), parts, test, model)
    assert json.loads((moved / "status.json").read_text())["status"] == "stopped"
    _start(strategy("ivon-admm", resume=True, out=moved, **options), parts, test, model)
    assert json.loads((moved / "status.json").read_text())["status"] == "completed"
    assert not (tmp_path / "before").exists()
    local = _local(parts, test, tmp_path / "local", "ivon-admm", IVON)
    assert_same_metrics(local.history, lines(moved), tol=1e-9)


def test_a_run_without_a_server_side_evaluation_set_says_so_and_leaves_what_docs_deploy_lists(data, tmp_path):
    parts, test = data
    torch.manual_seed(7)
    model = user_app.make_model()
    s = strategy("fedavg", model=model, rounds=2, seed=7, eval_samples=4, dtype="float64", out=tmp_path / "run",
                 lr=0.05, epochs=1, batch_size=8)  # fmt: skip
    _start(s, parts, test, model)
    log = (tmp_path / "run" / "flower.log").read_text().splitlines()
    assert any(line.endswith(f"-> {tmp_path / 'run'}") for line in log)  # the run directory, absolute
    said = [line for line in log if "no server-side evaluation set" in line]
    assert len(said) == 1 and "writes no curves.png and no reliability diagram" in said[0]
    assert "the nodes' own scores are in client-evaluation.jsonl" in said[0]
    files = {p.name for p in (tmp_path / "run").iterdir()}
    # docs/deploy.md, "What a run leaves": with no eval_data, these and no curves.png or reliability diagram
    leaves = {"config.json", "metrics.jsonl", "checkpoint.pt", "status.json", "posterior.safetensors", "flower.log",
              "client-evaluation.jsonl", "environment.json"}  # fmt: skip
    assert leaves <= files
    assert not files & {"curves.png", "reliability.png", "reliability.json"}
    assert not any("acc" in key or "nll" in key for key in lines(tmp_path / "run")[-1])
