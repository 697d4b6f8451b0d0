"""The parameter groups of `optim.IVON` (`optimizer.py`) whose parameters are views of one flat buffer
(`_FlatGroup`), the helpers that move values between parameters and flat vectors, and the optimizer's own fused
kernels, which update and sample such a buffer in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor
from torch.autograd.graph import increment_version

from bayesadmm import rng
from bayesadmm.optim import kernels
from bayesadmm.optim.ivon_terms import UpdateTerms


def _flatten(tensors: Iterable[Tensor]) -> Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _flat_grads(params: Sequence[Tensor]) -> Tensor:
    # A parameter the loss does not touch has p.grad None: its loss gradient is zero, but the prior and the duals
    # still act on it, so it is updated rather than skipped.
    return torch.cat([(p.grad.detach() if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def _write(params: Sequence[Tensor], flat: Tensor) -> None:
    # In place, so the Parameter objects (and anything holding them) keep their storage; vector_to_parameters would
    # instead make each parameter a view of `flat`.
    with torch.no_grad():
        for p, piece in zip(params, _views(flat, params), strict=True):
            p.copy_(piece)


def _views(flat: Tensor, params: Sequence[Tensor]) -> list[Tensor]:
    """Consecutive pieces of `flat` shaped like `params`."""
    views, offset = [], 0
    for p in params:
        views.append(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return views


def _can_share_one_buffer(params: Sequence[Tensor]) -> bool:
    """Whether `params` can become views of one flat buffer without changing what any of them is: plain dense
    tensors, contiguous (a channels-last weight would silently lose its memory format) and disjoint in memory (a
    parameter listed twice, or two viewing one storage, would be pulled apart)."""
    if any(
        type(p) not in (torch.nn.Parameter, Tensor) or p.layout != torch.strided or not p.is_contiguous()
        for p in params
    ):
        return False
    spans = sorted((p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()) for p in params if p.numel())
    return all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))


# The optimizer's own fused kernels (compiled like those in optim/kernels.py, whose functions they call). With
# noise="counter", `step()` draws the next step's noise in the update's kernel, but the optimizer cannot hand over the
# next θ = m + σε ready-made as the federated solver does: m is the parameters, which anyone may write between
# `step()` and `sampled_params` (even through .data, which no version counter sees), and checking that they did not
# costs a comparison pass that is dearer than a compiled call. So the kernels return the perturbation σε, which
# depends only on h, δ, ess and the block of the stream (all the optimizer's own), and `sampled_params` adds it to m
# as it then is: θ = m + (σε), the same two roundings as the kernels' m + σε (no contraction into fused
# multiply-adds, see torch._inductor.config.cpp.enable_floating_point_contract_flag).


def _perturbation(hess: Tensor, delta: Tensor, ess: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
    """(σε (d,), ε (1, d)) with σ = 1/sqrt(ess (h + δ)) and ε the block of the stream with key `key`."""
    d = hess.shape[0]
    eps = rng.counter_normal(key, d, hess.dtype, hess.device).view(1, d)
    return torch.rsqrt(ess * (hess + delta)) * eps[0], eps


_perturbation_step = kernels.fused(_perturbation)


@kernels.fused
def _update_and_perturb_step_(
    mean: Tensor,
    hess: Tensor,
    momentum: Tensor,
    grads: Tensor,
    eps: Tensor,
    delta: Tensor,
    prior_mean: Tensor | None,
    v: Tensor | None,
    u: Tensor | None,
    lr: Tensor,
    ess: Tensor,
    beta1: Tensor,
    beta2: Tensor,
    debias: Tensor,
    clip_radius: Tensor,
    key: Tensor,
) -> tuple[Tensor, Tensor]:
    """`kernels.update_step_`, then `_perturbation` from the new h: one loop once compiled. As there, prior_mean, v,
    u may be None and δ 0-d (the optimizer's kernel inputs, `IVON._terms`): that variant reads none of them."""
    new = kernels.update_step(
        mean, hess, momentum, grads, eps, delta, prior_mean, v, u, lr, ess, beta1, beta2, debias, clip_radius
    )
    for state, value in zip((mean, hess, momentum), new, strict=True):
        state.copy_(value)
    return _perturbation(new[1], delta, ess, key)


class _FlatGroup:
    """A param group whose parameters are views of one flat buffer, `mean`, which holds m between steps: the compiled
    kernels read and write the parameters there, with no gathering or scattering of the mean.

    saved: m while the parameters hold a sample. grads (grad_views: its pieces): where a step's first sample gathers
    its gradient (a copy: zero_grad sets p.grad to None and backward then allocates it afresh, which is cheaper than
    accumulating into views of one buffer). ptrs: each parameter's address, to notice one whose .data was replaced
    (`IVON._live`). terms, key, refs, generation: the kernel inputs (`UpdateTerms`) and what they were built from
    (`IVON._terms`).
    ahead: (token, σε, ε) of the next sample, drawn by the step's fused kernel with noise="counter".
    """

    __slots__ = (
        "params",
        "mean",
        "ptrs",
        "saved",
        "grads",
        "grad_views",
        "terms",
        "key",
        "refs",
        "generation",
        "ahead",
    )

    def __init__(self, params: list[Tensor]):
        self.params = params
        self.mean = _flatten(params)
        for p, view in zip(params, _views(self.mean, params), strict=True):
            p.data = view
        self.ptrs = [p.data_ptr() for p in params]
        self.saved = torch.empty_like(self.mean)
        self.grads = torch.empty_like(self.mean)
        self.grad_views = _views(self.grads, params)
        self.terms: UpdateTerms | None = None
        self.key: tuple | None = None
        self.refs: list = []
        self.generation = 0
        self.ahead: tuple | None = None

    def intact(self, params: list[Tensor]) -> bool:
        """Whether `params` are still this group's parameters, each still viewing its piece of the buffer."""
        return params is self.params and all(p.data_ptr() == ptr for p, ptr in zip(params, self.ptrs, strict=True))

    def forget(self) -> None:
        """Drop the kernel inputs and the sample drawn ahead (the prior, duals or state were set from outside)."""
        self.key, self.refs, self.ahead = None, [], None

    def gather_grads(self, first: bool) -> Tensor:
        """The parameters' gradients as one flat vector (None: zero, as in `_flat_grads`): a step's first sample's
        into `grads`, a later one's into a new vector (the first is still needed)."""
        flat = self.grads if first else torch.empty_like(self.mean)
        for p, piece in zip(self.params, self.grad_views if first else _views(flat, self.params), strict=True):
            if p.grad is None:
                piece.zero_()
            else:
                piece.copy_(p.grad)
        return flat

    def written(self) -> None:
        """Tell autograd that the parameters changed: writes through the buffer pass by their own version counters
        (p.data was re-pointed), and a graph that saved a parameter before the write must fail its backward, as
        after an in-place write to the parameter itself, rather than use the new values."""
        increment_version(self.params)
