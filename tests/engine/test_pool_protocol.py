"""The protocol between the engine and its worker processes (`engine.pool` over `engine.transport`): no deadlock
whatever the number and size of the replies; a worker that dies or falls silent in a round ends it with an error
naming the worker; a worker's reply whose record is malformed is refused naming the worker and the client."""

import os
import re
import signal
import threading
from multiprocessing import Pipe

import pytest
import torch

from bayesadmm.engine import transport
from bayesadmm.engine.pool import client_runner
from bayesadmm.engine.transport import DONE, Reply, check_reply, layout_bytes, payload, receive_tensors
from bayesadmm.experiments.build import build
from bayesadmm.experiments.config import resolve

# logreg-100k's shape (IVON-ADMM, a linear softmax model, a few examples per client) at 2000 clients, all of them in
# every round: a thousand replies of about 1 kB per worker and round, twice as many as deadlocked the parent and its
# two workers when the parent acknowledged each reply through the pipe. Cohorts of 64 keep the round to seconds.
TINY = ["clients=2000", "data_fraction=0.01", "participation=1", "epochs=1", "method=ivon-admm", "cohort=64"]
DEADLINE = 90  # seconds for a round of these: a few on a loaded machine


@pytest.fixture(scope="module")
def tiny():
    config, _ = resolve("logreg-100k", TINY)
    return config, build(config)


def _runner(tiny, workers):
    config, built = tiny
    federation = built.federation
    return client_runner(federation.make_algorithm, federation.clients, config.seed, workers, built.algorithm(),
                         config.cohort, participation=1.0)


def _within(seconds, pool, call):
    """call(), whose workers are killed if it has not returned after `seconds`: a deadlock then fails the test (the
    parent's blocked read or write ends with the workers) instead of hanging it."""
    fired = threading.Event()

    def kill():
        fired.set()
        for process in pool.processes:
            process.kill()

    timer = threading.Timer(seconds, kill)
    timer.start()
    try:
        result = call()
    except Exception:
        if not fired.is_set():
            raise
    finally:
        timer.cancel()
    if fired.is_set():
        pytest.fail(f"no end within {seconds} s: a deadlock between the parent and its workers")
    return result


def _started(tiny, clients):
    """`clients` started from the initial server state; (round 1's broadcast, every client)."""
    config, built = tiny
    algorithm = built.algorithm()
    server = algorithm.init_server(built.federation.theta0)
    clients.start(server)
    return algorithm.broadcast(server), list(range(config.clients))


def _round(tiny, clients):
    """Round 1 of every client through `clients` (started here): its replies."""
    message, everyone = _started(tiny, clients)
    return clients.train(1, message, everyone)


@pytest.fixture  # (in the test's environment: kernels compiled or not, conftest.py)
def one_process(tiny):
    clients = _runner(tiny, 1)
    try:
        return _round(tiny, clients)
    finally:
        clients.close()


@pytest.mark.parametrize("arena_bytes", [
    None,  # the default arena: a slot for every reply of the round
    3000,  # one slot (a reply is 1856 bytes): the workers wait for each copy of the parent's
    100,   # too small for one reply: every reply through the pipe
])
def test_thousands_of_tiny_replies_a_round_give_one_processs_bits_without_deadlock(tiny, one_process, arena_bytes,
                                                                                 monkeypatch):
    if arena_bytes is not None:
        monkeypatch.setattr(transport, "ARENA_BYTES", arena_bytes)
    pool = _runner(tiny, 2)
    try:
        replies = _within(DEADLINE, pool, lambda: _round(tiny, pool))
        assert type(pool).__name__ == "ClientPool" and min(map(len, pool.groups)) >= 900
    finally:
        pool.close()
    assert list(replies) == list(one_process)
    assert all(torch.equal(replies[k][key], one_process[k][key]) for k in replies for key in replies[k])


def test_a_worker_that_dies_in_a_round_ends_it_at_once_naming_it(tiny):
    pool = _runner(tiny, 2)
    pid = pool.processes[1].pid
    killed = []

    def kill_worker_1(client):
        if not killed:
            killed.append(client)
            os.kill(pid, signal.SIGKILL)

    try:
        message, everyone = _started(tiny, pool)
        with pytest.raises(RuntimeError, match=rf"client worker 1 \(pid {pid}\) died \(exit code -9\)"):
            _within(DEADLINE, pool, lambda: pool.train(1, message, everyone, kill_worker_1))
    finally:
        pool.close()
    assert killed and not any(process.is_alive() for process in pool.processes)


def test_a_round_without_progress_ends_with_an_error_naming_the_silent_worker(tiny):
    """A stopped worker (SIGSTOP: alive, silent) and a round that would wait for it for good: after stall_seconds
    without a message from any worker, an error names it; the pool still closes (SIGTERM does not end a stopped
    process: it is killed)."""
    pool = _runner(tiny, 2)
    pool.stall_seconds = 3  # (ClientPool's stall_seconds; STALL_SECONDS by default)
    pid = pool.processes[0].pid
    try:
        message, everyone = _started(tiny, pool)
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(RuntimeError, match=rf"round 1 made no progress: no client worker has sent anything for "
                                               rf"3 s, and it waits for client worker 0 \(pid {pid}\), still running"):
            _within(DEADLINE, pool, lambda: pool.train(1, message, everyone))
    finally:
        pool.close()
    assert not any(process.is_alive() for process in pool.processes)


@pytest.mark.parametrize("answers", ["outside the arena", "no replies"])
def test_a_workers_malformed_answer_is_refused_naming_the_worker_and_the_client(tiny, answers):
    """Worker 1's end of the pipe replaced by this test's, which answers the round with a reply whose layout lies
    outside the worker's arena (refused before its bytes are read), or ends it without its replies."""
    pool = _runner(tiny, 2)
    real, pid, mine = pool.connections[1], pool.processes[1].pid, pool.groups[1]
    pool.connections[1], fake = Pipe()
    _, built = tiny
    message = built.algorithm().broadcast(built.algorithm().init_server(built.federation.theta0))

    def worker_1():
        train = fake.recv()
        receive_tensors(fake, train.layout)
        if answers == "outside the arena":
            layout = payload({"change": torch.zeros(210, dtype=torch.float64)})[0]
            fake.send(Reply(train.chosen[0], transport.ARENA_BYTES - 64, {}, layout))
        fake.send(DONE)

    expected = {
        "outside the arena": rf"client worker 1 \(pid {pid}\), round 1: a malformed reply for client {mine[0]} \(its "
                             rf"1728 bytes at offset {transport.ARENA_BYTES - 64} are not inside the arena",
        "no replies": rf"client worker 1 \(pid {pid}\) ended round 1 without the replies of clients \[{mine[0]}, ",
    }[answers]
    answering = threading.Thread(target=worker_1)
    answering.start()
    try:
        with pytest.raises(RuntimeError, match=expected):
            _within(DEADLINE, pool, lambda: pool.train(1, message, mine))
    finally:
        answering.join()
        pool.close()
        real.close()
        fake.close()


def test_a_reply_record_is_checked_before_its_bytes_are_read():
    layout = payload({"theta": torch.zeros(3), "first": torch.tensor(1.0, dtype=torch.float64)})[0]
    assert layout_bytes(layout) == 128  # each tensor on a 64-byte boundary
    good = Reply(7, 0, {"steps": 1.0}, layout)
    assert check_reply(good, {7, 8}, 128) is good and check_reply(good._replace(offset=None), {7}, 0).client == 7
    refused = {
        "'done' instead of a client's reply": ("done", {7}),
        "a reply for client 9, which it was not asked for": (good._replace(client=9), {7}),
        "a reply for client '7', which": (good._replace(client="7"), {7}),
        "client 7 (its 128 bytes at offset 64 are not inside the arena of 128 bytes)": (good._replace(offset=64), {7}),
        "client 7 (its 128 bytes at offset -64 are not": (good._replace(offset=-64), {7}),
        "client 7 (its layout is a dict": (good._replace(layout={"theta": 3}), {7}),
        "client 7 (its layout has the entry ('theta', 3)": (good._replace(layout=[("theta", 3)]), {7}),
        "client 7 (its layout has the entry ('theta', 'float32'": (
            good._replace(layout=[("theta", "float32", (3,), "cpu")]), {7}),
        "client 7 (its entry 'theta' has the shape (-3,)": (
            good._replace(layout=[("theta", torch.float32, (-3,), "cpu")]), {7}),
        "client 7 (its info is a list": (good._replace(info=[1.0]), {7}),
    }
    for reason, (answer, pending) in refused.items():
        with pytest.raises(ValueError, match=re.escape(reason)):
            check_reply(answer, pending, 128)


UNGUARDED_SCRIPT = """
import torch
from torch import nn
import bayesadmm

torch.manual_seed(0)
clients = [(torch.randn(40, 5), torch.randint(0, 3, (40,))) for _ in range(4)]
bayesadmm.run(nn.Linear(5, 3), clients, clients[0], algorithm="fedavg",
              hparams={"lr": 0.01, "epochs": 1, "batch_size": 8}, rounds=1, workers=2, progress=False, out="run")
"""


def test_a_script_that_starts_workers_at_its_top_level_is_told_to_guard_it(tmp_path):
    """Each worker process imports the user's script; one without `if __name__ == "__main__":` starts the run again
    in the worker, which dies: the run ends at once naming the fix, not with a reset pipe or a hang."""
    import subprocess
    import sys

    (tmp_path / "script.py").write_text(UNGUARDED_SCRIPT)
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: client worker") and 'if __name__ == "__main__":' in last, last
