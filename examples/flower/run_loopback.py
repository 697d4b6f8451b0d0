"""This example deployed on this machine: a SuperLink and one SuperNode per client over loopback with TLS
(throw-away certificates) and SuperNode authentication (a registered key per node), each SuperNode given only its
own file, then `flwr run .`.

    python run_loopback.py [--workdir DIR] [--rounds 5] [--kill-after-round R [--restart]]

`--kill-after-round R --restart` kills the last SuperNode after round R and starts it again: it rejoins and gets
its client state back (flower.log in the run directory says when it left and when it came back).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from prepare import prepare  # noqa: E402

from bayesadmm.flower.demo import run_deployment  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--kill-after-round", type=int, default=None)
    parser.add_argument("--restart", action="store_true")
    parser.add_argument("--round-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="bayesadmm-example-"))).resolve()
    files, test = prepare(workdir / "data", args.clients)
    node_configs = [f'partition-id={k} data="{path}"' for k, path in enumerate(files)]
    run_config = {
        "eval-data": str(test),
        "out": str(workdir / "run"),
        "num-server-rounds": args.rounds,
        "clients": args.clients,
        "round-timeout": args.round_timeout,
    }
    result = run_deployment(
        HERE, run_config, node_configs, workdir, kill_after_round=args.kill_after_round, restart=args.restart
    )
    print(f"{result['status']['status']} after round {result['status']['round']}: {result['metrics']}")
    print(f"run directory: {result['run_dir']} (flower.log: what each node did)")
    return result


if __name__ == "__main__":
    main()
