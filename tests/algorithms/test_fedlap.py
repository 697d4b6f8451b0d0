"""FedLap, FedLap-Cov and isotropic BayesADMM with Gaussian smoothing: fixed points, identities, curvature,
contracts."""

import math

import numpy as np
import pytest
import torch
from torch.nn.functional import softplus

from bayesadmm.algorithms import admm, fedlap, fedlap_cov, make, smoothing_admm
from bayesadmm.algorithms.base import PointEstimate
from bayesadmm.engine.simulate import generator_for, run_rounds
from bayesadmm.families import DiagonalGaussian, IsotropicGaussian, Posterior
from bayesadmm.problems import synthetic
from bayesadmm.problems.losses import LogisticLoss
from bayesadmm.solvers import curvature
from bayesadmm.solvers.curvature import GGN, MonteCarloFisher
from bayesadmm.solvers.newton import ProxNewton
from bayesadmm.solvers.smoothing import GaussianSmoothingAdam
from bayesadmm.solvers.von import SubproblemError

K, N_K, DELTA = 3, 20, 3.0


@pytest.fixture(autouse=True)
def _one_thread():
    """These problems are tiny: torch's thread pool only adds overhead (and noise when the machine is shared)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def clients(seed=0):
    return synthetic.logistic_clients(num_clients=K, per_client=N_K, dim=2, seed=seed)


def map_estimate(losses, delta=DELTA):
    """argmin Σ_k ℓ_k(w) + δ/2 ‖w‖² (summed losses), by Newton on the pooled data."""
    return ProxNewton().minimize(synthetic.pooled(losses), torch.zeros(losses[0].dim), delta,
                                 torch.zeros(losses[0].dim)).theta


def sizes(losses):
    return {k: loss.num_examples for k, loss in enumerate(losses)}


def subset(loss, m):
    return LogisticLoss(loss.X[:m], loss.y[:m])


# --- FedLap -------------------------------------------------------------------------------------------------------


def test_fedlap_fixed_point_is_the_map_with_weight_decay_delta():
    losses = clients()
    w_star = map_estimate(losses)
    alg = fedlap.make(delta=DELTA, lr=0.05, epochs=60, batch_size=N_K, rho=fedlap.ConstantDamping(0.5),
                      client_sizes=sizes(losses))
    server, states = run_rounds(alg, losses, torch.zeros(2), rounds=25, seed=0)
    w = alg.posterior(server).mean
    assert (w - w_star).norm() / w_star.norm() < 3e-3, (w, w_star)
    # stationarity in summed units: Σ_k ∇ℓ_k(w) + δw ≈ 0 (relative to the size of the gradients)
    residual = sum(loss.grad(w) for loss in losses) + DELTA * w
    assert residual.norm() < 1e-2 * sum(loss.grad(w).norm() for loss in losses)
    for k, state in states.items():
        assert (state.theta - w).norm() < 5e-3                                   # w_k = w_g
        torch.testing.assert_close(state.dual, -losses[k].grad(w) / N_K, atol=2e-3, rtol=0)   # ṽ_k = −∇ℓ̄_k(w*)
    # the server identity w_g = Σ_k (N_k/δ) ṽ_k
    torch.testing.assert_close(w, sum(N_K / DELTA * s.dual for s in states.values()))


@pytest.mark.parametrize("rho", [1.0, 0.5])
def test_fedlap_dual_after_each_client_step(rho):
    """Client stationarity: ṽ_k^new + (1 − ρ)(δ/N_k)(w_k − w_g) = −∇ℓ̄_k(w_k); for ρ = 1, ṽ_k = −∇ℓ̄_k(w_k)."""
    losses = clients(seed=1)
    alg = make("fedlap", delta=DELTA, lr=0.05, epochs=200, batch_size=N_K, rho=rho, client_sizes=sizes(losses))
    server = alg.init_server(torch.zeros(2))
    states = {k: alg.init_client(server, k) for k in range(K)}
    for r in range(1, 4):
        message = alg.broadcast(server)
        replies = {}
        for k in range(K):
            states[k], replies[k], _ = alg.client_update(states[k], message, losses[k], generator_for(0, r, k))
            w_k, w_g = states[k].theta, message["theta"]
            gradient = losses[k].grad(w_k) / N_K
            lhs = states[k].dual + (1 - rho) * DELTA / N_K * (w_k - w_g)
            assert (lhs + gradient).abs().max() < 2e-3 * max(1.0, float(gradient.abs().max())), (r, k)
        server, _ = alg.server_update(server, replies)


def test_fedlap_initialisation_round_one_and_partial_participation():
    """Initial sites ṽ_k = δθ_0/N make w_g⁽⁰⁾ = θ_0 = Σ(N_k/δ)ṽ_k; round 1 is then θ_0 + Σ ρ_k (w_k − θ_0), the
    N_k-weighted mean of the local models for ρ_k = N_k/N; clients that did not reply keep their initial share."""
    base = synthetic.logistic_clients(num_clients=3, per_client=30, dim=2, seed=2)
    losses = [subset(base[0], 10), subset(base[1], 20), base[2]]
    n = {0: 10, 1: 20, 2: 30}
    total = 60
    theta0 = torch.tensor([0.7, -1.2])
    for rho in ["size", 0.4]:
        alg = make("fedlap", delta=DELTA, lr=0.05, epochs=5, batch_size=10, rho=rho, client_sizes=n)
        server = alg.init_server(theta0)
        assert torch.equal(alg.broadcast(server)["theta"], theta0)
        states = {k: alg.init_client(server, k) for k in range(3)}
        torch.testing.assert_close(sum(n[k] / DELTA * states[k].dual for k in range(3)), theta0)
        message = alg.broadcast(server)
        replies = {}
        for k in range(3):
            states[k], replies[k], _ = alg.client_update(states[k], message, losses[k], generator_for(0, 1, k))
        rho_k = {k: (n[k] / total if rho == "size" else rho) for k in range(3)}
        new, _ = alg.server_update(server, replies)
        expected = theta0 + sum(rho_k[k] * (states[k].theta - theta0) for k in range(3))
        torch.testing.assert_close(new.theta, expected)
        if rho == "size":
            torch.testing.assert_close(new.theta, sum(n[k] / total * states[k].theta for k in range(3)))
        partial, _ = alg.server_update(server, {0: replies[0]})
        torch.testing.assert_close(partial.theta, theta0 + rho_k[0] * (states[0].theta - theta0))
        assert isinstance(alg.posterior(new), PointEstimate)


def test_fedlap_rejects_bad_settings_and_inconsistent_data():
    losses = clients()
    for rho in ("equal", 0.0, 1.5, math.nan, True):
        with pytest.raises(ValueError, match="rho"):
            make("fedlap", delta=1.0, lr=0.1, rho=rho, client_sizes=sizes(losses))
    with pytest.raises(ValueError, match="rho"):
        fedlap.ConstantDamping(0.0)

    class Overdamped:
        def per_client(self, sizes):
            return {k: 2.0 for k in sizes}

    with pytest.raises(ValueError, match="rho"):
        fedlap.make(delta=1.0, lr=0.1, rho=Overdamped(), client_sizes=sizes(losses))
    with pytest.raises(ValueError, match="delta"):
        fedlap.make(delta=0.0, lr=0.1, client_sizes=sizes(losses))
    with pytest.raises(ValueError, match="client_sizes"):
        fedlap.make(delta=1.0, lr=0.1, client_sizes={})
    with pytest.raises(ValueError, match="lr"):
        fedlap.make(delta=1.0, lr=0.0, client_sizes=sizes(losses))
    alg = fedlap.make(delta=1.0, lr=0.1, client_sizes={0: 7})
    server = alg.init_server(torch.zeros(2))
    with pytest.raises(KeyError):
        alg.init_client(server, 3)
    with pytest.raises(ValueError, match="examples"):
        alg.client_update(alg.init_client(server, 0), alg.broadcast(server), losses[0], torch.Generator())
    with pytest.raises(ValueError, match="Generator"):
        alg.client_update(alg.init_client(server, 0), alg.broadcast(server), subset(losses[0], 7), None)


# --- FedLap-Cov: curvature ----------------------------------------------------------------------------------------


def test_ggn_is_the_exact_hessian_diagonal_for_logistic_and_softmax_regression():
    logistic = clients()[0]
    softmax = synthetic.softmax_clients(num_clients=1, per_client=25, dim=3, num_classes=4, seed=3)[0]
    for loss, theta in [(logistic, torch.tensor([0.4, -0.9])), (softmax, torch.linspace(-1, 1, 12))]:
        exact = loss.hess_diag(theta)                   # Σ_i p_i(1 − p_i) x_ij² (per class for softmax)
        torch.testing.assert_close(GGN()(loss, theta), exact, rtol=1e-10, atol=1e-12)
        # chunking does not change the result
        torch.testing.assert_close(GGN(max_elements=1)(loss, theta), exact, rtol=1e-10,
                                   atol=1e-12)


def _mlp_data(seed=0, n=40, features=5, classes=4, hidden=(8,)):
    from bayesadmm.models import mlp
    from bayesadmm.problems.neural import ClassificationData

    g = torch.Generator().manual_seed(seed)
    model = mlp(in_features=features, hidden=hidden, num_classes=classes, activation="tanh")
    centres = 2.0 * torch.randn(classes, features, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    X = centres[y] + torch.randn(n, features, generator=g)
    return model, ClassificationData(model, X, y)


def test_ggn_of_a_network_is_the_diagonal_of_jT_lambda_j():
    """Against the GGN written out from full Jacobians: Σ_i J_iᵀ (diag p_i − p_i p_iᵀ) J_i."""
    model, data = _mlp_data()
    theta = model.initial_params(torch.Generator().manual_seed(1))
    J = torch.func.jacrev(lambda th: model.forward(th, data.X))(theta)              # (n, C, P)
    p = torch.softmax(model.forward(theta, data.X), -1)
    Lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    expected = torch.einsum("icp,icd,idp->p", J, Lam, J)
    torch.testing.assert_close(GGN()(data, theta), expected, rtol=1e-9, atol=1e-12)
    # a network is not a GLM: the GGN differs from the Hessian of the summed loss
    hess = torch.func.hessian(lambda th: data.num_examples * data.batch_loss(th, torch.arange(40)))(theta)
    assert (torch.diagonal(hess) - expected).abs().max() > 1e-3


def test_ggn_of_a_linear_model_is_its_hessian_diagonal():
    from bayesadmm.models import logistic
    from bayesadmm.problems.neural import ClassificationData

    _, base = _mlp_data(seed=4)
    model = logistic(in_features=5, num_classes=4)
    data = ClassificationData(model, base.X, base.y)
    theta = model.initial_params(torch.Generator().manual_seed(2))
    hess = torch.func.hessian(lambda th: data.num_examples * data.batch_loss(th, torch.arange(40)))(theta)
    torch.testing.assert_close(GGN()(data, theta), torch.diagonal(hess), rtol=1e-9, atol=1e-12)


def test_mc_fisher_is_an_unbiased_estimate_of_the_ggn():
    """R copies of the data = R independent label draws per example in one call."""
    R = 20000
    loss = clients()[1]
    softmax = synthetic.softmax_clients(num_clients=1, per_client=20, dim=2, num_classes=3, seed=5)[0]
    from bayesadmm.problems.losses import SoftmaxLoss
    for data, copies, theta in [
        (loss, LogisticLoss(loss.X.repeat(R, 1), loss.y.repeat(R)), torch.tensor([0.3, -0.5])),
        (softmax, SoftmaxLoss(softmax.X.repeat(R, 1), softmax.y.repeat(R), 3), torch.linspace(-1, 1, 6)),
    ]:
        exact = GGN()(data, theta)
        estimate = MonteCarloFisher()(copies, theta, torch.Generator().manual_seed(0)) / R
        torch.testing.assert_close(estimate, exact, rtol=0.03, atol=0)
    theta = torch.tensor([0.3, -0.5])
    single = [MonteCarloFisher()(loss, theta, torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert torch.equal(single[0], single[1]) and not torch.equal(single[0], single[2])
    with pytest.raises(ValueError, match="Generator"):
        MonteCarloFisher()(loss, theta)
    with pytest.raises(TypeError, match="per-example outputs"):
        GGN()(synthetic.ridge_clients(1)[0], torch.zeros(5))


# --- FedLap-Cov: the fast curvature of linear layers and elementwise activations -----------------------------------


def _flat_data(build, X, classes, seed=0):
    """ClassificationData for the network `build()` on inputs X, with float64 parameters from `seed`."""
    from bayesadmm.models.functional import FlatModel
    from bayesadmm.problems.neural import ClassificationData

    model = FlatModel(build)
    y = torch.randint(0, classes, (X.shape[0],), generator=torch.Generator().manual_seed(seed))
    theta = model.initial_params(torch.Generator().manual_seed(seed + 1)).double()
    return ClassificationData(model, X, y), theta


def _assert_fast_equals_per_example(data, theta):
    """The fast path is taken and equals the per-example vmap gradients for "ggn", and for "mc-fisher" with the same
    generator (one chunk each, so both draw all labels in one call), every coordinate to relative 1e-10: both are
    sums of squares, without cancellation, so even the tiny entries of a saturated layer are compared."""
    assert curvature.linear_chain(data) is not None
    big = 2 ** 40
    for kind in (GGN(max_elements=big), MonteCarloFisher(max_elements=big)):
        fast = kind(data, theta, torch.Generator().manual_seed(7))
        slow = curvature.per_example_diagonal_ggn(data, theta, kind, torch.Generator().manual_seed(7), big)
        assert slow.abs().max() > 0
        torch.testing.assert_close(fast, slow, rtol=1e-10, atol=0)


@pytest.mark.parametrize("activation", ["tanh", "relu", "sigmoid"])
def test_fast_ggn_of_the_zoo_mlp_equals_per_example_gradients(activation):
    from bayesadmm.models import mlp
    from bayesadmm.problems.neural import ClassificationData

    g = torch.Generator().manual_seed(0)
    model = mlp(in_features=6, hidden=(7, 5), num_classes=4, activation=activation)
    X = 2.0 * torch.randn(30, 6, generator=g, dtype=torch.float64)
    data = ClassificationData(model, X, torch.randint(0, 4, (30,), generator=g))
    theta = model.initial_params(g).double()
    _assert_fast_equals_per_example(data, theta)
    # chunking does not change the exact curvature (here 1 example per chunk)
    whole = GGN()(data, theta)
    torch.testing.assert_close(GGN(max_elements=1)(data, theta), whole, rtol=1e-12, atol=0)


@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu"])
def test_fast_ggn_of_the_papers_mlp_equals_per_example_gradients(activation):
    """784-200-100-10 on a few raw-scale (0–255) images, where the sigmoid saturates as in the experiments."""
    from bayesadmm.models import mlp
    from bayesadmm.problems.neural import ClassificationData

    g = torch.Generator().manual_seed(1)
    model = mlp(activation=activation)
    X = torch.rand(5, 1, 28, 28, generator=g, dtype=torch.float64) * 255
    data = ClassificationData(model, X, torch.randint(0, 10, (5,), generator=g))
    theta = model.initial_params(g).double()
    _assert_fast_equals_per_example(data, theta)


def test_fast_ggn_of_the_logistic_model_equals_per_example_gradients():
    from bayesadmm.models import logistic

    X = torch.randn(25, 2, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    _assert_fast_equals_per_example(*_flat_data(lambda: logistic(in_features=6, num_classes=3).build(), X, 3))


@pytest.mark.parametrize("activation", curvature.ELEMENTWISE, ids=lambda t: t.__name__)
def test_fast_ggn_with_every_elementwise_activation_and_unusual_chains(activation):
    """Every activation the fast path accepts, and chains with activations of the inputs, a linear layer without
    bias, two activations in a row, a Flatten between linear layers and an activation of the logits."""
    from torch import nn

    X = torch.randn(20, 2, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def build():
        return nn.Sequential(activation(), nn.Flatten(), nn.Linear(6, 7, bias=False), activation(), nn.Tanh(),
                             nn.Linear(7, 5), nn.Flatten(), nn.Linear(5, 4), activation())

    _assert_fast_equals_per_example(*_flat_data(build, X, 4))
    _assert_fast_equals_per_example(*_flat_data(lambda: nn.Sequential(nn.Linear(6, 5), activation(), nn.Linear(5, 3)),
                                                X.flatten(1), 3))


def test_models_that_are_not_linear_chains_take_the_per_example_path(monkeypatch):
    from torch import nn

    from bayesadmm.models.zoo import zenke_cnn
    from bayesadmm.problems.neural import ClassificationData

    class Wrapped(nn.Module):                       # the same function, but not an nn.Sequential
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))

        def forward(self, x):
            return self.net(x)

    class Square(nn.Tanh):                          # an ELEMENTWISE type's subclass may compute anything
        def forward(self, x):
            return x.square()

    def shared_layer():
        shared = nn.Linear(5, 5)
        return nn.Sequential(nn.Flatten(), nn.Linear(6, 5), shared, nn.Tanh(), shared, nn.Linear(5, 3))

    X = torch.randn(12, 2, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    others = {
        "not Sequential": _flat_data(Wrapped, X, 3),
        "not elementwise": _flat_data(lambda: nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.LayerNorm(5),
                                                            nn.Linear(5, 3)), X, 3),
        "subclassed activation": _flat_data(lambda: nn.Sequential(nn.Flatten(), nn.Linear(6, 5), Square(),
                                                                  nn.Linear(5, 3)), X, 3),
        "shared linear layer": _flat_data(shared_layer, X, 3),
        "linear layer on (n, 2, 3) inputs": _flat_data(lambda: nn.Sequential(nn.Linear(3, 4), nn.Flatten(),
                                                                             nn.Linear(8, 3)), X, 3),
        "partial Flatten": _flat_data(lambda: nn.Sequential(nn.Flatten(0, -1), nn.Linear(6 * 12, 3)), X, 3),
    }
    for why, (data, _) in others.items():
        assert curvature.linear_chain(data) is None, why
    cnn = ClassificationData(zenke_cnn(), torch.zeros(1, 3, 32, 32), torch.zeros(1, dtype=torch.long))
    assert curvature.linear_chain(cnn) is None

    # diagonal_ggn on such models never calls the fast path, and is still the exact GGN (Σ_i J_iᵀ Λ_i J_i)
    def fail(*args, **kwargs):
        raise AssertionError("the fast path was taken")

    monkeypatch.setattr(curvature, "linear_chain_diagonal_ggn", fail)
    for why in ("not Sequential", "shared linear layer", "linear layer on (n, 2, 3) inputs"):
        data, theta = others[why]
        J = torch.func.jacrev(lambda th, data=data: data.model.forward(th, data.X))(theta)          # (n, C, P)
        p = torch.softmax(data.model.forward(theta, data.X), -1)
        Lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
        expected = torch.einsum("icp,icd,idp->p", J, Lam, J)
        torch.testing.assert_close(GGN()(data, theta), expected, rtol=1e-9, atol=1e-12)


# --- FedLap-Cov: the algorithm ------------------------------------------------------------------------------------


def test_cavity_problem_represents_the_client_objective_exactly():
    g = torch.Generator().manual_seed(0)
    d, n = 4, 17
    v, w_g = torch.randn(d, generator=g), torch.randn(d, generator=g)
    V = torch.rand(d, generator=g)
    S_g = V + 0.5 + torch.rand(d, generator=g)
    a, b, c = fedlap_cov.cavity_problem(v, V, w_g, S_g, n)
    torch.testing.assert_close(b, (S_g - V) / n)
    assert bool((b > 0).all())

    def paper(w):       # (1/N_k)[vᵀw − ½ΣV w² + ½ΣS_g(w − w_g)²]
        return (v @ w - 0.5 * (V * w.square()).sum() + 0.5 * (S_g * (w - w_g).square()).sum()) / n

    def adam_form(w):   # aᵀw + ½Σ b(w − c)²
        return a @ w + 0.5 * (b * (w - c).square()).sum()

    differences = [paper(w) - adam_form(w) for w in torch.randn(5, d, generator=g) * 3]
    for diff in differences[1:]:
        torch.testing.assert_close(diff, differences[0])


def test_fedlap_cov_fixed_point_mean_is_the_map_and_precision_is_delta_plus_curvatures():
    losses = clients()
    w_star = map_estimate(losses)
    S_star = DELTA + sum(loss.hess_diag(w_star) for loss in losses)
    alg = fedlap_cov.make(delta=DELTA, lr=0.05, epochs=100, batch_size=N_K, num_clients=K)   # ρ = 1/K
    cavities = []

    def check(r, server, states):
        for k, state in states.items():        # S_g − V_k = δ + Σ_{j≠k} V_j > 0: the client's proximal weight
            cavity = server.precision - state.V
            torch.testing.assert_close(cavity, DELTA + sum(states[j].V for j in states if j != k))
            cavities.append(float(cavity.min()))

    server, states = run_rounds(alg, losses, torch.zeros(2), rounds=20, seed=0, on_round=check)
    posterior = alg.posterior(server)
    assert isinstance(posterior, Posterior) and isinstance(posterior.family, DiagonalGaussian)
    assert (posterior.mean - w_star).norm() / w_star.norm() < 2e-3, (posterior.mean, w_star)
    torch.testing.assert_close(posterior.precision, S_star, rtol=5e-3, atol=0)
    assert min(cavities) >= DELTA
    for _k, state in states.items():
        assert (state.mean - posterior.mean).norm() < 5e-3                      # w_k = w_g
        torch.testing.assert_close(state.precision, S_star, rtol=1e-2, atol=0)   # S_k = S_g
    residual = sum(loss.grad(posterior.mean) for loss in losses) + DELTA * posterior.mean
    assert residual.norm() < 2e-2 * sum(loss.grad(posterior.mean).norm() for loss in losses)


def test_fedlap_cov_round_one_from_a_random_start():
    """Eq. 21 written out for round 1 from v_k = δθ_0/K, V_k = 0, S_g = δ, w_g = θ_0, with the GGN at the new w_k."""
    losses = clients(seed=3)
    theta0 = torch.tensor([0.8, -0.6])
    rho = 1.0 / K
    alg = fedlap_cov.make(delta=DELTA, lr=0.05, epochs=3, batch_size=5, num_clients=K)
    server = alg.init_server(theta0)
    posterior = alg.posterior(server)
    torch.testing.assert_close(posterior.mean, theta0)
    torch.testing.assert_close(posterior.precision, torch.full((2,), DELTA))
    states = {k: alg.init_client(server, k) for k in range(K)}
    message = alg.broadcast(server)
    replies = {}
    for k in range(K):
        states[k], replies[k], _ = alg.client_update(states[k], message, losses[k], generator_for(0, 1, k))
        w_k = states[k].mean
        H = losses[k].hess_diag(w_k)
        torch.testing.assert_close(states[k].precision, H + DELTA)                               # S_k = H − 0 + δ
        torch.testing.assert_close(states[k].V, rho * H)
        torch.testing.assert_close(states[k].v, DELTA * theta0 / K + rho * ((H + DELTA) * w_k - DELTA * theta0))
    new, _ = alg.server_update(server, replies)
    S_g = DELTA + sum(states[k].V for k in range(K))
    torch.testing.assert_close(new.precision, S_g)
    expected = (DELTA * theta0 + rho * sum(states[k].precision * states[k].mean - DELTA * theta0
                                            for k in range(K))) / S_g
    torch.testing.assert_close(new.mean, expected)
    # partial participation: the two silent clients keep their initial sites
    partial, _ = alg.server_update(server, {0: replies[0]})
    torch.testing.assert_close(partial.mean, (2 * DELTA * theta0 / K + states[0].v) / (DELTA + states[0].V))
    assert alg.posterior(new).sample(3, torch.Generator().manual_seed(0)).shape == (3, 2)


def test_fedlap_cov_rejects_bad_settings():
    with pytest.raises(ValueError, match="rho"):
        fedlap_cov.make(delta=1.0, lr=0.1, num_clients=3, rho=1.5)
    with pytest.raises(ValueError, match="curvature"):
        make("fedlap-cov", delta=1.0, lr=0.1, num_clients=3, curvature="kfac")
    with pytest.raises(ValueError, match="delta"):
        fedlap_cov.make(delta=-1.0, lr=0.1, num_clients=3)
    alg = fedlap_cov.make(delta=1.0, lr=0.1, num_clients=2)
    server = alg.init_server(torch.zeros(2))
    with pytest.raises(KeyError):
        alg.init_client(server, 2)
    # a client whose V_k is not inside the broadcast S_g has no valid cavity
    state = alg.init_client(server, 0)._replace(V=torch.full((2,), 5.0))
    with pytest.raises(SubproblemError, match="cavity"):
        alg.client_update(state, alg.broadcast(server), clients()[0], torch.Generator())


# --- Gaussian smoothing and isotropic BayesADMM -------------------------------------------------------------------


def test_smoothing_solver_with_tiny_noise_is_the_proximal_admm_step():
    """s huge: Eq. 22 is ADMM's Eq. 5 with proximal weight ρs (summed units), which ProxNewton solves."""
    loss = clients()[0]
    s, rho = 1e8, 2.0 / 1e8
    family = IsotropicGaussian(2, s)
    m_g, eta = torch.tensor([0.5, -0.3]), (torch.tensor([1.0, -2.0]),)
    exact = ProxNewton().minimize(loss, eta[0], rho * s, m_g).theta
    result = GaussianSmoothingAdam(lr=0.05, epochs=200, batch_size=N_K).solve(
        family, loss, family.from_moments(m_g), eta, rho, torch.Generator().manual_seed(0))
    torch.testing.assert_close(result.natural[0], s * exact, rtol=1e-3, atol=0)          # λ = s·m
    assert result.iterations == 200


def test_smoothing_solver_minimises_the_gaussian_smoothed_objective():
    """s moderate: the answer is the minimiser of Σ_i E[softplus(a_i)] − y_i x_iᵀm + ηᵀm + ρs/2‖m − m_g‖² with
    a_i ~ N(x_iᵀm, ‖x_i‖²/s) (Gauss–Hermite quadrature), clearly away from the unsmoothed and wrongly scaled ones."""
    loss = clients()[0]
    s, rho = 0.5, 4.0
    m_g, eta = torch.tensor([0.5, -0.3]), (torch.tensor([1.0, -2.0]),)
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    nodes, weights = torch.tensor(nodes), torch.tensor(weights) / math.sqrt(2 * math.pi)

    def minimiser(variance):
        def objective(m):
            mu, sd = loss.X @ m, loss.X.norm(dim=1) * math.sqrt(variance)
            expected = (softplus(mu[:, None] + sd[:, None] * nodes) * weights).sum(1)
            return (expected - loss.y * mu).sum() + eta[0] @ m + 0.5 * rho * s * (m - m_g).square().sum()
        m = m_g.clone()
        for _ in range(30):
            m = m - torch.linalg.solve(torch.func.hessian(objective)(m), torch.func.grad(objective)(m))
        return m

    target = minimiser(1.0 / s)
    family = IsotropicGaussian(2, s)
    result = GaussianSmoothingAdam(lr=0.01, epochs=800, batch_size=N_K, mc_samples=4).solve(
        family, loss, family.from_moments(m_g), eta, rho, torch.Generator().manual_seed(0))
    m = family.to_moments(result.natural)[0]
    tol = 0.08
    assert (m - target).abs().max() < tol, (m, target)
    for wrong in (1e-12, 1.0 / s ** 2):               # no smoothing; noise scale 1/s instead of 1/√s
        assert (minimiser(wrong) - target).abs().max() > 2 * tol


def test_bayes_admm_iso_with_large_precision_reaches_the_admm_fixed_point():
    losses = clients()
    w_star = map_estimate(losses)
    s = 1e6
    rho = 3.0 / s                                     # ADMM's proximal weight ρs = 3
    alg = smoothing_admm.make(2, rho=rho, delta=DELTA, precision=s, lr=0.05, epochs=100, batch_size=N_K)
    assert alg.name == "bayes-admm-iso"
    server, _ = run_rounds(alg, losses, torch.zeros(2), rounds=10, seed=0)
    m = alg.posterior(server).mean
    reference, _ = run_rounds(admm.make(rho=rho * s, delta=DELTA), losses, torch.zeros(2), rounds=10)
    assert (reference.theta - w_star).norm() / w_star.norm() < 1e-3          # ADMM itself is there after 10 rounds
    assert (m - w_star).norm() / w_star.norm() < 5e-3, (m, w_star)


def test_smoothing_solver_rejects_bad_settings():
    with pytest.raises(ValueError, match="mc_samples"):
        GaussianSmoothingAdam(lr=0.1, mc_samples=0)
    family = DiagonalGaussian(2)
    with pytest.raises(TypeError, match="isotropic"):
        GaussianSmoothingAdam(lr=0.1).solve(family, clients()[0], family.from_moments(torch.zeros(2), torch.ones(2)),
                                            None, 1.0, torch.Generator())


# --- contracts: pure functions, reproducible with the same generator ----------------------------------------------


def _snapshot(x):
    if torch.is_tensor(x):
        return x.clone()
    if isinstance(x, dict):
        return {k: _snapshot(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return type(x)(*map(_snapshot, x)) if hasattr(x, "_fields") else tuple(map(_snapshot, x))
    return x


def _same(a, b):
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=False))
    return a == b


BUILDERS = {
    "fedlap": lambda losses: fedlap.make(delta=1.0, lr=0.05, epochs=2, batch_size=5, client_sizes=sizes(losses)),
    "fedlap-cov": lambda losses: fedlap_cov.make(delta=1.0, lr=0.05, epochs=2, batch_size=5, num_clients=K,
                                                 curvature=MonteCarloFisher()),
    "bayes-admm-iso": lambda losses: smoothing_admm.make(2, rho=0.5, delta=1.0, precision=4.0, lr=0.05, epochs=2,
                                                         batch_size=5, mc_samples=2),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_contract_no_mutation_and_same_generator_same_reply(name):
    losses = clients()
    alg = BUILDERS[name](losses)
    server, states = run_rounds(alg, losses, torch.tensor([0.3, -0.4]), rounds=1, seed=0)  # non-trivial duals
    message = alg.broadcast(server)
    before = (_snapshot(states), _snapshot(message), _snapshot(server))
    a = alg.client_update(states[1], message, losses[1], generator_for(7, 2, 1))
    b = alg.client_update(states[1], message, losses[1], generator_for(7, 2, 1))
    c = alg.client_update(states[1], message, losses[1], generator_for(8, 2, 1))
    assert _same(a[0], b[0]) and _same(a[1], b[1])
    assert not _same(a[1], c[1])
    replies = {1: a[1]}
    replies_before = _snapshot(replies)
    s1, _ = alg.server_update(server, replies)
    s2, _ = alg.server_update(server, replies)
    assert _same(s1, s2)
    assert _same(before, (states, message, server)) and _same(replies_before, replies)


@pytest.mark.parametrize("name", ["fedlap", "fedlap-cov", "bayes-admm-iso"])
def test_trains_a_small_network(name):
    """A tanh MLP on a 4-class Gaussian mixture split by label: three rounds beat the random initialisation."""
    from bayesadmm.problems.neural import ClassificationData

    model, pooled = _mlp_data(seed=6, n=150)
    order = torch.argsort(pooled.y)                      # label-sorted split: heterogeneous clients
    parts = [order[50 * i:50 * (i + 1)] for i in range(3)]
    data = [ClassificationData(model, pooled.X[p], pooled.y[p]) for p in parts]
    theta0 = model.initial_params(torch.Generator().manual_seed(0))
    if name == "fedlap":
        alg = fedlap.make(delta=0.1, lr=0.02, epochs=5, batch_size=10, client_sizes={k: 50 for k in range(3)})
    elif name == "fedlap-cov":
        alg = fedlap_cov.make(delta=0.1, lr=0.02, epochs=5, batch_size=10, num_clients=3)
    else:
        alg = smoothing_admm.make(model.dim, rho=0.01, delta=0.1, precision=1e3, lr=0.02, epochs=5, batch_size=10)

    def accuracy(theta):
        return float((model.forward(theta, pooled.X).argmax(-1) == pooled.y).double().mean())

    server, _ = run_rounds(alg, data, theta0, rounds=3, seed=0)
    posterior = alg.posterior(server)
    assert accuracy(posterior.mean) > max(0.8, accuracy(theta0) + 0.2)
    if name == "fedlap-cov":
        assert bool((posterior.precision > 0.1).all())
        assert torch.isfinite(posterior.sample(4, torch.Generator().manual_seed(0))).all()
