"""The Flower ClientApp: one SuperNode is one client of the local engine, and runs that client's `client_update`.

Identity: the node's `--node-config` carries ``partition-id`` (and ``num-partitions``, checked against the run's
``clients``); partition k here is client k of `bayesadmm run`, with the same data, because the node builds it with
the engine's own deterministic `build` from the run configuration the server sends with every message, and draws
its randomness from the engine's `generator_for(seed, round, k)`. So a Flower run reproduces a local run.

State: the algorithm's per-client state (duals, local posteriors, ...) lives in the node's ``Context.state``
between rounds, converted losslessly by `records`; a node without one starts from
``init_client(init_server(theta0), k)``, exactly as the engine does.

Messages handled:
* ``query``: the node says which partition it holds (the server's discovery step);
* ``train``: one `client_update`; the reply carries the algorithm's Message in ``"arrays"``, and
  ``"num-examples"``, ``"partition-id"`` and the numeric entries of the update's info dict in ``"metrics"``.
A numerical breakdown of the local solve (the engine's `BREAKDOWNS`) is reported in the reply, so the server can
stop the run as "diverged" just as the engine does; any other exception becomes a Flower error reply.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from bayesadmm.algorithms import Algorithm
from bayesadmm.engine.loop import BREAKDOWNS
from bayesadmm.engine.simulate import generator_for
from bayesadmm.engine.workers import one_thread
from bayesadmm.experiments.build import Built, build
from bayesadmm.experiments.config import RunConfig
from bayesadmm.flower import records

# Keys of the records the server and the clients exchange (besides Flower's "arrays", "config", "metrics").
RUN_CONFIG, ROUND, DTYPE = "run-config", "server-round", "dtype"
PARTITION_ID, NUM_PARTITIONS, DATA_DIR = "partition-id", "num-partitions", "data-dir"
BREAKDOWN = "breakdown"

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
# a process that serves several rounds builds once
_experiments: dict[tuple[str, str, str], tuple[Built, Algorithm]] = {}


def partition_of(context: Context, config: RunConfig) -> int:
    """The client id this node plays, from its node config; a clear error if it is missing or out of range."""
    node_config = context.node_config
    if PARTITION_ID not in node_config:
        raise ValueError(
            f"SuperNode {context.node_id} has no '{PARTITION_ID}' in its node config; start it with "
            f'--node-config "{PARTITION_ID}=K {NUM_PARTITIONS}={config.clients}"'
        )
    k = int(node_config[PARTITION_ID])
    total = int(node_config.get(NUM_PARTITIONS, config.clients))
    if total != config.clients:
        raise ValueError(
            f"SuperNode {context.node_id}: {NUM_PARTITIONS}={total} but the run has clients={config.clients}"
        )
    if not 0 <= k < config.clients:
        raise ValueError(f"SuperNode {context.node_id}: {PARTITION_ID}={k} is not in 0..{config.clients - 1}")
    return k


def experiment_for(config: RunConfig, dtype: str, data_dir: str = "") -> tuple[Built, Algorithm]:
    """The engine's `build` for this config (data, split, model, algorithm), cached per process."""
    if data_dir:
        config = RunConfig(**{**config.to_json(), "data_dir": data_dir})
    key = (records.config_to_json(config), dtype, data_dir)
    if key not in _experiments:
        _experiments.clear()
        with default_dtype(dtype):
            built = build(config)
            _experiments[key] = (built, built.algorithm())
    return _experiments[key]


@contextlib.contextmanager
def default_dtype(name: str):
    """Compute in the server's default dtype (the engine's precision follows torch's default), then restore it."""
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; valid: {', '.join(_DTYPES)}")
    old = torch.get_default_dtype()
    torch.set_default_dtype(_DTYPES[name])
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _run_config(message: Message) -> tuple[RunConfig, ConfigRecord]:
    if "config" not in message.content or RUN_CONFIG not in message.content["config"]:
        raise ValueError("message has no 'config' record with the run configuration; is the ServerApp bayesadmm's?")
    config_record = records.get_record(message.content, "config", ConfigRecord)
    return records.config_from_json(records.str_entry(config_record, RUN_CONFIG)), config_record


def _data_dir(context: Context) -> str:
    return str(context.node_config.get(DATA_DIR, "") or os.environ.get("BAYESADMM_DATA", "") or "")


def handle_query(message: Message, context: Context) -> Message:
    """Which client this node is (and that its node config fits the run)."""
    config, _ = _run_config(message)
    k = partition_of(context, config)
    return Message(
        RecordDict({"metrics": MetricRecord({PARTITION_ID: k, NUM_PARTITIONS: config.clients})}), reply_to=message
    )


def handle_train(message: Message, context: Context) -> Message:
    """One round of this client: the algorithm's `client_update`, with the state kept in Context.state."""
    config, config_record = _run_config(message)
    k = partition_of(context, config)
    round_ = records.int_entry(config_record, ROUND)
    dtype = str(config_record.get(DTYPE, "float32"))
    built, algorithm = experiment_for(config, dtype, _data_dir(context))
    data = built.federation.clients(k)
    metrics: dict[str, Any] = {PARTITION_ID: k, "num-examples": int(data.num_examples), "server-round": round_}
    content = RecordDict()
    with default_dtype(dtype):
        device = torch.device(config.device)  # records hold numpy arrays: back onto the run's device
        theta0 = built.federation.theta0.to(device)
        state = records.load_state(context.state, device)
        if state is None:
            state = algorithm.init_client(algorithm.init_server(theta0), k)
        broadcast = records.record_to_message(records.get_record(message.content, "arrays", ArrayRecord), device)
        try:
            with one_thread():  # as the local engine runs every client update, so the numbers are the same
                state, reply, info = algorithm.client_update(
                    state, broadcast, data, generator_for(config.seed, round_, k)
                )
        except BREAKDOWNS as exc:
            metrics[BREAKDOWN] = 1
            content["config"] = ConfigRecord({"error": f"{type(exc).__name__}: {exc}"})
            content["metrics"] = MetricRecord(metrics)
            content["arrays"] = ArrayRecord()
            return Message(content, reply_to=message)
        records.save_state(context.state, state)
    metrics.update({key: value for key, value in records.numeric_metrics(info).items() if key not in metrics})
    content["arrays"] = records.message_to_record(reply)
    content["metrics"] = MetricRecord(metrics)
    return Message(content, reply_to=message)


def make_client_app() -> ClientApp:
    app = ClientApp()
    app.query()(handle_query)
    app.train()(handle_train)
    return app


app = make_client_app()
