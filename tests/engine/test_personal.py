"""Personalised posteriors: the seeded personal split, each method's personal posterior against closed forms,
the engine's per-client metrics against `bayesadmm.evaluate` on the client's split, seeded fine-tuning, and the
personalised `compare` table."""

import json

import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm.algorithms import bayes_admm, pvi
from bayesadmm.clients import SupervisedData
from bayesadmm.engine.personal import (
    FINETUNE,
    PERSONAL_EVALUATION,
    PERSONAL_SPLIT,
    held_out,
    split_personal,
    stream,
    summarise,
)
from bayesadmm.engine.simulate import generator_for, run_rounds
from bayesadmm.evaluation.personal_reports import personal_report
from bayesadmm.families import FullGaussian
from bayesadmm.problems import synthetic
from bayesadmm.solvers.von import ExactQuadratic

TIMING = ("seconds", "eval_seconds", "personal_seconds")


def _clients(sizes=(40, 31, 25), seed=0):
    g = torch.Generator().manual_seed(seed)

    def data(n):
        X = torch.randn(n, 4, generator=g)
        return X, (X[:, 0] > 0).long() + (X[:, 1] > 0).long()

    return [data(n) for n in sizes], data(50)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _run(method, tmp_path, name, **kwargs):
    clients, test = _clients()
    hparams = bayesadmm.algorithms.spec.get(method).example
    return bayesadmm.run(
        _model(), clients, test, algorithm=method, hparams=hparams, rounds=2, out=tmp_path / name, progress=False,
        eval_samples=4, **kwargs,
    )  # fmt: skip


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the split ------------------------------------------------------------------------------------------------------


def test_the_split_is_seeded_disjoint_and_holds_the_fraction_of_every_client():
    parts = {0: torch.arange(0, 50), 1: torch.arange(50, 57), 2: torch.arange(57, 58), 3: torch.arange(58, 158)}
    train, test = split_personal(parts, 0.2, generator_for(3, 0, PERSONAL_SPLIT))
    again = split_personal(parts, 0.2, generator_for(3, 0, PERSONAL_SPLIT))
    other = split_personal(parts, 0.2, generator_for(4, 0, PERSONAL_SPLIT))
    for k, rows in parts.items():
        assert sorted(train[k].tolist() + test[k].tolist()) == rows.tolist()  # disjoint, and together the client's
        assert len(test[k]) == {0: 10, 1: 1, 2: 0, 3: 20}[k]  # round(0.2 n), at least 1, a client keeps one row
        assert torch.equal(test[k], again[1][k]) and torch.equal(train[k], again[0][k])
    assert not torch.equal(test[3], other[1][3])
    assert held_out(10, 0.0) == 0 and held_out(1, 0.5) == 0 and held_out(2, 0.99) == 1
    with pytest.raises(ValueError, match="personal_split must be in"):
        split_personal(parts, 1.0, generator_for(3, 0, PERSONAL_SPLIT))


def test_personal_split_zero_is_the_run_without_it(tmp_path):
    plain = _run("fedavg", tmp_path, "plain")
    zero = _run("fedavg", tmp_path, "zero", personal_split=0.0)
    strip = [{k: v for k, v in line.items() if k not in TIMING} for line in plain.history]
    assert strip == [{k: v for k, v in line.items() if k not in TIMING} for line in zero.history]
    assert torch.equal(plain.posterior.mean, zero.posterior.mean)
    assert (tmp_path / "plain/config.json").read_text() == (tmp_path / "zero/config.json").read_text()
    assert not (tmp_path / "zero/personal.jsonl").exists()


def test_personal_split_zero_through_the_cli_changes_nothing_and_a_split_only_holds_rows_out(tmp_path):
    pytest.importorskip("sklearn")  # the diabetes set ships with scikit-learn
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import resolve

    small = ["method=fedavg", "rounds=1", "epochs=1", "workers=1"]
    plain, _ = resolve("diabetes-iid5", small)
    zero, _ = resolve("diabetes-iid5", [*small, "personal_split=0"])
    split, _ = resolve("diabetes-iid5", [*small, "personal_split=0.25"])
    assert plain.to_json() == zero.to_json() and "personal_split" not in zero.to_json()
    built_plain, built_zero, built_split = build(plain), build(zero), build(split)
    assert built_zero.federation.personal is None and not built_zero.personal_tests
    for a, b in ((built_plain, built_zero), (built_plain, built_split)):
        assert torch.equal(a.federation.theta0, b.federation.theta0)  # every other random choice as it was
        assert torch.equal(a.federation.eval_X, b.federation.eval_X)
    for k, rows in enumerate(built_plain.parts):
        held = built_split.personal_tests[k]
        assert sorted(built_split.parts[k].tolist() + held.tolist()) == sorted(rows.tolist())
        assert len(held) == held_out(len(rows), 0.25)
    source_zero, source_plain = built_zero.federation.clients, built_plain.federation.clients
    assert torch.equal(source_zero.X, source_plain.X) and source_zero.slices == source_plain.slices


# --- the hooks against closed forms -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bayes-admm", "pvi"])
def test_the_personal_posterior_of_a_conjugate_client_is_its_local_posterior(kind):
    """Bayesian linear regression, full Gaussian family, exact solves: after round 1 (η_k = 0, q_g = N(0, δ⁻¹I))
    client k's q_k ∝ q_g exp(−ℓ_k/ρ), i.e. precision δI + A_k/ρ and mean (δI + A_k/ρ)⁻¹ b_k/ρ (PVI: ρ = 1)."""
    losses = synthetic.ridge_clients(num_clients=3, per_client=12, dim=4, seed=2)
    delta, rho, family = 2.0, 0.5 if kind == "bayes-admm" else 1.0, FullGaussian(4)
    algorithm = (
        bayes_admm.make(family, ExactQuadratic(), rho=rho, delta=delta)
        if kind == "bayes-admm"
        else pvi.make(family, ExactQuadratic(), delta=delta)
    )
    server = algorithm.init_server(torch.zeros(4, dtype=torch.float64))
    before = algorithm.personal(server, algorithm.init_client(server, 0))
    assert torch.equal(before.mean, algorithm.posterior(server).mean)  # before a solve: the global posterior
    server, clients = run_rounds(algorithm, losses, torch.zeros(4, dtype=torch.float64), rounds=1)
    for k, loss in enumerate(losses):
        precision = delta * torch.eye(4, dtype=torch.float64) + loss.A / rho
        mean = torch.linalg.solve(precision, loss.b / rho)
        q_k = algorithm.personal(server, clients[k])
        torch.testing.assert_close(q_k.precision, precision, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(q_k.mean, mean, rtol=1e-10, atol=1e-10)


# --- the engine's per-client metrics --------------------------------------------------------------------------------


def _client_split(k, seed=0, fraction=0.2):
    clients, _ = _clients()
    bounds = torch.tensor([0] + [len(y) for _, y in clients]).cumsum(0).tolist()
    rows = {i: torch.arange(bounds[i], bounds[i + 1]) for i in range(len(clients))}
    train, test = split_personal(rows, fraction, generator_for(seed, 0, PERSONAL_SPLIT))
    X, y = torch.cat([X for X, _ in clients]), torch.cat([y for _, y in clients])
    return (X[train[k]], y[train[k]]), (X[test[k]], y[test[k]])


def test_the_engine_reports_each_clients_metrics_as_evaluate_gives_them(tmp_path):
    result = _run("ivon-admm", tmp_path, "ivon", personal_split=0.2, personal_every=1)
    lines = _lines(tmp_path / "ivon/personal.jsonl")
    assert [line["round"] for line in lines] == [1, 2]
    flat = bayesadmm.FlatModel.from_module(_model())
    for k in range(3):
        _, (X, y) = _client_split(k)
        reported = lines[-1]["clients"][str(k)]
        expected = bayesadmm.evaluate(flat, result.personal(k), X, y, 4, stream(0, 2, PERSONAL_EVALUATION, k))
        assert reported["examples"] == len(y) and reported["personal"] == pytest.approx(expected, rel=1e-6)
        expected = bayesadmm.evaluate(flat, result.posterior, X, y, 4, stream(0, 2, PERSONAL_EVALUATION, k))
        assert reported["global"] == pytest.approx(expected, rel=1e-6)
    assert result.history[-1]["personal_acc_mean"] == pytest.approx(
        sum(lines[-1]["clients"][str(k)]["personal"]["acc"] for k in range(3)) / 3
    )
    assert "ens_personal_nll_worst" in result.history[-1]
    assert result.history[-1] == {**result.history[-1], **summarise({k: v for k, v in lines[-1]["clients"].items()})}


def test_fine_tuning_is_seeded_and_is_what_the_engine_evaluated(tmp_path):
    result = _run("fedavg", tmp_path, "fedavg", personal_split=0.2, finetune_epochs=2)
    assert result.algorithm.personal is None
    with pytest.raises(ValueError, match="keeps no client posterior"):
        result.personal(0)
    flat = bayesadmm.FlatModel.from_module(_model())
    (X_train, y_train), (X, y) = _client_split(1)
    data = SupervisedData(flat, X_train, y_train)
    finetune = bayesadmm.engine.personal.FineTune(2)
    first, second = (result.personal(1, data, seed=0, finetune=finetune) for _ in range(2))
    assert torch.equal(first.mean, second.mean) and not torch.equal(first.mean, result.posterior.mean)
    other = result.personal(1, data, seed=1, finetune=finetune)
    assert not torch.equal(first.mean, other.mean)
    reported = _lines(tmp_path / "fedavg/personal.jsonl")[-1]["clients"]["1"]["personal"]
    assert reported == pytest.approx(bayesadmm.evaluate(flat, first, X, y), rel=1e-6)
    assert FINETUNE not in (PERSONAL_SPLIT, PERSONAL_EVALUATION)


def test_compare_makes_the_personalised_table(tmp_path):
    _run("fedavg", tmp_path, "runs/fedavg", personal_split=0.2)
    _run("ivon-admm", tmp_path, "runs/ivon-admm", personal_split=0.2)
    _run("fedprox", tmp_path, "runs/fedprox")  # no personal split: left out of the table
    text = personal_report([tmp_path / "runs"], tmp_path / "out")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "method" not in line]
    assert [row.split(" | ")[0] for row in rows] == ["| fedavg (m_g)", "| ivon-admm (m_g)", "| ivon-admm (predictive)"]
    assert all(" → " in cell for row in rows for cell in row.strip("| ").split(" | ")[3:])
    assert (tmp_path / "out/personal.md").exists() and (tmp_path / "out/personal.png").stat().st_size > 0


def test_a_resumed_run_writes_the_personal_lines_of_an_uninterrupted_one(tmp_path):
    whole = _run("fedavg", tmp_path, "whole", personal_split=0.2, personal_every=1)
    _run("fedavg", tmp_path, "parts", personal_split=0.2, personal_every=1, stop_at=1)
    resumed = _run("fedavg", tmp_path, "parts", personal_split=0.2, personal_every=1, resume=True)
    assert _lines(tmp_path / "parts/personal.jsonl") == _lines(tmp_path / "whole/personal.jsonl")
    assert resumed.history[-1]["personal_acc_mean"] == whole.history[-1]["personal_acc_mean"]


@pytest.mark.parametrize("method, lr, batch", [("fedavg", 0.05, 8), ("fedlap-func", 0.05, 8), ("fedpa", 1e-3, 32)])
def test_fine_tuning_takes_the_methods_own_adam_settings_or_the_defaults(method, lr, batch):
    from bayesadmm.algorithms.spec import Context, get

    flat = bayesadmm.FlatModel.from_module(nn.Linear(4, 3))
    spec = get(method)
    algorithm = spec.factory(spec.make_hparams(**spec.example), Context(flat.dim, flat, {0: 9, 1: 9}, None, 3))()
    solver = bayesadmm.FineTune(2).solver(algorithm)
    assert (solver.lr, solver.batch_size, solver.epochs) == (lr, batch, 2)
    assert bayesadmm.FineTune(2, lr=0.1, batch_size=4).solver(algorithm).lr == 0.1
    with pytest.raises(ValueError, match="finetune_epochs"):
        bayesadmm.FineTune(0)


def test_fedeps_personal_posterior_is_the_tilted_distribution_of_its_last_inference():
    """Gaussian sites p_k = N(m_k, P_k⁻¹), exact tilted inference, damping ½, prior N(0, 2⁻¹I): the sites after
    round 1 are ½(P_k m_k, P_k), so in round 2 client k's tilted p_k q_{−k} has precision
    2I + ½Σ_j P_j + ½P_k and precision-mean ½Σ_j P_j m_j + ½P_k m_k."""
    from bayesadmm.algorithms import fedep
    from bayesadmm.solvers.ep_inference import ExactGaussian, GaussianLikelihood

    g = torch.Generator().manual_seed(5)
    clients = []
    for _ in range(3):
        root = torch.randn(3, 3, generator=g, dtype=torch.float64)
        clients.append(GaussianLikelihood(torch.randn(3, generator=g, dtype=torch.float64),
                                          torch.linalg.inv(root @ root.T + torch.eye(3, dtype=torch.float64))))
    algorithm = fedep.make(FullGaussian(3), ExactGaussian(), damping=0.5, prior_precision=2.0)
    server, states = run_rounds(algorithm, clients, torch.zeros(3, dtype=torch.float64), rounds=2)
    P = [torch.linalg.inv(c.covariance) for c in clients]
    for k, client in enumerate(clients):
        precision = 2.0 * torch.eye(3, dtype=torch.float64) + 0.5 * sum(P) + 0.5 * P[k]
        h = 0.5 * sum(p @ c.mean for p, c in zip(P, clients, strict=True)) + 0.5 * P[k] @ client.mean
        q_k = algorithm.personal(server, states[k])
        torch.testing.assert_close(q_k.precision, precision, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(q_k.mean, torch.linalg.solve(precision, h), rtol=1e-10, atol=1e-10)
