"""BayesADMM's server on a running sum (`bayes_admm.make(incremental=True)`, hyperparameter `incremental` of
ivon-admm and ivon-pvi): the sum it keeps is the clients' terms computed here from their states, its closed form
is the default server's up to rounding, and its state and work do not grow with the clients that did not reply."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm.algorithms import bayes_admm, get
from bayesadmm.families import DiagonalGaussian
from bayesadmm.trees import flatten
from toy_clients import toy_clients

RHO, DELTA = 0.5, 1.0


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def _problem(clients=6):
    return toy_clients(clients)


def _run(tmp_path, name, method="ivon-admm", **hparams):
    clients, test = _problem()
    return bayesadmm.run(_net(), clients, test, algorithm=method, hparams=dict(get(method).example) | hparams,
                         rounds=4, participation=0.5, eval_samples=4, progress=False, out=tmp_path / name)


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    monkeypatch.setattr("bayesadmm.evaluation.diagrams.try_plot_run", lambda *args, **kwargs: None)


@pytest.mark.parametrize("method", ["ivon-admm", "ivon-pvi"])
def test_the_running_sum_is_the_sum_of_the_clients_terms_and_gives_the_closed_form(method, tmp_path):
    result = _run(tmp_path, "running", method, incremental=True)
    server, states = result.server, result.client_states()
    rho_s = RHO if method == "ivon-admm" else 0.0
    replied = [s for s in states.values() if s.natural is not None]
    assert 0 < len(replied) < len(states) + 1 and server.clients == len(replied)
    # Σ_k (η_k + ρ_s λ_k) over the clients that replied, from their states, in float64
    terms = [tuple(d.double() + rho_s * n.double() for d, n in zip(s.dual, s.natural, strict=True)) for s in replied]
    for part, total in zip(zip(*terms, strict=True), server.total, strict=True):
        expected = torch.stack(part).sum(0)
        assert torch.allclose(total, expected, rtol=1e-12, atol=1e-12 * float(expected.abs().max()))
    # Eq. 54 with the diagonal prior N(0, δ⁻¹I): λ_g = ((0, −δ/2) + Σ r_k) / (1 + ρ_s K)
    prior = (torch.zeros_like(server.total[0]), torch.full_like(server.total[1], -DELTA / 2))
    for lam, b, total in zip(server.natural, prior, server.total, strict=True):
        expected = (b + total) / (1 + rho_s * len(replied))
        assert torch.allclose(lam.double(), expected, rtol=1e-6 if lam.dtype == torch.float32 else 1e-14, atol=0)


def test_the_running_sum_server_is_the_default_server_up_to_rounding(tmp_path):
    default = _run(tmp_path, "default")
    running = _run(tmp_path, "running", incremental=True)
    for line_d, line_r in zip(default.history, running.history, strict=True):
        assert line_d["test_nll"] == pytest.approx(line_r["test_nll"], rel=1e-4)
    for a, b in zip(default.server.natural, running.server.natural, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def _replies(algorithm, server, ids, gen, first=True):
    """Replies of clients `ids` as their `finish` makes them, from made-up local solutions."""
    replies, states = {}, {}
    for k in ids:
        old = bayes_admm.ClientState(tuple(torch.randn(8, generator=gen) for _ in range(2)), None)
        if not first:
            old = old._replace(natural=(torch.randn(8, generator=gen), -torch.rand(8, generator=gen) - 1))
        lam_k = (torch.randn(8, generator=gen), -torch.rand(8, generator=gen) - 1)
        result = type("Result", (), {"natural": lam_k, "iterations": 1, "converged": True})()
        problem = algorithm.local.prepare(old, algorithm.broadcast(server), None)
        states[k], replies[k], _ = algorithm.local.finish(old, algorithm.broadcast(server), None, problem, result)
    return replies, states


def test_the_server_state_and_work_do_not_grow_with_the_clients_that_did_not_reply():
    family = DiagonalGaussian(8)
    algorithm = bayes_admm.make(family, solver=None, rho=RHO, delta=DELTA, incremental=True)
    gen = torch.Generator().manual_seed(0)
    server = algorithm.init_server(torch.zeros(8))
    few, _ = _replies(algorithm, server, range(3), gen)
    seconds = {}
    for absent in (0, 100_000):  # as if that many other clients had replied in earlier rounds
        crowded = server._replace(clients=absent)
        began = time.perf_counter()
        for _ in range(20):
            after, _ = algorithm.server_update(crowded, few)
        seconds[absent] = time.perf_counter() - began
        assert after.clients == absent + 3
        assert sum(t.numel() for t in flatten(after)[1]) == 4 * 8  # λ_g and Σ r_k, nothing per client
    assert seconds[100_000] < 3 * seconds[0] + 0.05


def test_unlearning_from_the_running_sum_gives_the_default_servers_posterior():
    family = DiagonalGaussian(8)
    servers, states = {}, {}
    for incremental in (False, True):
        algorithm = bayes_admm.make(family, solver=None, rho=RHO, delta=DELTA, incremental=incremental)
        server = algorithm.init_server(torch.zeros(8))
        replies, states[incremental] = _replies(algorithm, server, range(4), torch.Generator().manual_seed(2))
        server, _ = algorithm.server_update(server, replies)
        servers[incremental] = algorithm.unlearn(server, 2, states[incremental][2])
    default, running = servers[False], servers[True]
    for a, b in zip(default.natural, running.natural, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    # the running total holds the other clients' terms as they sent them (their next replies are changes from those):
    # the default server's records of them before the shift it gives them, ρ_s (λ_g' − λ_g) each
    shift = [RHO * (a.double() - b.double()) for a, b in zip(default.natural, server.natural, strict=True)]
    for part, total, moved in zip(zip(*default.replies.values(), strict=True), running.total, shift, strict=True):
        assert torch.allclose(torch.stack(part).double().sum(0) - 3 * moved, total, rtol=1e-5, atol=1e-5)
    assert running.clients == 3 and sorted(default.replies) == [0, 1, 3]


@pytest.mark.parametrize("method", ["admm", "ama"])
def test_admms_running_sum_is_the_sum_of_the_clients_terms_and_the_default_server_up_to_rounding(method, tmp_path):
    """Federated ADMM and AMA (ρ_s = 0): the running sum is Σ_k (v_k + ρ_s θ_k) over the clients that replied, from
    their states, θ_g = that sum / (δ + ρ_s K), and the run is the default server's up to rounding."""
    hparams = {"rho": RHO, "delta": DELTA}
    default = _run(tmp_path, "default", method, **hparams)
    result = _run(tmp_path, "running", method, incremental=True, **hparams)
    server, states = result.server, result.client_states()
    rho_s = RHO if method == "admm" else 0.0
    replied = [s for s in states.values() if s.theta is not None]
    assert 0 < len(replied) <= len(states) and server.clients == len(replied)
    expected = torch.stack([s.dual.double() + rho_s * s.theta.double() for s in replied]).sum(0)
    assert torch.allclose(server.total, expected, rtol=1e-12, atol=1e-12 * float(expected.abs().max()))
    assert torch.allclose(server.theta.double(), expected / (DELTA + rho_s * len(replied)), rtol=1e-6, atol=1e-7)
    assert torch.allclose(server.theta, default.server.theta, rtol=1e-4, atol=1e-5)
    for line_d, line_r in zip(default.history, result.history, strict=True):
        assert line_d["test_nll"] == pytest.approx(line_r["test_nll"], rel=1e-4)


def test_fedlaps_running_sum_is_the_sum_of_the_sites_and_the_default_server_up_to_rounding(tmp_path):
    """FedLap: the running sum starts at θ_0 (the initial sites) and is Σ_k (N_k/δ) ṽ_k over every client, from their
    states (never-trained clients at their initial site δθ_0/N); the run and an unlearnt client's server are the
    default's up to rounding."""
    hparams = {"delta": DELTA, "rho": 0.5}
    default = _run(tmp_path, "default", "fedlap", **hparams)
    result = _run(tmp_path, "running", "fedlap", incremental=True, **hparams)
    server, states = result.server, result.client_states()
    sizes = {k: len(y) for k, (_, y) in enumerate(_problem()[0])}
    expected = torch.stack([(sizes[k] / DELTA) * s.dual.double() for k, s in states.items()]).sum(0)
    assert torch.allclose(server.total, expected, rtol=1e-10, atol=1e-10 * float(expected.abs().max()))
    assert server.clients == sum(s.theta is not None for s in states.values())
    assert torch.allclose(server.theta, default.server.theta, rtol=1e-4, atol=1e-5)
    for line_d, line_r in zip(default.history, result.history, strict=True):
        assert line_d["test_nll"] == pytest.approx(line_r["test_nll"], rel=1e-4)
    replied = next(k for k, s in states.items() if s.theta is not None)
    unlearnt = [bayesadmm.unlearn(r, replied).server.theta for r in (default, result)]
    assert torch.allclose(unlearnt[1], unlearnt[0], rtol=1e-4, atol=1e-5)
