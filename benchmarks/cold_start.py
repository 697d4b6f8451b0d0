"""The cost of compiling the fused kernels (IVON's, the cohorts' Adam) in a run's first round: on an empty Inductor
cache, and with the cache a first run left behind.

    python benchmarks/cold_start.py [--method ivon-admm] [--rounds 3] [--epochs N] [--cohort 1 10] [--threads N]

For each `--cohort` setting (bayesadmm.run's: 1 the clients one after the other, 10 a round's clients as one
batched computation, 0 the engine's choice),
two child processes run `bayesadmm.run` of `--method` on fmnist-heterog10 (the preset's split and hyperparameters,
`--rounds` rounds; `--epochs` overrides the preset's 10 local epochs to make it quicker) with the same new, empty
Inductor cache (TORCHINDUCTOR_CACHE_DIR, a temporary folder): the first compiles every kernel it uses (cold), the
second finds them in the cache (warm). Printed for each: the seconds of every round (the `seconds` field of the run's
metrics.jsonl: the client updates and the server's, without the evaluation) and round 1's seconds minus the median
of the later rounds' (what compiling, and anything else done once, adds to the first round), and the child's wall
time. Then, on another empty cache, `bayesadmm precompile` (what `make setup` runs; its time is printed) and the same
run after it: a fresh install's first run. Needs FashionMNIST (`make setup`).
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


def child(method: str, rounds: int, epochs: int, cohort: int, threads: int, out: str) -> None:
    """One run in this process, writing its run directory to `out`."""
    import torch

    import bayesadmm
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import resolve

    if threads:
        torch.set_num_threads(threads)
    config, _ = resolve("fmnist-heterog10", [f"method={method}", f"rounds={rounds}"])
    built = build(config)
    federation = built.federation
    source = federation.clients
    clients = {k: (source.X[a:b], source.y[a:b]) for k, (a, b) in source.slices.items()}  # type: ignore[attr-defined]
    hparams = {k: v for k, v in config.hparams.items() if k != "cosine"}
    if config.hparams.get("cosine"):
        hparams["cosine_rounds"] = rounds
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
        out=out,
        progress=False,
    )


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
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)  # the cohort, in a child
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.method, args.rounds, args.epochs, args.child, args.threads, args.out)
        return
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is compared with the later ones)")
    print(f"{args.method} on fmnist-heterog10, {args.rounds} rounds, epochs {args.epochs or 'as the preset'}")
    for cohort in args.cohort:
        with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache, tempfile.TemporaryDirectory() as runs:
            for label in ("cold", "warm"):
                _timed_run(args, cohort, cache, Path(runs) / label, label + " cache")
        with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache, tempfile.TemporaryDirectory() as runs:
            began = time.perf_counter()
            command = [sys.executable, "-m", "bayesadmm", "precompile"]
            subprocess.run(command, env=_environment(cache), check=True, stdout=subprocess.DEVNULL)
            print(f"bayesadmm precompile on an empty cache (what make setup runs): {time.perf_counter() - began:.1f} s")
            _timed_run(args, cohort, cache, Path(runs) / "precompiled", "precompiled")


def _environment(cache: str) -> dict[str, str]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    env.pop("BAYESADMM_COMPILE", None)  # the kernels compiled, as by default
    return env


def _timed_run(args, cohort: int, cache: str, out: Path, label: str) -> None:
    """One child run with Inductor's cache in `cache`; prints round 1's extra seconds."""
    command = [sys.executable, __file__, "--child", str(cohort), "--out", str(out)]
    command += ["--method", args.method, "--rounds", str(args.rounds), "--epochs", str(args.epochs)]
    command += ["--threads", str(args.threads)]
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
