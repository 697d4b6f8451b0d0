"""A cohort's minibatch gradients by the two routes of `bayesadmm.models.batched`, timed alternately in one process:
the written-out backward pass of plan-run MLPs (`FlatModel.batched_gradients`) and vmap of grad (the route of any
other model, `batched.vmap_gradients`), on the papers' MLP (784-200-100-10) at minibatches of 32.

    python benchmarks/batched_gradients.py [--clients 5 16 32] [--calls 20] [--repeats 7] [--threads 1]

For each cohort size K: K random parameter vectors and K minibatches of random images, each route called `--calls`
times per repetition, the routes alternating; printed: the median milliseconds per call of each, their ratio, and the
largest difference between the two (they agree to float32 rounding).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bayesadmm.models import batched, mlp

BATCH = 32
LOSS = torch.nn.functional.cross_entropy  # each client's mean over its minibatch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[5, 16, 32])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = mlp()
    gen = torch.Generator().manual_seed(0)
    print(f"papers' MLP, batch {BATCH}, {torch.get_num_threads()} threads, {args.repeats} alternating repeats of "
          f"{args.calls} calls, medians")
    for k in args.clients:
        thetas = 0.05 * torch.randn(k, model.dim, generator=gen)
        X = torch.rand(k, BATCH, 784, generator=gen)
        y = torch.randint(0, 10, (k, BATCH), generator=gen)

        out = torch.empty_like(thetas)
        routes = {
            "written-out": lambda thetas=thetas, X=X, y=y, o=out: model.batched_gradients(thetas, X, LOSS, y, out=o),
            "vmap": lambda thetas=thetas, X=X, y=y: batched.vmap_gradients(model.forward, thetas, X, LOSS, y),
        }
        gap = float((routes["written-out"]() - routes["vmap"]()).abs().max())
        times: dict[str, list[float]] = {name: [] for name in routes}
        for _ in range(args.repeats):
            for name, route in routes.items():
                began = time.perf_counter()
                for _ in range(args.calls):
                    route()
                times[name].append((time.perf_counter() - began) / args.calls * 1e3)
        written, generic = statistics.median(times["written-out"]), statistics.median(times["vmap"])
        print(f"K={k:3d}: written-out {written:6.2f} ms, vmap {generic:6.2f} ms per call; vmap / written-out "
              f"{generic / written:.2f}; largest difference {gap:.1e}")


if __name__ == "__main__":
    main()
