"""The peers' client updates, written by hand once and used by both the plain loop and the Flower client app.

* `fedavg_update`: `epochs` passes of torch.optim.Adam (fresh state) over a DataLoader, mean cross-entropy.
* `ivon_admm_update`: one IVON-ADMM client step (spec: /work/shared/spec/bayesadmm-spec.md, Alg. 1 and 2):

      λ = N_k/(ρτ),  v = τ v_k/N_k,  u = τ u_k/N_k,  δ = s_g/λ (per coordinate), prior N(m_g, diag(s_g)⁻¹)
      IVON from m = m_g, h = h0 in round 1 (restart_at_q_g: h = 0 afterwards, i.e. q = q_g), lr cosine over rounds
      per step: ĝ = ∇ℓ̄(θ), ĥ = ĝ∘(θ − m)/σ² − u, g ← β1 g + (1−β1)(ĝ + v − u∘m − δ∘m_g),
                h ← IVON's update,  m ← m − α (g/(1 − β1ᵗ) + δ∘m)/(h + δ)
      then s_k = λ(h + δ), m_k = m and the duals v_k += γ(s_k m_k − s_g m_g), u_k += γ(s_k − s_g);
      reply (v_k + ρ s_k m_k, u_k + ρ s_k), all the server needs:
      s_g = (δ0 + Σ(u_k + ρ s_k))/(1 + ρK),  m_g = Σ(v_k + ρ s_k m_k)/((1 + ρK) s_g)     (Eq. 54, α = 1/(1 + ρK))

  With the ivon-opt package's `ivon.IVON` (used when importable): its weight decay is set to the vector δ, and the
  terms it lacks (the duals v, −u∘m and the prior's centre −δ∘m_g; the Stein term −u of ĥ) are added to its recorded
  gradient and curvature samples before each `step()`. So, unlike the spec, v − u∘m − δ∘m_g pass through the
  momentum: the constants exactly (ivon-opt debiases the momentum), −u∘m with the momentum's lag. Otherwise
  `bayesadmm.optim.IVON` (torch.optim interface), which takes the prior mean/precision and the duals itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

try:
    import ivon as ivon_opt
except ImportError:  # pragma: no cover - the fallback
    ivon_opt = None

OPTIMIZER = "ivon-opt ivon.IVON" if ivon_opt is not None else "bayesadmm.optim.IVON (ivon-opt not importable)"


def fedavg_update(model: nn.Module, loader: Iterable, lr: float, epochs: int, device: str = "cpu") -> int:
    """Train `model` (on `device`) in place: `epochs` passes of Adam over `loader`, each minibatch moved to `device`
    as a tutorial's loop moves it; returns the number of steps."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps = 0
    for _ in range(epochs):
        for X, y in loader:
            X, y = X.to(device), y.to(device)
            optimizer.zero_grad()
            F.cross_entropy(model(X), y).backward()
            optimizer.step()
            steps += 1
    return steps


def ivon_admm_update(
    model: nn.Module,
    loader: Iterable,
    m_g: Tensor,
    s_g: Tensor,
    v_k: Tensor,
    u_k: Tensor,
    hp: dict,
    round_: int,
    lr: float,
    num_examples: int,
    device: str = "cpu",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One client's IVON-ADMM step from the broadcast (m_g, s_g) and its duals (v_k, u_k) (module docstring), all on
    `device` with `model`; each minibatch is moved there. `lr` is this round's step size (the schedule applied).
    Returns the new duals and the reply (a, b) = (v_k + ρ s_k m_k, u_k + ρ s_k). `model` ends holding m_k."""
    rho, tau, gamma = hp["rho"], hp["tau"], hp["gamma"]
    ess = num_examples / (rho * tau)
    v, u, delta = tau * v_k / num_examples, tau * u_k / num_examples, s_g / ess
    h0 = hp["hess_init"] if round_ <= 1 or not hp.get("restart_at_q_g", False) else 0.0
    nn.utils.vector_to_parameters(m_g.clone(), model.parameters())
    params = list(model.parameters())
    beta1, beta2 = hp.get("beta1", 0.9), hp["beta2"]
    if ivon_opt is not None:
        opt = ivon_opt.IVON(
            params,
            lr=lr,
            ess=ess,
            hess_init=hp["hess_init"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=0.0,
            rescale_lr=False,
        )
        group = opt.param_groups[0]
        group["weight_decay"] = delta  # a vector: ivon-opt's arithmetic takes it as it takes a number
        group["hess"] = torch.full_like(m_g, h0)
        shift = v - delta * m_g  # the constant terms of the mean's gradient
    else:
        from bayesadmm.optim import IVON

        opt = IVON(
            params,
            lr=lr,
            ess=ess,
            hess_init=h0,
            beta1=beta1,
            beta2=beta2,
            rescale_lr=False,
            prior_mean=m_g,
            prior_precision=s_g,
            v=v,
            u=u,
        )
        group = None
    for _ in range(hp["epochs"]):
        for X, y in loader:
            X, y = X.to(device), y.to(device)
            with opt.sampled_params(train=True):
                opt.zero_grad()
                F.cross_entropy(model(X), y).backward()
            if group is not None:  # ivon-opt: add the terms it does not know (module docstring)
                m = nn.utils.parameters_to_vector(params).detach()
                opt.state["avg_grad"] += shift - u * m
                opt.state["avg_nxg"] -= u / (ess * (group["hess"] + delta))
            opt.step()
    m_k = nn.utils.parameters_to_vector(params).detach().clone()
    if group is not None:
        s_k = ess * (group["hess"] + delta)
    else:
        s_k = opt.get_posterior()[1]
    if not (torch.isfinite(m_k).all() and (s_k > 0).all()):
        raise FloatingPointError("IVON diverged on this client")
    v_k = v_k + gamma * (s_k * m_k - s_g * m_g)
    u_k = u_k + gamma * (s_k - s_g)
    return v_k, u_k, v_k + rho * s_k * m_k, u_k + rho * s_k


def ivon_admm_server(a_sum: Tensor, b_sum: Tensor, hp: dict, num_clients: int) -> tuple[Tensor, Tensor]:
    """(m_g, s_g) from the sums of the clients' replies (Eq. 54; the prior N(0, δ0⁻¹))."""
    scale = 1.0 + hp["rho"] * num_clients
    s_g = (hp["delta"] + b_sum) / scale
    return a_sum / scale / s_g, s_g
