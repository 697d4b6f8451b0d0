"""`bayesadmm flower demo` and `bayesadmm flower resume`: runs on Flower (the flower extra)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bayesadmm.experiments.config import ConfigError, resolve
from bayesadmm.flower.demo import DeploymentError, run_demo
from bayesadmm.flower.resume import resume, resume_argv


def add_parser(commands) -> argparse.ArgumentParser:
    """The `flower` subcommand's parser, with its `demo` and `resume` subcommands."""
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
    flower_resume.add_argument(
        "--app", type=Path, default=None, help="the Flower app (default: the presets' app, bayesadmm/flower/app/)"
    )
    flower_resume.add_argument("--stop-at", type=int, default=0, metavar="ROUND", help="stop again after this round")
    return flower


def command(args) -> int:
    return _flower_resume(args) if args.flower_command == "resume" else _flower_demo(args)


def _flower_resume(args) -> int:
    try:
        resume_argv(args.run_dir, args.connection, args.app, args.stop_at)  # checks the run directory first
    except ValueError as exc:
        print(f"bayesadmm: {exc}", file=sys.stderr)
        return 2
    return resume(args.run_dir, args.connection, args.app, args.stop_at)


def _flower_demo(args) -> int:
    if "=" in args.scenario:  # `bayesadmm flower demo method=fedavg`: no scenario given, only overrides
        args.overrides, args.scenario = [args.scenario, *args.overrides], "fmnist-heterog10"
    if args.supernodes < 1 or args.rounds < 1:
        print("bayesadmm: --supernodes and --rounds must be at least 1", file=sys.stderr)
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
