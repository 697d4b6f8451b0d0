"""Cost of IVON's per-step weight noise: d standard normals for the papers' MLP (d = 178,110), float32, one thread.

    python benchmarks/noise.py [--calls 300] [--repeats 7] [--threads 1]

Three ways of drawing them are timed alternately in this one run (median ms per call, and each one's median ratio to
the library's stream over neighbouring timings):
* `rng.counter_normal` compiled, as the fused IVON kernel draws it (32-bit integer hashes, polynomial Box–Muller);
* the previous design of that stream, kept here as the reference point: SplitMix64 on every pair (64-bit integer
  multiplies and int64 → float conversions) and the library log/cos/sin, compiled the same way;
* `torch.randn` (torch's sequential mt19937 generator), eager.
Why it matters: on CPUs without AVX-512 the 64-bit variant cost a third of an Adam step (docs/performance.md).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from bayesadmm import rng
from bayesadmm.optim.kernels import compile_enabled

D = 178_110
_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _srl64(z, bits):
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64_normal(key, offset, n):
    """The stream's previous definition: pair j is Box–Muller of the two halves of SplitMix64(key + j·γ), j from
    `offset` on. (Written exactly so: a variant without the offset tensor made torch 2.13's Inductor write out of
    bounds on an AVX2 CPU, "free(): invalid next size"; the library's kernels are checked by the tests.)"""
    pairs = (n + 1) // 2
    z = key + (torch.arange(pairs, dtype=torch.int64) + offset) * _GAMMA
    z = (z ^ _srl64(z, 30)) * _MIX1
    z = (z ^ _srl64(z, 27)) * _MIX2
    z = z ^ _srl64(z, 31)
    u1 = (_srl64(z, 32).to(torch.float32) + 0.5) * 2.0 ** -32
    u2 = ((z & 0xFFFFFFFF).to(torch.float32) + 0.5) * 2.0 ** -32
    radius, angle = torch.sqrt(-2.0 * torch.log(u1)), (2.0 * math.pi) * u2
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    key = rng.block_key(torch.tensor(12345), 0)
    # compiled as the library's kernels are, unless BAYESADMM_COMPILE=0 (the smoke test: compiling took ~100 s)
    how = "compiled" if compile_enabled() else "eager"
    compiled = (lambda f: torch.compile(f, dynamic=True, fullgraph=True)) if compile_enabled() else (lambda f: f)
    library = compiled(lambda k: rng.counter_normal(k, D, torch.float32, "cpu"))
    offset = torch.tensor(0)
    previous = compiled(lambda k: splitmix64_normal(k, offset, D))
    draws = {f"rng.counter_normal (32-bit hashes), {how}": library,
             f"SplitMix64 per pair + library Box-Muller, {how}": previous,
             "torch.randn (mt19937), eager": lambda k: torch.randn(D)}
    times: dict[str, list[float]] = {name: [] for name in draws}
    for f in draws.values():     # warm-up, compilation
        for _ in range(20):
            f(key)
    for _ in range(args.repeats):
        for name, f in draws.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                f(key)
            times[name].append((time.perf_counter() - start) / args.calls)
    reference = times[f"rng.counter_normal (32-bit hashes), {how}"]
    print(f"{D} normals, float32, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{args.calls} calls x {args.repeats} repeats, alternating (median)")
    print("| draw | ms per call | ratio to rng.counter_normal |")
    print("|---|---|---|")
    for name, runs in times.items():
        ratio = statistics.median(t / r for t, r in zip(runs, reference, strict=True))
        print(f"| {name} | {1e3 * statistics.median(runs):.3f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
