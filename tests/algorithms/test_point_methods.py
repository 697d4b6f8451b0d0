"""FedAvg, FedProx, FedDyn and federated ADMM with the Adam local solver (mean-loss units), in float64.

The convex checks use logistic regression (each client's `batch_loss` is its mean loss ℓ̄_k); the exact references
come from Newton's method on the pooled (summed) loss, independently of the algorithms' code.
"""

import functools
import math

import pytest
import torch

from bayesadmm.algorithms import admm, fedavg, feddyn, fedprox, make
from bayesadmm.algorithms.base import DivergenceError, ServerInfo, TrainingInfo
from bayesadmm.engine.simulate import generator_for, run_rounds
from bayesadmm.problems import synthetic
from bayesadmm.problems.losses import LogisticLoss
from bayesadmm.solvers.adam import LocalAdam, LocalAdamProx
from bayesadmm.solvers.newton import ProxNewton


def run(algorithm, data, theta0, rounds, seed=0):
    """[(server, {client: state})] for rounds 0..R (the states are immutable NamedTuples, so no copies are needed)."""
    history = []
    run_rounds(algorithm, data, theta0, rounds, seed, on_round=lambda r, s, c: history.append((s, dict(c))))
    return history


def run_with_replies(algorithm, data, theta0, rounds, seed=0):
    """[(server, {client: state}, {client: reply})] for rounds 1..R: the loop of `run_rounds`, keeping the replies
    (FedAvg and FedDyn clients do not keep their θ_k; it travels in the reply)."""
    server = algorithm.init_server(theta0)
    states = {k: algorithm.init_client(server, k) for k in range(len(data))}
    history = [(server, dict(states), {})]
    for r in range(1, rounds + 1):
        message, replies = algorithm.broadcast(server), {}
        for k, loss in enumerate(data):
            states[k], replies[k], _ = algorithm.client_update(states[k], message, loss, generator_for(seed, r, k))
        server, _ = algorithm.server_update(server, replies)
        history.append((server, dict(states), replies))
    return history


def mean_grad(loss, theta):
    """∇ℓ̄_k(θ), from the loss's closed-form summed gradient (not from autograd through batch_loss)."""
    return loss.grad(theta) / loss.num_examples


def sum_of_mean_losses_minimiser(losses, delta):
    """argmin Σ_k ℓ̄_k(θ) + δ/2‖θ‖² for equal-sized clients (n each) = argmin Σ_k ℓ_k + nδ/2‖θ‖² (Newton)."""
    n = losses[0].num_examples
    assert all(loss.num_examples == n for loss in losses)
    zeros = torch.zeros(losses[0].dim)
    result = ProxNewton().minimize(synthetic.pooled(losses), zeros, n * delta, zeros)
    assert result.converged
    return result.theta


def subset(loss: LogisticLoss, size: int) -> LogisticLoss:
    return LogisticLoss(loss.X[:size], loss.y[:size])


# --- FedAvg and FedProx ------------------------------------------------------------------------------------------


def test_fedprox_with_mu_zero_is_fedavg_iterate_for_iterate():
    losses = synthetic.logistic_clients(num_clients=3, per_client=20, dim=3, seed=0)
    settings = dict(lr=0.05, epochs=2, batch_size=6)  # minibatches: the shuffling must agree too
    avg = run(fedavg.make(**settings), losses, torch.zeros(3), rounds=3)
    prox = run(fedprox.make(mu=0.0, **settings), losses, torch.zeros(3), rounds=3)
    for (a_server, _), (p_server, _) in zip(avg[1:], prox[1:], strict=False):
        assert torch.equal(a_server.theta, p_server.theta)
    # a positive μ changes them (so the comparison above is not vacuous), and the iterates do move
    other = run(fedprox.make(mu=1.0, **settings), losses, torch.zeros(3), rounds=3)
    assert not torch.allclose(other[-1][0].theta, avg[-1][0].theta)
    assert (avg[-1][0].theta - avg[1][0].theta).norm() > 1e-2


def test_fedavg_with_one_client_and_one_round_is_local_adam():
    loss = synthetic.logistic_clients(num_clients=1, per_client=25, dim=3, seed=1)[0]
    theta0 = torch.tensor([0.3, -0.1, 0.2])
    (server, _, replies), = run_with_replies(fedavg.make(lr=0.03, epochs=3, batch_size=7), [loss], theta0, rounds=1,
                                             seed=4)[1:]
    direct, _ = LocalAdam(lr=0.03, epochs=3, batch_size=7).train(loss, theta0, generator_for(4, 1, 0))
    assert torch.equal(server.theta, direct) and torch.equal(replies[0]["theta"], direct)


def test_fedavg_server_means_unweighted_and_weighted():
    base = synthetic.logistic_clients(num_clients=3, per_client=30, dim=3, seed=2)
    losses = [subset(base[0], 30), subset(base[1], 10), subset(base[2], 5)]  # unequal N_k
    for weighted in (False, True):
        alg = make("fedavg", lr=0.05, epochs=1, batch_size=5, weighted=weighted)
        server = alg.init_server(torch.zeros(3))
        replies = {k: alg.client_update(alg.init_client(server, k), alg.broadcast(server), losses[k],
                                        generator_for(0, 1, k))[1] for k in range(3)}
        assert [float(replies[k]["num-examples"]) for k in range(3)] == [30.0, 10.0, 5.0]
        new, info = alg.server_update(server, replies)
        thetas = [replies[k]["theta"] for k in range(3)]
        expected = ((30 * thetas[0] + 10 * thetas[1] + 5 * thetas[2]) / 45 if weighted else sum(thetas) / 3)
        torch.testing.assert_close(new.theta, expected, rtol=1e-14, atol=1e-15)
        assert info == ServerInfo(clients=3) and new.round == 1
    # the two means differ here (the clients moved differently), so the flag matters
    assert not torch.allclose(sum(thetas) / 3, expected)


def test_fedprox_client_solves_the_squared_proximal_problem():
    """After a converged local solve, ∇ℓ̄_k(θ_k) + μ(θ_k − θ_g) = 0: the proximal term is μ/2‖θ − θ_g‖² (the
    un-squared ‖θ − θ_g‖ of the authors' code would give μ(θ_k − θ_g)/‖θ_k − θ_g‖ instead)."""
    loss = synthetic.logistic_clients(num_clients=1, per_client=40, dim=3, seed=3)[0]
    mu, theta_g = 0.3, torch.tensor([0.5, -0.5, 0.2])
    alg = fedprox.make(mu=mu, lr=0.01, epochs=400, batch_size=40)
    server = alg.init_server(theta_g)
    _, reply, info = alg.client_update(alg.init_client(server, 0), alg.broadcast(server), loss, generator_for(0, 1, 0))
    theta_k = reply["theta"]
    assert info == TrainingInfo(iterations=400)
    assert (mean_grad(loss, theta_k) + mu * (theta_k - theta_g)).norm() < 1e-5
    assert (theta_k - theta_g).norm() > 0.1          # the solution is not at the centre


# --- FedDyn --------------------------------------------------------------------------------------------------------


def test_feddyn_dual_and_server_bookkeeping():
    """g_k = −α Σ_r (θ_k^r − θ_g^{r−1}) and h = −(α/K) Σ_r Σ_k (θ_k^r − θ_g^{r−1}) = (1/K) Σ_k g_k, every round."""
    losses = synthetic.logistic_clients(num_clients=3, per_client=20, dim=3, seed=4)
    alpha, K = 0.7, 3
    history = run_with_replies(feddyn.make(alpha=alpha, num_clients=K, lr=0.05, epochs=2, batch_size=8,
                                           weight_decay=0.01), losses, torch.zeros(3), rounds=4)
    drift = {k: torch.zeros(3) for k in range(K)}
    for (previous, _, _), (server, clients, replies) in zip(history[:-1], history[1:], strict=False):
        for k in range(K):
            drift[k] = drift[k] + replies[k]["theta"] - previous.theta
            torch.testing.assert_close(clients[k].grad, -alpha * drift[k], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(server.h, -(alpha / K) * sum(drift.values()), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(server.h, sum(c.grad for c in clients.values()) / K, rtol=1e-12, atol=1e-14)
        mean_theta = sum(r["theta"] for r in replies.values()) / K
        torch.testing.assert_close(server.theta, mean_theta - server.h / alpha, rtol=1e-12, atol=1e-14)
    assert server.h.norm() > 1e-3                     # h really moved


def test_feddyn_dual_is_the_regularised_local_gradient_after_a_converged_solve():
    """Client stationarity: after an (almost) exact local solve, g_k = ∇ℓ̄_k(θ_k) + wd θ_k."""
    losses = synthetic.logistic_clients(num_clients=2, per_client=20, dim=3, seed=5)
    wd = 0.05
    history = run_with_replies(feddyn.make(alpha=0.5, num_clients=2, lr=0.01, epochs=300, batch_size=20,
                                           weight_decay=wd), losses, torch.zeros(3), rounds=2)
    for _, clients, replies in history[1:]:
        for k, state in clients.items():   # full-batch Adam from θ_g converges linearly here: ~1e-7 after 300 steps
            theta_k = replies[k]["theta"]
            assert (state.grad - (mean_grad(losses[k], theta_k) + wd * theta_k)).norm() < 1e-5
            assert state.grad.norm() > 0.05


@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_feddyn_fixed_point_minimises_the_sum_of_mean_losses(wd):
    """FedDyn's fixed point solves Σ_k ∇ℓ̄_k(θ) + K·wd·θ = 0 (module docstring). Tolerance 1e-2 on the gradient and
    on the distance to Newton's solution (≈2e-3 is reached: 50 Adam steps per round leave the local solves slightly
    inexact), from 1.5 at the start; FedAvg with the same budget stays ≈0.6 away (client drift)."""
    K = 3
    losses = synthetic.logistic_clients(num_clients=K, per_client=20, dim=3, seed=3)
    star = sum_of_mean_losses_minimiser(losses, K * wd)
    alg = feddyn.make(alpha=0.5, num_clients=K, lr=0.01, epochs=50, batch_size=20, weight_decay=wd)
    server, clients = run_rounds(alg, losses, torch.zeros(3), rounds=25)
    stationarity = sum(mean_grad(loss, server.theta) for loss in losses) + K * wd * server.theta
    assert stationarity.norm() < 1e-2
    assert (server.theta - star).norm() < 1e-2
    assert server.h.norm() < 1e-2                    # h → 0 at the fixed point
    # the control: FedAvg with the same local budget does not get there, so the tolerance above is meaningful
    avg, _ = run_rounds(fedavg.make(lr=0.01, epochs=50, batch_size=20), losses, torch.zeros(3), rounds=5)
    assert (avg.theta - star).norm() > 0.3


def test_feddyn_without_weight_decay_is_fedadmm_under_full_participation():
    """With wd = 0 and all clients every round, g_k = −v_k and h = −(1/K) Σ v_k, so θ_g = Mean(θ_k + v_k/α):
    FedDyn and FedADMM (δ = 0, ρ = α) give the same iterates, computed by two independent implementations."""
    losses = synthetic.logistic_clients(num_clients=3, per_client=20, dim=3, seed=6)
    settings = dict(lr=0.05, epochs=2, batch_size=6)
    dyn = run(feddyn.make(alpha=0.4, num_clients=3, **settings), losses, torch.zeros(3), rounds=4)
    fedadmm = run(admm.make_nn(rho=0.4, **settings), losses, torch.zeros(3), rounds=4)
    for (d_server, d_clients), (a_server, a_clients) in zip(dyn[1:], fedadmm[1:], strict=False):
        torch.testing.assert_close(d_server.theta, a_server.theta, rtol=1e-12, atol=1e-13)
        for k in d_clients:
            torch.testing.assert_close(d_clients[k].grad, -a_clients[k].dual, rtol=1e-12, atol=1e-13)


def test_feddyn_partial_participation_follows_acar():
    """An absent client's g_k does not change; h is divided by the TOTAL number of clients K; θ_g averages only the
    participants; h = (1/K) Σ_k g_k still holds."""
    losses = synthetic.logistic_clients(num_clients=3, per_client=20, dim=3, seed=7)
    alpha, K = 0.5, 3
    alg = feddyn.make(alpha=alpha, num_clients=K, lr=0.05, epochs=2, batch_size=10)
    server = alg.init_server(torch.zeros(3))
    states = {k: alg.init_client(server, k) for k in range(K)}
    for r, participants in enumerate([(0, 1, 2), (1,), (0, 2)], start=1):
        message, replies = alg.broadcast(server), {}
        before = dict(states)
        for k in participants:
            states[k], replies[k], _ = alg.client_update(states[k], message, losses[k], generator_for(0, r, k))
        new, info = alg.server_update(server, replies)
        drift = sum(replies[k]["theta"] - server.theta for k in participants)
        torch.testing.assert_close(new.h, server.h - (alpha / K) * drift, rtol=1e-12, atol=1e-14)
        mean_theta = sum(replies[k]["theta"] for k in participants) / len(participants)
        torch.testing.assert_close(new.theta, mean_theta - new.h / alpha, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(new.h, sum(s.grad for s in states.values()) / K, rtol=1e-12, atol=1e-14)
        for k in set(range(K)) - set(participants):
            assert states[k] is before[k]
        assert info.clients == len(participants) and new.clients == tuple(sorted(set(new.clients)))
        server = new
    assert server.clients == (0, 1, 2)
    with pytest.raises(ValueError, match="num_clients"):
        alg.server_update(server, {3: replies[0]})   # a fourth distinct client


# --- Federated ADMM with the Adam local solver ---------------------------------------------------------------------


def test_local_adam_prox_solves_eq5_in_mean_loss_units():
    loss = synthetic.logistic_clients(num_clients=1, per_client=30, dim=3, seed=8)[0]
    v, rho, center = torch.tensor([0.2, -0.1, 0.05]), 0.5, torch.tensor([0.1, 0.2, -0.3])
    result = LocalAdamProx(lr=0.01, epochs=400, batch_size=30).minimize(loss, v, rho, center,
                                                                     generator=torch.Generator().manual_seed(0))
    n = loss.num_examples
    exact = ProxNewton().minimize(loss, n * v, n * rho, center).theta   # the same problem in summed-loss units
    assert result.iterations == 400 and result.converged
    torch.testing.assert_close(result.theta, exact, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="Generator"):
        LocalAdamProx().minimize(loss, v, rho, center)


@pytest.mark.parametrize("delta", [0.0, 0.1])
def test_nn_admm_dual_is_the_negative_mean_gradient_after_each_client_step(delta):
    """Eq. 8 in mean-loss units: after a converged client step v_k = −∇ℓ̄_k(θ_k) (the residual is exactly the
    gradient of the client objective at Adam's output, so the tolerance is the local solver's accuracy)."""
    losses = synthetic.logistic_clients(num_clients=2, per_client=20, dim=3, seed=9)
    history = run(admm.make_nn(rho=0.5, delta=delta, lr=0.01, epochs=300, batch_size=20), losses, torch.zeros(3), 2)
    for _, clients in history[1:]:
        for k, state in clients.items():   # ~1e-7 after 300 full-batch steps
            assert (state.dual + mean_grad(losses[k], state.theta)).norm() < 1e-5
            assert state.dual.norm() > 0.05


@pytest.mark.parametrize("delta", [0.0, 0.1])
def test_nn_admm_fixed_point_solves_the_regularised_sum_of_mean_losses(delta):
    """At the fixed point θ_g solves Σ_k ∇ℓ̄_k(θ) + δθ = 0 and v_k = −∇ℓ̄_k(θ*); tolerance 1e-2 (≈2e-3 is reached,
    from 1.5 at the start), as for FedDyn."""
    losses = synthetic.logistic_clients(num_clients=3, per_client=20, dim=3, seed=3)
    star = sum_of_mean_losses_minimiser(losses, delta)
    server, clients = run_rounds(admm.make_nn(rho=0.5, delta=delta, lr=0.01, epochs=50, batch_size=20), losses,
                                 torch.zeros(3), rounds=25)
    assert (sum(mean_grad(loss, server.theta) for loss in losses) + delta * server.theta).norm() < 1e-2
    assert (server.theta - star).norm() < 1e-2
    for k, state in clients.items():               # and the duals are at −∇ℓ̄_k(θ*)
        assert (state.dual + mean_grad(losses[k], star)).norm() < 1e-2


def test_fedadmm_server_is_mean_of_theta_plus_scaled_dual():
    """δ = 0, ρ_s = ρ: admm.py's server (Σv + ρΣθ)/(δ + ρK) is the FedADMM server Mean_k(θ_k + v_k/ρ)."""
    g = torch.Generator().manual_seed(0)
    replies = {k: {"theta": torch.randn(4, generator=g), "dual": torch.randn(4, generator=g)} for k in range(3)}
    rho = 0.3
    alg = admm.make_nn(rho=rho)
    new, _ = alg.server_update(alg.init_server(torch.zeros(4)), replies)
    expected = sum(r["theta"] + r["dual"] / rho for r in replies.values()) / 3
    torch.testing.assert_close(new.theta, expected, rtol=1e-14, atol=1e-15)
    # with absent clients the server uses their stored last replies (ADMM needs every client's dual)
    later = {1: {"theta": torch.randn(4, generator=g), "dual": torch.randn(4, generator=g)}}
    newer, info = alg.server_update(new, later)
    merged = {**replies, **later}
    torch.testing.assert_close(newer.theta, sum(r["theta"] + r["dual"] / rho for r in merged.values()) / 3,
                               rtol=1e-14, atol=1e-15)
    assert info.clients == 3


def test_admm_delta_zero_needs_a_server_proximal_term():
    admm.make(rho=1.0, delta=0.0)                                     # FedADMM-style, fine
    with pytest.raises(ValueError, match="delta"):
        admm.make(rho=1.0, delta=0.0, server_rho=0.0)
    with pytest.raises(ValueError, match="delta"):
        admm.make(rho=1.0, delta=-1.0)


# --- Neural networks: all four methods train a tiny MLP -----------------------------------------------------------


def tiny_mlp_clients(num_clients=2, per_client=40):
    from bayesadmm.models import mlp
    from bayesadmm.problems.neural import ClassificationData

    g = torch.Generator().manual_seed(0)
    model = mlp(in_features=4, hidden=(8,), num_classes=3)
    W = 2.0 * torch.randn(3, 4, generator=g)
    data = []
    for _k in range(num_clients):
        X = torch.randn(per_client, 4, generator=g) + torch.randn(4, generator=g)
        data.append(ClassificationData(model, X, (X @ W.T).argmax(dim=1)))
    return model, data


SETTINGS = dict(lr=0.05, epochs=2, batch_size=8)
FACTORIES = {
    "fedavg": lambda: fedavg.make(**SETTINGS),
    "fedavg-weighted": lambda: fedavg.make(average=fedavg.WeightedMean(), **SETTINGS),
    "fedprox": lambda: fedprox.make(mu=0.1, **SETTINGS),
    "feddyn": lambda: feddyn.make(alpha=0.1, num_clients=2, weight_decay=1e-3, **SETTINGS),
    "fedadmm": lambda: admm.make_nn(rho=0.1, **SETTINGS),
}


@pytest.mark.parametrize("method", sorted(FACTORIES))
def test_trains_a_tiny_mlp(method):
    model, data = tiny_mlp_clients()
    theta0 = model.initial_params(torch.Generator().manual_seed(1))

    def total_loss(theta):
        return sum(float(d.batch_loss(theta, torch.arange(d.num_examples))) for d in data)

    alg = FACTORIES[method]()
    server, _ = run_rounds(alg, data, theta0, rounds=3)
    assert alg.posterior(server).mean.shape == theta0.shape
    assert total_loss(alg.posterior(server).mean) < 0.7 * total_loss(theta0)


# --- Contract ------------------------------------------------------------------------------------------------------


def clone_tree(x):
    if torch.is_tensor(x):
        return x.clone()
    if isinstance(x, dict):
        return {k: clone_tree(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(clone_tree(v) for v in x))
    return x


def same_tree(a, b):
    if torch.is_tensor(a):
        return torch.is_tensor(b) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_tree(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same_tree(x, y) for x, y in zip(a, b, strict=False))
    return a == b


@pytest.mark.parametrize("method", sorted(FACTORIES))
def test_client_update_is_pure_and_reproducible(method):
    """No input is mutated; the same generator gives the same reply (also after other calls: no optimizer state
    survives a call); another generator gives another reply (minibatches are shuffled by it); a generator is required;
    each client id gets its own state."""
    model, data = tiny_mlp_clients()
    alg = FACTORIES[method]()
    server = alg.init_server(model.initial_params(torch.Generator().manual_seed(1)))
    states = {k: alg.init_client(server, k) for k in range(2)}
    # one round first, so that the client state is not the trivial initial one
    message = alg.broadcast(server)
    replies = {}
    for k in range(2):
        states[k], replies[k], _ = alg.client_update(states[k], message, data[k], generator_for(0, 1, k))
    server, _ = alg.server_update(server, replies)
    message, state = alg.broadcast(server), states[0]
    snapshot = clone_tree((server, state, message))
    s1, r1, _ = alg.client_update(state, message, data[0], generator_for(0, 2, 0))
    s3, r3, _ = alg.client_update(state, message, data[0], generator_for(0, 2, 1))
    s2, r2, _ = alg.client_update(state, message, data[0], generator_for(0, 2, 0))
    assert same_tree(snapshot, (server, state, message))
    assert same_tree(r1, r2) and same_tree(s1, s2)
    assert not torch.equal(r1["theta"], r3["theta"])
    with pytest.raises(ValueError, match="Generator"):
        alg.client_update(state, message, data[0], None)
    fresh = {k: alg.init_client(server, k) for k in range(2)}
    for a, b in zip(fresh[0], fresh[1], strict=False):
        if torch.is_tensor(a):
            assert a.data_ptr() != b.data_ptr()       # not one shared tensor


@pytest.mark.parametrize("method", sorted(FACTORIES))
def test_server_update_is_pure_and_ignores_reply_order(method):
    model, data = tiny_mlp_clients(num_clients=2)
    alg = FACTORIES[method]()
    server = alg.init_server(model.initial_params(torch.Generator().manual_seed(1)))
    message = alg.broadcast(server)
    replies = {k: alg.client_update(alg.init_client(server, k), message, data[k], generator_for(0, 1, k))[1]
               for k in (1, 0)}
    snapshot = clone_tree((server, replies))
    forward, _ = alg.server_update(server, replies)
    backward, _ = alg.server_update(server, dict(reversed(list(replies.items()))))
    assert torch.equal(forward.theta, backward.theta)
    assert same_tree(snapshot, (server, replies))
    recorded = forward.clients if hasattr(forward, "clients") else tuple(forward.replies)  # ids, or kept replies
    assert tuple(recorded) == (0, 1)


@pytest.mark.parametrize("method", ["fedavg", "fedavg-weighted", "fedprox"])
def test_averaging_methods_average_only_the_participants(method):
    """The documented choice for FedAvg/FedProx: absent clients' stale models are not averaged (the server still
    records every client's last reply)."""
    alg = FACTORIES[method]()
    g = torch.Generator().manual_seed(0)
    def reply(n):
        return {"theta": torch.randn(5, generator=g), "num-examples": torch.tensor(float(n))}
    server, _ = alg.server_update(alg.init_server(torch.zeros(5)), {0: reply(10), 1: reply(30), 2: reply(20)})
    partial = {0: reply(10), 2: reply(20)}
    new, info = alg.server_update(server, partial)
    if method == "fedavg-weighted":
        expected = (10 * partial[0]["theta"] + 20 * partial[2]["theta"]) / 30
    else:
        expected = (partial[0]["theta"] + partial[2]["theta"]) / 2
    torch.testing.assert_close(new.theta, expected, rtol=1e-14, atol=1e-15)
    assert info.clients == 2 and new.clients == (0, 1, 2)
    with pytest.raises(ValueError, match="at least one"):
        alg.server_update(new, {})


@pytest.mark.parametrize("method", ["fedavg", "feddyn", "fedadmm"])
def test_non_finite_server_state_is_a_divergence(method):
    alg = FACTORIES[method]()
    bad = {0: {"theta": torch.tensor([math.nan, 0.0]), "dual": torch.zeros(2), "num-examples": torch.tensor(1.0)}}
    with pytest.raises(DivergenceError):
        alg.server_update(alg.init_server(torch.zeros(2)), bad)


@pytest.mark.parametrize("factory, kwargs, key", [
    (fedavg.make, dict(lr=0.0), "lr"),
    (fedavg.make, dict(lr=math.nan), "lr"),
    (fedavg.make, dict(epochs=0), "epochs"),
    (fedavg.make, dict(epochs=1.5), "epochs"),
    (fedavg.make, dict(batch_size=0), "batch_size"),
    (functools.partial(make, "fedavg"), dict(weighted="yes"), "weighted"),
    (functools.partial(make, "fedprox"), dict(mu=0.1, weighted=1), "weighted"),
    (fedprox.make, dict(mu=-0.1), "mu"),
    (fedprox.make, dict(mu=math.inf), "mu"),
    (fedprox.make, dict(mu=0.1, lr=-1.0), "lr"),
    (feddyn.make, dict(alpha=0.0, num_clients=2), "alpha"),
    (feddyn.make, dict(alpha=0.1, num_clients=0), "num_clients"),
    (feddyn.make, dict(alpha=0.1, num_clients=2.0), "num_clients"),
    (feddyn.make, dict(alpha=0.1, num_clients=2, weight_decay=-1e-3), "weight_decay"),
    (feddyn.make, dict(alpha=0.1, num_clients=2, batch_size=True), "batch_size"),
    (admm.make_nn, dict(rho=0.0), "rho"),
    (admm.make_nn, dict(rho=1.0, delta=-1.0), "delta"),
    (admm.make_nn, dict(rho=1.0, epochs=0), "epochs"),
    (admm.make_nn, dict(rho=1.0, server_rho=0.0), "server_rho"),
])
def test_bad_hyperparameters_are_rejected(factory, kwargs, key):
    with pytest.raises(ValueError, match=key):
        factory(**kwargs)


def test_factories_take_keywords_only_and_name_themselves():
    assert fedavg.make().name == "fedavg" and fedprox.make(mu=0.1).name == "fedprox"
    assert feddyn.make(alpha=0.1, num_clients=2).name == "feddyn" and admm.make_nn(rho=1.0).name == "fedadmm"
    assert fedavg.make(name="fedavg-w", average=fedavg.WeightedMean()).name == "fedavg-w"
    for factory, args in ((fedavg.make, (1e-3,)), (fedprox.make, (0.1,)), (feddyn.make, (0.1, 2)),
                          (admm.make_nn, (1.0,))):
        with pytest.raises(TypeError):
            factory(*args)
