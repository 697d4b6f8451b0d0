"""Client-level DP of a running-sum server (IVON-ADMM and IVON-PVI with `incremental=true`), at any participation:
what it releases against a closed form written here in numpy, its sensitivity to one client, the precision's
floor, the refusal of the summing-every-reply server at partial participation, and whole runs (never below a
tight accountant's ε, no divergence however large the noise, σ = 0 the method's own run bit for bit)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm.algorithms import ivon_admm
from bayesadmm.engine.simulate import generator_of
from bayesadmm.privacy import DPSettings
from bayesadmm.privacy.client_level import DP_NOISE, private, released_sum

pytest.importorskip("opacus")

DIM, RHO_S, DELTA = 5, 0.5, 2.0


def _update():
    hparams = ivon_admm.Hparams(lr=0.01, rho=RHO_S, gamma=0.1, delta=DELTA, incremental=True)
    return ivon_admm.dp_update(hparams)


def _reply(rng: np.random.Generator, first: bool, size: float) -> dict[str, torch.Tensor]:
    return {
        "change.0": torch.from_numpy(size * rng.standard_normal(DIM)),
        "change.1": torch.from_numpy(size * rng.standard_normal(DIM)),
        "first": torch.tensor(float(first), dtype=torch.float64),
    }


def _noise(seed: int, t: int, std: float) -> np.ndarray:
    """Round t's noise as the mechanism draws it: float32 standard normals of the flattened update, times σC."""
    z = torch.randn(2 * DIM, generator=generator_of(seed, t, DP_NOISE), dtype=torch.float32)
    return z.double().numpy() * std


def _clipped(u: np.ndarray, clip: float) -> np.ndarray:
    return u * min(1.0, clip / np.linalg.norm(u))


def test_the_released_sum_moves_by_one_clients_clipped_update_at_most():
    """Adding or removing one client (its coins and the noise as they are) moves the release by its clipped update,
    of norm at most C: the sensitivity the accountant assumes. u_k is the change, less ρ_s λ_g in a first reply."""
    update, rng = _update(), np.random.default_rng(0)
    base = {"lam.0": torch.randn(DIM), "lam.1": -torch.rand(DIM) - 1, "round": torch.tensor(3)}
    replies = {k: _reply(rng, first=k % 2 == 0, size=10.0) for k in range(4)}
    a = RHO_S * np.concatenate([base["lam.0"].double().numpy(), base["lam.1"].double().numpy()])
    for k in replies:
        kept = {j: r for j, r in replies.items() if j != k}
        with_k, norms = released_sum(replies, base, update, 1.5, 0.7, torch.Generator().manual_seed(5), new=2.5)
        without_k, _ = released_sum(kept, base, update, 1.5, 0.7, torch.Generator().manual_seed(5), new=2.5)
        moved = np.concatenate([(with_k[f"change.{i}"] - without_k[f"change.{i}"]).numpy() for i in (0, 1)])
        u = np.concatenate([replies[k]["change.0"].numpy(), replies[k]["change.1"].numpy()]) - (k % 2 == 0) * a
        assert norms[k] == (pytest.approx(np.linalg.norm(u)), pytest.approx(np.linalg.norm(u[DIM:])))
        np.testing.assert_allclose(moved, _clipped(u, 1.5), rtol=1e-12, atol=1e-12)
        assert np.linalg.norm(moved) <= 1.5 * (1 + 1e-12)
    assert set(with_k) == {"change.0", "change.1"}  # no flag: the new clients are counted by their expectation


def test_the_server_follows_the_closed_form_of_the_released_sums_with_the_expected_count_and_the_floor():
    """Three rounds of hand-made replies (new and returning clients, one round without any) through the private
    server: λ_g = ((0, −δ/2) + Σ_t released_t) / (1 + ρ_s Σ_t K q (1 − q)^(t−1)), each release Σ clip(u_k) + z_t +
    K q (1 − q)^(t−1) ρ_s λ_g, a coordinate whose precision is below δ at its previous mean and precision δ; computed
    here in numpy from the replies and the noise."""
    K, q, clip, sigma, seed = 40, 0.1, 3.0, 0.8, 11
    update = _update()
    algorithm = private(
        ivon_admm.make(DIM, rho=RHO_S, gamma=0.1, delta=DELTA, lr=0.01, incremental=True),
        update, DPSettings(clip=clip, noise_multiplier=sigma), sigma, q, seed, K,
    )  # fmt: skip
    theta0 = torch.linspace(-1, 1, DIM)
    server = algorithm.init_server(theta0)
    rng = np.random.default_rng(1)
    rounds = [
        {0: _reply(rng, True, 50.0), 1: _reply(rng, True, 0.5), 2: _reply(rng, True, 2.0)},
        {},
        {1: _reply(rng, False, 4.0), 5: _reply(rng, True, 1.0)},
    ]
    lam = np.concatenate([DELTA * theta0.double().numpy(), np.full(DIM, -DELTA / 2)])  # N(θ0, 1/δ)
    total, count = np.zeros(2 * DIM), 0.0
    for t, replies in enumerate(rounds, start=1):
        message = algorithm.broadcast(server)
        a = RHO_S * np.concatenate([message["lam.0"].double().numpy(), message["lam.1"].double().numpy()])
        np.testing.assert_allclose(a / RHO_S, lam, rtol=1e-6)  # the broadcast is λ_g (in float32)
        new = K * q * (1 - q) ** (t - 1)
        released = new * a + _noise(seed, t, sigma * clip)
        for k in sorted(replies):
            change = np.concatenate([replies[k]["change.0"].numpy(), replies[k]["change.1"].numpy()])
            released += _clipped(change - float(replies[k]["first"]) * a, clip)
        total, count = total + released, count + new
        mean_before = lam[:DIM] / (-2 * lam[DIM:])
        lam = (np.concatenate([np.zeros(DIM), np.full(DIM, -DELTA / 2)]) + total) / (1 + RHO_S * count)
        low = -2 * lam[DIM:] < DELTA  # these coordinates keep their mean, at the prior's precision
        lam[:DIM][low], lam[DIM:][low] = DELTA * mean_before[low], -DELTA / 2
        server, info = algorithm.server_update(server, replies)
        assert info.server.clients == pytest.approx(count, rel=1e-12)
        assert info.server.floored == pytest.approx(low.mean())
        got = np.concatenate([x.double().numpy() for x in server.inner.natural])
        np.testing.assert_allclose(got, lam, rtol=1e-6, atol=1e-6)
    assert count == pytest.approx(K * (1 - (1 - q) ** 3))  # the expected number of clients drawn at least once


def test_the_participants_server_follows_the_closed_form_of_the_released_steps_over_the_expected_participants():
    """IVON-ADMM's `proximal="participants"` server under client-level DP, three rounds of hand-made replies (one
    round without any): each release is R_t = Σ clip(d_k) + z_t, the replies' steps d_k = λ_k − λ_g measured against
    0, and λ_g = ((0, −δ/2) + Σ η + ρ_s (R_t + Kq λ_g)) / (1 + ρ_s Kq) with the dual sum Σ η moved by γ R_t and Kq
    the expected number of participants in place of the number drawn; a coordinate whose precision is below δ at its
    previous mean and precision δ. Computed here in numpy from the replies and the noise."""
    K, q, clip, sigma, seed, gamma = 40, 0.1, 3.0, 0.8, 12, 0.1
    hparams = ivon_admm.Hparams(lr=0.01, rho=RHO_S, gamma=gamma, delta=DELTA, proximal="participants")
    algorithm = private(
        ivon_admm.make(DIM, rho=RHO_S, gamma=gamma, delta=DELTA, lr=0.01, proximal="participants"),
        ivon_admm.dp_update(hparams), DPSettings(clip=clip, noise_multiplier=sigma), sigma, q, seed, K,
    )  # fmt: skip
    theta0 = torch.linspace(-1, 1, DIM)
    server = algorithm.init_server(theta0)
    rng = np.random.default_rng(2)
    step = lambda size: {f"step.{i}": torch.from_numpy(size * rng.standard_normal(DIM)).float() for i in (0, 1)}  # noqa: E731
    rounds = [{0: step(50.0), 1: step(0.5), 2: step(2.0)}, {}, {1: step(4.0), 5: step(1.0)}]
    lam = np.concatenate([DELTA * theta0.double().numpy(), np.full(DIM, -DELTA / 2)])
    duals, expected = np.zeros(2 * DIM), K * q
    for t, replies in enumerate(rounds, start=1):
        released = _noise(seed, t, sigma * clip)
        for k in sorted(replies):
            released += _clipped(np.concatenate([replies[k]["step.0"].numpy(), replies[k]["step.1"].numpy()]), clip)
        duals = duals + gamma * released
        mean_before = lam[:DIM] / (-2 * lam[DIM:])
        prior = np.concatenate([np.zeros(DIM), np.full(DIM, -DELTA / 2)])
        lam_g = np.concatenate([x.double().numpy() for x in server.inner.natural])  # the broadcast λ_g
        lam = (prior + duals + RHO_S * (released + expected * lam_g)) / (1 + RHO_S * expected)
        low = -2 * lam[DIM:] < DELTA
        lam[:DIM][low], lam[DIM:][low] = DELTA * mean_before[low], -DELTA / 2
        server, info = algorithm.server_update(server, replies)
        assert info.server.clients == expected and info.server.floored == pytest.approx(low.mean())
        np.testing.assert_allclose(np.concatenate([x.double().numpy() for x in server.inner.natural]), lam,
                                   rtol=1e-6, atol=1e-6)  # fmt: skip
        np.testing.assert_allclose(np.concatenate([x.numpy() for x in server.inner.duals]), duals, rtol=1e-6, atol=1e-6)


def test_with_a_precision_clip_the_halves_are_clipped_in_an_ellipsoid_of_the_precision_weighted_mean_change():
    """(v1, v2) = (u1 + 2 m_g u2, u2), m_g = λ₁ / (−2λ₂) of the broadcast: one client moves the release by its
    update scaled so that ‖v1‖²/C² + ‖v2‖²/C_p² ≤ 1, and the noise is σC on v1's coordinates and σC_p on v2's (the
    same standard normals as the ball's), mapped back; all computed here in numpy."""
    update, rng = _update(), np.random.default_rng(2)
    base = {"lam.0": torch.randn(DIM, dtype=torch.float64), "lam.1": -torch.rand(DIM, dtype=torch.float64) - 1}
    mix = 2 * base["lam.0"].numpy() / (-2 * base["lam.1"].numpy())
    a = RHO_S * np.concatenate([base["lam.0"].numpy(), base["lam.1"].numpy()])
    replies = {k: _reply(rng, first=k == 0, size=[30.0, 0.1, 3.0][k]) for k in range(3)}
    clip, precision_clip, sigma = 2.0, 5.0, 0.6
    for k in replies:
        kept = {j: r for j, r in replies.items() if j != k}
        args = (base, update, clip, sigma)
        with_k, norms = released_sum(replies, *args, torch.Generator().manual_seed(9), 1.0, precision_clip)
        without_k, _ = released_sum(kept, *args, torch.Generator().manual_seed(9), 1.0, precision_clip)
        moved = np.concatenate([(with_k[f"change.{i}"] - without_k[f"change.{i}"]).numpy() for i in (0, 1)])
        u = np.concatenate([replies[k]["change.0"].numpy(), replies[k]["change.1"].numpy()]) - (k == 0) * a
        v1, v2 = u[:DIM] + mix * u[DIM:], u[DIM:]
        size = np.hypot(np.linalg.norm(v1) / clip, np.linalg.norm(v2) / precision_clip)
        np.testing.assert_allclose(moved, u * min(1.0, 1 / size), rtol=1e-10, atol=1e-12)
        assert norms[k] == (pytest.approx(np.linalg.norm(v1)), pytest.approx(np.linalg.norm(v2)))
    assert [n[0] > clip or n[1] > precision_clip for n in norms] == [True, False, True]
    noise, _ = released_sum({}, base, update, clip, sigma, torch.Generator().manual_seed(4), 0.0, precision_clip)
    z = torch.randn(2 * DIM, generator=torch.Generator().manual_seed(4), dtype=torch.float64).numpy()
    z1, z2 = sigma * clip * z[:DIM], sigma * precision_clip * z[DIM:]
    np.testing.assert_allclose(noise["change.0"].numpy(), z1 - mix * z2, rtol=1e-12)
    np.testing.assert_allclose(noise["change.1"].numpy(), z2, rtol=1e-12)


def test_a_precision_clip_is_refused_where_the_update_has_no_precision_half(tmp_path):
    parts, test = _federation()
    with pytest.raises(ValueError, match="precision_clip bounds the precision half.*fedavg"):
        bayesadmm.run(
            nn.Linear(4, 3), parts, test, algorithm="fedavg", rounds=1, out=tmp_path / "a", progress=False,
            dp=DPSettings(noise_multiplier=1.0, precision_clip=1.0),
        )  # fmt: skip
    assert not (tmp_path / "a").exists()
    with pytest.raises(ValueError, match="precision_clip bounds a client's update"):
        DPSettings(level="example", noise_multiplier=1.0, precision_clip=1.0)
    assert DPSettings.from_json(DPSettings(noise_multiplier=1.0, precision_clip=3.0).to_json()).precision_clip == 3.0
    assert "precision_clip" not in DPSettings(noise_multiplier=1.0).to_json()  # records without one are as before


def _federation(clients: int = 60, size: int = 8):
    torch.manual_seed(0)
    w = torch.randn(4, 3)
    parts = []
    for _ in range(clients):
        X = torch.randn(size, 4)
        parts.append((X, (X @ w).argmax(dim=1)))
    X = torch.randn(200, 4)
    return parts, (X, (X @ w).argmax(dim=1))


# the running sum of IVON-ADMM and IVON-PVI, and IVON-ADMM's participants' server
SERVERS = {"ivon-admm": {"incremental": True}, "ivon-pvi": {"incremental": True},
           "ivon-admm[participants]": {"proximal": "participants"}}  # fmt: skip


def _run(out, method="ivon-admm", participation=0.1, rounds=4, **kwargs):
    parts, test = _federation()
    torch.manual_seed(0)
    name = method.split("[")[0]
    hparams = {**bayesadmm.algorithms.spec.get(name).example, **SERVERS[method]}
    return bayesadmm.run(
        nn.Linear(4, 3), parts, test, algorithm=name, hparams=hparams, rounds=rounds, participation=participation,
        out=out, progress=False, eval_samples=2, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("method", list(SERVERS))
def test_a_running_sum_run_at_partial_participation_is_private_and_never_diverges(tmp_path, method):
    """Noise far above the clients' updates (σC = 300 on a linear model): the server floors its precisions at δ
    (those coordinates at their previous mean) instead of stopping, the run completes, and each round logs the
    accountant's ε of its (σ, q) history."""
    from bayesadmm.privacy.accountant import epsilon

    result = _run(tmp_path / "dp", method, dp=DPSettings(clip=300.0, noise_multiplier=1.0, precision_clip=300.0))
    assert result.status == "completed"
    assert [line["dp_epsilon"] for line in result.history] == [epsilon([(1.0, 0.1)] * r, 1e-5) for r in (1, 2, 3, 4)]
    assert max(line["server_floored"] for line in result.history) > 0  # the noise did take precisions below δ
    assert all(math.isfinite(line["test_nll"]) for line in result.history)
    # the running sum counts the clients drawn at least once, the participants' server the round's expected draw
    expected = 60 * 0.1 if method.endswith("[participants]") else 60 * (1 - 0.9**4)
    assert result.history[-1]["server_clients"] == pytest.approx(expected)


@pytest.mark.parametrize("method", ["ivon-admm", "ivon-admm[participants]"])
def test_without_noise_a_running_sum_run_is_the_methods_own_bit_for_bit(tmp_path, method):
    plain = _run(tmp_path / "plain", method)
    private_run = _run(tmp_path / "dp", method, dp=DPSettings(clip=1e12, noise_multiplier=0.0))
    strip = lambda h: [  # noqa: E731
        {k: v for k, v in line.items() if not k.endswith("seconds") and not k.startswith("dp_")} for line in h
    ]
    assert strip(private_run.history) == strip(plain.history)
    assert torch.equal(private_run.posterior.mean, plain.posterior.mean)


def test_the_server_summing_every_reply_refuses_partial_participation_naming_the_running_sum(tmp_path):
    parts, test = _federation()
    example = bayesadmm.algorithms.spec.get("ivon-admm").example
    with pytest.raises(ValueError, match="participation=1.*incremental=true.*proximal=participants"):
        bayesadmm.run(
            nn.Linear(4, 3), parts, test, algorithm="ivon-admm", hparams=example,
            rounds=1, participation=0.5, out=tmp_path / "a", progress=False, dp=DPSettings(noise_multiplier=1.0),
        )  # fmt: skip
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("method", ["ivon-admm", "ivon-admm[participants]"])
def test_a_private_running_sum_run_resumed_is_the_one_that_never_stopped(tmp_path, method):
    """Stopped after round 2 and resumed: the same expected count of clients, noise, floor and ε as without the
    stop (the count follows the accountant's history in the checkpoint)."""
    dp = DPSettings(clip=30.0, noise_multiplier=1.0, precision_clip=30.0)
    whole = _run(tmp_path / "whole", method, dp=dp)
    _run(tmp_path / "run", method, dp=dp, stop_at=2)
    resumed = _run(tmp_path / "run", method, dp=dp, resume=True)
    strip = lambda h: [{k: v for k, v in line.items() if not k.endswith("seconds")} for line in h]  # noqa: E731
    assert strip(resumed.history) == strip(whole.history)
    assert torch.equal(resumed.posterior.mean, whole.posterior.mean)


def test_the_command_lines_precision_clip_is_read_and_recorded_only_where_set():
    from bayesadmm.experiments.config import resolve
    from bayesadmm.experiments.privacy import dp_settings

    keys = ["method=ivon-admm", "incremental=true", "dp=client", "dp_clip=2", "dp_noise=1"]
    config, _ = resolve("diabetes-iid5", [*keys, "dp_precision_clip=5"])
    assert config.to_json()["dp_precision_clip"] == 5.0 and dp_settings(config).precision_clip == 5.0
    plain, _ = resolve("diabetes-iid5", keys)
    assert "dp_precision_clip" not in plain.to_json() and dp_settings(plain).precision_clip is None
