"""The `bayesadmm` command. It parses and dispatches; the work lives in the modules it calls.

One module per subcommand group, each with the subcommand's parser (`add_parser`) and its handler (`command`):
`run` (run, resume), `predict`, `unlearn`, `sweep`, `tune`, `compare`, `flower` (demo, resume), `precompile`,
`paper`, `methods`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from bayesadmm.cli import compare, flower, methods, paper, precompile, predict, run, sweep, tune, unlearn

DESCRIPTION = "The `bayesadmm` command. It parses and dispatches; the work lives in the modules it calls."

# subcommand -> its handler, which returns the exit code
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": run.command,
    "resume": run.command,
    "compare": compare.command,
    "sweep": sweep.command,
    "tune": tune.command,
    "flower": flower.command,
    "precompile": precompile.command,
    "paper": paper.command,
    "predict": predict.command,
    "unlearn": unlearn.command,
    "methods": methods.command,
}


def _version() -> str:
    """The installed distribution's version (its metadata: importing bayesadmm itself would import torch)."""
    from importlib import metadata

    try:
        return metadata.version("bayesadmm")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bayesadmm", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    # in this order in the help
    parser.set_defaults(run_parser=run.add_parser(commands))
    flower.add_parser(commands)
    parser.set_defaults(resume_parser=run.add_resume_parser(commands))
    parser.set_defaults(sweep_parser=sweep.add_parser(commands))
    parser.set_defaults(tune_parser=tune.add_parser(commands))
    compare.add_parser(commands)
    predict.add_parser(commands)
    unlearn.add_parser(commands)
    precompile.add_parser(commands)
    methods.add_parser(commands)
    paper.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    if argv[:1] in (["run"], ["resume"], ["sweep"], ["tune"]):
        # options may come anywhere among the KEY=VALUE(S) arguments, which plain parse_args does not allow
        args = parser.get_default(f"{argv[0]}_parser").parse_intermixed_args(argv[1:])
        args.command = argv[0]
    else:
        args = parser.parse_args(argv)
    if methods.load(getattr(args, "method_modules", [])):
        return 2
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
