"""Random draws that do not depend on where the tensors live.

Every draw is made by a CPU `torch.Generator` (the engine's per-(seed, round, client) streams) on the CPU and then
moved to the target device, so a run on a GPU consumes exactly the random numbers of the same run on the CPU and
their results agree up to floating-point tolerance. (A CUDA generator would produce a different stream, and torch
refuses a CPU generator for a CUDA tensor.) On the CPU the `.to` is free. `generator=None` uses torch's global CPU
generator, for callers that want ivon-opt's behaviour.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _source(generator: torch.Generator | None) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


def randn(shape, generator: torch.Generator | None, dtype: torch.dtype, device) -> Tensor:
    """Standard normals of `shape`, drawn on the generator's device, returned on `device`."""
    return torch.randn(shape, generator=generator, dtype=dtype, device=_source(generator)).to(device)


def randperm(n: int, generator: torch.Generator | None, device) -> Tensor:
    """A random permutation of 0..n−1, drawn on the generator's device, returned on `device`."""
    return torch.randperm(n, generator=generator, device=_source(generator)).to(device)


def multinomial(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One category per row of `probs` (N, C), drawn on the generator's device, returned on `probs`' device."""
    return torch.multinomial(probs.to(_source(generator)), 1, generator=generator).squeeze(-1).to(probs.device)
