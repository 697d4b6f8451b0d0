"""The engine's client runners side by side on a scenario: per-client or cohort training, in one process or in a pool
of workers, timed alternately in one process (what decides `cohort`'s default).

    python benchmarks/runners.py [--scenario fmnist-heterog10] [--method fedavg] [--workers 1 2] [--cohort 1 64]
                                 [--repeats 5] [KEY=VALUE ...]

For each (workers, cohort) pair a runner is made as `bayesadmm run ... workers=W cohort=C` makes it
(`engine.pool.client_runner`; cohort 1: one client at a time) and started from the same initial server state;
round 1 is trained once by each (kernel compilation, worker start-up). Then each repetition trains one round of
every runner from the same broadcast, in turn (the order rotates per repetition), so that neighbouring measurements
see the same machine. Printed: each runner's median seconds per round, and its speed-up over the first runner.
KEY=VALUE: the scenario's settings, as on `bayesadmm run` (e.g. epochs=2), given before the options.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bayesadmm.engine.cohort import CohortClients
from bayesadmm.engine.federation import participants
from bayesadmm.engine.pool import client_runner
from bayesadmm.experiments.build import build
from bayesadmm.experiments.config import resolve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="fmnist-heterog10")
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cohort", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threaded", action="store_true", help="also each cohort size in this process on all torch threads"
    )
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE settings of the scenario")
    args = parser.parse_args()
    config, _ = resolve(args.scenario, [f"method={args.method}", *args.overrides])
    federation = build(config).federation
    algorithm = federation.make_algorithm()
    server = algorithm.init_server(federation.theta0.to(config.device))
    chosen = participants(sorted(federation.clients.sizes), config.participation, config.seed, 1)
    message = algorithm.broadcast(server)
    runners = {}
    try:
        for workers in args.workers:
            for cohort in args.cohort:
                name = f"workers={workers} cohort={cohort}"
                size = cohort if cohort > 1 else 0  # (client_runner's 0: one client at a time)
                runner = client_runner(
                    federation.make_algorithm, federation.clients, config.seed, workers, algorithm, size
                )
                runners[name] = runner
        if args.threaded:
            for cohort in (c for c in args.cohort if c > 1):
                name = f"threads={torch.get_num_threads()} cohort={cohort}"
                clients = {k: federation.clients(k) for k in sorted(federation.clients.sizes)}
                runners[name] = CohortClients(algorithm, clients, config.seed, cohort, single_thread=False)
        for name, runner in runners.items():
            runner.start(server)
            began = time.perf_counter()
            runner.train(1, message, chosen)
            print(f"{name:24s} ({type(runner).__name__}): round 1 {time.perf_counter() - began:.2f} s", flush=True)
        times: dict[str, list[float]] = {name: [] for name in runners}
        names = list(runners)
        for repeat in range(args.repeats):
            for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
                began = time.perf_counter()
                runners[name].train(1, message, chosen)
                times[name].append(time.perf_counter() - began)
            print(f"repetition {repeat + 1}/{args.repeats} done", flush=True)
    finally:
        for runner in runners.values():
            runner.close()
    print(
        f"{args.scenario}, {args.method}, {len(chosen)} clients, {torch.get_num_threads()} torch threads in this "
        f"process, {args.repeats} alternating repetitions, medians:"
    )
    first = statistics.median(times[names[0]])
    for name in names:
        median = statistics.median(times[name])
        print(f"  {name:24s} {median:7.3f} s per round   speed-up over {names[0]}: {first / median:5.2f}")


if __name__ == "__main__":
    main()
