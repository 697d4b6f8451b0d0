"""BayesADMM's server with its proximal term over the round's participants (`bayes_admm.make(proximal=
"participants")`, hyperparameter `proximal` of ivon-admm): λ_g = (b + Σ_k η_k + ρ_s Σ_{k∈P} λ_k) / (c + ρ_s |P|)
against that closed form written here in numpy over rounds of different participants, Eq. 54 (the default server)
at full participation, its unlearning, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm.algorithms import bayes_admm, get, ivon_admm
from bayesadmm.algorithms.bregman_admm import expectation_dual_step
from bayesadmm.families import DiagonalGaussian
from toy_clients import toy_clients

DIM, RHO, GAMMA, DELTA = 6, 0.5, 0.2, 2.0


def _algorithm():
    return ivon_admm.make(DIM, rho=RHO, gamma=GAMMA, delta=DELTA, lr=0.01, proximal="participants")


def _solve(algorithm, server, state, lam_k):
    """Client `state`'s update as its `finish` makes it, with `lam_k` as the local solution."""
    message = algorithm.broadcast(server)
    problem = algorithm.local.prepare(state, message, None)
    result = type("Result", (), {"natural": lam_k, "iterations": 1, "converged": True})()
    return algorithm.local.finish(state, message, None, problem, result)[:2]


def _flat(natural) -> np.ndarray:
    return np.concatenate([x.double().numpy() for x in natural])


def test_the_server_is_the_closed_form_over_the_participants_with_every_clients_dual():
    """Three rounds with different participants (new and returning clients, all float64): the server's λ_g is
    ((0, −δ/2) + Σ_k η_k + ρ_s Σ_{k∈P} λ_k) / (1 + ρ_s |P|), each η_k moved by γ (λ_k − λ_g) when k takes part;
    computed in numpy from the local solutions alone."""
    algorithm, gen = _algorithm(), torch.Generator().manual_seed(0)
    theta0 = torch.linspace(-1, 1, DIM, dtype=torch.float64)
    server = algorithm.init_server(theta0)
    states = {k: algorithm.init_client(server, k) for k in range(5)}
    lam_g = np.concatenate([DELTA * theta0.numpy(), np.full(DIM, -DELTA / 2)])
    duals = {k: np.zeros(2 * DIM) for k in range(5)}
    for participants in ([0, 1, 2], [1, 3], [0, 2, 3, 4]):
        replies = {}
        for k in participants:
            lam_k = (torch.randn(DIM, generator=gen, dtype=torch.float64),
                     -torch.rand(DIM, generator=gen, dtype=torch.float64) - 1)  # fmt: skip
            states[k], replies[k] = _solve(algorithm, server, states[k], lam_k)
            duals[k] = duals[k] + GAMMA * (_flat(lam_k) - lam_g)
            replies[k]["lam_k"] = _flat(lam_k)  # kept for the numpy side only
        proximal = sum(replies[k].pop("lam_k") for k in participants)
        prior = np.concatenate([np.zeros(DIM), np.full(DIM, -DELTA / 2)])
        lam_g = (prior + sum(duals.values()) + RHO * proximal) / (1 + RHO * len(participants))
        server, info = algorithm.server_update(server, replies)
        assert info.clients == len(participants)
        np.testing.assert_allclose(_flat(server.natural), lam_g, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(_flat(server.duals), sum(duals.values()), rtol=1e-13, atol=1e-13)
        for k in participants:  # the clients' duals are the dual step's, as with the other servers
            np.testing.assert_allclose(_flat(states[k].dual), duals[k], rtol=1e-13, atol=1e-13)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def _run(tmp_path, name, participation=1.0, **hparams):
    clients, test = toy_clients(6)
    return bayesadmm.run(
        _net(),
        clients,
        test,
        algorithm="ivon-admm",
        hparams=dict(get("ivon-admm").example) | hparams,
        rounds=4,
        participation=participation,
        eval_samples=4,
        progress=False,
        out=tmp_path / name,
    )


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    monkeypatch.setattr("bayesadmm.evaluation.diagrams.try_plot_run", lambda *args, **kwargs: None)


def test_with_every_client_in_every_round_it_is_eq_54_up_to_rounding(tmp_path):
    everyone = _run(tmp_path, "all")
    participants = _run(tmp_path, "participants", proximal="participants")
    for a, b in zip(everyone.history, participants.history, strict=True):
        assert a["test_nll"] == pytest.approx(b["test_nll"], rel=1e-4)
    for a, b in zip(everyone.server.natural, participants.server.natural, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_at_partial_participation_its_state_does_not_grow_and_the_run_completes(tmp_path):
    result = _run(tmp_path, "half", participation=0.5, proximal="participants")
    assert result.status == "completed"
    assert isinstance(result.server, bayes_admm.RoundServerState)  # λ_g and the dual sum, whatever the clients
    assert [line["server_clients"] for line in result.history] == [3, 3, 3, 3]  # the round's participants


def test_unlearning_takes_the_clients_dual_out_of_the_posterior_and_of_the_dual_sum():
    """λ_g' = λ_g − η_j and Σ η' = Σ η − η_j (c = 1 for the diagonal family), from the client's state."""
    algorithm, gen = _algorithm(), torch.Generator().manual_seed(1)
    server = algorithm.init_server(torch.zeros(DIM, dtype=torch.float64))
    states, replies = {}, {}
    for k in range(3):
        lam_k = (torch.randn(DIM, generator=gen, dtype=torch.float64), torch.full((DIM,), -3.0, dtype=torch.float64))
        states[k], replies[k] = _solve(algorithm, server, algorithm.init_client(server, k), lam_k)
    server, _ = algorithm.server_update(server, replies)
    assert algorithm.unlearn is not None
    without = algorithm.unlearn(server, 1, states[1])
    np.testing.assert_allclose(_flat(without.natural), _flat(server.natural) - _flat(states[1].dual), rtol=1e-14)
    np.testing.assert_allclose(_flat(without.duals), _flat(server.duals) - _flat(states[1].dual), rtol=1e-14)
    with pytest.raises(ValueError, match="never replied"):
        algorithm.unlearn(server, 4, algorithm.init_client(server, 4))


def test_an_unknown_proximal_and_a_dual_step_that_is_not_the_natural_one_are_refused():
    with pytest.raises(ValueError, match="proximal must be one of all, participants"):
        ivon_admm.Hparams(lr=0.01, rho=1.0, gamma=1.0, delta=1.0, proximal="some")
    with pytest.raises(ValueError, match="natural dual step"):
        bayes_admm.make(DiagonalGaussian(DIM), None, rho=1.0, delta=1.0, proximal="participants",
                        dual_step=expectation_dual_step)  # fmt: skip
