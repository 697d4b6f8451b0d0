"""IVON (Alg. 2) as the BayesADMM client solver for the diagonal family: the local step of IVON-ADMM (Alg. 1).

The client problem of tempered BayesADMM (App. D.4, Eq. 66) with q_k = N(m, diag(s)⁻¹), η_k = (v_k, −½u_k),
broadcast q_g = N(m_g, diag(s_g)⁻¹), temperature τ and N_k examples,

    argmin_q  E_q[Σ_i ℓ_k^(i)(θ)/τ + v_kᵀθ − ½ θᵀdiag(u_k)θ] + ρ KL(q ‖ q_g),

divided by ρ is Alg. 2's objective λ E_q[ℓ̄(θ) + vᵀθ − ½θᵀdiag(u)θ] + KL(q ‖ p) with the MEAN loss ℓ̄, prior p = q_g and

    λ = N_k/(ρτ),   v = τ v_k / N_k,   u = τ u_k / N_k                                          (Eq. 67)

so IVON's weight decay is the vector δ = s_g/λ. Every round starts from m ← m_g, g ← 0 and, as Alg. 2 writes, h ← h0:
the client's first posterior is then N(m_g, diag(s_g + λh0)⁻¹), q_g with λh0 of extra precision. With `restart_at_q_g`
the rounds after the first start at q_g itself (h ← 0, so λ(h + δ) = s_g), which is what the authors' public code does
(it resets IVON's posterior to q_g after each server step; only round 1, where q_g is the wide prior, uses h0). The
two differ in the early rounds: λh0 (3000–6000 on average for the FashionMNIST presets) is added to every s_k each
round (β2^steps of it survives the round), so δ = s_g/λ stays ≳ h0 and caps the step lr/(h + δ) on flat coordinates.
The optimizer's state is never carried across rounds or shared between clients. IVON returns s = λ(h + δ), which
already includes the prior's precision s_g.

`data` is anything with `num_examples` and `batch_loss(theta, idx)` (the mean loss over examples `idx`): the convex
per-example losses, or `problems.neural.ClassificationData` for neural networks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.checks import all_finite, all_positive
from bayesadmm.families import DiagonalGaussian
from bayesadmm.optim import ivon
from bayesadmm.solvers.adam import minibatches
from bayesadmm.solvers.von import SolveResult, SubproblemError


def cosine_lr(lr: float, round_: int, total_rounds: int | None) -> float:
    """The learning rate for `round_` (1-based): constant, or cosine-decayed to 0 over `total_rounds` rounds, stepped
    once per round (torch's CosineAnnealingLR with T_max = total_rounds, as the authors used)."""
    if total_rounds is None:
        return lr
    t = min(max(round_ - 1, 0), total_rounds)
    return 0.5 * lr * (1.0 + math.cos(math.pi * t / total_rounds))


@dataclass(frozen=True)
class IVONSolver:
    lr: float
    epochs: int = 1
    batch_size: int = 32
    tau: float = 1.0
    hess_init: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.99999
    mc_samples: int = 1
    clip_radius: float = float("inf")
    cosine_rounds: int | None = None   # decay the lr over this many rounds (None: constant)
    rescale_lr: bool = False           # True: step size lr·(h0 + δ) as ivon-opt does (first steps SGD-sized)
    restart_at_q_g: bool = False       # True: rounds > 1 start at q_g (h ← 0) instead of h ← h0 (module docstring)

    def __post_init__(self) -> None:
        problems = [f"{name} must be > 0, got {value}" for name, value in
                    (("lr", self.lr), ("epochs", self.epochs), ("batch_size", self.batch_size), ("tau", self.tau),
                     ("mc_samples", self.mc_samples)) if value <= 0]
        if self.hess_init < 0:
            problems.append(f"hess_init must be >= 0, got {self.hess_init}")
        if self.cosine_rounds is not None and self.cosine_rounds < 1:
            problems.append(f"cosine_rounds must be >= 1 or None, got {self.cosine_rounds}")
        if problems:
            raise ValueError("IVONSolver: " + "; ".join(problems))

    def solve(self, family, data, lam_g, eta, rho: float, generator: torch.Generator, init=None,
              round_: int = 1) -> SolveResult:
        if not isinstance(family, DiagonalGaussian):
            raise TypeError(f"IVON learns diagonal Gaussians, not the {family.name} family")
        m_g, s_g = family.to_moments(lam_g)
        n = data.num_examples
        ess = n / (rho * self.tau)                                    # Eq. 67
        # v = τ v_k / n and u = τ u_k / n with (v_k, u_k) = (η₁, −2η₂), each computed into one new tensor (the same
        # operations in the same order; a fresh model-sized tensor costs about as much as the arithmetic)
        v = torch.mul(eta[0], self.tau).div_(n)
        u = torch.mul(eta[1], -2.0).mul_(self.tau).div_(n)
        delta = s_g / ess
        lr = cosine_lr(self.lr, round_, self.cosine_rounds)
        if self.rescale_lr:
            lr = lr * (self.hess_init + delta)

        state = ivon.init(m_g, 0.0 if self.restart_at_q_g and round_ > 1 else self.hess_init)
        ivon.check_noise_scale(state, ess, delta)   # h + δ > 0 (δ = s_g/ess > 0 as q_g is valid): checked once here
        # the weight noise: a counter-based stream keyed once per solve (drawn in IVON's fused sampling kernel);
        # the generator also shuffles the minibatches
        noise_key = rng.stream_key(generator)
        steps = 0
        try:
            # the hot loop skips the per-step elementwise checks; non-finite results are caught below
            thetas, eps = ivon.sample(state, ess, delta, noise_key, self.mc_samples, check=False)
            terms = ivon.update_terms(m_g, lr=lr, ess=ess, delta=delta, beta1=self.beta1, beta2=self.beta2,
                                      prior_mean=m_g, v=v, u=u, clip_radius=self.clip_radius, check=False)
            batches = minibatches(n, self.batch_size, self.epochs, generator, m_g.device)
            idx = next(batches, None)
            while idx is not None:
                grads = (_grad(data, thetas[0], idx).unsqueeze(0) if self.mc_samples == 1    # a view, no copy
                         else torch.stack([_grad(data, theta, idx) for theta in thetas]))
                # (only the shuffles draw from the generator, so looking one batch ahead changes no number)
                idx = next(batches, None)
                # in place: the state is this solve's own (ivon.init copies m_g)
                if idx is None:   # the last step: no sample after it (its noise is a third of a 2-step client's)
                    state = ivon.update_with(state, grads, eps, terms, inplace=True)
                else:             # the update and the next step's samples in one pass
                    state, thetas, eps = ivon.update_and_sample_with(state, grads, eps, noise_key, self.mc_samples,
                                                                     terms, inplace=True)
                steps += 1
        except ValueError as exc:  # IVON refuses to sample once h + δ ≤ 0: the dual curvature won
            raise SubproblemError(f"IVON's precision stopped being positive after {steps} steps: {exc}") from exc
        mean, precision = ivon.posterior(state, ess, delta)
        if not (all_finite(mean) and all_positive(precision)):
            raise SubproblemError("IVON diverged on this client (non-finite mean or non-positive precision); "
                                  "lower lr or the dual step")
        return SolveResult(family.from_moments(mean, precision), steps, True)


def _grad(data, theta: Tensor, idx: Tensor) -> Tensor:
    """∇ of the mean loss over `idx` at `theta` (a fresh leaf, so nothing leaks between samples)."""
    theta = theta.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(data.batch_loss(theta, idx), theta)
    return grad
