"""Time per round against the machine's arithmetic limit, with 1 and N client workers (issue #6).

    python benchmarks/engine.py                     # FedAvg, FedDyn, IVON-ADMM on fmnist-heterog10 and -heterog100
    python benchmarks/engine.py --scaling           # 10, 100, 1000 clients over the same data (one local epoch)
    python benchmarks/engine.py --scenarios fmnist-heterog10 --methods ivon-admm --workers 1,2 --rounds 3
    python benchmarks/engine.py --scenarios fmnist-heterog10 --methods feddyn,ivon-admm --interleave --rounds 23

`--interleave` compares the methods' time per round (issue #5's "IVON-ADMM within 1.3x of FedDyn") on a VM whose
speed drifts by tens of percent within minutes: all methods of a scenario run in one process, their rounds alternating
(A B, then B A, ...), so that neighbouring rounds see the same machine; it prints each method's median round and, per
round, its time over the first method's in that round, with the median of those ratios. Rounds 1-3 are not timed
(compilation, heap growth), as below.

Each (scenario, method, clients, workers) cell runs in a fresh process (so that its peak memory is its own): it builds
the run as `bayesadmm run` does but trains one client at a time (`cohort=1`; `benchmarks/cohort.py` and
`benchmarks/runners.py` time the cohorts), runs `--rounds` rounds of client updates and server update (no evaluation)
and reports the mean time of the rounds after the first three (all but the last if there are fewer): round 1 compiles
IVON's kernels in each process, and in rounds 2 and 3 the processes' heaps still grow (the states, replies and stored
replies of successive rounds are alive at once), paying page faults that cost as much as the training and that a long
run pays once (1000 IVON-ADMM clients: 1.4, 0.7 and 0.17 million page faults in the parent with 2 workers, then ~0).
It then times one checkpoint as `bayesadmm run` writes it (`ckpt s`: the client states, by the workers in
parallel, and the server state; in a temporary directory under the current one, deleted after).

The limit: a round's arithmetic is counted as 6·B·P floating-point operations per local step and MC sample (forward
2·B·P, backward 4·B·P, for minibatch size B and P weights in matrix multiplications; biases and elementwise work are
left out, so the limit is optimistic), summed over the clients' steps. The matrix-multiply throughput is measured in
the same run on one thread (2048 × 2048 float32 products); the limit with N workers is flops / (N × throughput).
`ratio` = measured time / limit: 1 would be a round that is nothing but large matrix products on every core.
`r/round`: the same ratio per timed round, with the throughput measured again right after that round (best of 3
products, workers idle), and the median over the rounds: a virtual machine's speed can drift by tens of percent within
minutes, and the per-round limit drifts
with it, so this column is the one to compare across runs.
With more than one worker count, each speed-up is printed beside what the machine leaves room for: workers × balance /
contention (an estimate: both timings can vary by ±15 % from run to run on a shared machine). `balance` is how
evenly the pool's static assignment spreads the round's local steps (total / (workers × the busiest worker's
steps); unequal clients cannot always be split evenly). `contention` is measured in the same run: the
largest client's update timed in one process alone, then in as many processes at once as there are workers (the same
update in each); the ratio is what the machine's shared caches and memory bandwidth take from each worker, which no
scheduling of ours can win back.
`state MB`: the size of that checkpoint on disk (server and client states). `peak MB`: the peak resident memory of the
process plus that of each worker (each counts the shared training set).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

import torch


def matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    """Single-thread float32 matrix-multiply throughput (best of `repeats`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        a @ b
        best = math.inf
        for _ in range(repeats):
            began = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - began)
    finally:
        torch.set_num_threads(threads)
    return 2 * size**3 / best / 1e9


def matmul_weights(model) -> int:
    """The number of weights that sit in matrix multiplications (2-D and higher parameters of the template)."""
    return sum(p.numel() for p in model.module.parameters() if p.dim() >= 2)


def peak_mb(pid: int) -> float:
    """A live process's peak resident memory in MB (Linux: VmHWM in /proc/<pid>/status)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_cell(scenario: str, method: str, workers: int, rounds: int, overrides: list[str]) -> dict:
    """Run one cell in this process and return its measurements."""
    import shutil
    import tempfile
    from pathlib import Path

    from bayesadmm.engine.checkpoint import save_checkpoint
    from bayesadmm.engine.federation import participants
    from bayesadmm.engine.policy import assign
    from bayesadmm.engine.pool import client_runner
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import resolve

    config, _ = resolve(scenario, [f"method={method}", f"workers={workers}", f"rounds={rounds}", *overrides])
    federation = build(config).federation
    algorithm = federation.make_algorithm()
    sizes = federation.clients.sizes
    ids = sorted(sizes)
    batch = int(config.hparams.get("batch_size", 32))
    epochs = int(config.hparams.get("epochs", 1))
    samples = int(config.hparams.get("mc_samples", 1))
    client_steps = {k: epochs * math.ceil(n / batch) for k, n in sizes.items()}
    steps = sum(client_steps.values())
    # how evenly the pool's static assignment spreads the steps: total / (workers × the busiest worker's steps)
    groups = assign(sizes, workers)
    balance = steps / (len(groups) * max(sum(client_steps[k] for k in group) for group in groups))
    flops = 6 * batch * matmul_weights(federation.model) * steps * samples

    server = algorithm.init_server(federation.theta0.to(config.device))
    clients = client_runner(federation.make_algorithm, federation.clients, config.seed, workers, algorithm)
    times, round_gflops = [], []
    try:
        clients.start(server)
        for round_ in range(1, rounds + 1):
            began = time.perf_counter()
            chosen = participants(ids, config.participation, config.seed, round_)
            replies = clients.train(round_, algorithm.broadcast(server), chosen)
            server, _ = algorithm.server_update(server, replies)
            times.append(time.perf_counter() - began)
            # the machine's speed right after this round (workers idle), for a limit that drifts with it
            round_gflops.append(matmul_gflops(repeats=3))
        folder = Path(tempfile.mkdtemp(prefix="bench-checkpoint-", dir="."))
        try:
            began = time.perf_counter()
            save_checkpoint(folder / "checkpoint.pt", rounds, server, clients, {})
            checkpoint_seconds = time.perf_counter() - began
            # the state's size as saved (server + every client's state, from the workers' shards)
            state_mb = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
        finally:
            shutil.rmtree(folder)
        peak_parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024      # MB (Linux reports KB)
        peak_workers = [peak_mb(process.pid) for process in getattr(clients, "processes", [])]
    finally:
        clients.close()
    timed = times[3:] or times[-1:]   # steady state (see the module docstring)
    first = len(times) - len(timed)
    # each timed round against the limit at the throughput measured right after it; the median of those ratios
    ratios = [t * workers * g * 1e9 / flops for t, g in zip(timed, round_gflops[first:], strict=True)]
    return {"scenario": scenario, "method": method, "clients": config.clients, "workers": workers,
            "seconds_per_round": sum(timed) / len(timed), "rounds_timed": len(timed), "round_seconds": times,
            "round_gflops": round_gflops, "round_ratios": ratios, "median_round_ratio": statistics.median(ratios),
            "checkpoint_seconds": checkpoint_seconds, "local_steps": steps, "balance": balance,
            "gflop_per_round": flops / 1e9, "state_mb": state_mb,
            "peak_mb_parent": peak_parent, "peak_mb_workers": peak_workers}


def client_cell(scenario: str, method: str, overrides: list[str], min_seconds: float = 2.0) -> dict:
    """Time the largest client's update alone in this process (after one untimed warm-up that compiles the kernels):
    repeated until `min_seconds` have passed (at least 3 times); returns the median."""
    from bayesadmm.engine.runners import train_client
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import resolve

    config, _ = resolve(scenario, [f"method={method}", "workers=1", *overrides])
    federation = build(config).federation
    algorithm = federation.make_algorithm()
    server = algorithm.init_server(federation.theta0.to(config.device))
    message = algorithm.broadcast(server)
    sizes = federation.clients.sizes
    largest = max(sizes, key=lambda k: (sizes[k], -k))
    state = algorithm.init_client(server, largest)
    data = federation.clients(largest)
    train_client(algorithm, state, message, data, config.seed, 1, largest)
    times: list[float] = []
    while len(times) < 3 or sum(times) < min_seconds:
        began = time.perf_counter()
        train_client(algorithm, state, message, data, config.seed, 1, largest)   # the same update each time
        times.append(time.perf_counter() - began)
    return {"median_seconds": sorted(times)[len(times) // 2], "repeats": len(times)}


def contention(scenario: str, method: str, copies: int, overrides: list[str]) -> float:
    """How much slower one client update runs when `copies` processes run it at the same moment than when it runs
    alone: the machine's own limit on the workers' speed-up (shared caches and memory bandwidth), whatever our code
    does. Each process times the same update of the scenario's largest client; factor = mean concurrent median /
    the lone median."""
    command = [sys.executable, __file__, "--client-cell", scenario, method, *overrides]

    def finish(process) -> float:
        out, err = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"client cell {scenario} {method} failed:\n{err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1])["median_seconds"]

    alone = finish(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    together = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(copies)]
    return sum(finish(p) for p in together) / copies / alone


def run_cell(scenario: str, method: str, workers: int, rounds: int, overrides: list[str]) -> dict:
    """One cell in a fresh process (clean peak-memory counters, no state shared with other cells)."""
    command = [sys.executable, __file__, "--cell", scenario, method, str(workers), str(rounds), *overrides]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"cell {scenario} {method} workers={workers} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def interleaved_cell(scenario: str, methods: list[str], workers: int, rounds: int, overrides: list[str]) -> dict:
    """The methods' rounds alternating in this process (A B, B A, A B, ...); returns each method's round times."""
    from bayesadmm.engine.federation import participants
    from bayesadmm.engine.pool import client_runner
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import resolve

    runs = {}
    try:
        for method in methods:
            config, _ = resolve(scenario, [f"method={method}", f"workers={workers}", f"rounds={rounds}", *overrides])
            federation = build(config).federation
            algorithm = federation.make_algorithm()
            clients = client_runner(federation.make_algorithm, federation.clients, config.seed, workers, algorithm)
            server = algorithm.init_server(federation.theta0.to(config.device))
            runs[method] = [config, algorithm, clients, server]
            clients.start(server)
        times: dict[str, list[float]] = {method: [] for method in methods}
        for round_ in range(1, rounds + 1):
            for method in (methods if round_ % 2 else methods[::-1]):
                config, algorithm, clients, server = runs[method]
                began = time.perf_counter()
                chosen = participants(list(range(config.clients)), config.participation, config.seed, round_)
                replies = clients.train(round_, algorithm.broadcast(server), chosen)
                runs[method][3], _ = algorithm.server_update(server, replies)
                times[method].append(time.perf_counter() - began)
    finally:
        for _config, _algorithm, clients, _server in runs.values():
            clients.close()
    return {"scenario": scenario, "workers": workers, "methods": methods, "round_seconds": times}


def print_interleaved(result: dict) -> None:
    """Median round per method and each method's per-round ratio to the first method (rounds after the third)."""
    times = {method: seconds[3:] or seconds[-1:] for method, seconds in result["round_seconds"].items()}
    reference, *others = result["methods"]
    print(f"{result['scenario']}, {result['workers']} worker(s), rounds alternating, {len(times[reference])} timed:")
    for method, seconds in times.items():
        print(f"  {method:<10} median {statistics.median(seconds):.2f} s/round "
              f"(min {min(seconds):.2f}, max {max(seconds):.2f})")
    for method in others:
        ratios = [a / b for a, b in zip(times[method], times[reference], strict=True)]
        print(f"  {method}/{reference} per round: {' '.join(f'{r:.2f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.2f}x", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="fmnist-heterog10,fmnist-heterog100")
    parser.add_argument("--methods", default="fedavg,feddyn,ivon-admm")
    parser.add_argument("--workers", default=None, help="comma-separated worker counts (default: 1 and the cores)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per cell; the first three are not timed")
    parser.add_argument("--scaling", action="store_true",
                        help="10, 100 and 1000 clients over the full training set (iid, one local epoch)")
    parser.add_argument("--clients", default="10,100,1000", help="with --scaling: comma-separated client counts")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every cell")
    parser.add_argument("--interleave", action="store_true",
                        help="the methods of a scenario in one process, rounds alternating; prints ratios")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--cell", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--client-cell", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--interleave-cell", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.interleave_cell:
        scenario, methods, workers, rounds, *overrides = args.interleave_cell
        print(json.dumps(interleaved_cell(scenario, methods.split(","), int(workers), int(rounds), overrides)))
        return 0

    if args.client_cell:
        scenario, method, *overrides = args.client_cell
        print(json.dumps(client_cell(scenario, method, overrides)))
        return 0
    if args.cell:
        scenario, method, workers, rounds, *overrides = args.cell
        print(json.dumps(one_cell(scenario, method, int(workers), int(rounds), overrides)))
        return 0

    from bayesadmm.engine.policy import default_workers
    cores = default_workers()
    workers = [int(w) for w in (args.workers or f"1,{cores}").split(",")]
    gflops = matmul_gflops()
    print(f"matrix-multiply throughput: {gflops:.1f} GFLOP/s on one thread (2048² float32); {cores} cores",
          flush=True)
    if args.interleave:
        if args.scaling or len(args.methods.split(",")) < 2:
            parser.error("--interleave compares two or more --methods (and not with --scaling)")
        results = []
        for scenario in args.scenarios.split(","):
            for w in workers:
                command = [sys.executable, __file__, "--interleave-cell", scenario, args.methods, str(w),
                           str(args.rounds), *args.set]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"interleaved {scenario} workers={w} failed:\n{done.stderr[-3000:]}")
                results.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print_interleaved(results[-1])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return 0
    if args.scaling:
        cells = [("fmnist-heterog100", m, w, [f"clients={c}", "partition=iid", "epochs=1", *args.set])
                 for c in map(int, args.clients.split(",")) for m in args.methods.split(",") for w in workers]
    else:
        cells = [(s, m, w, list(args.set)) for s in args.scenarios.split(",") for m in args.methods.split(",")
                 for w in workers]
    header = (f"{'scenario':<18} {'method':<10} {'clients':>7} {'workers':>7} {'s/round':>8} {'steps':>7} "
              f"{'GFLOP':>7} {'limit s':>8} {'ratio':>6} {'state MB':>9} {'peak MB':>8} {'ckpt s':>7}")
    print(header, flush=True)
    rows = []
    overrides_of = {}
    for scenario, method, w, overrides in cells:
        row = run_cell(scenario, method, w, args.rounds, overrides)
        overrides_of[(scenario, method, row["clients"])] = overrides
        row["limit_seconds"] = row["gflop_per_round"] / (w * gflops)
        row["ratio"] = row["seconds_per_round"] / row["limit_seconds"]
        row["matmul_gflops"] = gflops
        rows.append(row)
        peak = row["peak_mb_parent"] + sum(row["peak_mb_workers"])
        print(f"{scenario:<18} {method:<10} {row['clients']:>7} {w:>7} {row['seconds_per_round']:>8.2f} "
              f"{row['local_steps']:>7} {row['gflop_per_round']:>7.1f} {row['limit_seconds']:>8.3f} "
              f"{row['ratio']:>6.1f} {row['median_round_ratio']:>8.1f} {row['state_mb']:>9.1f} {peak:>8.0f} "
              f"{row['checkpoint_seconds']:>7.2f}",
              flush=True)
    by_key = {(r["scenario"], r["method"], r["clients"], r["workers"]): r for r in rows}
    if len(workers) > 1:
        print("\nspeed-up of the most workers over one:")
        for (scenario, method, clients, w), row in by_key.items():
            if w == max(workers) and (scenario, method, clients, 1) in by_key:
                one = by_key[(scenario, method, clients, 1)]
                factor = contention(scenario, method, w, overrides_of[(scenario, method, clients)])
                expected = w * row["balance"] / factor
                print(f"  {scenario} {method} clients={clients}: "
                      f"{one['seconds_per_round'] / row['seconds_per_round']:.2f}x with {w} workers "
                      f"(machine: one client update runs {factor:.2f}x slower while {w} run at once; with the step "
                      f"balance {row['balance']:.3f} that leaves ~{expected:.2f}x)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
