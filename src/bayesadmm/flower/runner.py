"""`FlowerClients`: the engine's `ClientRunner` whose clients are SuperNodes, reached through a Flower `Grid`.

The engine's loop (`run_federation`) chooses the participants, broadcasts, updates the server, evaluates and
checkpoints; this runner only carries a round's messages. Per round, each chosen client's node gets a train Message
(the broadcast, the setup, the round, and the version of the client state the server expects it to hold); the reply
carries the algorithm's Message, the info scalars, and the client's new state.

Client states: a node keeps its client's state between rounds (its Context.state), and the server keeps a copy of
every state from the replies, which is what checkpoint.pt records (the same record as a local run's). So a node
that lost its state (a restarted SuperNode, a new `flwr run` after a resume) or holds a different one (it trained a
round whose reply came too late) is sent the server's copy with its next train message: the server sends the state
whenever it does not know that node to hold the version it expects, and a node whose version differs asks for it.

Absent clients (no reply in time, an error reply, no node) are left out of the round's replies and logged; a client
that missed a round is not waited for again until it answers. Nodes that connect later are asked which client they
hold at the start of every round, and take it if no node holds it yet.

Claims (`claim`): a client is bound to the first node that claims it and is never moved, so a client's state is
sent only to that node. A second node claiming a held client is refused and logged, and the run goes on. A
restarted SuperNode keeps its node id under SuperNode authentication (its key names it) and gets its state back
(it asks for it); without authentication it comes back as a new node and is refused.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, ConfigRecordValues, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid

from bayesadmm.algorithms.base import Algorithm, DivergenceError
from bayesadmm.engine.runners import checkpointed_states
from bayesadmm.flower import protocol as p
from bayesadmm.flower import records, reply_checks
from bayesadmm.flower.app_config import Timeouts

Log = Callable[..., None]


def exchange(
    grid: Grid, messages: dict[int, Message], wait_for: set[int], timeout: float, poll: float
) -> dict[int, Message]:
    """Push one message per key and pull the replies until every key in `wait_for` has answered (then take
    whatever else has arrived) or `timeout` has passed. Returns {key: reply} for the replies received,
    each from the node its message was sent to (Flower checks this too; a reply from another node is dropped)."""
    keys = list(messages)
    if not keys:
        return {}
    ids = dict(zip(grid.push_messages([messages[k] for k in keys]), keys, strict=True))
    pending = set(ids)
    replies: dict[int, Message] = {}
    deadline = time.monotonic() + timeout
    waited_out = False
    while pending:
        for reply in grid.pull_messages(list(pending)):
            message_id = reply.metadata.reply_to_message_id
            if message_id not in pending:
                continue
            pending.discard(message_id)
            if reply.metadata.src_node_id == messages[ids[message_id]].metadata.dst_node_id:
                replies[ids[message_id]] = reply  # a reply from another node than the one asked is dropped
        if not pending or waited_out or time.monotonic() >= deadline:
            break
        if wait_for <= set(replies):
            waited_out = True  # one more pull for replies already on their way, then stop
            continue
        time.sleep(poll)
    return replies


def query(
    grid: Grid, node_ids: list[int], setup: str, timeout: float, poll: float, log: Log
) -> dict[int, tuple[int, int, int]]:
    """Ask nodes which client they hold: {node id: (client id, number of examples, number of clients the node's
    num-partitions says, 0 where it says none)} of those that answered."""
    content = RecordDict({"config": ConfigRecord({p.SETUP: setup})})
    messages = {n: Message(content, n, MessageType.QUERY, group_id="discovery") for n in node_ids}
    found = {}
    for node_id, reply in exchange(grid, messages, set(node_ids), timeout, poll).items():
        if reply.has_error():
            log(f"node {node_id} cannot take part: {reply.error.reason}", WARNING)
            continue
        try:  # an answer is data from another machine: one that does not decode is refused, and the run goes on
            found[node_id] = _holding(reply)
        except (records.RecordError, KeyError) as exc:
            why = f"it has no {exc}" if isinstance(exc, KeyError) else str(exc)
            log(f"node {node_id} cannot take part: its answer is refused: {why}", WARNING)
    return found


def _holding(reply: Message) -> tuple[int, int, int]:
    """(client id, number of examples, number of clients or 0) of a node's answer to a query, each checked."""
    metrics = records.get_record(reply.content, "metrics", MetricRecord)
    k, size = records.int_entry(metrics, p.PARTITION_ID), records.int_entry(metrics, p.NUM_EXAMPLES)
    total = records.int_entry(metrics, p.NUM_PARTITIONS) if p.NUM_PARTITIONS in metrics else 0
    if k < 0 or size < 1 or total < 0 or (total and k >= total):
        raise records.RecordError(f"{p.PARTITION_ID}={k}, {p.NUM_EXAMPLES}={size}, {p.NUM_PARTITIONS}={total}")
    return k, size, total


def discover(
    grid: Grid, setup: str, clients: int | None, timeouts: Timeouts, log: Log
) -> tuple[dict[int, int], dict[int, int], set[int]]:
    """({client: node}, {client: number of examples}, node ids asked): ask every connected SuperNode which client it
    holds, until `clients` are known (None: as many as the nodes' num-partitions says) or the discovery timeout
    passes."""
    deadline = time.monotonic() + timeouts.discovery
    nodes: dict[int, int] = {}
    sizes: dict[int, int] = {}
    asked: set[int] = set()
    while (clients is None or len(nodes) < clients) and time.monotonic() < deadline:
        fresh = [n for n in grid.get_node_ids() if n not in asked]
        if not fresh:
            time.sleep(min(1.0, max(timeouts.poll, 0.01)))
            continue
        answers = query(grid, fresh, setup, max(1.0, deadline - time.monotonic()), timeouts.poll, log)
        asked.update(fresh)
        for node_id, (k, size, total) in answers.items():
            clients = clients or total or None
            if clients is not None and k >= clients:
                log(f"node {node_id} claims client {k}, but the run has {clients} clients: refused", WARNING)
                continue
            if claim(nodes, k, node_id, log):
                sizes[k] = size
    return dict(sorted(nodes.items())), dict(sorted(sizes.items())), asked


def claim(nodes: dict[int, int], k: int, node_id: int, log: Log, round_: int | None = None) -> bool:
    """Bind client `k` to `node_id` if no node holds it yet (`nodes`: client → node, updated); True if it is now
    that node's. A client is bound to the first node that claims it and never moved: a second node claiming it
    (a misconfigured or rogue SuperNode) is refused and logged, and the run goes on with the first. With SuperNode
    authentication (docs/deploy.md) only registered nodes can claim, and a restarted SuperNode keeps its node id (its
    key names it), so it is the same holder."""
    holder = nodes.setdefault(k, node_id)
    if holder != node_id:
        when = f"round {round_}: " if round_ is not None else ""
        log(
            f"{when}node {node_id} also claims client {k}, held by node {holder}: refused (a client stays with the "
            f'first node that claims it; give each SuperNode its own --node-config "{p.PARTITION_ID}=K")',
            WARNING,
        )
    return holder == node_id


class FlowerClients:
    """The clients of a run on SuperNodes (`nodes`: client id → node id, from `discover`). See the module's doc."""

    def __init__(
        self,
        grid: Grid,
        algorithm: Algorithm,
        ids: Sequence[int],
        nodes: Mapping[int, int],
        asked: set[int],
        setup: str,
        sizes: Mapping[int, int],
        timeouts: Timeouts,
        log: Log,
        device: str,
    ):
        self.grid, self.algorithm, self.ids = grid, algorithm, list(ids)
        self.nodes, self.asked = dict(nodes), set(asked)
        self.setup, self.sizes = setup, json.dumps({str(k): n for k, n in sizes.items()})
        self.timeouts, self.log, self.device = timeouts, log, device
        self._states: dict[int, Any] = {}
        self._versions: dict[int, str] = {}
        self._held: dict[int, tuple[int, str]] = {}  # client → (node, version) the server knows that node holds
        self._lost: set[int] = set()
        self._reference = reply_checks.Reference()  # the layouts of the replies accepted so far (`reply_checks`)
        self._offline: set[int] = set()  # lost clients whose node the SuperLink said was gone
        self._run = uuid.uuid4().hex[:8]  # versions of this server process differ from any a node kept before
        self.last_info: dict[int, dict[str, float]] = {}
        self._connected: set[int] = set()  # the nodes connected when the round's messages were made
        self._arrays = ArrayRecord()  # the round's broadcast record (`outbox`)
        self._extra: dict[str, ConfigRecordValues] = {}  # the round's extra config entries (`outbox`)

    def start(self, server: Any) -> None:
        self._states = {k: self.algorithm.init_client(server, k) for k in self.ids}
        self._versions = {k: f"{self._run}:0" for k in self.ids}

    def restore(self, checkpoint: Mapping, run_dir: Path) -> None:
        self._states = checkpointed_states(checkpoint, run_dir, self.ids)
        self._versions = {k: f"{self._run}:restored" for k in self.ids}  # every node is sent its state

    def states(self) -> dict[int, Any]:
        return dict(self._states)

    def save(self, run_dir: Path, round_: int) -> dict:
        return {"clients": self.states()}

    def close(self) -> None:
        pass

    def _rejoin(self, round_: int) -> None:
        """Ask nodes that connected since the last look which client they hold; a node claiming a client no node
        holds yet takes it (`claim`: a client held by a node is never moved to another)."""
        fresh = [n for n in self.grid.get_node_ids() if n not in self.asked]
        if not fresh:
            return
        self.asked.update(fresh)
        answers = query(self.grid, fresh, self.setup, self.timeouts.round, self.timeouts.poll, self.log)
        for node_id, (k, *_) in answers.items():
            if k not in self._states:
                self.log(f"node {node_id} holds client {k}, which is not in this run; ignored", WARNING)
                continue
            if claim(self.nodes, k, node_id, self.log, round_):
                self.log(f"round {round_}: client {k} joins on node {node_id}")
                self._held.pop(k, None)
                self._lost.discard(k)  # a new node: waited for this round, as every other

    def _message(self, k: int, round_: int, arrays: ArrayRecord, with_state: bool) -> Message:
        version = self._versions[k]
        config: dict[str, ConfigRecordValues] = {
            **self._extra,
            p.SETUP: self.setup,
            p.SIZES: self.sizes,
            p.ROUND: round_,
            p.VERSION: version,
            p.NEXT_VERSION: f"{self._run}:{round_}",
        }
        content = RecordDict({"arrays": arrays, "config": ConfigRecord(config)})
        if with_state:
            records.save_state(content, self._states[k], version)
        return Message(content, self.nodes[k], MessageType.TRAIN, group_id=str(round_))

    def train(
        self, round_: int, message: Mapping, chosen: Sequence[int], on_done: Callable[[int], None] | None = None
    ) -> dict:
        """One round through the grid: `outbox`, the exchange, `inbox` (the engine's `ClientRunner.train`)."""
        messages = self.outbox(round_, message, chosen)
        wait_for = (set(messages) - self._lost) or set(messages)
        answers = exchange(self.grid, messages, wait_for, self.timeouts.round, self.timeouts.poll)
        return self.inbox(round_, chosen, answers, on_done)

    def outbox(
        self,
        round_: int,
        message: Mapping,
        chosen: Sequence[int],
        extra: Mapping[str, ConfigRecordValues] | None = None,
    ) -> dict[int, Message]:
        """The train Messages of round `round_`, {client: Message}, for the `chosen` clients a connected node holds
        (nodes that connected since the last round are asked first which client they hold). `extra`: entries added
        to each message's config (a Flower strategy's train config)."""
        self._rejoin(round_)
        self._connected = set(self.grid.get_node_ids())
        for k in sorted(k for k in self._offline if self.nodes[k] in self._connected):
            self.log(f"round {round_}: client {k} is back on node {self.nodes[k]}")
            self._offline.discard(k)
            self._lost.discard(k)  # waited for this round, as every other
        reachable = [k for k in chosen if k in self.nodes and self.nodes[k] in self._connected]
        self._arrays, self._extra = records.message_to_record(message), dict(extra or {})
        sent = {k: self._held.get(k) != (self.nodes[k], self._versions[k]) for k in reachable}
        return {k: self._message(k, round_, self._arrays, sent[k]) for k in reachable}

    @property
    def lost(self) -> set[int]:
        """The clients that missed a round and have not answered since (not waited for while others answer)."""
        return set(self._lost)

    def client_of(self, reply: Message) -> int | None:
        """The client whose node sent `reply` (None: a node that holds no client of this run)."""
        return next((k for k, node in self.nodes.items() if node == reply.metadata.src_node_id), None)

    def inbox(
        self,
        round_: int,
        chosen: Sequence[int],
        answers: dict[int, Message],
        on_done: Callable[[int], None] | None = None,
    ) -> dict:
        """The replies of round `round_` from the nodes' `answers` ({client: reply Message} to `outbox`'s
        messages): decoded, the new client states kept, absent clients logged. Nodes that hold another state than
        expected are sent theirs and asked again first. Raises `DivergenceError` for a client's breakdown."""
        again = [k for k, a in answers.items() if not a.has_error() and _metrics(a).get(p.NEED_STATE)]
        if again:  # nodes that hold another state than expected: the same round again, with the state
            self.log(f"round {round_}: clients {sorted(again)} get their state from the server")
            retry = {k: self._message(k, round_, self._arrays, True) for k in again}
            answers.update(exchange(self.grid, retry, set(again), self.timeouts.round, self.timeouts.poll))
        decoded: dict[int, tuple[dict, Any, dict[str, float]]] = {}
        refused: dict[int, str] = {}
        for k in chosen:
            if k not in answers:
                continue
            answer = answers[k]
            if answer.has_error():
                self.log(f"round {round_}: client {k} (node {self.nodes[k]}) failed: {answer.error.reason}", WARNING)
                continue
            metrics = _metrics(answer)
            if metrics.get(p.BREAKDOWN):
                raise DivergenceError(f"client {k}: {_breakdown(answer)}")
            if metrics.get(p.NEED_STATE):
                continue
            try:  # a reply is data from another machine: one that does not decode is refused, not trusted
                metrics = records.get_record(answer.content, "metrics", MetricRecord)
                reply = records.record_to_message(
                    records.get_record(answer.content, "arrays", ArrayRecord), self.device
                )
                state = records.load_state(answer.content, self.device)
                info = {key: float(records.number(v, key)) for key, v in metrics.items() if key not in p.OWN_METRICS}
            except (records.RecordError, KeyError) as exc:
                refused[k] = f"it has no record {exc}" if isinstance(exc, KeyError) else str(exc)
                continue
            decoded[k] = (reply, state, info)
        # one that decodes to what the method cannot take (arrays missing, mis-shaped, of another dtype, not finite)
        refused.update(reply_checks.refusals(decoded, self._states, self._reference))
        replies, self.last_info = {}, {}
        for k in chosen:
            if k in refused:
                self.log(f"round {round_}: client {k} (node {self.nodes[k]}) sent a reply that is refused: "
                         f"{refused[k]}", WARNING)  # fmt: skip
                continue
            if k not in decoded:
                continue
            reply, state, info = decoded[k]
            self._reference.accepted(k, reply)
            replies[k], self._states[k] = reply, state
            self._versions[k] = f"{self._run}:{round_}"
            self._held[k] = (self.nodes[k], self._versions[k])
            self.last_info[k] = info
            if k in self._lost:
                self.log(f"round {round_}: client {k} replies again (node {self.nodes[k]})")
            if on_done is not None:
                on_done(k)
        self._log_absent(round_, chosen, replies, answers, self._connected)
        if chosen and not replies:  # (a round may choose none: client-level DP's Poisson sampling)
            why = "; ".join(f"client {k}: {refused[k]}" for k in sorted(refused)[:3])
            raise RuntimeError(
                f"round {round_}: no client replied " + (f"validly ({why})" if why else "(flower.log says why)")
            )
        if len(replies) < len(chosen):
            self.log(f"round {round_}: server update with the {len(replies)} replies of clients {sorted(replies)}")
        return replies

    def _log_absent(self, round_: int, chosen, replies, answers, connected) -> None:
        absent = [k for k in chosen if k not in replies]
        for k in absent:
            if k not in self.nodes:
                why = "no SuperNode holds it"
            elif self.nodes[k] not in connected:
                why = f"node {self.nodes[k]} is no longer connected to the SuperLink"
                self._offline.add(k)
            elif k in answers:
                why = "Flower returned the error above instead of its reply, or its reply was refused"
            elif k in self._lost:
                why = f"node {self.nodes[k]} has not answered since an earlier round (not waited for)"
            else:
                why = f"node {self.nodes[k]} did not answer within {self.timeouts.round:g} s"
            self.log(f"round {round_}: client {k} did not reply ({why})", WARNING)
            self._held.pop(k, None)  # its node may have trained and kept a state the server did not get
        self._lost = (self._lost | set(absent)) - set(replies)


def _metrics(message: Message) -> MetricRecord:
    """The reply's metrics record; an empty one where it has none or another kind of record (its decoding, in
    `FlowerClients.inbox`, then refuses it)."""
    found = message.content.get("metrics")
    return found if isinstance(found, MetricRecord) else MetricRecord()


def _breakdown(message: Message) -> str:
    """What a node reports of its client update's numerical breakdown (its config's "error")."""
    config = message.content.get("config")
    error = config.get("error") if isinstance(config, ConfigRecord) else None
    return error if isinstance(error, str) else "a numerical breakdown of its update"


__all__ = ["FlowerClients", "claim", "discover", "exchange", "query", "INFO"]
