r"""IVON with a per-coordinate Gaussian prior and BayesADMM dual terms (BayesADMM paper, Alg. 2).

IVON (Shen et al. 2024, Alg. 1) fits a diagonal Gaussian q = N(m, diag(σ²)) by minimising, for the MEAN
per-example loss ℓ and the effective sample size λ ("ess"),

    λ E_q[ℓ(θ) + vᵀθ − ½ θᵀ diag(u) θ] + KL(q ‖ N(m_p, diag(s_p)⁻¹)).                                (Alg. 2)

v, u are the client's dual terms in IVON-ADMM (zero for plain IVON); m_p, s_p the prior mean and precision
(plain IVON: m_p = 0, s_p = λ·weight_decay). With δ := s_p / λ, one step t ← t + 1 is

    1. θ_i = m + σ ε_i,  ε_i ~ N(0, I),  σ = 1 / sqrt(λ (h + δ)),                              i = 1..S
    2. ĝ = mean_i ∇ℓ(θ_i),   ĥ = mean_i [∇ℓ(θ_i) ∘ (θ_i − m) / σ²] − u = mean_i [∇ℓ(θ_i) ∘ ε_i] / σ − u
    3. g ← β₁ g + (1 − β₁) ĝ
    4. h ← β₂ h + (1 − β₂) ĥ + ½ (1 − β₂)² (h − ĥ)² / (h + δ)
    5. ḡ = g / (1 − β₁ᵗ)                                                              (debias; off: ḡ = g)
    6. m ← m − α · clip((ḡ + v − u∘m + δ∘(m − m_p)) / (h + δ), ±clip_radius)

and the posterior is q = N(m, diag(s)⁻¹) with s = λ (h + δ) = λ h + s_p.

Why these are the right fixed points: the gradients of the objective in m and σ² vanish where

    E_q[∇ℓ] + v − u∘m + δ∘(m − m_p) = 0     and     1/σ² = λ (E_q[diag ∇²ℓ] − u) + s_p,

and by Stein's lemma E_q[∇ℓ(θ) ∘ ε]/σ = E_q[diag ∇²ℓ], so the averages g, h estimate exactly these expectations.
The −u in ĥ is the exact Stein term of −½θᵀdiag(u)θ; the matching term of vᵀθ has expectation zero and is left out
rather than added as pure noise. Step 4 is IVON's Riemannian update: writing x = h + δ > 0 and r = (x − ĥ − δ)/x,
the new h + δ is x (½ (1 − (1 − β₂) r)² + ½) > 0, so σ stays finite even when ĥ < 0 (non-convex ℓ, large u).

Gradients with known noise (example-level DP, `privacy.example_level`): where each sample's gradient carries
independent zero-mean noise n_i of known variance s² per coordinate (s = σC/B), ĥ carries n̄ = mean_i n_i ∘ ε_i ·
sqrt(λ(h + δ)), of mean zero and, given the ε_i, variance V = λ(h + δ) s² Σ_i ε_i²/S². Steps 2, 3 and the linear term
of 4 are unbiased as they are, but the squared term of step 4 has E[(h − ĥ)²] = (h − ĥ₀)² + V (ĥ₀ the noise-free
estimate): each step adds ½(1 − β₂)² V/(h + δ) = ½(1 − β₂)² λ s² Σ_i ε_i²/S² to h on average. With `grad_noise` = s²
step 4 becomes

    4'. h ← max(β₂ h + (1 − β₂) ĥ + ½ (1 − β₂)² [(h − ĥ)² − V] / (h + δ),  ½(h − δ),  0),

whose first argument A has the noise-free update's expectation over the noise: it is step 4's h less
c = ½(1 − β₂)² λ s² Σ_i ε_i²/S² (= ½(1 − β₂)² V/(h + δ), which does not depend on h). A alone can be ≤ −δ: where V is
large against (h + δ)², the subtraction can outweigh everything else. The floor keeps h ≥ 0 (the posterior's precision
λ(h + δ) at least the prior's s_p; from h₀ ≥ 0, as `init` requires, it holds at every step) and h + δ ≥ ½(old h + δ)
(the bound step 4 keeps: ½(1 − (1 − β₂)r)² + ½ ≥ ½), so h + δ > 0 and σ stays finite. A coordinate whose noise
dwarfs its curvature would otherwise random-walk towards h + δ = 0, where σ and the step α/(h + δ) blow up. The price
is bias: since A ≥ ½(h − δ) − c, the floor raises h by at most c where h ≥ δ (what the uncorrected step adds on
average) and by at most c + ½δ elsewhere, only on the steps where it binds, and a coordinate whose curvature is
negative (h* < 0) is held at 0 rather than estimated.

What we learnt testing the duals: the fixed point is right for any u with diag(u) < E[diag ∇²ℓ] + δ and a positive
definite E[∇²ℓ] − diag(u) + diag(δ), but the mean can overshoot wildly on the way when u is comparable to δ (in one
test problem |m| reached ~100× the solution before settling): the loss gradient enters through the momentum g, which
lags by ~1/(1 − β₁) steps, while −u∘m acts at once, so early on the dual's negative curvature is not yet balanced
by the loss's. A prior-dominated δ (as in IVON-ADMM, where the prior comes from the broadcast q_g), a 10× smaller
lr, or β₁ = 0 each removed the excursion there.

Two layers:

* the functional core (`IVONState`, `init`, `noise_scale`, `sample`, `update`, `posterior`) over flat 1-D tensors:
  pure functions, nothing mutated, noise only from the generator passed in. The federated local solver calls it.
* `IVON` (in `optim.optimizer`), a `torch.optim.Optimizer` for nn.Modules with the constructor and `sampled_params`
  protocol of the public `ivon-opt` package (0.1.3), built on the functional core so that the maths lives in one
  place.

Conventions shared with ivon-opt 0.1.3 (found black-box: signature, README, and by running it side by side; the
test suite checks step-for-step agreement): defaults hess_init = 1, β₁ = 0.9, β₂ = 0.99999, weight_decay = 1e-4,
mc_samples = 1, clip_radius = ∞, debias on; `rescale_lr=True` uses α = lr·(hess_init + δ) (so the first step is an
SGD step of size lr on the regularised loss); one N(0, I) draw per parameter group per `sampled_params` entry,
over the group's parameters flattened in order; `step()` averages however many samples were recorded; `step(closure)`
calls the closure `mc_samples` times (it must enter `sampled_params(train=True)` itself) and returns the mean loss.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.checks import all_positive
from bayesadmm.optim.compilation import COMPILED, Kernels
from bayesadmm.optim.ivon_terms import UpdateTerms, _check_delta, _check_positive, _scalar, _vector, update_terms
from bayesadmm.trees import register

__all__ = [
    "IVONState",
    "UpdateTerms",
    "init",
    "noise_scale",
    "check_noise_scale",
    "sample",
    "update_terms",
    "update",
    "update_with",
    "update_and_sample",
    "update_and_sample_with",
    "posterior",
]


# --- functional core ---------------------------------------------------------------------------------------------


@register
class IVONState(NamedTuple):
    """IVON's state over a flat parameter vector: mean m, Hessian estimate h, gradient momentum g, step count t."""

    mean: Tensor
    hess: Tensor
    momentum: Tensor
    step: int


def init(mean: Tensor, hess_init: float | Tensor) -> IVONState:
    """IVONState(mean, h = hess_init, g = 0, t = 0); `mean` is copied (Alg. 2 starts from m_p; the caller chooses)."""
    if mean.dim() != 1:
        raise ValueError(f"mean must be a flat 1-D tensor, got shape {tuple(mean.shape)}")
    if torch.is_tensor(hess_init):
        if tuple(hess_init.shape) not in ((), tuple(mean.shape)):
            raise ValueError(
                f"hess_init must be a scalar or have shape {tuple(mean.shape)}, got {tuple(hess_init.shape)}"
            )
        if bool((hess_init < 0).any()):
            raise ValueError("hess_init must be >= 0")
        hess = hess_init.to(mean).expand_as(mean).clone()
    else:
        if not hess_init >= 0:
            raise ValueError(f"hess_init must be >= 0, got {hess_init}")
        hess = torch.full_like(mean, float(hess_init))
    return IVONState(mean.detach().clone(), hess, torch.zeros_like(mean), 0)


def noise_scale(state: IVONState, ess: float, delta: Tensor | float, check: bool = True) -> Tensor:
    """σ = 1 / sqrt(ess (h + δ)), the posterior standard deviation.

    check=False skips the elementwise checks (each a full pass and a device sync): for hot loops whose caller
    validated the inputs once and checks the result for non-finite values at the end.
    """
    curvature = _checked_curvature(state, ess, delta, check)
    return torch.rsqrt(ess * curvature)


def check_noise_scale(state: IVONState, ess: float, delta: Tensor | float) -> None:
    """Raise ValueError where `noise_scale` would (ess ≤ 0, or h + δ ≤ 0 somewhere), without computing σ."""
    _checked_curvature(state, ess, delta, True)


def _checked_curvature(state: IVONState, ess: float, delta: Tensor | float, check: bool) -> Tensor:
    _check_positive("ess", ess)
    curvature = state.hess + delta
    # h + δ = 0 happens for hess_init = 0 without a prior; σ would be infinite, so say so instead of sampling inf.
    if check and not all_positive(curvature):
        raise ValueError("h + delta must be > 0 for a finite noise scale (hess_init = 0 needs a prior precision)")
    return curvature


def sample(
    state: IVONState,
    ess: float,
    delta: Tensor | float,
    generator: torch.Generator | Tensor | None,
    mc_samples: int = 1,
    check: bool = True,
    kernels: Kernels = COMPILED,
) -> tuple[Tensor, Tensor]:
    """Draw θ_i = m + σ ε_i for i = 1..S: returns (thetas (S, d), eps (S, d)).

    The noise comes from `generator`:
    * a 0-d int64 key tensor (`rng.stream_key`): block number `state.step` of that counter-based stream
      (`rng.block_key`, `rng.counter_normal`), drawn inside one fused kernel (`optim.kernels`). Fast; what the
      federated solver uses; `kernels` the compiled or eager ones (`optim.compilation`).
    * a torch.Generator, or None for torch's global RNG (what ivon-opt does): one randn((S, d)) call. Note that
      randn((S, d)) is not the same stream as S calls of randn(d); `IVON` draws one row per `sampled_params` entry.
    """
    if mc_samples < 1:
        raise ValueError(f"mc_samples must be >= 1, got {mc_samples}")
    if check:
        _check_delta(delta, state.mean.numel())
    if torch.is_tensor(generator):
        if check:
            noise_scale(state, ess, delta, check)  # raises where h + δ ≤ 0
        mean = state.mean
        return kernels.sample_step(
            mean, state.hess, _vector(delta, mean), _scalar(ess, mean), rng.block_key(generator, state.step), mc_samples
        )
    sigma = noise_scale(state, ess, delta, check)
    eps = rng.randn((mc_samples, state.mean.numel()), generator, state.mean.dtype, state.mean.device)
    return state.mean + sigma * eps, eps


def _checked_terms(state: IVONState, check: bool, **hyper) -> UpdateTerms:
    """`update_terms` for `state`'s mean, and with check=True also that h + δ > 0 (as `noise_scale` checks)."""
    terms = update_terms(state.mean, check=check, **hyper)
    if check:
        noise_scale(state, hyper["ess"], hyper["delta"], check)  # raises where h + δ ≤ 0
    return terms


def update(
    state: IVONState,
    grads: Tensor,
    eps: Tensor,
    *,
    lr: float | Tensor,
    ess: float,
    delta: Tensor | float,
    beta1: float,
    beta2: float,
    prior_mean: Tensor | None = None,
    v: Tensor | None = None,
    u: Tensor | None = None,
    clip_radius: float = math.inf,
    debias: bool = True,
    check: bool = True,
    grad_noise: float | Tensor | None = None,
) -> IVONState:
    """Steps 2–6 of the module docstring from the gradients ∇ℓ(θ_i) (S, d) at the samples drawn with noise eps (S, d).

    lr is the step size α_t itself (a scalar, or per coordinate); `IVON` applies ivon-opt's lr rescaling before
    calling this. σ is recomputed from `state`, which must be the state the samples were drawn from.
    prior_mean=None means m_p = 0; v=None, u=None mean zero dual terms. check=False: see `noise_scale`.
    grad_noise: the known variance of the noise in `grads` (module docstring, "Gradients with known noise"); None:
    none.
    """
    terms = _checked_terms(
        state,
        check,
        lr=lr,
        ess=ess,
        delta=delta,
        beta1=beta1,
        beta2=beta2,
        prior_mean=prior_mean,
        v=v,
        u=u,
        clip_radius=clip_radius,
        debias=debias,
        grad_noise=grad_noise,
    )
    return update_with(state, grads, eps, terms)


def update_with(
    state: IVONState,
    grads: Tensor,
    eps: Tensor,
    terms: UpdateTerms,
    inplace: bool = False,
    kernels: Kernels = COMPILED,
) -> IVONState:
    """`update` with its fixed inputs prepared by `update_terms` (no elementwise checks, as
    `update_and_sample_with`): for the last step of a loop, whose next samples would go unused.
    inplace=True and `kernels`: see `update_and_sample_with`."""
    state, args = _writable(state, grads, eps, terms, inplace)
    kernels.update_step_(*args, terms.grad_noise)
    return state._replace(step=state.step + 1)


def update_and_sample(
    state: IVONState,
    grads: Tensor,
    eps: Tensor,
    key: Tensor,
    mc_samples: int = 1,
    *,
    lr: float | Tensor,
    ess: float,
    delta: Tensor | float,
    beta1: float,
    beta2: float,
    prior_mean: Tensor | None = None,
    v: Tensor | None = None,
    u: Tensor | None = None,
    clip_radius: float = math.inf,
    debias: bool = True,
    check: bool = True,
    grad_noise: float | Tensor | None = None,
) -> tuple[IVONState, Tensor, Tensor]:
    """`update`, then `sample` from the new state with the counter-based stream `key`, in one fused kernel:
    (new state, thetas (S, d), eps (S, d)) for the next step. The same numbers as the two calls (up to rounding);
    the sampling reads m, h and δ while the update has them at hand instead of in a second pass over memory.
    In a loop, prepare the fixed inputs once with `update_terms` and call `update_and_sample_with`."""
    terms = _checked_terms(
        state,
        check,
        lr=lr,
        ess=ess,
        delta=delta,
        beta1=beta1,
        beta2=beta2,
        prior_mean=prior_mean,
        v=v,
        u=u,
        clip_radius=clip_radius,
        debias=debias,
        grad_noise=grad_noise,
    )
    return update_and_sample_with(state, grads, eps, key, mc_samples, terms)


def update_and_sample_with(
    state: IVONState,
    grads: Tensor,
    eps: Tensor,
    key: Tensor,
    mc_samples: int,
    terms: UpdateTerms,
    inplace: bool = False,
    kernels: Kernels = COMPILED,
) -> tuple[IVONState, Tensor, Tensor]:
    """`update_and_sample` with its fixed inputs prepared by `update_terms`: the hot loop's call. No elementwise
    checks: the caller checks h + δ > 0 before the loop and the result for non-finite values after it.

    inplace=True writes the new m, h, g into `state`'s tensors (returned in a state with the step advanced): the same
    numbers, 12–17 % less time per step on the papers' MLP (optim/kernels.py), for a loop that owns its state (e.g. one
    made by `init`, which copies). They must not share memory with each other or the other inputs (checked).
    `kernels`: the compiled kernels (default) or the eager maths (`optim.compilation.EAGER`), equal to rounding.
    """
    step = state.step + 1
    state, args = _writable(state, grads, eps, terms, inplace)
    thetas, new_eps = kernels.update_and_sample_step_(*args, rng.block_key(key, step), mc_samples, terms.grad_noise)
    return state._replace(step=step), thetas, new_eps


def _writable(state: IVONState, grads: Tensor, eps: Tensor, terms: UpdateTerms, inplace: bool) -> tuple:
    """(state, kernel arguments) for the in-place kernels: `state` itself if inplace (after checking that writing m,
    h or g changes no other input), else a copy of it (the pure functions' result)."""
    if not inplace:
        copy = state._replace(mean=state.mean.clone(), hess=state.hess.clone(), momentum=state.momentum.clone())
        return copy, _kernel_args(copy, grads, eps, terms)
    args = _kernel_args(state, grads, eps, terms)
    written = [t.untyped_storage().data_ptr() for t in state[:3]]
    read = [t.untyped_storage().data_ptr() for t in args[3:] if torch.is_tensor(t) and t.dim() > 0]
    if len(set(written)) < 3 or set(written) & set(read):
        raise ValueError(
            "an in-place IVON step needs mean, hess and momentum that share memory with no other "
            "input (make the state with ivon.init, which copies)"
        )
    return state, args


def _kernel_args(state: IVONState, grads: Tensor, eps: Tensor, terms: UpdateTerms) -> tuple:
    """kernels.update_step's arguments for one step from `state`."""
    d = state.mean.numel()
    if grads.dim() != 2 or grads.shape[1] != d or grads.shape != eps.shape:
        raise ValueError(
            f"grads and eps must both have shape (S, {d}), got {tuple(grads.shape)} and {tuple(eps.shape)}"
        )
    debias = 1.0 - terms.beta1_value ** (state.step + 1) if terms.debias else 1.0
    return (
        state.mean,
        state.hess,
        state.momentum,
        grads,
        eps,
        terms.delta,
        terms.prior_mean,
        terms.v,
        terms.u,
        terms.lr,
        terms.ess,
        terms.beta1,
        terms.beta2,
        _scalar(debias, state.mean),
        terms.clip_radius,
    )


def posterior(state: IVONState, ess: float, delta: Tensor | float) -> tuple[Tensor, Tensor]:
    """(m, s) with s = ess (h + δ) = ess·h + s_p, the diagonal precision of q."""
    _check_positive("ess", ess)
    # (h + δ)·ess into the one new tensor: the bits of ess·(h + δ) (multiplication commutes exactly)
    return state.mean.clone(), (state.hess + delta).mul_(ess)
