"""Client-level DP through a Flower strategy at participation < 1: the strategy draws the engine's Poisson sample
(rounds without participants included) and gives bayesadmm.run's numbers and ε."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr")
pytest.importorskip("opacus")

import user_app
from flwr.app import ArrayRecord
from helpers import LoopbackGrid, assert_same_metrics, lines
from test_strategy import _user_client_app

import bayesadmm
from bayesadmm.engine.federation import participants
from bayesadmm.flower import strategy

FEDAVG = {"lr": 0.01, "epochs": 1, "batch_size": 8}
# IVON-ADMM's running-sum server: its private rounds release the noised sum of the changes (privacy.client_level)
IVON_ADMM = {**bayesadmm.algorithms.spec.get("ivon-admm").example, "incremental": True}
# and its participants' server: the noised sum of the round's steps over the expected number of participants
PARTICIPANTS = {**bayesadmm.algorithms.spec.get("ivon-admm").example, "proximal": "participants"}


@pytest.mark.parametrize(
    "method, hparams", [("fedavg", FEDAVG), ("ivon-admm", IVON_ADMM), ("ivon-admm", PARTICIPANTS)]
)
def test_a_private_strategy_at_partial_participation_draws_the_engines_poisson_sample(tmp_path, method, hparams):
    """3 clients at q = 0.4, seed 7: rounds 2 and 3 draw no client; the strategy's rounds are the local run's, with
    the same participants, numbers and ε."""
    torch.set_default_dtype(torch.float64)  # restored by tests/conftest.py
    parts, test = user_app.tensors(seed=3)
    dp = bayesadmm.DPSettings(clip=1.0, noise_multiplier=1.0)
    torch.manual_seed(7)
    model = user_app.make_model()
    local = bayesadmm.run(
        model,
        clients=parts,
        test=test,
        algorithm=method,
        hparams=hparams,
        rounds=4,
        seed=7,
        eval_samples=4,
        out=tmp_path / "local",
        progress=False,
        cohort=1,
        participation=0.4,
        dp=dp,
    )
    torch.manual_seed(7)
    model = user_app.make_model()
    s = strategy(
        method,
        model=model,
        rounds=4,
        seed=7,
        eval_samples=4,
        dtype="float64",
        eval_data=test,
        dp=dp,
        fraction_train=0.4,
        fraction_evaluate=0.0,
        out=tmp_path / "flower",
        **hparams,
    )
    grid = LoopbackGrid(_user_client_app(parts, test), len(parts))
    s.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()))
    flower = lines(tmp_path / "flower")
    drawn = [len(participants([0, 1, 2], 0.4, 7, r, "poisson")) for r in range(1, 5)]
    assert drawn == [3, 0, 0, 1]
    assert [line["participants"] for line in flower] == drawn == [line["participants"] for line in local.history]
    assert_same_metrics(local.history, flower, tol=1e-9)
    assert [line["dp_epsilon"] for line in flower] == [line["dp_epsilon"] for line in local.history]


def test_a_run_configs_dp_precision_clip_reaches_the_strategy(tmp_path):
    """Read as `DPSettings.precision_clip` and recorded in the run's configuration; absent, nothing is recorded."""
    from bayesadmm.flower import strategy_from_config

    method = {f"ivon-admm.{key.replace('_', '-')}": value for key, value in IVON_ADMM.items()}
    run_config = {"method": "ivon-admm", **method, "dp": "client", "dp-noise": 1.0, "out": str(tmp_path / "run")}
    s = strategy_from_config({**run_config, "dp-precision-clip": 5.0}, model=user_app.make_model())
    assert s.config["dp"]["precision_clip"] == 5.0
    s = strategy_from_config(run_config, model=user_app.make_model())
    assert "precision_clip" not in s.config["dp"]
