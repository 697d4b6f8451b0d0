r"""Neural networks evaluated from one flat parameter vector.

The federated algorithms keep a model's parameters as one flat 1-D tensor ``θ ∈ R^d``: the server's algebra on
natural parameters (``λ = (s∘m, −½ s)`` for the diagonal family) is then elementwise arithmetic on vectors of length
``d``, the same for every architecture.  A ``FlatModel`` is the bridge from such a vector to an ``nn.Module``.
With the module's parameters ``j = 1, …, J`` in ``named_parameters()`` order, of shapes ``shape_j`` and sizes ``n_j``,
and offsets ``o_j = Σ_{i<j} n_i`` (so ``d = Σ_j n_j``):

    unflatten(θ)             = {name_j: θ[o_j : o_j + n_j].view(shape_j)}       (views, no copies)
    forward(θ, X)            = f(X; unflatten(θ))                               (torch.func.functional_call)
    forward_batched(Θ, X)[s] = forward(Θ[s], X)                                 (torch.func.vmap over the rows of Θ)
    batched_gradients(Θ, X, ℓ, y)[s] = ∇ ℓ(forward(Θ[s], X[s]), y[s])             (models.batched)

``forward`` is an ordinary function of ``θ``, so ``autograd``, ``torch.func.grad`` and ``vmap`` all apply to it
directly.  The module is only a template of the computation: it lives on the ``meta`` device, so a forward pass that
accidentally read its own weights would fail instead of silently using stale values.

Why a second route for plain MLPs: ``functional_call`` swaps the module's parameters in and out on every call (named
member walks, tie checks, a context manager): for the papers' MLP at batch 32, `python benchmarks/overheads.py`
measured 0.345 ms per forward pass that way against 0.246 ms without, on a 2-core CPU (docs/performance.md).  A
``Sequential`` made only of ``Flatten``, ``Linear`` and elementwise activations is therefore run from a plan fixed at
construction: the same ``F.linear``/activation calls the modules make, on views of ``θ``, so the numbers are the same
bits (tests/models/test_functional.py checks values and gradients against ``functional_call``).  Any other module goes
through ``functional_call``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn import functional as F

from bayesadmm.models import batched

__all__ = ["FlatModel", "mean_nll"]


def _identity(x: Tensor) -> Tensor:
    return x


def _sigmoid_backward(delta: Tensor, out: Tensor) -> Tensor:
    return torch.ops.aten.sigmoid_backward(delta, out)


def _tanh_backward(delta: Tensor, out: Tensor) -> Tensor:
    return torch.ops.aten.tanh_backward(delta, out)


def _relu_backward(delta: Tensor, out: Tensor) -> Tensor:
    return torch.ops.aten.threshold_backward(delta, out, 0)


# the elementwise activations the plan runs as nn.Module.forward does (inplace variants are left to functional_call),
# each with the gradient of its input from its output's gradient and its output (autograd's own kernels; None for
# the identity) for `models.batched`; module-level functions, so that a FlatModel with its plan still pickles for
# the worker processes
_ACTIVATION_FNS: dict[type[nn.Module], tuple[Callable[[Tensor], Tensor], Callable[[Tensor, Tensor], Tensor] | None]] = {
    nn.Sigmoid: (torch.sigmoid, _sigmoid_backward),
    nn.Tanh: (torch.tanh, _tanh_backward),
    nn.ReLU: (F.relu, _relu_backward),
    nn.Identity: (_identity, None),
}


def _sequential_plan(module: nn.Module, names: list[str]) -> tuple | None:
    """For an nn.Sequential of Flatten, Linear and the activations above: one step per layer, ("flatten", start,
    end), ("linear", weight slot, bias slot or None) or ("act", fn, its backward or None), with slots indexing `names`
    (the parameters in named_parameters() order). None for anything else, which then runs through functional_call."""
    if type(module) is not nn.Sequential:
        return None
    plan: list[tuple] = []
    for key, layer in module.named_children():
        kind = type(layer)
        if kind is nn.Flatten:
            plan.append(("flatten", layer.start_dim, layer.end_dim))
        elif kind is nn.Linear:
            bias = names.index(f"{key}.bias") if layer.bias is not None else None
            plan.append(("linear", names.index(f"{key}.weight"), bias))
        elif kind in _ACTIVATION_FNS and not getattr(layer, "inplace", False):
            plan.append(("act", *_ACTIVATION_FNS[kind]))
        else:
            return None
    return tuple(plan)


class _Slot(NamedTuple):
    """Where one named parameter lives in the flat vector (its offset is the sum of the earlier sizes)."""

    name: str
    shape: torch.Size
    numel: int


@dataclass(frozen=True, eq=False)
class FlatModel:
    """An ``nn.Module`` seen as a function ``(θ, X) ↦ logits`` of a flat vector ``θ`` of length ``dim``.

    ``build`` is a zero-argument callable returning a freshly initialised module.  It is called once for the
    template and again by ``initial_params``, so it must build the same architecture every time; a
    ``functools.partial`` of a module-level function keeps the model picklable for worker processes.

    Buffers (BatchNorm's running statistics, for instance) are carried, not trained: their values at construction
    are kept in ``buffers`` and passed to every forward pass as constants, so ``(θ, X) ↦ logits`` stays a pure
    function of ``θ``.  The template is in eval mode (BatchNorm normalises with the carried statistics, Dropout is
    off), so ``forward`` is deterministic and all the randomness of an algorithm comes from its explicit generators.
    Use ``from_module`` for a module you have already built and initialised.
    """

    build: Callable[[], nn.Module]
    module: nn.Module = field(init=False, repr=False)
    dim: int = field(init=False)
    _slots: tuple[_Slot, ...] = field(init=False, repr=False)
    _plan: tuple | None = field(init=False, repr=False)  # see the module docstring; None: functional_call
    buffers: dict[str, Tensor] = field(init=False, repr=False)  # carried constants (CPU), by name

    @classmethod
    def from_module(cls, module: nn.Module) -> FlatModel:
        """The flat view of an existing module: its architecture, and its buffers as constants. Its current parameter
        values are ``flatten(dict(module.named_parameters()))`` (what ``initial_params`` returns for it, the
        generator unused); the module itself is copied, never changed."""
        if not isinstance(module, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(module).__name__}")
        return cls(functools.partial(copy.deepcopy, copy.deepcopy(module)))  # later changes to `module` do not leak in

    def __post_init__(self) -> None:
        module = self.build()
        if not isinstance(module, nn.Module):
            raise ValueError(f"build() must return an nn.Module, got {type(module).__name__}")
        object.__setattr__(self, "buffers", {name: b.detach().cpu().clone() for name, b in module.named_buffers()})
        slots = tuple(_Slot(name, p.shape, p.numel()) for name, p in module.named_parameters())
        if not slots:
            raise ValueError(f"{type(module).__name__} has no parameters")
        object.__setattr__(self, "module", module.to("meta").eval())
        object.__setattr__(self, "dim", sum(slot.numel for slot in slots))
        object.__setattr__(self, "_slots", slots)
        plan = None if self.buffers else _sequential_plan(module, [slot.name for slot in slots])
        object.__setattr__(self, "_plan", plan)

    @property
    def layout(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The flat vector's layout: ``(name_j, shape_j)`` in ``named_parameters()`` order (what ``unflatten`` uses)."""
        return tuple((slot.name, tuple(slot.shape)) for slot in self._slots)

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
        """``θ = concat_j vec(params[name_j])``, the inverse of ``unflatten`` (a new tensor)."""
        names = [slot.name for slot in self._slots]
        if set(params) != set(names):
            raise ValueError(f"parameter names {sorted(params)} do not match the model's {sorted(names)}")
        for slot in self._slots:
            if params[slot.name].shape != slot.shape:
                raise ValueError(
                    f"parameter {slot.name!r} must have shape {tuple(slot.shape)}, got {tuple(params[slot.name].shape)}"
                )
        return torch.cat([params[slot.name].reshape(-1) for slot in self._slots])

    def unflatten(self, theta: Tensor) -> dict[str, Tensor]:
        """``{name_j: θ[o_j : o_j + n_j].view(shape_j)}``: views into ``θ``, so gradients flow back to it."""
        if not isinstance(theta, Tensor) or tuple(theta.shape) != (self.dim,):
            shape = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
            raise ValueError(f"theta must have shape ({self.dim},), got {shape}")
        chunks = theta.split([slot.numel for slot in self._slots])
        return {slot.name: chunk.view(slot.shape) for slot, chunk in zip(self._slots, chunks, strict=True)}

    def forward(self, theta: Tensor, X: Tensor) -> Tensor:
        """Logits ``f(X; θ)`` of shape ``(N, C)`` for a batch of inputs ``X`` of shape ``(N, ...)``.

        Floating-point inputs are cast to ``θ``'s dtype: the parameters decide the precision of the computation, so
        a float64 posterior can be evaluated on float32 images.
        """
        if X.is_floating_point() and X.dtype != theta.dtype:
            X = X.to(theta.dtype)
        if self._plan is None:
            return functional_call(self.module, {**self.unflatten(theta), **self._buffers_like(theta)}, (X,))
        params = tuple(self.unflatten(theta).values())
        out = X
        for step in self._plan:
            if step[0] == "linear":
                out = F.linear(out, params[step[1]], None if step[2] is None else params[step[2]])
            elif step[0] == "act":
                out = step[1](out)
            else:
                out = out.flatten(step[1], step[2])
        return out

    def _buffers_like(self, theta: Tensor) -> dict[str, Tensor]:
        """The carried buffers on θ's device, floating ones in θ's dtype (no copies where they already match)."""
        return {
            name: b.to(theta.device, theta.dtype) if b.is_floating_point() else b.to(theta.device)
            for name, b in self.buffers.items()
        }

    def forward_batched(self, thetas: Tensor, X: Tensor) -> Tensor:
        """Logits of shape ``(S, N, C)`` for ``S`` parameter vectors ``thetas`` of shape ``(S, d)`` on the same ``X``.

        One vectorised pass (``vmap``) instead of ``S`` Python-level calls; activation memory grows like ``S·N``.
        """
        if not isinstance(thetas, Tensor) or thetas.dim() != 2 or thetas.shape[1] != self.dim:
            shape = tuple(thetas.shape) if isinstance(thetas, Tensor) else type(thetas).__name__
            raise ValueError(f"thetas must have shape (S, {self.dim}), got {shape}")
        return vmap(self.forward, in_dims=(0, None))(thetas, X)

    @property
    def written_out_backward(self) -> bool:
        """Whether ``batched_gradients`` runs the written-out backward pass (a model run from its plan), which needs
        no autograd graph when it is given the loss's gradient at the outputs."""
        return self._plan is not None

    def batched_gradients(
        self,
        thetas: Tensor,
        X: Tensor,
        loss: Callable[..., Tensor],
        *args: Tensor,
        out: Tensor | None = None,
        loss_grad: Callable[..., Tensor] | None = None,
    ) -> Tensor:
        """Row ``s`` of the ``(S, d)`` result is ``∇ loss(forward(thetas[s], X[s]), *(a[s] for a in args))`` for ``S``
        parameter vectors ``thetas (S, d)``, each on its own inputs ``X[s]`` (``X`` of shape ``(S, N, ...)``) with
        its own rows of ``args`` (the targets, say): a cohort's clients' minibatch gradients. ``loss`` takes one
        row's outputs (N, ...) and arguments. A plan-run model writes the gradients into ``out`` (S, d) where given,
        by batched matrix products and its written-out backward pass, with ``loss_grad(outputs (S, N, ...), *args)``
        as the gradient of the rows' summed losses with respect to their outputs where given (autograd of ``loss``
        otherwise); any other model uses ``vmap`` of ``grad`` of ``loss`` (``models.batched``)."""
        if thetas.dim() != 2 or thetas.shape[1] != self.dim or X.shape[0] != thetas.shape[0]:
            raise ValueError(
                f"thetas must have shape (S, {self.dim}) and X (S, N, ...); got {tuple(thetas.shape)}, {tuple(X.shape)}"
            )
        if self._plan is None:
            return batched.vmap_gradients(self.forward, thetas, X, loss, *args)
        if out is None:
            out = torch.empty_like(thetas)
        return batched.plan_gradients(self._plan, self._slots, thetas, X, loss, args, out, loss_grad)


def mean_nll(model: FlatModel, theta: Tensor, X: Tensor, y: Tensor) -> Tensor:
    """``(1/N) Σ_i −log softmax(f(x_i; θ))_{y_i}``, differentiable with respect to ``θ``."""
    return F.cross_entropy(model.forward(theta, X), y)
