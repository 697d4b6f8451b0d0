"""Sticky client workers: the assignment of clients to workers, states kept in the workers, checkpoint shards."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from bayesadmm.cli import main
from bayesadmm.engine import federation
from bayesadmm.engine import run as engine_run
from bayesadmm.engine.policy import assign, cohort_blocks, fixed_cohorts, round_cohorts
from bayesadmm.engine.pool import client_runner
from bayesadmm.engine.rundir import load_state
from bayesadmm.engine.runners import SHARDS
from bayesadmm.experiments.build import build, run
from bayesadmm.experiments.config import resolve
from conftest import needs_fmnist

SMALL = ["data_fraction=0.01", "clients=5", "epochs=1", "eval_samples=4"]


def _lines(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in ("seconds", "eval_seconds")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _tensors(tree, path=""):
    """(path, tensor) for every tensor in a nest of NamedTuples, tuples, lists and dicts (None and numbers skipped)."""
    if torch.is_tensor(tree):
        yield path, tree
    elif isinstance(tree, dict):
        for key in sorted(tree, key=str):
            yield from _tensors(tree[key], f"{path}.{key}")
    elif isinstance(tree, (list, tuple)):
        for i, item in enumerate(tree):
            yield from _tensors(item, f"{path}[{i}]")


def _same(a, b) -> bool:
    ta, tb = dict(_tensors(a)), dict(_tensors(b))
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


# --- the assignment ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 3, 7])
def test_assignment_gives_every_client_once_and_balances_examples(workers):
    generator = torch.Generator().manual_seed(0)
    sizes = {k: int(n) for k, n in enumerate(torch.randint(1, 500, (101,), generator=generator))}
    groups = assign(sizes, workers)
    assert len(groups) == workers and sorted(k for group in groups for k in group) == list(range(101))
    assert all(group == sorted(group) and group for group in groups)
    loads = [sum(sizes[k] for k in group) for group in groups]
    # greedy assignment, largest first: no worker is ahead of another by more than one client's examples
    assert max(loads) - min(loads) <= max(sizes.values())
    assert assign(sizes, workers) == groups                                        # deterministic


@pytest.mark.parametrize(("clients", "cohort_size", "workers"), [(10, 3, 2), (101, 8, 3), (5, 2, 4), (7, 64, 2)])
def test_assignment_gives_workers_whole_cohorts(clients, cohort_size, workers):
    """Each worker's clients are whole cohorts of the run's layout, so a worker batches what one process would."""
    generator = torch.Generator().manual_seed(1)
    sizes = {k: int(n) for k, n in enumerate(torch.randint(1, 500, (clients,), generator=generator))}
    whole = fixed_cohorts(sizes, cohort_size, spread=2)
    groups = assign(sizes, workers, whole)
    assert len(groups) == min(workers, len(whole)) and sorted(k for g in groups for k in g) == list(range(clients))
    assert sorted(k for c in whole for k in c) == list(range(clients)) and max(map(len, whole)) <= cohort_size
    for group in groups:
        assert sorted(k for c in whole if c[0] in group for k in c) == group


def test_cohorts_are_bands_of_similar_clients_dealt_back_and_forth():
    """Largest first, `spread` cohorts per band, dealt 1, 2, 2, 1, ...: a band's cohorts carry nearly equal work,
    and the next band's clients are all smaller."""
    sizes = {k: 100 - k for k in range(10)}  # client 0 the largest
    assert fixed_cohorts(sizes, 3, spread=2) == [[0, 3, 4], [1, 2, 5], [6, 9], [7, 8]]
    assert fixed_cohorts(sizes, 5, spread=2) == [[0, 3, 4, 7, 8], [1, 2, 5, 6, 9]]
    assert fixed_cohorts(sizes, 4, spread=1) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert fixed_cohorts({5: 1, 2: 1, 9: 1}, 2, spread=1) == [[2, 5], [9]]  # ties: lower id first
    with pytest.raises(ValueError, match="cohort_size"):
        fixed_cohorts(sizes, 0)


def test_blocks_at_partial_participation_hold_about_a_cohort_of_each_rounds_participants():
    """A block is a cohort at full participation; at participation p ⌈cohort_size / p⌉ clients, bands of similar
    sizes; a round's members of a block are one cohort up to cohort_size, bands of cohort_size largest first
    beyond."""
    generator = torch.Generator().manual_seed(2)
    sizes = {k: int(n) for k, n in enumerate(torch.randint(1, 500, (1000,), generator=generator))}
    assert cohort_blocks(sizes, 16, 1.0, spread=2) == fixed_cohorts(sizes, 16, spread=2)
    blocks = cohort_blocks(sizes, 16, 0.1, spread=2)
    assert blocks == fixed_cohorts(sizes, 160, spread=1) and sorted(k for b in blocks for k in b) == list(range(1000))
    assert cohort_blocks(sizes, 5, 0.1, spread=2) == fixed_cohorts(sizes, 50, spread=1)
    assert cohort_blocks(sizes, 16, 0.01, spread=2) == [sorted(sizes)]  # one block, as one cohort of every client
    small = {k: 100 - k for k in range(10)}
    assert round_cohorts([], small, 3) == [] and round_cohorts([7, 2], small, 3) == [[2, 7]]
    assert round_cohorts([9, 1, 4, 0, 8], small, 3) == [[0, 1, 4], [8, 9]]
    with pytest.raises(ValueError, match="cohort_size"):
        cohort_blocks(sizes, 0, 0.5)


def test_assignment_of_equal_clients_alternates_and_never_leaves_a_worker_idle():
    assert assign({k: 60 for k in range(6)}, 2) == [[0, 2, 4], [1, 3, 5]]
    assert assign({0: 10, 1: 5}, 4) == [[0], [1]]                                  # no more workers than clients
    # one large client against many small ones: the large one's worker gets nothing else until the others catch up
    groups = assign({0: 100, **{k: 10 for k in range(1, 11)}}, 2)
    assert groups == [[0], list(range(1, 11))]


# --- states in the workers -----------------------------------------------------------------------------------------


def _clients(built, algorithm, seed, workers, cohort_size=0):
    """The clients of `built` as the engine's loop makes them: in this process with the server's algorithm, or in a
    pool of `workers` processes that each build their own from the factory."""
    federation, participation = built.federation, built.settings.participation
    return client_runner(federation.make_algorithm, federation.clients, seed, workers, algorithm, cohort_size,
                         participation=participation)


def _two_rounds(built, algorithm, clients, chosen):
    """Rounds 1 and 2 through `clients` (started here) with participants chosen(round); (server, last replies)."""
    server = algorithm.init_server(built.federation.theta0)
    clients.start(server)
    for round_ in (1, 2):
        replies = clients.train(round_, algorithm.broadcast(server), chosen(round_))
        server, _ = algorithm.server_update(server, replies)
    return server, replies


@needs_fmnist
@pytest.mark.parametrize("cohort_size", [0, 2])
def test_states_fetched_from_two_workers_are_the_bits_of_one_process(tmp_path, cohort_size):
    """Two rounds with some clients absent (so some keep their initial state), then every client's state and the
    server state compared bit for bit; and the checkpoint record of each layout restores the other. With cohorts
    too: each worker trains whole cohorts, the ones a single process trains."""
    config, _ = resolve("fmnist-heterog10", SMALL + ["method=ivon-admm", "participation=0.6", "rounds=2"])
    built = build(config)
    algorithm = built.algorithm()
    ids = list(range(config.clients))
    results = {}
    for workers in (1, 2):
        clients = _clients(built, algorithm, config.seed, workers, cohort_size)
        assert type(clients).__name__ == ["CohortClients", "ClientPool"][workers - 1] if cohort_size else True
        try:
            server, _ = _two_rounds(built, algorithm, clients,
                                    lambda round_: federation.participants(ids, config.participation, config.seed, round_))
            record = clients.save(tmp_path / str(workers), 2)
            results[workers] = server, clients.states(), record
        finally:
            clients.close()
    (server1, states1, inline), (server2, states2, shards) = results[1], results[2]
    assert sorted(states1) == sorted(states2) == list(range(5))
    assert any(states1[k].natural is None for k in states1)                       # absent in both rounds
    assert _same(server1, server2) and _same(states1, states2)
    assert set(inline) == {"clients"} and len(shards["shards"]) == 2
    assert sorted(k for shard in shards["shards"] for k in shard["clients"]) == list(range(5))
    for record, run_dir, workers in ((shards, tmp_path / "2", 1), (inline, tmp_path / "1", 2)):
        clients = _clients(built, algorithm, config.seed, workers, cohort_size)
        try:
            clients.restore(record, run_dir)
            assert _same(clients.states(), states1)
        finally:
            clients.close()


# --- checkpoints and resume ----------------------------------------------------------------------------------------


@pytest.mark.slow  # runs with worker processes, killed and resumed
@needs_fmnist
def test_killed_while_checkpointing_with_workers_resumes_from_the_last_whole_checkpoint(tmp_path, monkeypatch):
    """Workers write round 2's shards, then the process dies before checkpoint.pt names them: resume must use round
    1's checkpoint and shards (never a mix of rounds), delete the orphans, and give the uninterrupted run's numbers."""
    common = ["fmnist-heterog10", *SMALL, "method=feddyn", "rounds=3", "--quiet"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert main(["run", *common, "workers=1", f"out={whole}"]) == 0
    save = engine_run.save_checkpoint

    def dies_after_the_shards(path, round_, server, clients, identity):
        if round_ == 2:
            clients.save(path.parent, round_)         # the workers' shards of round 2 are complete ...
            raise KeyboardInterrupt                    # ... checkpoint.pt still says round 1
        save(path, round_, server, clients, identity)

    monkeypatch.setattr(engine_run, "save_checkpoint", dies_after_the_shards)
    assert main(["run", *common, "workers=2", f"out={killed}"]) == 130  # as a shell reports Ctrl-C
    monkeypatch.setattr(engine_run, "save_checkpoint", save)
    checkpoint = load_state(killed / "checkpoint.pt")
    assert checkpoint["round"] == 1 and "clients" not in checkpoint
    assert sorted(p.name for p in (killed / SHARDS).iterdir()) == ["r000001-w0.pt", "r000001-w1.pt",
                                                                   "r000002-w0.pt", "r000002-w1.pt"]
    assert main(["resume", str(killed), "--quiet"]) == 0
    assert _lines(killed) == _lines(whole)
    assert sorted(p.name for p in (killed / SHARDS).iterdir()) == ["r000003-w0.pt", "r000003-w1.pt"]
    final = load_state(killed / "checkpoint.pt")
    assert final["round"] == 3 and [s["file"] for s in final["shards"]] == [f"{SHARDS}/r000003-w0.pt",
                                                                           f"{SHARDS}/r000003-w1.pt"]


@pytest.mark.slow  # five runs, four of them with worker processes
@needs_fmnist
def test_resume_with_another_number_of_workers(tmp_path):
    """A run checkpointed by two workers (shards) resumed in one process, and the other way round: both give the
    uninterrupted run's numbers. FedDyn (client states, no kernels to compile in each fresh worker): IVON-ADMM's
    states through shards and back are test_states_fetched_from_two_workers_are_the_bits_of_one_process's."""
    common = [*SMALL, "method=feddyn", "rounds=3"]
    whole, config = tmp_path / "whole", resolve("fmnist-heterog10", common)[0]
    assert run(dataclasses.replace(config, workers=1, out=str(whole)), progress=False).exit_code == 0
    for first, second in ((2, 1), (1, 2)):
        out = tmp_path / f"{first}-{second}"
        split = dataclasses.replace(config, workers=first, out=str(out), stop_at=1)
        assert run(split, progress=False).exit_code == 0
        assert ("shards" in load_state(out / "checkpoint.pt")) == (first == 2)
        resumed = dataclasses.replace(config, workers=second, out=str(out))
        assert run(resumed, resume=True, progress=False).exit_code == 0
        assert _lines(out) == _lines(whole)
        assert sorted(p.name for p in (out / SHARDS).glob("*")) == (["r000003-w0.pt", "r000003-w1.pt"] if second == 2
                                                                     else [])


@needs_fmnist
def test_checkpoint_every_skips_rounds_but_always_saves_the_last(tmp_path, monkeypatch):
    saved = []
    save = engine_run.save_checkpoint

    def recording_save(path, round_, server, clients, identity):
        saved.append(round_)
        save(path, round_, server, clients, identity)

    monkeypatch.setattr(engine_run, "save_checkpoint", recording_save)
    assert main(["run", "fmnist-heterog10", *SMALL, "method=fedavg", "rounds=5", "checkpoint_every=2",
                 f"out={tmp_path / 'run'}", "--quiet"]) == 0
    assert saved == [0, 2, 4, 5]


@needs_fmnist
@pytest.mark.parametrize("arena_bytes", [1000, 3 << 20])   # 3 MB: two IVON-ADMM replies of 1.4 MB
def test_replies_through_the_pipe_or_few_arena_slots_are_the_same(arena_bytes, monkeypatch):
    """Replies larger than the worker's arena go through the pipe; an arena of two IVON replies makes the worker wait
    for the parent's copies all the time. Both give the numbers of one process."""
    from bayesadmm.engine import transport
    monkeypatch.setattr(transport, "ARENA_BYTES", arena_bytes)
    config, _ = resolve("fmnist-heterog10", SMALL + ["method=ivon-admm", "rounds=2"])
    built = build(config)
    algorithm = built.algorithm()
    replies = {}
    for count in (1, 2):
        clients = _clients(built, algorithm, config.seed, count)
        try:
            _, replies[count] = _two_rounds(built, algorithm, clients, lambda round_: list(range(5)))
        finally:
            clients.close()
    assert list(replies[2]) == list(range(5)) and _same(replies[1], replies[2])


@needs_fmnist
def test_a_client_that_breaks_down_in_a_worker_stops_the_run_as_diverged(tmp_path):
    out = tmp_path / "diverged"
    code = main(["run", "fmnist-heterog10", *SMALL, "method=ivon-admm", "lr=1e30", "rounds=2", "workers=2",
                 f"out={out}", "--quiet"])
    assert code == federation.EXIT_DIVERGED                  # the worker's SubproblemError, raised again in the parent
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "diverged" and "IVON diverged on this client" in status["message"]
