"""Pure arithmetic on parameter tuples.

Every exponential-family object in ``bayesadmm.families`` stores its
parameters as a plain tuple of tensors, ``Natural = tuple[Tensor, ...]``.  The
same layout holds natural parameters ``λ``, expectation parameters
``μ = E_q[T(θ)]`` and dual variables ``η`` (which need not describe a valid
distribution).  The tuple is treated as one vector in the direct sum of its
components, so that e.g.

    inner(a, b) = Σ_k <a_k, b_k>_F        (Frobenius inner product per component)

which is exactly the pairing ``<λ, T(θ)>`` used in ``q(θ) ∝ exp(<λ, T(θ)>)``.

All functions are pure: they never modify their arguments and return new
tuples.  Components must match in shape exactly; broadcasting is refused
because silently broadcasting a dual variable is almost always a bug.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

import torch
from torch import Tensor

Natural = tuple[Tensor, ...]

__all__ = [
    "Natural",
    "add",
    "add_scaled",
    "allclose",
    "flatten",
    "inner",
    "lincomb",
    "mean",
    "norm",
    "scale",
    "sub",
    "total",
    "unflatten",
    "zeros_like",
]


def _check_compatible(a: Natural, b: Natural) -> None:
    if len(a) != len(b):
        raise ValueError(f"parameter tuples have different lengths: {len(a)} and {len(b)}")
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.shape != y.shape:
            raise ValueError(f"component {k} has mismatched shapes: {tuple(x.shape)} and {tuple(y.shape)}")


def _check_scalar(c: float | Tensor) -> None:
    if isinstance(c, Tensor) and c.dim() != 0:
        raise ValueError(f"scale factor must be a scalar, got shape {tuple(c.shape)}")


def add(a: Natural, b: Natural) -> Natural:
    """Componentwise ``a + b``."""
    _check_compatible(a, b)
    return tuple(x + y for x, y in zip(a, b, strict=True))


def sub(a: Natural, b: Natural) -> Natural:
    """Componentwise ``a - b``."""
    _check_compatible(a, b)
    return tuple(x - y for x, y in zip(a, b, strict=True))


def scale(a: Natural, c: float | Tensor) -> Natural:
    """``c · a`` for a scalar ``c`` (Python number or 0-dim tensor)."""
    _check_scalar(c)
    return tuple(c * x for x in a)


def add_scaled(a: Natural, c: float | Tensor, b: Natural) -> Natural:
    """``a + c · b``: the numbers of ``add(a, scale(b, c))`` from one new tensor per component instead of two.

    Why: the per-client updates (dual steps, replies) run this on vectors of the model's size, where a fresh
    tensor costs about as much as the arithmetic. c·b is computed into the result and a added in place; IEEE
    addition and multiplication are commutative, so the bits are those of a + (c·b).
    """
    _check_compatible(a, b)
    _check_scalar(c)
    return tuple(_add_into(torch.mul(y, c), x) for x, y in zip(a, b, strict=True))


def _add_into(acc: Tensor, x: Tensor) -> Tensor:
    """acc + x, written into `acc` (a tensor the caller owns) unless x's dtype would widen the result."""
    return acc.add_(x) if torch.result_type(acc, x) == acc.dtype else acc + x


def lincomb(*pairs: tuple[float | Tensor, Natural]) -> Natural:
    """Linear combination ``Σ_i c_i · a_i`` of ``(c_i, a_i)`` pairs (summed left to right)."""
    if not pairs:
        raise ValueError("lincomb needs at least one (coefficient, parameters) pair")
    result = scale(pairs[0][1], pairs[0][0])
    for c, a in pairs[1:]:
        result = add_scaled(result, c, a)
    return result


def total(items: Iterable[Natural]) -> Natural:
    """Sum ``Σ_i a_i`` of a non-empty collection of parameter tuples, added left to right.

    The server sums one reply per client: the sum is accumulated in place in one new tensor per component (the same
    numbers as adding pairwise, without a fresh tensor per client).
    """
    items = list(items)
    if not items:
        raise ValueError("cannot sum an empty collection of parameter tuples")
    for a in items[1:]:
        _check_compatible(items[0], a)
    result = tuple(x.clone() for x in items[0])
    for a in items[1:]:
        result = tuple(_add_into(acc, x) for acc, x in zip(result, a, strict=True))
    return result


def mean(items: Iterable[Natural]) -> Natural:
    """Average ``(1/n) Σ_i a_i`` of a non-empty collection of parameter tuples."""
    items = list(items)
    return scale(total(items), 1.0 / len(items))


def inner(a: Natural, b: Natural) -> Tensor:
    """``Σ_k <a_k, b_k>_F`` as a 0-dim tensor."""
    _check_compatible(a, b)
    return cast(Tensor, sum((x * y).sum() for x, y in zip(a, b, strict=True)))


def norm(a: Natural) -> Tensor:
    """Euclidean norm ``sqrt(inner(a, a))`` as a 0-dim tensor."""
    return torch.sqrt(inner(a, a))


def zeros_like(a: Natural) -> Natural:
    """All-zero tuple with the shapes, dtypes and devices of ``a``."""
    return tuple(torch.zeros_like(x) for x in a)


def allclose(a: Natural, b: Natural, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
    """``torch.allclose`` applied to every component."""
    _check_compatible(a, b)
    return all(torch.allclose(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b, strict=True))


def flatten(a: Natural) -> Tensor:
    """Concatenate all components (row-major) into one 1-D tensor."""
    return torch.cat([x.reshape(-1) for x in a])


def unflatten(vec: Tensor, like: Sequence[Tensor]) -> Natural:
    """Inverse of ``flatten``: split ``vec`` into the component shapes of ``like``."""
    if vec.dim() != 1:
        raise ValueError(f"expected a 1-D tensor, got shape {tuple(vec.shape)}")
    sizes = [x.numel() for x in like]
    if vec.numel() != sum(sizes):
        raise ValueError(f"vector has {vec.numel()} entries but the layout needs {sum(sizes)}")
    return tuple(chunk.reshape(x.shape) for chunk, x in zip(torch.split(vec, sizes), like, strict=True))
