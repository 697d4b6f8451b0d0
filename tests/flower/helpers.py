"""Shared pieces of the Flower tests: small scenarios and an in-process Grid."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid

from bayesadmm.experiments import build as setup

# a small, fast version of the heterogeneous FashionMNIST scenario (as tests/engine/test_runner.py)
# cohort=1: the local engine trains one client at a time, as each Flower node does, so the numbers agree to 1e-9
SMALL = ["data_fraction=0.005", "clients=3", "epochs=1", "eval_samples=2", "cohort=1"]

# every registered method with the hyperparameters it needs and the preset does not give
EXTRA = {"ama": ["rho=0.01", "delta=0.01", "lr=0.001", "batch_size=32"],
         "bayes-admm-iso": ["rho=0.1", "delta=1.0", "precision=1.0", "lr=0.001", "batch_size=32"],
         "fedep": [], "fedsep": [], "fedlap-func": ["server_iterations=50"], "fedlap-cov": ["curvature=mc-fisher"], "ivon-admm": ["epochs=1"], "ivon-pvi": ["epochs=1"]}


_loaded = {}


@pytest.fixture
def fast_data(monkeypatch):
    """float32 (the precision of `bayesadmm run`, and twice as fast as the suite's float64) and the engine's data
    loading cached across tests, with the test set cut to its first 1000 images: both sides of a comparison run in
    this process and see the same data, and evaluating 10 000 images per round would dominate these tests' time.
    (tests/conftest.py restores the default dtype after each test.)"""
    import torch

    torch.set_default_dtype(torch.float32)
    load = setup.load_data

    def cached(config):
        key = (config.dataset, config.preprocessing, config.data_dir)
        if key not in _loaded:
            data = load(config)
            _loaded[key] = data._replace(X_test=data.X_test[:1000], y_test=data.y_test[:1000])
        return _loaded[key]

    monkeypatch.setattr(setup, "load_data", cached)


def lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def assert_same_metrics(local: list[dict], flower: list[dict], tol: float = 1e-4) -> None:
    assert [line["round"] for line in local] == [line["round"] for line in flower]
    for a, b in zip(local, flower):
        for key, value in a.items():
            if key in ("seconds", "eval_seconds"):
                continue
            assert abs(value - b[key]) <= tol, (a["round"], key, value, b[key])


class LoopbackGrid(Grid):
    """A Grid that runs the ClientApp in this process, one Context per node (what a SuperNode keeps between
    rounds): the adapter's whole message path, without the Simulation Runtime's start-up cost.

    `dead` holds client ids whose node stops answering after round `dies_after` (their messages get no reply)."""

    def __init__(self, client_app, clients: int, dead: tuple[int, ...] = (), dies_after: int = 10**9):
        self.client_app = client_app
        self.node_ids = {k: 1000 + k for k in range(clients)}
        self.contexts = {n: Context(run_id=1, node_id=n, node_config={"partition-id": k, "num-partitions": clients},
                                    state=RecordDict(), run_config={}) for k, n in self.node_ids.items()}
        self.dead = {self.node_ids[k] for k in dead}
        self.dies_after = dies_after
        self.replies: dict[str, Message] = {}
        # what the Simulation Runtime sets for the ServerApp's thread, so that Message() can be constructed
        from flwr.common.constant import SUPERLINK_NODE_ID
        from flwr.supercore.task_identity import TaskIdentity
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID

    def set_run(self, run_id):   # pragma: no cover - not used by the adapter
        pass

    @property
    def run(self):   # pragma: no cover
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):   # pragma: no cover
        return Message(content, dst_node_id, message_type, group_id=group_id)

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            ids.append(message.metadata.message_id)
            node = message.metadata.dst_node_id
            group = message.metadata.group_id
            if node in self.dead and group.isdigit() and int(group) > self.dies_after:
                continue
            try:
                self.replies[message.metadata.message_id] = self.client_app(message, self.contexts[node])
            except Exception as exc:   # a ClientApp exception is an error reply in Flower
                self.replies[message.metadata.message_id] = Message(Error(code=0, reason=repr(exc)),
                                                                    reply_to=message)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def send_and_receive(self, messages, *, timeout=None):   # pragma: no cover
        return self.pull_messages(self.push_messages(messages))


class LocalDataGrid(LoopbackGrid):
    """A LoopbackGrid whose node k is configured with `node_configs[k]` and, while it handles a message, sees only
    its own file `files[k]`: every other client's file and the server's `server_files` are moved out of reach, so a
    node that reads anything but its own data fails. `restart(k)` gives client k's node an empty Context.state and
    keeps its node id, as a SuperNode that died and was started again with its authentication key (the SuperLink
    names a node by its registered key)."""

    def __init__(self, client_app, node_configs: dict, files: dict, server_files=(), **options):
        super().__init__(client_app, len(node_configs), **options)
        self.files, self.server_files = {k: Path(f) for k, f in files.items()}, [Path(f) for f in server_files]
        for k, node in self.node_ids.items():
            self.contexts[node].node_config.update(node_configs[k])
        self.client_of = {node: k for k, node in self.node_ids.items()}
        self.reads: dict[int, int] = {}   # node → messages handled (the test checks every node was exercised)

    def restart(self, k: int) -> int:
        node = self.node_ids[k]
        config = dict(self.contexts.pop(node).node_config)
        self.contexts[node] = Context(run_id=1, node_id=node, node_config=config, state=RecordDict(), run_config={})
        return node

    def push_messages(self, messages):
        ids = []
        for message in messages:
            node = message.metadata.dst_node_id
            others = [f for j, f in self.files.items() if j != self.client_of.get(node)] + self.server_files
            moved = []
            try:
                for f in others:
                    if f.exists():
                        (f.parent / ".vault").mkdir(exist_ok=True)
                        f.rename(f.parent / ".vault" / f.name)
                        moved.append(f)
                ids.extend(super().push_messages([message]))
                self.reads[node] = self.reads.get(node, 0) + 1
            finally:
                for f in moved:
                    (f.parent / ".vault" / f.name).rename(f)
        return ids


def user_client_app(parts, test):
    """The ClientApp a user writes for a ServerApp with a bayesadmm strategy: user_app's model and the node's own data
    (`parts[partition-id]`), evaluating on `test`."""
    import user_app
    from flwr.clientapp import ClientApp
    from torch.utils.data import DataLoader, TensorDataset

    from bayesadmm.flower import client

    app = ClientApp()

    def own(context):
        return parts[int(context.node_config["partition-id"])]

    @app.query()
    def query(message, context):
        return client.query(message, context, user_app.make_model(), own(context))

    @app.train()
    def train(message, context):
        return client.train(message, context, user_app.make_model(), own(context))

    @app.evaluate()
    def evaluate(message, context):
        return client.evaluate(message, context, user_app.make_model(), DataLoader(TensorDataset(*test), batch_size=16))

    return app


def flower_run_dir(tmp_path: Path, method: str = "ivon-admm", kind: str = "strategy", rounds: int = 2,
                   returned: list | None = None, **options) -> Path:
    """A small run directory as a Flower run writes it, in a second or two: `method` (a registry name) over
    user_app's model (``user_app.make_model()``, 67 parameters) and three clients' synthetic data, through a
    LoopbackGrid, `rounds` rounds, float64, an evaluation set on the server. `kind`: "strategy" (a ServerApp of your
    own with `bayesadmm.flower.strategy`: config.json's keys under "flower-strategy") or "run-config" (the run-config
    app's ServerApp, a model named in the run config: config.json's under "flower", with flower.json beside it).
    `options`: more of `strategy`'s arguments (or, for "run-config", run config keys). Returns the run directory;
    `returned`, if given, gets the engine's Result of the run appended."""
    import torch
    import user_app
    from flwr.app import ArrayRecord

    from bayesadmm.algorithms import spec
    from bayesadmm.flower import strategy

    out = tmp_path / f"flower-{kind}-{method}"
    hparams = {**spec.get(method).example, **({"server_iterations": 20} if method == "fedlap-func" else {})}
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        parts, test = user_app.tensors(seed=3)
        if kind == "strategy":
            torch.manual_seed(7)
            model = user_app.make_model()
            s = strategy(method, model=model, rounds=rounds, seed=7, eval_samples=4, dtype="float64", eval_data=test,
                         fraction_evaluate=0.0, out=out, **{**hparams, **options})
            s.start(grid=LoopbackGrid(user_client_app(parts, test), len(parts)),
                    initial_arrays=ArrayRecord(model.state_dict()))
            result = s.result
        elif kind == "run-config":
            from bayesadmm.flower.app_config import flower_run
            from bayesadmm.flower.client_app import app as client_app
            from bayesadmm.flower.loaders import save_tensors
            from bayesadmm.flower.server_app import run_server

            data = tmp_path / f"flower-{kind}-{method}-data"
            files = {k: save_tensors(data / f"client-{k}.npz", X, y) for k, (X, y) in enumerate(parts)}
            eval_file = save_tensors(data / "test.npz", *test)
            run_config = {"model": "user_app:make_model", "algorithm": method, "clients": len(parts), "rounds": rounds,
                          "seed": 7, "eval-samples": 4, "dtype": "float64", "eval-data": str(eval_file),
                          "out": str(out), "hparams": " ".join(f"{k}={json.dumps(v)}" for k, v in hparams.items()),
                          "discovery-timeout": 5.0, **options}
            configs = {k: {"partition-id": k, "data": str(f)} for k, f in files.items()}
            result = run_server(LocalDataGrid(client_app, configs, files, [eval_file]), flower_run(run_config))
        else:
            raise ValueError(f"kind={kind!r}: strategy or run-config")
    finally:
        torch.set_default_dtype(saved)
    if returned is not None:
        returned.append(result)
    return out
