"""IVON's per-step elementwise work as fused kernels: `sample_step`, and the update `update_step` (alone, or with the
next step's sampling: `update_and_sample_step`), compiled in its in-place form (`update_step_`,
`update_and_sample_step_`).

Why: written as eager torch, one IVON step is ~25 separate passes over the parameter vector, each allocating a fresh
tensor; for the papers' 178k-parameter MLP on a CPU they cost more than the forward and backward pass together, and
torch's sequential normal generator another ~0.6 ms (docs/performance.md). Each function below is one loop once
torch.compile (Inductor) fuses it, and the sampling kernel draws its noise from the counter-based stream of
`rng.counter_normal` inside that loop.

The functions are plain torch and are the reference: `fused(fn)` compiles them on first use and falls back to running
them eagerly (with one warning) where compilation is unavailable (no C++ compiler, an unsupported device) or switched
off with BAYESADMM_COMPILE=0 (an override for tests and debugging). Whether a run calls the compiled or the eager
ones is its `compile` setting (`optim.compilation`: each solver holds its choice). Compiled and eager agree to
rounding (tests/optim/test_kernels.py), not necessarily bit for bit (Inductor computes some scalar arithmetic in
double precision).

Every hyperparameter is a tensor, never a Python float (torch.compile treats Python numbers as constants and would
recompile for every new learning rate), and every per-coordinate quantity is a full vector even where it is constant
(one compiled kernel per dtype, sample count 1 or more and scalar or vector lr, rather than one per combination).
The exception is `update_step`'s prior mean and duals, which may be None, and its δ, which may be 0-d: the
nn.Module optimizer passes them so where its user set no prior or duals, in a compiled variant of its own that reads
four fewer model-sized vectors per step.
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from bayesadmm import rng

__all__ = [
    "compile_enabled",
    "fused",
    "recheck_compile_enabled",
    "sample_rows_step",
    "sample_step",
    "update_and_sample_step",
    "update_and_sample_step_",
    "update_step",
    "update_step_",
]

# dtype × sample count 1 or more × scalar or vector lr: up to 8 variants per kernel, torch's default recompile limit,
# after which it would stop compiling. The kernels get a limit of their own instead; torch's global setting is left
# as it is.
RECOMPILE_LIMIT = 16


def compile_enabled() -> bool:
    """Whether the compiled kernels may compile: False where BAYESADMM_COMPILE=0 (an override for tests and
    debugging; a run's own choice is its `compile` setting, `optim.compilation`). Each kernel reads it on its first
    call, and again after `recheck_compile_enabled`."""
    return os.environ.get("BAYESADMM_COMPILE", "1") != "0"


_checks = [0]  # bumped by recheck_compile_enabled: kernels that read the setting before read it again


def recheck_compile_enabled() -> None:
    """Makes every kernel read BAYESADMM_COMPILE again on its next call (for tests that switch it between tests). A
    kernel compiled before keeps its compiled form for when compiling is switched back on."""
    _checks[0] += 1


def fused(fn: Callable, *, inductor_config: dict[str, Any] | None = None) -> Callable:
    """`fn` compiled with torch.compile on its first call, or `fn` itself where compiling fails or is switched off.
    Inductor compiles it with the settings `inductor_config` (default `INDUCTOR_CONFIG`; {}: torch's own)."""
    state: dict[str, Any] = {}
    config = INDUCTOR_CONFIG if inductor_config is None else inductor_config

    @functools.wraps(fn)
    def run(*args):
        if state.get("checked") != _checks[0]:
            state["checked"] = _checks[0]
            if compile_enabled():
                if "compiled" not in state:
                    state["compiled"] = _compiled(fn, config)
                state["impl"] = state["compiled"]
            else:
                state["impl"] = fn
        if state["impl"] is fn:
            return fn(*args)
        try:
            return state["impl"](*args)
        except Exception as exc:  # noqa: BLE001 — any compiler failure: run the same maths eagerly instead
            warnings.warn(
                f"torch.compile failed for {fn.__name__} ({type(exc).__name__}: {exc}); running it "
                f"eagerly (slower, same maths)",
                RuntimeWarning,
                stacklevel=2,
            )
            state["impl"] = state["compiled"] = fn
            return fn(*args)

    run.eager = fn  # type: ignore[attr-defined]   # the uncompiled function, for tests and debugging
    # whether this process has run it compiled already (a run's first round then does not wait for the compiler)
    run.compiled_here = lambda: "compiled" in state and state["compiled"] is not fn  # type: ignore[attr-defined]
    return run


# Inductor settings for compiling the kernels, in force only while one of them compiles (`_inductor_backend`): no
# process-wide setting is changed. Inductor inlines a pointwise result into every use instead of computing it once
# (it keeps one in memory only past some size or read count), and its lowering traces each use in full, so the
# noise's integer hashes (rng.counter_normal: x ^ (x >>> s) uses x twice, three stages per hash, hashes nested)
# grew into expression trees of hundreds of thousands of nodes: 40–60 s of Python codegen per kernel variant on a
# cold cache, for ~350 lines of C++. realize_reads_threshold=0 makes every pointwise result with more than one use
# (and a read of some input) a node of its own; the scheduler fuses them back into the one loop and drops the
# in-kernel buffers, so the C++ has the same operations in another order (the same numbers, bit for bit, at the same
# speed) and the compile costs about what a trivial kernel's does.
INDUCTOR_CONFIG: dict[str, Any] = {"realize_reads_threshold": 0}
# `sample_rows_step`'s (clients, pairs) nodes: Inductor merges the two loops of a node whose buffers are contiguous,
# and a merged node no longer fuses with the unmerged ones (those reading a client's key, or writing the cat's
# halves): ~10 % slower through the extra buffers. Padded rows (the padding Inductor does on GPUs, for dynamic
# shapes too) keep every node's loops apart, and they fuse into one loop nest again; the outputs are not padded.
ROWS_INDUCTOR_CONFIG: dict[str, Any] = {
    **INDUCTOR_CONFIG,
    "comprehensive_padding": True,
    "disable_padding_cpu": False,
    "pad_dynamic_shapes": True,
}


def _inductor_backend(config: dict[str, Any]) -> str | Callable:
    """torch.compile's Inductor backend with `config` in force while it compiles (recompiles included).

    (A config patch, not torch.compile(options=...): options make Inductor wrap its inner compiler, which torch 2.13
    cannot hash for its on-disk cache, so every process would compile afresh. Patched here, the settings are part of
    the cache key as usual and a later process loads the compiled kernel from the cache. Settings this torch does not
    have are left out.)
    """
    if not config:
        return "inductor"

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        from torch._inductor import config as inductor
        from torch._inductor.compile_fx import compile_fx

        with inductor.patch({key: value for key, value in config.items() if hasattr(inductor, key)}):
            return compile_fx(gm, example_inputs)

    backend.compiler_name = "inductor"  # type: ignore[attr-defined]   # for torch's debugging and repro tools
    return backend


def _compiled(fn: Callable, config: dict[str, Any]) -> Callable:
    """torch.compile(fn) with Inductor under `config`, allowed `RECOMPILE_LIMIT` variants.

    (Not options={"size_asserts": False}: it would save ~18 µs per call, but torch 2.13 then caches nothing on disk
    and every process compiles each kernel afresh. The recompile limit is not part of the cache key.)
    """
    backend = _inductor_backend(config)
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        limit: dict[str, Any] = {"recompile_limit": RECOMPILE_LIMIT}  # (torch's typed overloads do not list it)
        return torch.compile(fn, backend=backend, dynamic=True, fullgraph=True, **limit)
    return _compiled_with_scoped_limit(fn, backend)


def _compiled_with_scoped_limit(fn: Callable, backend: str | Callable) -> Callable:
    """For a torch whose torch.compile takes no recompile limit: the global one is raised only while a call that may
    compile runs, i.e. the first call of every variant (the variants already run are tracked here, so later calls
    pay only for the lookup)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # its older name
    compiled = torch.compile(fn, backend=backend, dynamic=True, fullgraph=True)
    seen: set[tuple] = set()

    @functools.wraps(fn)
    def run(*args):
        key = _variant(args)
        if key in seen:
            return compiled(*args)
        with config.patch(**{name: max(getattr(config, name), RECOMPILE_LIMIT)}):
            result = compiled(*args)
        seen.add(key)
        return result

    return run


def _variant(args: tuple) -> tuple:
    """What tells the compiled variants apart: each tensor's dtype, device and shape with the sizes above 1 merged
    (dynamic shapes specialise only on 0 and 1), and the other arguments' values."""
    return tuple(
        (a.dtype, a.device, tuple(min(size, 2) for size in a.shape)) if isinstance(a, Tensor) else a for a in args
    )


@fused
def sample_step(
    mean: Tensor, hess: Tensor, delta: Tensor, ess: Tensor, key: Tensor, mc_samples: int
) -> tuple[Tensor, Tensor]:
    """(θ (S, d), ε (S, d)) with θ_i = m + σ ε_i, σ = 1/sqrt(ess (h + δ)), ε the S·d draws of the block with key
    `key` (`rng.block_key`). Vectors (d,): mean, hess, delta; 0-d: ess, key (int64)."""
    d = mean.shape[0]
    eps = rng.counter_normal(key, mc_samples * d, mean.dtype, mean.device).view(mc_samples, d)
    sigma = torch.rsqrt(ess * (hess + delta))
    return mean + sigma * eps, eps


@functools.partial(fused, inductor_config=ROWS_INDUCTOR_CONFIG)
def sample_rows_step(
    mean: Tensor, hess: Tensor, delta: Tensor, ess: Tensor, keys: Tensor, mc_samples: int
) -> tuple[Tensor, Tensor]:
    """`sample_step` for several clients at once: row i of (θ (A, S, d), ε (A, S, d)) is `sample_step` of row i of
    mean, hess, delta, ess (A, d) with key keys[i] (keys (A,), int64): each client's own stream of noise."""
    rows, d = mean.shape
    # keys as a column: one row of draws per client, with `rows` a dynamic size (vmap over the keys made torch.compile
    # specialise on it: a compilation for every number of clients still active in a cohort)
    eps = rng.counter_normal(keys.unsqueeze(1), mc_samples * d, mean.dtype, mean.device).view(rows, mc_samples, d)
    sigma = torch.rsqrt(ess * (hess + delta))
    return mean.unsqueeze(1) + sigma.unsqueeze(1) * eps, eps


def update_step(
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
    grad_noise: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Steps 2–6 of IVON (optim/ivon.py's docstring): the new (m, h, g). Vectors (d,): mean, hess, momentum,
    prior_mean, v, u; samples (S, d): grads, eps; 0-d: ess, beta1, beta2, debias (the divisor 1 − β₁ᵗ, 1: off) and
    clip_radius (inf: no clipping); delta and lr 0-d or (d,).

    prior_mean, v or u None: m_p = 0, v = 0 or u = 0, with their terms left out rather than computed on zeros (the
    same numbers: x − 0, x + 0 and x − 0·m are x), so a compiled variant for them reads no vector for them. The
    federated solver passes all three as vectors; the nn.Module optimizer passes what its user set.

    grad_noise (0-d or (d,); None: none): the known variance s² per coordinate of independent zero-mean noise in
    each sample's gradient (example-level DP's privatised gradient, s = σC/B). Step 4 then subtracts the noise's
    expected share of its squared term, ½(1 − β₂)²·ess·s²·mean_i(ε_i²)/S, and keeps h ≥ max(0, ½(old h − δ))
    (optim/ivon.py's docstring, "Gradients with known noise"); None leaves step 4 as it is, bit for bit."""
    curvature = hess + delta
    g_hat = grads.mean(dim=0)
    # (θ − m)/σ² = ε/σ = ε·sqrt(ess (h + δ)): no division by the rounded σ, no re-derivation of θ − m
    h_hat = (grads * eps).mean(dim=0) * torch.sqrt(ess * curvature)
    if u is not None:
        h_hat = h_hat - u
    new_momentum = beta1 * momentum + (1.0 - beta1) * g_hat
    new_hess = beta2 * hess + (1.0 - beta2) * h_hat + 0.5 * (1.0 - beta2) ** 2 * (hess - h_hat) ** 2 / curvature
    if grad_noise is not None:
        # E[(h − ĥ)²] over the gradient's noise exceeds its noise-free value by Var(ĥ | ε) = ess·(h + δ)·s²·Σε_i²/S²;
        # its share of the squared term, divided by h + δ, no longer depends on h. The floor: h ≥ 0 (the precision
        # at least the prior's) and h + δ ≥ ½(old h + δ) (the bound IVON's own step 4 keeps), so h + δ stays > 0
        # and cannot collapse where the noise dwarfs the curvature (σ_q and the step α/(h + δ) would blow up)
        samples = eps.shape[0]
        excess = 0.5 * (1.0 - beta2) ** 2 * ess * grad_noise * eps.square().mean(dim=0) / samples
        new_hess = torch.maximum(new_hess - excess, (0.5 * (hess - delta)).clamp(min=0.0))
    # (ḡ + δ∘(m − m_p)) + v − u∘m, summed in this order whichever terms are present
    direction = new_momentum / debias + delta * (mean if prior_mean is None else mean - prior_mean)
    if v is not None:
        direction = direction + v
    if u is not None:
        direction = direction - u * mean
    # the new h is used in the preconditioner, as in Shen et al. (and ivon-opt)
    ratio = (direction / (new_hess + delta)).clamp(-clip_radius, clip_radius)
    return mean - lr * ratio, new_hess, new_momentum


def update_and_sample_step(
    mean: Tensor,
    hess: Tensor,
    momentum: Tensor,
    grads: Tensor,
    eps: Tensor,
    delta: Tensor,
    prior_mean: Tensor,
    v: Tensor,
    u: Tensor,
    lr: Tensor,
    ess: Tensor,
    beta1: Tensor,
    beta2: Tensor,
    debias: Tensor,
    clip_radius: Tensor,
    key: Tensor,
    mc_samples: int,
    grad_noise: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """`update_step`, then `sample_step` from its result: (m, h, g, θ, ε). One loop once compiled."""
    new_mean, new_hess, new_momentum = update_step(
        mean,
        hess,
        momentum,
        grads,
        eps,
        delta,
        prior_mean,
        v,
        u,
        lr,
        ess,
        beta1,
        beta2,
        debias,
        clip_radius,
        grad_noise,
    )
    thetas, new_eps = sample_step.eager(new_mean, new_hess, delta, ess, key, mc_samples)  # type: ignore[attr-defined]
    return new_mean, new_hess, new_momentum, thetas, new_eps


# The compiled forms of the two update functions above, which are the maths (and the eager reference): they write the
# new m, h and g into the input tensors instead of three new model-sized ones per step. Loops that own their IVON
# state (the federated solver) call them directly, on the papers' MLP a whole step (forward and backward included)
# 12–17 % faster than with a kernel returning new tensors (benchmarks/ivon_step.py: in place / new 0.83 on AVX-512,
# 0.88 on AVX2; the kernel timed alone showed no difference: fresh output buffers cost memory traffic in the full
# loop); optim/ivon.py's pure functions call them on copies of the state. One compiled form per operation, not a
# pure and an in-place one: each variant adds its own compilation (seconds on a CPU, ~10 s for the first kernel of a
# process; see INDUCTOR_CONFIG) to a cold start.
# mean, hess and momentum must not share memory with each other or with any other input (optim/ivon.py checks).


@fused
def update_step_(
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
    grad_noise: Tensor | None = None,
) -> None:
    """`update_step` with the new (m, h, g) written into mean, hess and momentum (None terms: as there)."""
    new = update_step(
        mean,
        hess,
        momentum,
        grads,
        eps,
        delta,
        prior_mean,
        v,
        u,
        lr,
        ess,
        beta1,
        beta2,
        debias,
        clip_radius,
        grad_noise,
    )
    for state, value in zip((mean, hess, momentum), new, strict=True):
        state.copy_(value)


@fused
def update_and_sample_step_(
    mean: Tensor,
    hess: Tensor,
    momentum: Tensor,
    grads: Tensor,
    eps: Tensor,
    delta: Tensor,
    prior_mean: Tensor,
    v: Tensor,
    u: Tensor,
    lr: Tensor,
    ess: Tensor,
    beta1: Tensor,
    beta2: Tensor,
    debias: Tensor,
    clip_radius: Tensor,
    key: Tensor,
    mc_samples: int,
    grad_noise: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """`update_and_sample_step` with the new (m, h, g) written into mean, hess and momentum: returns (θ, ε)."""
    *new, thetas, new_eps = update_and_sample_step(
        mean,
        hess,
        momentum,
        grads,
        eps,
        delta,
        prior_mean,
        v,
        u,
        lr,
        ess,
        beta1,
        beta2,
        debias,
        clip_radius,
        key,
        mc_samples,
        grad_noise,
    )
    for state, value in zip((mean, hess, momentum), new, strict=True):
        state.copy_(value)
    return thetas, new_eps
