"""The run directory's promises: never silently overwritten, one writer at a time, a resume that checks before it
writes, a final status whatever happens, files written whole."""

from __future__ import annotations

import dataclasses
import io
import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm import cli
from bayesadmm.engine import identity, rundir, signals

FEDAVG = {"lr": 0.05, "epochs": 1, "batch_size": 8}


def _data():
    gen = torch.Generator().manual_seed(0)
    clients = [(torch.randn(16, 3, generator=gen), torch.randint(0, 2, (16,), generator=gen)) for _ in range(2)]
    return clients, (torch.randn(20, 3, generator=gen), torch.randint(0, 2, (20,), generator=gen))


def _run(out, **kwargs):
    torch.manual_seed(0)
    clients, test = _data()
    options = {"algorithm": "fedavg", "hparams": FEDAVG, "rounds": 2, "progress": False, "out": out, **kwargs}
    return bayesadmm.run(nn.Linear(3, 2), clients, test, **options)


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".lock"}


def test_a_run_is_never_silently_overwritten(tmp_path):
    first = _run(tmp_path / "r")
    before = _files(tmp_path / "r")
    with pytest.raises(rundir.RunDirError, match="holds a run already .status completed at round 2.*resume"):
        _run(tmp_path / "r", hparams={**FEDAVG, "lr": 0.5})
    assert _files(tmp_path / "r") == before  # refused before anything was written
    again = _run(tmp_path / "r", hparams={**FEDAVG, "lr": 0.5}, overwrite=True)
    assert again.status == "completed" and again.history != first.history
    assert json.loads((tmp_path / "r" / "config.json").read_text())["hparams"]["lr"] == 0.5


def test_a_second_writer_is_refused_with_the_holder_named(tmp_path):
    (tmp_path / "r").mkdir()
    with rundir.locked(tmp_path / "r"):
        with pytest.raises(rundir.RunDirError, match=f"in use by process {os.getpid()}"):
            _run(tmp_path / "r")
    assert _run(tmp_path / "r").status == "completed"  # the lock went with its holder


def test_resume_checks_the_checkpoint_before_writing(tmp_path):
    _run(tmp_path / "r", stop_at=1)
    before = _files(tmp_path / "r")
    path = tmp_path / "r" / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[:100])  # truncated
    truncated = _files(tmp_path / "r")
    with pytest.raises(rundir.RunDirError, match="checkpoint.pt is not a readable bayesadmm state file"):
        _run(tmp_path / "r", resume=True)
    assert _files(tmp_path / "r") == truncated  # metrics.jsonl and status.json untouched
    rundir.save_state(path, {"round": 7, "server": None, "clients": {}})
    with pytest.raises(rundir.RunDirError, match="round 7, not one of this run's 0..2"):
        _run(tmp_path / "r", resume=True)
    path.write_bytes(before["checkpoint.pt"])
    assert _run(tmp_path / "r", resume=True).status == "completed"


def test_resuming_a_complete_run_changes_nothing(tmp_path):
    whole = _run(tmp_path / "r")
    before = _files(tmp_path / "r")
    again = _run(tmp_path / "r", resume=True)
    assert again.message.startswith("already complete") and again.history == whole.history
    assert _files(tmp_path / "r") == before


def test_stop_at_before_the_checkpoint_is_refused(tmp_path):
    _run(tmp_path / "r", rounds=3, stop_at=2)
    with pytest.raises(rundir.RunDirError, match="stop_at=1 is before the checkpoint's round 2"):
        _run(tmp_path / "r", rounds=3, stop_at=1, resume=True)


def test_a_failure_ends_with_a_final_status(tmp_path):
    def broken_metric(outputs, targets):
        raise RuntimeError("metric broke")

    with pytest.raises(RuntimeError, match="metric broke"):
        _run(tmp_path / "r", metrics={"broken": broken_metric})
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert status == {"status": "failed", "round": 0, "message": "RuntimeError: metric broke"}


def test_a_full_disk_names_the_path_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    _run(tmp_path / "r", rounds=3, stop_at=1)
    kept = (tmp_path / "r" / "checkpoint.pt").read_bytes()

    def no_space(obj, f, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", no_space)
    with pytest.raises(OSError, match="could not write .*checkpoint.pt: No space left on device"):
        _run(tmp_path / "r", rounds=3, resume=True)
    assert (tmp_path / "r" / "checkpoint.pt").read_bytes() == kept
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "r").iterdir())
    assert json.loads((tmp_path / "r" / "status.json").read_text())["status"] == "failed"


@pytest.mark.parametrize("signum, code", [(15, 143), (2, 130)])
def test_the_cli_ends_an_interrupted_run_with_the_shells_code(monkeypatch, capsys, signum, code):
    def interrupted(*args, **kwargs):
        raise signals.Interrupted(signum)

    monkeypatch.setattr("bayesadmm.experiments.build.run", interrupted)
    assert cli.main(["run", "fmnist-heterog10", "rounds=2", "--quiet"]) == code
    err = capsys.readouterr().err
    assert "interrupted; `bayesadmm resume" in err and "Traceback" not in err


def test_the_cli_refuses_an_existing_run_with_exit_2(tmp_path, monkeypatch, capsys):
    def refused(*args, **kwargs):
        raise rundir.RunDirError(f"{tmp_path} holds a run already")

    monkeypatch.setattr("bayesadmm.experiments.build.run", refused)
    assert cli.main(["run", "fmnist-heterog10", f"out={tmp_path}", "--quiet"]) == 2
    assert "holds a run already" in capsys.readouterr().err


def test_the_cli_reports_a_failure_in_one_line(monkeypatch, capsys):
    def failing(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("bayesadmm.experiments.build.run", failing)
    assert cli.main(["run", "fmnist-heterog10", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "the run failed: RuntimeError: boom" in err and "Traceback" not in err
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["run", "fmnist-heterog10", "--quiet", "--debug"])


class _Payload:
    """What a crafted pickle would run on loading: a file appears."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_crafted_checkpoint_runs_no_code(tmp_path):
    _run(tmp_path / "r", stop_at=1)
    marker = tmp_path / "pwned"
    for payload in (_Payload(marker), {"format": "bayesadmm-state-1", "structure": "{}", "tensors": [_Payload(marker)]}):
        torch.save(payload, tmp_path / "r" / "checkpoint.pt")
        with pytest.raises(rundir.RunDirError, match="not a readable bayesadmm state file"):
            _run(tmp_path / "r", resume=True)
        assert not marker.exists()
    # a structure naming a callable outside the allowed state classes is refused too
    structure = {"namedtuple": "os:system", "items": [{"str": f"touch {marker}"}]}
    torch.save(rundir.sealed(json.dumps(structure), []), tmp_path / "r" / "checkpoint.pt")
    with pytest.raises(rundir.RunDirError, match="refusing os:system"):
        _run(tmp_path / "r", resume=True)
    assert not marker.exists()
    # nor is any module a file names imported: bayesadmm.__main__ once ran the command line (a SystemExit here)
    structure = {"namedtuple": "bayesadmm.__main__:X", "items": []}
    torch.save(rundir.sealed(json.dumps(structure), []), tmp_path / "r" / "checkpoint.pt")
    with pytest.raises(rundir.RunDirError, match="refusing bayesadmm.__main__:X: not a registered state class"):
        _run(tmp_path / "r", resume=True)


# ---- a run directory is confined: no symbolic links followed, only the engine's shard names, no FIFOs ----


def _sharded(out):
    """A run stopped at round 1 with two workers: its checkpoint lists shard files."""
    _run(out, stop_at=1, workers=2)
    checkpoint = rundir.load_state(out / "checkpoint.pt")
    assert [s["file"] for s in checkpoint["shards"]] == ["client-states/r000001-w0.pt", "client-states/r000001-w1.pt"]
    return checkpoint


def test_a_symlinked_client_states_folder_is_refused_and_its_target_untouched(tmp_path):
    _sharded(tmp_path / "r")
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "r" / "client-states").rename(elsewhere)
    (elsewhere / "precious.txt").write_text("keep me")
    (tmp_path / "r" / "client-states").symlink_to(elsewhere)
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    with pytest.raises(rundir.RunDirError, match="client-states is a symbolic link or not a folder"):
        _run(tmp_path / "r", resume=True, workers=2)
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before   # nothing read through it deleted
    # a fresh start with overwrite removes the link, not what it points to
    _run(tmp_path / "r", overwrite=True)
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before


def test_shard_names_outside_the_engines_pattern_are_refused(tmp_path):
    checkpoint = _sharded(tmp_path / "r")
    (tmp_path / "other").mkdir()
    for name in ("../other/r000001-w0.pt", "client-states/../../other/x.pt", "/etc/passwd", "client-states/x.pt", 7):
        checkpoint["shards"][0]["file"] = name
        rundir.save_state(tmp_path / "r" / "checkpoint.pt", checkpoint)
        with pytest.raises(rundir.RunDirError, match="lists a shard .*not a name the engine writes"):
            _run(tmp_path / "r", resume=True, workers=2)


def test_a_fifo_in_place_of_a_file_is_refused_without_hanging(tmp_path):
    import signal

    _sharded(tmp_path / "r")
    shard = tmp_path / "r" / "client-states" / "r000001-w0.pt"
    shard.unlink()
    os.mkfifo(shard)
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("reading the FIFO hung"))
    signal.alarm(60)
    try:
        with pytest.raises(rundir.RunDirError, match="r000001-w0.pt is not a regular file"):
            _run(tmp_path / "r", resume=True, workers=2)
        (tmp_path / "r" / "checkpoint.pt").rename(tmp_path / "r" / "saved.pt")
        os.mkfifo(tmp_path / "r" / "checkpoint.pt")
        with pytest.raises(rundir.RunDirError, match="checkpoint.pt is not a regular file"):
            _run(tmp_path / "r", resume=True, workers=2)
    finally:
        signal.alarm(0)
    # a symbolic link in place of the checkpoint is refused too (not read from where it points)
    (tmp_path / "r" / "checkpoint.pt").unlink()
    (tmp_path / "r" / "checkpoint.pt").symlink_to(tmp_path / "r" / "saved.pt")
    with pytest.raises(rundir.RunDirError, match="checkpoint.pt is a symbolic link"):
        _run(tmp_path / "r", resume=True, workers=2)


# ---- integrity: checksums, and a resume only of the same method, configuration and data ----


def test_a_damaged_state_file_is_refused_naming_it_before_anything_is_written(tmp_path):
    _sharded(tmp_path / "r")
    before = _files(tmp_path / "r")
    path = tmp_path / "r" / "checkpoint.pt"
    payload = torch.load(path, weights_only=True)
    payload["tensors"][0].view(-1)[:16] = 0.0   # 16 weights changed, the file otherwise well-formed
    torch.save(payload, path)
    with pytest.raises(rundir.RunDirError, match="checkpoint.pt is not a readable.*checksum does not match"):
        _run(tmp_path / "r", resume=True, workers=2)
    # 64 zeroed bytes where the server's weights are, in the file's raw bytes
    raw = bytearray(before["checkpoint.pt"])
    weights = rundir.load_state(tmp_path / "r" / "client-states" / "r000001-w1.pt")  # a shard read is fine
    server = torch.load(io.BytesIO(before["checkpoint.pt"]), weights_only=True)["tensors"][0]
    at = bytes(raw).find(server.numpy().tobytes()[:64])
    assert at > 0 and weights is not None
    raw[at:at + 64] = bytes(64)
    path.write_bytes(bytes(raw))
    with pytest.raises(rundir.RunDirError, match="checkpoint.pt is not a readable.*checksum does not match"):
        _run(tmp_path / "r", resume=True, workers=2)
    path.write_bytes(before["checkpoint.pt"])
    shard = tmp_path / "r" / "client-states" / "r000001-w1.pt"
    payload = torch.load(shard, weights_only=True)
    payload["structure"] = payload["structure"].replace('"int": 1', '"int": 0', 1)   # client 1 → client 0
    torch.save(payload, shard)
    with pytest.raises(rundir.RunDirError, match="r000001-w1.pt is not a readable.*checksum"):
        _run(tmp_path / "r", resume=True, workers=2)
    assert _files(tmp_path / "r") == before   # status.json and environment.json untouched: shards read first
    torch.save({"format": "bayesadmm-state-1", "structure": "{}", "tensors": []}, path)
    with pytest.raises(rundir.RunDirError, match="written by an older bayesadmm .no checksum.*start the run again"):
        _run(tmp_path / "r", resume=True, workers=2)


def test_a_resume_with_another_method_or_data_is_refused_naming_the_difference(tmp_path):
    _run(tmp_path / "r", stop_at=1)
    before = _files(tmp_path / "r")
    checkpoint = rundir.load_state(tmp_path / "r" / "checkpoint.pt")
    run = checkpoint["run"]
    assert run["method"] == "fedavg" and run["data"]["sizes"] == {"0": 16, "1": 16} and len(run["data"]["sha256"]) == 64
    rundir.save_state(tmp_path / "r" / "checkpoint.pt", {**checkpoint, "run": {**run, "method": "feddyn"}})
    with pytest.raises(rundir.RunDirError, match="checkpoint of method 'feddyn', this run's is 'fedavg'"):
        _run(tmp_path / "r", resume=True)
    rundir.save_state(tmp_path / "r" / "checkpoint.pt", checkpoint)
    torch.manual_seed(0)
    clients, test = _data()
    other = [(x + 1.0, y) for x, y in clients]   # the same shapes, other values
    with pytest.raises(rundir.RunDirError, match="clients' examples differ .*sha256"):
        bayesadmm.run(nn.Linear(3, 2), other, test, algorithm="fedavg", hparams=FEDAVG, rounds=2, progress=False,
                      out=tmp_path / "r", resume=True)
    with pytest.raises(rundir.RunDirError, match=r'clients differ .*sizes \{"0": 16, "1": 16\} → \{"0": 16, "1": 8\}'):
        identity.check_same_run(tmp_path / "r" / "checkpoint.pt", checkpoint,
                             {**run, "data": {"sizes": {"0": 16, "1": 8}}})
    edited = {**run["config"], "hparams": {**run["config"]["hparams"], "lr": 0.5}}   # an edited config.json
    with pytest.raises(rundir.RunDirError, match=r"configuration differs .*\(hparams.lr 0.05 → 0.5\); resume with the settings"):
        identity.check_same_run(tmp_path / "r" / "checkpoint.pt", checkpoint, {**run, "config": edited})
    assert _files(tmp_path / "r") == before


def test_an_edited_config_json_is_validated_like_a_new_one(tmp_path):
    from bayesadmm.experiments.config import ConfigError, RunConfig, load

    (tmp_path / "config.json").write_text(json.dumps({**RunConfig().to_json(), "data_fraction": 7.0}))
    with pytest.raises(ConfigError, match=r"config.json: data_fraction must be in \(0, 1\], got 7.0; restore"):
        load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**RunConfig().to_json(), "clients": "ten"}))
    with pytest.raises(ConfigError, match="config.json: .*clients"):
        load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(RunConfig().to_json()))
    loaded = load(tmp_path)  # an older record: the hyperparameters not set are read at their defaults
    assert dataclasses.replace(loaded, hparams={}) == RunConfig()
    assert loaded.hparams["beta1"] == 0.9 and loaded.hparams["mc_samples"] == 1 and "lr" not in loaded.hparams


def test_hashing_the_data_is_cheap():
    """FashionMNIST's training set (60000 × 784 float32), hashed once at each start: its two passes (all the data,
    then each client's) cost about two sha256 passes over the bytes, measured against one on the same machine (a
    ratio, so that a loaded machine does not fail it)."""
    import hashlib
    import time

    from bayesadmm.clients import TensorClients, fingerprint

    X, y = torch.rand(60000, 784), torch.randint(0, 10, (60000,))
    source = TensorClients(None, X, y, {k: (k * 6000, (k + 1) * 6000) for k in range(10)})
    start = time.perf_counter()
    hashlib.sha256(X.numpy().tobytes()).update(y.numpy().tobytes())
    one_pass = time.perf_counter() - start
    start = time.perf_counter()
    first = fingerprint(source)
    seconds = time.perf_counter() - start
    assert first == fingerprint(source) and seconds < 4 * one_pass + 0.05, (seconds, one_pass)
    X[123, 45] += 1.0
    assert fingerprint(source)["sha256"] != first["sha256"]


def test_metrics_are_never_appended_through_a_link_or_into_a_fifo(tmp_path):
    """A link placed as metrics.jsonl (or personal.jsonl, flower.log, a sweep's log) in a handed-over run directory
    cannot make a run append to a file outside it, and a FIFO there cannot hang it: both are refused, naming the file,
    and the link's target is untouched."""
    import os

    from bayesadmm.engine.history import append_line
    from bayesadmm.engine.rundir import RunDirError

    outside = tmp_path / "outside.txt"
    outside.write_text("mine\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").symlink_to(outside)
    with pytest.raises(RunDirError, match="metrics.jsonl"):
        append_line(run_dir / "metrics.jsonl", {"round": 1})
    assert outside.read_text() == "mine\n"
    os.mkfifo(run_dir / "personal.jsonl")
    with pytest.raises(RunDirError, match="personal.jsonl"):
        append_line(run_dir / "personal.jsonl", {"round": 1})
    append_line(run_dir / "fresh.jsonl", {"round": 1})  # a regular file is created and appended to as before
    append_line(run_dir / "fresh.jsonl", {"round": 2})
    assert (run_dir / "fresh.jsonl").read_text() == '{"round": 1}\n{"round": 2}\n'
