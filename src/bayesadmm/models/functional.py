r"""Neural networks evaluated from one flat parameter vector.

The federated algorithms keep a model's parameters as one flat 1-D tensor ``θ ∈ R^d``: the server's algebra on
natural parameters (``λ = (s∘m, −½ s)`` for the diagonal family) is then elementwise arithmetic on vectors of length
``d``, the same for every architecture.  A :class:`FlatModel` is the bridge from such a vector to an ``nn.Module``.
With the module's parameters ``j = 1, …, J`` in ``named_parameters()`` order, of shapes ``shape_j`` and sizes ``n_j``,
and offsets ``o_j = Σ_{i<j} n_i`` (so ``d = Σ_j n_j``):

    unflatten(θ)             = {name_j: θ[o_j : o_j + n_j].view(shape_j)}       (views, no copies)
    forward(θ, X)            = f(X; unflatten(θ))                               (torch.func.functional_call)
    forward_batched(Θ, X)[s] = forward(Θ[s], X)                                 (torch.func.vmap over the rows of Θ)

``forward`` is an ordinary function of ``θ``, so ``autograd``, ``torch.func.grad`` and ``vmap`` all apply to it
directly.  The module is only a template of the computation: it lives on the ``meta`` device, so a forward pass that
accidentally read its own weights would fail instead of silently using stale values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn import functional as F

__all__ = ["FlatModel", "mean_nll"]


class _Slot(NamedTuple):
    """Where one named parameter lives in the flat vector (its offset is the sum of the earlier sizes)."""

    name: str
    shape: torch.Size
    numel: int


@dataclass(frozen=True, eq=False)
class FlatModel:
    """A parameter-only ``nn.Module`` seen as a function ``(θ, X) ↦ logits`` of a flat vector ``θ`` of length ``dim``.

    ``build`` is a zero-argument callable returning a freshly initialised module.  It is called once for the
    template and again by :meth:`initial_params`, so it must build the same architecture every time; a
    ``functools.partial`` of a module-level function keeps the model picklable for worker processes.

    Only parameter-only modules are supported: buffers (BatchNorm's running statistics, for instance) are state
    that changes in the forward pass and is not part of ``θ``, which would break the pure ``(θ, X) ↦ logits`` view;
    use GroupNorm or LayerNorm instead.  The template is in eval mode, so ``forward`` is deterministic and all the
    randomness of an algorithm comes from its explicit generators.
    """

    build: Callable[[], nn.Module]
    module: nn.Module = field(init=False, repr=False)
    dim: int = field(init=False)
    _slots: tuple[_Slot, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        module = self.build()
        if not isinstance(module, nn.Module):
            raise ValueError(f"build() must return an nn.Module, got {type(module).__name__}")
        buffers = [name for name, _ in module.named_buffers()]
        if buffers:
            raise ValueError(
                f"FlatModel only supports parameter-only modules, but {type(module).__name__} has buffers "
                f"{buffers}; replace BatchNorm by GroupNorm or LayerNorm"
            )
        slots = tuple(_Slot(name, p.shape, p.numel()) for name, p in module.named_parameters())
        if not slots:
            raise ValueError(f"{type(module).__name__} has no parameters")
        object.__setattr__(self, "module", module.to("meta").eval())
        object.__setattr__(self, "dim", sum(slot.numel for slot in slots))
        object.__setattr__(self, "_slots", slots)

    def initial_params(self, generator: torch.Generator) -> Tensor:
        """The flat parameters of a freshly built module with PyTorch's default initialisation.

        The ``nn.init`` functions draw from the global RNG, so the module is built under ``fork_rng`` with the global
        CPU generator seeded from ``generator``: the result depends only on ``generator``, and the caller's global
        RNG state is left exactly as it was.
        """
        seed = int(torch.randint(0, 2**62, (), generator=generator))
        with torch.random.fork_rng(devices=[]):
            # Seed only the CPU generator: torch.manual_seed would also reseed CUDA generators that
            # fork_rng(devices=[]) does not restore.
            torch.random.default_generator.manual_seed(seed)
            module = self.build()
        return self.flatten(dict(module.named_parameters())).detach()

    def flatten(self, params: Mapping[str, Tensor]) -> Tensor:
        """``θ = concat_j vec(params[name_j])``, the inverse of :meth:`unflatten` (a new tensor)."""
        names = [slot.name for slot in self._slots]
        if set(params) != set(names):
            raise ValueError(f"parameter names {sorted(params)} do not match the model's {sorted(names)}")
        for slot in self._slots:
            if params[slot.name].shape != slot.shape:
                raise ValueError(
                    f"parameter {slot.name!r} must have shape {tuple(slot.shape)}, "
                    f"got {tuple(params[slot.name].shape)}"
                )
        return torch.cat([params[slot.name].reshape(-1) for slot in self._slots])

    def unflatten(self, theta: Tensor) -> dict[str, Tensor]:
        """``{name_j: θ[o_j : o_j + n_j].view(shape_j)}``: views into ``θ``, so gradients flow back to it."""
        if not isinstance(theta, Tensor) or tuple(theta.shape) != (self.dim,):
            shape = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
            raise ValueError(f"theta must have shape ({self.dim},), got {shape}")
        chunks = theta.split([slot.numel for slot in self._slots])
        return {slot.name: chunk.view(slot.shape) for slot, chunk in zip(self._slots, chunks)}

    def forward(self, theta: Tensor, X: Tensor) -> Tensor:
        """Logits ``f(X; θ)`` of shape ``(N, C)`` for a batch of inputs ``X`` of shape ``(N, ...)``.

        Floating-point inputs are cast to ``θ``'s dtype: the parameters decide the precision of the computation, so
        a float64 posterior can be evaluated on float32 images.
        """
        if X.is_floating_point() and X.dtype != theta.dtype:
            X = X.to(theta.dtype)
        return functional_call(self.module, self.unflatten(theta), (X,))

    def forward_batched(self, thetas: Tensor, X: Tensor) -> Tensor:
        """Logits of shape ``(S, N, C)`` for ``S`` parameter vectors ``thetas`` of shape ``(S, d)`` on the same ``X``.

        One vectorised pass (``vmap``) instead of ``S`` Python-level calls; activation memory grows like ``S·N``.
        """
        if not isinstance(thetas, Tensor) or thetas.dim() != 2 or thetas.shape[1] != self.dim:
            shape = tuple(thetas.shape) if isinstance(thetas, Tensor) else type(thetas).__name__
            raise ValueError(f"thetas must have shape (S, {self.dim}), got {shape}")
        return vmap(self.forward, in_dims=(0, None))(thetas, X)


def mean_nll(model: FlatModel, theta: Tensor, X: Tensor, y: Tensor) -> Tensor:
    """``(1/N) Σ_i −log softmax(f(x_i; θ))_{y_i}``, differentiable with respect to ``θ``."""
    return F.cross_entropy(model.forward(theta, X), y)
