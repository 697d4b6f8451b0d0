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
    "natural",
    "Natural",
    "GaussianFamily",
    "IsotropicGaussian",
    "DiagonalGaussian",
    "FullGaussian",
    "Posterior",
    "make_family",
]
