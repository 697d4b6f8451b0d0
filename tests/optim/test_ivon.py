"""IVON (bayesadmm.optim.ivon): agreement with ivon-opt, closed-form fixed points, and the functional core's contract.

Float64 throughout (tests/conftest.py sets the default dtype).
"""

import copy
import inspect
import math

import pytest
import torch

from bayesadmm.optim import IVON, IVONState
from bayesadmm.optim import ivon as F


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))


def regression_data(seed=1, n=24):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, torch.sin(x[:, :2] * 2.0) + 0.1 * torch.randn(n, 2, generator=g)


def flat(model):
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def train_step(model, opt, x, y, mc_samples):
    for _ in range(mc_samples):
        with opt.sampled_params(train=True):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
    opt.step()


# --- agreement with the public ivon-opt 0.1.3 ------------------------------------------------------------------------

# Black-box findings checked here: ivon-opt draws torch.randn(numel) from the GLOBAL RNG once per param group per
# sampled_params entry, so our generator seeded like the global RNG reproduces its noise exactly; rescale_lr=True steps
# with lr·(hess_init + weight_decay); step() averages the recorded samples; the new h is used in the mean update.
CASES = {
    "defaults": dict(kw=dict(), mc=1),
    "mc2": dict(kw=dict(hess_init=0.3, weight_decay=0.01, beta2=0.999), mc=2),
    "mc2-clipped": dict(kw=dict(hess_init=0.3, weight_decay=0.01, beta2=0.999, clip_radius=0.02), mc=2),
    "mc1-clipped-no-rescale": dict(kw=dict(hess_init=0.5, weight_decay=0.02, beta2=0.99, clip_radius=0.5,
                                           rescale_lr=False, lr=0.2), mc=1),
    "no-debias": dict(kw=dict(hess_init=0.2, weight_decay=0.05, beta1=0.8, beta2=0.995, debias=False), mc=2),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_follows_ivon_opt_step_for_step(case):
    ivon = pytest.importorskip("ivon")
    kw, mc = dict(lr=0.05, ess=24.0) | CASES[case]["kw"], CASES[case]["mc"]
    x, y = regression_data()
    ref_model, our_model = mlp(), mlp()
    ref = ivon.IVON(ref_model.parameters(), mc_samples=mc, **kw)
    ours = IVON(our_model.parameters(), mc_samples=mc, generator=torch.Generator().manual_seed(7), noise="torch",
                **kw)
    torch.manual_seed(7)  # ivon-opt's noise source
    start = flat(ref_model)
    for _ in range(25):
        train_step(ref_model, ref, x, y, mc)
        train_step(our_model, ours, x, y, mc)
        # 1e-12 is ~10⁴ ulps: both compute the same float64 expressions in slightly different orders (ivon-opt
        # keeps ∇ℓ∘σε and multiplies by ess(h + wd) later; we divide ∇ℓ∘ε by σ), nothing more.
        torch.testing.assert_close(flat(our_model), flat(ref_model), atol=1e-12, rtol=0)
        torch.testing.assert_close(ours.param_groups[0]["hess"], ref.param_groups[0]["hess"], atol=1e-12, rtol=0)
        torch.testing.assert_close(ours.param_groups[0]["momentum"], ref.param_groups[0]["momentum"], atol=1e-12,
                                   rtol=0)
    assert (flat(ref_model) - start).abs().max() > 5e-3  # the trajectory went somewhere


def test_clipping_is_active_in_the_clipped_case():
    """Otherwise the clipped agreement above would be vacuous."""
    x, y = regression_data()
    runs = []
    for clip in (math.inf, CASES["mc2-clipped"]["kw"]["clip_radius"]):
        model = mlp()
        opt = IVON(model.parameters(), lr=0.05, ess=24.0, hess_init=0.3, weight_decay=0.01, beta2=0.999,
                   mc_samples=2, clip_radius=clip, generator=torch.Generator().manual_seed(7))
        for _ in range(25):
            train_step(model, opt, x, y, 2)
        runs.append(flat(model))
    assert (runs[0] - runs[1]).abs().max() > 1e-3


def test_follows_ivon_opt_with_two_param_groups():
    """Per-group ess and weight decay; noise drawn group by group in order."""
    ivon = pytest.importorskip("ivon")
    x, y = regression_data()
    models, opts = [mlp(), mlp()], []
    for cls, model, extra in ((ivon.IVON, models[0], {}),
                              (IVON, models[1], dict(generator=torch.Generator().manual_seed(3), noise="torch"))):
        groups = [{"params": [model[0].weight, model[2].weight]},
                  {"params": [model[0].bias, model[2].bias], "ess": 12.0, "weight_decay": 0.1}]
        opts.append(cls(groups, lr=0.05, ess=24.0, hess_init=0.4, weight_decay=0.01, beta2=0.999, **extra))
    torch.manual_seed(3)
    for _ in range(20):
        for model, opt in zip(models, opts):
            train_step(model, opt, x, y, 1)
    torch.testing.assert_close(flat(models[1]), flat(models[0]), atol=1e-12, rtol=0)
    for g_ours, g_ref in zip(opts[1].param_groups, opts[0].param_groups):
        torch.testing.assert_close(g_ours["hess"], g_ref["hess"], atol=1e-12, rtol=0)


def test_closure_protocol_matches_ivon_opt():
    """step(closure) calls the closure mc_samples times and returns the mean loss, as ivon-opt does."""
    ivon = pytest.importorskip("ivon")
    x, y = regression_data()
    results = []
    for cls, extra in ((ivon.IVON, {}), (IVON, dict(generator=torch.Generator().manual_seed(11), noise="torch"))):
        model = mlp()
        opt = cls(model.parameters(), lr=0.05, ess=24.0, mc_samples=3, **extra)
        calls = []

        def closure():
            with opt.sampled_params(train=True):
                opt.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
            calls.append(loss.item())
            return loss

        torch.manual_seed(11)
        loss = opt.step(closure)
        results.append((len(calls), loss.item(), flat(model)))
    assert results[0][0] == results[1][0] == 3
    assert results[1][1] == pytest.approx(results[0][1], abs=1e-14)
    torch.testing.assert_close(results[1][2], results[0][2], atol=1e-14, rtol=0)


def test_defaults_match_ivon_opt():
    ivon = pytest.importorskip("ivon")
    ref = inspect.signature(ivon.IVON).parameters
    ours = inspect.signature(IVON).parameters
    for name in ("hess_init", "beta1", "beta2", "mc_samples", "clip_radius", "rescale_lr", "debias"):
        assert ours[name].default == ref[name].default, name
    # weight_decay defaults to None so that a prior precision can replace it; None means ivon-opt's 1e-4
    assert ref["weight_decay"].default == 1e-4
    assert IVON([torch.nn.Parameter(torch.zeros(2))], lr=0.1, ess=1.0).param_groups[0]["weight_decay"] == 1e-4


# --- closed-form fixed points ----------------------------------------------------------------------------------------


def run_functional(loss_grad, d, ess, delta, steps, mc_samples, seed, lr=0.1, beta2=0.999, **terms):
    """Run the functional core from m = 0, h = 0 with lr decaying as 1/t in the second half; return the averages of m
    and h over the second half and the final state."""
    state = F.init(torch.zeros(d), 0.0)
    gen = torch.Generator().manual_seed(seed)
    means, hesses = [], []
    for t in range(steps):
        thetas, eps = F.sample(state, ess, delta, gen, mc_samples)
        step_lr = lr if t < steps // 2 else lr * (steps // 2) / t
        state = F.update(state, loss_grad(thetas), eps, lr=step_lr, ess=ess, delta=delta, beta1=0.9, beta2=beta2,
                         **terms)
        if t >= steps // 2:
            means.append(state.mean)
            hesses.append(state.hess)
    return torch.stack(means).mean(0), torch.stack(hesses).mean(0), state


def test_bayesian_linear_regression_with_prior_mean_reaches_mean_field_optimum():
    r"""ℓ(θ) = (1/N) Σ_n ½ (y_n − x_nᵀθ)²/σ_n², ess = N, prior N(m_p, diag(s_p)⁻¹).

    Mean-field VB is exact in closed form here: the optimal q has precision s_i = s_p,i + Σ_n x_ni²/σ_n² (the diagonal
    of the exact posterior precision P = S_p + XᵀX/σ_n²), and its mean satisfies the same stationarity as the exact
    posterior mean, P m = S_p m_p + Xᵀy/σ_n² (E_q[∇ℓ] = ∇ℓ(m) for a quadratic). Correlated features make P
    non-diagonal, so the mean-field precision is not the exact one.

    Run: h from 0, β₂ = 0.999 (h's memory ~1000 steps), 128 samples per step, 10 000 steps, lr decaying in the second
    half, whose iterates are averaged. Tolerances (observed maxima over seeds 0–5 in brackets): averaged m within
    0.1 % (1.1e-4), averaged s within 2 % (1.0 %); the last iterate within 0.5 % (7e-4) and 4 % (1.8 %). s is the
    noisy one: ĥ's per-sample relative noise is O(1) (its ∇ℓ(m)∘ε/σ part, with ∇ℓ(m) = −δ∘(m − m_p) ≠ 0), and h
    averages only over its ~1000-step memory.
    """
    g = torch.Generator().manual_seed(0)
    n, d, noise_var = 40, 4, 0.5
    mix = torch.eye(d) + 0.6 * torch.diag(torch.ones(d - 1), 1)
    X = torch.randn(n, d, generator=g) @ mix
    y = X @ torch.tensor([1.0, -1.0, 2.0, 0.5]) + math.sqrt(noise_var) * torch.randn(n, generator=g)
    s_p = torch.tensor([20.0, 50.0, 10.0, 30.0])
    m_p = torch.tensor([2.0, -3.0, 1.0, 2.5])

    P = torch.diag(s_p) + X.T @ X / noise_var
    m_star = torch.linalg.solve(P, s_p * m_p + X.T @ y / noise_var)
    s_star = torch.diag(P)
    m_star_zero_prior_mean = torch.linalg.solve(P, X.T @ y / noise_var)

    A, b = X.T @ X / (n * noise_var), X.T @ y / (n * noise_var)
    delta = s_p / n
    m_avg, h_avg, state = run_functional(lambda th: th @ A - b, d, float(n), delta, steps=10000, mc_samples=128,
                                         seed=1, prior_mean=m_p)
    s_avg = n * (h_avg + delta)
    m_fin, s_fin = F.posterior(state, float(n), delta)

    rel = lambda a, b: ((a - b).norm() / b.norm()).item()
    assert rel(m_avg, m_star) < 1e-3
    assert ((s_avg - s_star) / s_star).abs().max() < 2e-2
    assert rel(m_fin, m_star) < 5e-3 and ((s_fin - s_star) / s_star).abs().max() < 4e-2  # the last iterate too
    # Dropping the prior-mean term would converge to the m_p = 0 optimum, which is far outside the tolerance.
    assert rel(m_star_zero_prior_mean, m_star) > 0.3
    assert rel(m_avg, m_star_zero_prior_mean) > 0.3


def test_fixed_point_with_duals_is_stationary_point_of_alg2_objective():
    r"""Quadratic ℓ = ½θᵀAθ − bᵀθ with v, u ≠ 0 and a prior mean: E_q[∇ℓ] = Am − b and E_q[diag ∇²ℓ] = diag(A), so
    the stationarity of Alg. 2's objective is exact:

        A m − b + v − u∘m + δ∘(m − m_p) = 0,      h = diag(A) − u.

    u is chosen so that h < 0 in one coordinate (the dual's curvature can exceed the loss's; only h + δ must stay
    positive). The prior dominates u here (δ ≥ 1): with u comparable to δ the mean overshoots far from a distant start,
    because the momentum g lags the loss gradient while −u∘m acts at once (module docstring).
    Same run as above (8000 steps, 128 samples). Tolerances (observed maxima over seeds 0–5): stationarity residual
    < 0.3 % of ‖b‖ (4.3e-4), m within 0.3 % of the solution (5.4e-4), h within 4 % of diag(A) (1.9 %).
    """
    g = torch.Generator().manual_seed(2)
    d, ess = 5, 30.0
    Q = torch.randn(d, d, generator=g)
    A = Q @ Q.T / d + 0.5 * torch.eye(d)
    b = torch.randn(d, generator=g)
    v = 0.3 * torch.randn(d, generator=g)
    u = 0.4 * torch.diag(A)
    u[0] = torch.diag(A)[0] + 0.2  # h₀ = A₀₀ − u₀ = −0.2 < 0
    s_p = torch.linspace(30.0, 60.0, d)
    delta = s_p / ess  # 1 … 2
    m_p = torch.linspace(-1.0, 1.0, d)
    assert torch.linalg.eigvalsh(A - torch.diag(u) + torch.diag(delta)).min() > 0.5

    m_star = torch.linalg.solve(A - torch.diag(u) + torch.diag(delta), b - v + delta * m_p)
    h_star = torch.diag(A) - u
    m_avg, h_avg, _ = run_functional(lambda th: th @ A - b, d, ess, delta, steps=8000, mc_samples=128, seed=3,
                                     prior_mean=m_p, v=v, u=u)
    residual = A @ m_avg - b + v - u * m_avg + delta * (m_avg - m_p)
    assert residual.norm() < 3e-3 * b.norm()
    assert (m_avg - m_star).norm() < 3e-3 * m_star.norm()
    assert h_avg[0] < 0
    assert ((h_avg - h_star).abs() / torch.diag(A)).max() < 4e-2


# --- the functional core -----------------------------------------------------------------------------------------------


def quad_problem(d=6, seed=4):
    g = torch.Generator().manual_seed(seed)
    Q = torch.randn(d, d, generator=g)
    return Q @ Q.T / d + 0.2 * torch.eye(d), torch.randn(d, generator=g)


def functional_trajectory(seed, steps=10, mc=2, **kw):
    A, b = quad_problem()
    delta = torch.full((6,), 0.1)
    state, gen, out = F.init(torch.ones(6), 0.5), torch.Generator().manual_seed(seed), []
    for _ in range(steps):
        thetas, eps = F.sample(state, 10.0, delta, gen, mc)
        state = F.update(state, thetas @ A - b, eps, lr=0.2, ess=10.0, delta=delta, beta1=0.9, beta2=0.99, **kw)
        out.append(state)
    return out


def test_functional_core_does_not_mutate_inputs():
    A, b = quad_problem()
    state = F.init(torch.randn(6), 0.5)._replace(momentum=torch.randn(6), step=3)
    delta, m_p, v, u = torch.full((6,), 0.1), torch.randn(6), torch.randn(6), 0.1 * torch.rand(6)
    thetas, eps = F.sample(state, 10.0, delta, torch.Generator().manual_seed(0), 3)
    grads = thetas @ A - b
    inputs = [*state[:3], delta, m_p, v, u, grads, eps]
    before = [t.clone() for t in inputs]
    new = F.update(state, grads, eps, lr=0.1, ess=10.0, delta=delta, beta1=0.9, beta2=0.99, prior_mean=m_p, v=v,
                   u=u, clip_radius=1.0)
    F.posterior(new, 10.0, delta)
    for t, t0 in zip(inputs, before):
        assert torch.equal(t, t0)
    assert new.step == 4 and state.step == 3
    assert all(a is not c for a, c in zip(new[:3], state[:3]))
    mean = torch.randn(6)
    init_state = F.init(mean, 0.5)
    init_state.mean.add_(1.0)  # init copies: the caller's tensor is not aliased
    assert not torch.equal(init_state.mean, mean)


def test_same_generator_gives_identical_trajectory():
    a, b, c = functional_trajectory(0), functional_trajectory(0), functional_trajectory(1)
    for sa, sb in zip(a, b):
        assert all(torch.equal(x, y) for x, y in zip(sa[:3], sb[:3]))
    assert not torch.equal(a[-1].mean, c[-1].mean)


def test_sample_shapes_scale_and_single_draw():
    state = F.init(torch.arange(4.0), 0.5)
    delta = torch.tensor([0.1, 0.2, 0.3, 0.4])
    thetas, eps = F.sample(state, 8.0, delta, torch.Generator().manual_seed(5), 3)
    assert thetas.shape == eps.shape == (3, 4)
    sigma = F.noise_scale(state, 8.0, delta)
    torch.testing.assert_close(sigma, 1.0 / torch.sqrt(8.0 * (0.5 + delta)))
    torch.testing.assert_close(thetas, state.mean + sigma * eps)
    # one randn call of shape (S, d) per step
    torch.testing.assert_close(eps, torch.randn(3, 4, generator=torch.Generator().manual_seed(5)), atol=0, rtol=0)


def test_posterior_is_mean_and_ess_times_h_plus_delta():
    state = functional_trajectory(0)[-1]
    delta = torch.full((6,), 0.1)
    m, s = F.posterior(state, 10.0, delta)
    assert torch.equal(m, state.mean)
    torch.testing.assert_close(s, 10.0 * (state.hess + delta))


def test_update_matches_the_equations_for_one_step():
    """Steps 2–6 written out by hand for one update with all terms present."""
    g = torch.Generator().manual_seed(6)
    d, S, ess, lr, b1, b2 = 5, 3, 7.0, 0.3, 0.8, 0.9
    state = IVONState(torch.randn(d, generator=g), torch.rand(d, generator=g), torch.randn(d, generator=g), 2)
    delta, m_p, v, u = torch.rand(d, generator=g), torch.randn(d, generator=g), torch.randn(d, generator=g), \
        0.1 * torch.rand(d, generator=g)
    grads, eps = torch.randn(S, d, generator=g), torch.randn(S, d, generator=g)
    new = F.update(state, grads, eps, lr=lr, ess=ess, delta=delta, beta1=b1, beta2=b2, prior_mean=m_p, v=v, u=u)

    sigma = 1 / torch.sqrt(ess * (state.hess + delta))
    thetas = state.mean + sigma * eps
    g_hat = grads.mean(0)
    h_hat = (grads * (thetas - state.mean) / sigma**2).mean(0) - u
    mom = b1 * state.momentum + (1 - b1) * g_hat
    h = b2 * state.hess + (1 - b2) * h_hat + 0.5 * (1 - b2) ** 2 * (state.hess - h_hat) ** 2 / (state.hess + delta)
    m = state.mean - lr * (mom / (1 - b1**3) + v - u * state.mean + delta * (state.mean - m_p)) / (h + delta)
    torch.testing.assert_close(new.momentum, mom)
    torch.testing.assert_close(new.hess, h)
    torch.testing.assert_close(new.mean, m)
    assert new.step == 3


def test_hess_init_zero_works_with_a_prior():
    A, b = quad_problem()
    delta = torch.full((6,), 0.05)
    state = F.init(torch.zeros(6), 0.0)
    assert torch.equal(state.hess, torch.zeros(6))
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        thetas, eps = F.sample(state, 20.0, delta, gen, 4)
        state = F.update(state, thetas @ A - b, eps, lr=0.1, ess=20.0, delta=delta, beta1=0.9, beta2=0.9)
    assert torch.isfinite(state.mean).all() and (state.hess + delta > 0).all()
    assert (state.hess > 0.3 * torch.diag(A)).all()  # h learnt the curvature from zero
    with pytest.raises(ValueError, match="h \\+ delta"):
        F.sample(F.init(torch.zeros(6), 0.0), 20.0, 0.0, gen)


def test_functional_core_rejects_bad_input():
    state = F.init(torch.zeros(3), 1.0)
    grads = eps = torch.zeros(2, 3)
    ok = dict(lr=0.1, ess=5.0, delta=torch.full((3,), 0.1), beta1=0.9, beta2=0.99)
    F.update(state, grads, eps, **ok)
    bad = [dict(lr=0.0), dict(lr=-1.0), dict(ess=0.0), dict(beta1=1.0), dict(beta2=-0.1), dict(beta2=1.0),
           dict(delta=torch.full((4,), 0.1)), dict(delta=-0.1), dict(prior_mean=torch.zeros(4)),
           dict(v=torch.zeros(3, 1)), dict(u=torch.zeros(2)), dict(clip_radius=0.0)]
    for change in bad:
        with pytest.raises(ValueError):
            F.update(state, grads, eps, **(ok | change))
    with pytest.raises(ValueError):
        F.update(state, torch.zeros(2, 3), torch.zeros(1, 3), **ok)
    with pytest.raises(ValueError):
        F.update(state, torch.zeros(3), torch.zeros(3), **ok)
    with pytest.raises(ValueError):
        F.init(torch.zeros(3), -1.0)
    with pytest.raises(ValueError):
        F.init(torch.zeros(3), torch.tensor([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError):
        F.init(torch.zeros(2, 2), 1.0)
    with pytest.raises(ValueError):
        F.sample(state, 5.0, 0.1, None, mc_samples=0)
    with pytest.raises(ValueError):
        F.noise_scale(state, 0.0, 0.1)


# --- the Optimizer ---------------------------------------------------------------------------------------------------


class Quadratic(torch.nn.Module):
    """ℓ = ½θᵀAθ − bᵀθ + ¼Σθ⁴ over two parameters of different shapes (the quartic keeps ∇ℓ non-linear)."""

    def __init__(self, A, b):
        super().__init__()
        self.A, self.b = A, b
        self.w = torch.nn.Parameter(torch.linspace(-1, 1, 4).reshape(2, 2))
        self.c = torch.nn.Parameter(torch.tensor([0.5, -0.5]))

    def forward(self):
        th = torch.cat([self.w.reshape(-1), self.c])
        return 0.5 * th @ self.A @ th - self.b @ th + 0.25 * (th**4).sum()


def loss_grad_flat(A, b):
    return lambda th: th @ A - b + th**3


@pytest.mark.parametrize("rescale_lr", [True, False])
@pytest.mark.parametrize("mc", [1, 2])
def test_optimizer_and_functional_core_give_identical_trajectories(mc, rescale_lr):
    A, b = quad_problem()
    d, ess, lr, h0 = 6, 15.0, 0.1, 0.4
    g = torch.Generator().manual_seed(8)
    m_p, s_p, v, u = torch.randn(d, generator=g), 1.0 + torch.rand(d, generator=g) * 5, \
        0.2 * torch.randn(d, generator=g), 0.05 * torch.rand(d, generator=g)
    model = Quadratic(A, b)
    opt = IVON(model.parameters(), lr=lr, ess=ess, hess_init=h0, beta2=0.99, mc_samples=mc, clip_radius=2.0,
               rescale_lr=rescale_lr, prior_mean=m_p, prior_precision=s_p, v=v, u=u,
               generator=torch.Generator().manual_seed(9), noise="torch")
    delta = s_p / ess
    state, gen, grad = F.init(flat(model), h0), torch.Generator().manual_seed(9), loss_grad_flat(A, b)
    for _ in range(15):
        for _ in range(mc):
            with opt.sampled_params(train=True):
                opt.zero_grad()
                model().backward()
        opt.step()
        # the optimizer draws one row per sampled_params entry
        draws = [F.sample(state, ess, delta, gen, 1) for _ in range(mc)]
        thetas, eps = torch.cat([t for t, _ in draws]), torch.cat([e for _, e in draws])
        state = F.update(state, grad(thetas), eps, lr=lr * (h0 + delta) if rescale_lr else lr, ess=ess,
                         delta=delta, beta1=0.9, beta2=0.99, prior_mean=m_p, v=v, u=u, clip_radius=2.0)
        torch.testing.assert_close(flat(model), state.mean, atol=1e-13, rtol=0)
        m, s = opt.get_posterior()
        fm, fs = F.posterior(state, ess, delta)
        torch.testing.assert_close(m, fm, atol=1e-13, rtol=0)
        torch.testing.assert_close(s, fs, atol=1e-11, rtol=1e-13)
    assert opt.param_groups[0]["step"] == state.step == 15


def test_prior_given_per_parameter_equals_flat_vector():
    A, b = quad_problem()
    m_p = torch.linspace(-1, 1, 6)
    runs = []
    for prior in (m_p, [m_p[:4].reshape(2, 2), m_p[4:]]):
        model = Quadratic(A, b)
        opt = IVON(model.parameters(), lr=0.1, ess=10.0, prior_mean=prior, prior_precision=2.0,
                   generator=torch.Generator().manual_seed(0))
        for _ in range(5):
            with opt.sampled_params(train=True):
                opt.zero_grad()
                model().backward()
            opt.step()
        runs.append(flat(model))
    assert torch.equal(runs[0], runs[1])


def test_sampled_params_restores_parameters_and_records_samples():
    A, b = quad_problem()
    model = Quadratic(A, b)
    opt = IVON(model.parameters(), lr=0.1, ess=10.0, generator=torch.Generator().manual_seed(0))
    m0, w_storage = flat(model), model.w.data_ptr()
    for train in (False, True):
        with opt.sampled_params(train=train):
            inside = flat(model)
            opt.zero_grad()
            model().backward()
        assert not torch.equal(inside, m0)
        assert torch.equal(flat(model), m0)
    assert model.w.data_ptr() == w_storage  # written in place, not re-bound
    assert len(opt.param_groups[0]["_samples"]) == 1  # only the train=True entry
    with pytest.raises(KeyError):
        with opt.sampled_params(train=True):
            raise KeyError("boom")
    assert torch.equal(flat(model), m0)
    assert len(opt.param_groups[0]["_samples"]) == 1  # a failed sample is not recorded
    with pytest.raises(RuntimeError, match="re-entrant"):
        with opt.sampled_params():
            with opt.sampled_params():
                pass
    assert torch.equal(flat(model), m0)
    opt.step()
    with pytest.raises(RuntimeError, match="at least one sample"):
        opt.step()


def test_state_dict_round_trip_continues_identically():
    A, b = quad_problem()

    def steps(model, opt, n):
        out = []
        for _ in range(n):
            for _ in range(2):
                with opt.sampled_params(train=True):
                    opt.zero_grad()
                    model().backward()
            opt.step()
            out.append(flat(model))
        return out

    gen = torch.Generator().manual_seed(1)
    model = Quadratic(A, b)
    opt = IVON(model.parameters(), lr=0.1, ess=10.0, hess_init=0.3, prior_mean=torch.ones(6),
               prior_precision=torch.full((6,), 3.0), v=0.1 * torch.ones(6), u=0.01 * torch.ones(6), generator=gen,
               noise="torch")
    steps(model, opt, 5)
    saved = copy.deepcopy(opt.state_dict())
    saved_params, saved_gen = copy.deepcopy(model.state_dict()), gen.get_state()
    reference = steps(model, opt, 5)

    model2 = Quadratic(A, b)
    model2.load_state_dict(saved_params)
    gen2 = torch.Generator()
    gen2.set_state(saved_gen)
    # prior, duals, h, g, t come from the state
    opt2 = IVON(model2.parameters(), lr=0.1, ess=10.0, generator=gen2, noise="torch")
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0]["step"] == 5
    for a, c in zip(reference, steps(model2, opt2, 5)):
        assert torch.equal(a, c)


def test_get_and_set_posterior():
    A, b = quad_problem()
    model = Quadratic(A, b)
    opt = IVON(model.parameters(), lr=0.1, ess=10.0, hess_init=0.0, prior_precision=torch.linspace(1, 2, 6),
               generator=torch.Generator().manual_seed(0))
    m, s = opt.get_posterior()
    assert torch.equal(m, flat(model))
    torch.testing.assert_close(s, torch.linspace(1, 2, 6))  # hess_init = 0: the prior precision
    new_m, new_s = torch.randn(6), torch.linspace(5, 9, 6)
    opt.set_posterior(new_m, new_s)
    m, s = opt.get_posterior()
    torch.testing.assert_close(m, new_m, atol=0, rtol=0)
    torch.testing.assert_close(s, new_s)
    assert torch.equal(flat(model), new_m)
    with pytest.raises(ValueError):
        opt.set_posterior(new_m, torch.zeros(6))
    with pytest.raises(ValueError):
        opt.set_posterior(torch.zeros(5), new_s)


def test_optimizer_rejects_bad_hyperparameters():
    params = lambda: [torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(3))]
    IVON(params(), lr=0.1, ess=1.0)
    bad = [dict(lr=0.0), dict(lr=-0.1), dict(ess=0.0), dict(beta1=1.0), dict(beta1=-0.5), dict(beta2=1.0),
           dict(hess_init=-1.0), dict(mc_samples=0), dict(weight_decay=-1.0), dict(clip_radius=0.0),
           dict(prior_mean=torch.zeros(6)), dict(prior_mean=[torch.zeros(2, 2), torch.zeros(2)]),
           dict(prior_precision=torch.zeros(8)), dict(prior_precision=-1.0), dict(v=torch.zeros(3)),
           dict(u=[torch.zeros(4), torch.zeros(3)]), dict(weight_decay=0.1, prior_precision=1.0),
           dict(hess_init=0.0, weight_decay=0.0)]
    for kw in bad:
        with pytest.raises(ValueError):
            IVON(params(), **(dict(lr=0.1, ess=1.0) | kw))
    IVON(params(), lr=0.1, ess=1.0, hess_init=0.0)  # hess_init = 0 is fine with a (default) weight decay


# --- noise="counter": the optimizer drawing from the counter-based stream in the fused sampling kernel ----------------

def test_counter_noise_is_the_default():
    """The cheaper noise by default; noise="torch" (ivon-opt's stream) when asked for, as in the cross-checks above."""
    opt = IVON(mlp().parameters(), lr=0.05, ess=24.0)
    assert opt.noise == "counter" and "noise_key" in opt.param_groups[0]
    assert "noise_key" not in IVON(mlp().parameters(), lr=0.05, ess=24.0, noise="torch").param_groups[0]


def test_counter_noise_samples_are_block_after_block_of_the_stream():
    """Each `sampled_params` entry of a group takes the next block of `numel` draws of the group's stream, so the
    samples of one step (mc_samples > 1) and of successive steps are all different noise."""
    from bayesadmm import rng

    model = mlp()
    x, y = regression_data()
    opt = IVON(model.parameters(), lr=0.05, ess=24.0, hess_init=0.3, weight_decay=0.01, mc_samples=2,
               generator=torch.Generator().manual_seed(3), noise="counter")
    group = opt.param_groups[0]
    d, key = group["numel"], group["noise_key"]
    seen = []
    for step in range(2):
        for i in range(2):
            m, s = opt.get_posterior()
            with opt.sampled_params(train=True):
                theta = flat(model)
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
            block = 2 * step + i
            eps = rng.counter_normal(rng.block_key(key, block), d, torch.float64, "cpu")
            torch.testing.assert_close(theta, m + eps / torch.sqrt(s), rtol=1e-12, atol=1e-12)
            seen.append(eps)
        opt.step()
    assert all(not torch.isclose(a, b).any() for i, a in enumerate(seen) for b in seen[i + 1:])


@pytest.mark.slow
def test_counter_noise_reaches_the_mean_field_optimum_like_torch_noise():
    """The same Bayesian linear regression as above through the nn.Module optimizer: both noise sources give the
    closed-form mean-field posterior (mean within 1 %, precision within 5 %; observed ≤ 0.07 % and ≤ 2.4 % over two seeds of each)."""
    g = torch.Generator().manual_seed(0)
    n, d, noise_var = 40, 4, 0.5
    X = torch.randn(n, d, generator=g) @ (torch.eye(d) + 0.6 * torch.diag(torch.ones(d - 1), 1))
    y = X @ torch.tensor([1.0, -1.0, 2.0, 0.5]) + math.sqrt(noise_var) * torch.randn(n, generator=g)
    s_p = torch.tensor([20.0, 50.0, 10.0, 30.0])
    P = torch.diag(s_p) + X.T @ X / noise_var
    m_star, s_star = torch.linalg.solve(P, X.T @ y / noise_var), torch.diag(P)

    for noise in ("torch", "counter"):
        theta = torch.nn.Parameter(torch.zeros(d))
        # h starts near its target (2.0; h forgets its start over ~1/(1 − β₂) = 1000 steps, too slowly for 4000)
        opt = IVON([theta], lr=0.05, ess=float(n), hess_init=2.0, beta2=0.999, prior_precision=s_p, mc_samples=16,
                   rescale_lr=False, generator=torch.Generator().manual_seed(1), noise=noise)
        means, precisions = [], []
        for t in range(4000):
            for _ in range(16):
                with opt.sampled_params(train=True):
                    opt.zero_grad()
                    (0.5 * ((y - X @ theta) ** 2).mean() / noise_var).backward()
            opt.step()
            if t == 2000:
                opt.param_groups[0]["lr"] = 0.01   # smaller steps while the iterates are averaged
            if t >= 2000:
                m, s = opt.get_posterior()
                means.append(m)
                precisions.append(s)
        m, s = torch.stack(means).mean(0), torch.stack(precisions).mean(0)
        assert (m - m_star).norm() / m_star.norm() < 1e-2, noise
        assert ((s - s_star) / s_star).abs().max() < 5e-2, noise


def test_counter_noise_state_dict_continues_without_the_generator():
    model = mlp()
    x, y = regression_data()
    opt = IVON(model.parameters(), lr=0.05, ess=24.0, generator=torch.Generator().manual_seed(5), noise="counter")
    for _ in range(3):
        train_step(model, opt, x, y, 1)
    saved, saved_params = copy.deepcopy(opt.state_dict()), copy.deepcopy(model.state_dict())
    reference = []
    for _ in range(3):
        train_step(model, opt, x, y, 1)
        reference.append(flat(model))

    model2 = mlp()
    model2.load_state_dict(saved_params)
    opt2 = IVON(model2.parameters(), lr=0.05, ess=24.0, noise="counter")   # no generator: the key is in the state
    opt2.load_state_dict(saved)
    for expected in reference:
        train_step(model2, opt2, x, y, 1)
        assert torch.equal(flat(model2), expected)

    torch_noise = IVON(mlp().parameters(), lr=0.05, ess=24.0, noise="torch")
    with pytest.raises(ValueError, match="noise='torch'"):
        IVON(mlp().parameters(), lr=0.05, ess=24.0, noise="counter").load_state_dict(torch_noise.state_dict())
    with pytest.raises(ValueError, match="noise must be"):
        IVON(mlp().parameters(), lr=0.05, ess=24.0, noise="philox")


# --- parameters as views of one flat buffer (flatten=True) against the copying path (flatten=False) -------------------

# What a user sets: the flat path's kernels read only these (None for an absent prior mean or dual, δ one number for
# a weight decay); the copying path passes full vectors, zeros where absent.
TERMS = ["prior-and-duals", "weight-decay", "prior-mean-and-weight-decay", "duals"]


def ivon_terms(terms):
    g = torch.Generator().manual_seed(4)
    m_p, v = 0.1 * torch.randn(38, generator=g), 0.01 * torch.randn(38, generator=g)
    u = 1e-3 * torch.rand(38, generator=g)
    return {"prior-and-duals": dict(prior_mean=m_p, prior_precision=torch.linspace(0.5, 2.0, 38), v=v, u=u),
            "weight-decay": dict(weight_decay=0.01),
            "prior-mean-and-weight-decay": dict(prior_mean=m_p, weight_decay=0.01),
            "duals": dict(v=v, u=u)}[terms]


def run_both_paths(noise, mc, steps=8, between=None, make=None, terms="prior-and-duals"):
    """The same training from the same start with flatten=True and flatten=False: per step, the parameters, h and g
    of each. `between(model, opt, step)` runs between step() and the next sampling (e.g. a write to the parameters);
    `terms`: one of TERMS."""
    x, y = regression_data()
    runs = []
    for flatten in (True, False):
        model = make() if make else mlp()
        opt = IVON(model.parameters(), lr=0.05, ess=24.0, hess_init=0.3, beta2=0.999, mc_samples=mc, noise=noise,
                   flatten=flatten, generator=torch.Generator().manual_seed(5), **ivon_terms(terms))
        trajectory = []
        for t in range(steps):
            train_step(model, opt, x, y, mc)
            group = opt.param_groups[0]
            trajectory.append((flat(model), group["hess"].clone(), group["momentum"].clone()))
            if between:
                between(model, opt, t)
        runs.append((opt, trajectory))
    return runs


def assert_same_trajectories(a, b):
    for step, (left, right) in enumerate(zip(a, b, strict=True)):
        for name, p, q in zip(("mean", "hess", "momentum"), left, right, strict=True):
            assert torch.equal(p, q), (step, name, (p - q).abs().max())


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize("noise", ["torch", "counter"])
@pytest.mark.parametrize("mc", [1, 2])
def test_parameters_become_views_of_one_buffer_and_step_as_the_copying_path(noise, mc, terms):
    """Same bits as the copying path (which the ivon-opt cross-checks above pin down), with the parameters viewing one
    buffer throughout, in order, and keeping their values at construction; with every combination of terms the
    flat path's kernels leave out when absent."""
    model = mlp()
    before = flat(model)
    IVON(model.parameters(), lr=0.05, ess=24.0, noise=noise)
    params = list(model.parameters())
    assert torch.equal(flat(model), before)
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1
    offsets = [p.storage_offset() for p in params]
    assert offsets == [sum(q.numel() for q in params[:i]) for i in range(len(params))]

    (fast, fast_run), (slow, slow_run) = run_both_paths(noise, mc, terms=terms)
    assert fast._flats[0] is not None and slow._flats[0] is None
    given, kept = ivon_terms(terms), fast._flats[0].terms   # the flat path's kernels get only what was set
    assert [x is None for x in kept[1:4]] == [name not in given for name in ("prior_mean", "v", "u")]
    assert kept.delta.dim() == (1 if "prior_precision" in given else 0)
    assert (fast_run[-1][0] - fast_run[0][0]).abs().max() > 1e-3  # it moved
    assert_same_trajectories(fast_run, slow_run)


def shrink_parameters(model, opt, step):
    if step % 2 == 0:
        for p in model.parameters():
            p.data.mul_(0.9)


def change_ess(model, opt, step):
    opt.param_groups[0]["ess"] = 24.0 + step


@pytest.mark.parametrize("noise", ["torch", "counter"])
@pytest.mark.parametrize("between", [shrink_parameters, change_ess], ids=["parameters", "ess"])
def test_changes_between_steps_are_used_by_the_next_sample(noise, between):
    """With noise="counter" the step draws the next sample's noise ahead; the sample must still be taken around the
    parameters as they are when sampled_params is entered, however they were written (here through .data), and with
    the σ of the hyperparameters then (a new ess: drawn again)."""
    (_, fast_run), (_, slow_run) = run_both_paths(noise, 1, between=between)
    assert_same_trajectories(fast_run, slow_run)


def test_groups_that_cannot_share_a_buffer_use_the_copying_path():
    """A non-contiguous parameter keeps its layout (no buffer for its group), the other group still gets one; and a
    group whose parameter's .data is replaced later falls back to copying from then on, with the same numbers."""

    class Transposed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.w = torch.nn.Parameter(torch.randn(3, 2).t())  # non-contiguous
            self.b = torch.nn.Parameter(torch.randn(2))
            self.head = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.head(torch.tanh(x @ self.w.t() + self.b))

    x, y = regression_data()
    runs = []
    for flatten in (True, False):
        model = Transposed()
        groups = [{"params": [model.w, model.b]}, {"params": list(model.head.parameters())}]
        opt = IVON(groups, lr=0.05, ess=24.0, noise="counter", flatten=flatten,
                   generator=torch.Generator().manual_seed(2))
        assert not model.w.is_contiguous()
        assert (opt._flats[0] is None, opt._flats[1] is None) == ((True, False) if flatten else (True, True))
        trajectory = []
        for t in range(6):
            if t == 3:  # as module.to(...) does: the parameter now lives elsewhere
                model.head.weight.data = model.head.weight.data.clone()
            train_step(model, opt, x, y, 1)
            trajectory.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        assert opt._flats[1] is None
        runs.append(trajectory)
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_state_dict_is_a_snapshot_while_h_and_g_are_updated_in_place():
    model = mlp()
    x, y = regression_data()
    opt = IVON(model.parameters(), lr=0.05, ess=24.0, hess_init=0.3, generator=torch.Generator().manual_seed(1))
    train_step(model, opt, x, y, 1)
    saved = opt.state_dict()
    hess, momentum = saved["param_groups"][0]["hess"].clone(), saved["param_groups"][0]["momentum"].clone()
    train_step(model, opt, x, y, 1)
    assert not torch.equal(opt.param_groups[0]["hess"], hess)
    assert torch.equal(saved["param_groups"][0]["hess"], hess)
    assert torch.equal(saved["param_groups"][0]["momentum"], momentum)


def test_backward_after_the_parameters_changed_under_it_fails():
    """Writes through the buffer bypass the parameters' version counters; the optimizer bumps them, so autograd
    refuses a graph built on values since overwritten, as it does after any in-place write to a parameter."""
    model = mlp()
    x, y = regression_data()
    opt = IVON(model.parameters(), lr=0.05, ess=24.0, generator=torch.Generator().manual_seed(1))
    with opt.sampled_params(train=False):
        loss = ((model(x) - y) ** 2).mean()
    with pytest.raises(RuntimeError, match="inplace operation"):
        loss.backward()
