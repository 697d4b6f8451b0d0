"""IVON's hyperparameters checked and converted once into the fixed inputs of its fused kernels (`UpdateTerms`,
`update_terms`), and the checks the functional core (`optim.ivon`) and `optim.IVON` share."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


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
    the fused kernels take: vectors (d,) delta, prior_mean, v, u (zeros where absent; with full_vectors=False None
    where absent and δ 0-d where it is a number); lr 0-d or (d,); 0-d ess, beta1, beta2, clip_radius; and the
    debias switch with β₁ as a number (the divisor 1 − β₁ᵗ changes every step). Built by `update_terms`; preparing
    them once instead of every step saves about a dozen tensor conversions and validations per step."""

    delta: Tensor
    prior_mean: Tensor | None
    v: Tensor | None
    u: Tensor | None
    lr: Tensor
    ess: Tensor
    beta1: Tensor
    beta2: Tensor
    clip_radius: Tensor
    beta1_value: float
    debias: bool
    grad_noise: Tensor | None = None  # the gradients' known noise variance s² (0-d or (d,)); None: none


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
    full_vectors: bool = True,
    grad_noise: float | Tensor | None = None,
) -> UpdateTerms:
    """Validate `update`'s fixed inputs for a mean shaped like `like` and convert them once (`UpdateTerms`).
    check=False skips the elementwise check δ ≥ 0 (see `noise_scale`); the cheap checks always run.

    full_vectors=True makes δ, prior_mean, v and u vectors (zeros where absent): one compiled kernel for every
    combination, what the federated solver wants. False keeps prior_mean, v, u None where absent and δ 0-d where it
    is a number: the kernels skip what is absent (`kernels.update_step`), each combination in a compiled variant
    of its own, for the nn.Module optimizer whose users mostly set only a weight decay.

    grad_noise: the variance s² (a number, or per coordinate) of zero-mean noise of known scale in the gradients the
    steps will be given, independent of everything else (example-level DP's Gaussian noise, s = σC/B), whose share
    of the Hessian update the kernels then remove (`kernels.update_step`); None (default): IVON's update as it is."""
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
    noise = None
    if grad_noise is not None:
        noise = torch.as_tensor(grad_noise, dtype=like.dtype, device=like.device)
        if tuple(noise.shape) not in ((), (d,)):
            raise ValueError(f"grad_noise must be a scalar or have shape ({d},), got {tuple(noise.shape)}")
        if not bool(((noise >= 0) & (noise < math.inf)).all()):
            raise ValueError("grad_noise (the gradients' noise variance) must be finite and >= 0")
    vec, sca = (lambda x: _vector(x, like)), (lambda x: _scalar(x, like))  # noqa: E731
    if full_vectors:
        delta_term, prior_mean, v, u = vec(delta), vec(prior_mean), vec(v), vec(u)
    else:
        delta_term = vec(delta) if torch.is_tensor(delta) and delta.dim() > 0 else sca(delta)
        prior_mean, v, u = (None if x is None else vec(x) for x in (prior_mean, v, u))
    return UpdateTerms(
        delta_term,
        prior_mean,
        v,
        u,
        vec(lr) if torch.is_tensor(lr) and lr.dim() > 0 else sca(lr),
        sca(ess),
        sca(beta1),
        sca(beta2),
        sca(clip_radius),
        float(beta1),
        bool(debias),
        noise,
    )
