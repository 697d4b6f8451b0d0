"""`bayesadmm.run`: a user's own module, tensors or Datasets, likelihood and algorithm through the engine's loop."""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import bayesadmm
from bayesadmm.algorithms.base import Algorithm
from bayesadmm.engine.simulate import run_rounds


def _blobs(n_clients=3, per_client=24, classes=3, features=4, seed=0):
    """Gaussian blobs per class, split over clients by label skew."""
    gen = torch.Generator().manual_seed(seed)
    centres = 2.0 * torch.randn(classes, features, generator=gen)
    clients = []
    for k in range(n_clients):
        y = (torch.arange(per_client) + k) % classes
        y = torch.where(torch.rand(per_client, generator=gen) < 0.5, y, torch.full_like(y, k % classes))
        clients.append((centres[y] + torch.randn(per_client, features, generator=gen), y))
    y_test = torch.arange(60) % classes
    return clients, (centres[y_test] + torch.randn(60, features, generator=gen), y_test)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


FEDAVG = {"lr": 0.05, "epochs": 2, "batch_size": 8}
IVON_ADMM = {"lr": 0.05, "epochs": 1, "batch_size": 8, "rho": 0.5, "gamma": 0.5, "delta": 1.0}


def _same_numbers(a, b):
    timing = {"seconds", "eval_seconds"}
    return [{k: v for k, v in line.items() if k not in timing} for line in a] == \
        [{k: v for k, v in line.items() if k not in timing} for line in b]


def test_own_module_and_tensors_run_with_every_file(tmp_path):
    clients, test = _blobs()
    result = bayesadmm.run(_net(), clients, test, algorithm="fedavg", hparams=FEDAVG, rounds=3, progress=False,
                           out=tmp_path / "run")
    assert result.status == "completed" and result.exit_code == 0 and result.round == 3
    assert [line["round"] for line in result.history] == [1, 2, 3]
    assert result.history[-1]["test_acc"] > 0.8            # separable blobs: learnt
    for name in ("config.json", "metrics.jsonl", "checkpoint.pt", "status.json", "curves.png", "environment.json"):
        assert (tmp_path / "run" / name).exists(), name
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["algorithm"] == "fedavg" and config["hparams"] == {**FEDAVG, "weighted": False} and config["settings"]["rounds"] == 3
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "completed"
    assert isinstance(result.posterior, bayesadmm.PointEstimate)   # FedAvg: a point estimate, scored at its mean
    assert not any(key.startswith("ens_") for key in result.history[-1])


def test_engine_equals_the_bare_sequential_loop(tmp_path):
    """One client at a time (cohort=1), the bits of `run_rounds`; with cohorts, its numbers to 1e-10 (float64)."""
    clients, test = _blobs()
    results = {cohort: bayesadmm.run(_net(), clients, test, algorithm="ivon-admm", hparams=IVON_ADMM, rounds=2,
                                     cohort=cohort, progress=False, out=tmp_path / f"run{cohort}") for cohort in (1, 3)}
    model = bayesadmm.FlatModel.from_module(_net())
    theta0 = model.flatten(dict(_net().named_parameters())).detach()
    data = [bayesadmm.SupervisedData(model, X, y) for X, y in clients]
    algorithm = bayesadmm.algorithms.make("ivon-admm", **IVON_ADMM, dim=model.dim)
    server, _ = run_rounds(algorithm, data, theta0, rounds=2)
    expected = algorithm.posterior(server).mean
    assert torch.equal(results[1].posterior.mean, expected)
    assert torch.allclose(results[3].posterior.mean, expected, rtol=1e-10, atol=1e-10)
    assert "ens_test_acc" in results[1].history[-1]   # a Gaussian posterior: the predictive is scored too


def test_datasets_mapping_and_partial_participation(tmp_path):
    clients, test = _blobs(n_clients=4)
    ids = [3, 7, 11, 20]
    as_tensors = bayesadmm.run(_net(), dict(zip(ids, clients)), test, algorithm="fedavg", hparams=FEDAVG,
                               rounds=3, participation=0.5, progress=False, out=tmp_path / "tensors")
    as_datasets = bayesadmm.run(_net(), {k: TensorDataset(*c) for k, c in zip(ids, clients)}, TensorDataset(*test),
                                algorithm="fedavg", hparams=FEDAVG, rounds=3, participation=0.5, progress=False,
                                out=tmp_path / "datasets")
    assert [line["participants"] for line in as_tensors.history] == [2, 2, 2]
    assert _same_numbers(as_tensors.history, as_datasets.history)
    assert json.loads((tmp_path / "tensors" / "config.json").read_text())["clients"] == {str(k): 24 for k in ids}


def test_resume_after_stop_gives_the_uninterrupted_numbers(tmp_path):
    clients, test = _blobs()
    kwargs = dict(algorithm="ivon-admm", hparams=IVON_ADMM,
                  rounds=3, progress=False)
    whole = bayesadmm.run(_net(), clients, test, out=tmp_path / "whole", **kwargs)
    first = bayesadmm.run(_net(), clients, test, out=tmp_path / "split", stop_at=1, **kwargs)
    assert first.status == "stopped" and len(first.history) == 1
    rest = bayesadmm.run(_net(), clients, test, out=tmp_path / "split", resume=True, **kwargs)
    assert rest.status == "completed" and _same_numbers(rest.history, whole.history)
    assert torch.equal(rest.posterior.mean, whole.posterior.mean)
    with pytest.raises(ValueError, match=r"configuration differs .*\(settings.rounds 3 → 4\)"):
        bayesadmm.run(_net(), clients, test, out=tmp_path / "split", resume=True, **{**kwargs, "rounds": 4})


def test_workers_give_the_numbers_of_one(tmp_path):
    clients, test = _blobs(n_clients=4)
    one = bayesadmm.run(_net(), clients, test, algorithm=fedmean, hparams={"steps": 3}, rounds=2, progress=False,
                        out=tmp_path / "one")
    two = bayesadmm.run(_net(), clients, test, algorithm=fedmean, hparams={"steps": 3}, rounds=2, workers=2,
                        progress=False, out=tmp_path / "two")
    assert _same_numbers(one.history, two.history) and torch.equal(one.posterior.mean, two.posterior.mean)
    assert one.history[-1]["client_loss"] > 0   # the user algorithm's typed info record is logged


def test_regression_and_user_metrics(tmp_path):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(3, generator=gen)
    clients = []
    for _ in range(3):
        X = torch.randn(30, 3, generator=gen)
        clients.append((X, X @ w + 0.1 * torch.randn(30, generator=gen)))
    X_test = torch.randn(50, 3, generator=gen)
    test = (X_test, X_test @ w)
    torch.manual_seed(0)
    result = bayesadmm.run(nn.Linear(3, 1), clients, test, algorithm="ivon-admm",
                           hparams={**IVON_ADMM, "epochs": 3, "batch_size": 10},
                           likelihood=bayesadmm.GaussianRegression(noise=0.1), metrics={"max_err": max_error},
                           rounds=3, progress=False, out=tmp_path / "reg")
    last = result.history[-1]
    for key in ("test_rmse", "test_nll", "test_coverage90", "test_calibration_error", "ens_test_rmse",
                "test_max_err", "ens_test_max_err"):
        assert key in last, key
    assert last["test_rmse"] < result.history[0]["test_rmse"]
    assert (tmp_path / "reg" / "curves.png").exists()


def max_error(outputs, targets):
    return float((outputs.mean(0).squeeze(-1) - targets).abs().max())


def test_ready_algorithm_instance_runs_in_process_but_not_in_workers(tmp_path):
    clients, test = _blobs()
    algorithm = fedmean(steps=2)
    result = bayesadmm.run(_net(), clients, test, algorithm=algorithm, rounds=1, progress=False, out=tmp_path / "a")
    assert result.status == "completed"
    with pytest.raises(ValueError, match="must pickle"):
        bayesadmm.run(_net(), clients, test, algorithm=algorithm, rounds=1, workers=2, progress=False,
                      out=tmp_path / "b")


@pytest.mark.parametrize("kwargs, match", [
    ({"algorithm": "no-such"}, "unknown method .no-such.; valid: admm"),
    ({"algorithm": "fedavg", "hparams": {"lr": 0.1, "learning_rate": 1}}, "no hyperparameters learning_rate"),
    ({"rounds": 0}, "rounds must be"),
    ({"participation": 1.5}, "participation"),
    ({"stop_at": 5, "rounds": 2}, "stop_at"),
])
def test_bad_arguments_are_clear_errors(tmp_path, kwargs, match):
    clients, test = _blobs()
    with pytest.raises(ValueError, match=match):
        bayesadmm.run(_net(), clients, test, **{"hparams": FEDAVG, **kwargs}, progress=False, out=tmp_path / "x")


def test_bad_client_data_is_a_clear_error(tmp_path):
    clients, test = _blobs()
    with pytest.raises(ValueError, match="client 1: X has 24 examples but y has 23"):
        bayesadmm.run(_net(), [clients[0], (clients[1][0], clients[1][1][:-1])], test, algorithm="fedavg",
                      hparams=FEDAVG, progress=False, out=tmp_path / "x")
    with pytest.raises(ValueError, match="client ids"):
        bayesadmm.run(_net(), {"a": clients[0]}, test, algorithm="fedavg", hparams=FEDAVG, progress=False,
                      out=tmp_path / "x")


@pytest.mark.parametrize("dp, said", [
    ("client", "got str 'client'"),
    ({"level": "client", "noise_multiplier": 1.0}, "got dict {'level': 'client', 'noise_multiplier': 1.0}"),
    (3.0, "got float 3.0"),
])
def test_dp_takes_a_dpsettings_and_refuses_anything_else_by_type(tmp_path, dp, said):
    """A level's name, a mapping or ε alone: a TypeError saying what dp= takes, before anything is written."""
    clients, test = _blobs()
    with pytest.raises(TypeError) as refused:
        bayesadmm.run(_net(), clients, test, algorithm="fedavg", hparams=FEDAVG, dp=dp, progress=False,
                      out=tmp_path / "x")
    assert str(refused.value) == f"dp= takes a bayesadmm.DPSettings(level=..., ...), {said}"
    assert not (tmp_path / "x").exists()


# ---- a user-written algorithm: gradient steps from the server's point, then the weighted mean of the replies ----


class MeanServer(NamedTuple):
    params: torch.Tensor


bayesadmm.trees.register(MeanServer)  # a state class of the user's own: allowed in checkpoints


class MeanInfo(NamedTuple):
    loss: float


def fedmean(steps: int, lr: float = 0.1, dim: int | None = None) -> Algorithm:
    """A few full-batch gradient steps per client, then the size-weighted mean: a minimal Algorithm."""

    def client_update(state, message, data, generator):
        theta = message["params"].clone().requires_grad_(True)
        idx = torch.randperm(data.num_examples, generator=generator)
        for _ in range(steps):
            loss = data.batch_loss(theta, idx)
            (grad,) = torch.autograd.grad(loss, theta)
            theta = (theta - lr * grad).detach().requires_grad_(True)
        reply = {"params": theta.detach(), "n": torch.tensor(float(data.num_examples))}
        return state, reply, MeanInfo(loss=loss.item())

    def server_update(server, replies):
        total = sum(r["n"] for r in replies.values())
        params = sum(r["n"] * r["params"] for r in replies.values()) / total
        return MeanServer(params), MeanInfo(loss=0.0)

    return Algorithm(name="fedmean", init_server=MeanServer, init_client=lambda server, k: None,
                     broadcast=lambda server: {"params": server.params}, client_update=client_update,
                     server_update=server_update, posterior=lambda server: bayesadmm.PointEstimate(server.params))


def test_a_device_this_machine_lacks_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    clients, test = _blobs()
    with pytest.raises(ValueError, match="sees no CUDA device"):
        bayesadmm.run(_net(), clients, test, algorithm="fedavg", hparams=FEDAVG, device="cuda", progress=False,
                      out=tmp_path / "x")
    assert not (tmp_path / "x").exists()   # refused before anything is written


@pytest.mark.parametrize("algorithm,hparams", [("fedavg", FEDAVG), ("ivon-admm", {**FEDAVG, "lr": 0.01, "rho": 0.5, "gamma": 0.5, "delta": 1.0})])
def test_cohort_setting_trains_a_rounds_clients_together_with_the_per_client_numbers(tmp_path, monkeypatch,
                                                                                     algorithm, hparams):
    from bayesadmm.engine import cohort as engine_cohort
    from bayesadmm.engine.cohort import CohortClients

    monkeypatch.setattr(engine_cohort, "usable_cores", lambda: 2)  # automatic: the 4 clients over 2 cores
    automatic = 2 if algorithm == "fedavg" else 1  # Adam's cohorts up to 16; IVON one client at a time on a CPU
    trained = []
    train = CohortClients.train
    monkeypatch.setattr(CohortClients, "train", lambda self, *a, **k: trained.append(1) or train(self, *a, **k))
    clients, test = _blobs(n_clients=4)
    runs = {
        cohort: bayesadmm.run(_net(), clients, test, algorithm=algorithm, hparams=hparams, rounds=2, cohort=cohort,
                              progress=False, out=tmp_path / f"cohort{cohort}")
        for cohort in (1, 4, 0)  # one at a time; the 4 clients as one cohort; automatic
    }
    assert json.loads((tmp_path / "cohort4" / "config.json").read_text())["settings"]["cohort"] == 4
    layouts = {c: json.loads((tmp_path / f"cohort{c}" / "environment.json").read_text())[-1] for c in runs}
    assert [(layouts[c]["workers"], layouts[c]["cohort"]) for c in (1, 4, 0)] == [(1, 1), (1, 4), (1, automatic)]
    assert len(trained) == (2 if automatic == 1 else 4)  # one call per round, in each run that trains in cohorts
    if automatic == 1:
        assert _same_numbers(runs[1].history, runs[0].history)
    for batched in (runs[4], runs[0]):
        for a, b in zip(runs[1].history, batched.history, strict=True):
            for key in (k for k in a if k.endswith(("_acc", "_nll"))):
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key
    with pytest.raises(ValueError, match="cohort must be an integer >= 0"):
        bayesadmm.run(_net(), clients, test, cohort=-1, progress=False, out=tmp_path / "bad")
