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


def rand(n: int, generator: torch.Generator | None, device) -> Tensor:
    """n uniforms on [0, 1) in float64, drawn on the generator's device, returned on `device`."""
    return torch.rand(n, generator=generator, dtype=torch.float64, device=_source(generator)).to(device)


def randperm(n: int, generator: torch.Generator | None, device) -> Tensor:
    """A random permutation of 0..n−1, drawn on the generator's device, returned on `device`."""
    return torch.randperm(n, generator=generator, device=_source(generator)).to(device)


def multinomial(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One category per row of `probs` (N, C), drawn on the generator's device, returned on `probs`' device."""
    return torch.multinomial(probs.to(_source(generator)), 1, generator=generator).squeeze(-1).to(probs.device)


def poisson(rates: Tensor, generator: torch.Generator | None) -> Tensor:
    """Poisson counts of `rates` (any shape, as floats), drawn on the generator's device, returned on `rates`'."""
    return torch.poisson(rates.to(_source(generator)), generator=generator).to(rates.device)


# --- a counter-based stream of normals, for IVON's per-step noise --------------------------------------------------
#
# A sequential generator (torch's mt19937) cannot be drawn inside a fused kernel, and on a CPU it is slow: 178k
# normals cost as much as a whole Adam step of the papers' MLP. A counter-based generator computes draw i from
# (key, i) with plain integer and float arithmetic, so the draws are made inside the fused IVON sampling kernel
# (optim/kernels.py) in one vectorised pass and give the same numbers on any device.
#
# Block b of stream `key` (IVON's step b) gets its own 64-bit key, SplitMix64(key + (b + 1)·γ) (Steele, Lea & Flood
# 2014), computed once per step in Python; within the block, pair j of draws comes from 32-bit integer hashes only:
#     a = H(H(j·φ + k_lo) ^ k_hi),   b = H(a + φ),    H = Wellons' "lowbias32" integer hash, φ = 2³²/golden ratio,
# with (k_lo, k_hi) the halves of the block key; a is bijective in j, so no pair repeats within a block, and every
# draw depends on all 64 key bits. Why 32-bit: CPUs without AVX-512 (AVX2) have no vectorised 64-bit multiply or
# int64 → float conversion, and SplitMix64 on every draw cost 1.6× as much as this (benchmarks/noise.py).
# The pair is turned into two normals by Box–Muller: radius √(−2 ln u₁) with u₁ = (top 24 bits of a + ½)/2²⁴, angle
# from b: quadrant from its top 2 bits, offset y ∈ [−π/4, π/4) from its low 24 bits, with cos y and sin y as Taylor
# polynomials (|error| < 2·10⁻⁹, below float32's resolution), which are cheaper than the library cos/sin.
# u₁ ≥ 2⁻²⁵, so |draw| ≤ √(2 ln 2²⁵) ≈ 5.9: the normal's tail beyond 5.9σ (probability 4·10⁻⁹) is cut.
#
# torch has no unsigned 32-bit arithmetic, so the hash runs on int32, whose multiplication wraps like uint32's
# (two's complement; the tests compare eager and compiled draws with exact integers); right shifts are made logical
# by masking.

_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1
_PHI32 = 0x9E3779B9 - (1 << 32)  # as int32
_HASH1 = 0x7FEB352D
_HASH2 = 0x846CA68B - (1 << 32)
_LOW24 = (1 << 24) - 1


def _splitmix64(z: int) -> int:
    """SplitMix64's output function on a Python integer (mod 2⁶⁴)."""
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int32 values (>> is arithmetic on signed integers)."""
    return (z >> bits) & ((1 << (32 - bits)) - 1)


def _hash32(x: Tensor) -> Tensor:
    """Wellons' lowbias32 integer hash (a bijection of 32-bit integers), on int32 tensors."""
    x = (x ^ _shift_right(x, 16)) * _HASH1
    x = (x ^ _shift_right(x, 15)) * _HASH2
    return x ^ _shift_right(x, 16)


def stream_key(generator: torch.Generator | None) -> Tensor:
    """A key for `block_key` (a 0-d int64 tensor on the CPU), drawn from the generator: one draw per stream."""
    return torch.randint(
        -(1 << 63), (1 << 63) - 1, (), generator=generator, dtype=torch.int64, device=_source(generator)
    ).cpu()


def block_key(key: Tensor | int, block: int) -> Tensor:
    """The key of block number `block` (≥ 0) of stream `key`: SplitMix64(key + (block + 1)·γ), a 0-d int64 tensor.
    Computed in Python (one per IVON step), so blocks of any size and any number of steps never share draws."""
    if block < 0:
        raise ValueError(f"block must be >= 0, got {block}")
    bits = _splitmix64((int(key) + (block + 1) * _GAMMA) & _MASK64)
    return torch.tensor(bits - (1 << 64) if bits >= 1 << 63 else bits, dtype=torch.int64)


def counter_normal(key: Tensor, n: int, dtype: torch.dtype, device) -> Tensor:
    """n standard normals of the block with key `key` (0-d int64, from `block_key`), as a flat tensor; for keys
    (A, 1) the A blocks' draws as the rows of an (A, n) tensor (one computation without vmap, whose batch size
    torch.compile would specialise on).

    Pair j = 0 … ⌈n/2⌉ − 1 gives outputs j (cosine half) and ⌈n/2⌉ + j (sine half); see the comment above for the
    hash and the transform. The same (key, n) always gives the same draws, on any device and in compiled code.
    """
    pairs = (n + 1) // 2
    key = key.to(device)
    k_lo, k_hi = key.to(torch.int32), (key >> 32).to(torch.int32)  # int64 → int32 keeps the low 32 bits
    j = torch.arange(pairs, dtype=torch.int32, device=device)
    a = _hash32(_hash32(j * _PHI32 + k_lo) ^ k_hi)
    b = _hash32(a + _PHI32)
    scale = 2.0**-24
    u1 = (_shift_right(a, 8).to(dtype) + 0.5) * scale
    radius = torch.sqrt(-2.0 * torch.log(u1))
    y = ((b & _LOW24).to(dtype) * scale - 0.5) * (math.pi / 2)
    y2 = y * y
    sin_y = y * (1.0 + y2 * (-1.0 / 6 + y2 * (1.0 / 120 + y2 * (-1.0 / 5040 + y2 * (1.0 / 362880)))))
    cos_y = 1.0 + y2 * (-0.5 + y2 * (1.0 / 24 + y2 * (-1.0 / 720 + y2 * (1.0 / 40320 + y2 * (-1.0 / 3628800)))))
    # angle = quadrant·π/2 + y, quadrant q = top 2 bits of b: rotate (cos y, sin y) by q quarter turns, i.e.
    # (cos, sin) = (c, s), (−s, c), (−c, −s), (s, −c) for q = 0..3: an odd q swaps the two, cos is negative for
    # q = 1, 2 (the two top bits differ) and sin for q = 2, 3 (top bit set). Multiplying by ±1 is exact, so these
    # are the bits of a four-way select, with 2 selects instead of 6 (4 % of the draw's time on an AVX2 CPU).
    swap = (b & (1 << 30)) != 0
    cos_sign = 1.0 - 2.0 * ((_shift_right(b, 31) ^ _shift_right(b, 30)) & 1).to(dtype)
    sin_sign = 1.0 - 2.0 * _shift_right(b, 31).to(dtype)
    cos_angle = cos_sign * torch.where(swap, sin_y, cos_y)
    sin_angle = sin_sign * torch.where(swap, cos_y, sin_y)
    return torch.cat([radius * cos_angle, radius * sin_angle], dim=-1)[..., :n]
