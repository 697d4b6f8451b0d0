"""Random draws that do not depend on where the tensors live.

Every draw is made by a CPU `torch.Generator` (the engine's per-(seed, round, client) streams) on the CPU and then
moved to the target device, so a run on a GPU consumes exactly the random numbers of the same run on the CPU and
their results agree up to floating-point tolerance. (A CUDA generator would produce a different stream, and torch
refuses a CPU generator for a CUDA tensor.) On the CPU the `.to` is free. `generator=None` uses torch's global CPU
generator, for callers that want ivon-opt's behaviour.
"""

from __future__ import annotations

import math

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


# --- a counter-based stream of normals, for IVON's per-step noise --------------------------------------------------
#
# torch's CPU generator (mt19937) is sequential: 178k normals cost ~0.6 ms, half an Adam step of the papers' MLP.
# A counter-based generator computes draw i from (key, i) with plain integer and float arithmetic, so the draws can be
# made inside the fused IVON sampling kernel (optim/kernels.py) in one vectorised pass, and give the same integers on
# any device. Draw i hashes the key and i with SplitMix64's output function (Steele, Lea & Flood 2014: the state
# key + i·γ, γ the golden-ratio increment, is exactly SplitMix64's i-th state, a generator that passes BigCrush), and
# turns the 64 bits into two normals by Box–Muller. torch has no unsigned 64-bit arithmetic, so the hash runs on
# int64, whose multiplication wraps like uint64's; right shifts are made logical by masking.

_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)   # as int64
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
_LOW32 = (1 << 32) - 1


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 values (>> is arithmetic on signed integers)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix64(z: Tensor) -> Tensor:
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def stream_key(generator: torch.Generator | None) -> Tensor:
    """A key for `counter_normal` (a 0-d int64 tensor on the CPU), drawn from the generator: one draw per stream."""
    return torch.randint(-(1 << 63), (1 << 63) - 1, (), generator=generator, dtype=torch.int64,
                         device=_source(generator)).cpu()


def counter_normal(key: Tensor, offset: Tensor | int, n: int, dtype: torch.dtype, device) -> Tensor:
    """Standard normals number 2·offset … 2·offset + n − 1 of the stream `key` (0-d int64), as a flat tensor.

    Pair j (j = offset, offset + 1, …) of the stream is Box–Muller of the two 32-bit halves of SplitMix64(key + j·γ);
    the first ⌈n/2⌉ outputs are the cosine halves, the rest the sine halves. `offset` counts pairs, so consecutive
    blocks of n draws use offsets 0, ⌈n/2⌉, 2⌈n/2⌉, …. The uniforms are (k + ½)/2³², never 0, so the largest |draw|
    is √(2·ln 2³³) ≈ 6.8: the normal's tail beyond 6.8σ (probability 10⁻¹¹) is cut.
    """
    pairs = (n + 1) // 2
    j = torch.arange(pairs, dtype=torch.int64, device=device) + offset
    bits = _splitmix64(key.to(device) + j * _GAMMA)
    scale = 2.0 ** -32
    u1 = (_shift_right(bits, 32).to(dtype) + 0.5) * scale
    u2 = ((bits & _LOW32).to(dtype) + 0.5) * scale
    radius = torch.sqrt(-2.0 * torch.log(u1))
    angle = (2.0 * math.pi) * u2
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n]
