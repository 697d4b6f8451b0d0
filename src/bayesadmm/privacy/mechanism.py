"""The Gaussian mechanism on a sum of clipped vectors, as pure functions (the client-level wrapper and the tests
use the same code)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from bayesadmm import rng

__all__ = ["clip_factor", "gaussian_noise", "noised_sum"]


def clip_factor(vector: Tensor, clip: float) -> float:
    """min(1, clip / ‖vector‖₂): the factor that scales `vector` into the L2 ball of radius `clip` (1 inside it)."""
    norm = float(torch.linalg.vector_norm(vector.double()))
    return 1.0 if norm <= clip else clip / norm


def gaussian_noise(like: Tensor, std: float, generator: torch.Generator) -> Tensor:
    """N(0, std² I) of `like`'s shape, dtype and device, drawn from `generator` alone, on the generator's device
    (`rng.randn`: a run on a GPU draws the numbers of the same run on the CPU)."""
    return rng.randn(like.shape, generator, like.dtype, like.device).mul_(std)


def noised_sum(vectors: Sequence[Tensor], clip: float, noise_multiplier: float, generator: torch.Generator) -> Tensor:
    """Σ_k clip(v_k) + N(0, (noise_multiplier · clip)² I): each vector scaled into the L2 ball of radius `clip`, so
    that adding or removing one changes the sum by at most `clip` (its sensitivity), then Gaussian noise of
    standard deviation `noise_multiplier` · `clip`."""
    total = torch.stack([v * clip_factor(v, clip) for v in vectors]).sum(dim=0)
    return total + gaussian_noise(total, noise_multiplier * clip, generator)
