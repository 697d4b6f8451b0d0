"""Example-level DP (`bayesadmm.privacy.example_level`): per-example gradients against autograd example by example,
the clipped and noised minibatch gradient, the cohort's private gradients against each client's, the per-client ε
against Opacus, and runs of DP-Adam and DP-IVON."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm.clients import SupervisedData
from bayesadmm.models import FlatModel
from bayesadmm.privacy import DPSettings
from bayesadmm.privacy.example_level import round_step
from bayesadmm.privacy.gradients import PrivateGradients, per_example_gradients
from bayesadmm.solvers.adam import LocalAdam

pytest.importorskip("opacus")


def _data(dtype=torch.float64):
    torch.manual_seed(0)
    model = FlatModel.from_module(nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).to(dtype))
    X = torch.randn(12, 4, dtype=dtype)
    return SupervisedData(model, X, torch.randint(0, 3, (12,))), model.initial_params(torch.Generator().manual_seed(1))


def _autograd_rows(data, theta, idx):
    """Each example's gradient of its cross-entropy, by autograd on the model's forward, one example at a time."""
    rows = []
    for i in idx.tolist():
        leaf = theta.detach().clone().requires_grad_(True)
        loss = nn.functional.cross_entropy(data.model.forward(leaf, data.X[i : i + 1]), data.y[i : i + 1])
        rows.append(torch.autograd.grad(loss, leaf)[0])
    return torch.stack(rows)


def test_per_example_gradients_are_each_examples_own():
    data, theta = _data()
    idx = torch.tensor([3, 0, 7, 11])
    assert torch.allclose(per_example_gradients(data, theta, idx), _autograd_rows(data, theta, idx), atol=1e-12)


def test_the_private_gradient_is_the_mean_of_clipped_gradients_plus_noise_over_the_batch():
    data, theta = _data()
    idx = torch.tensor([1, 2, 5, 8, 9])
    rows = _autograd_rows(data, theta, idx)
    clip = float(rows.norm(dim=1).median())  # about half the rows are clipped
    clipped = torch.stack([r * min(1.0, clip / r.norm().item()) for r in rows])
    assert (clipped.norm(dim=1) <= clip * (1 + 1e-12)).all()
    quiet = PrivateGradients(data, clip, 0.0, torch.Generator())
    assert torch.allclose(quiet.batch_grad(theta, idx), clipped.mean(dim=0), atol=1e-12)
    noisy = PrivateGradients(data, clip, 2.0, torch.Generator().manual_seed(4))  # the solve's noise stream
    z = torch.randn(theta.shape, generator=torch.Generator().manual_seed(4), dtype=theta.dtype) * 2.0 * clip
    assert torch.allclose(noisy.batch_grad(theta, idx), (clipped.sum(dim=0) + z) / 5, atol=1e-12)


def test_a_clients_epsilon_is_opacus_own_for_its_sampling_rate_and_steps():
    """N_k = 50, B = 8, 2 epochs: 7 steps a round at q = 8/50; 3 rounds are 21 steps."""
    from opacus.accountants import RDPAccountant

    (sigma, rate), steps = round_step(LocalAdam(batch_size=8, epochs=2), 50, 1.3)
    assert (sigma, rate, steps) == (1.3, 8 / 50, 14)
    accountant = RDPAccountant()
    for _ in range(3 * steps):
        accountant.step(noise_multiplier=1.3, sample_rate=8 / 50)
    from bayesadmm.privacy.accountant import epsilon

    assert epsilon([(sigma, rate)] * (3 * steps), 1e-5) == accountant.get_epsilon(delta=1e-5)


def _clients():
    torch.manual_seed(0)
    w = torch.randn(4, 3)
    parts = []
    for n in (20, 30, 40):
        X = torch.randn(n, 4)
        parts.append((X, (X @ w).argmax(dim=1)))
    return parts


ADAM = {"lr": 0.05, "epochs": 1, "batch_size": 8}
IVON = {**dict(bayesadmm.algorithms.spec.get("ivon-admm").example), "epochs": 1, "batch_size": 8}


def _run(out, method="fedavg", hparams=ADAM, **kwargs):
    torch.manual_seed(0)
    parts = _clients()
    return bayesadmm.run(
        nn.Linear(4, 3), parts, parts[0], algorithm=method, hparams=hparams, rounds=2, out=out, progress=False,
        eval_samples=2, **kwargs,
    )  # fmt: skip


def test_no_noise_and_a_large_clip_give_the_methods_own_run_up_to_rounding(tmp_path):
    """Per-example gradients summed are the minibatch gradient up to rounding, not to the bit."""
    plain = _run(tmp_path / "plain")
    private = _run(tmp_path / "dp", dp=DPSettings(level="example", clip=1e9, noise_multiplier=0.0))
    assert torch.allclose(private.posterior.mean, plain.posterior.mean, rtol=1e-4, atol=1e-5)
    assert private.history[-1]["dp_epsilon"] == math.inf


def test_a_noised_run_reports_the_largest_clients_epsilon(tmp_path):
    """The smallest client (20 examples, q = 8/20, 3 steps a round) spends the most."""
    from bayesadmm.privacy.accountant import epsilon

    result = _run(tmp_path / "dp", dp=DPSettings(level="example", clip=1.0, noise_multiplier=1.0))
    assert result.history[-1]["dp_epsilon"] == epsilon([(1.0, 8 / 20)] * 6, 1e-5)
    calibrated = _run(tmp_path / "eps", dp=DPSettings(level="example", clip=1.0, epsilon=4.0))
    assert calibrated.status == "completed" and calibrated.history[-1]["dp_epsilon"] <= 4.0


def test_methods_that_use_their_data_otherwise_refuse_example_level_dp(tmp_path):
    """FedEP's sites come from sampling the tilted distribution, not from gradient steps; IVON with two weight
    samples a step takes two gradients of each minibatch."""
    with pytest.raises(ValueError, match="example-level DP is available for the methods trained by Adam's or IVON's"):
        _run(tmp_path / "ep", method="fedep", hparams=dict(bayesadmm.algorithms.spec.get("fedep").example),
             dp=DPSettings(level="example", noise_multiplier=1.0))  # fmt: skip
    with pytest.raises(ValueError, match="set mc_samples=1"):
        _run(tmp_path / "mc", method="ivon-admm", hparams={**IVON, "mc_samples": 2},
             dp=DPSettings(level="example", noise_multiplier=1.0))  # fmt: skip
    assert not (tmp_path / "ep").exists() and not (tmp_path / "mc").exists()


def test_dp_ivon_without_noise_and_with_a_large_clip_is_ivon_admm_up_to_rounding(tmp_path):
    """IVON's Hessian estimate is the private gradient times its own weight noise: without noise and clipping the
    run is IVON-ADMM's."""
    plain = _run(tmp_path / "plain", "ivon-admm", IVON, cohort=1)
    private = _run(tmp_path / "dp", "ivon-admm", IVON, cohort=1,
                   dp=DPSettings(level="example", clip=1e9, noise_multiplier=0.0))  # fmt: skip
    assert torch.allclose(private.posterior.mean, plain.posterior.mean, rtol=1e-4, atol=1e-5)
    assert torch.allclose(private.posterior.precision, plain.posterior.precision, rtol=1e-4)
    noised = _run(tmp_path / "noised", "ivon-admm", IVON, dp=DPSettings(level="example", clip=1.0, epsilon=4.0))
    assert noised.status == "completed" and 0 < noised.history[-1]["dp_epsilon"] <= 4.0


def test_the_budget_stops_before_the_round_that_would_exceed_it_and_a_resume_goes_on_to_the_same_numbers(tmp_path):
    from bayesadmm.privacy.accountant import epsilon

    budget = (epsilon([(1.0, 0.4)] * 3, 1e-5) + epsilon([(1.0, 0.4)] * 6, 1e-5)) / 2  # the smallest client's rounds
    stopped = _run(tmp_path / "run", dp=DPSettings(level="example", clip=1.0, noise_multiplier=1.0, epsilon=budget))
    assert stopped.status == "budget" and stopped.round == 1
    resumed = _run(tmp_path / "run", resume=True, dp=DPSettings(level="example", clip=1.0, noise_multiplier=1.0))
    whole = _run(tmp_path / "whole", dp=DPSettings(level="example", clip=1.0, noise_multiplier=1.0))
    assert torch.equal(resumed.posterior.mean, whole.posterior.mean)
    assert [line["dp_epsilon"] for line in resumed.history] == [line["dp_epsilon"] for line in whole.history]


def test_a_run_with_example_level_dp_unlearns_a_client_as_the_method_does(tmp_path):
    """The server sums the clients' private replies exactly, so IVON-ADMM's unlearning applies to its state; the
    privacy ledger stays as it was."""
    dp = DPSettings(level="example", clip=1.0, noise_multiplier=1.0)
    result = _run(tmp_path / "dp", "ivon-admm", IVON, dp=dp)
    unlearned = bayesadmm.unlearn(result, 1)
    plain = _run(tmp_path / "plain", "ivon-admm", IVON).algorithm  # the method's own hook
    own = plain.unlearn(result.server.inner, 1, result.client_states([1])[1])
    assert torch.equal(unlearned.posterior.mean, plain.posterior(own).mean)
    assert not torch.equal(unlearned.posterior.mean, result.posterior.mean)
    assert unlearned.server.trained == result.server.trained


def test_poisson_minibatches_without_examples_give_the_noise_over_the_expected_size_alone_and_in_a_cohort():
    """A step whose Poisson minibatch drew nothing: (0 + z) / B. A cohort's private gradients, steps where every
    client, one client or none drew nothing included, are each client's own (its rows, its noise stream)."""
    from bayesadmm.privacy.gradients import PrivateCohortGradients
    from bayesadmm.solvers.cohort import StackedClients, plan_batches

    data, theta = _data()
    empty = torch.tensor([], dtype=torch.int64)
    noisy = PrivateGradients(data, 1.0, 2.0, torch.Generator().manual_seed(4), expected=3)
    z = torch.randn(theta.shape, generator=torch.Generator().manual_seed(4), dtype=theta.dtype) * 2.0
    assert torch.allclose(noisy.batch_grad(theta, empty), z / 3, atol=1e-12)

    halves = [SupervisedData(data.model, data.X[k * 6 : (k + 1) * 6], data.y[k * 6 : (k + 1) * 6]) for k in (0, 1)]
    stacked = StackedClients(data.model, data.likelihood, data.X, data.y, (0, 6), (6, 6), tuple(halves))
    plan = plan_batches(stacked, 1, 3, [torch.Generator().manual_seed(s) for s in (1, 2)], poisson=True)
    counts = plan.counts.T.tolist()  # (step, slot)
    assert [0, 0] in counts and any(0 in c and sum(c) > 0 for c in counts) and len(counts) == 18
    cohort = PrivateCohortGradients(1.0, 2.0, [torch.Generator().manual_seed(10 + k) for k in (0, 1)], batch_size=1)
    alone = [PrivateGradients(halves[k], 1.0, 2.0, torch.Generator().manual_seed(10 + k), expected=1) for k in (0, 1)]
    thetas = torch.stack([theta, theta + 0.1])[:, None]  # (2, 1, d) in the plan's order
    for t in range(18):
        got = cohort(stacked, plan, t, thetas[plan.order])[:, 0]
        for slot, k in enumerate(plan.order):
            idx = plan.rows[t, slot, : counts[t][slot]] - 6 * k
            assert torch.allclose(got[slot], alone[k].batch_grad(thetas[k, 0], idx), atol=1e-12)


def test_a_budgeted_run_records_its_noise_so_load_does_not_calibrate_it_again(tmp_path, monkeypatch):
    """config.json holds the noise multiplier the run used (calibrated to the budget: the largest client's, Opacus's
    for q = 8/20 and 3 steps a round over 2 rounds), so `bayesadmm.load` rebuilds the private method without the
    accountant's search."""
    import json

    from bayesadmm.privacy import accountant

    result = _run(tmp_path / "eps", dp=DPSettings(level="example", clip=1.0, epsilon=4.0))
    recorded = json.loads((tmp_path / "eps" / "config.json").read_text())["dp"]
    assert recorded["dp_epsilon"] == 4.0
    assert recorded["dp_noise"] == accountant.calibrated_noise(4.0, 1e-5, 8 / 20, 6, "rdp")
    assert result.history[-1]["dp_epsilon"] == accountant.epsilon([(recorded["dp_noise"], 8 / 20)] * 6, 1e-5)

    def refused(*args, **kwargs):
        raise AssertionError("load calibrated the noise again")

    monkeypatch.setattr(accountant, "calibrated_noise", refused)
    monkeypatch.setattr("bayesadmm.privacy.example_level.calibrated_noise", refused)
    loaded = bayesadmm.load(tmp_path / "eps", model=nn.Linear(4, 3))
    assert torch.equal(loaded.posterior.mean, result.posterior.mean)


def test_dp_ivon_tells_ivon_the_private_gradients_noise_variance_alone_and_in_a_cohort(tmp_path, monkeypatch):
    """The privatised gradient's noise has variance (σC/B)² per coordinate, B the expected minibatch size (a public
    number): `PrivateGradients` and `PrivateCohortGradients` report it, IVON's solve takes it into its update terms
    (optim/ivon.py, "Gradients with known noise"), and a noised run's numbers are the same alone and in a cohort up to
    rounding, and differ from those of IVON's uncorrected update."""
    from bayesadmm.privacy.gradients import PrivateCohortGradients
    from bayesadmm.solvers.ivon import IVONSolver
    from bayesadmm.solvers.von import VariationalProblem

    data, theta = _data()
    noisy = PrivateGradients(data, 0.5, 2.0, torch.Generator().manual_seed(4), expected=3)
    assert noisy.gradient_noise == (2.0 * 0.5 / 3) ** 2
    assert PrivateGradients(data, 0.5, 0.0, None, expected=3).gradient_noise is None
    cohort = PrivateCohortGradients(0.5, 2.0, [torch.Generator(), None], batch_size=8)
    assert cohort.gradient_noise(0, 5) == (2.0 * 0.5 / 5) ** 2 and cohort.gradient_noise(0, 50) == (1.0 / 8) ** 2
    assert cohort.gradient_noise(1, 50) is None

    from bayesadmm.families import DiagonalGaussian

    family = DiagonalGaussian(theta.numel())
    lam = family.from_moments(theta, torch.full_like(theta, 4.0))
    eta = (torch.zeros_like(theta), torch.zeros_like(theta))
    problem = VariationalProblem(family, lam, eta, 1.0, 1)
    solver = IVONSolver(lr=0.1, batch_size=3)
    setup = solver.setup(problem, noisy, torch.Generator().manual_seed(0))
    assert float(setup.terms.grad_noise) == pytest.approx((2.0 * 0.5 / 3) ** 2, rel=1e-15)
    assert solver.setup(problem, data, torch.Generator().manual_seed(0)).terms.grad_noise is None

    dp = DPSettings(level="example", clip=1.0, noise_multiplier=1.0)
    alone = _run(tmp_path / "alone", "ivon-admm", IVON, cohort=1, dp=dp)
    together = _run(tmp_path / "cohort", "ivon-admm", IVON, cohort=3, dp=dp)
    assert torch.allclose(together.posterior.mean, alone.posterior.mean, rtol=1e-4, atol=1e-5)
    assert torch.allclose(together.posterior.precision, alone.posterior.precision, rtol=1e-4)
    monkeypatch.setattr(PrivateGradients, "gradient_noise", property(lambda self: None))
    uncorrected = _run(tmp_path / "uncorrected", "ivon-admm", IVON, cohort=1, dp=dp)
    assert float(uncorrected.posterior.precision.sum()) > float(alone.posterior.precision.sum())
