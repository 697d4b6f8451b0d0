"""FedEP Table 4, Fig. 1 and Fig. 4-left (Guo et al., ICLR 2023, Sec. 3.1 and 3.3): the 2-D two-client Gaussian toy.

Each client's likelihood is p_k(θ) = N(θ; μ_k, Σ_k), k ∈ {1, 2}, with an improper uniform prior, so the target is the
exact product N(θ; Λ⁻¹Σ_kΛ_kμ_k, Λ⁻¹), Λ = Σ_kΛ_k. Client parameters are drawn from the normal-inverse-Wishart
distribution of Sec. 3.1: Σ_k ∼ W⁻¹(Ψ, ν), μ_k ∼ N(μ_0, Σ_k/λ) with μ_0 = 0, ν = 7, λ = 0.2 and one random SPD Ψ
(eigenvalues uniform on [1, 2], random rotation; the paper only says "a random SPD matrix"). The authors' code scales
Σ_k by 1/λ as well, which changes none of the estimates below (they are invariant to a common scale of the Σ_k).

Methods (Sec. 3.1 and 3.3): FedAvg = unweighted average of the client means; FedPA = product of the diagonal
projections (mean and diag Σ_k) = FedEP round 1; FedEP = parallel EP in the diagonal family, no damping, uniform
start, exact tilted distributions projected onto the diagonal family; FedEP (scaled identity) = the same with the
projected precision replaced by diag(Λ_{−k}) + I (the authors' public code; the paper does not give it). Error:
Euclidean distance between the estimated and the exact global mean, mean ± std over `pairs` random client pairs. We
run in float64, so FedEP reaches ~1e-15; the paper's 1.1e-7 is float32 round-off.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, TypedDict

import torch

from bayesadmm.algorithms import fedep, fedpa
from bayesadmm.algorithms.base import DivergenceError
from bayesadmm.engine.simulate import run_rounds
from bayesadmm.families import DiagonalGaussian
from bayesadmm.paper.common import format_table, write_json
from bayesadmm.solvers.ep_inference import ExactGaussian, GaussianLikelihood
from bayesadmm.solvers.von import SubproblemError
from bayesadmm.threads import one_thread

NU, LAMBDA, DIM = 7, 0.2, 2
PAPER = {"fedavg": (0.54, 0.47), "fedpa": (0.26, 0.26), "fedep": (1.1e-7, 9.8e-8)}


class _Figure1(TypedDict):
    means: tuple[tuple[float, float], ...]
    covariances: tuple[tuple[tuple[float, float], tuple[float, float]], ...]
    rounds: int


# Fig. 1 (the values of the authors' public code; the paper only plots them)
FIG1: _Figure1 = {
    "means": ((7.0, -10.6), (0.2, 2.24)),
    "covariances": (((11.0, -5.3), (-5.3, 3.5)), ((5.0, 4.9), (4.9, 5.5))),
    "rounds": 10,
}


def random_spd(generator: torch.Generator, dim: int = DIM) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
    return q @ torch.diag(1.0 + torch.rand(dim, generator=generator, dtype=torch.float64)) @ q.T


def sample_client(psi: torch.Tensor, generator: torch.Generator) -> GaussianLikelihood:
    """Σ ∼ W⁻¹(Ψ, ν) (Σ⁻¹ = Σ_{i≤ν} z_i z_iᵀ, z_i ∼ N(0, Ψ⁻¹); ν is an integer), μ ∼ N(0, Σ/λ)."""
    chol = torch.linalg.cholesky(torch.linalg.inv(psi))
    z = torch.randn(NU, DIM, generator=generator, dtype=torch.float64) @ chol.T
    cov = torch.linalg.inv(z.T @ z)
    cov = 0.5 * (cov + cov.T)
    mean = torch.linalg.cholesky(cov / LAMBDA) @ torch.randn(DIM, generator=generator, dtype=torch.float64)
    return GaussianLikelihood(mean, cov)


def exact_mean(clients) -> torch.Tensor:
    return torch.linalg.solve(sum(c.natural[1] for c in clients), sum(c.natural[0] for c in clients))


def fedavg_mean(clients) -> torch.Tensor:
    return sum(c.mean for c in clients) / len(clients)


def ep_means(clients, rounds: int, scaled_identity: float | None = None) -> list[torch.Tensor]:
    """Global means after rounds 1..`rounds` of undamped parallel EP in the diagonal family from a uniform start
    (NaN after a breakdown, i.e. a tilted distribution that is not normalisable).

    The round loop is `engine.simulate.run_rounds` without its per-client generators (exact inference needs none).
    """
    alg = fedep.make(DiagonalGaussian(DIM), ExactGaussian(scaled_identity), damping=1.0)
    server = alg.init_server(torch.zeros(DIM, dtype=torch.float64))
    states = [alg.init_client(server, k) for k in range(len(clients))]
    means: list[torch.Tensor] = []
    unused = torch.Generator()  # exact tilted inference draws nothing, but client_update takes a generator
    try:
        for _ in range(rounds):
            message = alg.broadcast(server)
            replies = {}
            for k, data in enumerate(clients):
                states[k], replies[k], _ = alg.client_update(states[k], message, data, unused)
            server, _ = alg.server_update(server, replies)
            means.append(alg.posterior(server).mean)
    except (SubproblemError, DivergenceError):
        pass
    return means + [torch.full((DIM,), math.nan, dtype=torch.float64)] * (rounds - len(means))


def fedpa_mean(clients) -> torch.Tensor:
    alg = fedpa.make(DiagonalGaussian(DIM), ExactGaussian())
    server, _ = run_rounds(alg, clients, torch.zeros(DIM, dtype=torch.float64), 1)
    return alg.posterior(server).mean


def _stats(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    return [float(t.mean()), float(t.std(unbiased=False))]


def run(out: Path, rounds: int = 50, data_dir: str | None = None, pairs: int = 200, seed: int = 0) -> dict:
    """Run the toy, write fedep_toy.json, fedep_toy_fig1.png and fedep_toy_fig4.png to `out`, return the payload."""
    with one_thread():  # 2×2 linear algebra: threading only adds overhead (10× on a busy machine)
        return _run(Path(out), rounds, pairs, seed)


def _run(out: Path, rounds: int, pairs: int, seed: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    psi = random_spd(generator)
    errors: dict[str, list[float]] = {"fedavg": [], "fedpa": [], "fedep": [], "fedep-identity": []}
    per_round: dict[str, list[list[float]]] = {"fedep": [], "fedep-identity": []}
    for _ in range(pairs):
        clients = [sample_client(psi, generator) for _ in range(2)]
        target = exact_mean(clients)
        errors["fedavg"].append(float((fedavg_mean(clients) - target).norm()))
        errors["fedpa"].append(float((fedpa_mean(clients) - target).norm()))
        for name, alpha in (("fedep", None), ("fedep-identity", 1.0)):
            trace = [float((m - target).norm()) for m in ep_means(clients, rounds, alpha)]
            per_round[name].append(trace)
            errors[name].append(trace[-1])

    def by_round(traces):
        cols = torch.tensor(traces, dtype=torch.float64).T
        return [float(c.mean()) for c in cols], [float(c.std(unbiased=False)) for c in cols]

    curves = {name: by_round(traces) for name, traces in per_round.items()}
    payload: dict[str, Any] = {name: _stats(values) for name, values in errors.items()}
    payload.update(
        {
            "rounds": list(range(1, rounds + 1)),
            "per_round": {name: {"mean": c[0], "std": c[1]} for name, c in curves.items()},
            "paper": {k: list(v) for k, v in PAPER.items()},
            "breakdowns": {name: sum(1 for v in errors[name] if not math.isfinite(v)) for name in per_round},
            "settings": {
                "pairs": pairs,
                "seed": seed,
                "nu": NU,
                "lambda": LAMBDA,
                "psi": psi.tolist(),
                "dtype": "float64",
                "damping": 1.0,
                "start": "uniform",
            },
        }
    )
    payload["fig1"] = _fig1(out / "fedep_toy_fig1.png")
    write_json(out / "fedep_toy.json", payload)
    _fig4(out / "fedep_toy_fig4.png", payload)

    _print_tables(payload, curves, pairs, rounds)
    print(f"wrote {out / 'fedep_toy.json'}, {out / 'fedep_toy_fig1.png'} and {out / 'fedep_toy_fig4.png'}")
    return payload


def _print_tables(payload: dict, curves: dict, pairs: int, rounds: int) -> None:
    """Table 4 (ours beside the paper's) and FedEP's mean error at a few rounds."""

    def cell(v):
        return f"{v[0]:.2g} ± {v[1]:.2g}"

    rows = [
        [name, cell(PAPER[name]) if name in PAPER else "—", cell(payload[name])]
        for name in ("fedavg", "fedpa", "fedep", "fedep-identity")
    ]
    print(f"Table 4 (distance to the exact global mean, {pairs} client pairs; FedEP after {rounds} rounds, float64)")
    print(format_table(["method", "paper (float32)", "ours"], rows))
    shown = [r for r in (1, 2, 5, 10, 20, rounds) if r <= rounds]
    print(
        format_table(
            ["round", "fedep", "fedep-identity"],
            [[r, curves["fedep"][0][r - 1], curves["fedep-identity"][0][r - 1]] for r in sorted(set(shown))],
        )
    )


def _ellipse(mean, cov, scale=2.0, n=200):
    t = torch.linspace(0, 2 * math.pi, n, dtype=torch.float64)
    circle = torch.stack([torch.cos(t), torch.sin(t)])
    return (mean.unsqueeze(1) + scale * torch.linalg.cholesky(cov) @ circle).numpy()


def _fig1(path: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = [
        GaussianLikelihood(torch.tensor(m, dtype=torch.float64), torch.tensor(c, dtype=torch.float64))
        for m, c in zip(FIG1["means"], FIG1["covariances"], strict=True)
    ]
    target = exact_mean(clients)
    target_cov = torch.linalg.inv(sum(c.natural[1] for c in clients))
    avg, pa = fedavg_mean(clients), fedpa_mean(clients)
    trajectory = torch.stack(ep_means(clients, FIG1["rounds"]))

    fig, ax = plt.subplots(figsize=(5, 5))
    for k, (c, color) in enumerate(zip(clients, ("tab:blue", "tab:orange"), strict=True)):
        xy = _ellipse(c.mean, c.covariance)
        ax.plot(xy[0], xy[1], color=color, label=f"client {k + 1}")
        ax.plot(*c.mean.numpy(), "o", color=color)
    xy = _ellipse(target, target_cov)
    ax.plot(xy[0], xy[1], color="k", label="global (target)")
    ax.plot(*target.numpy(), "k*", markersize=12)
    ax.plot(*avg.numpy(), "s", color="tab:green", label="FedAvg")
    ax.plot(*pa.numpy(), "D", color="tab:red", label="FedPA (posterior averaging)")
    ax.plot(trajectory[:, 0].numpy(), trajectory[:, 1].numpy(), ".-", color="tab:purple", label="FedEP trajectory")
    ax.set_aspect("equal", adjustable="datalim")
    ax.legend(fontsize=8)
    ax.set_title("Two 2-D Gaussian clients (diagonal family)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {
        "target": target.tolist(),
        "fedavg": avg.tolist(),
        "fedpa": pa.tolist(),
        "fedep_trajectory": trajectory.tolist(),
    }


def _fig4(path: Path, payload: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = payload["rounds"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.semilogy(rounds, payload["per_round"]["fedep-identity"]["mean"], label="FedEP (scaled identity)")
    ax.semilogy(rounds, payload["per_round"]["fedep"]["mean"], label="FedEP (diagonal)")
    ax.semilogy(rounds, [payload["fedavg"][0]] * len(rounds), "--", label="FedAvg")
    ax.semilogy(rounds, [payload["fedpa"][0]] * len(rounds), ":", label="FedPA (diagonal)")
    ax.set_xlabel("round")
    ax.set_ylabel("Euclidean distance to the global mean")
    ax.set_title(f"Toy, mean over {payload['settings']['pairs']} client pairs")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
