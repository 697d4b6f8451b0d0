"""Time of FedLap-Cov's curvature `diagonal_ggn` on the papers' MLP (784-200-100-10, sigmoid) for one client's data.

    python benchmarks/diagonal_ggn.py [--examples 6000] [--repeats 3] [--threads 1] [--methods ggn mc-fisher]

Inputs are random raw-scale pixels (0–255, float32) and θ the MLP's default initialisation; the curvature's cost
does not depend on the values. Prints the median seconds per call over the repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bayesadmm.clients import SupervisedData
from bayesadmm.models import mlp
from bayesadmm.solvers.curvature import CURVATURES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=6000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--methods", nargs="+", default=["ggn", "mc-fisher"], choices=sorted(CURVATURES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    model = mlp()
    X = torch.rand(args.examples, 784, generator=gen) * 255
    y = torch.randint(0, 10, (args.examples,), generator=gen)
    data = SupervisedData(model, X, y)
    theta = model.initial_params(torch.Generator().manual_seed(1))
    print(f"MLP 784-200-100-10, {args.examples} examples, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}")
    for method in args.methods:
        curvature = CURVATURES[method]()
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            curvature(data, theta, torch.Generator().manual_seed(2))
            times.append(time.perf_counter() - start)
        print(f"{method}: {statistics.median(times):.3f} s  (runs: {', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
