"""Per-call overheads on the hot path that are not arithmetic (issue #6 item 1), each timed beside its alternative.

    python benchmarks/overheads.py [--calls 300] [--repeats 9] [--no-aot]

* the papers' MLP (784-200-100-10, batch 32) forward pass, and forward + backward, through `FlatModel.forward` (the
  plan of plain MLPs) against the same model through `torch.func.functional_call` (the general route);
* one call of IVON's fused update-and-sample kernel on 8 parameters, where the arithmetic is nothing and the time is
  the call: through `kernels.update_and_sample_step_` (torch.compile), and (unless --no-aot) through
  `torch.compile(...).aot_compile` with its guard check switched off, an alternative not adopted (it compiles on
  every process start; the seconds it took are printed) — its outputs are compared with the library's;
* a BayesADMM client's dual step and reply on the MLP's natural parameters (2 x 178,110 numbers; issue #6 item 4,
  where 1000 clients of 2 steps each spend as long on such per-client work as on their steps): as the library
  computes them (`nat.add_scaled`, one new tensor per component and operation) against the pairwise form
  `add(a, scale(b, c))` they replaced (two); their results are compared bit for bit.
Timings alternate between the two of each pair (median ms per call over the repeats), one thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.func import functional_call
from torch.nn import functional as F

from bayesadmm import rng
from bayesadmm.algorithms.bayes_admm import client_contribution, natural_dual_step
from bayesadmm.families import natural as nat
from bayesadmm.models import mlp
from bayesadmm.optim import kernels


def _alternate(fns: dict, calls: int, repeats: int) -> dict[str, float]:
    for f in fns.values():           # warm-up (and compilation)
        for _ in range(20):
            f()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, f in fns.items():
            began = time.perf_counter()
            for _ in range(calls):
                f()
            times[name].append((time.perf_counter() - began) / calls * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--no-aot", action="store_true", help="skip the aot_compile alternative (~20 s to compile)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, 1 thread, {args.calls} calls x "
          f"{args.repeats} repeats, alternating (median ms per call)")

    model = mlp()
    theta = model.initial_params(torch.Generator().manual_seed(0)).requires_grad_(True)
    x, y = torch.rand(32, 784) * 255, torch.randint(0, 10, (32,))

    def general(t, X):
        return functional_call(model.module, model.unflatten(t), (X,))

    def step(forward):
        return lambda: torch.autograd.grad(F.cross_entropy(forward(theta, x), y), theta)

    assert torch.equal(model.forward(theta, x), general(theta, x))
    rows = _alternate({"forward, MLP plan": lambda: model.forward(theta.detach(), x),
                       "forward, functional_call": lambda: general(theta.detach(), x),
                       "forward + backward, MLP plan": step(model.forward),
                       "forward + backward, functional_call": step(general)}, args.calls, args.repeats)

    d = 8
    vec = lambda: torch.rand(d)   # noqa: E731
    scalar = torch.tensor
    kernel_args = (vec(), vec() + 1, vec(), vec().unsqueeze(0), vec().unsqueeze(0), vec(), vec(), vec(), vec(),
                   scalar(1e-3), scalar(6000.0), scalar(0.9), scalar(0.9998), scalar(1.0), scalar(float("inf")),
                   rng.block_key(torch.tensor(1), 0), 1)
    calls = {"IVON kernel call on 8 parameters, torch.compile (library)":
             lambda: kernels.update_and_sample_step_(*kernel_args)}   # (writes into its first three inputs)
    note = ""
    if not args.no_aot:
        began = time.perf_counter()
        precompiled = torch.compile(kernels.update_and_sample_step_.eager, dynamic=True,
                                    fullgraph=True).aot_compile((kernel_args, {}))
        seconds = time.perf_counter() - began
        precompiled.disable_guard_check()
        copies = [[t.clone() if torch.is_tensor(t) else t for t in kernel_args] for _ in range(2)]
        outputs = (precompiled(*copies[0]), kernels.update_and_sample_step_(*copies[1]))
        compiled_out, library_out = (*copies[0][:3], *outputs[0]), (*copies[1][:3], *outputs[1])
        same = all(torch.equal(a, b) for a, b in zip(compiled_out, library_out, strict=True))
        calls["IVON kernel call on 8 parameters, aot_compile without guard check"] = lambda: precompiled(*kernel_args)
        note = f"aot_compile took {seconds:.1f} s; its outputs equal the library kernel's: {same}"
    rows.update(_alternate(calls, args.calls, args.repeats))

    gen = torch.Generator().manual_seed(1)
    pair = lambda: (torch.randn(model.dim, generator=gen), -torch.rand(model.dim, generator=gen))  # noqa: E731
    dual, lam_k, lam_g, gamma = pair(), pair(), pair(), 0.5

    def library():
        new_dual = natural_dual_step(None, dual, lam_k, lam_g, gamma)
        return new_dual, client_contribution(lam_k, new_dual, gamma)

    def pairwise():
        new_dual = nat.add(dual, nat.scale(nat.sub(lam_k, lam_g), gamma))
        return new_dual, nat.add(new_dual, nat.scale(lam_k, gamma))

    same_bits = all(
        torch.equal(a, b) for x, y in zip(library(), pairwise(), strict=True) for a, b in zip(x, y, strict=True)
    )
    rows.update(_alternate({"client dual step + reply, MLP, nat.add_scaled (library)": library,
                            "client dual step + reply, MLP, add(a, scale(b, c))": pairwise},
                           max(args.calls // 10, 10), args.repeats))
    print("| call | ms |")
    print("|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.3f} |")
    if note:
        print(note)
    print(f"dual step + reply: the two forms' results are equal bit for bit: {same_bits}")


if __name__ == "__main__":
    main()
