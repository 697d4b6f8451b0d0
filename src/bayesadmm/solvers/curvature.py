"""Diagonal curvature of a summed negative log-likelihood: FedLap-Cov's H_k (Swaroop, Khan & Doshi-Velez 2025,
Eqs. 10–14, 21), and the sampled-target Fisher of FedEP's Laplace and NGVI inference.

The paper says only "an additional backward pass through the dataset" and recommends a GGN so that H is PSD; the
estimator is not stated. Each estimator is an object (a `DiagonalCurvature`), called as `curvature(data, θ,
generator)` for the diagonal of the generalised Gauss–Newton matrix of the SUMMED negative log-likelihood of `data`
at θ. The curvature in the model's outputs comes from the data's likelihood (`likelihoods.CurvatureLikelihood`), so
every estimator is right for any likelihood that has what it reads (`needs`) and refuses one that has not:

    `GGN()`: exact.  With outputs f_i(w) (flattened to C numbers), J_i = ∂f_i/∂w and Λ_i the likelihood's
        `output_hessian` (softmax: diag(p_i) − p_i p_iᵀ; Gaussian: I/σ²; Poisson: diag(exp f_i)),
        diag(Σ_i J_iᵀ Λ_i J_i)_j = Σ_i Σ_k (J_iᵀ g_ik)_j²   for any factor Λ_i = Σ_k g_ik g_ikᵀ,
        the likelihood's `output_hessian_factor` where it has one (softmax: g_ic = √p_ic (p_i − e_c), exact however
        small p_ic), else the symmetric square root of Λ_i (`hessian_factor`; √Λ_i itself for C = 1): the squares
        of C backpropagated output directions per example. For networks of linear layers and elementwise
        activations (the MLP, the logistic model) they are summed without forming per-example gradients
        (`linear_chain_diagonal_ggn`: one forward pass, C backpropagated directions, about 2× `MonteCarloFisher`);
        any other model uses per-example gradients (vmap of grad), C passes over the data (about C times the cost
        of `MonteCarloFisher`; for CNNs that is the practical choice).
    `MonteCarloFisher()`: `samples` targets per example drawn from the model's predictive with the likelihood's
        `sample_targets` (and the client's generator), Σ_i mean_s (∂_j nll(f_i, ŷ_is))² — an unbiased estimate of
        the same diagonal (the Fisher E_ŷ[∇nll ∇nllᵀ] is the output Hessian for the canonical links), at the cost of
        one pass per sample, which is the cost the paper quotes. Its direction g_is = ∇_f nll(f_i, ŷ_is)/√samples
        is taken by autograd of the likelihood's own `mean_nll`.

For a GLM (logistic or softmax regression; a linear model with a Gaussian or Poisson likelihood) the GGN is the
Hessian, so for logistic regression `GGN` equals Σ_i p_i(1 − p_i) x_ij² and for a linear-Gaussian model
Σ_i x_ij²/σ² (tested). Data: `clients.SupervisedData` (any FlatModel and its likelihood), and the convex `SoftmaxLoss`
and `LogisticLoss` (binary logistic as the two-class softmax with logits (0, xᵀw)). The two estimators differ only in
the output directions they square (`OutputDirections`); the two ways of summing the squares are shared.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import Tensor, nn
from torch.func import grad, vmap

from bayesadmm.clients import SupervisedData, take_rows
from bayesadmm.likelihoods import Classification, Likelihood, require
from bayesadmm.problems.losses import LogisticLoss, SoftmaxLoss

DEFAULT_MAX_ELEMENTS = 2**24

_SOFTMAX = Classification()  # the likelihood of the convex SoftmaxLoss and LogisticLoss


class DiagonalCurvature(Protocol):
    """An estimator of the diagonal curvature; `needs` names the likelihood's members it reads (for `require`)."""

    needs: ClassVar[tuple[str, ...]]

    def __call__(self, data, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The diagonal curvature (P,) of the SUMMED negative log-likelihood of `data` at θ."""
        ...


class OutputDirections(Protocol):
    """What distinguishes the estimators: the vectors g in output space whose backpropagated squares are summed."""

    needs: ClassVar[tuple[str, ...]]

    @property
    def max_elements(self) -> int:
        """Numbers the intermediate tensors of one chunk of examples may hold."""
        ...

    def directions(self, outputs: int) -> int:
        """How many directions per example (K) for C = `outputs` outputs per example."""
        ...

    def output_directions(self, likelihood, outputs: Tensor, generator: torch.Generator | None) -> Tensor:
        """(K, n, C): the directions g_ik for the outputs (n, C) of a chunk."""
        ...


@dataclass(frozen=True)
class GGN:
    """The exact diagonal GGN, Σ_i diag(J_iᵀ Λ_i J_i) with Λ_i the likelihood's `output_hessian` (module docstring).
    Deterministic."""

    max_elements: int = DEFAULT_MAX_ELEMENTS
    name: ClassVar[str] = "ggn"
    needs: ClassVar[tuple[str, ...]] = ("output_hessian",)

    def __call__(self, data, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return diagonal_ggn(data, theta, self, generator, self.max_elements)

    def directions(self, outputs: int) -> int:
        return outputs

    def output_directions(self, likelihood, outputs: Tensor, generator: torch.Generator | None) -> Tensor:
        closed_form = getattr(likelihood, "output_hessian_factor", None)
        if closed_form is not None:
            return closed_form(outputs).permute(2, 0, 1)
        return hessian_factor(output_hessian(likelihood, outputs))


@dataclass(frozen=True)
class MonteCarloFisher:
    """Σ_i mean_s (∂ nll(f_i, ŷ_is)/∂θ)² with ŷ_is ~ p(y | f_i) drawn from the generator by the likelihood's
    `sample_targets`, `samples` per example (module docstring): unbiased for `GGN`."""

    max_elements: int = DEFAULT_MAX_ELEMENTS
    samples: int = 1
    name: ClassVar[str] = "mc-fisher"
    needs: ClassVar[tuple[str, ...]] = ("sample_targets",)

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"samples must be a positive integer, got {self.samples!r}")

    def __call__(self, data, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if generator is None:
            raise ValueError("the Monte-Carlo Fisher needs an explicit torch.Generator")
        return diagonal_ggn(data, theta, self, generator, self.max_elements)

    def directions(self, outputs: int) -> int:
        return self.samples

    def output_directions(self, likelihood, outputs: Tensor, generator: torch.Generator | None) -> Tensor:
        # drawn chunk by chunk, the samples one after another, on both paths alike; the two agree target for target
        # when their chunks do (torch 2.13's CPU multinomial also gives the same labels for any split of the rows)
        scale = 1.0 / math.sqrt(self.samples)  # the mean over the samples of the squares
        gradients = [
            nll_gradients(likelihood, outputs, likelihood.sample_targets(outputs, generator))
            for _ in range(self.samples)
        ]
        return torch.stack(gradients) * scale


# the estimators by the names the configs use
CURVATURES: dict[str, type[GGN | MonteCarloFisher]] = {cls.name: cls for cls in (GGN, MonteCarloFisher)}


def output_hessian(likelihood, outputs: Tensor) -> Tensor:
    """The likelihood's `output_hessian` of the outputs (n, C), checked to be (n, C, C): a user's callable that
    returns another shape is named here rather than broadcast into a wrong curvature."""
    hessian = likelihood.output_hessian(outputs)
    n, c = outputs.shape
    if not isinstance(hessian, Tensor) or tuple(hessian.shape) != (n, c, c):
        shape = tuple(hessian.shape) if isinstance(hessian, Tensor) else type(hessian).__name__
        raise ValueError(
            f"{type(likelihood).__name__}.output_hessian must return (N, C, C) = ({n}, {c}, {c}) for outputs "
            f"(N, C) = ({n}, {c}), got {shape}"
        )
    return hessian


def hessian_factor(hessian: Tensor) -> Tensor:
    """(K = C, n, C) directions g_ik with Σ_k g_ik g_ikᵀ = Λ_i for the PSD matrices Λ_i of `hessian (n, C, C)`:
    √λ_k u_k from Λ_i's eigendecomposition (√Λ_i itself for C = 1). Eigenvalues below 0 by rounding are taken as 0;
    an output Hessian that is not PSD (a GGN needs one) is refused."""
    if hessian.shape[-1] == 1:
        if bool((hessian < 0).any()):
            raise ValueError("the output Hessian has negative entries: the GGN needs a positive semi-definite one")
        return hessian.sqrt().permute(2, 0, 1)
    values, vectors = torch.linalg.eigh(hessian)  # ascending eigenvalues; column k of vectors is u_k
    if hessian.numel() and bool(values[:, 0].amin() < -1e-5 * values.abs().amax().clamp_min(1e-30)):
        raise ValueError("the output Hessian is not positive semi-definite: the GGN needs a PSD one")
    return (vectors * values.clamp_min(0).sqrt().unsqueeze(-2)).permute(2, 0, 1)


def nll_gradients(likelihood, outputs: Tensor, targets: Tensor) -> Tensor:
    """(n, C): ∇_{f_i} nll(f_i, y_i) of every example, by autograd of n · mean_nll (the examples are independent, so
    the gradient of their sum is theirs row by row); taken even under `torch.no_grad`."""
    with torch.enable_grad():
        leaf = outputs.detach().requires_grad_(True)
        (gradient,) = torch.autograd.grad(likelihood.mean_nll(leaf, targets) * leaf.shape[0], leaf)
    return gradient


def diagonal_ggn(
    data,
    theta: Tensor,
    kind: OutputDirections,
    generator: torch.Generator | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Tensor:
    """The diagonal GGN estimate `kind` of the SUMMED negative log-likelihood of `data` at θ. The examples are
    processed in chunks whose intermediate tensors hold about `max_elements` numbers. A network of linear layers and
    elementwise activations (`linear_chain`) takes the fast path `linear_chain_diagonal_ggn`; any other model the
    general `per_example_diagonal_ggn`. A likelihood without what `kind` reads is refused (`likelihoods.require`)."""
    _, _, likelihood = per_example_outputs(data)
    require(likelihood, kind.needs, f"the {getattr(kind, 'name', type(kind).__name__)} curvature")
    layers = linear_chain(data)
    if layers is not None:
        return linear_chain_diagonal_ggn(data, layers, theta, kind, generator, max_elements)
    return per_example_diagonal_ggn(data, theta, kind, generator, max_elements)


def rows(data, idx: Tensor | None):
    """`data` restricted to the examples `idx` (all of them for None): a `SupervisedData` of those rows, for the
    curvature of a minibatch (NGVI)."""
    if idx is None:
        return data
    if not isinstance(data, SupervisedData):
        raise TypeError(f"the curvature of a minibatch needs SupervisedData, got {type(data).__name__}")
    return dataclasses.replace(data, X=take_rows(data.X, idx), y=take_rows(data.y, idx))


def per_example_outputs(data) -> tuple[Callable[[Tensor, Tensor], Tensor], Tensor, Likelihood]:
    """(f, X, likelihood) with f(θ, x) the outputs (C,) of one input x, flattened: the model and the likelihood whose
    negative log-likelihood the curvature of `data` is taken of."""
    if isinstance(data, SupervisedData):
        model = data.model
        return (lambda theta, x: model.forward(theta, x.unsqueeze(0)).reshape(-1)), data.X, data.likelihood
    if isinstance(data, SoftmaxLoss):
        classes, features = data.num_classes, data.X.shape[1]
        return (lambda theta, x: theta.reshape(classes, features) @ x), data.X, _SOFTMAX
    if isinstance(data, LogisticLoss):
        # softplus(a) − y a is the cross-entropy of the two-class softmax with logits (0, a)
        return (lambda theta, x: torch.stack([torch.zeros_like(x @ theta), x @ theta])), data.X, _SOFTMAX
    raise TypeError(
        f"no per-example outputs for {type(data).__name__}; the curvature needs SupervisedData (a model, its inputs "
        f"and a likelihood), SoftmaxLoss or LogisticLoss"
    )


def per_example_diagonal_ggn(
    data, theta: Tensor, kind: OutputDirections, generator: torch.Generator | None, max_elements: int
) -> Tensor:
    """`diagonal_ggn` for any model: per-example gradients (vmap of grad) of ⟨f(θ, x_i), g_ik⟩, which are J_iᵀ g_ik,
    once per direction of `kind` (C for `GGN`). Memory and time grow like (examples × parameters); chunks hold at
    most `max_elements` gradient numbers."""
    outputs_of, X, likelihood = per_example_outputs(data)
    theta = theta.detach()

    def projected(th: Tensor, x: Tensor, direction: Tensor) -> Tensor:  # its gradient in θ is J_xᵀ g
        return (outputs_of(th, x) * direction).sum()

    per_example_grad = vmap(grad(projected), in_dims=(None, 0, 0))
    n = X.shape[0]
    chunk = max(1, min(n, max_elements // theta.numel()))
    total = torch.zeros_like(theta)
    for start in range(0, n, chunk):
        x = X[start : start + chunk]
        with torch.no_grad():
            outputs = vmap(outputs_of, in_dims=(None, 0))(theta, x)
        for direction in kind.output_directions(likelihood, outputs, generator):
            total = total + per_example_grad(theta, x, direction).square().sum(0)
    return total


# Activation modules that act on each number separately, so that their Jacobian is diagonal and a forward-mode
# derivative along a vector of ones gives all of it. Exact types: a subclass may override forward.
ELEMENTWISE = (nn.Sigmoid, nn.Tanh, nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Softplus, nn.Identity)


def linear_chain(data) -> list[tuple[str, nn.Module]] | None:
    """The (name, module) children of `data`'s network if its outputs are computed by a chain of nn.Linear layers and
    elementwise activations that `linear_chain_diagonal_ggn` can differentiate; None for any other model.

    Qualifies: SupervisedData whose FlatModel's template is a plain nn.Sequential of nn.Linear, nn.Flatten
    (start_dim=1, end_dim=-1) and `ELEMENTWISE` modules, in which every linear layer sees one vector per example (a
    Flatten comes first or the inputs are already (n, features)), and no module is used twice (shared weights would
    add the gradients of both uses before squaring). The zoo's `mlp` and `logistic` qualify; CNNs do not.
    """
    module = getattr(getattr(data, "model", None), "module", None)
    if not isinstance(data, SupervisedData) or type(module) is not nn.Sequential:
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
    data: SupervisedData,
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
    such squares over K output directions g_ik per example (`kind.output_directions` of the likelihood): for `GGN` the
    C columns of the square root of the output Hessian Λ_i; for `MonteCarloFisher` the gradient ∇_f nll(f_i, ŷ_i) at
    each sampled target (softmax: p_i − e_ĉi). All K directions are backpropagated at once as a (K, n, width) tensor
    by δ_l = (δ_{l+1} W_{l+1}) ∘ σ'(z_l), and the squares are summed over the directions before the matrix product.
    """
    model = data.model
    params = model.unflatten(theta.detach())
    total = {name: torch.zeros_like(p) for name, p in params.items()}
    linears = [(name, layer) for name, layer in layers if isinstance(layer, nn.Linear)]
    directions = kind.directions(linears[-1][1].out_features)
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
            delta = kind.output_directions(data.likelihood, h, generator)
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
