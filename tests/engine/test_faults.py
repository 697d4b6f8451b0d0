"""Faults end cleanly: a signal during a write acts once the file is whole, a full disk names the file and keeps
the last checkpoint, and every way a run can end leaves a final status."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from tests.engine.test_rundir import FEDAVG, _data, _run  # the same tiny federation
from torch import nn

import bayesadmm
from bayesadmm.engine import rundir, signals


def test_a_sigterm_during_a_checkpoint_write_acts_after_the_file_is_whole(tmp_path, monkeypatch):
    # an exception raised from the signal handler inside torch.save used to tear the write ("unexpected pos")
    write = rundir._Writes.write

    def signalled(self, data):
        signal.raise_signal(signal.SIGTERM)  # to this (the main) thread, as a kill's would be at its next bytecode
        return write(self, data)

    monkeypatch.setattr(rundir._Writes, "write", signalled)
    path = tmp_path / "checkpoint.pt"
    with pytest.raises(signals.Interrupted) as raised, signals.sigterm_as_interrupt():
        rundir.save_state(path, {"round": 3, "server": torch.arange(5.0), "clients": {}})
    assert raised.value.signum == signal.SIGTERM
    assert rundir.load_state(path)["round"] == 3 and not (tmp_path / "checkpoint.pt.tmp").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are back


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs mounted in tmp_path, where the test may mount one (root on Linux); skipped elsewhere."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], check=False)


def _fill(folder, leave):
    """Fill the disk of `folder`, then free `leave` bytes."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(folder / "filler", max(0, os.path.getsize(folder / "filler") - leave))


def test_a_real_full_disk_names_the_file_and_leaves_the_old_one(small_disk):
    path = small_disk / "checkpoint.pt"
    rundir.save_state(path, {"round": 1, "server": torch.zeros(10)})
    with pytest.raises(OSError, match=r"could not write .*checkpoint.pt: No space left on device"):
        rundir.save_state(path, {"round": 2, "server": torch.zeros(500_000)})  # 2 MB: more than the disk
    assert rundir.load_state(path)["round"] == 1 and not (small_disk / "checkpoint.pt.tmp").exists()


def test_a_run_on_a_disk_that_fills_up_fails_with_the_file_named_and_the_last_checkpoint_whole(small_disk):
    run_dir = small_disk / "r"

    def fill_after_round_1(line):
        if line["round"] == 1:
            _fill(small_disk, leave=4096)  # a page: room for the metrics line and status.json, not the checkpoint

    clients, test = _data()
    wide = nn.Sequential(nn.Linear(3, 512), nn.ReLU(), nn.Linear(512, 2))  # a checkpoint of several pages
    with pytest.raises(OSError, match=r"could not write .*checkpoint.pt: No space left on device"):
        bayesadmm.run(
            wide, clients, test, algorithm="fedavg", hparams=FEDAVG, rounds=3, progress=False, out=run_dir,
            on_round=fill_after_round_1,
        )  # fmt: skip
    assert rundir.load_state(run_dir / "checkpoint.pt")["round"] == 1
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    assert not any(p.name.endswith(".tmp") for p in run_dir.iterdir())


def test_a_system_exit_from_on_round_ends_with_a_final_status(tmp_path):
    def leave(line):
        sys.exit(4)

    with pytest.raises(SystemExit):
        _run(tmp_path / "r", on_round=leave)
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert status["status"] == "interrupted" and status["round"] == 1 and "SystemExit(4)" in status["message"]


def test_workers_that_cannot_start_end_with_a_final_status(tmp_path):
    from bayesadmm.likelihoods import Classification

    class Local(Classification):  # a class defined in a function does not pickle: the workers cannot start
        pass

    with pytest.raises(ValueError, match="must pickle"):
        _run(tmp_path / "r", workers=2, likelihood=Local())
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert status["status"] == "failed" and "must pickle" in status["message"]
