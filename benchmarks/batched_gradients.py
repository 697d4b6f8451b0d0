"""A cohort's minibatch gradients by the routes of `bayesadmm.models.batched`, timed alternately in one process: the
written-out backward pass of plan-run MLPs (`FlatModel.batched_gradients`), with the loss's gradient at the outputs
by autograd or in closed form (`Classification.nll_grad`, as cohort training passes it), and vmap of grad (the route
of any other model, `batched.vmap_gradients`), on the papers' MLP (784-200-100-10) at minibatches of 32.

    python benchmarks/batched_gradients.py [--clients 5 16 32] [--calls 20] [--repeats 7] [--threads 1]

For each cohort size K: K random parameter vectors and K minibatches of random images, each route called `--calls`
times per repetition, the routes alternating; printed: the median milliseconds per call of each, the ratios to the
closed form's, and the largest difference between the written-out and the vmap routes (they agree to float32
rounding; the two written-out ones give the same bits). Then one client, as the per-client solvers take its
gradient: `SupervisedData.batch_grad` (the written-out route for one row) against autograd of `batch_loss`, on a
client of 1200 random images, alternating the same way.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bayesadmm.clients import SupervisedData
from bayesadmm.likelihoods import Classification
from bayesadmm.models import batched, mlp

BATCH = 32
LOSS = torch.nn.functional.cross_entropy  # each client's mean over its minibatch


def mean_grad(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient of the clients' summed mean losses at their outputs, as `solvers.cohort` passes it."""
    return Classification().nll_grad(outputs, y, 1.0 / BATCH)


def alternate(routes: dict, calls: int, repeats: int) -> list[float]:
    """Each route's median milliseconds per call: `repeats` rounds of `calls` calls of each route in turn."""
    times: dict[str, list[float]] = {name: [] for name in routes}
    for _ in range(repeats):
        for name, route in routes.items():
            began = time.perf_counter()
            for _ in range(calls):
                route()
            times[name].append((time.perf_counter() - began) / calls * 1e3)
    return [statistics.median(times[name]) for name in routes]


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
            "closed form": lambda thetas=thetas, X=X, y=y, o=out: model.batched_gradients(
                thetas, X, LOSS, y, out=o, loss_grad=mean_grad
            ),
            "autograd": lambda thetas=thetas, X=X, y=y, o=out: model.batched_gradients(thetas, X, LOSS, y, out=o),
            "vmap": lambda thetas=thetas, X=X, y=y: batched.vmap_gradients(model.forward, thetas, X, LOSS, y),
        }
        closed = routes["closed form"]().clone()
        if not torch.equal(closed, routes["autograd"]()):
            raise SystemExit("the closed-form and the autograd loss gradients differ: a bug")
        gap = float((closed - routes["vmap"]()).abs().max())
        closed_ms, autograd_ms, vmap_ms = alternate(routes, args.calls, args.repeats)
        print(f"K={k:3d}: written-out with the closed form {closed_ms:6.2f} ms, with autograd {autograd_ms:6.2f} ms, "
              f"vmap {vmap_ms:6.2f} ms per call; autograd / closed form {autograd_ms / closed_ms:.2f}, vmap / closed "
              f"form {vmap_ms / closed_ms:.2f}; largest difference (vmap) {gap:.1e}")
    one_client(model, gen, args.calls, args.repeats)


def one_client(model, gen: torch.Generator, calls: int, repeats: int) -> None:
    """`SupervisedData.batch_grad` against autograd of `batch_loss` on one client's minibatches."""
    data = SupervisedData(model, torch.rand(1200, 784, generator=gen), torch.randint(0, 10, (1200,), generator=gen))
    theta = 0.05 * torch.randn(model.dim, generator=gen)
    idx = torch.randperm(1200, generator=gen)[:BATCH]

    def autograd() -> torch.Tensor:
        leaf = theta.detach().requires_grad_(True)
        return torch.autograd.grad(data.batch_loss(leaf, idx), leaf)[0]

    routes = {"batch_grad": lambda: data.batch_grad(theta, idx), "autograd": autograd}
    gap = float((routes["batch_grad"]() - routes["autograd"]()).abs().max())
    grad_ms, autograd_ms = alternate(routes, calls, repeats)
    print(f"one client: SupervisedData.batch_grad {grad_ms:6.2f} ms, autograd of batch_loss {autograd_ms:6.2f} ms per "
          f"call; autograd / batch_grad {autograd_ms / grad_ms:.2f}; largest difference {gap:.1e}")


if __name__ == "__main__":
    main()
