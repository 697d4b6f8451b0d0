"""`engine.run.Run`: a run's rounds one `step` at a time, a `checkpoint` when asked, `resume` from it with the numbers
of an uninterrupted run; and the engine's precision is `Settings.precision`, never torch's process-wide default."""

from __future__ import annotations

import json

import pytest
import torch
from tests.engine.test_api import FEDAVG, _blobs, _net

import bayesadmm
from bayesadmm.clients import TensorClients
from bayesadmm.engine.federation import Federation
from bayesadmm.engine.run import Run
from bayesadmm.engine.rundir import load_state
from bayesadmm.engine.settings import Settings
from bayesadmm.federated import algorithm_factory
from bayesadmm.likelihoods import Classification
from bayesadmm.models import FlatModel


def _federation() -> Federation:
    clients, (X_test, y_test) = _blobs()
    model = FlatModel.from_module(_net())
    theta0 = model.flatten(dict(_net().named_parameters())).detach().clone()
    X, y = torch.cat([X for X, _ in clients]), torch.cat([y for _, y in clients])
    bounds = [0, *torch.tensor([len(c[1]) for c in clients]).cumsum(0).tolist()]
    slices = {k: (bounds[k], bounds[k + 1]) for k in range(len(clients))}
    source = TensorClients(model, X, y, slices, Classification())
    make = algorithm_factory("fedavg", FEDAVG, model, source.sizes, Classification())
    return Federation(model, source, make, theta0, X_test, y_test, Classification())


def _numbers(line: dict) -> dict:
    return {k: v for k, v in line.items() if k not in ("seconds", "eval_seconds")}


def test_a_run_steps_checkpoints_when_asked_and_resumes_with_the_same_numbers(tmp_path):
    federation = _federation()
    settings = Settings(rounds=3, checkpoint_every=10, dtype="float64")   # only the last round is due
    with Run(federation, settings, tmp_path / "a") as run:
        run.start()
        assert (run.round, run.checkpointed) == (0, 0)                        # round 0's state, for a stop in round 1
        first = run.step()
        assert first is not None and first["round"] == 1 and run.round == 1 and run.checkpointed == 0
        run.checkpoint()                                                       # asked for: now, of round 1
        assert run.checkpointed == 1 and load_state(tmp_path / "a" / "checkpoint.pt")["round"] == 1
        second = run.step()
        assert second is not None and run.checkpointed == 1                   # not due: the checkpoint stays round 1
    assert [line["round"] for line in map(json.loads, (tmp_path / "a" / "metrics.jsonl").read_text().splitlines())] \
        == [1, 2]

    with Run(federation, settings, tmp_path / "a") as resumed:
        assert resumed.resume() and resumed.round == 1 and [line["round"] for line in resumed.history] == [1]
        again = resumed.step()                                                 # round 2 redone, the same numbers
        assert again is not None and _numbers(again) == _numbers(second)
        resumed.step()
        assert resumed.checkpointed == 3                                       # the last round is always saved
        result = resumed.finish()
    assert (result.status, result.round, [line["round"] for line in result.history]) == ("completed", 3, [1, 2, 3])

    with Run(federation, settings, tmp_path / "a") as done:                    # complete: nothing to do
        assert not done.resume() and done.result().status == "completed" and done.round == 3


def test_the_server_state_is_in_the_settings_dtype(tmp_path):
    federation = _federation()                                                  # a float64 θ₀ (the suite's dtype)
    with Run(federation, Settings(rounds=1, dtype="float32"), tmp_path / "r") as run:
        run.start()
        assert run.step() is not None
        assert run.algorithm.posterior(run.server).mean.dtype == torch.float32


def test_settings_name_the_key_and_what_it_must_be():
    with pytest.raises(ValueError, match=r"dtype must be one of float32, float64, got 'float16'"):
        Settings(dtype="float16")
    with pytest.raises(ValueError, match=r"rounds must be an integer >= 1 .*got 0.*participation must be in"):
        Settings(rounds=0, participation=2.0)


def test_bayesadmm_run_leaves_torch_default_dtype_alone(tmp_path):
    """A float64 model runs in float64 (its precision) in a process whose default stays float32, and the reverse."""
    clients, test = _blobs()
    for default, dtype in ((torch.float32, torch.float64), (torch.float64, torch.float32)):
        torch.set_default_dtype(default)                                         # tests/conftest.py restores it
        net = _net().to(dtype)
        data = [(X.to(dtype), y) for X, y in clients]
        result = bayesadmm.run(net, data, (test[0].to(dtype), test[1]), algorithm="fedavg", hparams=FEDAVG,
                               rounds=1, progress=False, out=tmp_path / str(dtype))
        assert result.status == "completed" and torch.get_default_dtype() == default
        assert result.posterior.mean.dtype == dtype
    with pytest.raises(ValueError, match="dtype='float32' but the model's parameters are float64: cast"):
        bayesadmm.run(_net().double(), clients, test, algorithm="fedavg", dtype="float32", progress=False,
                      out=tmp_path / "mismatch")


def test_the_cli_runs_in_its_precision_and_leaves_torch_default_dtype_alone(tmp_path):
    from bayesadmm.cli import main

    torch.set_default_dtype(torch.float32)                                       # tests/conftest.py restores it
    args = ["run", "diabetes-iid5", "rounds=1", "method=fedavg", "epochs=1", "dtype=float64", "--quiet"]
    assert main([*args, f"out={tmp_path / 'r'}"]) == 0
    assert torch.get_default_dtype() == torch.float32
    server = load_state(tmp_path / "r" / "checkpoint.pt")["server"]
    assert json.loads((tmp_path / "r" / "config.json").read_text())["dtype"] == "float64"
    assert {t.dtype for t in _tensors(server)} == {torch.float64}


def _tensors(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree] if tree.is_floating_point() else []
    if isinstance(tree, dict):
        return [t for value in tree.values() for t in _tensors(value)]
    if isinstance(tree, (tuple, list)):
        return [t for value in tree for t in _tensors(value)]
    return []
