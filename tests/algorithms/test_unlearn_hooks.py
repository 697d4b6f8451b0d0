"""The methods' unlearn hooks on conjugate Bayesian linear regression in float64.

The exact posterior of y_k = X_k θ + N(0, σ²), θ ~ N(0, δ⁻¹I) is computed here with plain linear algebra; every method
whose local solve is exact is run to its fixed point with all clients, client j is unlearned, and the result is
compared with (a) the closed-form posterior of the other clients' data and (b) the same method trained without
client j, to 1e-10. Methods whose terms are first-order (isotropic BayesADMM, FedLap) are checked to continue from the
unlearned state to the fixed point without client j.
"""

from dataclasses import dataclass

import pytest
import torch

from bayesadmm.algorithms import bayes_admm, bregman_admm, fedep, fedlap, fedlap_cov, fedsep, pvi
from bayesadmm.algorithms.base import Algorithm, PartlyInvalidRemoval
from bayesadmm.engine.simulate import generator_for, run_rounds
from bayesadmm.families import DiagonalGaussian, FullGaussian, IsotropicGaussian
from bayesadmm.problems.losses import QuadraticLoss
from bayesadmm.solvers.ep_inference import ExactGaussian, GaussianLikelihood
from bayesadmm.solvers.natural_optimizers import Momentum
from bayesadmm.solvers.von import ExactQuadratic

D, SIZES, NOISE, DELTA, GONE = 3, (6, 5, 7, 4), 0.5, 1.5, 2
DT = torch.float64


@dataclass(frozen=True)
class Regression:
    """One client's data: inputs X (n, D) and targets y (n,); the Gaussian noise is NOISE."""

    X: torch.Tensor
    y: torch.Tensor

    @property
    def num_examples(self) -> int:
        return self.y.shape[0]

    @property
    def A(self) -> torch.Tensor:  # the precision the client's likelihood adds: XᵀX / σ²
        return self.X.T @ self.X / NOISE**2

    @property
    def b(self) -> torch.Tensor:  # its natural mean: Xᵀy / σ²
        return self.X.T @ self.y / NOISE**2


def clients(diagonal_design: bool, seed: int = 0) -> dict[int, Regression]:
    """Random regression clients; with `diagonal_design` each row has one non-zero input, so XᵀX is diagonal and the
    exact posterior lies in the diagonal family."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(D, generator=g, dtype=DT)
    out = {}
    for k, n in enumerate(SIZES):
        X = torch.randn(n, D, generator=g, dtype=DT)
        if diagonal_design:
            X = X * torch.nn.functional.one_hot(torch.arange(n) % D, D).to(DT)
        out[k] = Regression(X, X @ theta + NOISE * torch.randn(n, generator=g, dtype=DT))
    return out


def exact(data: dict[int, Regression], delta: float = DELTA) -> tuple[torch.Tensor, torch.Tensor]:
    """The closed-form posterior (mean, precision) of the clients' data under the prior N(0, δ⁻¹I)."""
    P = delta * torch.eye(D, dtype=DT) + sum(c.A for c in data.values())
    return torch.linalg.solve(P, sum(c.b for c in data.values())), P


def without(data: dict, j: int = GONE) -> dict:
    return {k: c for k, c in data.items() if k != j}


def quadratic(data: dict[int, Regression]) -> dict[int, QuadraticLoss]:
    return {k: QuadraticLoss(c.A, c.b) for k, c in data.items()}


def sites(data: dict[int, Regression]) -> dict[int, GaussianLikelihood]:
    return {k: GaussianLikelihood(torch.linalg.solve(c.A, c.b), torch.linalg.inv(c.A)) for k, c in data.items()}


def proceed(alg: Algorithm, server, states: dict, data: dict, rounds: int, first: int):
    """`rounds` more rounds of full participation over `data`'s clients from (server, states)."""
    states = dict(states)
    for r in range(first, first + rounds):
        message = alg.broadcast(server)
        replies = {}
        for k in data:
            states[k], replies[k], _ = alg.client_update(states[k], message, data[k], generator_for(0, r, k))
        server, _ = alg.server_update(server, replies)
    return server, states


def moments(posterior) -> tuple[torch.Tensor, torch.Tensor]:
    precision = posterior.precision
    return posterior.mean, torch.diag(precision) if precision.dim() == 1 else precision


def assert_exact(posterior, mean, precision, atol=1e-10):
    m, P = moments(posterior)
    P = P if P.dim() == 2 else torch.diag(P)
    assert torch.allclose(m, mean, atol=atol, rtol=0), (m, mean)
    assert torch.allclose(P, precision, atol=atol, rtol=0), (P, precision)


# method name -> (factory of the algorithm for the given clients, diagonal design?, client data maker, rounds)
EXACT = {
    "bayes-admm full": (lambda ids: bayes_admm.make(FullGaussian(D), ExactQuadratic(), rho=0.5, delta=DELTA), False,
                        quadratic, 100),
    "bayes-admm diagonal": (lambda ids: bayes_admm.make(DiagonalGaussian(D), ExactQuadratic(), rho=0.5, delta=DELTA),
                            True, quadratic, 100),
    "bayes-admm diagonal running sum": (
        lambda ids: bayes_admm.make(DiagonalGaussian(D), ExactQuadratic(), rho=0.5, delta=DELTA, incremental=True),
        True, quadratic, 100),
    "pvi full": (lambda ids: pvi.make(FullGaussian(D), ExactQuadratic(), delta=DELTA, damping=0.5), False, quadratic,
                 80),
    "pvi diagonal": (lambda ids: pvi.make(DiagonalGaussian(D), ExactQuadratic(), delta=DELTA), True, quadratic, 80),
    "fedep full": (lambda ids: fedep.make(FullGaussian(D), ExactGaussian(), damping=0.5, prior_precision=DELTA,
                                          num_clients=len(ids)), False, sites, 80),
    "fedep diagonal": (lambda ids: fedep.make(DiagonalGaussian(D), ExactGaussian(), damping=1.0,
                                              prior_precision=DELTA, num_clients=len(ids)), True, sites, 20),
}  # fmt: skip


@pytest.mark.parametrize("method", sorted(EXACT))
def test_unlearning_is_exact_for_conjugate_models(method):
    make, diagonal, as_data, rounds = EXACT[method]
    data = clients(diagonal)
    local = as_data(data)
    alg = make(sorted(local))
    server, states = run_rounds(alg, local, torch.zeros(D, dtype=DT), rounds)
    assert_exact(alg.posterior(server), *exact(data))  # converged with every client

    unlearned = alg.unlearn(server, GONE, states[GONE])
    assert_exact(alg.posterior(unlearned), *exact(without(data)))  # (a) the closed form without client j
    alg_without = make(sorted(without(local)))
    retrained, _ = run_rounds(alg_without, without(local), torch.zeros(D, dtype=DT), rounds)
    m, P = moments(alg_without.posterior(retrained))
    assert_exact(alg.posterior(unlearned), m, P if P.dim() == 2 else torch.diag(P))  # (b) retrained without j

    # the others' states fit the unlearned server: training without client j goes on from a fixed point
    others = {k: s for k, s in states.items() if k != GONE}
    continued, _ = proceed(alg, unlearned, others, without(local), 3, rounds + 1)
    assert_exact(alg.posterior(continued), *exact(without(data)))


def test_isotropic_bayes_admm_continues_to_the_fixed_point_without_the_client():
    """The isotropic family's duals are first-order (its precision is fixed), so removing one is an approximation even
    for a quadratic loss; training on from it reaches the federation's fixed point without client j (the MAP)."""
    data = clients(False)
    local = quadratic(data)
    alg = bayes_admm.make(IsotropicGaussian(D, 20.0), ExactQuadratic(), rho=0.5, delta=DELTA)
    server, states = run_rounds(alg, local, torch.zeros(D, dtype=DT), 150)
    assert torch.allclose(alg.posterior(server).mean, exact(data)[0], atol=1e-10)
    unlearned = alg.unlearn(server, GONE, states[GONE])
    # δ m' = δ m − v_j: the posterior mean minus client j's dual over δ (c = δ/s, λ = s m)
    assert torch.allclose(alg.posterior(unlearned).mean, server.natural[0] / 20.0 - states[GONE].dual[0] / DELTA)
    others = {k: s for k, s in states.items() if k != GONE}
    continued, _ = proceed(alg, unlearned, others, without(local), 150, 151)
    assert torch.allclose(alg.posterior(continued).mean, exact(without(data))[0], atol=1e-10)


def weaker_on_first_weight(lam, dual):
    """λ_g with its first weight's precision cut to half of the dual's u_j (η_j = (v_j, −½u_j)), its mean kept: a
    server state far from a fixed point, where removing the dual leaves that weight no positive precision."""
    mean, precision = lam[0] / (-2 * lam[1]), -2 * lam[1].clone()
    precision[0] = -dual[1][0]  # ½ u_j
    return (precision * mean, -0.5 * precision)


@pytest.mark.parametrize("server", ["default", "incremental", "participants"])
def test_a_removal_left_invalid_on_some_weights_keeps_the_original_there_and_repair_rounds_reach_the_posterior(
    server,
):
    """Diagonal BayesADMM at its fixed point with a server state made weaker on one weight than client j's dual:
    the hook answers `PartlyInvalidRemoval` naming 1 of D weights, holding the state with λ_g kept on that weight
    and λ_g − η_j (c = 1) on the others; training on from it without client j reaches the closed-form posterior of
    the other clients' data. The full family, whose precision is one matrix, refuses outright."""
    data = clients(True)
    local = quadratic(data)
    options = {"default": {}, "incremental": {"incremental": True}, "participants": {"proximal": "participants"}}
    alg = bayes_admm.make(DiagonalGaussian(D), ExactQuadratic(), rho=0.5, delta=DELTA, **options[server])
    fixed, states = run_rounds(alg, local, torch.zeros(D, dtype=DT), 100)
    dual = states[GONE].dual
    weak = weaker_on_first_weight(fixed.natural, dual)
    with pytest.raises(PartlyInvalidRemoval, match=f"client {GONE}'s dual leaves 1 of {D} weights") as answer:
        alg.unlearn(fixed._replace(natural=weak), GONE, states[GONE])
    assert (answer.value.coordinates, answer.value.total) == (1, D)
    kept = answer.value.kept.natural
    for half in (0, 1):
        assert kept[half][0] == weak[half][0]  # the original's value, the client's term included
        assert torch.equal(kept[half][1:], weak[half][1:] - dual[half][1:])
    others = {k: s for k, s in states.items() if k != GONE}
    repaired, _ = proceed(alg, answer.value.kept, others, without(local), 200, 101)
    assert_exact(alg.posterior(repaired), *exact(without(data)))

    full = bayes_admm.make(FullGaussian(D), ExactQuadratic(), rho=0.5, delta=DELTA)
    fixed, states = run_rounds(full, local, torch.zeros(D, dtype=DT), 2)
    weak = (fixed.natural[0], fixed.natural[1] * 1e-6)
    with pytest.raises(ValueError, match=f"removing client {GONE}'s dual leaves no valid Gaussian") as answer:
        full.unlearn(fixed._replace(natural=weak), GONE, states[GONE])
    assert not isinstance(answer.value, PartlyInvalidRemoval)


@dataclass(frozen=True)
class ExactLaplace:
    """A test solver for the FedLap methods' client problem on `Regression` data, in closed form:
    argmin_w ℓ̄_k(w) + aᵀw + ½Σ b (w − c)² with ℓ̄_k the mean Gaussian NLL; FedLap-Cov's also returns the summed loss's
    diagonal Hessian diag(XᵀX)/σ² (its GGN, exact for a linear model)."""

    curvature: bool

    def solve_problem(self, problem, data: Regression, generator):
        n = data.num_examples
        weight = torch.as_tensor(problem.prox_weight, dtype=DT) * torch.ones(D, dtype=DT)
        lhs = data.A / n + torch.diag(weight)
        mean = torch.linalg.solve(lhs, data.b / n - problem.linear + weight * problem.prox_center)
        if not self.curvature:
            return mean, 1
        return fedlap_cov.LaplaceResult(mean, 1, torch.diagonal(data.A).clone())


def with_solver(alg: Algorithm, solver) -> Algorithm:
    return Algorithm.from_local(
        alg.name, alg.init_server, alg.init_client, alg.broadcast, alg.local._replace(solver=solver),
        alg.server_update, alg.posterior, unlearn=alg.unlearn,
    )  # fmt: skip


def test_fedlap_cov_unlearning_is_exact_where_its_laplace_sites_are():
    """Quadratic losses with diagonal Hessians: the Laplace sites are the likelihoods' exact Gaussian sites."""
    data = clients(True)
    make = lambda K: with_solver(fedlap_cov.make(delta=DELTA, lr=0.1, num_clients=K, rho=1.0), ExactLaplace(True))  # noqa: E731
    alg = make(len(data))
    server, states = run_rounds(alg, data, torch.zeros(D, dtype=DT), 60)
    assert_exact(alg.posterior(server), *exact(data))
    unlearned = alg.unlearn(server, GONE, states[GONE])
    assert_exact(alg.posterior(unlearned), *exact(without(data)))
    # retrained: FedLap-Cov numbers its clients 0..K−1, so the last one is left out here, the same client's data
    renumbered = {i: c for i, c in enumerate(without(data).values())}
    retrained, _ = run_rounds(make(len(renumbered)), renumbered, torch.zeros(D, dtype=DT), 60)
    assert_exact(alg.posterior(unlearned), retrained.mean, torch.diag(retrained.precision))
    others = {k: s for k, s in states.items() if k != GONE}
    continued, _ = proceed(alg, unlearned, others, without(data), 3, 61)
    assert_exact(alg.posterior(continued), *exact(without(data)))


def test_fedlap_continues_to_the_map_without_the_client():
    """FedLap's sites are first-order: its unlearned w_g = Σ_{k≠j} v_k is an approximation that training continues
    from, to the MAP (the posterior mean here) of the other clients' data."""
    data = clients(False)
    sizes = {k: c.num_examples for k, c in data.items()}
    delta = 30.0  # FedLap's proximal weight is the prior's precision: a strong prior converges in fewer rounds
    alg = with_solver(fedlap.make(delta=delta, lr=0.1, client_sizes=sizes), ExactLaplace(False))
    server, states = run_rounds(alg, data, torch.zeros(D, dtype=DT), 300)
    assert torch.allclose(alg.posterior(server).mean, exact(data, delta)[0], atol=1e-10)
    unlearned = alg.unlearn(server, GONE, states[GONE])
    total = sum(sizes[k] / delta * states[k].dual for k in data if k != GONE)  # Σ_{k≠j} (N_k/δ) ṽ_k
    assert torch.allclose(alg.posterior(unlearned).mean, total, atol=1e-12)
    others = {k: s for k, s in states.items() if k != GONE}
    continued, _ = proceed(alg, unlearned, others, without(data), 300, 301)
    assert torch.allclose(alg.posterior(continued).mean, exact(without(data), delta)[0], atol=1e-10)


def test_a_client_that_never_took_part_is_refused():
    data = clients(False)
    local = quadratic(data)
    for alg in (bayes_admm.make(FullGaussian(D), ExactQuadratic(), rho=0.5, delta=DELTA),
                pvi.make(FullGaussian(D), ExactQuadratic(), delta=DELTA)):  # fmt: skip
        server, states = run_rounds(alg, without(local), torch.zeros(D, dtype=DT), 2)
        fresh = alg.init_client(server, GONE)
        with pytest.raises(ValueError, match="never"):
            alg.unlearn(server, GONE, fresh)
    alg = fedep.make(FullGaussian(D), ExactGaussian(), num_clients=4, prior_precision=DELTA)
    server, _ = run_rounds(alg, without(sites(data)), torch.zeros(D, dtype=DT), 2)
    with pytest.raises(ValueError, match="never"):
        alg.unlearn(server, GONE, alg.init_client(server, GONE))


def test_fedep_with_a_momentum_server_and_fedsep_refuse():
    data = sites(clients(False))
    alg = fedep.make(FullGaussian(D), ExactGaussian(), num_clients=4, prior_precision=DELTA,
                     server_optimizer=Momentum(lr=1.0, beta=0.5))  # fmt: skip
    server, states = run_rounds(alg, data, torch.zeros(D, dtype=DT), 2)
    with pytest.raises(ValueError, match="identity optimizers"):
        alg.unlearn(server, GONE, states[GONE])
    # FedSEP's one shared factor is no client's own term; BregmanADMM's duals are not the clients' terms
    assert fedsep.make(FullGaussian(D), ExactGaussian(), num_clients=4).unlearn is None
    assert bregman_admm.make(FullGaussian(D), ExactQuadratic(), rho=0.5, delta=DELTA).unlearn is None


def test_the_built_in_methods_that_unlearn():
    """The registered methods whose server is a sum of per-client terms have the hook; the others refuse (None)."""
    from torch import nn

    from bayesadmm import Classification
    from bayesadmm.algorithms import make, spec
    from bayesadmm.models import FlatModel

    model = FlatModel.from_module(nn.Linear(4, 3))
    context = dict(dim=model.dim, model=model, client_sizes={0: 10, 1: 10}, likelihood=Classification(), rounds=5)
    built_in = [s for s in spec.specs() if s.build.__module__.startswith("bayesadmm.")]
    has_hook = {s.name for s in built_in if make(s.name, **context, **s.example).unlearn is not None}
    assert has_hook == {"bayes-admm-iso", "fedep", "fedlap", "fedlap-cov", "ivon-admm", "ivon-pvi"}
