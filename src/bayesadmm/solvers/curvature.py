"""Diagonal curvature of a summed cross-entropy: FedLap-Cov's H_k (Swaroop, Khan & Doshi-Velez 2025, Eqs. 10–14, 21).

The paper says only "an additional backward pass through the dataset" and recommends a GGN so that H is PSD; the
estimator is not stated. Each estimator is an object (a `DiagonalCurvature`), called as `curvature(data, θ,
generator)` for the diagonal of the generalised Gauss–Newton matrix of the SUMMED cross-entropy of `data` at θ:

    `GGN()`: exact.  With logits f_i(w), p_i = softmax(f_i), J_i = ∂f_i/∂w and Λ_i = diag(p_i) − p_i p_iᵀ,
        diag(Σ_i J_iᵀ Λ_i J_i)_j = Σ_i Σ_c p_ic (∂_j CE(f_i(w), c))²,
        because ∇_w CE(f_i, c) = J_iᵀ(p_i − e_c) and Σ_c p_c (p − e_c)(p − e_c)ᵀ = Λ: the squared gradients for
        every class c, weighted by the model's own predictive. For networks of linear layers and elementwise
        activations (the MLP, the logistic model) they are summed without forming per-example gradients
        (`linear_chain_diagonal_ggn`: one forward pass, C backpropagated directions, about 2× `MonteCarloFisher`);
        any other model uses per-example gradients (vmap of grad), C passes over the data (about C times the cost
        of `MonteCarloFisher`; for CNNs that is the practical choice).
    `MonteCarloFisher()`: one label per example sampled from the model's predictive (with the client's generator),
        Σ_i (∂_j CE(f_i, ĉ_i))² — an unbiased estimate of the same diagonal at the cost of one pass, which is the
        cost the paper quotes.

For a GLM (logistic or softmax regression) the GGN is the Hessian, so `GGN` equals Σ_i p_i(1 − p_i) x_ij² (tested).
Data: `problems.neural.ClassificationData` (any FlatModel), and the convex `SoftmaxLoss` and `LogisticLoss` (binary
logistic as the two-class softmax with logits (0, xᵀw)). The two estimators differ only in the output directions
they square (`OutputDirections`); the two ways of summing the squares are shared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import Tensor, nn
from torch.func import grad, vmap

from bayesadmm import rng
from bayesadmm.problems.losses import LogisticLoss, SoftmaxLoss
from bayesadmm.problems.neural import ClassificationData

DEFAULT_MAX_ELEMENTS = 2**24


class DiagonalCurvature(Protocol):
    def __call__(self, data, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The diagonal curvature (P,) of the SUMMED cross-entropy of `data` at θ."""


class OutputDirections(Protocol):
    """What distinguishes the estimators: the vectors g in logit space whose backpropagated squares are summed."""

    @property
    def max_elements(self) -> int:
        """Numbers the intermediate tensors of one chunk of examples may hold."""

    def directions(self, classes: int) -> int:
        """How many directions per example (K)."""

    def output_directions(self, probs: Tensor, generator: torch.Generator | None) -> Tensor:
        """(K, n, C): the directions g_ik for the predictive probabilities (n, C) of a chunk."""

    def targets(self, probs: Tensor, generator: torch.Generator | None) -> Iterator[tuple[Tensor | None, Tensor]]:
        """(weight (n,) or None for 1, one-hot target (n, C)): the squared ∇_θ CE(f_i, target_i) summed with these
        weights over the examples, for the per-example path (the same directions: ∇_f CE = p − target)."""


@dataclass(frozen=True)
class GGN:
    """The exact diagonal GGN, Σ_i Σ_c p_ic (∂ CE(f_i, c)/∂θ)² (module docstring). Deterministic."""

    max_elements: int = DEFAULT_MAX_ELEMENTS
    name: ClassVar[str] = "ggn"

    def __call__(self, data, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return diagonal_ggn(data, theta, self, generator, self.max_elements)

    def directions(self, classes: int) -> int:
        return classes

    def output_directions(self, probs: Tensor, generator: torch.Generator | None) -> Tensor:
        # delta[c, i] = √p_ic (p_i − e_c)
        eye = torch.eye(probs.shape[1], dtype=probs.dtype, device=probs.device)
        return probs.T.sqrt().unsqueeze(-1) * (probs.unsqueeze(0) - eye.unsqueeze(1))

    def targets(self, probs: Tensor, generator: torch.Generator | None) -> Iterator[tuple[Tensor | None, Tensor]]:
        for c in range(probs.shape[1]):
            target = torch.zeros_like(probs)
            target[:, c] = 1.0
            yield probs[:, c], target


@dataclass(frozen=True)
class MonteCarloFisher:
    """Σ_i (∂ CE(f_i, ĉ_i)/∂θ)² with ĉ_i ~ p_i drawn from the generator (module docstring): unbiased for `GGN`."""

    max_elements: int = DEFAULT_MAX_ELEMENTS
    name: ClassVar[str] = "mc-fisher"

    def __call__(self, data, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if generator is None:
            raise ValueError("the Monte-Carlo Fisher needs an explicit torch.Generator")
        return diagonal_ggn(data, theta, self, generator, self.max_elements)

    def directions(self, classes: int) -> int:
        return 1

    def output_directions(self, probs: Tensor, generator: torch.Generator | None) -> Tensor:
        # drawn chunk by chunk like the per-example path; the two agree label for label when their chunks do
        # (torch 2.13's CPU multinomial also gives the same labels for any split of the rows)
        labels = rng.multinomial(probs, generator)
        return (probs - torch.nn.functional.one_hot(labels, probs.shape[1]).to(probs.dtype)).unsqueeze(0)

    def targets(self, probs: Tensor, generator: torch.Generator | None) -> Iterator[tuple[Tensor | None, Tensor]]:
        labels = rng.multinomial(probs, generator)
        yield None, torch.nn.functional.one_hot(labels, probs.shape[1]).to(probs.dtype)


# the estimators by the names the configs use
CURVATURES: dict[str, type[GGN | MonteCarloFisher]] = {cls.name: cls for cls in (GGN, MonteCarloFisher)}


def diagonal_ggn(
    data,
    theta: Tensor,
    kind: OutputDirections,
    generator: torch.Generator | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Tensor:
    """The diagonal GGN estimate `kind` of the SUMMED cross-entropy of `data` at θ. The examples are processed in
    chunks whose intermediate tensors hold about `max_elements` numbers. A network of linear layers and elementwise
    activations (`linear_chain`) takes the fast path `linear_chain_diagonal_ggn`; any other model the general
    `per_example_diagonal_ggn`."""
    layers = linear_chain(data)
    if layers is not None:
        return linear_chain_diagonal_ggn(data, layers, theta, kind, generator, max_elements)
    return per_example_diagonal_ggn(data, theta, kind, generator, max_elements)


def per_example_logits(data) -> tuple[Callable[[Tensor, Tensor], Tensor], Tensor]:
    """(f, X) with f(θ, x) the logits (C,) of one input x: the model the cross-entropy of `data` is taken on."""
    if isinstance(data, ClassificationData):
        model = data.model
        return (lambda theta, x: model.forward(theta, x.unsqueeze(0)).squeeze(0)), data.X
    if isinstance(data, SoftmaxLoss):
        classes, features = data.num_classes, data.X.shape[1]
        return (lambda theta, x: theta.reshape(classes, features) @ x), data.X
    if isinstance(data, LogisticLoss):
        # softplus(a) − y a is the cross-entropy of the two-class softmax with logits (0, a)
        return (lambda theta, x: torch.stack([torch.zeros_like(x @ theta), x @ theta])), data.X
    raise TypeError(
        f"no per-example logits for {type(data).__name__}; FedLap-Cov's curvature needs "
        f"ClassificationData, SoftmaxLoss or LogisticLoss"
    )


def per_example_diagonal_ggn(
    data, theta: Tensor, kind: OutputDirections, generator: torch.Generator | None, max_elements: int
) -> Tensor:
    """`diagonal_ggn` for any model: per-example gradients (vmap of grad) of the cross-entropy, once per target of
    `kind` (C for `GGN`). Memory and time grow like (examples × parameters); chunks hold at most `max_elements`
    gradient numbers."""
    logits_of, X = per_example_logits(data)
    theta = theta.detach()

    def cross_entropy(th: Tensor, x: Tensor, target: Tensor) -> Tensor:  # target: one-hot (C,)
        return -(torch.log_softmax(logits_of(th, x), -1) * target).sum()

    per_example_grad = vmap(grad(cross_entropy), in_dims=(None, 0, 0))
    n = X.shape[0]
    chunk = max(1, min(n, max_elements // theta.numel()))
    total = torch.zeros_like(theta)
    for start in range(0, n, chunk):
        x = X[start : start + chunk]
        with torch.no_grad():
            probs = torch.softmax(vmap(logits_of, in_dims=(None, 0))(theta, x), -1)
        for weight, target in kind.targets(probs, generator):
            squares = per_example_grad(theta, x, target).square()
            total = total + (squares.sum(0) if weight is None else weight @ squares)
    return total


# Activation modules that act on each number separately, so that their Jacobian is diagonal and a forward-mode
# derivative along a vector of ones gives all of it. Exact types: a subclass may override forward.
ELEMENTWISE = (nn.Sigmoid, nn.Tanh, nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Softplus, nn.Identity)


def linear_chain(data) -> list[tuple[str, nn.Module]] | None:
    """The (name, module) children of `data`'s network if its logits are computed by a chain of nn.Linear layers and
    elementwise activations that `linear_chain_diagonal_ggn` can differentiate; None for any other model.

    Qualifies: ClassificationData whose FlatModel's template is a plain nn.Sequential of nn.Linear, nn.Flatten
    (start_dim=1, end_dim=-1) and `ELEMENTWISE` modules, in which every linear layer sees one vector per example (a
    Flatten comes first or the inputs are already (n, features)), and no module is used twice (shared weights would
    add the gradients of both uses before squaring). The zoo's `mlp` and `logistic` qualify; CNNs do not.
    """
    module = getattr(getattr(data, "model", None), "module", None)
    if not isinstance(data, ClassificationData) or type(module) is not nn.Sequential:
        return None
    # named_children() lists a module used twice only once; the names are needed to find the parameters
    children = list(module.named_children())
    if len(children) != len(module):
        return None
    flat = data.X.dim() == 2
    for _, child in children:
        if type(child) is nn.Flatten and child.start_dim == 1 and child.end_dim == -1:
            flat = True
        elif not (type(child) is nn.Linear and flat or type(child) in ELEMENTWISE):
            return None
    if not any(type(child) is nn.Linear for _, child in children):
        return None
    return children


def linear_chain_diagonal_ggn(
    data: ClassificationData,
    layers: list[tuple[str, nn.Module]],
    theta: Tensor,
    kind: OutputDirections,
    generator: torch.Generator | None,
    max_elements: int,
) -> Tensor:
    """`diagonal_ggn` for a chain of linear layers and elementwise activations (`linear_chain`), without
    per-example gradients.

    For a linear layer z_i = W a_i + b, ∂ℓ_i/∂W = δ_i a_iᵀ with δ_i = ∂ℓ_i/∂z_i, so over the examples
    Σ_i (∂ℓ_i/∂W)² = (δ∘δ)ᵀ(a∘a), one matrix product, and Σ_i (∂ℓ_i/∂b)² = Σ_i δ_i∘δ_i. The curvature is a sum of
    such squares over K output directions g_ik per example (the gradient of a CE with respect to the logits,
    `kind.output_directions`): for `GGN` g_ic = √p_ic (p_i − e_c), c = 1..C, since
    Σ_c p_c (p − e_c)(p − e_c)ᵀ = diag(p) − ppᵀ; for `MonteCarloFisher` the one direction p_i − e_ĉi. All K
    directions are backpropagated at once as a (K, n, width) tensor by δ_l = (δ_{l+1} W_{l+1}) ∘ σ'(z_l), and the
    squares are summed over the directions before the matrix product.
    """
    model = data.model
    params = model.unflatten(theta.detach())
    total = {name: torch.zeros_like(p) for name, p in params.items()}
    linears = [(name, layer) for name, layer in layers if isinstance(layer, nn.Linear)]
    classes = linears[-1][1].out_features
    directions = kind.directions(classes)
    # numbers held per example: every layer's input and σ'(z), and the K backpropagated δ's (and their squares)
    per_example = sum(layer.in_features + (2 * directions + 1) * layer.out_features for _, layer in linears)
    n = data.X.shape[0]
    chunk = max(1, min(n, max_elements // per_example))
    with torch.no_grad():
        for start in range(0, n, chunk):
            h = data.X[start : start + chunk]
            if h.is_floating_point():
                h = h.to(theta.dtype)  # as FlatModel.forward: θ decides the precision
            # forward, keeping each linear layer's input a and the slope σ'(z) of the activations after it
            inputs: list[Tensor] = []
            slopes: list[Tensor | None] = []
            for name, layer in layers:
                if isinstance(layer, nn.Linear):
                    inputs.append(h)
                    slopes.append(None)  # None: no activation after this layer (yet)
                    h = torch.nn.functional.linear(h, params[f"{name}.weight"], params.get(f"{name}.bias"))
                elif inputs and type(layer) in ELEMENTWISE:
                    h, slope = torch.func.jvp(layer, (h,), (torch.ones_like(h),))[:2]
                    slopes[-1] = slope if slopes[-1] is None else slopes[-1] * slope
                else:
                    h = layer(h)  # Flatten, or activations of the inputs (nothing to learn)
            delta = kind.output_directions(torch.softmax(h, -1), generator)
            # backward: delta holds ∂ℓ/∂(output of the layer's activations), then ∂ℓ/∂z of the layer
            for index in reversed(range(len(linears))):
                name, _ = linears[index]
                slope_after = slopes[index]
                if slope_after is not None:
                    delta = delta * slope_after
                squares = delta.square().sum(0)  # Σ_k δ_ik², (n, out)
                total[f"{name}.weight"] += squares.T @ inputs[index].square()
                if f"{name}.bias" in total:
                    total[f"{name}.bias"] += squares.sum(0)
                if index > 0:  # (the first layer's input needs no δ: the costliest product)
                    delta = delta @ params[f"{name}.weight"]
    return model.flatten(total)
