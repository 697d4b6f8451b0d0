"""The client-level rows of docs/results/privacy.md through Flower: each run of fmnist-heterog10 with FedAvg and
client-level DP as a Flower simulation (`bayesadmm.flower.run_simulation`: Flower's simulation runtime, one virtual
SuperNode per client, the method as the `BayesStrategy`), into runs/privacy-flower, then the table.

    python scripts/privacy_flower.py [--epsilons 1 3 8] [--out runs/privacy-flower] [--rounds 10] [--set KEY=VALUE ...]
    python scripts/privacy_table.py runs/privacy-flower client

`--set` adds settings to every run (e.g. `--rounds 1 --set data_fraction=0.01 epochs=1`: a quick check that the
script runs, as tests/test_benchmarks.py runs it).
"""

import argparse
from pathlib import Path

from bayesadmm.experiments.config import resolve
from bayesadmm.flower.simulation import run_simulation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1, 3, 8])
    parser.add_argument("--out", type=Path, default=Path("runs/privacy-flower"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="settings of every run")
    args = parser.parse_args()
    runs = [(f"fedavg-eps{e:g}", ["dp=client", "dp_clip=7", f"dp_epsilon={e:g}"]) for e in args.epsilons]
    for name, keys in [*runs, ("fedavg-inf", [])]:
        if (args.out / name / "status.json").exists():
            print(f"{name}: done before, kept")
            continue
        settings = [f"rounds={args.rounds}", "method=fedavg", f"out={args.out / name}", *keys, *args.set]
        config, _ = resolve("fmnist-heterog10", settings)
        run_simulation(config, cpus=2)
        print(f"{name}: done")


if __name__ == "__main__":
    main()
