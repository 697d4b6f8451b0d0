"""Cohort training against per-client training: one round's client updates, timed
alternately in one process, for 10, 100 and 1000 clients over the same FashionMNIST training set.

    python benchmarks/cohort.py [--method fedavg] [--clients 10 100 1000] [--fraction 1.0] [--repeats 3]
                                [--cohort-size 32 [64 ...]] [--device cpu] [--threads N]

For each number of clients K, the training set (a `--fraction` of FashionMNIST's 60,000 images; random images of the
same shape where the files are absent, which changes no timing) is split into K equal clients of the papers' MLP
(784-200-100-10), and one round of `--method` (every client, one epoch, minibatches of 32) is trained by
`LocalClients` (one client after the other, one thread each, as the engine's one-process runner) and by
`CohortClients` (`--cohort-size` clients per batched computation; on torch's threads, or on one with --threads 1),
alternately, `--repeats` times from the same broadcast and client states, after a whole round of each as warm-up.
Printed per K (medians): seconds per round of each runner and their ratio; the total number of local steps and the
time per local step; the per-client runner's overhead per client (its round time above its steps at the cohort
runner's pace, in cohort steps); and the cohort round's time over what its arithmetic needs at the batched matrix-
product throughput measured in the same run. The arithmetic of one local step on a minibatch of B = 32: 2·B·P
floating-point operations forward, 2·B·P for the weights' gradients and 2·B·(P − P₁) for the gradients of the hidden
layers' inputs (the images need none), with P = 177,800 weights and P₁ = 156,800 of them in the first layer: 24.1
MFLOP (biases and elementwise work left out, so the bound is optimistic), at the GFLOP/s of `torch.bmm` on a cohort's
stacked first-layer products.

Scale (after the table, for each cohort size): the cohort runner's time per local step at each K against the
smallest K's, as the overhead per client in local steps, (t_K / steps_K − t_k / steps_k) · steps_K / K /
(t_k / steps_k): what each client costs beyond its local steps as the same data is cut into more, smaller clients.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bayesadmm.clients import TensorClients
from bayesadmm.engine.cohort import CohortClients
from bayesadmm.engine.runners import LocalClients
from bayesadmm.federated import algorithm_factory
from bayesadmm.models import mlp

BATCH = 32
HPARAMS = {
    "fedavg": {"lr": 1e-3},
    "fedprox": {"lr": 1e-3, "mu": 0.01},
    "feddyn": {"lr": 1e-3, "alpha": 0.01},
    "ivon-admm": {"lr": 0.1, "rho": 1.0, "gamma": 1.0, "delta": 1.0, "hess_init": 1.0},
}


def _images(fraction: float) -> tuple[torch.Tensor, torch.Tensor, str]:
    try:
        from bayesadmm.data import load_image_dataset

        X, y = load_image_dataset("fashion-mnist", "train", download=False)
        what = "FashionMNIST"
    except Exception:  # noqa: BLE001 — absent files: random images of the same shape time the same
        gen = torch.Generator().manual_seed(0)
        X, y = torch.rand(60000, 1, 28, 28, generator=gen), torch.randint(0, 10, (60000,), generator=gen)
        what = "random images (FashionMNIST absent)"
    n = int(len(y) * fraction)
    return X[:n].reshape(n, -1).float(), y[:n], what


def _bmm_gflops(k: int, device: str, dtype: torch.dtype, repeats: int = 5) -> float:
    """GFLOP/s of torch.bmm on k stacked (32 × 784) × (784 × 200) products, the MLP's largest."""
    a = torch.randn(k, BATCH, 784, device=device, dtype=dtype)
    b = torch.randn(k, 784, 200, device=device, dtype=dtype)
    torch.bmm(a, b)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        began = time.perf_counter()
        for _ in range(10):
            torch.bmm(a, b)
        _sync(device)
        best = min(best, (time.perf_counter() - began) / 10)
    return 2 * k * BATCH * 784 * 200 / best / 1e9


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="fedavg", choices=sorted(HPARAMS))
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cohort-size", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for the process (0: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    single = torch.get_num_threads() == 1
    dtype = torch.float32
    torch.set_default_dtype(dtype)
    X, y, what = _images(args.fraction)
    model = mlp()
    weights, first_layer = 784 * 200 + 200 * 100 + 100 * 10, 784 * 200
    # forward, weights' gradients, hidden layers' input gradients
    step_flops = 2 * BATCH * (2 * weights + weights - first_layer)
    per_step: dict[int, dict[int, tuple[float, int]]] = {}  # cohort size → K → (cohort seconds per round, steps)
    print(
        f"{args.method}, {what}: {len(y)} examples, 1 epoch, batch {BATCH}, device {args.device}, "
        f"{torch.get_num_threads()} threads (per-client runner: 1), cohorts of {args.cohort_size}, "
        f"{args.repeats} alternating repeats, medians"
    )
    for k in args.clients:
        bounds = torch.linspace(0, len(y), k + 1).round().long().tolist()
        source = TensorClients(model, X, y, {c: (bounds[c], bounds[c + 1]) for c in range(k)}, device=args.device)
        algorithm = algorithm_factory(args.method, HPARAMS[args.method], model, source.sizes)()
        clients = {c: source(c) for c in range(k)}
        theta0 = model.initial_params(torch.Generator().manual_seed(0)).to(args.device, dtype)
        server = algorithm.init_server(theta0)
        runners: dict[str, LocalClients] = {"per-client": LocalClients(algorithm, clients, seed=0)}
        for size in args.cohort_size:
            runners[f"cohort-{size}"] = CohortClients(algorithm, clients, 0, size, single_thread=single)
        message = algorithm.broadcast(server)
        chosen = sorted(clients)
        for runner in runners.values():  # warm-up: a whole round, so that every kernel variant is compiled
            runner.start(server)
            runner.train(1, message, chosen)
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.repeats):
            for name, runner in runners.items():
                runner.start(server)  # every repeat from the same client states
                _sync(args.device)
                began = time.perf_counter()
                runner.train(1, message, chosen)
                _sync(args.device)
                times[name].append(time.perf_counter() - began)
        per_client = statistics.median(times["per-client"])
        steps = sum(-(-n // BATCH) for n in source.sizes.values())
        flops = step_flops * steps
        print(
            f"K={k:5d}: per-client {per_client:7.3f} s per round, {steps} local steps, "
            f"{per_client / steps * 1e3:.3f} ms per step"
        )
        for size in args.cohort_size:
            cohort = statistics.median(times[f"cohort-{size}"])
            step_cohort = cohort / steps
            overhead = (per_client - steps * step_cohort) / k / step_cohort
            gflops = _bmm_gflops(min(k, size), args.device, dtype)
            print(
                f"    cohorts of {size:4d}: {cohort:7.3f} s per round, ratio per-client/cohort "
                f"{per_client / cohort:5.2f}, {step_cohort * 1e3:.3f} ms per step; per-client runner's overhead "
                f"{overhead:.2f} cohort steps per client; bmm {gflops:.1f} GFLOP/s, round / its arithmetic at that "
                f"rate {cohort / (flops / gflops / 1e9):.2f}"
            )
            per_step.setdefault(size, {})[k] = (cohort, steps)
    for size, rounds in per_step.items():
        if len(rounds) < 2:
            continue
        base_k = min(rounds)
        base = rounds[base_k][0] / rounds[base_k][1]
        print(f"scale (cohorts of {size}): overhead per client beyond its local steps, against K={base_k}")
        for k, (seconds, steps) in sorted(rounds.items()):
            overhead = (seconds / steps - base) * steps / k / base
            print(f"  K={k:5d}: {seconds / steps * 1e3:.3f} ms per local step, {overhead:+.2f} local steps per client")


if __name__ == "__main__":
    main()
