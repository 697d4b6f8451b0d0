"""Cost of FedLap-Func's server step (function_space.minimize_server): Adam on the memory loss plus weight-space terms.

    python benchmarks/fedlap_server.py [--steps 300] [--repeats 8] [--memory 95] [--threads 1]

The FashionMNIST MLP (d = 178,110) with M memory points (95 ≈ the heterog10 runs' memory: 10 clients × the classes
each holds). Two forms are timed alternately in this one run, ms per Adam step and their median ratio over
neighbouring timings:
* the library's: autograd through the memory loss only, the weight-space gradient δ(w − Σ_k v_k) added analytically,
  torch's fused Adam;
* the previous form, kept here as the reference point: autograd through the whole objective
  Σ_i τ_i ℓ(ŷ_i, w) − δ(Σ_k v_k)ᵀw + ½δ‖w‖² with torch.optim.Adam's default (single-tensor) implementation.
The paper's FashionMNIST setting runs 5000 of these steps every round, the largest part of a FedLap-Func round.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bayesadmm.algorithms.function_space import Memory, minimize_server, soft_label_loss
from bayesadmm.likelihoods import Classification
from bayesadmm.models import mlp


def previous_form(model, likelihood, start, dual_sum, delta, memory, iterations, lr):
    w = torch.nn.Parameter(start.detach().clone())
    optimizer = torch.optim.Adam([w], lr=lr)
    for _ in range(iterations):
        optimizer.zero_grad(set_to_none=True)
        objective = 0.5 * delta * w.square().sum() - delta * (dual_sum @ w) + soft_label_loss(model, likelihood, w, memory)
        objective.backward()
        optimizer.step()
    return w.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--memory", type=int, default=95)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = mlp()
    g = torch.Generator().manual_seed(0)
    start = model.initial_params(g)
    dual_sum = start + 0.01 * torch.randn(model.dim, generator=g)
    memory = Memory(torch.rand(args.memory, 784, generator=g) * 255,                 # raw pixels, as the presets
                    torch.softmax(torch.randn(args.memory, 10, generator=g), -1),
                    torch.full((args.memory,), 6e-3))
    forms = {"library": minimize_server, "previous": previous_form}
    for form in forms.values():                                                      # warm-up
        form(model, Classification(), start, dual_sum, 0.01, memory, 20, 1e-3)
    times = {name: [] for name in forms}
    for _ in range(args.repeats):
        for name, form in forms.items():
            t0 = time.perf_counter()
            form(model, Classification(), start, dual_sum, 0.01, memory, args.steps, 1e-3)
            times[name].append((time.perf_counter() - t0) / args.steps * 1e3)
    ratio = statistics.median(p / q for p, q in zip(times["previous"], times["library"], strict=True))
    print(f"FedLap-Func server step, MLP d={model.dim}, {args.memory} memory points, {args.threads} thread(s)")
    for name, values in times.items():
        print(f"  {name:9s} {statistics.median(values):.2f} ms/step (median of {args.repeats})")
    print(f"  previous/library: {ratio:.2f}x (median of neighbouring ratios)")


if __name__ == "__main__":
    main()
