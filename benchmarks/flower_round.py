"""Flower's round cost: Flower's own PyTorch FedAvg app against bayesadmm's FedAvg strategy in the same app layout,
with the same model, data and nodes, on Flower's local simulation and on a loopback deployment (TLS, SuperNode
authentication), run alternately.

    python benchmarks/flower_round.py [--rounds 4] [--repetitions 2] [--modes simulation deployment]

The two apps differ only in their strategy and ClientApp body:

* flower: `flwr.serverapp.strategy.FedAvg`; the ClientApp loads the received arrays into the model and trains it
  with Adam (the library's FedAvg's local solver: lr, epochs, batch size as below), replying the arrays and
  ``num-examples``;
* bayesadmm: `bayesadmm.flower.strategy("fedavg", ...)`; the ClientApp calls `bayesadmm.flower.client.query/train`.

The model is a 64-32-10 MLP on scikit-learn's digits, split over 2 SuperNodes by partition-id (as
examples/flower-app). A round's time runs from `configure_train` to the end of `aggregate_train`, measured by the
same wrapper around both strategies, so the ServerApp's start-up is outside it; printed per round, and the median
of rounds 2.. (round 1 includes bayesadmm's discovery of the nodes) per contender and mode, with their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HPARAMS = {"lr": 0.01, "epochs": 1, "batch_size": 32}

TASK = (ROOT / "examples" / "flower-app" / "bayesadmm_app" / "task.py").read_text()

TIMING = '''
"""A strategy wrapper that records each round's seconds, configure_train to the end of aggregate_train."""
import json
import time
from pathlib import Path

from flwr.serverapp.strategy import Strategy


class Timed(Strategy):
    def __init__(self, strategy, path):
        self.strategy, self.path, self.began, self.seconds = strategy, Path(path), 0.0, []

    def summary(self):
        self.strategy.summary()

    def configure_train(self, server_round, arrays, config, grid):
        self.began = time.perf_counter()
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        found = self.strategy.aggregate_train(server_round, replies)
        self.seconds.append(time.perf_counter() - self.began)
        self.path.write_text(json.dumps(self.seconds))
        return found

    def configure_evaluate(self, server_round, arrays, config, grid):
        return []

    def aggregate_evaluate(self, server_round, replies):
        return None
'''

FLOWER_SERVER = """
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from app.task import Net
from app.timing import Timed

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rounds = int(context.run_config["num-server-rounds"])
    timed = Timed(FedAvg(fraction_train=1.0, fraction_evaluate=0.0), context.run_config["times"])
    timed.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=rounds)
"""

FLOWER_CLIENT = f"""
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from app.task import Net, load_data

app = ClientApp()
HPARAMS = {HPARAMS!r}


@app.train()
def train(msg: Message, context: Context) -> Message:
    (X, y), _ = load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    optimizer = torch.optim.Adam(model.parameters(), lr=HPARAMS["lr"])
    for _ in range(HPARAMS["epochs"]):
        for idx in torch.randperm(len(y)).split(HPARAMS["batch_size"]):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
            optimizer.step()
    metrics = MetricRecord({{"num-examples": len(y)}})
    content = RecordDict({{"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}})
    return Message(content=content, reply_to=msg)
"""

BAYESADMM_SERVER = f"""
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from app.task import Net
from app.timing import Timed
from bayesadmm.flower import strategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rounds = int(context.run_config["num-server-rounds"])
    model = Net()
    inner = strategy("fedavg", model=model, rounds=rounds, fraction_evaluate=0.0, out=context.run_config["out"],
                     overwrite=True, **{HPARAMS!r})
    Timed(inner, context.run_config["times"]).start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                                                    num_rounds=rounds)
"""

BAYESADMM_CLIENT = """
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from app.task import Net, load_data
from bayesadmm.flower import client

app = ClientApp()


def _train_data(context):
    return load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))[0]


@app.query()
def query(msg: Message, context: Context) -> Message:
    return client.query(msg, context, Net(), _train_data(context))


@app.train()
def train(msg: Message, context: Context) -> Message:
    return client.train(msg, context, Net(), _train_data(context))
"""

PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "bench"

[tool.flwr.app.components]
serverapp = "app.server_app:app"
clientapp = "app.client_app:app"

[tool.flwr.app.config]
num-server-rounds = 4
times = ""
out = ""
"""


def write_app(folder: Path, name: str, server: str, client: str) -> Path:
    """An app folder laid out as `flwr new` lays one out (its package is `app`)."""
    package = folder / "app"
    package.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(PYPROJECT.format(name=name))
    for file, text in (("__init__.py", ""), ("task.py", TASK), ("timing.py", TIMING), ("server_app.py", server),
                       ("client_app.py", client)):  # fmt: skip
        (package / file).write_text(textwrap.dedent(text))
    return folder


def run_simulation(app: Path, home: Path, work: Path, rounds: int, times: Path) -> None:
    """`flwr run APP --stream` on Flower's local simulation (2 SuperNodes), FLWR_HOME `home`."""
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("VIRTUAL_ENV", None)
    config = f'num-server-rounds={rounds} times="{times}" out="{work / "runs" / app.name}"'
    done = subprocess.run([str(Path(sys.executable).parent / "flwr"), "run", str(app), "--stream", "--run-config",
                           config], cwd=work, env=env, capture_output=True, text=True, timeout=1800)  # fmt: skip
    if done.returncode != 0 or not times.exists():
        raise RuntimeError(f"flwr run {app.name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def run_deployment(deployment, app: Path, work: Path, rounds: int, times: Path) -> None:
    """`flwr run APP CONNECTION` on the loopback deployment, waited for."""
    process = deployment.flwr_run(
        app, {"num-server-rounds": rounds, "times": str(times), "out": str(work / "runs" / app.name)}
    )
    process.wait(timeout=3600)
    if process.returncode != 0 or not times.exists():
        raise RuntimeError(f"flwr run {app.name} failed: see {deployment.logs['flwr-run']}")


def stop_local_superlink(home: Path) -> None:
    for pid in subprocess.run(["pgrep", "-f", str(home)], capture_output=True, text=True).stdout.split():
        try:
            os.kill(int(pid), 15)
        except ProcessLookupError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument(
        "--modes", nargs="+", default=["simulation", "deployment"], choices=["simulation", "deployment"]
    )
    args = parser.parse_args()
    from bayesadmm.flower.demo import Deployment

    work = Path(tempfile.mkdtemp(prefix="flower-round-"))
    apps = {
        "flower": write_app(work / "flower-fedavg", "flower-fedavg", FLOWER_SERVER, FLOWER_CLIENT),
        "bayesadmm": write_app(work / "bayesadmm-fedavg", "bayesadmm-fedavg", BAYESADMM_SERVER, BAYESADMM_CLIENT),
    }
    print(f"{args.rounds} rounds of FedAvg ({HPARAMS}), 64-32-10 MLP on digits, 2 SuperNodes; work folder {work}")
    results: dict[tuple[str, str], list[float]] = {}
    for mode in args.modes:
        deployment = Deployment(work / "deployment", 2).start() if mode == "deployment" else None
        home = work / "simulation-home"
        try:
            for repetition in range(args.repetitions):
                for name, app in apps.items():
                    times = work / f"times-{mode}-{name}-{repetition}.json"
                    began = time.perf_counter()
                    if deployment is None:
                        run_simulation(app, home, work, args.rounds, times)
                    else:
                        run_deployment(deployment, app, work, args.rounds, times)
                    seconds = json.loads(times.read_text())
                    results.setdefault((mode, name), []).append(statistics.median(seconds[1:]))
                    rounds = " ".join(f"{s:.2f}" for s in seconds)
                    print(f"[{mode} {repetition + 1}/{args.repetitions}] {name:9s}: rounds {rounds} s "
                          f"({time.perf_counter() - began:.0f} s in all)", flush=True)  # fmt: skip
        finally:
            if deployment is not None:
                deployment.stop()
            stop_local_superlink(home)
    print("\nseconds per round (median of rounds 2.., then the median over repetitions):")
    for mode in args.modes:
        flower, ours = (statistics.median(results[(mode, name)]) for name in ("flower", "bayesadmm"))
        print(f"  {mode:10s}  flower {flower:.3f}  bayesadmm {ours:.3f}  ratio bayesadmm/flower {ours / flower:.2f}")


if __name__ == "__main__":
    main()
