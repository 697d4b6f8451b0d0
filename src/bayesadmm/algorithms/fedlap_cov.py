"""FedLap-Cov (Swaroop, Khan & Doshi-Velez 2025, Eqs. 10–14, implemented form Eq. 21), diagonal: PVI with the
second-order delta method, Gaussian sites t_k(w) ∝ exp(v_kᵀw − ½wᵀV_k w) and q_g = N(w_g, S_g⁻¹).

Eq. 21 in summed-loss units, with diagonal V_k, S and H_k (as in all the paper's experiments), prior π_0 = N(0, I/δ):

    client mean:       w_k ← argmin_w ℓ_k(w) + v_kᵀw − ½Σ_j V_kj w_j² + ½Σ_j S_gj (w_j − w_gj)²
    client precision:  S_k ← H_k(w_k) − V_k + S_g
    duals:             v_k ← v_k + ρ (S_k w_k − S_g w_g),     V_k ← (1 − ρ) V_k + ρ H_k(w_k)   (= V_k + ρ(S_k − S_g))
    server:            S_g ← δ + Σ_k V_k,     w_g ← Σ_k v_k / S_g                                  (elementwise)

The client mean problem divided by N_k is `LocalAdam`'s shape ℓ̄_k + aᵀw + ½Σ_j b_j (w_j − c_j)² exactly, with

    b = (S_g − V_k)/N_k,    c = w_g,    a = (v_k − V_k∘w_g)/N_k                           (`cavity_problem`)

since ½(S_g − V)(w − w_g)² + (v − V w_g)w = vw − ½Vw² + ½S_g(w − w_g)² − ½V w_g² coordinatewise. The proximal weight
is the cavity precision over N_k: S_g − V_k = δ + Σ_{j≠k} V_j, positive because every V_j is a convex combination of
PSD curvatures (it starts at 0). The client starts at w_g with fresh Adam state (digest §1.8 minibatch form).

Curvature H_k. The paper says only "an additional backward pass through the dataset" and recommends a GGN so that H
is PSD; the estimator is not stated. `diagonal_ggn` gives the diagonal of the generalised Gauss–Newton matrix of the
SUMMED cross-entropy, recomputed every round at the post-update w_k (the "most recent parameters"; the digest's
reading, which fits the extra pass):

    "ggn" (default): exact.  With logits f_i(w), p_i = softmax(f_i), J_i = ∂f_i/∂w and Λ_i = diag(p_i) − p_i p_iᵀ,
        diag(Σ_i J_iᵀ Λ_i J_i)_j = Σ_i Σ_c p_ic (∂_j CE(f_i(w), c))²,
        because ∇_w CE(f_i, c) = J_iᵀ(p_i − e_c) and Σ_c p_c (p − e_c)(p − e_c)ᵀ = Λ: the squared gradients for
        every class c, weighted by the model's own predictive. For networks of linear layers and elementwise
        activations (the MLP, the logistic model) they are summed without forming per-example gradients
        (`linear_chain_diagonal_ggn`: one forward pass, C backpropagated directions, about 2× "mc-fisher"); any
        other model uses per-example gradients (vmap of grad), C passes over the data (about C times the cost of
        "mc-fisher"; for CNNs "mc-fisher" is the practical choice).
    "mc-fisher": one label per example sampled from the model's predictive (with the client's generator),
        Σ_i (∂_j CE(f_i, ĉ_i))² — an unbiased estimate of the same diagonal at the cost of one pass, which is the
        cost the paper quotes.

For a GLM (logistic or softmax regression) the GGN is the Hessian, so "ggn" equals Σ_i p_i(1 − p_i) x_ij² (tested).
Data: `problems.neural.ClassificationData` (any FlatModel), and the convex `SoftmaxLoss` and `LogisticLoss` (binary
logistic as the two-class softmax with logits (0, xᵀw)).

Fixed point: w_k = w_g = w* with Σ_k ∇ℓ_k(w*) + δw* = 0 (the MAP), V_k = H_k(w*), S_g = S_k = δ + Σ_k H_k(w*).

Initialisation (not stated in the paper). The Bayes-consistent start is v_k = V_k = 0, q_g = π_0 (w_g = 0), which a
network cannot train from. As in `fedlap`, the initial sites share a random θ_0 instead: v_k⁽⁰⁾ = δθ_0/K, V_k⁽⁰⁾ = 0,
so that the server identity w_g = Σ_k v_k / S_g already holds at round 0 (q_g⁽⁰⁾ = N(θ_0, I/δ)); round 1 then gives
w_g = [δθ_0 + ρΣ_k (S_k w_k − δθ_0)] / S_g, for ρ = 1/K the precision-weighted mean of the local models, instead of
a result that misses θ_0. For θ_0 = 0 this is the Bayes-consistent start, and the fixed point does not depend on it.
Clients that have not replied yet count with their initial sites.

ρ defaults to 1/K, the paper's choice for FedLap-Cov (App. E). The posterior is q_g = N(w_g, diag(S_g)⁻¹).
"""

from __future__ import annotations

import math
import numbers
from typing import Callable, Mapping, NamedTuple

import torch
from torch import Tensor, nn
from torch.func import grad, vmap

from bayesadmm import rng
from bayesadmm.algorithms.base import Algorithm, DivergenceError, Message, merge_replies
from bayesadmm.families import DiagonalGaussian, Posterior
from bayesadmm.problems.losses import LogisticLoss, SoftmaxLoss
from bayesadmm.problems.neural import ClassificationData
from bayesadmm.solvers.adam import local_adam
from bayesadmm.solvers.von import SubproblemError

CURVATURES = ("ggn", "mc-fisher")


class ServerState(NamedTuple):
    mean: Tensor                        # w_g
    precision: Tensor                   # S_g (diagonal)
    theta0: Tensor                      # θ_0: the initial sites of clients that have not replied yet
    replies: Mapping[int, Message]


class ClientState(NamedTuple):
    v: Tensor                           # v_k
    V: Tensor                           # V_k (diagonal)
    mean: Tensor | None                 # w_k from the last local solve
    precision: Tensor | None            # S_k


# --- the client's mean problem ------------------------------------------------------------------------------------


def cavity_problem(v: Tensor, V: Tensor, mean_g: Tensor, precision_g: Tensor,
                   num_examples: int) -> tuple[Tensor, Tensor, Tensor]:
    """(a, b, c) with aᵀw + ½Σ b(w − c)² = (1/N_k)[vᵀw − ½ΣV w² + ½ΣS_g(w − w_g)²] + const (see the docstring)."""
    linear = (v - V * mean_g) / num_examples
    weight = (precision_g - V) / num_examples
    return linear, weight, mean_g


# --- curvature ----------------------------------------------------------------------------------------------------


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
    raise TypeError(f"no per-example logits for {type(data).__name__}; FedLap-Cov's curvature needs "
                    f"ClassificationData, SoftmaxLoss or LogisticLoss")


def diagonal_ggn(data, theta: Tensor, method: str = "ggn", generator: torch.Generator | None = None,
                 max_elements: int = 2 ** 24) -> Tensor:
    """The diagonal GGN (= Fisher with the model's predictive) of the SUMMED cross-entropy of `data` at θ.

    method "ggn": exact, Σ_i Σ_c p_ic (∂ CE(f_i, c)/∂θ)²; "mc-fisher": Σ_i (∂ CE(f_i, ĉ_i)/∂θ)² with ĉ_i ~ p_i drawn
    from `generator`. The examples are processed in chunks whose intermediate tensors hold about `max_elements`
    numbers. A network of linear layers and elementwise activations (`linear_chain`) takes the fast path
    `linear_chain_diagonal_ggn`; any other model the general `per_example_diagonal_ggn`.
    """
    if method not in CURVATURES:
        raise ValueError(f"unknown curvature {method!r}; valid: {', '.join(CURVATURES)}")
    if method == "mc-fisher" and generator is None:
        raise ValueError("the Monte-Carlo Fisher needs an explicit torch.Generator")
    layers = linear_chain(data)
    if layers is not None:
        return linear_chain_diagonal_ggn(data, layers, theta, method, generator, max_elements)
    return per_example_diagonal_ggn(data, theta, method, generator, max_elements)


def per_example_diagonal_ggn(data, theta: Tensor, method: str, generator: torch.Generator | None,
                             max_elements: int) -> Tensor:
    """`diagonal_ggn` for any model: per-example gradients (vmap of grad) of the cross-entropy, once per class for
    "ggn". Memory and time grow like (examples × parameters); chunks hold at most `max_elements` gradient numbers."""
    logits_of, X = per_example_logits(data)
    theta = theta.detach()

    def cross_entropy(th: Tensor, x: Tensor, target: Tensor) -> Tensor:       # target: one-hot (C,)
        return -(torch.log_softmax(logits_of(th, x), -1) * target).sum()

    per_example_grad = vmap(grad(cross_entropy), in_dims=(None, 0, 0))
    n = X.shape[0]
    chunk = max(1, min(n, max_elements // theta.numel()))
    total = torch.zeros_like(theta)
    for start in range(0, n, chunk):
        x = X[start:start + chunk]
        with torch.no_grad():
            probs = torch.softmax(vmap(logits_of, in_dims=(None, 0))(theta, x), -1)
        classes = probs.shape[1]
        if method == "ggn":
            for c in range(classes):
                target = torch.zeros_like(probs)
                target[:, c] = 1.0
                total = total + probs[:, c] @ per_example_grad(theta, x, target).square()
        else:
            labels = rng.multinomial(probs, generator)
            target = torch.nn.functional.one_hot(labels, classes).to(probs.dtype)
            total = total + per_example_grad(theta, x, target).square().sum(0)
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


def linear_chain_diagonal_ggn(data: ClassificationData, layers: list[tuple[str, nn.Module]], theta: Tensor,
                              method: str, generator: torch.Generator | None, max_elements: int) -> Tensor:
    """`diagonal_ggn` for a chain of linear layers and elementwise activations (`linear_chain`), without
    per-example gradients.

    For a linear layer z_i = W a_i + b, ∂ℓ_i/∂W = δ_i a_iᵀ with δ_i = ∂ℓ_i/∂z_i, so over the examples
    Σ_i (∂ℓ_i/∂W)² = (δ∘δ)ᵀ(a∘a), one matrix product, and Σ_i (∂ℓ_i/∂b)² = Σ_i δ_i∘δ_i. The curvature is a sum of
    such squares over K output directions g_ik per example (the gradient of a CE with respect to the logits): for
    "ggn" g_ic = √p_ic (p_i − e_c), c = 1..C, since Σ_c p_c (p − e_c)(p − e_c)ᵀ = diag(p) − ppᵀ; for "mc-fisher"
    the one direction p_i − e_ĉi. All K directions are backpropagated at once as a (K, n, width) tensor by
    δ_l = (δ_{l+1} W_{l+1}) ∘ σ'(z_l), and the squares are summed over the directions before the matrix product.
    """
    model = data.model
    params = model.unflatten(theta.detach())
    total = {name: torch.zeros_like(p) for name, p in params.items()}
    linears = [(name, layer) for name, layer in layers if isinstance(layer, nn.Linear)]
    classes = linears[-1][1].out_features
    directions = classes if method == "ggn" else 1
    # numbers held per example: every layer's input and σ'(z), and the K backpropagated δ's (and their squares)
    per_example = sum(layer.in_features + (2 * directions + 1) * layer.out_features for _, layer in linears)
    n = data.X.shape[0]
    chunk = max(1, min(n, max_elements // per_example))
    with torch.no_grad():
        for start in range(0, n, chunk):
            h = data.X[start:start + chunk]
            if h.is_floating_point():
                h = h.to(theta.dtype)                    # as FlatModel.forward: θ decides the precision
            # forward, keeping each linear layer's input a and the slope σ'(z) of the activations after it
            inputs, slopes = [], []
            for name, layer in layers:
                if isinstance(layer, nn.Linear):
                    inputs.append(h)
                    slopes.append(None)                  # None: no activation after this layer (yet)
                    h = torch.nn.functional.linear(h, params[f"{name}.weight"], params.get(f"{name}.bias"))
                elif inputs and type(layer) in ELEMENTWISE:
                    h, slope = torch.func.jvp(layer, (h,), (torch.ones_like(h),))
                    slopes[-1] = slope if slopes[-1] is None else slopes[-1] * slope
                else:
                    h = layer(h)                         # Flatten, or activations of the inputs (nothing to learn)
            probs = torch.softmax(h, -1)
            if method == "ggn":
                # delta[c, i] = √p_ic (p_i − e_c)
                eye = torch.eye(classes, dtype=probs.dtype, device=probs.device)
                delta = probs.T.sqrt().unsqueeze(-1) * (probs.unsqueeze(0) - eye.unsqueeze(1))
            else:
                # drawn chunk by chunk like the per-example path; the two agree label for label when their chunks do
                # (torch 2.13's CPU multinomial also gives the same labels for any split of the rows)
                labels = rng.multinomial(probs, generator)
                delta = (probs - torch.nn.functional.one_hot(labels, classes).to(probs.dtype)).unsqueeze(0)
            # backward: delta holds ∂ℓ/∂(output of the layer's activations), then ∂ℓ/∂z of the layer
            for index in reversed(range(len(linears))):
                name, _ = linears[index]
                if slopes[index] is not None:
                    delta = delta * slopes[index]
                squares = delta.square().sum(0)          # Σ_k δ_ik², (n, out)
                total[f"{name}.weight"] += squares.T @ inputs[index].square()
                if f"{name}.bias" in total:
                    total[f"{name}.bias"] += squares.sum(0)
                if index > 0:                            # (the first layer's input needs no δ: the costliest product)
                    delta = delta @ params[f"{name}.weight"]
    return model.flatten(total)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


# --- the algorithm ------------------------------------------------------------------------------------------------


def make(*, delta: float, lr: float, num_clients: int, rho: float | None = None, epochs: int = 1,
         batch_size: int = 32, curvature: str = "ggn", name: str = "fedlap-cov") -> Algorithm:
    """FedLap-Cov (diagonal) with prior precision δ, damping ρ (default 1/K), local Adam (lr, epochs, batch_size) and
    the curvature estimator `curvature` ("ggn" exact diagonal GGN, or "mc-fisher")."""
    solver = local_adam(name, lr, epochs, batch_size)
    if isinstance(num_clients, bool) or not isinstance(num_clients, numbers.Integral) or num_clients < 1:
        raise ValueError(f"{name}: num_clients must be a positive integer, got {num_clients!r}")
    rho = 1.0 / num_clients if rho is None else rho
    problems = []
    if not _is_real(delta) or not delta > 0:
        problems.append(f"delta must be a finite number > 0, got {delta!r}")
    if not _is_real(rho) or not 0 < rho <= 1:
        problems.append(f"rho must be a number in (0, 1], got {rho!r}")
    if curvature not in CURVATURES:
        problems.append(f"curvature must be one of {', '.join(CURVATURES)}, got {curvature!r}")
    if problems:
        raise ValueError(f"{name}: " + "; ".join(problems))
    rho = float(rho)

    def initial_site(theta0: Tensor) -> Tensor:
        return delta * theta0 / num_clients                                  # v_k⁽⁰⁾, Σ_k v_k⁽⁰⁾ = δθ_0

    def init_server(theta0: Tensor) -> ServerState:
        return ServerState(theta0, torch.full_like(theta0, delta), theta0, {})

    def init_client(server: ServerState, client_id: int) -> ClientState:
        if not 0 <= client_id < num_clients:
            raise KeyError(f"{name}: client id {client_id} is not in range({num_clients})")
        return ClientState(initial_site(server.theta0), torch.zeros_like(server.theta0), None, None)

    def broadcast(server: ServerState) -> Message:
        return {"mean": server.mean, "precision": server.precision}

    def client_update(state: ClientState, message: Message, data, generator: torch.Generator):
        if generator is None:
            raise ValueError(f"{name}: client_update needs the client's torch.Generator (it shuffles the minibatches)")
        mean_g, precision_g = message["mean"], message["precision"]
        n = data.num_examples
        linear, weight, center = cavity_problem(state.v, state.V, mean_g, precision_g, n)
        if not bool((weight > 0).all()):
            raise SubproblemError(f"{name}: the cavity precision S_g − V_k is not positive; the broadcast S_g does "
                                  f"not contain this client's V_k")
        mean, steps = solver.train(data, mean_g, generator, linear=linear, prox_weight=weight, prox_center=center)
        H = diagonal_ggn(data, mean, curvature, generator)
        precision = H - state.V + precision_g
        v = state.v + rho * (precision * mean - precision_g * mean_g)
        V = (1.0 - rho) * state.V + rho * H
        reply = {"v": v, "V": V, "mean": mean, "precision": precision}
        return ClientState(v, V, mean, precision), reply, {"iterations": steps}

    def server_update(server: ServerState, replies: Mapping[int, Message]):
        unknown = sorted(k for k in replies if not 0 <= k < num_clients)
        if unknown:
            raise KeyError(f"{name}: replies from clients {unknown} outside range({num_clients})")
        last = merge_replies(server.replies, replies)
        precision = delta + sum((r["V"] for r in last.values()), torch.zeros_like(server.theta0))
        v_sum = sum((r["v"] for r in last.values()), torch.zeros_like(server.theta0))
        v_sum = v_sum + (num_clients - len(last)) * initial_site(server.theta0)
        if not bool(torch.isfinite(precision).all() and (precision > 0).all() and torch.isfinite(v_sum).all()):
            raise DivergenceError(f"{name}: the server's precision is not positive and finite")
        return ServerState(v_sum / precision, precision, server.theta0, last), {"clients": len(last)}

    def posterior(server: ServerState) -> Posterior:
        family = DiagonalGaussian(server.mean.shape[0])
        return Posterior(family, family.from_moments(server.mean, server.precision))

    return Algorithm(name, init_server, init_client, broadcast, client_update, server_update, posterior)
