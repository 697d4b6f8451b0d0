"""The client-state store (`engine.store`): the disk store's blocks (round trip, integrity, eviction), and runs of
every stateful built-in method giving the same bits with the states in memory or on disk, with workers, cohorts
and resume."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm.algorithms import get, names
from bayesadmm.engine import store
from bayesadmm.engine.rundir import SHARDS, RunDirError, load_state, save_state, shard_path
from bayesadmm.engine.store import DiskStore, block_files, read_block, store_kind
from bayesadmm.federated import algorithm_factory
from bayesadmm.models import FlatModel
from bayesadmm.trees import flatten
from toy_clients import toy_clients


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _problem(clients=6):
    return toy_clients(clients)


def _stateful() -> list[str]:
    """The built-in methods whose clients keep tensors from round to round."""
    model, found = FlatModel(_net), []
    for name in names():
        spec = get(name)
        if not spec.build.__module__.startswith("bayesadmm."):
            continue
        algorithm = algorithm_factory(name, dict(spec.example), model, {k: 10 for k in range(6)})()
        state = algorithm.init_client(algorithm.init_server(torch.zeros(model.dim)), 0)
        if flatten(state)[1]:
            found.append(name)
    return found


STATEFUL = _stateful()


def _tensors(tree) -> list[torch.Tensor]:
    return flatten(tree)[1]


def _same(a, b) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    return flatten(a)[0] == flatten(b)[0] and all(torch.equal(x, y) for x, y in zip(ta, tb, strict=True))


def _lines(run_dir):
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("seconds")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _run(method, out, **kwargs):
    clients, test = _problem()
    settings = dict(rounds=3, participation=0.5, eval_samples=4, progress=False, workers=1) | kwargs
    return bayesadmm.run(_net(), clients, test, algorithm=method, hparams=dict(get(method).example), out=out,
                         **settings)


@pytest.fixture
def _tiny_cache(monkeypatch):
    """A cache of one block: every other read comes from disk, every change is written when its block leaves."""
    monkeypatch.setattr(store, "CACHE_BYTES", 1)
    monkeypatch.setattr(store, "BLOCK_BYTES", 1)  # one client a block


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    monkeypatch.setattr("bayesadmm.evaluation.diagrams.try_plot_run", lambda *args, **kwargs: None)


# --- the blocks ------------------------------------------------------------------------------------------------------


def _states(n=7):
    gen = torch.Generator().manual_seed(1)
    return {k: (torch.randn(5, generator=gen), {"h": torch.randn(2, 3, generator=gen).t(), "n": k}, None)
            for k in range(n)}


def test_disk_store_gives_back_the_bits_it_was_given_through_evictions(tmp_path, monkeypatch):
    states = _states()
    monkeypatch.setattr(store, "BLOCK_BYTES", 2 * 11 * states[0][0].element_size())  # blocks of two clients
    disk = DiskStore(tmp_path, states, cache_bytes=1)
    disk.fill(states, lambda k: states[k])
    assert disk.block_size == 2 and block_files(tmp_path / SHARDS) == []  # initial states: made when read
    for k in reversed(range(7)):
        assert _same(disk[k], states[k])
    assert block_files(tmp_path / SHARDS) == []  # read, evicted, unchanged: nothing to write
    new = {k: (states[k][0] * 2, states[k][1], None) for k in states}
    for k in (3, 0, 6, 0):
        disk[k] = new[k]
    expected = {k: new[k] if k in (3, 0, 6) else states[k] for k in states}
    assert _same(dict(disk), expected)
    record = disk.flush()
    assert [entry["clients"] for entry in record] == [[0, 1], [2, 3], [4, 5], [6]]
    assert [entry.get("fresh", False) for entry in record] == [False, False, True, False]
    for entry in record[:2] + record[3:]:  # names the engine accepts in a checkpoint, read with their checksums
        read = read_block(shard_path(tmp_path, entry["file"]), entry["sha256"])
        assert _same(read, {k: expected[k] for k in entry["clients"]})
    # only the blocks' current files are left: superseded ones are deleted when no checkpoint names them
    assert sorted(block_files(tmp_path / SHARDS)) == sorted(e["file"].split("/")[1] for e in record if "file" in e)
    again = DiskStore(tmp_path, states, cache_bytes=1)  # a resume: the files adopted, the fresh block made again
    again.restore({"shards": record}, tmp_path, lambda k: states[k])
    assert again.files == disk.files and _same(dict(again), expected)


def test_a_damaged_or_swapped_block_is_refused_naming_the_file(tmp_path, monkeypatch):
    states = _states(4)
    disk = DiskStore(tmp_path, states)
    monkeypatch.setattr(store, "BLOCK_BYTES", 2 * 11 * states[0][0].element_size())  # blocks of two clients
    disk.fill(states, lambda k: states[k])
    for k in states:
        disk[k] = states[k]  # changed (to the same values): written at the flush
    first, second = disk.flush()
    path = shard_path(tmp_path, first["file"])
    with pytest.raises(RunDirError, match="not the block its checkpoint names"):
        read_block(shard_path(tmp_path, second["file"]), first["sha256"])
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(RunDirError, match=path.name):
        read_block(path, first["sha256"])


def test_auto_keeps_small_federations_and_clients_without_tensors_in_memory():
    many, state = store.AUTO_DISK_CLIENTS + 1, (torch.zeros(3),)
    assert store_kind("auto", store.AUTO_DISK_CLIENTS, state) == "memory"
    assert store_kind("auto", many, state) == "disk"
    assert store_kind("auto", many, (0.5, None)) == "memory"  # (FedSEP's share, FedAvg's empty state)
    assert store_kind("memory", 10**6) == "memory"
    with pytest.raises(ValueError, match="client_store must be one of"):
        bayesadmm.run(_net(), *_problem(), client_store="ssd", rounds=1, progress=False)


# --- runs ------------------------------------------------------------------------------------------------------------


def _compare(method, tmp_path, **kwargs):
    memory = _run(method, tmp_path / "memory", client_store="memory", **kwargs)
    disk = _run(method, tmp_path / "disk", client_store="disk", **kwargs)
    assert memory.status == disk.status == "completed"
    assert _lines(tmp_path / "memory") == _lines(tmp_path / "disk")
    assert _same(memory.server, disk.server)
    assert _same(memory.client_states(), disk.client_states())
    assert "shards" in load_state(tmp_path / "disk" / "checkpoint.pt")


@pytest.mark.usefixtures("_tiny_cache")
@pytest.mark.parametrize("method", STATEFUL)
def test_every_stateful_method_gives_the_same_bits_with_its_states_on_disk(method, tmp_path):
    assert len(STATEFUL) >= 10  # the registry's stateful methods were found
    _compare(method, tmp_path)


@pytest.mark.usefixtures("_tiny_cache")
@pytest.mark.parametrize(("method", "cohort"), [("ivon-admm", 2), ("fedep", 1)])
def test_disk_store_in_two_workers_and_in_cohorts_gives_the_same_bits(method, cohort, tmp_path):
    # (the workers get the spec's cache of one byte: the store's settings travel with it)
    _compare(method, tmp_path, workers=2, cohort=cohort)


@pytest.mark.slow  # two worker processes for every stateful method; the fast test above covers two of them
@pytest.mark.parametrize("method", STATEFUL)
def test_every_stateful_method_in_two_workers_gives_the_same_bits_on_disk(method, tmp_path):
    _compare(method, tmp_path, workers=2)


@pytest.mark.usefixtures("_tiny_cache")
@pytest.mark.parametrize(("first", "second", "workers"),
                         [("disk", "disk", 1), ("memory", "disk", 1), ("disk", "memory", 1), ("disk", "disk", 2)])
def test_resume_with_the_disk_store_gives_the_uninterrupted_run(first, second, workers, tmp_path):
    whole = _run("ivon-admm", tmp_path / "whole", client_store="memory")
    out = tmp_path / "split"
    _run("ivon-admm", out, client_store=first, stop_at=1, workers=workers)
    resumed = _run("ivon-admm", out, client_store=second, resume=True, workers=workers)
    assert _lines(out) == _lines(tmp_path / "whole")
    assert _same(resumed.server, whole.server)
    assert _same(resumed.client_states(), whole.client_states())
    if second == "disk":  # the files of the last checkpoint, and nothing else
        checkpoint = load_state(out / "checkpoint.pt")
        named = sorted(e["file"].split("/")[1] for e in checkpoint["shards"] if "file" in e)
        assert sorted(block_files(out / SHARDS)) == named


@pytest.mark.parametrize("malformed", [
    lambda entries: [{**entries[0], "clients": 3}, *entries[1:]],
    lambda entries: [{**entries[0], "clients": [str(k) for k in entries[0]["clients"]]}, *entries[1:]],
    lambda entries: [{**entries[0], "clients": {"0": 0}}, *entries[1:]],
    lambda entries: ["b0.safetensors", *entries[1:]],
], ids=["clients-an-int", "clients-strings", "clients-a-table", "an-entry-a-string"])
def test_a_malformed_block_list_is_refused_naming_the_checkpoint(malformed, tmp_path):
    """A checkpoint sealed again (a valid checksum) whose block list alone is wrong: a resume and a loaded run's
    client states refuse it by the checkpoint's name."""
    out = tmp_path / "run"
    _run("ivon-admm", out, client_store="disk", stop_at=1)
    path = out / "checkpoint.pt"
    checkpoint = load_state(path)
    assert any("file" in entry for entry in checkpoint["shards"])  # a block on disk, named by the list
    save_state(path, {**checkpoint, "shards": malformed(checkpoint["shards"])})
    status = (out / "status.json").read_bytes()
    with pytest.raises(RunDirError, match=f"^{re.escape(str(path))} lists its client-state blocks in a form"):
        _run("ivon-admm", out, client_store="disk", resume=True)
    assert (out / "status.json").read_bytes() == status  # refused before anything was written
    with pytest.raises(RunDirError, match=f"^{re.escape(str(path))} lists its client-state blocks in a form"):
        bayesadmm.load(out, model=_net()).client_states()
