"""Where compiling IVON's fused kernels pays: the data behind `optim.kernels.compile_pays` (`compile="auto"`).

    python benchmarks/compile_rule.py [--dims 771 10000 100000 199210 1000000] [--calls 200] [--threads 1]

A run's IVON client solves call one fused kernel per local step (`update_and_sample_step_`; `sample_step` before
the first step and `update_step_` after the last), with the gradient computed the same way either way. So compiling
changes a run's time by (compiled − eager seconds per step call) × the run's local steps, plus the compilation, paid
once per process. Printed:

- per parameter count d: the median seconds per call of the step kernel, eager and compiled (warmed up; `--calls`
  calls, 5 repeats alternating), and the difference;
- the compilation of the three kernels a solve calls, in a child process on a new, empty Inductor cache (cold), and
  again in another child on the cache the first left (warm: tracing and loading);
- a straight line a + b·d through the savings per call (least squares of the relative error), and what it makes of
  the rule: compiling pays where a run's local steps × (a + b·d) exceed the compilation on an empty cache.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def _arguments(d: int) -> tuple:
    """`update_and_sample_step_`'s arguments for one client with d parameters and one sample, as a solve makes them."""
    g = torch.Generator().manual_seed(0)

    def vec(scale: float = 1.0, shift: float = 0.0):
        return torch.rand(d, generator=g) * scale + shift

    def scalar(value: float):
        return torch.tensor(value)

    mean, hess, momentum = vec(), vec(1e-3, 1e-3), vec(1e-3)
    grads, eps = torch.randn(1, d, generator=g), torch.randn(1, d, generator=g)
    delta, prior, v, u, lr = vec(1e-3, 1e-3), vec(), vec(1e-4), vec(1e-5), scalar(1e-3)
    rest = (scalar(100.0), scalar(0.9), scalar(0.9998), scalar(0.5), scalar(float("inf")))
    return (mean, hess, momentum, grads, eps, delta, prior, v, u, lr, *rest, torch.tensor(7, dtype=torch.int64), 1)


def time_calls(d: int, calls: int) -> tuple[float, float]:
    """Median seconds per call of the step kernel on d parameters: (eager, compiled)."""
    from bayesadmm.optim import kernels

    args = _arguments(d)
    compiled, eager = kernels.update_and_sample_step_, kernels.update_and_sample_step_.eager
    for _ in range(10):  # warm-up (the compiled one compiles here)
        compiled(*args)
        eager(*args)
    runs: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(5):
        for name, fn in (("eager", eager), ("compiled", compiled)):
            start = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            runs[name].append((time.perf_counter() - start) / calls)
    return statistics.median(runs["eager"]), statistics.median(runs["compiled"])


def compile_once() -> float:
    """Seconds for the first calls of the three kernels a solve calls (in this process: compiles or loads them)."""
    from bayesadmm.optim import kernels

    args = _arguments(1000)
    start = time.perf_counter()
    kernels.sample_step(args[0], args[1], args[5], args[10], args[15], 1)
    kernels.update_and_sample_step_(*args)
    kernels.update_step_(*args[:15])
    return time.perf_counter() - start


def _child_compile(cache: str) -> float:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    env.pop("BAYESADMM_COMPILE", None)
    out = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", type=int, nargs="+", default=[771, 10_000, 100_000, 178_110, 1_000_000])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a client solve's, one per worker)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        print(compile_once())
        return
    os.environ.pop("BAYESADMM_COMPILE", None)
    with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache:
        cold, warm = _child_compile(cache), _child_compile(cache)
    print(f"compiling the three kernels of a solve: {cold:.1f} s on an empty cache, {warm:.1f} s on a warm one")
    print(f"{'d':>9} {'eager µs':>9} {'compiled µs':>12} {'saving µs':>10}")
    points = []
    for d in args.dims:
        eager, compiled = time_calls(d, args.calls)
        points.append((d, eager - compiled))
        print(f"{d:>9} {eager * 1e6:>9.1f} {compiled * 1e6:>12.1f} {(eager - compiled) * 1e6:>10.1f}", flush=True)
    a, b = _fit(points)
    print(
        f"saving per step call ≈ {a * 1e6:.0f} µs + {b * 1e9:.2f} ns × d (least squares of the relative error); "
        f"compiling pays on an empty cache where steps × ({a * 1e6:.0f} µs + {b * 1e9:.2f} ns × d) > {cold:.1f} s"
    )


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) of the line a + b·d closest to the savings s in relative terms: least squares of (a + b·d)/s − 1."""
    rows = torch.tensor([[1.0 / s, d / s] for d, s in points], dtype=torch.float64)
    solution = torch.linalg.lstsq(rows, torch.ones(len(points), 1, dtype=torch.float64)).solution
    return float(solution[0]), float(solution[1])

if __name__ == "__main__":
    main()
