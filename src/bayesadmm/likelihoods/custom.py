"""``NegLogLikelihood``: a user-written per-example negative log-likelihood, with optional curvature callables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from bayesadmm.likelihoods.base import CURVATURE_MEMBERS, _draws_per_example, _mixture_nll, _squeeze_singleton


@dataclass(frozen=True)
class NegLogLikelihood:
    """A user-written per-example negative log-likelihood ``fn(outputs (N, ...), targets (N, ...)) -> (N,)``.

    ``fn`` sees the targets as they are and the outputs as the model returns them, except that one extra trailing
    dimension of size 1 is squeezed as in ``GaussianRegression`` (so a ``Linear(·, 1)`` head does not
    broadcast ``(N, 1)`` against ``(N,)`` targets into ``(N, N)``).  It must be differentiable in the outputs for
    training, and picklable (a module-level function or a ``functools.partial`` of one, not a lambda) to reach
    worker processes.  The predictive keeps the draws, and the only metric is the mixture's
    ``nll = −(1/N) Σ_i log (1/S) Σ_s exp(−fn(f_s, y)_i)``.

    Without more it serves the methods that need only the loss. The curvature of ``CurvatureLikelihood`` is given as
    optional callables of the same names and signatures (``output_hessian(outputs) -> (N, C, C)``,
    ``sample_targets(outputs, generator)``, ``soft_targets(outputs)``, each with the outputs flattened to ``(N, C)``
    and returning targets that ``fn`` takes); a method that needs one that was not given refuses to start
    (``require``).
    """

    fn: Callable[[Tensor, Tensor], Tensor]
    output_hessian: Callable[[Tensor], Tensor] | None = None
    sample_targets: Callable[[Tensor, torch.Generator | None], Tensor] | None = None
    soft_targets: Callable[[Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"fn must be a callable (outputs, targets) -> per-example NLL (N,), got {self.fn!r}")
        for name in CURVATURE_MEMBERS:
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be None or a callable {CURVATURE_MEMBERS[name]}, got {value!r}")

    def mean_nll(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """``(1/N) Σ_i fn(outputs, targets)_i``."""
        return self._per_example(outputs, targets).mean()

    def predictive(self, outputs: Tensor) -> Tensor:
        """The draws themselves, moved to shape ``(N, S, ...)``."""
        return _draws_per_example(outputs)

    def metrics(self, summary: Tensor, targets: Tensor) -> dict[str, float]:
        """``nll`` of the mixture over the draws ``summary (N, S, ...)``."""
        if summary.dim() < 2 or summary.shape[0] != targets.shape[0]:
            raise ValueError(
                f"summary must have shape (N, S, ...) with N = {targets.shape[0]} targets, got {tuple(summary.shape)}"
            )
        s = summary.shape[1]
        nll = torch.stack([self._per_example(summary[:, k], targets) for k in range(s)], dim=1)  # (N, S)
        return {"nll": _mixture_nll(-nll).item()}

    def _per_example(self, outputs: Tensor, targets: Tensor) -> Tensor:
        value = self.fn(_squeeze_singleton(outputs, targets, lead=1), targets)
        n = outputs.shape[0]
        if not isinstance(value, Tensor) or tuple(value.shape) != (n,):
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(
                f"fn must return the per-example negative log-likelihood, a tensor of shape (N,) = ({n},), "
                f"got {shape}; "
                "sum over the output dimensions inside fn and do not average over the examples"
            )
        return value
