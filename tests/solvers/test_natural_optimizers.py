"""The optimizers over natural parameters (FedEP's ServerOptim / ClientOptim): their steps, written out."""

import math

import torch

from bayesadmm.families import natural as nat
from bayesadmm.solvers.natural_optimizers import Adam, Identity, Momentum


def deltas():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(3, generator=g), torch.randn(3, 3, generator=g)) for _ in range(3)]


def test_identity_steps_by_the_change_itself():
    opt = Identity()
    state = opt.init(deltas()[0])
    for delta in deltas():
        step, state = opt.step(delta, state)
        assert step is delta and state == ()


def test_momentum_is_heavy_ball_on_the_changes():
    opt = Momentum(lr=0.5, beta=0.9)
    state = opt.init(deltas()[0])
    trace = nat.zeros_like(deltas()[0])
    for delta in deltas():
        step, state = opt.step(delta, state)
        trace = nat.add(nat.scale(trace, 0.9), delta)
        assert nat.allclose(step, nat.scale(trace, 0.5), rtol=0, atol=0)


def test_adam_is_bias_corrected_and_elementwise():
    opt = Adam(lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8)
    state = opt.init(deltas()[0])
    changes = deltas()
    for t, delta in enumerate(changes, start=1):
        step, state = opt.step(delta, state)
        assert int(state.count) == t
    for part in range(2):
        m = sum(0.1 * 0.9 ** (3 - t) * changes[t - 1][part] for t in (1, 2, 3))
        v = sum(0.001 * 0.999 ** (3 - t) * changes[t - 1][part] ** 2 for t in (1, 2, 3))
        expected = 0.1 * (m / (1 - 0.9 ** 3)) / ((v / (1 - 0.999 ** 3)).sqrt() + 1e-8)
        torch.testing.assert_close(step[part], expected, rtol=1e-12, atol=1e-14)
    first, _ = opt.step(changes[0], opt.init(changes[0]))   # the first step is lr·sign(Δ) up to ε
    assert all(math.isclose(float(a), 0.1 * float(torch.sign(d)), rel_tol=1e-6)
               for a, d in zip(first[0], changes[0][0], strict=True))
