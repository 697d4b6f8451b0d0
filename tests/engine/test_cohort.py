"""Cohort training (`engine.cohort.CohortClients`): a round's clients trained as one batched computation give the
per-client results (`LocalClients`, i.e. `train_client`) to 1e-10 in float64 and to rounding in float32, for every
registered method whose local solver batches (`base.batches`: it has `solve_cohort`), with clients of different sizes, several
epochs, partial participation and cohorts smaller than a round; on the CPU, and on a CUDA device where there is one
(`scripts/device_check.sh` runs them on a GPU machine)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bayesadmm.algorithms import get, names, specs
from bayesadmm.algorithms.base import batches, trains_in_cohorts
from bayesadmm.clients import SupervisedData, TensorClients
from bayesadmm.engine.cohort import CohortClients
from bayesadmm.engine.runners import LocalClients
from bayesadmm.federated import algorithm_factory
from bayesadmm.models import FlatModel
from bayesadmm.solvers.adam import LocalAdam, LocalAdamProx
from bayesadmm.solvers.ivon import IVONSolver

SIZES = {0: 24, 1: 13, 2: 5, 3: 24, 4: 17}  # full and partial minibatches, 1 to 3 per epoch
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _clients(dtype: torch.dtype, device: str = "cpu") -> tuple[FlatModel, dict[int, SupervisedData]]:
    gen = torch.Generator().manual_seed(0)
    centres = 3.0 * torch.randn(3, 4, generator=gen, dtype=dtype)
    model = FlatModel(_net)
    clients = {}
    for k, n in SIZES.items():
        y = torch.cat([torch.full((n // 2,), k % 3), torch.randint(0, 3, (n - n // 2,), generator=gen)])
        X = centres[y] + torch.randn(n, 4, generator=gen, dtype=dtype)
        clients[k] = SupervisedData(model, X.to(device), y.to(device))
    return model, clients


def _algorithm(name: str, model: FlatModel, extra: dict | None = None, rounds: int | None = None):
    """The method with its spec's toy hyperparameters (and `extra`), on 3 classes of 4 features."""
    return algorithm_factory(name, dict(get(name).example) | dict(extra or {}), model, SIZES, rounds=rounds)()


def _batched() -> list[str]:
    """The registered methods that the engine batches: those whose local solver has `solve_cohort`."""
    model, _ = _clients(torch.float64)
    return sorted(name for name in names() if trains_in_cohorts(_algorithm(name, model)))


# (fedavg, fedprox, feddyn, admm, ama, fedlap, ivon-admm, ivon-pvi: each must give its one-at-a-time results)
BATCHED = _batched()


def _flat(tree) -> list[torch.Tensor]:
    if torch.is_tensor(tree):
        return [tree]
    if isinstance(tree, dict):
        return [t for key in sorted(tree, key=str) for t in _flat(tree[key])]
    if isinstance(tree, (tuple, list)):
        return [t for item in tree for t in _flat(item)]
    return []


def _run(runner, algorithm, theta0, rounds):
    """`rounds` rounds (clients 0, 1, 2, 4 in round 2: partial participation); every round's replies."""
    server = algorithm.init_server(theta0)
    runner.start(server)
    history = []
    for r in range(1, rounds + 1):
        chosen = [4, 0, 2, 1] if r == 2 else sorted(SIZES)
        replies = runner.train(r, algorithm.broadcast(server), chosen)
        assert list(replies) == chosen
        history.append((replies, dict(runner.last_info)))
        server, _ = algorithm.server_update(server, replies)
    return server, runner.states(), history


@pytest.fixture(autouse=True)
def _eager():
    with torch.compiler.set_stance("force_eager"):
        yield


def test_the_methods_that_batch_are_the_adam_and_ivon_ones():
    """Every built-in method's client update is a LocalStep's, and it batches exactly where its local solver is Adam's
    (plain or proximal) or IVON's: a solver that gains `solve_cohort` must be added here, with its equality checked
    below. (A user's method may write client_update by hand: tests/algorithms/test_spec.py registers one.)"""
    model, _ = _clients(torch.float64)
    for name in (s.name for s in specs() if s.build.__module__.startswith("bayesadmm.")):
        local = _algorithm(name, model).local
        assert local is not None, f"{name} has no LocalStep"
        assert batches(local.solver) == isinstance(local.solver, (LocalAdam, LocalAdamProx, IVONSolver)), name
    assert BATCHED


@pytest.mark.parametrize("name", BATCHED)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("device", DEVICES)
def test_cohort_gives_the_per_client_results(name, dtype, device):
    model, clients = _clients(dtype, device)
    theta0 = model.initial_params(torch.Generator().manual_seed(1)).to(device, dtype)
    algorithm = _algorithm(name, model)
    sequential = _run(LocalClients(algorithm, clients, seed=3), algorithm, theta0, 3)
    batched = _run(CohortClients(algorithm, clients, seed=3, cohort_size=3), algorithm, theta0, 3)
    left, right = (
        _flat(sequential[:2]) + _flat([h[0] for h in sequential[2]]),
        _flat(batched[:2]) + _flat([h[0] for h in batched[2]]),
    )
    assert len(left) == len(right) and all(a.dtype == b.dtype == dtype for a, b in zip(left, right, strict=True))
    assert all(a.device == b.device == theta0.device for a, b in zip(left, right, strict=True) if a.dim() > 0)
    tol = 1e-10 if dtype == torch.float64 else 64 * torch.finfo(torch.float32).eps  # float32: a few roundings
    worst = max(float((a - b).abs().max() / (1 + a.abs().max())) for a, b in zip(left, right, strict=True))
    assert worst <= tol, f"{name}: cohort and per-client results differ by {worst:.3g} (relative)"
    assert [h[1] for h in sequential[2]] == [h[1] for h in batched[2]]  # the same info (steps) per client


@pytest.mark.parametrize(
    ("name", "extra", "cohort_size"),
    [
        ("ivon-admm", {"mc_samples": 2}, 2),
        ("ivon-admm", {"restart_at_q_g": True, "cosine": True, "epochs": 1}, 5),
        ("ivon-pvi", {"batch_size": 32}, 1),  # every client in one minibatch of its own size
        ("feddyn", {"weight_decay": 0.01}, 4),
        ("fedavg", {"weighted": True, "epochs": 3}, 5),
    ],
)
def test_cohort_gives_the_per_client_results_for_variants(name, extra, cohort_size):
    model, clients = _clients(torch.float64)
    theta0 = model.initial_params(torch.Generator().manual_seed(1))
    algorithm = _algorithm(name, model, extra, rounds=3)
    sequential = _run(LocalClients(algorithm, clients, seed=5), algorithm, theta0, 3)
    batched = _run(CohortClients(algorithm, clients, seed=5, cohort_size=cohort_size), algorithm, theta0, 3)
    for a, b in zip(_flat(sequential[:2]), _flat(batched[:2]), strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["fedavg", "admm", "ivon-admm"])
def test_an_example_private_cohort_gives_the_per_client_results(name):
    """Example-level DP in a cohort (`privacy.gradients.PrivateCohortGradients`): each client's per-example gradients
    clipped, its minibatch's sum noised from its own stream, as one client at a time; clients of different sizes."""
    pytest.importorskip("opacus")
    from bayesadmm.privacy import DPSettings, example_private

    model, clients = _clients(torch.float64)
    theta0 = model.initial_params(torch.Generator().manual_seed(1))
    dp = DPSettings(level="example", clip=0.5, noise_multiplier=1.0)
    algorithm = example_private(_algorithm(name, model, rounds=3), dp, 1.0, SIZES)
    sequential = _run(LocalClients(algorithm, clients, seed=5), algorithm, theta0, 3)
    batched = _run(CohortClients(algorithm, clients, seed=5, cohort_size=3), algorithm, theta0, 3)
    plain = _algorithm(name, model, rounds=3)
    quiet = _run(LocalClients(plain, clients, seed=5), plain, theta0, 3)
    for a, b in zip(_flat(sequential[:2]), _flat(batched[:2]), strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10)
    assert any(not torch.allclose(a, c) for a, c in zip(_flat(sequential[:2]), _flat(quiet[:2]), strict=True))


def test_methods_that_do_not_batch_keep_the_per_client_runner():
    model, clients = _clients(torch.float64)
    algorithm = _algorithm("fedlap-cov", model)
    with pytest.raises(ValueError, match="does not batch"):
        CohortClients(algorithm, clients, seed=0)
    source = TensorClients.from_parts(model, {k: (d.X, d.y) for k, d in clients.items()})
    from bayesadmm.engine.pool import client_runner

    assert type(client_runner(lambda: algorithm, source, 0, 1, algorithm, cohort_size=8)) is LocalClients


def test_cohort_reads_a_tensor_source_in_place():
    model, clients = _clients(torch.float64)
    source = TensorClients.from_parts(model, {k: (d.X, d.y) for k, d in clients.items()})
    from bayesadmm.engine.pool import client_runner

    algorithm = _algorithm("fedavg", model)
    runner = client_runner(lambda: algorithm, source, 0, 1, algorithm, cohort_size=2)
    assert isinstance(runner, CohortClients) and runner.rows.X.data_ptr() == source.X.data_ptr()
    theta0 = model.initial_params(torch.Generator().manual_seed(1))
    expected = _run(LocalClients(algorithm, {k: source(k) for k in SIZES}, seed=0), algorithm, theta0, 2)
    got = _run(runner, algorithm, theta0, 2)
    pairs = zip(_flat(expected[:2]), _flat(got[:2]), strict=True)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-10) for a, b in pairs)


def test_a_run_through_the_engine_with_cohorts_matches_the_per_client_run(tmp_path):
    """The engine's loop with a cohort runner (`run_federation(runner=...)`, checkpoints included): the metrics of
    the per-client run up to rounding."""
    import json

    from bayesadmm.engine import loop
    from bayesadmm.engine.pool import client_runner
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import resolve

    try:
        config, _ = resolve(
            "fmnist-heterog10",
            [
                "data_fraction=0.01",
                "clients=3",
                "epochs=1",
                "eval_samples=4",
                "method=fedavg",
                "rounds=2",
                "workers=1",
                f"out={tmp_path}",
            ],
        )
        built = build(config)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"FashionMNIST not available: {exc}")
    federation = built.federation

    def cohorts(algorithm, workers):
        return client_runner(
            federation.make_algorithm, federation.clients, built.settings.seed, workers, algorithm, cohort_size=2
        )

    def metrics(run_dir):
        return [
            {k: v for k, v in json.loads(line).items() if k not in ("seconds", "eval_seconds")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]

    with torch.compiler.set_stance("force_eager"):
        assert loop.run_federation(federation, built.settings, tmp_path / "a", progress=False).exit_code == 0
        assert (
            loop.run_federation(federation, built.settings, tmp_path / "b", progress=False, runner=cohorts).exit_code
            == 0
        )
    per_client, cohort = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert len(per_client) == len(cohort) == 2
    for a, b in zip(per_client, cohort, strict=True):
        assert a.keys() == b.keys()
        for key, value in a.items():
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
            else:
                assert b[key] == value, key


def test_automatic_cohorts_on_a_cpu_follow_the_solver_and_the_cores_and_elsewhere_each_workers_clients(monkeypatch):
    from bayesadmm.engine import cohort
    from bayesadmm.engine.cohort import DEFAULT_COHORT, automatic_cohort

    model, _ = _clients(torch.float64)
    fedavg, ivon = _algorithm("fedavg", model), _algorithm("ivon-admm", model)
    monkeypatch.setattr(cohort, "usable_cores", lambda: 2)
    assert automatic_cohort(10, 2, "cpu", fedavg) == automatic_cohort(10, 1, "cpu", fedavg) == 5  # not per worker
    assert automatic_cohort(1000, 2, "cpu", fedavg) == fedavg.local.solver.cpu_cohort == 16
    assert automatic_cohort(1000, 2, "cpu", ivon) == automatic_cohort(1000, 2, "cpu") == 1
    assert automatic_cohort(1000, 2, "cpu", _algorithm("fedpa", model)) == 1  # its client update does not batch
    # at partial participation, where a round's participants are batched: four model-sized rows a client within
    # COHORT_BYTES (the papers' MLP in float32: 5 clients), not at full participation (the size of earlier versions)
    mlp_row = 178_110 * 4
    assert automatic_cohort(100, 2, "cpu", fedavg, participation=0.1, row_bytes=mlp_row) == 5
    assert automatic_cohort(100, 2, "cpu", fedavg, participation=1.0, row_bytes=mlp_row) == 16
    assert automatic_cohort(100, 2, "cpu", fedavg, participation=0.1, row_bytes=8 * mlp_row) == 1
    assert automatic_cohort(100, 2, "cpu", fedavg, participation=0.1, row_bytes=4 * 64) == 16
    monkeypatch.setattr(cohort, "usable_cores", lambda: 16)
    assert automatic_cohort(10, 2, "cpu", fedavg) == 1
    assert automatic_cohort(10, 2, "cuda") == 5 and automatic_cohort(10, 1, "cuda:0") == 10
    assert automatic_cohort(1000, 1, "cuda") == DEFAULT_COHORT and automatic_cohort(1, 4, "cuda") == 1


def test_blocks_given_must_hold_each_client_once():
    model, clients = _clients(torch.float64)
    algorithm, ids = _algorithm("fedavg", model), sorted(clients)
    runner = CohortClients(algorithm, clients, 0, 2, blocks=[ids[:2], ids[2:4], ids[4:]])
    assert runner.blocks == [ids[:2], ids[2:4], ids[4:]]
    assert runner.units(ids) == [ids[:2], ids[2:4], ids[4:]]
    for bad in ([ids[:2], ids[2:4]], [ids[:2], ids[1:3], ids[3:]]):
        with pytest.raises(ValueError, match="each client once"):
            CohortClients(algorithm, clients, 0, 2, blocks=bad)


def test_a_rounds_participants_train_together_at_partial_participation():
    """At participation p the blocks hold about cohort_size / p clients, and a round's participants in a block train
    as cohorts of at most cohort_size (largest first): not one at a time in fixed cohorts of cohort_size. The results
    stay the per-client ones (to 1e-10 in float64), round by round, with every client's state."""
    model, clients = _clients(torch.float64)
    theta0 = model.initial_params(torch.Generator().manual_seed(1))
    for name in ("fedavg", "ivon-admm"):
        algorithm = _algorithm(name, model)
        runner = CohortClients(algorithm, clients, seed=3, cohort_size=2, participation=0.4)
        assert runner.blocks == [[0, 1, 2, 3, 4]]  # ⌈2 / 0.4⌉ = 5 clients a block
        assert runner.units([4, 0, 2, 1]) == [[0, 4], [1, 2]]  # sizes 24, 17 | 13, 5
        assert runner.units([2, 4]) == [[2, 4]]
        sequential = _run(LocalClients(algorithm, clients, seed=3), algorithm, theta0, 3)
        batched = _run(runner, algorithm, theta0, 3)
        left = _flat(sequential[:2]) + _flat([h[0] for h in sequential[2]])
        right = _flat(batched[:2]) + _flat([h[0] for h in batched[2]])
        worst = max(float((a - b).abs().max() / (1 + a.abs().max())) for a, b in zip(left, right, strict=True))
        assert worst <= 1e-10, f"{name}: per-round cohorts and per-client results differ by {worst:.3g}"


def _problem_sets(dim: int, dtype: torch.dtype) -> dict[str, list]:
    """Cohorts of AdamProblems whose extra terms take each of `ExtraTerms`' forms."""
    from bayesadmm.solvers.adam import AdamProblem

    gen = torch.Generator().manual_seed(7)
    vec = lambda scale=1.0: scale * torch.randn(dim, generator=gen, dtype=dtype)  # noqa: E731
    theta_g = vec(0.3)
    return {
        "none (FedAvg)": [AdamProblem(theta_g) for _ in range(3)],
        "one weight, one centre (FedProx)": [AdamProblem(theta_g, prox_weight=0.3, prox_center=theta_g)] * 3,
        "one weight, own linear terms (FedDyn)": [
            AdamProblem(theta_g, linear=vec(0.1), prox_weight=torch.tensor(0.3, dtype=dtype), prox_center=theta_g)
            for _ in range(3)
        ],
        "mixed": [
            AdamProblem(vec(0.3), linear=vec(0.1), prox_weight=vec().abs(), prox_center=vec(0.3)),
            AdamProblem(theta_g, prox_weight=0.7),
            AdamProblem(vec(0.3), linear=vec(0.1)),
        ],
    }


@pytest.mark.parametrize(
    "terms", ["none (FedAvg)", "one weight, one centre (FedProx)", "one weight, own linear terms (FedDyn)", "mixed"]
)
@pytest.mark.parametrize("weight_decay", [0.0, 0.02])
def test_adam_cohort_solves_each_clients_own_extra_terms(terms, weight_decay):
    from bayesadmm.solvers.adam import LocalAdam
    from bayesadmm.solvers.cohort import client_rows

    model, clients = _clients(torch.float64)
    ids = [0, 1, 4]
    dim = model.initial_params(torch.Generator().manual_seed(0)).numel()
    problems = _problem_sets(dim, torch.float64)[terms]
    adam = LocalAdam(lr=0.05, epochs=2, batch_size=8, weight_decay=weight_decay)
    sequential = [
        adam.solve_problem(p, clients[k], torch.Generator().manual_seed(k)) for p, k in zip(problems, ids, strict=True)
    ]
    rows = client_rows(clients)
    assert rows is not None
    batched = adam.solve_cohort(problems, rows.cohort(ids, clients), [torch.Generator().manual_seed(k) for k in ids])
    for (a, steps_a), (b, steps_b) in zip(sequential, batched, strict=True):
        assert steps_a == steps_b
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)
    assert not torch.equal(sequential[0][0], problems[0].theta0)  # trained


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("name", ["fedavg", "feddyn", "ivon-admm"])
def test_a_cuda_run_gives_the_cpu_numbers(name):
    """The same random numbers on any device (`bayesadmm.rng` draws on CPU generators), so in float64 a GPU's cohort
    round lands on the CPU's per-client numbers up to the devices' different roundings."""
    runs = {}
    for device in ("cpu", "cuda"):
        model, clients = _clients(torch.float64, device)
        theta0 = model.initial_params(torch.Generator().manual_seed(1)).to(device)
        algorithm = _algorithm(name, model)
        runner = (
            LocalClients(algorithm, clients, seed=3)
            if device == "cpu"
            else CohortClients(algorithm, clients, seed=3, cohort_size=3)
        )
        runs[device] = _flat(_run(runner, algorithm, theta0, 2)[:2])
    for a, b in zip(runs["cpu"], runs["cuda"], strict=True):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-8, atol=1e-8)
