"""Every bayesadmm method as a Flower strategy (Message API): `strategy("ivon-admm", model=Net(), ...)` is a
`flwr.serverapp.strategy.Strategy` that a ServerApp starts as it starts Flower's `FedAvg`:

    @app.main()
    def main(grid, context):
        strategy = bayesadmm.flower.strategy_from_config(context.run_config, model=Net())
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=3)

and whose ClientApp answers with `bayesadmm.flower.client`'s `query`, `train` and `evaluate` on the node's own model
and data. The rounds are the engine's (`engine.run.Run`): `configure_train` is the first half of a round (the seeded
participants, the broadcast, one train Message per participant through `runner.FlowerClients`, which also carries the
client states), `aggregate_train` the second (replies decoded, server update, metrics line, checkpoint), so a run
through the strategy writes the run directory a local run writes (metrics.jsonl, checkpoint.pt, status.json,
posterior.safetensors) and gives its numbers; `resume=True` continues it from its checkpoint (the rounds already done
are skipped). The preset ServerApp (`server_app`) is this strategy over a preset's federation.

Evaluation: where the strategy has an evaluation set (`eval_data`), every round's metrics line scores the posterior
on it, as locally; `configure_evaluate` sends the server state to a `fraction_evaluate` share of the nodes, whose
`client.evaluate` scores the global posterior (mean and predictive) and, for methods with one, the client's personal
posterior on the node's own data; `aggregate_evaluate` averages them weighted by examples (client-evaluation.jsonl).

Flower's strategy wrappers that change the aggregated arrays (the central-DP wrappers `DifferentialPrivacy*`) do not
apply: the server state of these methods is not the arrays Flower passes around (a posterior's natural parameters,
duals, sites), so noise added to the arrays would never reach it. `configure_train` refuses arrays other than those
it returned (use the library's own DP settings instead).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import Tensor

from bayesadmm.engine.federation import BREAKDOWNS, Federation
from bayesadmm.engine.history import append_line
from bayesadmm.engine.run import Run
from bayesadmm.engine.rundir import locked, prepare_fresh
from bayesadmm.engine.settings import Settings
from bayesadmm.flower import protocol as p
from bayesadmm.flower import records
from bayesadmm.flower.app_config import Timeouts
from bayesadmm.flower.runlog import RunLog
from bayesadmm.flower.runner import FlowerClients, discover, exchange
from bayesadmm.privacy import BudgetExhausted

SERVER_ARRAYS, SERVER_TREE = "bayesadmm.server-state", "bayesadmm.server-state.tree"
CLIENT_EVALUATION = "client-evaluation.jsonl"

# federation_of(sizes, initial): the run's Federation once the clients' sizes are known (initial: the model's named
# initial parameters that Flower's initial_arrays give, or None)
FederationOf = Callable[[Mapping[int, int], Mapping[str, Tensor] | None], Federation]


class BayesStrategy(Strategy):
    """A bayesadmm method as a Flower strategy (see the module's doc). Built by `strategy` (a model of your own) or
    `server_app` (a preset); `setup` is what the nodes build the model, likelihood and algorithm from."""

    def __init__(
        self,
        federation_of: FederationOf,
        setup: dict[str, Any],
        settings: Settings,
        run_dir: Path | str,
        *,
        config: Mapping[str, Any] | Callable[[Mapping[int, int]], Mapping[str, Any]] | None = None,
        clients: int | None = None,
        fraction_evaluate: float = 1.0,
        timeouts: Timeouts | None = None,
        resume: bool = False,
        overwrite: bool = False,
        title: str = "",
        on_start: Callable[[Path], None] | None = None,
        on_round: Callable[[dict], None] | None = None,
    ):
        super().__init__()
        if not 0.0 <= fraction_evaluate <= 1.0:
            raise ValueError(f"fraction_evaluate={fraction_evaluate} must be in [0, 1] (0: no client evaluation)")
        self.federation_of, self.setup, self.settings = federation_of, setup, settings
        self.run_dir, self.config, self.clients_expected = Path(run_dir), config, clients
        self.fraction_evaluate, self.timeouts = fraction_evaluate, timeouts or Timeouts()
        self.resume, self.overwrite = resume, overwrite
        self.title, self.on_start, self.on_round = title, on_start, on_round
        self.run: Run | None = None
        self.clients: FlowerClients | None = None
        self.log = RunLog(self.run_dir / "flower.log")
        self._stack = contextlib.ExitStack()
        self._pending: tuple[int, list[int], float] | None = None
        self._returned: ArrayRecord | None = None  # the arrays aggregate_train returned last
        self._text = ""  # the setup as the nodes get it (JSON)
        self._result: Any = None  # the engine's Result, once the run has finished

    # ---- Flower's Strategy -------------------------------------------------------------------------------------

    def summary(self) -> None:
        what = self.setup.get("algorithm") or self.setup.get("preset", {}).get("method", "?")
        settings = self.settings
        self.run_dir.mkdir(parents=True, exist_ok=True)  # the log's folder
        # absolute: a relative out= is relative to the ServerApp's working directory, which the user may not know
        where = self.run_dir.absolute()
        self.log(f"{what}: {settings.rounds} rounds, participation {settings.participation} -> {where}")

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's round loop over this strategy (`Strategy.start`), for the run's rounds (`num_rounds`, if given,
        must be the strategy's); the run directory is locked for the run and ends with a final status however the
        run ends. `timeout` (default: the strategy's round timeout) bounds each round's wait; a round waits for
        clients that missed an earlier one only while others are still answering (`runner.exchange`)."""
        rounds = self.settings.rounds
        try:
            if num_rounds is not None and num_rounds != rounds:
                raise ValueError(f"num_rounds={num_rounds}, but the strategy was made for {rounds} (num-server-rounds)")
            with self._stack:  # an exception reaches the run's guard, which records it as the run's final status
                last = self.settings.last_round  # stop_at: Flower's loop ends there, the run stops resumably
                wait = self.timeouts.round if timeout is None else timeout
                patient: Any = _RoundGrid(grid, self)  # a Grid by delegation
                arrays = initial_arrays or ArrayRecord()
                return super().start(patient, arrays, last, wait, train_config, evaluate_config, evaluate_fn)
        except Exception as exc:
            # the reason in one line, before the traceback Flower logs; `flwr run` exits 0 whatever the ServerApp
            # does (flwr 1.42), `flwr ls` shows the run "finished:failed" with this reason (docs/deploy.md)
            self.log(f"the run failed: {one_line(exc)}", ERROR)
            raise

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Round `server_round`'s train Messages: its participants (the engine's seeded choice) get the broadcast,
        the setup, `config`'s entries and, where the server does not know their node to hold it, their state."""
        run, clients = self._open(grid, arrays)
        if server_round <= run.round or run.outcome is not None or run.complete:
            if server_round <= run.round:
                self.log(f"round {server_round}: done before the resume (checkpoint of round {run.round}); skipped")
            if server_round >= self.settings.last_round and run.outcome is None and not run.complete:
                self._finish()  # a resume of a run whose end was cut short: its posterior file, plots, final status
            return []
        if self._returned is not None and not _same_arrays(arrays, self._returned):
            raise RuntimeError(
                "configure_train got other arrays than aggregate_train returned: a wrapper changed them (Flower's "
                "central-DP wrappers do); they cannot reach this method's server state. Use bayesadmm's own DP settings"
            )
        round_, chosen = run.next_round()
        if round_ != server_round:
            raise RuntimeError(f"Flower asks for round {server_round}, the run is at round {round_}")
        try:
            message = run.algorithm.broadcast(run.server)
        except BudgetExhausted as exc:  # a private run's budget: stopped before the round, resumable with more
            run._out_of_budget(round_, str(exc))
            self._finish()
            return []
        extra = {key: value for key, value in config.items() if not key.startswith("bayesadmm.")}
        messages = clients.outbox(round_, message, chosen, extra)
        self._pending = (round_, chosen, time.perf_counter())
        return list(messages.values())

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The server update of round `server_round` from its replies, and the rest of the engine's round (metrics
        line, checkpoint); returns the posterior's mean as the model's named arrays and the metrics line."""
        if self._pending is None or self._pending[0] != server_round:
            return None, None
        assert self.run is not None and self.clients is not None
        run, clients = self.run, self.clients
        round_, chosen, began = self._pending
        self._pending = None
        answers = {k: reply for reply in replies if (k := clients.client_of(reply)) is not None}
        try:
            received = clients.inbox(round_, chosen, answers)
        except BREAKDOWNS as exc:
            run._diverged(round_, str(exc))
            received = None
        line = run.end_round(round_, chosen, received, began) if received is not None else None
        if line is None or round_ >= self.settings.last_round:
            self._finish()
        if line is None:
            assert run.outcome is not None
            raise RuntimeError(f"run diverged: {run.outcome[1]['message']} (the last good state is checkpointed)")
        self._returned = self.arrays()
        return self._returned, MetricRecord({k: v for k, v in line.items() if isinstance(v, (int, float))})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Evaluate Messages to a `fraction_evaluate` share of the run's nodes (chosen with the run's seed): the
        server state, so that each node scores the global and its personal posterior on its own data."""
        run, clients = self.run, self.clients
        if run is None or clients is None or run.round != server_round or self.fraction_evaluate == 0:
            return []
        held = sorted(clients.nodes)
        count = max(1, round(self.fraction_evaluate * len(held)))
        chosen = sorted(np.random.default_rng([self.settings.seed, server_round, 10**9 + 4]).choice(held, count, False))
        server_arrays, tree = records.tree_to_records(run.server)
        entries = {key: value for key, value in config.items() if not key.startswith("bayesadmm.")}
        setup = {**entries, p.SETUP: self._text, p.SIZES: clients.sizes, p.ROUND: server_round}
        messages = []
        for k in chosen:
            content = RecordDict({SERVER_ARRAYS: server_arrays, SERVER_TREE: tree, "config": ConfigRecord(setup)})
            messages.append(Message(content, clients.nodes[int(k)], MessageType.EVALUATE, group_id=str(server_round)))
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The nodes' metrics averaged with their numbers of examples as weights (client-evaluation.jsonl)."""
        found: list[dict[str, float]] = []
        for reply in replies:
            if reply.has_error():
                self.log(f"round {server_round}: node {reply.metadata.src_node_id} could not evaluate: "
                         f"{reply.error.reason}", WARNING)  # fmt: skip
                continue
            try:  # a reply is data from another machine: one that does not decode to finite numbers is left out
                metrics = records.get_record(reply.content, "metrics", MetricRecord)
                scores = {key: float(records.number(value, key)) for key, value in metrics.items()}
                bad = next((key for key, value in scores.items() if not math.isfinite(value)), None)
                if bad is None and scores.get(p.NUM_EXAMPLES, 1.0) <= 0:  # a weight
                    bad = p.NUM_EXAMPLES
                if bad is not None:
                    raise records.RecordError(f"metric {bad!r} is {scores[bad]}")
            except (records.RecordError, KeyError) as exc:
                self.log(f"round {server_round}: node {reply.metadata.src_node_id} sent an evaluation that is "
                         f"refused: {exc}", WARNING)  # fmt: skip
                continue
            found.append(scores)
        if not found:
            return None
        weights = np.array([m.get(p.NUM_EXAMPLES, 1.0) for m in found])
        keys = sorted(set.intersection(*(set(m) for m in found)) - set(p.OWN_METRICS))
        mean: dict[str, Any] = {key: float(np.average([m[key] for m in found], weights=weights)) for key in keys}
        append_line(self.run_dir / CLIENT_EVALUATION, {"round": server_round, "clients": len(found), **mean})
        return MetricRecord(mean)

    # ---- the run -----------------------------------------------------------------------------------------------

    def arrays(self) -> ArrayRecord:
        """The server posterior's mean as the model's named parameters (what Flower's Result.arrays then holds)."""
        assert self.run is not None
        mean = self.run.algorithm.posterior(self.run.server).mean
        named = self.run.federation.model.unflatten(mean)
        return ArrayRecord({name: Array(np.ascontiguousarray(t.detach().cpu().numpy())) for name, t in named.items()})

    def _open(self, grid: Grid, arrays: ArrayRecord) -> tuple[Run, FlowerClients]:
        """On the first call: discover the nodes, build the federation and start (or resume) the engine's Run."""
        if self.run is not None and self.clients is not None:
            return self.run, self.clients
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not self.resume and not self.overwrite:
            prepare_fresh(self.run_dir, overwrite=False)  # a run there already: refused before any node is asked
        self._text = json.dumps(self.setup, sort_keys=True)
        nodes, sizes, asked = discover(grid, self._text, self.clients_expected, self.timeouts, self.log)
        if not nodes:
            raise RuntimeError(f"after {self.timeouts.discovery:g} s no SuperNode answered; start them and try again")
        self.log("clients -> nodes: " + ", ".join(f"{k} -> {n}" for k, n in nodes.items()))
        federation = self.federation_of(sizes, _named(arrays))
        if federation.eval_X is None:
            self.log(without_evaluation(self.fraction_evaluate))
        self._text = json.dumps(self.setup, sort_keys=True)  # as `federation_of` completed it (a DP noise)
        ids = federation.clients.sizes
        clients = self.clients = FlowerClients(
            grid, federation.make_algorithm(), sorted(ids), nodes, asked, self._text, ids, self.timeouts,
            self.log, self.settings.device,
        )  # fmt: skip
        self._stack.enter_context(locked(self.run_dir))
        config = self.config(ids) if callable(self.config) else self.config
        run = Run(federation, self.settings, self.run_dir, config=config, title=self.title,
                  on_round=self.on_round, runner=lambda algorithm, workers: clients)  # fmt: skip
        if self.resume and run.prepare_resume():
            self._stack.enter_context(run.guard())
            run.open()
        elif not self.resume:
            run.prepare_fresh(self.overwrite, self.on_start)
            self._stack.enter_context(run.guard())
            run.open()
        self.run = run
        return run, self.clients

    def _finish(self) -> None:
        if self.run is not None and not self.run.complete:
            result = self._result = self.run.finish()
            message = f": {result.message}" if result.message else ""
            self.log(f"{result.status} after round {result.round}{message}")
        self.close()

    def close(self) -> None:
        """Release the run directory (its lock, and a final status if the run did not finish)."""
        self._stack.close()

    @property
    def result(self) -> Any:
        """The engine's `Result` of the run (its posterior, history, run directory), once it has started."""
        assert self.run is not None, "the strategy has not run yet"
        return self._result or self.run.result()


class _RoundGrid:
    """The grid as Flower's round loop uses it, whose `send_and_receive` waits as the engine's Flower runner waits
    (`runner.exchange`): for every client, except those that missed an earlier round while others answer."""

    def __init__(self, grid: Grid, strategy: BayesStrategy):
        self.grid, self.strategy = grid, strategy

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        keyed = dict(enumerate(messages))
        clients = self.strategy.clients
        lost = {clients.nodes[k] for k in clients.lost if k in clients.nodes} if clients is not None else set()
        wait_for = {i for i, m in keyed.items() if m.metadata.dst_node_id not in lost} or set(keyed)
        poll = self.strategy.timeouts.poll
        wait = self.strategy.timeouts.round if timeout is None else timeout
        return list(exchange(self.grid, keyed, wait_for, wait, poll).values())


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _named(arrays: ArrayRecord) -> dict[str, Tensor] | None:
    """The named arrays of Flower's `initial_arrays` (a model's state dict), or None where it holds none."""
    if not arrays:
        return None
    return {name: torch.from_numpy(np.array(a.numpy(), copy=True)) for name, a in arrays.items()}


def without_evaluation(fraction_evaluate: float) -> str:
    """What the log says of a run without a server-side evaluation set: which of a local run's files it leaves out,
    and where the nodes' scores are, if anywhere."""
    nodes = (
        f"the nodes' own scores are in {CLIENT_EVALUATION} (fraction-evaluate)"
        if fraction_evaluate > 0
        else f"set fraction-evaluate > 0 for the nodes' own scores ({CLIENT_EVALUATION})"
    )
    return (
        "no server-side evaluation set (eval_data, eval-data): metrics.jsonl holds no accuracy or NLL, and the run "
        f"writes no curves.png and no reliability diagram; {nodes}"
    )


def _same_arrays(a: ArrayRecord, b: ArrayRecord) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)


__all__ = ["BayesStrategy", "SERVER_ARRAYS", "SERVER_TREE", "CLIENT_EVALUATION", "INFO"]
