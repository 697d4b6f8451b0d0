"""`bayesadmm run` and `bayesadmm resume`: one federated experiment, and its continuation from a checkpoint."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from pathlib import Path

from bayesadmm.cli import methods
from bayesadmm.engine.rundir import RunDirError
from bayesadmm.engine.settings import check_device
from bayesadmm.experiments import build as experiment  # the module: `run` looked up per call (tests replace it)
from bayesadmm.experiments.config import GENERAL_KEYS, ConfigError, load, presets, resolve, validate
from bayesadmm.experiments.sweep import end_with_parent
from bayesadmm.experiments.values import convert, unknown
from bayesadmm.likelihoods import MissingCurvatureError


def _scenarios() -> list[str]:
    """The scenario presets (bayesadmm/experiments/scenarios/), by name."""
    return list(presets())


def add_parser(commands) -> argparse.ArgumentParser:
    """The `run` subcommand's parser (`main` parses its arguments intermixed with the overrides)."""
    run = commands.add_parser(
        "run",
        help="run a federated experiment: a scenario preset or a JSON config file",
        description="KEY=VALUE overrides: general keys (method, rounds, seed, clients, likelihood, out, "
        "participation, ...), the method's hyperparameters and the likelihood's settings (likelihood.noise=0.5); "
        f"an unknown key lists the valid ones. Methods: {', '.join(methods.names())}, and those of --methods files.",
    )
    run.add_argument("scenario", help=f"a preset ({', '.join(_scenarios())}) or a file")
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    run.add_argument("--data-dir", default=None, help="folder with the dataset's files (same as data_dir=...)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    methods.add_option(run)
    run.add_argument("--overwrite", action="store_true", help="replace a run already in the run directory")
    run.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    run.add_argument(
        "--log",
        default=None,
        metavar="TRACKERS",
        help="also log the metrics to tensorboard, mlflow or both (tensorboard,mlflow; same as log=...)",
    )
    return run


# the settings of config.json that `bayesadmm resume KEY=VALUE` may change: where and how the run computes, never
# what it computes (`engine.identity.RESUME_MAY_CHANGE`; stop_at and dp_epsilon have their options)
RESUMABLE = ("workers", "checkpoint_every", "device", "client_store", "data_dir", "log")


def add_resume_parser(commands) -> argparse.ArgumentParser:
    """The `resume` subcommand's parser."""
    resume = commands.add_parser("resume", help="continue a run from its last checkpoint")
    resume.add_argument("run_dir", type=Path)
    resume.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE",
        help=f"what a resume may change (the numbers stay those of an uninterrupted run): {', '.join(RESUMABLE)}",
    )  # fmt: skip
    resume.add_argument("--quiet", action="store_true")
    methods.add_option(resume)
    resume.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    resume.add_argument(
        "--stop-at", type=int, default=0, metavar="ROUND", help="stop again after this round (default: run to the end)"
    )
    resume.add_argument(
        "--dp-epsilon", type=float, default=None, metavar="EPSILON",
        help="a private run's new privacy budget: a run that stopped with status budget goes on up to it",
    )  # fmt: skip
    return resume


def command(args) -> int:
    resume = args.command == "resume"
    if os.environ.get("BAYESADMM_SWEEP_PID", "").isdigit():  # a run of a sweep: it ends with the sweep
        end_with_parent(int(os.environ["BAYESADMM_SWEEP_PID"]))
    try:  # everything about the configuration is checked before the run directory is touched
        if resume:
            if not (args.run_dir / "checkpoint.pt").exists():
                raise ConfigError(f"{args.run_dir} has no checkpoint to resume from")
            config = load(args.run_dir)
            config = type(config)(**{**config.to_json(), "out": str(args.run_dir), "stop_at": args.stop_at})
            config = resume_overrides(config, args.overrides)
            if args.dp_epsilon is not None:
                config = dataclasses.replace(config, dp_epsilon=args.dp_epsilon)
            device_problem = check_device(config.device)
            if device_problem:
                raise ConfigError(f"cannot resume here: {device_problem}")
        else:
            overrides = list(args.overrides) + ([f"data_dir={args.data_dir}"] if args.data_dir else [])
            overrides += [f"log={args.log}"] if args.log else []
            config, changed = resolve(args.scenario, overrides)
            for line in changed:
                print(f"override: {line}")
        experiment.settings_of(config)  # the engine's own checks (e.g. stop_at against rounds)
        built = experiment.build(config)  # the data files, the split and the model's fit to the data
        built.algorithm()  # the method's own checks of its hyperparameters and of the likelihood's curvature
    # ValueError: a data file or a setting's value; MissingCurvatureError: a method needs more of the likelihood
    except (ConfigError, ValueError, MissingCurvatureError, FileNotFoundError) as exc:
        if args.debug:
            raise
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    run_dir = config.run_dir()
    print(f"run directory: {run_dir}")
    try:
        result = experiment.run(
            config, resume=resume, progress=not args.quiet, overwrite=getattr(args, "overwrite", False), built=built
        )
    except (RunDirError, FileNotFoundError) as exc:  # the run directory, or the data (the loaders say how to get it)
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C or a SIGTERM (the engine recorded it in status.json)
        print(f"bayesadmm: interrupted; `bayesadmm resume {run_dir}` goes on from the last checkpoint", file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)
    except Exception as exc:  # noqa: BLE001 — the run failed; status.json holds the reason too
        if args.debug:
            raise
        print(f"bayesadmm: the run failed: {type(exc).__name__}: {exc} (--debug shows where)", file=sys.stderr)
        return 1
    if result.status == "diverged":  # the library reports it in the Result; the command says it
        print(
            f"bayesadmm: diverged in {result.message} (the state of round {result.round} is in the checkpoint)",
            file=sys.stderr,
        )
    elif result.message:
        print(result.message)
    if (run_dir / "curves.png").exists():
        print(f"metrics: {run_dir / 'metrics.jsonl'}; plot: {run_dir / 'curves.png'}")
    return result.exit_code


def resume_overrides(config, overrides: list[str]):
    """`config` with the KEY=VALUE pairs of `bayesadmm resume` applied: only settings a resume may change
    (`RESUMABLE`), each typed and validated as `bayesadmm run`'s are; anything else is a `ConfigError`."""
    changes = {}
    for pair in overrides:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ConfigError(f"{pair!r} is not KEY=VALUE; a resume may change {', '.join(RESUMABLE)}")
        if key not in RESUMABLE and key not in GENERAL_KEYS:
            raise ConfigError(unknown("unknown key", [key], RESUMABLE, listed="a resume may change", quote=True))
        if key not in RESUMABLE:
            raise ConfigError(
                f"a resume may not change {key!r}: it would be another run (start one with `bayesadmm run`); "
                f"a resume may change {', '.join(RESUMABLE)}"
            )
        changes[key] = convert(key, value, (type(getattr(config, key)),))
    changed = dataclasses.replace(config, **changes)
    validate(dataclasses.replace(changed, device="cpu"))  # the device is the machine's, checked by the caller
    return changed
