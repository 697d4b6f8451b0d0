"""Cross-device scale: seconds per round, peak memory and bytes on disk as the federation grows at a fixed number of
participants per round.

    python benchmarks/scale.py [--cases fmnist-xdevice:ivon-admm:100 logreg-100k:fedavg:1000 ...]
                               [--clients 1000 10000 100000] [--rounds 4] [--out /tmp/bayesadmm-scale]
                               [--flower-repetitions 2]

Each case is SCENARIO:METHOD:PARTICIPANTS; for every number of clients K it runs the scenario with `clients=K`,
`participation=PARTICIPANTS/K` (the same clients per round at every K) and `data_fraction=K/K_scenario` (K_scenario:
the scenario's own clients, 10,000 or 100,000), so that a client holds as many examples at every K and a round the
same work: what grows with K is only the federation around the participants. `rounds` rounds in one worker, the
client store chosen by the engine (`client_store=auto`: on disk above 2,000 clients whose states hold tensors), each
run in a fresh child process. Printed per run: the median seconds per round after the first (wall time between the
ends of consecutive rounds: training, server update, evaluation and any checkpoint), the peak resident memory of
the child (`resource.getrusage`, max RSS), and the bytes the run directory holds at the end (its client-state
blocks included). A K above the scenario's own is skipped (fmnist-xdevice's 60,000 images cover 10,000 clients of
6 examples on average). The ratio column is each K's seconds per round over the smallest K's of the same case.

Then, against the standard Flower simulation (Ray backend): `benchmarks/flower_scale.py` with FedAvg at 10³ clients,
100 per round, bayesadmm with 2 workers, `--flower-repetitions` times each, alternately (0: skipped), in a child
process; it prints both sides' seconds per round and their ratio. The exit status is 1 where a run failed (its line
says why), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_CASES = ["fmnist-xdevice:ivon-admm:100", "logreg-100k:fedavg:1000", "logreg-100k:ivon-admm:1000"]
SCENARIO_CLIENTS = {"fmnist-xdevice": 10_000, "logreg-100k": 100_000}  # the presets' clients


def child(scenario: str, method: str, clients: int, participants: int, rounds: int, out: str) -> None:
    """One run, in this (child) process; prints one JSON line: seconds per round and peak RSS."""
    from bayesadmm.experiments.build import run
    from bayesadmm.experiments.config import resolve

    fraction = clients / SCENARIO_CLIENTS[scenario]
    overrides = [f"method={method}", f"clients={clients}", f"participation={participants / clients!r}",
                 f"data_fraction={fraction!r}", f"rounds={rounds}", "workers=1", f"out={out}",
                 "eval_samples=4"]  # fmt: skip
    config, _ = resolve(scenario, overrides)
    ends: list[float] = []
    result = run(config, progress=False, on_round=lambda line: ends.append(time.perf_counter()), overwrite=True)
    walls = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    print(json.dumps({"status": result.status, "seconds": statistics.median(walls), "peak_rss": peak}))


def disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=DEFAULT_CASES)
    parser.add_argument("--clients", nargs="+", type=int, default=[1000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default="/tmp/bayesadmm-scale")
    parser.add_argument("--flower-repetitions", type=int, default=2, help="0: no Flower comparison")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        scenario, method, clients, participants, rounds, out = args.child
        child(scenario, method, int(clients), int(participants), int(rounds), out)
        return 0
    failed = False
    print(f"{'case':34} {'clients':>8} {'s/round':>8} {'ratio':>6} {'peak RSS':>9} {'on disk':>9}")
    for case in args.cases:
        scenario, method, participants = case.split(":")
        base = None
        for clients in args.clients:
            if clients > SCENARIO_CLIENTS[scenario]:
                print(f"{case:34} {clients:>8} (skipped: more clients than the scenario's)")
                continue
            out = Path(args.out) / f"{scenario}-{method}-{clients}"
            command = [sys.executable, __file__, "--child", scenario, method, str(clients), participants,
                       str(args.rounds), str(out)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, env=os.environ, check=False)
            if done.returncode != 0:
                print(f"{case:34} {clients:>8} failed: {done.stderr.strip().splitlines()[-1:]}")
                failed = True
                continue
            line = json.loads(done.stdout.strip().splitlines()[-1])
            base = base or line["seconds"]
            print(f"{case:34} {clients:>8} {line['seconds']:>8.2f} {line['seconds'] / base:>6.2f} "
                  f"{line['peak_rss'] / 2**30:>7.2f} GB {disk_bytes(out) / 2**30:>6.2f} GB", flush=True)  # fmt: skip
    if args.flower_repetitions > 0:
        print("\nagainst the standard Flower simulation:", flush=True)
        options = f"--clients 1000 --participants 100 --repetitions {args.flower_repetitions} --bayesadmm workers=2"
        script = str(Path(__file__).with_name("flower_scale.py"))
        flower = subprocess.run([sys.executable, script, *options.split()], env=os.environ, check=False)
        failed = failed or flower.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
