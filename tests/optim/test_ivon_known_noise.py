"""IVON's update for gradients with noise of known variance (example-level DP's privatised gradient; optim/ivon.py,
"Gradients with known noise"), against closed forms computed here.

The problem: ℓ(θ) = ½ a θ² in every one of d coordinates (Hessian a), the mean held at 0 (a negligible lr), so the
noise-free IVON estimate is ĥ₀ = a ε² (E = a, Var = 2a²) and IVON's fixed point without noise is h* = a(1 + O(1 − β₂)).
The gradients get N(0, s²) noise per coordinate. The uncorrected update's h then gains, on average, c = ½(1 − β₂)² λ s²
a step; with the mean reversion of step 4, h − h_clean → c Σ_t β₂ᵗ = c (1 − β₂ᵀ)/(1 − β₂) after T steps (the guide's
law, docs/guides/privacy.md). The corrected update removes it.
"""

from __future__ import annotations

import pytest
import torch

from bayesadmm import rng
from bayesadmm.optim import ivon, kernels

A, ESS, BETA2, S = 1.0, 1e4, 0.999, 0.3  # Hessian, λ, β₂, the gradient noise's standard deviation
KAPPA = 1.0 - BETA2
HYPER = dict(lr=1e-12, ess=ESS, delta=0.0, beta1=0.9, beta2=BETA2)


def _chains(
    d: int, steps: int, seed: int = 0, beta2: float = BETA2, s: float = S
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h after `steps` steps from h = a of three chains sharing IVON's weight noise: without gradient noise, with
    noise of standard deviation `s` and IVON's update, with that noise and the update told its variance s²."""
    g = torch.Generator().manual_seed(seed)
    hyper = dict(HYPER, beta2=beta2)
    states = [ivon.init(torch.zeros(d, dtype=torch.float64), A) for _ in range(3)]
    for _ in range(steps):
        eps = torch.randn((1, d), generator=g, dtype=torch.float64)
        noise = s * torch.randn((1, d), generator=g, dtype=torch.float64)
        new = []
        for k, state in enumerate(states):
            sigma = ivon.noise_scale(state, ESS, 0.0)
            grads = A * (state.mean + sigma * eps) + (noise if k else 0.0)  # ∇ℓ at θ = m + σε
            new.append(ivon.update(state, grads, eps, **hyper, grad_noise=s**2 if k == 2 else None))
        states = new
    return tuple(state.hess for state in states)  # type: ignore[return-value]


def test_uncorrected_h_grows_by_the_guides_law_and_the_corrected_h_does_not():
    """After T = 200 steps (T(1 − β₂) = 0.2): the uncorrected h exceeds the noise-free chain's by c(1 − β₂ᵀ)/(1 − β₂)
    (8 % of a here) to 3 %; the corrected one by less than a tenth of that."""
    steps = 200
    clean, plain, corrected = _chains(20_000, steps)
    law = 0.5 * KAPPA**2 * ESS * S**2 * (1 - BETA2**steps) / KAPPA
    gap = float((plain - clean).mean())
    assert gap == pytest.approx(law, rel=0.03)
    assert abs(float((corrected - clean).mean())) < 0.1 * law


def test_corrected_h_stays_at_ivons_noise_free_fixed_point_where_the_uncorrected_one_does_not():
    """β₂ = 0.99, s = 0.1, after 600 steps (6/(1 − β₂)): the noise-free chain sits at a(1 + O(1 − β₂)), the corrected
    one within 3 % of a, the uncorrected one near a + c/(1 − β₂) = a + ½(1 − β₂)λs² (50 % above: the stationary form of
    the law)."""
    beta2, s = 0.99, 0.1
    clean, plain, corrected = _chains(4_000, 600, seed=1, beta2=beta2, s=s)
    assert float(clean.mean()) == pytest.approx(A, rel=0.02)
    assert float(corrected.mean()) == pytest.approx(A, rel=0.03)
    assert float(plain.mean()) == pytest.approx(A + 0.5 * (1 - beta2) * ESS * s**2, rel=0.05)
    assert bool((corrected > 0).all())


def test_the_floor_keeps_h_nonnegative_and_h_plus_delta_at_least_half_and_its_push_is_bounded():
    """Noise far larger than the curvature (c ≫ h + δ): the corrected h is ≥ 0, h + δ ≥ ½ its old value,
    h ≤ max(IVON's h, 0), and the floor lifts it above IVON's h − c by at most c where the old h ≥ δ, by at most
    c + ½δ elsewhere."""
    d, delta = 10_000, 0.01
    g = torch.Generator().manual_seed(3)
    state = ivon.init(torch.zeros(d, dtype=torch.float64), 0.05)
    hyper = dict(HYPER, delta=delta)
    big = 100.0  # s²: c = ½(1 − β₂)² λ s² ε² = 0.5 ε², against h + δ = 0.06
    bound = 1e-15 * (1 + state.hess.abs())  # rounding
    for _ in range(50):
        eps = torch.randn((1, d), generator=g, dtype=torch.float64)
        grads = A * (state.mean + ivon.noise_scale(state, ESS, delta) * eps) + big**0.5 * torch.randn(
            (1, d), generator=g, dtype=torch.float64
        )
        plain = ivon.update(state, grads, eps, **hyper)
        fixed = ivon.update(state, grads, eps, **hyper, grad_noise=big)
        c = 0.5 * KAPPA**2 * ESS * big * eps[0] ** 2
        floor = torch.clamp(0.5 * (state.hess - delta), min=0.0)
        assert bool((fixed.hess >= 0).all()) and bool((fixed.hess == floor).any())  # the floor binds somewhere
        assert bool((fixed.hess + delta >= 0.5 * (state.hess + delta) - bound).all())
        assert bool((fixed.hess <= plain.hess.clamp(min=0.0)).all())
        push = fixed.hess - (plain.hess - c)
        assert bool((push <= torch.where(state.hess >= delta, c, c + 0.5 * delta) + bound).all())
        state = fixed
    assert float((state.hess + delta).min()) >= delta


def test_no_grad_noise_is_ivons_update_bit_for_bit():
    """grad_noise None (every run without example-level DP) leaves step 4 as it is; 0 gives IVON's h to rounding."""
    g = torch.Generator().manual_seed(5)
    d = 500
    state = ivon.init(torch.randn(d, generator=g, dtype=torch.float64), 0.3)
    eps, grads = (torch.randn((1, d), generator=g, dtype=torch.float64) for _ in range(2))
    hyper = dict(HYPER, lr=0.1, delta=0.2)
    plain = ivon.update(state, grads, eps, **hyper)
    curvature = state.hess + 0.2
    h_hat = (grads * eps).mean(0) * torch.sqrt(ESS * curvature)
    expected = BETA2 * state.hess + KAPPA * h_hat + 0.5 * KAPPA**2 * (state.hess - h_hat) ** 2 / curvature
    assert torch.equal(plain.hess, expected)
    zero = ivon.update(state, grads, eps, **hyper, grad_noise=0.0)
    torch.testing.assert_close(zero.hess, plain.hess, rtol=1e-15, atol=0)
    with pytest.raises(ValueError, match="grad_noise"):
        ivon.update(state, grads, eps, **hyper, grad_noise=-1.0)


@pytest.mark.compiled
def test_compiled_update_with_known_noise_equals_the_eager_maths():
    """The compiled kernels with grad_noise on, in the variants the solvers call (0-d alone and with sampling, per
    coordinate in a cohort), with noise large enough that the floor binds on some coordinates."""
    from tests.optim.test_kernels import random_update_inputs

    d = 1000
    args = random_update_inputs(d, 1, torch.float64)
    key = rng.block_key(torch.tensor(9), 3)
    big = 4e5  # c = ½(1 − β₂)² ess s² ε² ≈ 1.4 ε², against h + δ ≈ 1
    noises = (torch.tensor(big, dtype=torch.float64),
              big * torch.rand(d, generator=torch.Generator().manual_seed(2), dtype=torch.float64))  # fmt: skip
    cases = [
        (kernels.update_step, kernels.update_step_, (), noises[0]),
        (kernels.update_step, kernels.update_step_, (), noises[1]),
        (kernels.update_and_sample_step, kernels.update_and_sample_step_, (key, 1), noises[0]),
    ]
    for pure, in_place, extra, noise in cases:
        expected = pure(*args, *extra, noise)
        floor = torch.clamp(0.5 * (args[1] - args[5]), min=0.0)
        assert bool((expected[1] == floor).any()) and bool((expected[1] > floor).any())  # both branches taken
        state = [t.clone() for t in args[:3]]
        returned = in_place(*state, *args[3:], *extra, noise)
        for a, b in zip((*state, *(returned or ())), expected, strict=False):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
