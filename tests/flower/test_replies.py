"""One bad node cannot end a federation: a train reply that decodes to arrays the method cannot take (missing,
mis-shaped, of another dtype, non-finite), a client state of another shape, non-finite metrics, or an answer to the
query or an evaluation that does not decode, is left out and logged with the node and the reason, and the round
completes with the others; a round with no valid reply ends the run "failed" with that reason."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

import user_app
from flwr.app import Array, ArrayRecord, MetricRecord
from helpers import LoopbackGrid, lines
from helpers import user_client_app as _user_client_app
from test_strategy import FEDAVG, IVON

from bayesadmm import trees
from bayesadmm.flower import protocol as p
from bayesadmm.flower import records, reply_checks, strategy
from bayesadmm.flower.app_config import Timeouts


def _first(arrays: ArrayRecord) -> str:
    return next(key for key in arrays if arrays[key].numpy().ndim == 1)


def _missing(content):
    del content["arrays"][_first(content["arrays"])]


def _misshaped(content):
    key = _first(content["arrays"])
    content["arrays"][key] = Array(content["arrays"][key].numpy()[:-1].copy())


def _other_dtype(content):
    key = _first(content["arrays"])
    content["arrays"][key] = Array(content["arrays"][key].numpy().astype(np.float32))


def _non_finite(content):
    key = _first(content["arrays"])
    values = content["arrays"][key].numpy().copy()
    values[3] = np.nan
    content["arrays"][key] = Array(values)


def _extra(content):
    content["arrays"]["theta-of-my-own"] = Array(np.zeros(3))


def _state(content):
    state = records.load_state(content)
    has_tensors = bool(trees.flatten(state)[1])
    changed = _shorter(state) if has_tensors else (torch.zeros(2),)  # a state without tensors: another kind
    records.save_state(content, changed, str(content[records.STATE_TREE][records.STATE_VERSION]))


def _shorter(tree):
    """The tree with its first tensor one entry shorter."""
    if isinstance(tree, torch.Tensor):
        return tree[:-1]
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        done, fields = False, []
        for value in tree:
            changed = value if done or value is None else _shorter(value)
            done = done or changed is not value
            fields.append(changed)
        return type(tree)(*fields)
    if isinstance(tree, (tuple, list)):
        return type(tree)([_shorter(tree[0]), *tree[1:]])
    return tree


def _metric(content):
    content["metrics"]["loss-of-mine"] = float("inf")


def _metrics_gone(content):
    del content["metrics"]


MALFORMED = {  # what a node sends → what the log says of it
    "missing": (_missing, "are missing"),
    "misshaped": (_misshaped, "has shape"),
    "dtype": (_other_dtype, "is torch.float32, expected torch.float64"),
    "nan": (_non_finite, "holds non-finite values"),
    "extra": (_extra, "['theta-of-my-own'] are not the method's"),
    "state": (_state, "its client state"),
    "metric": (_metric, "metric 'loss-of-mine' is inf"),
    "no-metrics": (_metrics_gone, "it has no record 'metrics'"),
}


def _tampering(app, bad: set[int], change, from_round: int = 1):
    """`app`, whose train replies from the clients in `bad` are changed by `change` from round `from_round` on."""

    def tampered(message, context):
        reply = app(message, context)
        config = message.content.get("config")
        if (context.node_config["partition-id"] in bad and "arrays" in reply.content
                and int(config[p.ROUND]) >= from_round):
            change(reply.content)
        return reply

    return tampered


def _run(tmp_path, method, bad, change, clients=3, from_round=1, fraction_evaluate=0.0, app=None, timeouts=None):
    torch.set_default_dtype(torch.float64)  # restored by tests/conftest.py
    parts, test = user_app.tensors(seed=3, clients=clients)
    torch.manual_seed(7)
    model = user_app.make_model()
    s = strategy(method, model=model, rounds=2, seed=7, eval_samples=4, dtype="float64", out=tmp_path,
                 fraction_evaluate=fraction_evaluate, timeouts=timeouts, **(FEDAVG if method == "fedavg" else IVON))
    grid = LoopbackGrid(app or _tampering(_user_client_app(parts, test), bad, change, from_round), clients)
    try:
        s.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()))
    finally:
        s.close()
    return json.loads((tmp_path / "status.json").read_text()), (tmp_path / "flower.log").read_text()


@pytest.mark.parametrize("method", ["fedavg", "ivon-admm"])
@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_malformed_reply_is_refused_and_logged_and_the_round_completes_with_the_others(tmp_path, method, kind):
    change, said = MALFORMED[kind]
    status, log = _run(tmp_path, method, {1}, change)
    assert status["status"] == "completed"
    metrics = lines(tmp_path)
    assert [line["participants"] for line in metrics] == [2, 2]
    assert metrics[0]["absent_clients"] == [1] == metrics[1]["absent_clients"]
    for round_ in (1, 2):
        said_of = f"round {round_}: client 1 (node 1001) sent a reply"
        refusal = next(line for line in log.splitlines() if said_of in line)
        assert "is refused: " in refusal and said in refusal, refusal


@pytest.mark.parametrize("method", ["fedavg", "ivon-admm"])
def test_a_round_whose_every_reply_is_refused_fails_the_run_with_the_reason(tmp_path, method):
    with pytest.raises(RuntimeError, match="round 1: no client replied validly"):
        _run(tmp_path, method, {0, 1, 2}, _non_finite)
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "failed" and "holds non-finite values" in status["message"]
    assert status["message"].count("\n") == 0


def test_two_nodes_one_wrong_fail_the_first_round_naming_the_clash_and_are_told_apart_after_it(tmp_path):
    """Before any reply has been accepted, the layout is what most replies share: two replies that disagree cannot
    be told apart (the round fails, naming the clash); once one layout has been accepted, the wrong one is refused."""
    with pytest.raises(RuntimeError, match="disagree on their arrays"):
        _run(tmp_path / "first", "fedavg", {1}, _misshaped, clients=2)
    status, log = _run(tmp_path / "later", "fedavg", {1}, _misshaped, clients=2, from_round=2)
    assert status["status"] == "completed"
    assert [line["participants"] for line in lines(tmp_path / "later")] == [2, 1]
    assert "round 2: client 1 (node 1001) sent a reply that is refused: array 'theta' has shape [66]" in log


def test_answers_to_the_query_and_evaluations_that_do_not_decode_are_refused_and_the_run_goes_on(tmp_path):
    torch.set_default_dtype(torch.float64)
    parts, test = user_app.tensors(seed=3)
    app = _user_client_app(parts, test)

    def crafted(message, context):
        reply = app(message, context)
        k = context.node_config["partition-id"]
        if k == 1 and message.metadata.message_type == "query":
            reply.content["metrics"] = MetricRecord({p.PARTITION_ID: -4, p.NUM_EXAMPLES: 10})
        if k == 2 and message.metadata.message_type == "evaluate":
            reply.content["metrics"]["acc"] = float("nan")
        return reply

    status, log = _run(tmp_path, "fedavg", set(), None, fraction_evaluate=1.0, app=crafted,
                       timeouts=Timeouts(discovery=1, round=60))   # client 1's node is refused: not waited for long
    assert status["status"] == "completed"
    assert "node 1001 cannot take part: its answer is refused: partition-id=-4" in log
    assert "node 1002 sent an evaluation that is refused: metric 'acc' is nan" in log
    evaluated = [json.loads(line) for line in (tmp_path / "client-evaluation.jsonl").read_text().splitlines()]
    assert [e["clients"] for e in evaluated] == [1, 1]   # client 1 holds no node; client 2's evaluations refused


def test_the_checks_of_a_reply_against_the_expected_layout_and_state():
    theta = torch.zeros(5, dtype=torch.float64)
    expected = reply_checks.layout({"theta": theta, "n": torch.tensor(3.0, dtype=torch.float64)})
    assert reply_checks.layout_problem({"theta": theta, "n": torch.tensor(1.0, dtype=torch.float64)}, expected) is None
    assert "['n'] are missing" in reply_checks.layout_problem({"theta": theta}, expected)
    # FedLap-func's memory points: as many rows as the client's classes allow, the rest of the shape as the run's
    memory = reply_checks.layout({"memory.x": torch.zeros(4, 3), "memory.tau": torch.zeros(4)})
    assert reply_checks.layout_problem({"memory.x": torch.zeros(2, 3), "memory.tau": torch.zeros(2)}, memory) is None
    assert "after its leading dimension" in reply_checks.layout_problem({"memory.x": torch.zeros(2, 2),
                                                                         "memory.tau": torch.zeros(2)}, memory)
    # a client state: the shape of the previous one, where a None (not yet filled) may become anything
    from bayesadmm.algorithms.admm import ClientState

    old = ClientState(torch.zeros(5), None)
    assert reply_checks.state_problem(ClientState(torch.ones(5), torch.ones(5)), old) is None
    assert "state.dual is torch.float64 [4]" in reply_checks.state_problem(ClientState(torch.ones(4), None), old)
    assert "state is a NoneType" in reply_checks.state_problem(None, old)
    assert "state.0 is a str" in reply_checks.state_problem(("x",), (torch.zeros(1),))
    assert "state has 2 entries, expected 1" in reply_checks.state_problem((torch.zeros(1),) * 2, (torch.zeros(1),))
    # a history a method of your own keeps: a list may grow, a dict gain keys; their common entries are compared
    assert reply_checks.state_problem({"losses": [1.0, 2.0], "n": 1}, {"losses": [1.0]}) is None
    assert "state has no key 'n'" in reply_checks.state_problem({"losses": []}, {"losses": [], "n": 1})
    assert "state.losses.0 is a str" in reply_checks.state_problem({"losses": ["x"]}, {"losses": [1.0]})
