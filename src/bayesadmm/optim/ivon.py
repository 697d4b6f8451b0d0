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

What we learnt testing the duals: the fixed point is right for any u with diag(u) < E[diag ∇²ℓ] + δ and a positive
definite E[∇²ℓ] − diag(u) + diag(δ), but the mean can overshoot wildly on the way when u is comparable to δ (in one
test problem |m| reached ~100× the solution before settling): the loss gradient enters through the momentum g, which
lags by ~1/(1 − β₁) steps, while −u∘m acts at once, so early on the dual's negative curvature is not yet balanced
by the loss's. A prior-dominated δ (as in IVON-ADMM, where the prior comes from the broadcast q_g), a 10× smaller
lr, or β₁ = 0 each removed the excursion there.

Two layers:

* the functional core (`IVONState`, `init`, `noise_scale`, `sample`, `update`, `posterior`) over flat 1-D tensors:
  pure functions, nothing mutated, noise only from the generator passed in. The federated local solver calls it.
* `IVON`, a `torch.optim.Optimizer` for nn.Modules with the constructor and `sampled_params` protocol of the public
  `ivon-opt` package (0.1.3), built on the functional core so that the maths lives in one place.

Conventions shared with ivon-opt 0.1.3 (found black-box: signature, README, and by running it side by side; the
test suite checks step-for-step agreement): defaults hess_init = 1, β₁ = 0.9, β₂ = 0.99999, weight_decay = 1e-4,
mc_samples = 1, clip_radius = ∞, debias on; `rescale_lr=True` uses α = lr·(hess_init + δ) (so the first step is an
SGD step of size lr on the regularised loss); one N(0, I) draw per parameter group per `sampled_params` entry,
over the group's parameters flattened in order; `step()` averages however many samples were recorded; `step(closure)`
calls the closure `mc_samples` times (it must enter `sampled_params(train=True)` itself) and returns the mean loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple, cast, overload

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.checks import all_positive
from bayesadmm.optim import kernels

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
    "IVON",
]


# --- functional core ---------------------------------------------------------------------------------------------


class IVONState(NamedTuple):
    """IVON's state over a flat parameter vector: mean m, Hessian estimate h, gradient momentum g, step count t."""

    mean: Tensor
    hess: Tensor
    momentum: Tensor
    step: int


def _check_positive(name: str, x: float | Tensor) -> None:
    ok = bool((x > 0).all()) if torch.is_tensor(x) else x > 0
    if not ok:
        raise ValueError(f"{name} must be > 0, got {x}")


def _check_beta(name: str, beta: float) -> None:
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"{name} must lie in [0, 1), got {beta}")


def _check_vector(name: str, x: Tensor | None, d: int) -> None:
    if x is not None and tuple(x.shape) != (d,):
        raise ValueError(f"{name} must have shape ({d},) like the mean, got {tuple(x.shape)}")


def _check_delta(delta: Tensor | float, d: int) -> None:
    shape = tuple(delta.shape) if torch.is_tensor(delta) else ()
    if shape not in ((), (d,)):
        raise ValueError(f"delta must be a scalar or have shape ({d},), got {shape}")
    if bool((torch.as_tensor(delta) < 0).any()):
        raise ValueError("delta = prior precision / ess must be >= 0")


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
) -> tuple[Tensor, Tensor]:
    """Draw θ_i = m + σ ε_i for i = 1..S: returns (thetas (S, d), eps (S, d)).

    The noise comes from `generator`:
    * a 0-d int64 key tensor (`rng.stream_key`): block number `state.step` of that counter-based stream
      (`rng.block_key`, `rng.counter_normal`), drawn inside one fused kernel (`optim.kernels`). Fast; what the
      federated solver uses.
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


def _scalar(x: float | Tensor, like: Tensor) -> Tensor:
    """A scalar hyperparameter as a 0-d tensor of the mean's dtype and device (see optim/kernels.py: no floats)."""
    return torch.as_tensor(x, dtype=like.dtype, device=like.device)


def _vector(x: Tensor | float | None, like: Tensor) -> Tensor:
    """A per-coordinate quantity (None: 0) as a vector shaped like the mean. The kernels always get full vectors, so
    torch.compile makes one kernel per dtype instead of one per scalar/vector combination."""
    if x is None:
        return torch.zeros_like(like)
    x = torch.as_tensor(x, dtype=like.dtype, device=like.device)
    return x if x.shape == like.shape else x.expand_as(like).clone()


class UpdateTerms(NamedTuple):
    """The inputs of steps 2–6 that stay fixed over many steps (a client's whole solve), validated and in the form
    the fused kernels take: vectors (d,) delta, prior_mean, v, u (zeros where absent); lr 0-d or (d,); 0-d ess,
    beta1, beta2, clip_radius; and the debias switch with β₁ as a number (the divisor 1 − β₁ᵗ changes every step).
    Built by `update_terms`; preparing them once instead of every step saves about a dozen tensor conversions and
    validations per step."""

    delta: Tensor
    prior_mean: Tensor
    v: Tensor
    u: Tensor
    lr: Tensor
    ess: Tensor
    beta1: Tensor
    beta2: Tensor
    clip_radius: Tensor
    beta1_value: float
    debias: bool


def update_terms(
    like: Tensor,
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
) -> UpdateTerms:
    """Validate `update`'s fixed inputs for a mean shaped like `like` and convert them once (`UpdateTerms`).
    check=False skips the elementwise check δ ≥ 0 (see `noise_scale`); the cheap checks always run."""
    d = like.numel()
    _check_positive("lr", lr)
    _check_positive("ess", ess)
    _check_beta("beta1", beta1)
    _check_beta("beta2", beta2)
    if not clip_radius > 0:
        raise ValueError(f"clip_radius must be > 0, got {clip_radius}")
    if check:
        _check_delta(delta, d)
    for name, x in (("prior_mean", prior_mean), ("v", v), ("u", u)):
        _check_vector(name, x, d)
    vec, sca = (lambda x: _vector(x, like)), (lambda x: _scalar(x, like))  # noqa: E731
    return UpdateTerms(
        vec(delta),
        vec(prior_mean),
        vec(v),
        vec(u),
        vec(lr) if torch.is_tensor(lr) and lr.dim() > 0 else sca(lr),
        sca(ess),
        sca(beta1),
        sca(beta2),
        sca(clip_radius),
        float(beta1),
        bool(debias),
    )


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
) -> IVONState:
    """Steps 2–6 of the module docstring from the gradients ∇ℓ(θ_i) (S, d) at the samples drawn with noise eps (S, d).

    lr is the step size α_t itself (a scalar, or per coordinate); `IVON` applies ivon-opt's lr rescaling before
    calling this. σ is recomputed from `state`, which must be the state the samples were drawn from.
    prior_mean=None means m_p = 0; v=None, u=None mean zero dual terms. check=False: see `noise_scale`.
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
    )
    return update_with(state, grads, eps, terms)


def update_with(state: IVONState, grads: Tensor, eps: Tensor, terms: UpdateTerms, inplace: bool = False) -> IVONState:
    """`update` with its fixed inputs prepared by `update_terms` (no elementwise checks, as
    `update_and_sample_with`): for the last step of a loop, whose next samples would go unused.
    inplace=True: see `update_and_sample_with`."""
    state, args = _writable(state, grads, eps, terms, inplace)
    kernels.update_step_(*args)
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
) -> tuple[IVONState, Tensor, Tensor]:
    """`update_and_sample` with its fixed inputs prepared by `update_terms`: the hot loop's call. No elementwise
    checks: the caller checks h + δ > 0 before the loop and the result for non-finite values after it.

    inplace=True writes the new m, h, g into `state`'s tensors (returned in a state with the step advanced): the same
    numbers, 5–7 % less time per step on the papers' MLP (optim/kernels.py), for a loop that owns its state (e.g. one
    made by `init`, which copies). They must not share memory with each other or the other inputs (checked).
    """
    step = state.step + 1
    state, args = _writable(state, grads, eps, terms, inplace)
    thetas, new_eps = kernels.update_and_sample_step_(*args, rng.block_key(key, step), mc_samples)
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


# --- the torch.optim.Optimizer -----------------------------------------------------------------------------------


_Vec = Tensor | Sequence[Tensor] | float | None


def _flatten(tensors: Iterable[Tensor]) -> Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _flat_grads(params: Sequence[Tensor]) -> Tensor:
    # A parameter the loss does not touch has p.grad None: its loss gradient is zero, but the prior and the duals
    # still act on it, so it is updated rather than skipped.
    return torch.cat([(p.grad.detach() if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def _write(params: Sequence[Tensor], flat: Tensor) -> None:
    # In place, so the Parameter objects (and anything holding them) keep their storage; vector_to_parameters would
    # instead make each parameter a view of `flat`.
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n


class IVON(torch.optim.Optimizer):
    r"""IVON for nn.Modules with a per-coordinate prior N(m_p, diag(s_p)⁻¹) and dual terms v, u (module docstring).

    Usage (the same pattern as the ivon-opt package's):

    ```python
    opt = IVON(model.parameters(), lr=0.1, ess=len(train_set), generator=torch.Generator().manual_seed(0))
    for x, y in loader:
        for _ in range(opt.mc_samples):
            with opt.sampled_params(train=True):
                opt.zero_grad()
                loss_fn(model(x), y).backward()
        opt.step()
    ```

    Between steps the parameters hold the posterior mean m. Inside `sampled_params` they hold a sample θ = m + σε;
    on exit they are restored to m exactly and, with train=True, p.grad (as it stands, so zero it inside the context)
    and ε are recorded for the next `step()`, which averages all recorded samples.

    Hyperparameters (per parameter group, like ivon-opt): lr, ess, hess_init, beta1, beta2, weight_decay, clip_radius,
    rescale_lr, debias. δ = prior_precision / ess when a prior precision is set, else δ = weight_decay (ivon-opt's
    s_p = ess·weight_decay). rescale_lr=True steps with α = lr·(hess_init + δ), per coordinate when δ is; use
    rescale_lr=False for a natural-gradient step of size lr (lr = 1 being a full Newton step).

    prior_mean, prior_precision, v, u cover all parameters of all groups, in group order: a flat vector, a sequence
    of tensors shaped like the parameters, or (prior_precision only) a float. Change them later with `set_prior` and
    `set_duals`.

    Noise: noise="torch" (default) draws ε from `generator` with torch's generator (None: the global RNG, as
    ivon-opt does); the generator is the caller's and not part of `state_dict`: save its `get_state()` alongside to
    resume identically. noise="counter" draws ε from the counter-based stream of `rng.counter_normal` inside IVON's
    fused sampling kernel (`optim.kernels`), keyed once per group from `generator`: about as fast as Adam's step,
    and the key and draw count are in `state_dict`, so a reloaded optimizer continues the same noise by itself.

    Left out of ivon-opt's options: hess_approx (only "price", the Stein estimator above) and sync (distributed).
    """

    _HYPER = ("lr", "ess", "hess_init", "beta1", "beta2", "weight_decay", "clip_radius", "rescale_lr", "debias")

    def __init__(
        self,
        params,
        lr: float,
        ess: float,
        hess_init: float = 1.0,
        beta1: float = 0.9,
        beta2: float = 0.99999,
        weight_decay: float | None = None,
        mc_samples: int = 1,
        clip_radius: float = math.inf,
        rescale_lr: bool = True,
        debias: bool = True,
        prior_mean: _Vec = None,
        prior_precision: _Vec = None,
        v: _Vec = None,
        u: _Vec = None,
        generator: torch.Generator | None = None,
        noise: str = "torch",
    ):
        if noise not in ("torch", "counter"):
            raise ValueError(f"noise must be 'torch' or 'counter', got {noise!r}")
        if weight_decay is not None and prior_precision is not None:
            raise ValueError("give either weight_decay or prior_precision (= ess * weight_decay), not both")
        if weight_decay is None and prior_precision is None:
            weight_decay = 1e-4  # ivon-opt's default
        if mc_samples < 1:
            raise ValueError(f"mc_samples must be >= 1, got {mc_samples}")
        self.mc_samples = int(mc_samples)
        self.generator = generator
        self.noise = noise
        self._sampling = False
        defaults = dict(
            lr=lr,
            ess=ess,
            hess_init=hess_init,
            beta1=beta1,
            beta2=beta2,
            weight_decay=weight_decay,
            clip_radius=clip_radius,
            rescale_lr=rescale_lr,
            debias=debias,
        )
        super().__init__(params, defaults)
        self.set_prior(prior_mean, prior_precision)
        self.set_duals(v, u)

    # -- groups and their state --

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        params = group["params"]
        if len({(p.dtype, p.device) for p in params}) != 1:
            raise ValueError("all parameters of a group must share dtype and device (they form one flat vector)")
        self._check_hyper(group)
        p0 = params[0]
        group["numel"] = sum(p.numel() for p in params)
        group["hess"] = torch.full((group["numel"],), float(group["hess_init"]), dtype=p0.dtype, device=p0.device)
        group["momentum"] = torch.zeros_like(group["hess"])
        group["step"] = 0
        if self.noise == "counter":
            # one stream per group; "draws" counts the samples taken from it (one block of `numel` draws each)
            group["noise_key"], group["draws"] = rng.stream_key(self.generator), 0
        for key in ("prior_mean", "prior_precision", "v", "u"):
            group.setdefault(key, None)
        group["_samples"] = []

    @staticmethod
    def _check_hyper(group: dict) -> None:
        _check_positive("lr", group["lr"])
        _check_positive("ess", group["ess"])
        _check_beta("beta1", group["beta1"])
        _check_beta("beta2", group["beta2"])
        if not group["hess_init"] >= 0:
            raise ValueError(f"hess_init must be >= 0, got {group['hess_init']}")
        wd = group["weight_decay"]
        if wd is not None and not wd >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {wd}")
        if not group["clip_radius"] > 0:
            raise ValueError(f"clip_radius must be > 0, got {group['clip_radius']}")

    def _delta(self, group: dict) -> Tensor | float:
        if group["prior_precision"] is not None:
            return group["prior_precision"] / group["ess"]
        if group["weight_decay"] is None:
            raise ValueError("this group has neither a prior precision nor a weight decay")
        return float(group["weight_decay"])

    def _lr(self, group: dict) -> Tensor | float:
        if not group["rescale_lr"]:
            return group["lr"]
        return group["lr"] * (group["hess_init"] + self._delta(group))

    def _state(self, group: dict) -> IVONState:
        return IVONState(_flatten(group["params"]), group["hess"], group["momentum"], group["step"])

    @overload
    def _split(self, name: str, value: None, allow_scalar: bool = False) -> list[None]: ...
    @overload
    def _split(
        self, name: str, value: Tensor | Sequence[Tensor] | float, allow_scalar: bool = False
    ) -> list[Tensor]: ...
    @overload
    def _split(self, name: str, value: _Vec, allow_scalar: bool = False) -> list[Tensor | None]: ...
    def _split(self, name: str, value: _Vec, allow_scalar: bool = False) -> Sequence[Tensor | None]:
        """A flat vector / per-parameter tensors / (optionally) a float over all groups -> one flat tensor per group."""
        if value is None:
            return [None] * len(self.param_groups)
        params = [p for g in self.param_groups for p in g["params"]]
        p0 = params[0]
        total = sum(p.numel() for p in params)
        if not torch.is_tensor(value) and isinstance(value, (int, float)):
            if not allow_scalar:
                raise ValueError(f"{name} must be a tensor or a sequence of tensors")
            flat = torch.full((total,), float(value), dtype=p0.dtype, device=p0.device)
        elif torch.is_tensor(value):
            if tuple(value.shape) != (total,):
                raise ValueError(
                    f"{name} as a tensor must be flat with {total} entries, got shape {tuple(value.shape)}"
                )
            flat = value.detach().to(dtype=p0.dtype, device=p0.device).clone()
        else:
            value = list(value)
            if len(value) != len(params) or any(
                tuple(x.shape) != tuple(p.shape) for x, p in zip(value, params, strict=True)
            ):
                raise ValueError(
                    f"{name} as a sequence must hold one tensor shaped like each parameter, got shapes "
                    f"{[tuple(x.shape) for x in value]}"
                )
            flat = _flatten(value).to(dtype=p0.dtype, device=p0.device)
        parts: list[Tensor] = []
        offset = 0
        for g in self.param_groups:
            parts.append(flat[offset : offset + g["numel"]].clone())
            offset += g["numel"]
        return parts

    def set_prior(self, mean: _Vec = None, precision: _Vec = None) -> None:
        """Set the prior N(m_p, diag(s_p)⁻¹); mean=None is m_p = 0, precision=None is s_p = ess·weight_decay."""
        means = self._split("prior_mean", mean)
        precisions = self._split("prior_precision", precision, allow_scalar=True)
        for s in precisions:
            if s is not None and bool((s < 0).any()):
                raise ValueError("prior_precision must be >= 0")
        for g, m_p, s_p in zip(self.param_groups, means, precisions, strict=True):
            if s_p is None and g["weight_decay"] is None:
                raise ValueError("precision=None needs a weight_decay for every group")
            g["prior_mean"], g["prior_precision"] = m_p, s_p
        for g in self.param_groups:
            if not bool((g["hess"] + self._delta(g) > 0).all()):
                raise ValueError(
                    "h + delta must be > 0: with hess_init = 0 give a positive prior precision or weight_decay"
                )

    def set_duals(self, v: _Vec = None, u: _Vec = None) -> None:
        """Set the dual terms of Alg. 2 (None: zero)."""
        for g, v_g, u_g in zip(self.param_groups, self._split("v", v), self._split("u", u), strict=True):
            g["v"], g["u"] = v_g, u_g

    # -- sampling and stepping --

    @contextmanager
    def sampled_params(self, train: bool = False) -> Iterator[None]:
        """Inside, the parameters hold θ = m + σε; on exit m is restored and (train=True) p.grad, ε are recorded."""
        if self._sampling:
            raise RuntimeError("sampled_params is not re-entrant")
        self._sampling = True
        means, eps = [], []
        try:
            for g in self.param_groups:
                state = self._state(g)
                if self.noise == "counter":
                    delta = self._delta(g)
                    check_noise_scale(state, g["ess"], delta)  # raises where `sample` would, without computing σ
                    thetas, e = kernels.sample_step(
                        state.mean,
                        state.hess,
                        _vector(delta, state.mean),
                        _scalar(g["ess"], state.mean),
                        rng.block_key(g["noise_key"], g["draws"]),
                        1,
                    )
                    g["draws"] += 1
                else:
                    thetas, e = sample(state, g["ess"], self._delta(g), self.generator, mc_samples=1)
                means.append(state.mean)
                eps.append(e[0])
                _write(g["params"], thetas[0])
            yield
            if train:
                for g, e in zip(self.param_groups, eps, strict=True):
                    g["_samples"].append((_flat_grads(g["params"]), e))
        finally:
            # after an error part-way through sampling, only the groups already overwritten have a mean to restore
            for g, m in zip(self.param_groups, means, strict=False):
                _write(g["params"], m)
            self._sampling = False

    @torch.no_grad()
    # torch types the closure as returning a float; here, as in torch's own optimizers, it returns the loss tensor
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:  # type: ignore[override]
        """One IVON step from the recorded samples. A closure is called mc_samples times (it must enter
        `sampled_params(train=True)` itself, like ivon-opt's); the mean of its losses is returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                # a sum of tensors (mc_samples >= 1), never sum's start value 0
                loss = cast(Tensor, sum(closure() for _ in range(self.mc_samples))) / self.mc_samples
        for g in self.param_groups:
            if not g["_samples"]:
                raise RuntimeError(
                    "step() needs at least one sample: compute the loss gradient inside "
                    "`with optimizer.sampled_params(train=True):` first"
                )
            self._check_hyper(g)
            grads = torch.stack([s[0] for s in g["_samples"]])
            eps = torch.stack([s[1] for s in g["_samples"]])
            new = update(
                self._state(g),
                grads,
                eps,
                lr=self._lr(g),
                ess=g["ess"],
                delta=self._delta(g),
                beta1=g["beta1"],
                beta2=g["beta2"],
                prior_mean=g["prior_mean"],
                v=g["v"],
                u=g["u"],
                clip_radius=g["clip_radius"],
                debias=g["debias"],
                # every input was validated: the hyperparameters just above, prior and duals when set, the
                # curvature when the samples were drawn; the per-step elementwise checks cost more than
                # the update itself
                check=False,
            )
            _write(g["params"], new.mean)
            g["hess"], g["momentum"], g["step"] = new.hess, new.momentum, new.step
            g["_samples"] = []
        return loss

    # -- the posterior --

    def get_posterior(self) -> tuple[Tensor, Tensor]:
        """(m, s) over all parameters (group order, flat), s = ess (h + δ) the diagonal precision."""
        parts = [posterior(self._state(g), g["ess"], self._delta(g)) for g in self.param_groups]
        return torch.cat([m for m, _ in parts]), torch.cat([s for _, s in parts])

    def set_posterior(
        self,
        mean: Tensor | Sequence[Tensor],
        precision: Tensor | Sequence[Tensor] | float,
        reset_momentum: bool = False,
    ) -> None:
        """Set m (into the parameters) and h = s/ess − δ. Momentum and step count are kept unless reset_momentum."""
        means = self._split("mean", mean)
        precisions = self._split("precision", precision, allow_scalar=True)
        for s in precisions:
            if not bool((s > 0).all()):
                raise ValueError("precision must be > 0")
        for g, m, s in zip(self.param_groups, means, precisions, strict=True):
            _write(g["params"], m)
            g["hess"] = s / g["ess"] - self._delta(g)
            g["_samples"] = []
            if reset_momentum:
                g["momentum"], g["step"] = torch.zeros_like(g["momentum"]), 0

    # -- checkpoints: the state lives in the param groups (replaced, never mutated, so state_dict is a snapshot) --

    def state_dict(self) -> dict:
        sd = super().state_dict()
        for g in sd["param_groups"]:
            g.pop("_samples", None)  # recorded samples belong to an unfinished step
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        for g in self.param_groups:
            p0 = g["params"][0]
            if self.noise == "counter" and "noise_key" not in g:
                raise ValueError(
                    "this state dict is of an IVON with noise='torch'; load it into one with the same "
                    "noise, or set noise='torch'"
                )
            if g["numel"] != sum(p.numel() for p in g["params"]):
                raise ValueError("loaded state dict does not match the size of the parameters")
            for key in ("hess", "momentum", "prior_mean", "prior_precision", "v", "u"):
                if g.get(key) is not None:
                    g[key] = g[key].to(dtype=p0.dtype, device=p0.device)
            g["_samples"] = []
