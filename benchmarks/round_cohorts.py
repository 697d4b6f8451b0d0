"""A round of a cross-device federation trained in cohorts, by how its participants are grouped: FedAvg's client
updates of `--participants` of `fmnist-xdevice`'s clients cut to `--clients` (a matching share of its images, ~6 per
client: the federation of `benchmarks/flower_scale.py`), on one thread, alternately, seconds per round.

    python benchmarks/round_cohorts.py [--clients 1000] [--participants 100] [--repeats 8] [--sizes 1 4 5 8 16]

For each cohort size n two groupings of the same rounds' participants (`engine.cohort.CohortClients`): "fixed",
cohorts of n clients fixed for the run (`policy.fixed_cohorts`, what the engine does at full participation), of which
a round trains each cohort's participants together; and "round", blocks of about n / participation clients of
similar sizes (`policy.cohort_blocks`), of which a round trains the participants in cohorts of at most n
(`policy.round_cohorts`). Printed per grouping: the cohorts of the first round, their mean number of clients, the
rows a step computes over the clients' examples (padding: clients of a cohort of different sizes), and the median
seconds of rounds 2.. (round 1 is warm-up).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bayesadmm.engine.cohort import CohortClients, cohort_rows
from bayesadmm.engine.federation import participants
from bayesadmm.experiments.build import build
from bayesadmm.experiments.config import resolve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--participants", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 5, 8, 16])
    args = parser.parse_args()
    torch.set_num_threads(1)
    fraction = args.participants / args.clients
    config, _ = resolve(
        "fmnist-xdevice", ["method=fedavg", f"clients={args.clients}", f"data_fraction={args.clients / 10_000!r}"]
    )
    federation = build(config).federation
    algorithm = federation.make_algorithm()
    source = federation.clients
    clients = {k: source(k) for k in sorted(source.sizes)}
    rows = cohort_rows(algorithm, clients, source)
    server = algorithm.init_server(federation.theta0)
    message = algorithm.broadcast(server)
    runners = {}
    for size in args.sizes:
        for grouping, participation in (("fixed", 1.0), ("round", fraction)):
            runner = CohortClients(algorithm, clients, config.seed, size, rows, participation=participation)
            runner.start(server)
            runners[f"{grouping} {size}"] = runner
    ids = sorted(clients)
    print(f"fmnist-xdevice, fedavg {dict(config.hparams)}: {args.participants} of {args.clients} clients a round, "
          f"torch {torch.__version__}, 1 thread, {args.repeats} rounds alternating (median of rounds 2..)")  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in runners}
    for round_ in range(1, args.repeats + 1):
        chosen = participants(ids, fraction, config.seed, round_)
        for name, runner in runners.items():
            began = time.perf_counter()
            runner.train(round_, message, chosen)
            times[name].append(time.perf_counter() - began)
    chosen = participants(ids, fraction, config.seed, 1)
    examples = sum(clients[k].num_examples for k in chosen)
    print("| grouping, cohort size | cohorts | clients a cohort | rows / examples | s/round |")
    print("|---|---|---|---|---|")
    for name, runner in runners.items():
        units = runner.units(chosen)
        padded = sum(len(unit) * max(clients[k].num_examples for k in unit) for unit in units)
        print(f"| {name} | {len(units)} | {len(chosen) / len(units):.1f} | {padded / examples:.2f} "
              f"| {statistics.median(times[name][1:]):.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
