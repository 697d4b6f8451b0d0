"""bayesadmm's engine against a standard Flower simulation (Ray backend) on a cross-device federation: FedAvg on
`fmnist-xdevice` cut to 1,000 clients (a tenth of its images, so each client keeps its examples), 100 of them per
round, alternately, seconds per round.

    python benchmarks/flower_scale.py [--clients 1000] [--participants 100] [--repetitions 1] [--bayesadmm workers=2]

Flower: the peers' standard app (`benchmarks/peers/flower_peer.py`: Flower's FedAvg strategy, a ClientApp training
the same MLP with Adam on its partition, ClientApps on Ray, one CPU each) with `fraction_train` = participants /
clients over that many virtual SuperNodes. bayesadmm: `bayesadmm.run` on the same clients and initial weights
(`benchmarks/peers/compare.py`'s `run_bayesadmm`) with participation = participants / clients. Each prints the
seconds of its rounds (configure_train to the end of aggregate_train; bayesadmm's metrics `seconds`), then the
medians of rounds 2.. and their ratio (the issue's target: Flower ≥ 10× bayesadmm).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))


def scenario(clients: int):
    """fmnist-xdevice with `clients` clients and the matching share of its images, as `bayesadmm run` builds it."""
    from common import Scenario

    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import resolve

    config, _ = resolve(
        "fmnist-xdevice", ["method=fedavg", f"clients={clients}", f"data_fraction={clients / 10_000!r}"]
    )
    federation = build(config).federation
    source = federation.clients
    parts = [
        (source.X[a:b].clone(), source.y[a:b].clone()) for a, b in (source.slices[k] for k in sorted(source.slices))
    ]
    return Scenario("fmnist-xdevice", "fedavg", parts, federation.eval_X, federation.eval_y, federation.theta0.clone(),
                    dict(config.hparams), config.seed, config.rounds)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--participants", type=int, default=100)
    parser.add_argument("--repetitions", type=int, default=1)
    parser.add_argument("--bayesadmm", nargs="*", default=[], help="bayesadmm.run settings as KEY=VALUE (workers=2)")
    args = parser.parse_args()
    from compare import run_bayesadmm
    from flower_peer import run_flower

    built = scenario(args.clients)
    fraction = args.participants / args.clients
    settings = {"participation": fraction, **{k: int(v) for k, v in (kv.split("=") for kv in args.bayesadmm)}}
    print(
        f"fmnist-xdevice, fedavg: {args.clients} clients ({sum(len(y) for _, y in built.clients)} examples), "
        f"{args.participants} per round, hparams {built.hparams}; bayesadmm settings {settings}",
        flush=True,
    )
    found: dict[str, list[float]] = {"bayesadmm": [], "flower": []}
    for repetition in range(args.repetitions):
        for name in ("bayesadmm", "flower"):
            with tempfile.TemporaryDirectory() as folder:
                began = time.perf_counter()
                if name == "bayesadmm":
                    out = run_bayesadmm(built, settings, folder)
                else:
                    out = run_flower(built, folder, fraction=fraction)
            seconds = out["seconds"]
            found[name].append(statistics.median(seconds[1:]))
            print(f"[repetition {repetition + 1}/{args.repetitions}] {name}: rounds "
                  + " ".join(f"{s:.2f}" for s in seconds) + f" s, acc {100 * out['acc']:.2f} % "
                  f"({time.perf_counter() - began:.0f} s in all)", flush=True)  # fmt: skip
    ours, theirs = statistics.median(found["bayesadmm"]), statistics.median(found["flower"])
    print(
        f"\nseconds per round (median of rounds 2.., median over repetitions): bayesadmm {ours:.3f}, "
        f"flower {theirs:.3f}; ratio flower/bayesadmm {theirs / ours:.1f}"
    )


if __name__ == "__main__":
    main()
