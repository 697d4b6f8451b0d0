"""Which node holds which client: a client is bound to the first node that claims it and never moved. A second node
claiming a held client (a misconfigured or rogue SuperNode; with SuperNode authentication only a registered one can
connect at all, tests/flower/test_deployment.py) is refused and logged, the run completes with the first holder,
and the second node is never sent a train message, so never a client's state."""

import pytest
import torch

pytest.importorskip("flwr")

import user_app
from flwr.app import Context, MessageType, RecordDict
from helpers import LocalDataGrid, lines

from bayesadmm.flower.app_config import flower_run
from bayesadmm.flower.client_app import app as client_app
from bayesadmm.flower.loaders import save_tensors
from bayesadmm.flower.runner import claim
from bayesadmm.flower.server_app import run_server

ROGUE = 1003


class ClaimingGrid(LocalDataGrid):
    """Three honest nodes (1000, 1001, 1002 holding clients 0, 1, 2) and a rogue node 1003 with client `k`'s node
    config, connected from the start (`at=0`) or from round `at`, when client `k`'s own node goes away (`takeover`).
    Records every message each node is sent."""

    def __init__(self, files, eval_file, k: int, at: int = 0, takeover: bool = False):
        configs = {j: {"partition-id": j, "data": str(f)} for j, f in files.items()}
        super().__init__(client_app, configs, files, [eval_file])
        self.k, self.at, self.takeover, self.round = k, at, takeover, 0
        self.sent: dict[int, list[str]] = {}
        self.client_of[ROGUE] = k   # it may read client k's file: its claim is a well-formed one
        if at == 0:
            self._connect_rogue()

    def _connect_rogue(self):
        config = dict(self.contexts[self.node_ids[self.k]].node_config)
        self.contexts[ROGUE] = Context(run_id=1, node_id=ROGUE, node_config=config, state=RecordDict(),
                                       run_config={})

    def get_node_ids(self):
        if self.at and self.round >= self.at - 1 and ROGUE not in self.contexts:
            self._connect_rogue()
            if self.takeover:
                del self.contexts[self.node_ids[self.k]]
        return list(self.contexts)

    def push_messages(self, messages):
        for m in messages:
            self.sent.setdefault(m.metadata.dst_node_id, []).append(m.metadata.message_type)
            if m.metadata.group_id.isdigit():
                self.round = max(self.round, int(m.metadata.group_id))
        return super().push_messages(messages)


@pytest.fixture
def files(tmp_path):
    torch.set_default_dtype(torch.float64)   # restored by tests/conftest.py
    parts, test = user_app.tensors(seed=3)
    files = {k: save_tensors(tmp_path / f"node-{k}" / f"client-{k}.npz", X, y) for k, (X, y) in enumerate(parts)}
    return files, save_tensors(tmp_path / "server" / "test.pt", *test)


def _config(eval_file, out):
    return {"model": "user_app:make_model", "algorithm": "user_app:make_algorithm", "hparams": "lr=0.2 steps=3",
            "clients": 3, "rounds": 3, "seed": 7, "eval-samples": 4, "dtype": "float64", "eval-data": str(eval_file),
            "out": str(out), "round-timeout": 0.5, "discovery-timeout": 5.0}


def test_a_claim_binds_a_client_to_the_first_node_and_a_second_claim_is_refused():
    said = []
    nodes = {}
    assert claim(nodes, 0, 10, lambda text, level=None: said.append(text))
    assert claim(nodes, 0, 10, lambda text, level=None: said.append(text))    # the holder claiming again: fine
    assert not claim(nodes, 0, 11, lambda text, level=None: said.append(text), round_=4)
    assert nodes == {0: 10}
    assert said == ["round 4: node 11 also claims client 0, held by node 10: refused (a client stays with the first "
                    'node that claims it; give each SuperNode its own --node-config "partition-id=K")']


def test_a_second_node_claiming_a_client_at_the_start_is_refused_and_the_run_completes(files, tmp_path):
    files, eval_file = files
    grid = ClaimingGrid(files, eval_file, k=0)
    out = tmp_path / "run"
    result = run_server(grid, flower_run(_config(eval_file, out)))
    assert result.status == "completed"
    assert [line["participants"] for line in lines(out)] == [3, 3, 3]
    # both answer the first query: whichever reply the server reads first holds client 0, the other is refused
    log = (out / "flower.log").read_text()
    holder = 1000 if "clients -> nodes: 0 -> 1000," in log else ROGUE
    other = ROGUE + 1000 - holder
    assert f"node {other} also claims client 0, held by node {holder}: refused" in log
    assert grid.sent[other] == [MessageType.QUERY]   # asked once which client it holds, never sent a train message
    assert grid.sent[holder].count(MessageType.TRAIN) == 3


def test_a_node_claiming_a_client_whose_node_went_away_is_refused_and_never_sent_its_state(files, tmp_path):
    files, eval_file = files
    grid = ClaimingGrid(files, eval_file, k=2, at=2, takeover=True)
    out = tmp_path / "run"
    result = run_server(grid, flower_run(_config(eval_file, out)))
    assert result.status == "completed"
    metrics = lines(out)
    assert [line["participants"] for line in metrics] == [3, 2, 2]
    assert metrics[1]["absent_clients"] == [2] == metrics[2]["absent_clients"]
    log = (out / "flower.log").read_text()
    assert "round 2: node 1003 also claims client 2, held by node 1002: refused" in log
    assert grid.sent[ROGUE] == [MessageType.QUERY]   # client 2's state (in every train message to it) never went there
