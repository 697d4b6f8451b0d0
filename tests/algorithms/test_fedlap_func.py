"""FedLap-Func (Eq. 17): memory selection and weights, the soft-label loss, the stationary-point property, the
reduction to FedLap without memory, the numerical server, and the algorithm contract."""

import pytest
import torch
from torch.nn import functional as F

from bayesadmm.algorithms import fedlap, fedlap_func, make
from bayesadmm.algorithms.base import PointEstimate
from bayesadmm.algorithms.fedlap_func import (
    ClientState,
    Memory,
    WithMemory,
    client_function_terms,
    minimize_server,
    predict,
    select_memory,
    soft_label_loss,
)
from bayesadmm.engine.simulate import generator_for, run_rounds
from bayesadmm.likelihoods import Classification
from bayesadmm.models import logistic, mlp
from bayesadmm.problems.neural import ClassificationData
from bayesadmm.solvers.adam import LocalAdam


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The problems are tiny: a second intra-op thread only adds synchronisation (3x slower on a busy 2-core box)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


MEANS = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])
# heterogeneous: client 1 has no class 2, client 2 no class 0
CLASS_COUNTS = [(8, 6, 5), (10, 4, 0), (0, 7, 9)]


def make_clients(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    clients = []
    for counts in CLASS_COUNTS:
        y = torch.cat([torch.full((n,), c, dtype=torch.long) for c, n in enumerate(counts)])
        X = MEANS[y] + torch.randn(len(y), 4, generator=g)
        clients.append(ClassificationData(model, X, y))
    return clients


SOFTMAX = Classification()


def sizes():
    return {k: sum(c) for k, c in enumerate(CLASS_COUNTS)}


def algorithm(model, **kw):
    """FedLap-Func by its method name's keywords (rho "size" or a number)."""
    settings = dict(delta=0.1, tau_f=0.5, lr=0.01, epochs=2, batch_size=8, client_sizes=sizes(), server_iterations=50,
                    server_lr=1e-2)
    settings.update(kw)
    return make("fedlap-func", model=model, dim=model.dim, **settings)


def theta0(model, seed=0):
    return model.initial_params(torch.Generator().manual_seed(seed))


def clone(tree):
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, dict):
        return {k: clone(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return type(tree)(*(clone(v) for v in tree)) if hasattr(tree, "_fields") else tuple(clone(v) for v in tree)
    return tree


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=False))
    return a == b


# --- memory ------------------------------------------------------------------------------------------------------


def test_memory_is_one_random_point_per_held_class_and_deterministic_per_generator():
    y = torch.tensor([2, 0, 2, 0, 0, 2, 0, 0])          # client holds classes 0 (5 points) and 2 (3 points)
    idx, tau = select_memory(y, 1, 0.1, torch.Generator().manual_seed(3))
    assert y[idx].tolist() == [0, 2]
    torch.testing.assert_close(tau, torch.tensor([0.1 * 5, 0.1 * 3]))
    again, _ = select_memory(y, 1, 0.1, torch.Generator().manual_seed(3))
    assert torch.equal(idx, again)
    picks = {tuple(select_memory(y, 1, 0.1, torch.Generator().manual_seed(s))[0].tolist()) for s in range(20)}
    assert len(picks) > 3                                 # random, not always the first member of each class


def test_tau_weights_represent_each_class_count():
    y = torch.tensor([0] * 5 + [1] * 3 + [3] * 1)         # class 2 absent, class 3 has a single point
    idx, tau = select_memory(y, 2, 0.25, torch.Generator().manual_seed(0))
    assert y[idx].tolist() == [0, 0, 1, 1, 3]
    assert len(set(idx.tolist())) == 5                    # without replacement
    torch.testing.assert_close(tau, 0.25 * torch.tensor([5 / 2, 5 / 2, 3 / 2, 3 / 2, 1.0]))
    torch.testing.assert_close(tau.sum(), torch.tensor(0.25 * len(y)))   # Σ τ_i = τ_f N_k
    with pytest.raises(ValueError, match="points_per_class"):
        select_memory(y, 0, 0.25, torch.Generator())


def test_client_keeps_its_memory_and_sends_soft_labels_of_its_latest_model():
    model = mlp(in_features=4, hidden=(8,), num_classes=3)
    clients = make_clients(model)
    alg = algorithm(model)
    server = alg.init_server(theta0(model))
    state = alg.init_client(server, 2)
    state, reply, info = alg.client_update(state, alg.broadcast(server), clients[2], generator_for(0, 1, 2))
    assert info.memory_terms == 0                      # round 1: no memory anywhere yet
    data = clients[2]
    x = reply["memory.x"]
    rows = [int(torch.nonzero((data.X == row).all(1)).flatten()[0]) for row in x]
    assert data.y[rows].tolist() == [1, 2]                # one per class it holds (it has no class 0)
    torch.testing.assert_close(reply["memory.tau"], 0.5 * torch.tensor([7.0, 9.0]))
    torch.testing.assert_close(reply["memory.soft"], F.softmax(model.forward(state.theta, x), -1))
    assert set(reply) == {"dual", "memory.x", "memory.soft", "memory.tau"}
    # the memory is fixed after the first update; the soft labels follow the newest w_k
    server, _ = alg.server_update(server, {2: reply})
    state2, reply2, info2 = alg.client_update(state, alg.broadcast(server), data, generator_for(0, 2, 2))
    assert torch.equal(reply2["memory.x"], x) and torch.equal(state2.memory_tau, state.memory_tau)
    torch.testing.assert_close(reply2["memory.soft"], predict(model, SOFTMAX, state2.theta, x))
    assert info2.memory_terms == 4                     # 2 global (at ŷ_g) + 2 own (at the previous ŷ_i)


def test_server_weights_and_zero_points_per_class():
    model = logistic(in_features=4, num_classes=3)
    alg = algorithm(model, points_per_class=0)
    server = alg.init_server(theta0(model))
    _, reply, _ = alg.client_update(alg.init_client(server, 0), alg.broadcast(server), make_clients(model)[0],
                                    generator_for(0, 1, 0))
    assert set(reply) == {"dual"}


# --- the soft-label loss ------------------------------------------------------------------------------------------


def test_soft_label_loss_gradient_matches_finite_differences_and_the_closed_form():
    g = torch.Generator().manual_seed(0)
    net = mlp(in_features=4, hidden=(8,), num_classes=3)
    memory = Memory(torch.randn(5, 4, generator=g), F.softmax(torch.randn(5, 3, generator=g), -1),
                    torch.tensor([1.0, -2.0, 0.5, 3.0, -0.3]))
    theta = theta0(net).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: soft_label_loss(net, SOFTMAX, t, memory), (theta,))

    # logistic regression: ∇_W = Σ_i w_i (p_i − ŷ_i) x_iᵀ, ∇_b = Σ_i w_i (p_i − ŷ_i)
    lin = logistic(in_features=4, num_classes=3)
    theta = theta0(lin, seed=1).requires_grad_()
    grad, = torch.autograd.grad(soft_label_loss(lin, SOFTMAX, theta, memory), theta)
    residual = memory.weight[:, None] * (predict(lin, SOFTMAX, theta, memory.x) - memory.soft)
    torch.testing.assert_close(grad, torch.cat([(residual.T @ memory.x).flatten(), residual.sum(0)]))
    # and the value is the soft-label cross-entropy
    log_p = F.log_softmax(lin.forward(theta, memory.x), -1)
    expected = -(memory.weight * (memory.soft * log_p).sum(1)).sum()
    torch.testing.assert_close(soft_label_loss(lin, SOFTMAX, theta, memory), expected)


def test_wrapped_data_adds_the_memory_terms_to_every_minibatch():
    model = mlp(in_features=4, hidden=(8,), num_classes=3)
    data = make_clients(model)[0]
    memory = Memory(data.X[:2], torch.full((2, 3), 1 / 3), torch.tensor([0.3, -0.1]))
    wrapped, theta, idx = WithMemory(data, model, SOFTMAX, memory), theta0(model), torch.tensor([0, 4, 7])
    assert wrapped.num_examples == data.num_examples
    torch.testing.assert_close(wrapped.batch_loss(theta, idx),
                               data.batch_loss(theta, idx) + soft_label_loss(model, SOFTMAX, theta, memory))


# --- stationary point -------------------------------------------------------------------------------------------


def test_function_space_terms_have_zero_gradient_at_a_stationary_point():
    """w_k = w_g = w, ŷ_i and ŷ_{i,g} both the predictions of w: client and server memory terms have ∇ = 0."""
    model = mlp(in_features=4, hidden=(8,), num_classes=3)
    clients = make_clients(model)
    w = theta0(model, seed=4)
    alg = algorithm(model, server_iterations=500)
    n_k = clients[0].num_examples
    memories = [(d.X[[0, -1]], torch.tensor([2.0, 3.0])) for d in clients]
    x_all = torch.cat([x for x, _ in memories])
    tau_all = torch.cat([t for _, t in memories])
    message = {"theta": w, "memory.x": x_all, "memory.soft": predict(model, SOFTMAX, w, x_all), "memory.tau": tau_all}
    own_x, own_tau = memories[0]
    state = ClientState(0, torch.zeros_like(w), own_x, own_tau, predict(model, SOFTMAX, w, own_x), w)
    terms = client_function_terms(state, message, n_k)
    assert len(terms.weight) == len(tau_all) + len(own_tau)
    torch.testing.assert_close(terms.weight, torch.cat([tau_all, -own_tau]) / n_k)

    def gradient(theta, data):
        theta = theta.clone().requires_grad_()
        return torch.autograd.grad(data.batch_loss(theta, torch.arange(n_k)), theta)[0]

    wrapped = WithMemory(clients[0], model, SOFTMAX, terms)
    torch.testing.assert_close(gradient(w, wrapped), gradient(w, clients[0]), atol=1e-12, rtol=0)
    # ... and they are not inert elsewhere
    moved = w + 0.3 * torch.randn(w.shape, generator=torch.Generator().manual_seed(0))
    assert (gradient(moved, wrapped) - gradient(moved, clients[0])).norm() > 1e-3

    # server: with Σ_k v_k = w and the clients' ŷ_i = predictions of w, the server problem is stationary at w. Started
    # there, Adam first jitters by about lr (it normalises rounding-level gradients), then returns.
    n, delta = sizes(), 0.1
    duals = [delta * share * w / n[k] for k, share in enumerate((0.2, 0.3, 0.5))]    # ṽ_k, with Σ_k v_k = w
    replies = {k: {"dual": duals[k], "memory.x": x, "memory.soft": predict(model, SOFTMAX, w, x), "memory.tau": t}
               for k, (x, t) in enumerate(memories)}
    server, info = alg.server_update(alg.init_server(w), replies)
    assert info.memory == 6 and info.grad_norm < 1e-6
    torch.testing.assert_close(server.theta, w, atol=1e-7, rtol=0)


# --- reduction to FedLap ------------------------------------------------------------------------------------------


def fedlap_reference(clients, theta_start, rounds, delta, lr, epochs, batch_size, seed=0):
    """FedLap written out in the paper's units (Eqs. 7–9, client problem divided by N_k): w_k from LocalAdam with
    linear term δv_k/N_k, v_k += ρ_k (w_k − w_g), w_g = Σ v_k, sites starting at v_k = (N_k/N) θ_0."""
    solver = LocalAdam(lr=lr, epochs=epochs, batch_size=batch_size)
    total = sum(d.num_examples for d in clients)
    duals = [(d.num_examples / total) * theta_start for d in clients]
    w_g, history = theta_start, []
    for r in range(1, rounds + 1):
        for k, data in enumerate(clients):
            n = data.num_examples
            w_k, _ = solver.train(data, w_g, generator_for(seed, r, k), linear=(delta / n) * duals[k],
                                  prox_weight=delta / n, prox_center=w_g)
            duals[k] = duals[k] + (n / total) * (w_k - w_g)
        w_g = sum(duals)
        history.append(w_g)
    return history


def run_history(alg, clients, theta_start, rounds, seed=0):
    history = []
    run_rounds(alg, clients, theta_start, rounds, seed, on_round=lambda r, s, c: history.append(s.theta) if r else None)
    return history


@pytest.mark.parametrize("settings", [dict(points_per_class=0, tau_f=1.0), dict(points_per_class=1, tau_f=0.0)],
                         ids=["no-memory", "tau-zero"])
def test_without_function_space_terms_it_is_fedlap(settings):
    model = mlp(in_features=4, hidden=(8,), num_classes=3)
    clients, start = make_clients(model), theta0(model)
    hyper = dict(delta=0.1, lr=0.01, epochs=2, batch_size=8)
    got = run_history(fedlap_func.make(model=model, client_sizes=sizes(), **hyper, **settings), clients, start, 3)
    expected = fedlap_reference(clients, start, 3, **hyper)
    assert len(got) == 3
    for a, b in zip(got, expected, strict=False):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    # and with the memory active the iterates differ
    active = run_history(fedlap_func.make(model=model, client_sizes=sizes(), tau_f=0.5, server_iterations=50,
                                          **hyper), clients, start, 3)
    assert (active[-1] - expected[-1]).norm() > 1e-4


def test_without_memory_it_matches_fedlap_module():
    model = mlp(in_features=4, hidden=(8,), num_classes=3)
    clients, start = make_clients(model), theta0(model)
    hyper = dict(delta=0.1, lr=0.01, epochs=2, batch_size=8, client_sizes=sizes())
    expected = run_history(fedlap.make(**hyper), clients, start, 3)
    assert len(expected) == 3
    for settings in (dict(points_per_class=0), dict(points_per_class=1, tau_f=0.0)):
        got = run_history(fedlap_func.make(model=model, **hyper, **settings), clients, start, 3)
        for a, b in zip(got, expected, strict=False):
            assert torch.equal(a, b)                       # the same operations in the same order


def test_numerical_server_reaches_fedlaps_closed_form_without_memory():
    delta = 0.05                     # Adam is invariant to the objective's scale: δ only matters through its ε
    model = mlp(in_features=4, hidden=(8,), num_classes=3)
    g = torch.Generator().manual_seed(1)
    start = theta0(model)
    dual_sum = start + 0.5 * torch.randn(model.dim, generator=g)
    w, gradient = minimize_server(model, SOFTMAX, start, dual_sum, delta, None, iterations=5000, lr=1e-3)
    # the paper's FMNIST setting (5000 Adam steps at 1e-3) from an offset of 0.5·N(0, I): within 1e-3 of Σ v_k
    torch.testing.assert_close(w, dual_sum, atol=1e-3, rtol=0)
    assert (w - dual_sum).norm() < 1e-3 * (start - dual_sum).norm()
    torch.testing.assert_close(gradient, delta * (w - dual_sum))


def test_numerical_server_with_memory_decreases_its_gradient():
    model = logistic(in_features=4, num_classes=3)
    g = torch.Generator().manual_seed(2)
    memory = Memory(torch.randn(6, 4, generator=g), F.softmax(torch.randn(6, 3, generator=g), -1),
                    torch.full((6,), 2.0))
    start, dual_sum = theta0(model), torch.randn(model.dim, generator=g)
    _, g0 = minimize_server(model, SOFTMAX, start, dual_sum, 0.5, memory, iterations=0, lr=1e-2)
    _, g1 = minimize_server(model, SOFTMAX, start, dual_sum, 0.5, memory, iterations=800, lr=1e-2)
    assert g1.norm() < 1e-2 * g0.norm()


# --- contract -----------------------------------------------------------------------------------------------------


def test_contract_pure_reproducible_and_order_free():
    model = mlp(in_features=4, hidden=(8,), num_classes=3)
    clients = make_clients(model)
    alg = algorithm(model)
    server = alg.init_server(theta0(model))
    states = {k: alg.init_client(server, k) for k in range(3)}
    for r in (1, 2):                                       # round 2 has memory terms on both sides
        message = alg.broadcast(server)
        replies = {}
        for k, data in enumerate(clients):
            before_state, before_message = clone(states[k]), clone(message)
            new, reply, info = alg.client_update(states[k], message, data, generator_for(0, r, k))
            again = alg.client_update(states[k], message, data, generator_for(0, r, k))
            assert same(again[0], new) and same(again[1], reply)
            assert same(states[k], before_state) and same(message, before_message)
            assert reply["dual"].shape == (model.dim,) and torch.isfinite(reply["dual"]).all()
            held = sum(c > 0 for c in CLASS_COUNTS[k])
            assert reply["memory.x"].shape == (held, 4) and reply["memory.soft"].shape == (held, 3)
            torch.testing.assert_close(reply["memory.soft"].sum(1), torch.ones(held))
            states[k], replies[k] = new, reply
        before = clone(server)
        forward, _ = alg.server_update(server, replies)
        backward, _ = alg.server_update(server, dict(reversed(list(replies.items()))))
        assert same(server, before)
        assert torch.equal(forward.theta, backward.theta) and torch.isfinite(forward.theta).all()
        server = forward
    message = alg.broadcast(server)
    assert message["memory.x"].shape == (7, 4) and message["memory.tau"].shape == (7,)
    torch.testing.assert_close(message["memory.soft"], predict(model, SOFTMAX, server.theta, message["memory.x"]))
    # partial participation: an absent client's last reply (dual and memory) still counts
    partial, info = alg.server_update(server, {0: replies[0]})
    assert info.clients == 3 and info.memory == 7
    assert isinstance(alg.posterior(server), PointEstimate) and torch.equal(alg.posterior(server).mean, server.theta)


def test_learns_the_toy_problem():
    model = logistic(in_features=4, num_classes=3)
    clients = make_clients(model)
    alg = algorithm(model, delta=0.1, tau_f=0.1, lr=0.05, epochs=5, server_iterations=100)
    server, _ = run_rounds(alg, clients, theta0(model), rounds=3)
    X, y = torch.cat([d.X for d in clients]), torch.cat([d.y for d in clients])
    accuracy = (model.forward(server.theta, X).argmax(1) == y).double().mean()
    assert accuracy > 0.8                                  # centralised MAP: 0.86 on these 49 points


def test_dual_step_and_rho():
    model = logistic(in_features=4, num_classes=3)
    clients, start = make_clients(model), theta0(model)
    total = sum(sizes().values())
    for rho, expected_rho in (("size", clients[1].num_examples / total), (0.25, 0.25)):
        alg = algorithm(model, rho=rho, tau_f=0.0)           # closed-form server
        server = alg.init_server(start)
        state = alg.init_client(server, 1)
        torch.testing.assert_close(state.dual, 0.1 * start / total)        # ṽ_k⁽⁰⁾ = δθ_0/N
        new, reply, _ = alg.client_update(state, alg.broadcast(server), clients[1], generator_for(0, 1, 1))
        n = clients[1].num_examples
        torch.testing.assert_close(reply["dual"], state.dual + expected_rho * (0.1 / n) * (new.theta - start))
        # the server: Σ_k v_k with the clients that have not replied at their initial sites
        server, _ = alg.server_update(server, {1: reply})
        others = sum(sizes()[k] for k in (0, 2)) / total
        torch.testing.assert_close(server.theta, (n / 0.1) * reply["dual"] + others * start)


def test_rejects_bad_settings():
    model = logistic(in_features=4, num_classes=3)
    kw = dict(model=model, delta=1.0, lr=1e-2, client_sizes={0: 3, 1: 4})
    for change, message in ((dict(client_sizes=None), "client_sizes"), (dict(client_sizes={0: 0}), "client_sizes"),
                            (dict(delta=0.0), "delta"), (dict(tau_f=-1.0), "tau_f"), (dict(rho=1.5), "rho"),
                            (dict(rho="half"), "rho"), (dict(points_per_class=-1), "points_per_class"),
                            (dict(server_lr=0.0), "server_lr"), (dict(epochs=0), "epochs")):
        with pytest.raises(ValueError, match=message):
            make("fedlap-func", **{**kw, **change})
    alg = fedlap_func.make(**kw)
    server = alg.init_server(torch.zeros(model.dim))
    with pytest.raises(KeyError, match="client_sizes"):
        alg.init_client(server, 2)
    with pytest.raises(ValueError, match="examples"):
        alg.client_update(alg.init_client(server, 0), alg.broadcast(server), make_clients(model)[0],
                          torch.Generator().manual_seed(0))
    with pytest.raises(KeyError, match="client_sizes"):
        alg.server_update(server, {5: {"dual": torch.zeros(model.dim)}})


# --- other likelihoods: regression and counts (issue #38) ----------------------------------------------------------

SIGMA = 0.5


def _linear_gaussian(n=12, seed=0):
    """A linear model f(x) = wᵀx + b (float64) and memory inputs, targets, weights for its function-space terms."""
    from torch import nn

    from bayesadmm.models import FlatModel

    g = torch.Generator().manual_seed(seed)
    model = FlatModel(lambda: nn.Linear(3, 1))
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    soft = torch.randn(n, 1, generator=g, dtype=torch.float64)            # ŷ_i: predictions of some other w
    weight = torch.rand(n, generator=g, dtype=torch.float64) * 4 - 1      # τ_i, some negative (a client's own terms)
    return model, Memory(x, soft, weight)


def _features(x):
    import numpy as np
    return np.concatenate([x.numpy(), np.ones((x.shape[0], 1))], axis=1)


def test_gaussian_function_space_terms_are_the_quadratic_of_the_output_hessian():
    """With the Gaussian likelihood ℓ(ŷ, w) = (x̃ᵀw − ŷ)²/2σ² + const: the gradient of Σ_i τ_i ℓ(ŷ_i, w) is
    Σ_i τ_i x̃_i (x̃_iᵀw − ŷ_i)/σ² and its Hessian Σ_i τ_i x̃_i x̃_iᵀ/σ², the output Hessian 1/σ² carried to the
    parameters (numpy, exact). The softmax's soft-label loss on one output is 0 whatever w."""
    import numpy as np

    from bayesadmm.likelihoods import GaussianRegression

    model, memory = _linear_gaussian()
    likelihood = GaussianRegression(SIGMA)
    theta = model.initial_params(torch.Generator().manual_seed(1)).double()
    features, tau, soft = _features(memory.x), memory.weight.numpy(), memory.soft.numpy()[:, 0]
    leaf = theta.clone().requires_grad_()
    (gradient,) = torch.autograd.grad(soft_label_loss(model, likelihood, leaf, memory), leaf)
    residual = features @ theta.numpy() - soft
    np.testing.assert_allclose(gradient.numpy(), features.T @ (tau * residual) / SIGMA**2, rtol=1e-12, atol=1e-13)
    hessian = torch.autograd.functional.hessian(lambda t: soft_label_loss(model, likelihood, t, memory), theta)
    np.testing.assert_allclose(hessian.numpy(), (features.T * tau) @ features / SIGMA**2, rtol=1e-12, atol=1e-13)
    # the predictions are the outputs themselves, and the terms vanish in gradient at their own predictions
    at_own = memory._replace(soft=predict(model, likelihood, theta, memory.x))
    torch.testing.assert_close(at_own.soft, model.forward(theta, memory.x))
    leaf = theta.clone().requires_grad_()
    (zero,) = torch.autograd.grad(soft_label_loss(model, likelihood, leaf, at_own), leaf)
    assert zero.abs().max() < 1e-13
    # what was used before, the softmax of one output: a constant loss (0), no information whatever w
    leaf = theta.clone().requires_grad_()
    softmax_value = soft_label_loss(model, SOFTMAX, leaf, Memory(memory.x, torch.ones(12, 1), memory.weight))
    assert softmax_value.abs() < 1e-12 and torch.autograd.grad(softmax_value, leaf)[0].abs().max() < 1e-12


def test_server_with_gaussian_memory_reaches_its_closed_form_minimiser():
    """The server problem Σ_i τ_i (x̃_iᵀw − ŷ_i)²/2σ² − δ(Σ_k v_k)ᵀw + ½δ‖w‖² (τ_i > 0, as the server's are) is a
    quadratic with minimiser (δI + Σ_i τ_i x̃_i x̃_iᵀ/σ²)⁻¹ (δ Σ_k v_k + Σ_i τ_i x̃_i ŷ_i/σ²), written out in numpy;
    the server's Adam reaches it."""
    import numpy as np

    from bayesadmm.likelihoods import GaussianRegression

    model, memory = _linear_gaussian(seed=2)
    memory = memory._replace(weight=memory.weight.abs() + 0.5)
    delta = 0.5
    g = torch.Generator().manual_seed(3)
    dual_sum = torch.randn(model.dim, generator=g, dtype=torch.float64)
    start = torch.zeros(model.dim, dtype=torch.float64)
    features, tau, soft = _features(memory.x), memory.weight.numpy(), memory.soft.numpy()[:, 0]
    A = delta * np.eye(4) + (features.T * tau) @ features / SIGMA**2
    expected = np.linalg.solve(A, delta * dual_sum.numpy() + features.T @ (tau * soft) / SIGMA**2)
    w, gradient = minimize_server(model, GaussianRegression(SIGMA), start, dual_sum, delta, memory, iterations=3000,
                                  lr=1e-2)
    assert np.abs(w.numpy() - expected).max() < 1e-6
    np.testing.assert_allclose(gradient.numpy(), A @ w.numpy() - (A @ expected), atol=1e-10)


def _regression_clients(model, likelihood, counts=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    clients = []
    for k, n in enumerate(sizes().values()):
        X = torch.randn(n, 4, generator=g) + k
        f = X @ torch.tensor([0.4, -0.3, 0.2, 0.1]) + 0.5
        y = torch.poisson(f.exp(), generator=g) if counts else f + SIGMA * torch.randn(n, generator=g)
        clients.append(ClassificationData(model, X, y, likelihood))
    return clients


@pytest.mark.parametrize("counts", [False, True], ids=["gaussian", "poisson"])
def test_regression_memory_is_random_points_of_one_stratum_and_soft_targets_are_the_mean(counts):
    """Without classes, `points_per_class` random inputs of all the client's, τ_i = τ_f N_k / M_k; the soft targets
    sent are E[y | f] (f for a Gaussian, exp f for a Poisson), the shape of the model's outputs."""
    from bayesadmm.likelihoods import GaussianRegression, Poisson

    likelihood = Poisson() if counts else GaussianRegression(SIGMA)
    model = mlp(in_features=4, hidden=(8,), num_classes=1)
    clients = _regression_clients(model, likelihood, counts)
    alg = algorithm(model, likelihood=likelihood, points_per_class=3, tau_f=0.5)
    server = alg.init_server(theta0(model))
    state, reply, _ = alg.client_update(alg.init_client(server, 0), alg.broadcast(server), clients[0],
                                        generator_for(0, 1, 0))
    assert reply["memory.x"].shape == (3, 4)
    torch.testing.assert_close(reply["memory.tau"], torch.full((3,), 0.5 * sizes()[0] / 3))
    outputs = model.forward(state.theta, reply["memory.x"])
    torch.testing.assert_close(reply["memory.soft"], outputs.exp() if counts else outputs)


def _squared_error(outputs, targets):
    return (targets - outputs) ** 2


def test_refuses_a_likelihood_without_soft_targets_and_data_of_another_likelihood():
    from bayesadmm.likelihoods import GaussianRegression, NegLogLikelihood

    model = mlp(in_features=4, hidden=(8,), num_classes=1)
    with pytest.raises(TypeError, match=r"fedlap-func needs the likelihood's soft_targets.*NegLogLikelihood"):
        algorithm(model, likelihood=NegLogLikelihood(_squared_error))
    alg = algorithm(model, likelihood=NegLogLikelihood(_squared_error, soft_targets=torch.clone))     # given: built
    alg = algorithm(model)                                                   # the default: the softmax's
    server = alg.init_server(theta0(model))
    data = _regression_clients(model, GaussianRegression(SIGMA))[0]
    with pytest.raises(ValueError, match=r"built for the likelihood Classification.*GaussianRegression"):
        alg.client_update(alg.init_client(server, 0), alg.broadcast(server), data, generator_for(0, 1, 0))
