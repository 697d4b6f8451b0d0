"""`bayesadmm.unlearn` on runs of `bayesadmm.run`: exact on conjugate linear regression (float64) against the
closed-form posterior and the run without the client, and its refusals."""

import dataclasses

import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm.algorithms import bayes_admm
from bayesadmm.families import FullGaussian
from bayesadmm.problems.losses import QuadraticLoss
from bayesadmm.solvers.von import ExactQuadratic, VariationalSolver

D, SIZES, NOISE, DELTA, GONE, ROUNDS = 3, (6, 5, 7, 4), 0.5, 1.5, 1, 100
DT = torch.float64


class ExactLinearGaussian(VariationalSolver):
    """BayesADMM's client problem solved in closed form for a client's `SupervisedData` of a linear model with a
    Gaussian likelihood: its summed NLL is the quadratic ½θᵀ(XᵀX/σ²)θ − (Xᵀy/σ²)ᵀθ + const (`ExactQuadratic`)."""

    def solve(self, family, data, lam_g, eta, rho, generator=None, init=None, round_=1):
        X, y, variance = data.X, data.y.reshape(-1), data.likelihood.noise**2
        return ExactQuadratic().solve(family, QuadraticLoss(X.T @ X / variance, X.T @ y / variance), lam_g, eta, rho)


def data() -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(D, generator=g, dtype=DT)
    out = {}
    for k, n in enumerate(SIZES):
        X = torch.randn(n, D, generator=g, dtype=DT)
        out[k] = (X, (X @ theta + NOISE * torch.randn(n, generator=g, dtype=DT)).unsqueeze(1))
    return out


def exact(clients) -> tuple[torch.Tensor, torch.Tensor]:
    """The posterior (mean, precision) of the clients' data, by linear algebra."""
    P = DELTA * torch.eye(D, dtype=DT) + sum(X.T @ X for X, _ in clients.values()) / NOISE**2
    return torch.linalg.solve(P, sum(X.T @ y[:, 0] for X, y in clients.values()) / NOISE**2), P


def run(clients, out, algorithm=None, **kwargs):
    torch.manual_seed(0)
    model = nn.Linear(D, 1, bias=False).to(DT)
    algorithm = algorithm or bayes_admm.make(FullGaussian(D), ExactLinearGaussian(), rho=0.5, delta=DELTA)
    test = data()[0]
    kwargs = {"rounds": ROUNDS, "likelihood": bayesadmm.GaussianRegression(NOISE), **kwargs}
    return bayesadmm.run(model, clients, test, algorithm=algorithm, out=out, progress=False, eval_samples=2, **kwargs)


def test_unlearned_run_equals_the_closed_form_and_the_run_without_the_client(tmp_path):
    clients = data()
    result = run(clients, tmp_path / "all")
    unlearned = bayesadmm.unlearn(result, GONE)
    rest = {k: c for k, c in clients.items() if k != GONE}
    mean, precision = exact(rest)
    assert torch.allclose(unlearned.posterior.mean, mean, atol=1e-10, rtol=0)
    assert torch.allclose(unlearned.posterior.precision, precision, atol=1e-10, rtol=0)
    retrained = run(rest, tmp_path / "without")  # the same ids, without client GONE
    assert torch.allclose(unlearned.posterior.mean, retrained.posterior.mean, atol=1e-10, rtol=0)
    assert torch.allclose(unlearned.posterior.precision, retrained.posterior.precision, atol=1e-10, rtol=0)
    # nothing else changes; the original result is untouched
    assert (unlearned.round, unlearned.status, unlearned.run_dir) == (result.round, result.status, result.run_dir)
    assert unlearned.history == result.history and f"client {GONE} unlearned" in unlearned.message
    assert torch.allclose(result.posterior.precision, exact(clients)[1], atol=1e-10, rtol=0)
    # client by client: a second client goes too, and none twice
    both = bayesadmm.unlearn(unlearned, 3)
    assert both.unlearned == (GONE, 3) and f"clients {GONE}, 3 unlearned" in both.message
    assert torch.allclose(both.posterior.mean, exact({k: clients[k] for k in (0, 2)})[0], atol=1e-10, rtol=0)
    with pytest.raises(bayesadmm.UnlearningError, match="already unlearned"):
        bayesadmm.unlearn(both, GONE)


def test_refusals(tmp_path):
    clients = data()
    fedavg = run(clients, tmp_path / "fedavg", algorithm="fedavg", hparams={"lr": 0.01, "epochs": 1}, rounds=1)
    with pytest.raises(bayesadmm.UnlearningError, match="fedavg keeps no per-client term.*retrain"):
        bayesadmm.unlearn(fedavg, 0)
    result = run(clients, tmp_path / "partial", rounds=1, participation=0.5)
    absent = sorted(set(clients) - set(result.server.replies))[0]
    with pytest.raises(bayesadmm.UnlearningError, match=f"client {absent} never"):
        bayesadmm.unlearn(result, absent)
    with pytest.raises(bayesadmm.UnlearningError, match="client 99 is not a client"):
        bayesadmm.unlearn(result, 99)
    with pytest.raises(bayesadmm.UnlearningError, match="client_id must be an int"):
        bayesadmm.unlearn(result, "1")
    with pytest.raises(bayesadmm.UnlearningError, match="server state is of round 1 but"):
        bayesadmm.unlearn(dataclasses.replace(result, round=0), 0)  # as after a divergence between checkpoints
    with pytest.raises(TypeError, match="Result or a run directory"):
        bayesadmm.unlearn(3.0, 1)


def test_the_exclude_client_key_leaves_one_client_out():
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import ConfigError, resolve

    config, _ = resolve("diabetes-iid5", ["exclude_client=2"])
    assert config.to_json()["exclude_client"] == 2
    assert "exclude_client" not in resolve("diabetes-iid5", [])[0].to_json()  # earlier runs' config.json unchanged
    sizes = build(config).federation.clients.sizes
    assert sorted(sizes) == [0, 1, 3, 4]
    assert sizes == {k: n for k, n in build(resolve("diabetes-iid5", [])[0]).federation.clients.sizes.items() if k != 2}
    with pytest.raises(ConfigError, match="exclude_client=7"):
        build(resolve("diabetes-iid5", ["exclude_client=7"])[0])


@pytest.mark.parametrize("method", ["fedlap-cov", "fedep", "fedsep"])
def test_methods_that_count_their_clients_take_a_scenario_without_one(method):
    """The ids after the left-out client keep their sizes (FedEP's initial sites, FedSEP's shares, FedLap-Cov's ids)."""
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import resolve

    alpha = ["alpha=0.01"] if method == "fedep" else []  # set here, not the preset's: the site below is written with it
    built = build(resolve("diabetes-iid5", [f"method={method}", "exclude_client=2", *alpha])[0])
    algorithm, sizes = built.algorithm(), built.federation.clients.sizes
    state = algorithm.init_client(algorithm.init_server(built.federation.theta0), 4)
    if method == "fedep":  # the initial site N(θ_0, (α n_4 I)⁻¹), α = 0.01
        assert torch.allclose(-2 * state.site[1], torch.full_like(state.site[1], 0.01 * sizes[4]))
    if method == "fedsep":
        assert state.fraction == sizes[4] / sum(sizes.values())


def test_a_run_directory_is_unlearned_as_its_result(tmp_path):
    """`unlearn(run_dir, k, model=...)` reads the run with `bayesadmm.load` and gives the posterior `unlearn(result, k)`
    gives, bit for bit; the posterior's provenance names the client removed."""
    torch.manual_seed(0)
    w = torch.randn(4, 3)
    parts = []
    for _ in range(3):
        X = torch.randn(40, 4)
        parts.append((X, (X @ w).argmax(dim=1)))
    model = nn.Linear(4, 3)
    hparams = dict(lr=0.05, hess_init=0.1, epochs=1, rho=0.5, gamma=0.5, delta=1.0)
    out = tmp_path / "ivon"
    result = bayesadmm.run(model, parts, parts[0], algorithm="ivon-admm", hparams=hparams, rounds=2, out=out,
                           progress=False, eval_samples=2)  # fmt: skip
    from_result = bayesadmm.unlearn(result, 1)
    from_dir = bayesadmm.unlearn(out, 1, model=model)
    assert torch.equal(from_dir.posterior.mean, from_result.posterior.mean)
    assert torch.equal(from_dir.posterior.precision, from_result.posterior.precision)
    assert from_dir.posterior.provenance["unlearned"] == [1]
    with pytest.raises(ValueError, match="model="):
        bayesadmm.unlearn(out, 1)


def test_a_result_whose_run_directory_moved_on_refuses_rather_than_mix_rounds(tmp_path):
    """A Result of round 2 whose run was resumed to round 4 since: its server is round 2's, the directory's client
    states round 4's; unlearn and personal refuse, naming the round the directory holds and how to read it."""
    clients, out = data(), tmp_path / "r"
    early = run(clients, out, rounds=4, stop_at=2)
    assert early.status == "stopped" and early.round == 2
    late = run(clients, out, rounds=4, resume=True)
    assert late.round == 4
    stale = f"this Result is of round 2; {out} now holds round 4: bayesadmm.load"
    with pytest.raises(bayesadmm.UnlearningError, match=stale):
        bayesadmm.unlearn(early, GONE)
    with pytest.raises(ValueError, match=stale):
        early.personal(GONE)
    with pytest.raises(ValueError, match=stale):
        early.client_states()
    assert torch.equal(early.posterior.mean, early.algorithm.posterior(early.server).mean)  # its own round's
    assert bayesadmm.unlearn(late, GONE).round == 4  # the current Result unlearns as before
