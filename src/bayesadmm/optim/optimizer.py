"""`IVON`, a `torch.optim.Optimizer` for nn.Modules with the constructor and `sampled_params` protocol of the public
`ivon-opt` package (0.1.3), built on the functional core of `optim.ivon` (the maths, its fixed points and the
conventions shared with ivon-opt are in that module's docstring), so that the maths lives in one place. Its groups'
flat buffers and its own fused kernels are in `optim.flat_group`, the handling of its parameter groups (state,
checks, checkpoints) in `optim.param_groups`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import cast

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.optim import kernels
from bayesadmm.optim.flat_group import (
    _flat_grads,
    _FlatGroup,
    _perturbation_step,
    _update_and_perturb_step_,
    _write,
)
from bayesadmm.optim.ivon import IVONState, _kernel_args, check_noise_scale, posterior, sample, update
from bayesadmm.optim.ivon_terms import UpdateTerms, _scalar, _vector, update_terms
from bayesadmm.optim.param_groups import _IVONGroups, _Vec


class IVON(_IVONGroups):
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

    Noise: noise="counter" (default) draws ε from the counter-based stream of `rng.counter_normal` inside IVON's
    fused kernels (`optim.kernels`), keyed once per group from `generator` (None: the global RNG): the cheaper of
    the two (torch's generator alone costs about half an Adam step on a CPU), and the key and draw count are in
    `state_dict`, so a reloaded optimizer continues the same noise by itself. With it, `step()` draws the next
    sample's noise in the same kernel as the update, and the next `sampled_params` uses it unless h or the
    hyperparameters changed in between (then it draws the same block of the stream again). noise="torch" draws ε
    from `generator` with torch's generator (None: the global RNG), one randn per group per `sampled_params` entry
    as ivon-opt does: ivon-opt's noise draw for draw, and so its steps up to rounding. That generator is the
    caller's and not part of `state_dict`: save its `get_state()` alongside to resume identically.

    Memory: with flatten=True (default) each group's parameters become views of one flat buffer at construction
    (p.data is re-pointed; the values are kept), so that a step runs the compiled kernels on the parameters in
    place, and IVON's h and g are updated in place too (`state_dict()` returns copies). A group whose parameters
    cannot share one buffer (non-contiguous, overlapping, or a tensor subclass), or where a parameter's .data is
    later replaced (e.g. by `module.to(dtype)`), is instead copied between its parameters and flat vectors at every
    step: the same numbers, a few passes over the parameters slower. Pass flatten=False for that from the start,
    e.g. where other tensors view a parameter's memory and must keep seeing it.

    The hyperparameters, prior and duals are validated when they change (h + δ > 0 included), not at every step;
    the update keeps h + δ positive.

    Left out of ivon-opt's options: hess_approx (only "price", the Stein estimator above) and sync (distributed).
    """

    _HYPER = ("lr", "ess", "hess_init", "beta1", "beta2", "weight_decay", "clip_radius", "rescale_lr", "debias")
    _TERMS_FROM = (*_HYPER, "prior_mean", "prior_precision", "v", "u", "hess")

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
        noise: str = "counter",
        flatten: bool = True,
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
        self._flatten = bool(flatten)
        self._flats: list[_FlatGroup | None] = []  # one per param group, in order
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

    # -- the kernel inputs of a group with a flat buffer --

    def _terms(self, group: dict, flat: _FlatGroup) -> UpdateTerms:
        """The group's kernel inputs (`update_terms`), rebuilt and validated (h + δ > 0 included) only when something
        they are made of changed: building them is about a dozen conversions and three model-sized allocations, the
        check of h + δ two passes and a sync, together more than the update itself. Tensors are recognised by
        identity and version counter, so replacing one or changing it in place both count; `refs` keeps them alive
        so that their ids stay theirs."""
        sources = [group[name] for name in self._TERMS_FROM]
        # h changes at every step, in place: only a new h tensor (set_posterior, load_state_dict) counts
        key = tuple((id(x), x._version if x is not sources[-1] else 0) if torch.is_tensor(x) else x for x in sources)
        if key != flat.key or flat.terms is None:
            self._check_hyper(group)
            hyper = self._hyper(group)
            # only what the user set: no prior mean or duals, and δ one number for a weight decay, leave the kernels
            # four model-sized vectors fewer to read per step
            flat.terms = update_terms(flat.mean, **hyper, full_vectors=False)
            check_noise_scale(
                IVONState(flat.mean, group["hess"], group["momentum"], group["step"]), group["ess"], hyper["delta"]
            )
            flat.key, flat.refs, flat.ahead = key, sources, None
            flat.generation += 1
        return flat.terms

    @staticmethod
    def _ahead_token(group: dict, flat: _FlatGroup) -> tuple:
        """What a perturbation σε drawn ahead depends on: the kernel inputs (δ, ess), h and the block of the stream."""
        return flat.generation, group["hess"]._version, group["draws"], id(group["noise_key"])

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
        # per group already overwritten: (its flat buffer or None, the mean to restore), and ε
        overwritten: list[tuple[_FlatGroup | None, Tensor]] = []
        eps: list[Tensor] = []
        try:
            for i, g in enumerate(self.param_groups):
                flat = self._live(i)
                if flat is not None:
                    eps.append(self._sample_into(g, flat))
                    overwritten.append((flat, flat.saved))
                    continue
                state = self._state(i)
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
                eps.append(e[0])
                _write(g["params"], thetas[0])
                overwritten.append((None, state.mean))
            yield
            if train:
                for g, (flat, _), e in zip(self.param_groups, overwritten, eps, strict=True):
                    if flat is not None and flat.intact(g["params"]):
                        grads = flat.gather_grads(first=not g["_samples"])
                    else:
                        grads = _flat_grads(g["params"])
                    g["_samples"].append((grads, e))
        finally:
            # after an error part-way through sampling, only the groups already overwritten have a mean to restore
            for g, (flat, mean) in zip(self.param_groups, overwritten, strict=False):
                if flat is not None and flat.intact(g["params"]):
                    flat.mean.copy_(mean)
                    flat.written()
                else:
                    _write(g["params"], mean)
            self._sampling = False

    def _sample_into(self, group: dict, flat: _FlatGroup) -> Tensor:
        """Keep m in flat.saved and write θ = m + σε into the parameters' buffer; returns ε (d,)."""
        terms, mean = self._terms(group, flat), flat.mean
        if self.noise == "counter":
            ahead, flat.ahead = flat.ahead, None
            if ahead is not None and ahead[0] == self._ahead_token(group, flat):
                _, perturbation, e = ahead
            else:
                key = rng.block_key(group["noise_key"], group["draws"])
                perturbation, e = _perturbation_step(group["hess"], terms.delta, terms.ess, key)
            group["draws"] += 1
            e = e[0]
        else:
            e = rng.randn((1, mean.numel()), self.generator, mean.dtype, mean.device)[0]
            # σε with `sample`'s roundings (σ = rsqrt(ess (h + δ))), in place to save allocations
            perturbation = (group["hess"] + terms.delta).mul_(group["ess"]).rsqrt_().mul_(e)
        # two eager passes: one compiled kernel writing both took longer on the papers' MLP (63 against 36 µs; a
        # compiled call costs ~20 µs before any work), and m must be kept exactly to be restored on exit
        flat.saved.copy_(mean)
        mean.add_(perturbation)
        flat.written()
        return e

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
        for i, g in enumerate(self.param_groups):
            samples = g["_samples"]
            if not samples:
                raise RuntimeError(
                    "step() needs at least one sample: compute the loss gradient inside "
                    "`with optimizer.sampled_params(train=True):` first"
                )
            if len(samples) == 1:
                grads, eps = samples[0][0].unsqueeze(0), samples[0][1].unsqueeze(0)
            else:
                grads, eps = torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples])
            flat = self._live(i)
            if flat is not None:
                self._step_flat(g, flat, grads, eps)
            else:
                self._check_hyper(g)
                new = update(
                    self._state(i),
                    grads,
                    eps,
                    **self._hyper(g),
                    # every input was validated: the hyperparameters just above, prior and duals when set, the
                    # curvature when the samples were drawn; the per-step elementwise checks cost more than
                    # the update itself
                    check=False,
                )
                _write(g["params"], new.mean)
                g["hess"], g["momentum"], g["step"] = new.hess, new.momentum, new.step
            g["_samples"] = []
        return loss

    def _step_flat(self, group: dict, flat: _FlatGroup, grads: Tensor, eps: Tensor) -> None:
        """The update written into the parameters' buffer, h and g; with noise="counter" fused with drawing the
        perturbation σε of the sample the next `sampled_params` takes (one compiled call per step instead of two)."""
        terms = self._terms(group, flat)
        args = _kernel_args(IVONState(flat.mean, group["hess"], group["momentum"], group["step"]), grads, eps, terms)
        group["step"] += 1
        if self.noise == "torch":
            kernels.update_step_(*args)
            flat.written()
            return
        perturbation, e = _update_and_perturb_step_(*args, rng.block_key(group["noise_key"], group["draws"]))
        flat.written()
        flat.ahead = (self._ahead_token(group, flat), perturbation, e)

    # -- the posterior --

    def get_posterior(self) -> tuple[Tensor, Tensor]:
        """(m, s) over all parameters (group order, flat), s = ess (h + δ) the diagonal precision."""
        parts = [posterior(self._state(i), g["ess"], self._delta(g)) for i, g in enumerate(self.param_groups)]
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
        self._forget()


__all__ = ["IVON"]
