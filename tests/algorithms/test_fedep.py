"""FedEP / FedSEP / FedPA identities (Guo et al. 2023): exactness for Gaussian likelihoods, round 1 = FedPA, the
damped natural-parameter updates written out, FedSEP's cavity, and the Algorithm contract."""

import numpy as np
import pytest
import torch

from bayesadmm.algorithms import fedep, fedpa, fedsep
from bayesadmm.algorithms.base import DivergenceError, NoInfo, ServerInfo, unpack
from bayesadmm.engine.simulate import run_rounds
from bayesadmm.families import DiagonalGaussian, FullGaussian, IsotropicGaussian
from bayesadmm.families import natural as nat
from bayesadmm.solvers.ep_inference import ExactGaussian, GaussianLikelihood
from bayesadmm.solvers.natural_optimizers import Adam, Momentum


def _clients(K=3, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(K):
        A = torch.randn(d, d, generator=g)
        cov = A @ A.T + 0.5 * torch.eye(d)
        out.append(GaussianLikelihood(torch.randn(d, generator=g) * 2, cov))
    return out


def _exact(clients, prior_precision=None):
    d = clients[0].dim
    P = sum(c.natural[1] for c in clients) + (0 if prior_precision is None else prior_precision * torch.eye(d))
    h = sum(c.natural[0] for c in clients)
    return torch.linalg.solve(P, h), P, h


def _regression(sizes, d=3, noise=0.5, seed=20):
    """Conjugate Bayesian linear regression, y = Xθ + ε with ε ~ N(0, σ²): client k's likelihood in θ is the Gaussian
    N(θ; (XᵀX)⁻¹Xᵀy, σ²(XᵀX)⁻¹), and the data for the closed form (numpy, float64)."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=d)
    data, clients = [], []
    for n in sizes:
        X = rng.normal(size=(n, d))
        y = X @ theta + noise * rng.normal(size=n)
        gram = X.T @ X
        data.append((X, y))
        clients.append(GaussianLikelihood(torch.from_numpy(np.linalg.solve(gram, X.T @ y)),
                                          torch.from_numpy(noise**2 * np.linalg.inv(gram))))
    return data, clients


def _regression_posterior(data, noise, prior_precision):
    """Mean and precision of the exact posterior under the prior N(0, δ⁻¹ I) (δ = 0: flat prior)."""
    d = data[0][0].shape[1]
    precision = prior_precision * np.eye(d) + sum(X.T @ X for X, _ in data) / noise**2
    return np.linalg.solve(precision, sum(X.T @ y for X, y in data) / noise**2), precision


def _run(alg, clients, rounds, d=3):
    trace = []
    server, states = run_rounds(alg, clients, torch.zeros(d), rounds,
                                on_round=lambda r, s, c: trace.append((s, dict(c))))
    return server, states, trace


@pytest.mark.parametrize("prior", [None, 2.0])
def test_one_undamped_round_with_full_family_is_exact(prior):
    clients = _clients()
    family = FullGaussian(3)
    alg = fedep.make(family, ExactGaussian(), damping=1.0, prior_precision=prior)
    server, _, _ = _run(alg, clients, 1)
    mean, P, h = _exact(clients, prior)
    post = alg.posterior(server)
    assert torch.allclose(post.mean, mean, atol=1e-12)
    assert torch.allclose(post.precision, P, atol=1e-12)
    assert torch.allclose(server.natural[0], h, atol=1e-12)
    # the fixed point: a second round changes nothing
    server2, _, _ = _run(alg, clients, 3)
    assert nat.allclose(server2.natural, server.natural, atol=1e-10)


@pytest.mark.parametrize("prior", [None, 3.0])
@pytest.mark.parametrize("sizes", [[10, 10, 10], [4, 9, 25]])
@pytest.mark.parametrize("method", ["fedep", "fedsep", "fedpa"])
def test_the_fixed_point_is_the_exact_regression_posterior(method, sizes, prior):
    """With exact tilted inference in the full family, FedEP, FedSEP (q_g ∝ p q̄^K) and FedPA all end at the exact
    posterior p(θ) Π_k p_k(θ), prior included, whatever the client sizes."""
    noise = 0.5
    data, clients = _regression(sizes, noise=noise)
    family = FullGaussian(3)
    if method == "fedpa":
        alg = fedpa.make(family, ExactGaussian(), prior_precision=prior)
    else:
        alg = {"fedep": fedep.make, "fedsep": fedsep.make}[method](
            family, ExactGaussian(), client_sizes=sizes, prior_precision=prior)
    server, _, _ = _run(alg, clients, 100)
    post = alg.posterior(server)
    mean, precision = _regression_posterior(data, noise, 0.0 if prior is None else prior)
    np.testing.assert_allclose(post.precision.numpy(), precision, rtol=0, atol=1e-10)
    np.testing.assert_allclose(post.mean.numpy(), mean, rtol=0, atol=1e-10)


def test_damped_full_family_converges_to_the_exact_posterior():
    clients = _clients(K=4)
    alg = fedep.make(FullGaussian(3), ExactGaussian(), num_clients=4, prior_precision=1.0)
    assert alg.name == "fedep"
    server, _, _ = _run(alg, clients, 200)
    assert torch.allclose(alg.posterior(server).mean, _exact(clients, 1.0)[0], atol=1e-8)


def test_round_one_from_uniform_start_equals_fedpa():
    clients = _clients(K=2, d=2, seed=3)
    family = DiagonalGaussian(2)
    ep = fedep.make(family, ExactGaussian(), damping=1.0)
    pa = fedpa.make(family, ExactGaussian())
    s_ep, _, _ = _run(ep, clients, 1, d=2)
    s_pa, _, _ = _run(pa, clients, 1, d=2)
    assert nat.allclose(s_ep.natural, s_pa.natural, rtol=0, atol=1e-13)
    # FedPA = product of the diagonal projections (mean and diag Σ of each p_k)
    lam = nat.total([(c.mean / torch.diagonal(c.covariance), -0.5 / torch.diagonal(c.covariance)) for c in clients])
    assert nat.allclose(s_pa.natural, lam, atol=1e-13)
    # and round 2 differs (EP uses the cavity; FedPA is one-shot)
    s_ep2, _, _ = _run(ep, clients, 2, d=2)
    s_pa2, _, _ = _run(pa, clients, 2, d=2)
    assert nat.allclose(s_pa2.natural, s_pa.natural, atol=1e-13)
    assert not nat.allclose(s_ep2.natural, s_pa2.natural, atol=1e-6)


def test_round_one_from_uniform_start_equals_fedpa_with_the_full_family():
    """With the full family both are the exact product of the Gaussian likelihoods after round 1."""
    clients = _clients(K=3, d=3, seed=12)
    family = FullGaussian(3)
    s_ep, _, _ = _run(fedep.make(family, ExactGaussian(), damping=1.0), clients, 1)
    s_pa, _, _ = _run(fedpa.make(family, ExactGaussian()), clients, 1)
    assert nat.allclose(s_ep.natural, s_pa.natural, rtol=0, atol=1e-12)
    _, P, h = _exact(clients)
    assert nat.allclose(s_pa.natural, (h, -0.5 * P), atol=1e-12)


def test_diagonal_parallel_ep_reaches_the_exact_global_mean():
    clients = _clients(K=2, d=2, seed=1)
    alg = fedep.make(DiagonalGaussian(2), ExactGaussian(), damping=1.0)
    server, _, _ = _run(alg, clients, 60, d=2)
    assert (alg.posterior(server).mean - _exact(clients)[0]).norm() < 1e-10


def _diag_eta_lam(lam):
    """Family tuple (η, −½s) -> the paper's (η, Λ) with Λ as a vector."""
    return lam[0], -2.0 * lam[1]


def test_damped_client_and_server_updates_written_out():
    clients = _clients(K=3, d=2, seed=5)
    delta = 0.3
    alg = fedep.make(DiagonalGaussian(2), ExactGaussian(), damping=delta)
    _, _, trace = _run(alg, clients, 3, d=2)

    # the formulas of Alg. 3/4 in (η, Λ), with the tilted moments computed from scratch
    eta_g, Lam_g = torch.zeros(2), torch.zeros(2)
    sites = [(torch.zeros(2), torch.zeros(2)) for _ in clients]
    for r in range(1, 4):
        deltas = []
        for k, c in enumerate(clients):
            eta_cav, Lam_cav = eta_g - sites[k][0], Lam_g - sites[k][1]          # step 2
            cov = torch.linalg.inv(torch.linalg.inv(c.covariance) + torch.diag(Lam_cav))
            mean = cov @ (torch.linalg.solve(c.covariance, c.mean) + eta_cav)
            Lam_t = 1.0 / torch.diagonal(cov)                                  # step 3: keep mean and diag Σ
            eta_t = Lam_t * mean
            d_eta, d_Lam = eta_t - eta_g, Lam_t - Lam_g                        # step 4
            sites[k] = (sites[k][0] + delta * d_eta, sites[k][1] + delta * d_Lam)   # step 5
            deltas.append((d_eta, d_Lam))
        eta_g = eta_g + delta * sum(d[0] for d in deltas)                      # Alg. 3
        Lam_g = Lam_g + delta * sum(d[1] for d in deltas)
        server, states = trace[r]
        assert torch.allclose(_diag_eta_lam(server.natural)[0], eta_g, atol=1e-12)
        assert torch.allclose(_diag_eta_lam(server.natural)[1], Lam_g, atol=1e-12)
        for k in range(len(clients)):
            got = _diag_eta_lam(states[k].site)
            assert torch.allclose(got[0], sites[k][0], atol=1e-12) and torch.allclose(got[1], sites[k][1], atol=1e-12)
        # identity optimizers keep λ_g = Σ_k λ_k (uniform prior)
        assert nat.allclose(server.natural, nat.total([states[k].site for k in states]), atol=1e-12)


def test_optimizer_hooks_scale_the_step():
    clients = _clients(K=2, d=2, seed=2)
    family = DiagonalGaussian(2)
    adam = Adam(lr=0.05)
    alg = fedep.make(family, ExactGaussian(), damping=0.5, prior_precision=1.0,
                     client_optimizer=adam, server_optimizer=Momentum(lr=0.5, beta=0.9))
    server = alg.init_server(torch.zeros(2))
    msg = alg.broadcast(server)
    state = alg.init_client(server, 0)
    new, reply, _ = alg.client_update(state, msg, clients[0], None)
    d = unpack("delta", reply)
    # Adam's first step is lr · Δ / (|Δ| + ε)
    expected = tuple(0.5 * 0.05 * x / (x.abs() + adam.eps) for x in d)
    assert nat.allclose(new.site, expected, atol=1e-12)
    assert int(new.optimizer.count) == 1
    server1, _ = alg.server_update(server, {0: reply})
    # momentum's first step is lr · Δ
    assert nat.allclose(server1.natural, nat.add(server.natural, nat.scale(d, 0.5 * 0.5)), atol=1e-12)
    server2, _ = alg.server_update(server1, {0: reply})
    assert nat.allclose(server2.natural, nat.add(server1.natural, nat.scale(d, 0.5 * 0.5 * 1.9)), atol=1e-12)


class _Spy:
    def __init__(self):
        self.cavities = []

    def __call__(self, family, data, cavity, generator, start=None):
        self.cavities.append(cavity)
        return ExactGaussian()(family, data, cavity, generator)


def test_fedsep_cavity_and_statelessness():
    clients = _clients(K=2, d=2, seed=4)
    family = DiagonalGaussian(2)
    spy = _Spy()
    alg = fedsep.make(family, spy, client_sizes=[1, 3], prior_precision=2.0)
    assert alg.name == "fedsep"
    server = alg.init_server(torch.zeros(2))
    server = server._replace(natural=family.from_moments(torch.tensor([1.0, -2.0]), torch.tensor([3.0, 5.0])))
    msg = alg.broadcast(server)
    eta_g, Lam_g, Lam_0 = torch.tensor([3.0, -10.0]), torch.tensor([3.0, 5.0]), 2.0
    for k, frac in ((0, 0.25), (1, 0.75)):
        state = alg.init_client(server, k)
        new, reply, _ = alg.client_update(state, msg, clients[k], None)
        assert new == state                                                    # no step 5
        # λ_{−k} = λ_g − (n_k/N)(λ_g − λ_0): the share n_k/N of the likelihood part leaves, the prior stays
        expected = ((1 - frac) * eta_g, -0.5 * (Lam_g - frac * (Lam_g - Lam_0)))
        assert nat.allclose(spy.cavities[-1], expected, atol=1e-14)
        tilted = ExactGaussian()(family, clients[k], spy.cavities[-1], None)
        assert nat.allclose(unpack("delta", reply), nat.sub(tilted, server.natural), atol=1e-14)
    # default exponent 1/K
    alg2 = fedsep.make(family, spy, num_clients=4)
    assert alg2.init_client(alg2.init_server(torch.zeros(2)), 3).fraction == 0.25


def test_fedsep_runs_to_a_valid_posterior():
    clients = _clients(K=3, d=2, seed=6)
    alg = fedsep.make(DiagonalGaussian(2), ExactGaussian(), num_clients=3, prior_precision=1.0)
    server, _, _ = _run(alg, clients, 30, d=2)
    post = alg.posterior(server)
    assert torch.isfinite(post.mean).all()


def test_contract_no_mutation_and_reply_order():
    clients = _clients(K=3, d=3, seed=7)
    alg = fedep.make(FullGaussian(3), ExactGaussian(), num_clients=3, prior_precision=1.0,
                     server_optimizer=Adam(lr=0.1), client_optimizer=Adam(lr=0.1))
    server = alg.init_server(torch.zeros(3))
    states = {k: alg.init_client(server, k) for k in range(3)}
    for _ in range(2):
        msg = alg.broadcast(server)
        msg_copy = {k: v.clone() for k, v in msg.items()}
        replies = {}
        for k in range(3):
            before = tuple(x.clone() for x in states[k].site)
            new, replies[k], _ = alg.client_update(states[k], msg, clients[k], None)
            assert all(torch.equal(x, y) for x, y in zip(states[k].site, before))
            states[k] = new
        assert all(torch.equal(msg[k], msg_copy[k]) for k in msg)
        server_nat = tuple(x.clone() for x in server.natural)
        replies_copy = {k: {n: t.clone() for n, t in r.items()} for k, r in replies.items()}
        a, _ = alg.server_update(server, replies)
        b, _ = alg.server_update(server, dict(reversed(list(replies.items()))))
        assert all(torch.equal(x, y) for x, y in zip(a.natural, b.natural))
        assert all(torch.equal(x, y) for x, y in zip(server.natural, server_nat))
        assert all(torch.equal(replies[k][n], replies_copy[k][n]) for k in replies for n in replies[k])
        server = a


def test_updates_return_typed_info_records():
    clients = _clients(K=3, d=2, seed=13)
    family = DiagonalGaussian(2)
    for alg, clients_counted in ((fedep.make(family, ExactGaussian(), num_clients=3, prior_precision=1.0), 2),
                                 (fedsep.make(family, ExactGaussian(), num_clients=3, prior_precision=1.0), 2),
                                 (fedpa.make(family, ExactGaussian(), prior_precision=1.0), 3)):
        server = alg.init_server(torch.zeros(2))
        message = alg.broadcast(server)
        replies = {}
        for k in range(3):
            _, replies[k], info = alg.client_update(alg.init_client(server, k), message, clients[k], None)
            assert info == NoInfo() and info._asdict() == {}
        server, info = alg.server_update(server, replies)
        assert info._asdict() == {"clients": 3}
        # a round with two of the three clients: FedEP/FedSEP count the replies, FedPA the remembered approximations
        _, info = alg.server_update(server, {k: replies[k] for k in (0, 2)})
        assert info._asdict() == {"clients": clients_counted}
    assert fedep.make(family, ExactGaussian(), damping=1.0).server_update(server, {})[1] == ServerInfo(0)


def test_client_update_does_not_mutate_its_state():
    clients = _clients(K=2, d=2, seed=8)
    alg = fedep.make(DiagonalGaussian(2), ExactGaussian(), num_clients=2, init_site_precision=0.5,
                     client_sizes=[2, 6])
    server = alg.init_server(torch.tensor([1.0, -1.0]))
    state = alg.init_client(server, 1)
    before = tuple(x.clone() for x in state.site)
    assert nat.allclose(state.site, (0.5 * 6 * torch.tensor([1.0, -1.0]), -0.5 * 3.0 * torch.ones(2)))
    assert torch.allclose(alg.posterior(server).mean, torch.tensor([1.0, -1.0]))
    alg.client_update(state, alg.broadcast(server), clients[1], None)
    assert all(torch.equal(x, y) for x, y in zip(state.site, before))


def test_rejects_bad_configuration_and_reports_improper_posterior():
    with pytest.raises(TypeError):
        fedep.make(IsotropicGaussian(2), ExactGaussian(), damping=1.0)
    with pytest.raises(ValueError):
        fedep.make(DiagonalGaussian(2), ExactGaussian())               # no damping, no num_clients
    with pytest.raises(ValueError):
        fedep.make(DiagonalGaussian(2), ExactGaussian(), damping=1.5)
    alg = fedep.make(DiagonalGaussian(2), ExactGaussian(), damping=1.0)
    with pytest.raises(DivergenceError):
        alg.posterior(alg.init_server(torch.zeros(2)))                       # improper uniform start


def test_scaled_identity_inference_keeps_the_tilted_mean():
    (c,) = _clients(K=1, d=2, seed=9)
    family = DiagonalGaussian(2)
    cavity = family.from_moments(torch.tensor([0.5, 0.2]), torch.tensor([0.7, 1.3]))
    full = ExactGaussian()(family, c, cavity)
    iso = ExactGaussian(scaled_identity=1.0)(family, c, cavity)
    assert torch.allclose(family.to_moments(full)[0], family.to_moments(iso)[0], atol=1e-12)
    assert torch.allclose(family.to_moments(iso)[1], torch.tensor([1.7, 2.3]), atol=1e-12)


def test_clip_norm_limits_the_delta():
    clients = _clients(K=1, d=2, seed=10)
    alg = fedep.make(DiagonalGaussian(2), ExactGaussian(), damping=1.0, prior_precision=1.0, clip_norm=0.1)
    server = alg.init_server(torch.zeros(2))
    _, reply, _ = alg.client_update(alg.init_client(server, 0), alg.broadcast(server), clients[0], None)
    assert abs(float(nat.norm(unpack("delta", reply))) - 0.1) < 1e-12


def _logistic_clients(K=2, n=40, d=3, seed=11):
    from torch import nn

    from bayesadmm.models import FlatModel
    from bayesadmm.problems.neural import ClassificationData

    model = FlatModel(lambda: nn.Linear(d, 2))
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(K):
        X = torch.randn(n, d, generator=g)
        y = (X[:, 0] + 0.5 * torch.randn(n, generator=g) > 0).long()
        out.append(ClassificationData(model, X, y))
    return model, out


def test_neural_tilted_inference_scaled_identity_and_laplace():
    from bayesadmm.solvers.adam import LocalAdam
    from bayesadmm.solvers.ep_inference import Laplace, ScaledIdentity, diagonal_fisher, tilted_mean

    model, clients = _logistic_clients()
    family = DiagonalGaussian(model.dim)
    solver = LocalAdam(lr=0.05, epochs=30, batch_size=40)
    cavity = family.from_moments(torch.full((model.dim,), 0.1), torch.full((model.dim,), 2.0))
    g = torch.Generator().manual_seed(0)
    # the mean minimises ℓ̄ + (½θᵀΛθ − ηᵀθ)/n: its full-batch gradient vanishes
    theta = tilted_mean(LocalAdam(lr=0.05, epochs=400, batch_size=40), clients[0], cavity, g).requires_grad_(True)
    n = clients[0].num_examples
    obj = clients[0].batch_loss(theta, torch.arange(n)) + (0.5 * (2.0 * theta.square()).sum()
                                                          - (cavity[0] * theta).sum()) / n
    (grad,) = torch.autograd.grad(obj, theta)
    assert grad.norm() < 1e-3
    # the Fisher equals the per-example loop
    th = theta.detach()
    fisher = diagonal_fisher(clients[0], th, torch.Generator().manual_seed(1), samples=2)
    g1 = torch.Generator().manual_seed(1)
    probs = torch.softmax(model.forward(th, clients[0].X), -1)
    manual = torch.zeros_like(th)
    for _ in range(2):
        ys = torch.multinomial(probs, 1, generator=g1).squeeze(-1)
        for i in range(n):
            t = th.clone().requires_grad_(True)
            lp = torch.log_softmax(model.forward(t, clients[0].X[i:i + 1])[0], -1)[ys[i]]
            manual += torch.autograd.grad(lp, t)[0].square()
    assert torch.allclose(fisher, manual / 2, atol=1e-10)
    # I: precision Λ_{−k} + α n ; L: larger than the cavity's
    iso = ScaledIdentity(alpha=0.01, solver=solver)(family, clients[0], cavity, g)
    assert torch.allclose(family.to_moments(iso)[1], torch.full((model.dim,), 2.0 + 0.01 * n))
    lap = Laplace(solver=solver)(family, clients[0], cavity, g)
    assert bool((family.to_moments(lap)[1] > 2.0).all())
    # a few FedEP rounds with either method give a valid global posterior
    for inference in (ScaledIdentity(alpha=0.01, solver=solver), Laplace(solver=solver)):
        alg = fedep.make(family, inference, num_clients=2, prior_precision=1.0)
        server, _, _ = _run(alg, clients, 3, d=model.dim)
        assert torch.isfinite(alg.posterior(server).mean).all()
