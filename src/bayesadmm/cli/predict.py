"""`bayesadmm predict RUN_DIR_OR_FILE DATA`: a scenario's posterior on one of the scenarios' data sets
(`experiments.predict`): the metrics at the mean and for the posterior predictive, and with `--out FILE.csv` the
predicted class and the predictive probabilities of every example."""

from __future__ import annotations

import argparse
import csv
import io
import sys
import tempfile
from pathlib import Path

from bayesadmm.cli import methods
from bayesadmm.engine.rundir import write_bytes
from bayesadmm.experiments.config import ConfigError
from bayesadmm.experiments.predict import DATA_SETS, predict
from bayesadmm.likelihoods import Classification


def _data_sets() -> str:
    return "; ".join(f"{name}: {what}" for name, (what, _) in DATA_SETS.items())


def add_parser(commands) -> argparse.ArgumentParser:
    """The `predict` subcommand's parser."""
    predict = commands.add_parser(
        "predict",
        help="predict with a scenario's posterior (a run directory or its posterior.safetensors)",
        description=f"Data sets: {_data_sets()}. A posterior of your own model: use the Python API "
        "(bayesadmm.Posterior.load(path).predict(model, x)).",
    )
    predict.add_argument("source", type=Path, metavar="RUN_DIR_OR_FILE")
    predict.add_argument("data", metavar="DATA", help="a data set name (see above)")
    predict.add_argument("--data-dir", default=None, help="folder with the data set's files")
    predict.add_argument("--samples", type=int, default=32, help="posterior draws for the predictive (default 32)")
    predict.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    predict.add_argument("--out", type=Path, default=None, metavar="FILE.csv", help="write the predictions here")
    methods.add_option(predict)  # a run of a method of one's own: its module registers it
    predict.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    return predict


def _check_out(out: Path | None) -> None:
    """Refuse an --out that cannot be written, before anything is loaded or computed. Whether its folder takes a new
    file is tried with a file made there and removed at once: permissions do not tell (root may write anywhere
    by them, yet /proc refuses new files)."""
    if out is None:
        return
    if out.suffix != ".csv":
        raise ValueError(f"--out {out}: give a .csv file name")
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder: give a .csv file name in it")
    if not out.parent.is_dir():
        raise ValueError(f"--out {out}: {out.parent} is not a folder; give a file in an existing folder")
    try:
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.", suffix=".probe"):
            pass
    except OSError as exc:
        raise ValueError(
            f"--out {out}: cannot write in {out.parent} ({exc.strerror or exc}); give a file in a folder you can write"
        ) from None


def _table(probabilities, targets) -> bytes:
    """One row per example: its index, target, predicted class and the predictive probability of every class."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    classes = probabilities.shape[1]
    writer.writerow(["index", "target", "predicted", *(f"p{c}" for c in range(classes))])
    rows = zip(probabilities.tolist(), targets.tolist(), probabilities.argmax(dim=1).tolist(), strict=True)
    for i, (row, target, guess) in enumerate(rows):
        writer.writerow([i, target, guess, *(repr(p) for p in row)])
    return buffer.getvalue().encode()


def command(args) -> int:
    try:
        _check_out(args.out)
        if args.samples < 1:
            raise ValueError(f"--samples must be >= 1, got {args.samples}")
        prediction = predict(args.source, args.data, data_dir=args.data_dir, samples=args.samples, seed=args.seed)
        if args.out is not None and not isinstance(prediction.likelihood, Classification):
            raise ValueError("--out writes class probabilities; for another likelihood use the Python API")
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        if args.debug:
            raise
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    metrics = prediction.metrics
    at_mean = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if not k.startswith("ens_"))
    print(f"at the mean:    {at_mean}")
    predictive = "  ".join(f"{k[4:]} {v:.4f}" for k, v in metrics.items() if k.startswith("ens_"))
    if predictive:
        print(f"predictive ({args.samples} draws): {predictive}")
    if args.out is not None:
        try:
            write_bytes(args.out, _table(prediction.predictive, prediction.targets))
        except OSError as exc:  # checked writable before; the disk filled or the folder changed since
            print(f"bayesadmm: {exc}", file=sys.stderr)
            return 2
        print(f"predictions: {args.out}")
    return 0
