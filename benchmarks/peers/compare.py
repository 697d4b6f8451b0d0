"""bayesadmm against two peers on one scenario: a plain PyTorch loop and a standard Flower simulation.

    python benchmarks/peers/compare.py --scenario fmnist-heterog10 --method fedavg --repeats 5
    python benchmarks/peers/compare.py --scenario fmnist-heterog10 --method ivon-admm --repeats 3
    python benchmarks/peers/compare.py --scenario fmnist-heterog100 --method fedavg --repeats 3 --bayesadmm cohort=10
    python benchmarks/peers/compare.py --scenario fmnist-heterog100 --method fedavg --repeats 1 --device cuda --epochs 2

Three contenders, each a 3-round run from the same partition, the same initial weights and the same settings (the
scenario's preset: epochs, batch size, learning rate, all clients every round, the MLP 784-200-100-10), taken in
turn within each repetition (repetition i starts at contender i mod 3: bayesadmm, plain, flower; plain, flower,
bayesadmm; ...), so that a drift in the machine's load falls on all of them:

* bayesadmm: `bayesadmm.run(module, clients, test, algorithm=METHOD, hparams=<preset>, rounds=<scenario's>,
  stop_at=3, seed=<scenario's>, out=<a temporary folder>, ...)` with the module holding the scenario's initial
  weights and the clients' (X_k, y_k) of the scenario's partition. Its time per round is the `seconds` of each
  round's metrics line (client updates and server step; the evaluation is timed apart as eval_seconds and not
  counted). `--bayesadmm KEY=VALUE` passes bayesadmm.run settings (workers, cohort, eval_samples,
  checkpoint_every); default: bayesadmm.run's defaults (workers=1, cohort=0).
* plain: `plain.py`, a hand-written loop: a DataLoader per client, torch.optim.Adam (or IVON), clients one after
  another, default torch threads; timed with time.perf_counter around each round.
* flower: `flower_peer.py`, a standard Flower 1.42 ServerApp/ClientApp with strategy FedAvg on the Ray backend, two
  ClientApps at a time (one CPU each); each round timed inside the strategy (configure_train to aggregate_train).

The runs stop after round 3 but keep the scenario's schedule (50 rounds: IVON-ADMM's cosine step size), as
`bayesadmm run --stop_at 3` does. Round 1 is warm-up (Ray's actors start, compilation); rounds 2-3 are timed.

Printed: a progress line per contender run (its rounds' seconds, accuracy, the machine's 1-minute load average
before and after: the machine is shared, and load slows most the plain loop's two OpenMP threads); then per
contender the median seconds per round over all timed rounds of all repetitions (with the per-repetition medians),
the test accuracy after the last round of each repetition (at the mean; IVON-ADMM also of the posterior predictive,
32 samples), and the ratio to bayesadmm's median (and the median of the per-repetition ratios); then the limit: one
round's arithmetic (2·B·P forward + 2·B·P weight gradients + 2·B·(P − P_first) input gradients per step, B the
minibatch, P = 178,110 weights, P_first = 157,000) at the float32 torch.mm throughput of 2048×2048 matrices on all
threads measured in the same run (before and after the runs; the better of the two), i.e. the least time a round
could take on this machine, and each contender's seconds per round over that limit.
`--plain-threads N` runs the plain loop on N torch threads (default: torch's).

On a GPU (`--device cuda`) all three train there: bayesadmm.run with `device="cuda"` (its automatic GPU cohorts unless
`--bayesadmm cohort=N` says otherwise), the plain loop with the model on the GPU and each minibatch moved there from
its CPU DataLoader, and the Flower simulation with `client_resources = {"num_cpus": 1, "num_gpus": --flower-gpus}`
(0.25: four ClientApps share the GPU at once), as Flower's guides set it. The limit is then the round's arithmetic at
the GPU's float32 torch.mm throughput (no TF32). `--epochs N` replaces the preset's local epochs for every contender
(a shorter round, the same ratios per local step); `--contenders` runs a subset; `--set KEY=VALUE ...` changes the
scenario's settings as on `bayesadmm run` (e.g. `--set data_fraction=0.01` for a quick check that the script runs, as
tests/test_benchmarks.py runs it).

Exit codes: 0 done, 2 a missing dependency (flwr) or a bad argument.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
CONTENDERS = ("bayesadmm", "plain", "flower")
RUN_SETTINGS = {"workers": int, "cohort": int, "eval_samples": int, "checkpoint_every": int}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="fmnist-heterog10", help="a bayesadmm scenario with the MLP")
    parser.add_argument("--method", default="fedavg", choices=("fedavg", "ivon-admm"))
    parser.add_argument("--repeats", type=int, default=5, help="repetitions of the three contenders")
    parser.add_argument("--plain-threads", type=int, default=0, help="torch threads of the plain loop (0: default)")
    parser.add_argument("--device", default="cpu", help="where all three contenders train: cpu or cuda")
    parser.add_argument("--flower-gpus", type=float, default=0.25, help="each ClientApp's num_gpus on a GPU")
    parser.add_argument("--epochs", type=int, default=0, help="local epochs for every contender (0: the preset's)")
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="the scenario's settings")
    parser.add_argument(
        "--bayesadmm",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help=f"bayesadmm.run settings: {', '.join(RUN_SETTINGS)}",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if "bayesadmm" not in args.contenders:
        parser.error("--contenders must include bayesadmm (the ratios are to it)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this machine's torch sees no CUDA device")
    if not 0 < args.flower_gpus <= 1:
        parser.error("--flower-gpus must be in (0, 1]")
    settings = {}
    for item in args.bayesadmm:
        key, sep, value = item.partition("=")
        if not sep or key not in RUN_SETTINGS:
            parser.error(f"--bayesadmm takes KEY=VALUE with KEY one of {', '.join(RUN_SETTINGS)}; got {item!r}")
        try:
            settings[key] = RUN_SETTINGS[key](value)
        except ValueError:
            parser.error(f"--bayesadmm {key} must be {RUN_SETTINGS[key].__name__}, got {value!r}")
    settings["device"] = args.device
    args.settings = settings
    return args


def require_flower() -> None:
    try:
        import flwr  # noqa: F401
        import ray  # noqa: F401
    except ImportError as exc:
        print(f"error: the Flower contender needs flwr with Ray ({exc}); pip install -e '.[flower]'", file=sys.stderr)
        sys.exit(2)


def run_bayesadmm(scenario, settings: dict, folder: str) -> dict:
    """bayesadmm's public API on the scenario's clients and initial weights; seconds from the metrics lines."""
    from common import ROUNDS, mlp_with

    import bayesadmm

    result = bayesadmm.run(
        mlp_with(scenario.theta0),
        scenario.clients,
        (scenario.X_test, scenario.y_test),
        algorithm=scenario.method,
        hparams=scenario.hparams,  # cosine: true spans `rounds`, the scenario's, as `bayesadmm run` does
        rounds=scenario.schedule_rounds,
        stop_at=ROUNDS,
        seed=scenario.seed,
        out=folder,
        progress=False,
        **settings,
    )
    if len(result.history) != ROUNDS:
        raise RuntimeError(
            f"bayesadmm's run ended after {len(result.history)} rounds: {result.status} {result.message}"
        )
    last = result.history[-1]
    out = {"seconds": [line["seconds"] for line in result.history], "acc": last["test_acc"]}
    if "ens_test_acc" in last and scenario.method != "fedavg":
        out["ens_acc"] = last["ens_test_acc"]
    return out


def measure_throughput(matmul_throughput, device: str) -> float:
    """torch.mm's flop/s on `device` (on the CPU, all of the machine's threads; torch's thread count restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or threads)
    try:
        return matmul_throughput(device=device)
    finally:
        torch.set_num_threads(threads)


def fmt_acc(run: dict) -> str:
    text = f"acc {100 * run['acc']:.2f} %"
    return text + (f" (predictive {100 * run['ens_acc']:.2f} %)" if "ens_acc" in run else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "flower" in args.contenders:
        require_flower()
    # the Ray workers of the Flower contender import this folder's modules
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))
    from common import ROUNDS, TIMED, load_scenario, matmul_throughput, median_timed, round_flops
    from flower_peer import run_flower, shutdown_ray
    from local_update import OPTIMIZER
    from plain import run_plain

    began = time.perf_counter()
    scenario = load_scenario(args.scenario, args.method, tuple(args.set))
    if args.epochs:
        scenario.hparams["epochs"] = args.epochs
    contenders = tuple(name for name in CONTENDERS if name in args.contenders)
    sizes = [len(y) for _, y in scenario.clients]
    print(
        f"{args.scenario}, {args.method}: {len(sizes)} clients ({sum(sizes)} examples), hparams {scenario.hparams}, "
        f"seed {scenario.seed}; {ROUNDS} rounds a run (timed: {TIMED}); torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; bayesadmm.run settings {args.settings}"
    )
    if args.device != "cpu":
        print(f"device: {torch.cuda.get_device_name(args.device)}; Flower's num_gpus per ClientApp {args.flower_gpus}")
    if args.method == "ivon-admm":
        print(f"peers' IVON: {OPTIMIZER}")
    throughputs = [measure_throughput(matmul_throughput, args.device)]
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    try:
        with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
            for rep in range(args.repeats):
                turn = rep % len(contenders)
                order = contenders[turn:] + contenders[:turn]
                for name in order:
                    print(f"[repetition {rep + 1}/{args.repeats}] {name} ...", flush=True)
                    t0, load = time.perf_counter(), f"{os.getloadavg()[0]:.1f}"
                    if name == "bayesadmm":
                        run = run_bayesadmm(scenario, args.settings, f"{tmp}/bayesadmm-{rep}")
                    elif name == "plain":
                        run = run_plain(scenario, threads=args.plain_threads, device=args.device)
                    else:
                        data_dir = Path(tmp) / f"flower-{rep}"
                        data_dir.mkdir()
                        run = run_flower(scenario, str(data_dir), device=args.device, gpus=args.flower_gpus)
                    runs[name].append(run)
                    rounds = " ".join(f"{s:.2f}" for s in run["seconds"])
                    print(
                        f"[repetition {rep + 1}/{args.repeats}] {name}: rounds {rounds} s, {fmt_acc(run)} "
                        f"({time.perf_counter() - t0:.0f} s in all; load average {load} -> {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
    finally:
        shutdown_ray()

    flops, steps = round_flops(scenario)
    throughputs.append(measure_throughput(matmul_throughput, args.device))
    throughput = max(throughputs)  # measured before and after the runs; the machine is shared
    limit = flops / throughput
    where = "the GPU" if args.device != "cpu" else f"{os.cpu_count()} threads"
    print(
        f"\n{args.scenario}, {args.method}, {args.repeats} repetitions; seconds per round: the median over rounds "
        f"{TIMED[0]}-{TIMED[-1]} of every repetition"
    )
    medians = {}
    for name in contenders:
        timed = [run["seconds"][r - 1] for run in runs[name] for r in TIMED]
        medians[name] = statistics.median(timed)
        per_rep = " ".join(f"{median_timed(run['seconds']):.2f}" for run in runs[name])
        accs = " ".join(f"{100 * run['acc']:.2f}" for run in runs[name])
        line = f"  {name:9s} {medians[name]:8.3f} s/round  (per repetition: {per_rep})  acc % after round 3: {accs}"
        if any("ens_acc" in run for run in runs[name]):
            line += "  predictive: " + " ".join(f"{100 * run['ens_acc']:.2f}" for run in runs[name])
        print(line)
    for name in contenders[1:]:
        each = [
            median_timed(a["seconds"]) / median_timed(b["seconds"])
            for a, b in zip(runs[name], runs["bayesadmm"], strict=True)
        ]
        print(
            f"  ratio {name}/bayesadmm per round: {medians[name] / medians['bayesadmm']:.2f} "
            f"(per repetition: {' '.join(f'{r:.2f}' for r in each)}; their median {statistics.median(each):.2f})"
        )
    print(
        f"limit: {flops / 1e9:.2f} GFLOP a round ({steps} local steps of batch {scenario.batch_size}; "
        f"per example 6P - 2P_first) at {throughput / 1e9:.1f} GFLOP/s (torch.mm 2048x2048 float32, "
        f"{where}; the better of {throughputs[0] / 1e9:.1f} before and "
        f"{throughputs[1] / 1e9:.1f} after the runs) = {limit:.3f} s/round"
    )
    print("  over the limit: " + ", ".join(f"{name} {medians[name] / limit:.1f}x" for name in contenders))
    print(f"wall time {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
