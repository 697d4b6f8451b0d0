"""Client-level DP (`bayesadmm.privacy`): the mechanism's noise and clipping bound, ε against Opacus's own
computation, σ = 0 against the method's own run bit for bit, and the budget's stop and resume."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm.algorithms.client_update import ClientUpdate
from bayesadmm.privacy import DPSettings, clip_factor, noised_sum, privatize, sampling_rate
from bayesadmm.privacy.accountant import calibrated_noise, epsilon

pytest.importorskip("opacus")


def test_clipping_bounds_each_update_and_keeps_those_inside():
    """A vector outside the ball lands on its boundary (norm = clip, same direction); one inside is kept."""
    g = torch.Generator().manual_seed(0)
    big = 10 * torch.randn(50, generator=g)
    small = big / (2 * big.norm())
    clipped = big * clip_factor(big, 1.0)
    assert clipped.norm().item() == pytest.approx(1.0, rel=1e-6)
    assert torch.allclose(clipped / clipped.norm(), big / big.norm())
    assert clip_factor(small, 1.0) == 1.0


def test_the_noise_has_mean_zero_and_variance_of_sigma_clip_squared():
    """noised_sum's noise, over 200 000 coordinates: its mean is 0 and its variance (σC)² with σ = 1.5, C = 2.
    With n = 2e5 draws the sample mean's standard error is σC/√n ≈ 0.0067 and the sample variance's relative one
    √(2/n) ≈ 0.0032, so the tolerances (0.03 absolute, 2 % relative) are more than 4 standard errors: a fixed seed
    cannot fail them by chance, a wrong scale (e.g. σ instead of σC) fails them by far."""
    sigma, clip, n = 1.5, 2.0, 200_000
    vectors = [torch.full((n,), 5.0), torch.full((n,), -0.001)]  # the first is clipped to norm 2, the second kept
    expected = vectors[0] * clip_factor(vectors[0], clip) + vectors[1]
    noise = noised_sum(vectors, clip, sigma, torch.Generator().manual_seed(3)) - expected
    assert abs(noise.mean().item()) < 0.03
    assert noise.var().item() == pytest.approx((sigma * clip) ** 2, rel=0.02)


def test_privatize_rebuilds_replies_whose_sum_is_the_noised_sum_of_clipped_updates():
    """Σ_k reply_k = m·base + Σ clip(u_k) + z, the update measured against scale × broadcast; other keys untouched."""
    g = torch.Generator().manual_seed(1)
    base = {"lam.0": torch.randn(6, generator=g, dtype=torch.float64), "lam.1": -torch.rand(6, generator=g).double()}
    update = ClientUpdate((("contribution", "lam"),), scale=0.5)
    replies = {
        k: {
            "contribution.0": torch.randn(6, generator=g).double(),
            "contribution.1": torch.randn(6, generator=g).double(),
        }
        for k in range(3)
    }
    out, norms = privatize(replies, base, update, clip=0.8, noise_multiplier=0.0, generator=torch.Generator())
    for k in range(3):
        u = torch.cat(
            [replies[k]["contribution.0"] - 0.5 * base["lam.0"], replies[k]["contribution.1"] - 0.5 * base["lam.1"]]
        )
        assert norms[k] == (pytest.approx(u.norm().item()), 0.0)  # no precision half
        got = torch.cat(
            [out[k]["contribution.0"] - 0.5 * base["lam.0"], out[k]["contribution.1"] - 0.5 * base["lam.1"]]
        )
        assert torch.allclose(got, u * min(1.0, 0.8 / u.norm().item()))
    noisy, _ = privatize(replies, base, update, 0.8, 2.0, torch.Generator().manual_seed(5))
    z = torch.randn(12, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 1.6
    total = sum(torch.cat([noisy[k]["contribution.0"], noisy[k]["contribution.1"]]) for k in range(3))
    clean = sum(torch.cat([out[k]["contribution.0"], out[k]["contribution.1"]]) for k in range(3))
    assert torch.allclose(total, clean + z)


def test_epsilon_is_opacus_own_for_the_same_history():
    """ε of 10 rounds at σ = 1.1, q = 0.3 then 5 at σ = 2, q = 0.3 is what Opacus's RDPAccountant says after the
    same steps taken one at a time; the calibrated σ spends at most the target (Opacus's own search)."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for sigma, steps in ((1.1, 10), (2.0, 5)):
        for _ in range(steps):
            accountant.step(noise_multiplier=sigma, sample_rate=0.3)
    ours = epsilon([(1.1, 0.3)] * 10 + [(2.0, 0.3)] * 5, 1e-5)
    assert ours == accountant.get_epsilon(delta=1e-5)
    sigma = calibrated_noise(3.0, 1e-5, 0.5, 20)
    assert epsilon([(sigma, 0.5)] * 20, 1e-5) <= 3.0
    assert epsilon([(sigma * 0.97, 0.5)] * 20, 1e-5) > 2.9  # and not far below it
    assert epsilon([], 1e-5) == 0.0 and epsilon([(0.0, 1.0)], 1e-5) == math.inf
    assert sampling_rate(1.0) == 1.0 and sampling_rate(0.25) == 0.25


def test_settings_refuse_what_they_cannot_mean():
    with pytest.raises(ValueError, match="noise_multiplier or a target epsilon"):
        DPSettings(clip=1.0)
    with pytest.raises(ValueError, match="clip"):
        DPSettings(clip=0.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="level"):
        DPSettings(level="user", noise_multiplier=1.0)


# ---- runs -----------------------------------------------------------------------------------------------------------


def _clients():
    torch.manual_seed(0)
    w = torch.randn(4, 3)
    parts = []
    for _ in range(4):
        X = torch.randn(30, 4)
        parts.append((X, (X @ w).argmax(dim=1)))
    return parts


def _run(out, method="fedavg", **kwargs):
    torch.manual_seed(0)
    hparams = dict(bayesadmm.algorithms.spec.get(method).example)
    parts = _clients()
    return bayesadmm.run(
        nn.Linear(4, 3), parts, parts[0], algorithm=method, hparams=hparams, rounds=3, out=out, progress=False,
        eval_samples=2, **kwargs,
    )  # fmt: skip


def _numbers(result):
    return [
        {k: v for k, v in line.items() if not k.endswith("seconds") and not k.startswith("dp_")}
        for line in result.history
    ]


@pytest.mark.parametrize("method", ["fedavg", "ivon-admm"])
def test_no_noise_and_a_large_clip_give_the_methods_own_run_bit_for_bit(tmp_path, method):
    """σ = 0 and a clip no update reaches: the same metrics and the same final parameters as without dp."""
    plain = _run(tmp_path / "plain", method)
    private = _run(tmp_path / "dp", method, dp=DPSettings(clip=1e9, noise_multiplier=0.0))
    assert _numbers(private) == _numbers(plain)
    assert torch.equal(private.posterior.mean, plain.posterior.mean)
    assert all(line["dp_clipped"] == 0.0 and line["dp_epsilon"] == math.inf for line in private.history)


def test_noise_changes_the_run_and_epsilon_is_logged_each_round(tmp_path):
    dp = DPSettings(clip=0.5, noise_multiplier=1.0)
    result = _run(tmp_path / "dp", dp=dp)
    assert result.status == "completed"
    spent = [line["dp_epsilon"] for line in result.history]
    assert spent == [epsilon([(1.0, 1.0)] * r, 1e-5) for r in (1, 2, 3)]
    assert not torch.equal(result.posterior.mean, _run(tmp_path / "plain").posterior.mean)


def test_the_budget_stops_the_run_and_a_larger_one_resumes_it_to_the_uninterrupted_numbers(tmp_path):
    """A budget between ε after round 2 and after round 3 stops the run before round 3 (status "budget", resumable);
    the resume with no budget gives ε and the numbers of a run that never stopped."""
    after2, after3 = epsilon([(1.0, 1.0)] * 2, 1e-5), epsilon([(1.0, 1.0)] * 3, 1e-5)
    budget = (after2 + after3) / 2
    stopped = _run(tmp_path / "run", dp=DPSettings(clip=0.5, noise_multiplier=1.0, epsilon=budget))
    assert stopped.status == "budget" and stopped.round == 2 and "budget" in stopped.message
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["status"] == "budget" and status["round"] == 2
    resumed = _run(tmp_path / "run", dp=DPSettings(clip=0.5, noise_multiplier=1.0, epsilon=10.0), resume=True)
    whole = _run(tmp_path / "whole", dp=DPSettings(clip=0.5, noise_multiplier=1.0))
    assert resumed.status == "completed"
    strip = lambda h: [{k: v for k, v in line.items() if not k.endswith("seconds")} for line in h]  # noqa: E731
    assert strip(resumed.history) == strip(whole.history)
    assert torch.equal(resumed.posterior.mean, whole.posterior.mean)


def test_methods_that_cannot_be_private_refuse(tmp_path):
    with pytest.raises(ValueError, match="fedlap has no client-level DP"):
        _run(tmp_path / "a", "fedlap", dp=DPSettings(noise_multiplier=1.0))
    with pytest.raises(ValueError, match="participation=1"):
        _run(tmp_path / "b", "ivon-admm", participation=0.5, dp=DPSettings(noise_multiplier=1.0))
    with pytest.raises(ValueError, match="weighted=false"):
        torch.manual_seed(0)
        parts = _clients()
        bayesadmm.run(
            nn.Linear(4, 3), parts, parts[0], algorithm="fedavg", hparams={"weighted": True}, rounds=1,
            out=tmp_path / "c", progress=False, dp=DPSettings(noise_multiplier=1.0),
        )  # fmt: skip
    assert not any((tmp_path / name).exists() for name in ("a", "b", "c"))


def test_the_command_lines_dp_keys_build_the_private_method_and_are_recorded_only_where_set():
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import ConfigError, resolve
    from bayesadmm.privacy import PrivateServer

    plain, _ = resolve("diabetes-iid5", ["method=fedavg"])
    assert not any(key.startswith("dp") for key in plain.to_json())
    config, _ = resolve("diabetes-iid5", ["method=fedavg", "dp=client", "dp_clip=0.5", "dp_epsilon=3"])
    assert {k: v for k, v in config.to_json().items() if k.startswith("dp")} == {
        "dp": "client",
        "dp_clip": 0.5,
        "dp_epsilon": 3.0,
    }
    built = build(config)
    algorithm = built.algorithm()
    assert isinstance(algorithm.init_server(built.federation.theta0), PrivateServer)
    with pytest.raises(ConfigError, match="noise_multiplier or a target epsilon"):
        resolve("diabetes-iid5", ["method=fedavg", "dp=client"])
    with pytest.raises(ConfigError, match="fedlap has no client-level DP"):
        build(resolve("diabetes-iid5", ["method=fedlap", "dp=client", "dp_noise=1"])[0])


def test_a_private_run_is_loaded_back_with_its_posterior(tmp_path):
    result = _run(tmp_path / "run", dp=DPSettings(clip=0.5, noise_multiplier=1.0))
    loaded = bayesadmm.load(tmp_path / "run", model=nn.Linear(4, 3))
    assert torch.equal(loaded.posterior.mean, result.posterior.mean)


def test_the_command_line_stops_at_the_budget_and_resumes_with_a_larger_one(tmp_path, capsys):
    from bayesadmm.cli import main

    out = tmp_path / "run"
    budget = (epsilon([(1.0, 1.0)], 1e-5) + epsilon([(1.0, 1.0)] * 2, 1e-5)) / 2  # room for one round
    keys = ["method=fedavg", "rounds=2", "epochs=1", "workers=1", "dp=client", "dp_noise=1", f"out={out}"]
    assert main(["run", "diabetes-iid5", *keys, f"dp_epsilon={budget}", "--quiet"]) == 0
    assert "privacy budget: round 2 would take" in capsys.readouterr().out
    assert json.loads((out / "status.json").read_text())["status"] == "budget"
    assert main(["resume", str(out), "--dp-epsilon", "50", "--quiet"]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["dp_epsilon"] for line in lines] == [epsilon([(1.0, 1.0)] * r, 1e-5) for r in (1, 2)]
    assert json.loads((out / "status.json").read_text())["status"] == "completed"


def test_partial_participation_is_accounted_at_the_clients_drawn_over_the_clients(tmp_path):
    """4 clients at participation 0.5: 2 a round, q = 0.5; the calibrated σ spends at most the target by round 3."""
    result = _run(tmp_path / "run", participation=0.5, dp=DPSettings(clip=0.5, noise_multiplier=1.2))
    assert [line["dp_epsilon"] for line in result.history] == [epsilon([(1.2, 0.5)] * r, 1e-5) for r in (1, 2, 3)]
    calibrated = _run(tmp_path / "eps", participation=0.5, dp=DPSettings(clip=0.5, epsilon=2.0))
    assert calibrated.history[-1]["dp_noise_multiplier"] == calibrated_noise(2.0, 1e-5, 0.5, 3)
    assert calibrated.history[-1]["dp_epsilon"] <= 2.0


def test_unlearning_is_refused_for_the_noised_sum(tmp_path):
    """IVON-ADMM unlearns a client by subtracting its term from the server's sum; with client-level DP that sum is
    noised and holds no client's term, and the refusal says so."""
    result = _run(tmp_path / "run", "ivon-admm", dp=DPSettings(clip=1e9, noise_multiplier=0.0))
    with pytest.raises(bayesadmm.UnlearningError, match="client-level differential privacy.*noised sum.*retrain"):
        bayesadmm.unlearn(result, 1)
