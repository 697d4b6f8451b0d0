"""`bayesadmm.unlearn` on runs of `bayesadmm.run`: exact on conjugate linear regression (float64) against the
closed-form posterior and the run without the client, and its refusals."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm.algorithms import bayes_admm
from bayesadmm.engine.rundir import RunDirError, load_state
from bayesadmm.families import DiagonalGaussian, FullGaussian
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

    # written without client 1: read back with its removal, and resumed with the other two clients for a round more
    without = tmp_path / "without"
    bayesadmm.unlearn(out, 1, model=model, out=without, rounds=3)
    loaded = bayesadmm.load(without, model=model)
    assert loaded.unlearned == (1,) and torch.equal(loaded.posterior.mean, from_result.posterior.mean)
    assert sorted(loaded.client_states()) == [0, 2]
    resumed = bayesadmm.run(model, {0: parts[0], 2: parts[2]}, parts[0], algorithm="ivon-admm", hparams=hparams,
                            rounds=3, out=without, resume=True, progress=False, eval_samples=2)  # fmt: skip
    assert resumed.round == 3 and resumed.history[-1]["participants"] == 2


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


# ---- unlearn(..., out=DIR): a run directory without the client, which a resume continues ----------------------------


def exact_numpy(clients) -> tuple[np.ndarray, np.ndarray]:
    """The posterior (mean, precision) of the clients' data, by numpy's linear algebra (not the library's)."""
    Xs = [X.numpy() for X, _ in clients.values()]
    ys = [y.numpy()[:, 0] for _, y in clients.values()]
    precision = DELTA * np.eye(D) + sum(X.T @ X for X in Xs) / NOISE**2
    return np.linalg.solve(precision, sum(X.T @ y for X, y in zip(Xs, ys, strict=True)) / NOISE**2), precision


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_written_without_the_client_resumes_to_the_exact_posterior_of_the_others(tmp_path):
    """BayesADMM, full family, exact local solves: `unlearn(..., out=)` writes the run without client GONE; its
    repair rounds (`bayesadmm.run(..., resume=True)` with the other clients) keep the exact posterior of their data,
    and a resume with no round left gives the unlearned posterior bit for bit. The directory records the removal,
    holds no state of the client, and the original run directory is left as it was, byte for byte."""
    clients = data()
    rest = {k: c for k, c in clients.items() if k != GONE}
    mean, precision = exact_numpy(rest)
    result = run(clients, tmp_path / "all")
    original = files(tmp_path / "all")

    out = tmp_path / "without"
    written = bayesadmm.unlearn(result, GONE, out=out, rounds=ROUNDS + 4)
    assert (written.run_dir, written.status, written.round, written.unlearned) == (out, "stopped", ROUNDS, (GONE,))
    assert f"resume trains rounds {ROUNDS + 1} to {ROUNDS + 4} without client {GONE}" in written.message
    checkpoint = load_state(out / "checkpoint.pt")
    assert checkpoint["round"] == ROUNDS and sorted(checkpoint["clients"]) == [0, 2, 3]
    assert GONE not in checkpoint["server"].replies
    assert checkpoint["run"]["data"]["sizes"] == {"0": 6, "2": 7, "3": 4}
    assert checkpoint["run"]["data"]["unlearned"] == [GONE] and "sha256" not in checkpoint["run"]["data"]
    config = json.loads((out / "config.json").read_text())
    assert config["unlearned"] == [GONE] and config["clients"] == {"0": 6, "2": 7, "3": 4}
    assert config["settings"]["rounds"] == config["run"]["settings"]["rounds"] == ROUNDS + 4
    assert json.loads((out / "status.json").read_text())["status"] == "stopped"
    assert (out / "metrics.jsonl").read_bytes() == original["metrics.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all", "without"]  # no partial folder left beside it

    with pytest.raises(RunDirError, match=f"client {GONE} was unlearned from the run in .*without that client's data"):
        run(clients, out, rounds=ROUNDS + 4, resume=True)
    edited = {**rest, 0: (rest[0][0], rest[0][1] + 1.0)}  # the same sizes, other values of client 0
    with pytest.raises(RunDirError, match="client 0's examples differ from those .*sha256"):
        run(edited, out, rounds=ROUNDS + 4, resume=True)
    repaired = run(rest, out, rounds=ROUNDS + 4, resume=True)
    assert repaired.status == "completed" and [line["round"] for line in repaired.history] == list(range(1, 105))
    assert all(line["participants"] == 3 for line in repaired.history[ROUNDS:])
    np.testing.assert_allclose(repaired.posterior.mean.numpy(), mean, atol=1e-10, rtol=0)
    np.testing.assert_allclose(repaired.posterior.precision.numpy(), precision, atol=1e-10, rtol=0)
    later = load_state(out / "checkpoint.pt")
    assert later["round"] == ROUNDS + 4 and later["run"]["data"]["unlearned"] == [GONE]  # still recorded

    # no round left (the run's own rounds): the resume gives the unlearned posterior itself
    zero = bayesadmm.unlearn(result, GONE, out=tmp_path / "zero")
    resumed = run(rest, tmp_path / "zero", resume=True)
    assert resumed.round == ROUNDS and torch.equal(resumed.posterior.mean, zero.posterior.mean)
    assert torch.equal(resumed.posterior.precision, zero.posterior.precision)
    np.testing.assert_allclose(zero.posterior.mean.numpy(), mean, atol=1e-10, rtol=0)
    assert files(tmp_path / "all") == original


def diagonal_data() -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """`data()` with one non-zero input per row: XᵀX is diagonal, so the exact posterior is in the diagonal family."""
    return {k: (X * nn.functional.one_hot(torch.arange(len(X)) % D, D).to(DT), y) for k, (X, y) in data().items()}


def test_a_removal_left_invalid_on_a_weight_is_refused_naming_it_or_kept_there_when_asked(tmp_path):
    """Diagonal BayesADMM at its fixed point, its server made weaker on the first weight than client GONE's dual (as
    far from a fixed point on a network): `unlearn` refuses naming 1 of 3 weights and `keep_invalid=True`; with it,
    that weight keeps the original's value, the others lose the dual (c = 1), the message and the directory's status
    say so, and repair rounds reach the closed-form posterior of the other clients' data (numpy)."""
    clients = diagonal_data()
    rest = {k: c for k, c in clients.items() if k != GONE}
    mean, precision = exact_numpy(rest)
    diagonal = bayes_admm.make(DiagonalGaussian(D), ExactLinearGaussian(), rho=0.5, delta=DELTA)
    result = run(clients, tmp_path / "all", algorithm=diagonal)
    dual = result.client_states([GONE])[GONE].dual
    s = -2 * result.server.natural[1]
    m = result.server.natural[0] / s
    s[0] = -dual[1][0]  # half the dual's precision u_j (η_j = (v_j, −½u_j))
    weak = dataclasses.replace(result, server=result.server._replace(natural=(s * m, -0.5 * s)))
    with pytest.raises(bayesadmm.UnlearningError, match=f"leaves 1 of {D} weights without a positive .*keep_invalid"):
        bayesadmm.unlearn(weak, GONE)
    with pytest.raises(TypeError, match="keep_invalid must be True or False"):
        bayesadmm.unlearn(weak, GONE, keep_invalid="yes")

    out = tmp_path / "without"
    kept = bayesadmm.unlearn(weak, GONE, keep_invalid=True, out=out, rounds=ROUNDS + 200)
    assert f"the original's value kept on 1 of {D} weights" in kept.message
    assert f"kept on 1 of {D} weights" in json.loads((out / "status.json").read_text())["message"]
    natural = kept.posterior.natural
    assert natural[0][0] == s[0] * m[0] and natural[1][0] == -0.5 * s[0]
    assert torch.equal(natural[0][1:], (s * m - dual[0])[1:]) and torch.equal(natural[1][1:], (-0.5 * s - dual[1])[1:])
    repaired = run(rest, out, algorithm=diagonal, rounds=ROUNDS + 200, resume=True)
    np.testing.assert_allclose(repaired.posterior.mean.numpy(), mean, atol=1e-10, rtol=0)
    np.testing.assert_allclose(repaired.posterior.precision.numpy(), np.diag(precision), atol=1e-10, rtol=0)
    assert np.count_nonzero(precision - np.diag(np.diag(precision))) == 0  # the exact posterior is diagonal


def test_writing_a_run_without_the_client_is_refused_before_anything_is_written(tmp_path):
    clients = data()
    result = run(clients, tmp_path / "all", rounds=2)
    full = tmp_path / "full"
    full.mkdir()
    (full / "note.txt").write_text("mine")
    with pytest.raises(bayesadmm.UnlearningError, match="is not empty; give a new or empty folder"):
        bayesadmm.unlearn(result, GONE, out=full)
    with pytest.raises(bayesadmm.UnlearningError, match="is the run's own directory or inside it"):
        bayesadmm.unlearn(result, GONE, out=tmp_path / "all")
    with pytest.raises(bayesadmm.UnlearningError, match="is the run's own directory or inside it"):
        bayesadmm.unlearn(result, GONE, out=tmp_path / "all" / "without")
    with pytest.raises(bayesadmm.UnlearningError, match="rounds= must be an int of at least the unlearned round 2"):
        bayesadmm.unlearn(result, GONE, out=tmp_path / "few", rounds=1)
    with pytest.raises(bayesadmm.UnlearningError, match="rounds= is the number of rounds of the run written to out="):
        bayesadmm.unlearn(result, GONE, rounds=5)
    fedavg = run(clients, tmp_path / "fedavg", algorithm="fedavg", hparams={"lr": 0.01, "epochs": 1}, rounds=1)
    with pytest.raises(bayesadmm.UnlearningError, match="fedavg keeps no per-client term"):
        bayesadmm.unlearn(fedavg, 0, out=tmp_path / "fedavg-without")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all", "fedavg", "full"]  # nothing written
    assert [p.name for p in full.iterdir()] == ["note.txt"]


def test_a_scenario_run_without_a_client_resumes_on_the_command_line(tmp_path, capsys):
    """`bayesadmm run diabetes-iid5` → `bayesadmm unlearn DIR 2 --out ... --rounds 4` → `bayesadmm resume`: rounds 3
    and 4 train the four other clients (config.json's exclude_client), from the checkpoint of round 2; the command's
    refusals are one line and exit 2, and a second client is refused (a scenario leaves out one)."""
    pytest.importorskip("sklearn")
    from bayesadmm.cli import main

    source, out = tmp_path / "all", tmp_path / "without"
    args = ["method=ivon-admm", "rounds=2", "epochs=1", "eval_samples=2", "workers=1", "--quiet"]
    assert main(["run", "diabetes-iid5", f"out={source}", *args]) == 0
    original = files(source)
    capsys.readouterr()
    for bad, message in (
        (["7"], "client 7 is not a client of the run"),
        (["2", "--rounds", "1"], "rounds= must be an int of at least the unlearned round 2"),
        (["2", "--out", str(source)], "run's own directory"),
    ):
        where = [] if "--out" in bad else ["--out", str(out)]
        assert main(["unlearn", str(source), *bad, *where]) == 2
        err = capsys.readouterr().err
        assert err.startswith("bayesadmm: ") and message in err and err.count("\n") == 1, err
        assert not out.exists()
    assert main(["unlearn", str(source), "2", "--out", str(out), "--rounds", "4"]) == 0
    printed = capsys.readouterr().out
    assert f"client 2 unlearned from round 2 of {source}" in printed and f"bayesadmm resume {out}" in printed
    assert bayesadmm.load(out).unlearned == (2,)
    config = json.loads((out / "config.json").read_text())
    assert (config["exclude_client"], config["unlearned"], config["rounds"], config["out"]) == (2, [2], 4, str(out))
    assert sorted(load_state(out / "checkpoint.pt")["clients"]) == [0, 1, 3, 4]
    assert main(["resume", str(out), "--quiet"]) == 0, capsys.readouterr().err
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [1, 2, 3, 4]
    assert [line["participants"] for line in lines] == [5, 5, 4, 4]
    checkpoint = load_state(out / "checkpoint.pt")
    assert checkpoint["round"] == 4 and sorted(checkpoint["clients"]) == [0, 1, 3, 4]
    assert sorted(checkpoint["run"]["data"]["sizes"]) == ["0", "1", "3", "4"]
    assert json.loads((out / "status.json").read_text())["status"] == "completed"
    assert bayesadmm.load(out).unlearned == (2,)  # config.json's record
    with pytest.raises(bayesadmm.UnlearningError, match="leaves out one client .* clients 2, 3"):
        bayesadmm.unlearn(out, 3, out=tmp_path / "without-two")
    assert not (tmp_path / "without-two").exists() and files(source) == original


def test_clients_are_removed_one_after_the_other_into_new_directories(tmp_path, monkeypatch):
    """A run written without client GONE is unlearned again into another directory: both removals are recorded and
    neither client's state is kept. A write that fails leaves no directory, nor a partial one beside it."""
    from bayesadmm.posterior import unlearned_run

    result = run(data(), tmp_path / "all", rounds=2)
    first = bayesadmm.unlearn(result, GONE, out=tmp_path / "one")
    second = bayesadmm.unlearn(first, 3, out=tmp_path / "two")
    assert second.unlearned == (GONE, 3) and second.run_dir == tmp_path / "two"
    config = json.loads((tmp_path / "two" / "config.json").read_text())
    assert config["unlearned"] == [GONE, 3] and config["clients"] == {"0": 6, "2": 7}
    checkpoint = load_state(tmp_path / "two" / "checkpoint.pt")
    assert sorted(checkpoint["clients"]) == [0, 2] and checkpoint["run"]["data"]["unlearned"] == [GONE, 3]

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(unlearned_run, "save_checkpoint", full_disk)
    with pytest.raises(bayesadmm.UnlearningError, match="cannot write the run without client 1 to .*No space left"):
        bayesadmm.unlearn(result, GONE, out=tmp_path / "three")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all", "one", "two"]


def test_only_runs_a_resume_can_rebuild_without_the_client_are_written():
    """A Flower run's config.json (its run config) says nothing a resume could leave the client out by."""
    from bayesadmm.posterior.unlearned_run import OutError, config_without

    with pytest.raises(OutError, match="out= writes runs of bayesadmm.run and of `bayesadmm run SCENARIO`"):
        config_without({"flower": {"model": "m:f"}, "clients": {"0": 3}}, (0,), None, Path("out"))


def test_a_run_with_example_level_dp_is_unlearned_but_not_written_without_the_client(tmp_path):
    """Its accountant counts each client's rounds in the federation that drew them, which a resume without the client
    would not match: `out=` is refused before anything is written; the unlearned Result is still given."""
    pytest.importorskip("opacus")
    torch.manual_seed(0)
    parts = [(X, (X @ torch.ones(4, 3)).argmax(dim=1)) for X in torch.randn(3, 40, 4)]
    hparams = dict(lr=0.05, hess_init=0.1, epochs=1, rho=0.5, gamma=0.5, delta=1.0)
    dp = bayesadmm.DPSettings(level="example", clip=1.0, noise_multiplier=1.0)
    result = bayesadmm.run(nn.Linear(4, 3), parts, parts[0], algorithm="ivon-admm", hparams=hparams, rounds=1, dp=dp,
                           out=tmp_path / "dp", progress=False, eval_samples=2)  # fmt: skip
    with pytest.raises(bayesadmm.UnlearningError, match="a run with example-level DP: its accountant counts"):
        bayesadmm.unlearn(result, 1, out=tmp_path / "without")
    assert not (tmp_path / "without").exists()
    assert bayesadmm.unlearn(result, 1).unlearned == (1,)
