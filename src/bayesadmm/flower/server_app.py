"""The Flower ServerApp: one generic strategy for every registry algorithm, delegating to its server functions.

The round loop is the local engine's (`bayesadmm.engine.loop.run_federation`), with the client updates sent to
SuperNodes:

    chosen  = participants(ids, participation, seed, round)      # the engine's seeded choice
    message = algorithm.broadcast(server)                        # -> "arrays" of a train Message per chosen node
    replies = {k: reply_k for the nodes that answered in time}   # <- "arrays" of each reply
    server  = algorithm.server_update(server, replies)
    evaluate(posterior(server)) -> the engine's metrics line

Nothing here knows an algorithm's maths. Clients that do not reply (a SuperNode died, a ClientApp failed) are left
out of `replies`, logged, and named in the round's metrics line (``absent_clients``); the algorithms that need
absent clients' last messages keep them themselves (`merge_replies` in their `server_update`), just as under
partial participation. A client that missed a round is not waited for again (so one dead node costs one timeout,
not one per round) until it answers again.

The run directory is written like a local run's: config.json, partition.json, metrics.jsonl (the engine's
`metrics_line`, with the server's info scalars as `server_*` and the means of the replying clients' as `client_*`),
status.json, curves.png, plus flower.log (what happened to which node, per round). There is no checkpoint.pt: the
client states live on the SuperNodes, so `bayesadmm resume` does not apply.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import time
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log as flwr_log
from flwr.serverapp import Grid, ServerApp

from bayesadmm.engine.loop import (
    BREAKDOWNS,
    EVALUATION,
    EXIT_DIVERGED,
    EXIT_FAILED,
    EXIT_OK,
    _mean_client_info,
    info_scalars,
    metrics_line,
    participants,
)
from bayesadmm.engine.provenance import record_environment
from bayesadmm.engine.simulate import generator_for
from bayesadmm.experiments.build import build
from bayesadmm.experiments.config import RunConfig, resolve
from bayesadmm.flower import records
from bayesadmm.flower.client_app import BREAKDOWN, DTYPE, NUM_PARTITIONS, PARTITION_ID, ROUND, RUN_CONFIG
from bayesadmm.metrics import evaluate

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}


@dataclass(frozen=True)
class Timeouts:
    """Bounds on every wait, so a run with dead nodes still ends. Seconds."""

    discovery: float = 120.0  # for all `clients` SuperNodes to connect and say which partition they hold
    round: float = 600.0  # for the replies of one round
    poll: float = 0.1  # between two pulls of replies


def config_from_run_config(run_config: dict) -> tuple[RunConfig, Timeouts]:
    """The RunConfig of a `flwr run`: ``scenario`` plus ``overrides`` ("key=value key=value", as `bayesadmm run`),
    plus ``out`` and the timeouts; an error lists what is wrong just as `bayesadmm run` does."""
    scenario = str(run_config.get("scenario", "fmnist-heterog10"))
    overrides = shlex.split(str(run_config.get("overrides", "")))
    if run_config.get("out"):
        overrides.append(f"out={run_config['out']}")
    config, _ = resolve(scenario, overrides)
    timeouts = Timeouts(
        discovery=float(run_config.get("discovery-timeout", Timeouts.discovery)),
        round=float(run_config.get("round-timeout", Timeouts.round)),
    )
    return config, timeouts


class RunLog:
    """flower.log in the run directory, mirrored to Flower's logger (the SuperLink's log / `flwr log`)."""

    def __init__(self, path: Path):
        self.path = path
        path.write_text("")

    def __call__(self, text: str, level: int = INFO) -> None:
        flwr_log(level, "bayesadmm: %s", text)
        with self.path.open("a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")


def _write_json(path: Path, payload) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)


def _config_record(config: RunConfig, round_: int, dtype: str) -> ConfigRecord:
    return ConfigRecord({RUN_CONFIG: records.config_to_json(config), ROUND: round_, DTYPE: dtype})


def exchange(
    grid: Grid, messages: dict[int, Message], wait_for: set[int], timeout: float, poll: float
) -> dict[int, Message]:
    """Push one message per client and pull the replies until every client in `wait_for` has answered (then take
    whatever else has arrived) or `timeout` has passed. Returns {client: reply} for the replies received."""
    keys = list(messages)
    ids = dict(zip(grid.push_messages([messages[k] for k in keys]), keys, strict=True))
    pending = set(ids)
    replies: dict[int, Message] = {}
    deadline = time.monotonic() + timeout
    waited_out = False
    while pending:
        for reply in grid.pull_messages(list(pending)):
            message_id = reply.metadata.reply_to_message_id
            if message_id in pending:
                pending.discard(message_id)
                replies[ids[message_id]] = reply
        if not pending or waited_out or time.monotonic() >= deadline:
            break
        if wait_for <= set(replies):
            waited_out = True  # one more pull for replies already on their way, then stop
            continue
        time.sleep(poll)
    return replies


def discover(grid: Grid, config: RunConfig, dtype: str, timeouts: Timeouts, log: RunLog) -> dict[int, int]:
    """{client id: node id}: ask every connected SuperNode which partition it holds, until all `clients` are
    known or the discovery timeout passes (then the run goes on with the ones that are known, if any)."""
    deadline = time.monotonic() + timeouts.discovery
    nodes: dict[int, int] = {}
    asked: set[int] = set()
    while len(nodes) < config.clients and time.monotonic() < deadline:
        fresh = [n for n in grid.get_node_ids() if n not in asked]
        if not fresh:
            time.sleep(min(1.0, max(timeouts.poll, 0.01)))
            continue
        content = RecordDict({"config": _config_record(config, 0, dtype)})
        messages = {n: Message(content, n, MessageType.QUERY, group_id="discovery") for n in fresh}
        answers = exchange(grid, messages, set(fresh), max(1.0, deadline - time.monotonic()), timeouts.poll)
        asked.update(fresh)
        for node_id, reply in answers.items():
            if reply.has_error():
                log(f"node {node_id} cannot take part: {reply.error.reason}", WARNING)
                continue
            k = records.int_entry(records.get_record(reply.content, "metrics", MetricRecord), PARTITION_ID)
            if k in nodes:
                raise RuntimeError(
                    f"nodes {nodes[k]} and {node_id} both hold partition {k}; give each SuperNode "
                    f'its own --node-config "{PARTITION_ID}=K {NUM_PARTITIONS}={config.clients}"'
                )
            nodes[k] = node_id
    missing = sorted(set(range(config.clients)) - set(nodes))
    if missing:
        log(f"after {timeouts.discovery:g} s no SuperNode holds client(s) {missing}; running without them", WARNING)
    return dict(sorted(nodes.items()))


def run_server(grid: Grid, config: RunConfig, timeouts: Timeouts = Timeouts()) -> int:
    """The federated run on a Flower grid; writes the run directory; returns the engine's exit code."""
    from bayesadmm.reports import try_plot_run

    run_dir = config.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    log = RunLog(run_dir / "flower.log")
    dtype = _DTYPE_NAMES.get(torch.get_default_dtype())
    if dtype is None:
        raise ValueError(f"unsupported default dtype {torch.get_default_dtype()}; use float32 or float64")
    experiment = build(config)
    federation = experiment.federation
    algorithm = experiment.algorithm()
    theta0 = federation.theta0.to(config.device)
    _write_json(run_dir / "config.json", config.to_json())
    _write_json(run_dir / "partition.json", {"clients": [idx.tolist() for idx in experiment.parts]})
    record_environment(run_dir, config.device, 0)  # the server's code and processor (nodes may differ)
    metrics_path, status_path = run_dir / "metrics.jsonl", run_dir / "status.json"
    metrics_path.write_text("")
    _write_json(status_path, {"status": "running", "round": 0})
    log(f"{config.method} on {config.scenario}: {config.clients} clients, {config.rounds} rounds -> {run_dir}")

    nodes = discover(grid, config, dtype, timeouts, log)
    log("clients -> nodes: " + ", ".join(f"{k} -> {n}" for k, n in nodes.items()))
    server = algorithm.init_server(theta0)
    history: list[dict] = []
    lost: set[int] = set()
    status, code = {"status": "completed", "round": config.rounds}, EXIT_OK
    for round_ in range(1, config.rounds + 1):
        began = time.perf_counter()
        chosen = participants(list(range(config.clients)), config.participation, config.seed, round_)
        connected = set(grid.get_node_ids())
        reachable = [k for k in chosen if k in nodes and nodes[k] in connected]
        content = RecordDict(
            {
                "arrays": records.message_to_record(algorithm.broadcast(server)),
                "config": _config_record(config, round_, dtype),
            }
        )
        messages = {k: Message(content, nodes[k], MessageType.TRAIN, group_id=str(round_)) for k in reachable}
        wait_for = (set(reachable) - lost) or set(reachable)
        answers = exchange(grid, messages, wait_for, timeouts.round, timeouts.poll)
        replies, client_info, breakdown = {}, {}, None
        for k in sorted(answers):
            answer = answers[k]
            if answer.has_error():
                log(f"round {round_}: client {k} (node {nodes[k]}) failed: {answer.error.reason}", WARNING)
                continue
            metrics = records.get_record(answer.content, "metrics", MetricRecord)
            if metrics.get(BREAKDOWN):
                error = records.str_entry(records.get_record(answer.content, "config", ConfigRecord), "error")
                breakdown = f"round {round_}: client {k}: {error}"
                continue
            replies[k] = records.record_to_message(
                records.get_record(answer.content, "arrays", ArrayRecord), theta0.device
            )
            client_info[k] = {
                key: float(records.number(value, key))
                for key, value in metrics.items()
                if key not in (PARTITION_ID, "num-examples", "server-round")
            }
        absent = sorted(set(chosen) - set(replies))
        for k in absent:
            if k not in nodes:
                why = "no SuperNode holds it"
            elif nodes[k] not in connected:
                why = f"node {nodes[k]} is no longer connected to the SuperLink"
            elif k in answers:
                why = "Flower returned the error above instead of its reply"
            elif k in lost:
                why = f"node {nodes[k]} has not answered since an earlier round (not waited for)"
            else:
                why = f"node {nodes[k]} did not answer within {timeouts.round:g} s"
            log(f"round {round_}: client {k} did not reply ({why})", WARNING)
        lost = (lost | set(absent)) - set(replies)
        if breakdown is not None:
            status, code = {"status": "diverged", "round": round_ - 1, "message": breakdown}, EXIT_DIVERGED
            break
        if not replies:
            status, code = (
                {"status": "failed", "round": round_ - 1, "message": f"round {round_}: no client replied"},
                EXIT_FAILED,
            )
            break
        if absent:
            log(f"round {round_}: server update with the {len(replies)} replies of clients {sorted(replies)}")
        try:
            server, server_info = algorithm.server_update(server, replies)
        except BREAKDOWNS as exc:
            status, code = (
                {"status": "diverged", "round": round_ - 1, "message": f"round {round_}: {exc}"},
                EXIT_DIVERGED,
            )
            break
        seconds = time.perf_counter() - began
        began = time.perf_counter()
        results = evaluate(
            federation.model,
            algorithm.posterior(server),
            federation.eval_X,
            federation.eval_y,
            samples=config.eval_samples,
            generator=generator_for(config.seed, round_, EVALUATION),
            likelihood=federation.likelihood,
            extra=federation.metrics,
        )
        line = metrics_line(round_, results, seconds, time.perf_counter() - began, len(replies), federation.eval_set)
        if absent:
            line["absent_clients"] = absent
        if not all(math.isfinite(v) for v in results.values()):
            status, code = (
                {
                    "status": "diverged",
                    "round": round_ - 1,
                    "message": f"round {round_}: non-finite {federation.eval_set} metrics {results}",
                },
                EXIT_DIVERGED,
            )
            break
        # the algorithm's info scalars, as the local engine's metrics line carries them
        line.update({f"server_{k}": v for k, v in info_scalars(server_info).items()})
        line.update(_mean_client_info(client_info))
        with metrics_path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        history.append(line)
        _write_json(status_path, {"status": "running", "round": round_})
        acc = line.get(f"ens_{federation.eval_set}_acc", line[f"{federation.eval_set}_acc"])
        log(f"round {round_}: {len(replies)}/{len(chosen)} clients, {federation.eval_set} acc {100 * acc:.2f}%")
    if history:  # before the final status: whoever waits for it (run_demo) may stop everything once it is written
        try_plot_run(
            history, run_dir / "curves.png", title=f"{config.scenario} — {config.method} (seed {config.seed}, Flower)"
        )
    _write_json(status_path, status)
    log(f"{status['status']} after round {status['round']}" + (f": {status['message']}" if "message" in status else ""))
    return code


def make_server_app(config: RunConfig | None = None, timeouts: Timeouts | None = None) -> ServerApp:
    """A ServerApp for `config`, or (config=None) for the run config of `flwr run` (scenario, overrides, out)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        if config is None:
            run_config, run_timeouts = config_from_run_config(dict(context.run_config))
        else:
            run_config, run_timeouts = config, timeouts or Timeouts()
        code = run_server(grid, run_config, run_timeouts)
        if code != EXIT_OK:
            status = json.loads((run_config.run_dir() / "status.json").read_text())
            raise RuntimeError(f"run {status['status']}: {status.get('message', '')}")

    return app


app = make_server_app()
