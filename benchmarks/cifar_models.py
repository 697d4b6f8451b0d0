"""The papers' CIFAR models trained by `bayesadmm.run`: per-client against cohort training, seconds and memory.

    python benchmarks/cifar_models.py --device cuda [--models zenke-cnn acar-cnn resnet20] [--methods fedavg ivon-admm]
                                      [--clients 10] [--examples 500] [--epochs 1] [--rounds 2] [--test-examples 500]

For each model (the CIFAR-10 CNNs of Zenke et al. and Acar et al., and ResNet-20 with GroupNorm for CIFAR-100, as the
scenarios `cifar10-zenke`, `cifar10-acar` and `cifar100-resnet20` build them) and method, `--clients` clients of
`--examples` random images of CIFAR's shape (3 × 32 × 32, labels uniform over the model's classes; random data changes
no timing) are trained for `--rounds` rounds of `--epochs` local epochs in minibatches of 64 (the papers' batch size),
once one client at a time (`cohort=1`) and once with every client in one cohort (`cohort=K`). Round 1 is warm-up
(cuDNN's algorithm search, IVON's kernels); the later rounds are timed (the `seconds` of each round's metrics line:
client updates and server step, not the evaluation, on `--test-examples` such images). On CUDA the peak memory the run allocated
(`torch.cuda.max_memory_allocated`, reset before each run) is printed beside it.

The hyperparameters are each scenario's preset with the epochs cut to `--epochs`; each run has the scenario's rounds
and stops after `--rounds` (as `bayesadmm run --stop_at` does), so that IVON-ADMM's cosine schedule and the choice of
compiled kernels (`compile="auto"`, by the run's local steps) are those of the scenario's run. The papers train 5000
images per client for 10-25 epochs a round; a round here is `--examples`/5000 · `--epochs`/E of theirs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

import bayesadmm
from bayesadmm.experiments.config import resolve
from bayesadmm.models import make_model

SCENARIOS = {"zenke-cnn": "cifar10-zenke", "acar-cnn": "cifar10-acar", "resnet20": "cifar100-resnet20"}
CLASSES = {"zenke-cnn": 10, "acar-cnn": 10, "resnet20": 100}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--methods", nargs="+", default=["fedavg", "ivon-admm"], choices=["fedavg", "ivon-admm"])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--examples", type=int, default=500, help="random CIFAR-shaped images per client")
    parser.add_argument("--epochs", type=int, default=1, help="local epochs a round (the presets' cut to this)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds a run; round 1 is warm-up")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--test-examples", type=int, default=500, help="random CIFAR-shaped images evaluated on")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (round 1 is warm-up)")
    return args


def preset(model: str, method: str, epochs: int) -> tuple[dict, int]:
    """The scenario's hyperparameters of `method` with `epochs` local epochs, and the scenario's rounds (the length
    of a `cosine` schedule: the runs keep it and stop after `--rounds`, as `bayesadmm run --stop_at` does)."""
    config, _ = resolve(SCENARIOS[model], [f"method={method}"])
    hparams = dict(config.hparams)
    hparams["epochs"] = epochs
    return hparams, config.rounds


def data(clients: int, examples: int, classes: int, tests: int) -> tuple[list, tuple]:
    gen = torch.Generator().manual_seed(0)
    parts = [
        (torch.rand(examples, 3, 32, 32, generator=gen), torch.randint(0, classes, (examples,), generator=gen))
        for _ in range(clients)
    ]
    test = (torch.rand(tests, 3, 32, 32, generator=gen), torch.randint(0, classes, (tests,), generator=gen))
    return parts, test


def one_run(model: str, method: str, cohort: int, args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    flat = make_model(model, num_classes=CLASSES[model])
    clients, test = data(args.clients, args.examples, CLASSES[model], args.test_examples)
    cuda = torch.device(args.device).type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    hparams, schedule_rounds = preset(model, method, args.epochs)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        result = bayesadmm.run(
            flat,
            clients,
            test,
            algorithm=method,
            hparams=hparams,
            rounds=schedule_rounds,
            stop_at=args.rounds,
            seed=0,
            eval_samples=4,
            device=args.device,
            cohort=cohort,
            out=folder,
            progress=False,
        )
    if len(result.history) != args.rounds:
        raise RuntimeError(f"{model} {method} cohort={cohort}: {result.status} {result.message}")
    seconds = [line["seconds"] for line in result.history]
    return {
        "seconds": seconds,
        "timed": statistics.median(seconds[1:]),
        "memory": torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan"),
        "wall": time.perf_counter() - began,
        "params": flat.num_params if hasattr(flat, "num_params") else sum(p.numel() for p in flat.module.parameters()),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"{args.clients} clients of {args.examples} random CIFAR-shaped images, {args.epochs} local epoch(s) of "
        f"batch 64 a round, {args.rounds} rounds (timed: rounds 2-{args.rounds}); torch {torch.__version__}, {name}",
        flush=True,
    )
    rows = []
    for model in args.models:
        for method in args.methods:
            runs = {}
            for cohort in (1, args.clients):
                runs[cohort] = one_run(model, method, cohort, args)
                seconds = " ".join(f"{s:.2f}" for s in runs[cohort]["seconds"])
                print(
                    f"{model} {method} cohort={cohort}: rounds {seconds} s, peak memory "
                    f"{runs[cohort]['memory']:.0f} MiB ({runs[cohort]['wall']:.0f} s in all)",
                    flush=True,
                )
            rows.append((model, runs[1]["params"], method, runs[1], runs[args.clients]))
    print(
        "\n| model | weights | method | s/round per-client | s/round cohort | per-client/cohort | peak MiB per-client "
        "| peak MiB cohort |\n|---|---|---|---|---|---|---|---|"
    )
    for model, params, method, single, cohort in rows:
        print(
            f"| {model} | {params:,} | {method} | {single['timed']:.3f} | {cohort['timed']:.3f} | "
            f"{single['timed'] / cohort['timed']:.2f}x | {single['memory']:.0f} | {cohort['memory']:.0f} |"
        )


if __name__ == "__main__":
    main()
