"""The cost of compiling the fused kernels (IVON's, the cohorts' Adam) in a run's first round: on an empty Inductor
cache, and with the cache a first run left behind.

    python benchmarks/cold_start.py --quickstart [--repeats 3] [--modes auto off on]
    python benchmarks/cold_start.py [--method ivon-admm] [--rounds 3] [--epochs N] [--cohort 1 10] [--threads N]

With --quickstart: the README quickstart (a 771-parameter MLP, 5 clients, IVON-ADMM for 5 rounds) in child
processes, each on a new, empty Inductor cache, with bayesadmm.run's compile="auto" (the default), compile="off" and
any other `--modes` ("on": the kernels compiled), `--repeats` times in turn; printed: each child's wall time (Python
start, imports and the run), the medians, and auto's minus off's (what a first try pays for compiling).

Otherwise, for each `--cohort` setting (bayesadmm.run's: 1 the clients one after the other, 10 a round's clients as
one batched computation, 0 the engine's choice), two child processes run `bayesadmm.run` of `--method` with
compile="on" on fmnist-heterog10 (the preset's split and hyperparameters, `--rounds` rounds; `--epochs` overrides the
preset's 10 local epochs to make it quicker) with the same new, empty Inductor cache (TORCHINDUCTOR_CACHE_DIR, a
temporary folder): the first compiles every kernel it uses (cold), the
second finds them in the cache (warm). Printed for each: the seconds of every round (the `seconds` field of the run's
metrics.jsonl: the client updates and the server's, without the evaluation) and round 1's seconds minus the median
of the later rounds' (what compiling, and anything else done once, adds to the first round), and the child's wall
time. Then, on another empty cache, `bayesadmm precompile` (what `make setup` runs; its time is printed) and the same
run after it: a fresh install's first run. Needs FashionMNIST (`make setup`).

With --smoke: the same children on 1 % of the scenario's images with compile="off", and no precompile: a check that
the script runs (tests/test_benchmarks.py), which measures nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(method: str, rounds: int, epochs: int, cohort: int, threads: int, out: str, smoke: bool = False) -> None:
    """One run in this process, writing its run directory to `out` (with `smoke`: 1 % of the data, not compiled)."""
    import torch

    import bayesadmm
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import resolve

    if threads:
        torch.set_num_threads(threads)
    config, _ = resolve("fmnist-heterog10", [f"method={method}", f"rounds={rounds}", *(["data_fraction=0.01"] * smoke)])
    built = build(config)
    federation = built.federation
    source = federation.clients
    clients = {k: (source.X[a:b], source.y[a:b]) for k, (a, b) in source.slices.items()}  # type: ignore[attr-defined]
    hparams = dict(config.hparams)  # cosine: true spans the run's `rounds`, as `bayesadmm run` does
    if epochs:
        hparams["epochs"] = epochs
    bayesadmm.run(
        federation.model,
        clients,
        (federation.eval_X, federation.eval_y),
        algorithm=method,
        hparams=hparams,
        rounds=rounds,
        seed=config.seed,
        cohort=cohort,
        compile="off" if smoke else "on",  # what compiling costs (compile="auto" would run these short runs eagerly)
        out=out,
        progress=False,
    )


def quickstart(compile: str, out: str) -> None:
    """The README quickstart's code, with `compile` (README.md)."""
    import torch
    from torch import nn

    import bayesadmm

    torch.manual_seed(0)
    w = torch.randn(20, 3)

    def make_data(n):
        X = torch.randn(n, 20)
        return X, (X @ w).argmax(dim=1)

    clients = [make_data(200) for _ in range(5)]
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3))
    result = bayesadmm.run(model, clients, test=make_data(1000), algorithm="ivon-admm", rounds=5, out=out,
                           hparams=dict(lr=0.05, hess_init=0.1, epochs=2, rho=0.5, gamma=0.5, delta=1.0),
                           compile=compile, progress=False)  # fmt: skip
    print(result.history[-1]["ens_test_acc"])


def time_quickstart(repeats: int, modes: list[str]) -> None:
    """The quickstart's wall time on an empty cache with each compile setting of `modes`, in turn."""
    walls: dict[str, list[float]] = {mode: [] for mode in ["auto", "off", *modes]}
    for _ in range(repeats):
        for mode in walls:
            with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache, tempfile.TemporaryDirectory() as runs:
                began = time.perf_counter()
                command = [sys.executable, __file__, "--quickstart-child", mode, "--out", str(Path(runs) / "run")]
                done = subprocess.run(command, env=_environment(cache), check=True, capture_output=True, text=True)
                walls[mode].append(time.perf_counter() - began)
                accuracy = done.stdout.strip()
                print(f"compile={mode:<4} wall {walls[mode][-1]:5.1f} s (predictive accuracy {accuracy})", flush=True)
    medians = {mode: statistics.median(times) for mode, times in walls.items()}
    shown = ", ".join(f"compile={mode} {seconds:.1f} s" for mode, seconds in medians.items())
    print(f"README quickstart on an empty cache, median of {repeats}: {shown}; "
          f"auto − off {medians['auto'] - medians['off']:+.1f} s")  # fmt: skip


def _round_seconds(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["seconds"] for line in lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="ivon-admm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=0, help="local epochs (0: the preset's)")
    parser.add_argument("--cohort", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--threads", type=int, default=0, help="torch threads in the children (0: torch's default)")
    parser.add_argument("--quickstart", action="store_true", help="time the README quickstart, compile=auto and off")
    parser.add_argument("--repeats", type=int, default=3, help="with --quickstart: runs of each")
    parser.add_argument("--modes", nargs="*", default=[], help="with --quickstart: compile settings besides auto, off")
    parser.add_argument("--quickstart-child", default=None, help=argparse.SUPPRESS)  # the compile mode, in a child
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)  # the cohort, in a child
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="1 %% of the data, compile=off, no precompile: a check")
    args = parser.parse_args()
    if args.quickstart_child is not None:
        quickstart(args.quickstart_child, args.out)
        return
    if args.quickstart:
        time_quickstart(args.repeats, args.modes)
        return
    if args.child is not None:
        child(args.method, args.rounds, args.epochs, args.child, args.threads, args.out, args.smoke)
        return
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is compared with the later ones)")
    print(f"{args.method} on fmnist-heterog10, {args.rounds} rounds, epochs {args.epochs or 'as the preset'}")
    for cohort in args.cohort:
        with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache, tempfile.TemporaryDirectory() as runs:
            for label in ("cold", "warm"):
                _timed_run(args, cohort, cache, Path(runs) / label, label + " cache")
        if args.smoke:
            continue
        with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache, tempfile.TemporaryDirectory() as runs:
            began = time.perf_counter()
            command = [sys.executable, "-m", "bayesadmm", "precompile"]
            subprocess.run(command, env=_environment(cache), check=True, stdout=subprocess.DEVNULL)
            print(f"bayesadmm precompile on an empty cache (what make setup runs): {time.perf_counter() - began:.1f} s")
            _timed_run(args, cohort, cache, Path(runs) / "precompiled", "precompiled")


def _environment(cache: str) -> dict[str, str]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    env.pop("BAYESADMM_COMPILE", None)  # the kernels as the run's compile setting says
    return env


def _timed_run(args, cohort: int, cache: str, out: Path, label: str) -> None:
    """One child run with Inductor's cache in `cache`; prints round 1's extra seconds."""
    command = [sys.executable, __file__, "--child", str(cohort), "--out", str(out)]
    command += ["--method", args.method, "--rounds", str(args.rounds), "--epochs", str(args.epochs)]
    command += ["--threads", str(args.threads), *(["--smoke"] * args.smoke)]
    began = time.perf_counter()
    subprocess.run(command, env=_environment(cache), check=True)
    wall = time.perf_counter() - began
    seconds = _round_seconds(out)
    extra = seconds[0] - statistics.median(seconds[1:])
    rounds = " ".join(f"{s:.1f}" for s in seconds)
    print(
        f"cohort={cohort:<3} {label}: round 1 − median of rounds 2–{len(seconds)} = {extra:6.1f} s "
        f"(rounds: {rounds} s; child wall time {wall:.1f} s)",
        flush=True,
    )


if __name__ == "__main__":
    main()
