"""Exponential families in natural parameters (Gaussian variational families)."""

from . import natural
from .gaussian import (
    DiagonalGaussian,
    FullGaussian,
    GaussianFamily,
    IsotropicGaussian,
    Posterior,
    make_family,
)
from .natural import Natural

__all__ = [
    "DiagonalGaussian",
    "FullGaussian",
    "GaussianFamily",
    "IsotropicGaussian",
    "Natural",
    "Posterior",
    "make_family",
    "natural",
]
