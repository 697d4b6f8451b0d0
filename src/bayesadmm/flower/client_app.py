"""The Flower ClientApp: one SuperNode is one client, and runs that client's `client_update` on its own data.

Identity and data come from the node's ``--node-config``: ``partition-id=K`` (the client id; ``num-partitions``,
if given, is checked against the run's clients), and ``data=PATH`` or ``loader=module:function`` (`loaders`).
The model, likelihood and algorithm come from the setup the server sends with every message (`app_config`), so a
node needs no configuration of the run. The update is the engine's own `train_client` (one torch thread, the
generator of (seed, round, client)), so a Flower run gives a local run's numbers.

State: the client's state lives in the node's ``Context.state`` between rounds, with the version the server named;
if the server expects another version (the node restarted, or a reply of it was lost) and sent none, the node
answers ``need-state`` and the server sends its copy (`runner`).

Messages handled:
* ``query``: which client this node holds and how many examples it has (the server's discovery);
* ``train``: one `client_update`; the reply carries the algorithm's Message in ``"arrays"``, the new client state,
  and ``"num-examples"``, ``"partition-id"`` and the numeric entries of the update's info in ``"metrics"``.
A numerical breakdown of the local solve (the engine's `BREAKDOWNS`) is reported in the reply, so the server stops
the run as "diverged" just as the engine does; any other exception becomes a Flower error reply.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from bayesadmm.algorithms import Algorithm
from bayesadmm.clients import ClientData, SupervisedData
from bayesadmm.engine.federation import BREAKDOWNS, EVALUATION
from bayesadmm.engine.runners import train_client
from bayesadmm.engine.settings import DTYPES
from bayesadmm.engine.simulate import generator_of
from bayesadmm.evaluation.metrics import evaluate
from bayesadmm.flower import protocol as p
from bayesadmm.flower import records
from bayesadmm.flower.app_config import algorithm_of, likelihood_of, model_of
from bayesadmm.flower.bayes_strategy import SERVER_ARRAYS, SERVER_TREE
from bayesadmm.flower.loaders import node_data, preset_slice
from bayesadmm.privacy import DPSettings
from bayesadmm.privacy.example_level import example_private

# a node process that serves several rounds builds its objects once (keys: the setup and its node config)
_data: dict[tuple[str, str, int], ClientData] = {}
_algorithms: dict[tuple[str, str], Algorithm] = {}


def _dtype(setup: Mapping[str, Any]) -> torch.dtype:
    """The run's precision, which the server's setup names ("dtype"): what the node's data is checked and cast in."""
    name = setup.get("dtype", "float32")
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; valid: {', '.join(DTYPES)}")
    return DTYPES[name]


def partition_of(context: Context, clients: int | None) -> int:
    """The client id this node plays, from its node config; a clear error if it is missing or out of range (of
    `clients`, or, where the run leaves the number to the nodes (None), of the node's num-partitions)."""
    node_config = context.node_config
    if p.PARTITION_ID not in node_config:
        raise ValueError(
            f"SuperNode {context.node_id} has no '{p.PARTITION_ID}' in its node config; start it with "
            f'--node-config "{p.PARTITION_ID}=K data=PATH"'
        )
    k = int(node_config[p.PARTITION_ID])
    total = int(node_config.get(p.NUM_PARTITIONS, clients or k + 1))
    clients = clients or total
    if total != clients:
        raise ValueError(f"SuperNode {context.node_id}: {p.NUM_PARTITIONS}={total} but the run has clients={clients}")
    if not 0 <= k < clients:
        raise ValueError(f"SuperNode {context.node_id}: {p.PARTITION_ID}={k} is not in 0..{clients - 1}")
    return k


def _setup(message: Message) -> tuple[str, dict, ConfigRecord]:
    if "config" not in message.content or p.SETUP not in message.content["config"]:
        raise ValueError("message has no 'config' record with the run's setup; is the ServerApp bayesadmm's?")
    config = records.get_record(message.content, "config", ConfigRecord)
    text = records.str_entry(config, p.SETUP)
    return text, json.loads(text), config


def client_data(text: str, setup: Mapping[str, Any], node_config: Mapping[str, Any], k: int) -> ClientData:
    """This node's data: its own file or loader; in a preset run without either, its slice of the preset."""
    key = (text, json.dumps(dict(node_config), sort_keys=True, default=str), k)
    if key not in _data:
        _data.clear()
        if "preset" in setup:
            data = None
            if node_config.get("data") or node_config.get("loader"):
                model, _ = model_of(setup)  # the preset's model, from the arguments the server sent
                data = node_data(node_config, model, likelihood_of(setup), setup["device"], k, _dtype(setup))
            if data is None:
                data_dir = str(node_config.get(p.DATA_DIR, "") or os.environ.get("BAYESADMM_DATA", "") or "")
                data = preset_slice(setup["preset"], k, data_dir)
        else:
            model, _ = model_of(setup)
            if not (node_config.get("data") or node_config.get("loader")) and setup.get("loader"):
                node_config = {**node_config, "loader": setup["loader"]}  # the app's loader (a simulation's nodes)
            data = node_data(node_config, model, likelihood_of(setup), setup["device"], k, _dtype(setup))
            if data is None:
                raise ValueError(
                    "this SuperNode has no data: start it with --node-config "
                    f'"{p.PARTITION_ID}={k} data=PATH" (a .npz/.pt file of X and y) or "loader=module:function"'
                )
        _data[key] = data
    return _data[key]


def algorithm_for(text: str, setup: Mapping[str, Any], sizes: str, data: ClientData) -> Algorithm:
    """The run's algorithm, built as the server builds it (same factory, hyperparameters and client sizes)."""
    key = (text, sizes)
    if key not in _algorithms:
        _algorithms.clear()
        model = getattr(data, "model", None)
        if model is None:
            model, _ = model_of(setup)
        by_id = {int(k): int(n) for k, n in json.loads(sizes).items()}
        algorithm = algorithm_of(setup, model, by_id, getattr(data, "likelihood", None))()
        if "dp" in setup:  # example-level DP: the private solver, with the noise the server calibrated (`strategy`)
            algorithm = example_private(algorithm, DPSettings.from_json(setup["dp"]), setup["dp"]["dp_noise"], by_id)
        _algorithms[key] = algorithm
    return _algorithms[key]


# data_of(setup text, setup, node config, client id) -> the node's ClientData: `client_data` (the node config's file
# or loader, or a preset's slice), or the data a user's ClientApp passes (`bayesadmm.flower.client`)
DataOf = Callable[[str, Mapping[str, Any], Mapping[str, Any], int], ClientData]


def handle_query(message: Message, context: Context, data_of: DataOf = client_data) -> Message:
    """Which client this node holds, its number of examples and, where its node config says, the number of clients
    (num-partitions); and that its node config fits the run."""
    text, setup, _ = _setup(message)
    k = partition_of(context, setup.get("clients"))
    data = data_of(text, setup, context.node_config, k)
    metrics = MetricRecord({p.PARTITION_ID: k, p.NUM_EXAMPLES: int(data.num_examples)})
    if p.NUM_PARTITIONS in context.node_config:
        metrics[p.NUM_PARTITIONS] = int(context.node_config[p.NUM_PARTITIONS])
    return Message(RecordDict({"metrics": metrics}), reply_to=message)


def handle_train(message: Message, context: Context, data_of: DataOf = client_data) -> Message:
    """One round of this client: the algorithm's `client_update`, with the state kept in Context.state."""
    text, setup, config = _setup(message)
    k = partition_of(context, setup.get("clients"))
    round_ = records.int_entry(config, p.ROUND)
    expected, following = records.str_entry(config, p.VERSION), records.str_entry(config, p.NEXT_VERSION)
    device = torch.device(setup["device"])  # records hold numpy arrays: back onto the run's device
    metrics: dict[str, Any] = {p.PARTITION_ID: k, p.ROUND: round_}
    content = RecordDict()
    data = data_of(text, setup, context.node_config, k)
    algorithm = algorithm_for(text, setup, records.str_entry(config, p.SIZES), data)
    metrics[p.NUM_EXAMPLES] = int(data.num_examples)
    if records.state_version(message.content) is not None:
        state = records.load_state(message.content, device)
    elif records.state_version(context.state) == expected:
        state = records.load_state(context.state, device)
    else:
        content["metrics"] = MetricRecord({**metrics, p.NEED_STATE: 1})
        return Message(content, reply_to=message)
    broadcast = records.record_to_message(records.get_record(message.content, "arrays", ArrayRecord), device)
    try:
        state, reply, info = train_client(algorithm, state, broadcast, data, int(setup["seed"]), round_, k)
    except BREAKDOWNS as exc:
        metrics[p.BREAKDOWN] = 1
        content["config"] = ConfigRecord({"error": f"{type(exc).__name__}: {exc}"})
        content["metrics"] = MetricRecord(metrics)
        return Message(content, reply_to=message)
    records.save_state(context.state, state, following)
    records.save_state(content, state, following)
    metrics.update({key: value for key, value in records.numeric_metrics(info).items() if key not in metrics})
    content["arrays"] = records.message_to_record(reply)
    content["metrics"] = MetricRecord(metrics)
    return Message(content, reply_to=message)


def handle_evaluate(message: Message, context: Context, data_of: DataOf = client_data) -> Message:
    """Score the server's posterior (sent as its state by the strategy's `configure_evaluate`) on this node's data:
    at the mean and, for a distribution, the predictive; for a method with a personal posterior and a node that holds
    its client's state, that posterior too (keys ``personal_*``). The reply's metrics also hold the number of
    examples, the weight the strategy averages with."""
    text, setup, config = _setup(message)
    k = partition_of(context, setup.get("clients"))
    data = data_of(text, setup, context.node_config, k)
    if not isinstance(data, SupervisedData):
        raise ValueError("client evaluation needs the node's examples as (X, y) or a Dataset, not a ClientData object")
    algorithm = algorithm_for(text, setup, records.str_entry(config, p.SIZES), data)
    device = torch.device(setup["device"])
    server = records.records_to_tree(
        records.get_record(message.content, SERVER_ARRAYS, ArrayRecord),
        records.get_record(message.content, SERVER_TREE, ConfigRecord),
        device,
    )
    round_ = records.int_entry(config, p.ROUND)
    posteriors = {"": algorithm.posterior(server)}
    state = records.load_state(context.state, device)
    if algorithm.personal is not None and state is not None:
        posteriors["personal_"] = algorithm.personal(server, state)
    metrics: dict[str, Any] = {p.PARTITION_ID: k, p.NUM_EXAMPLES: int(data.num_examples), p.ROUND: round_}
    samples = int(setup.get("eval_samples", 32))
    for prefix, posterior in posteriors.items():
        generator = generator_of(int(setup["seed"]), round_, EVALUATION, k)  # the node's own draws
        found = evaluate(data.model, posterior, data.X, data.y, samples, generator, likelihood=data.likelihood)
        metrics.update({f"{prefix}{key}": float(value) for key, value in found.items()})
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=message)


def make_client_app() -> ClientApp:
    app = ClientApp()
    app.query()(handle_query)
    app.train()(handle_train)
    app.evaluate()(handle_evaluate)
    return app


app = make_client_app()
