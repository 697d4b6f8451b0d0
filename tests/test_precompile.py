"""`bayesadmm precompile`: it fills Inductor's on-disk cache with the kernels a scenario's runs use, once per cache,
and its user errors are exit 2 with one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bayesadmm import cli


@pytest.mark.parametrize(
    "args, message",
    [
        (["no-such-scenario"], "unknown scenario 'no-such-scenario'; choose one of"),
        (["--cohorts", "1,x"], "--cohorts takes integers >= 0 separated by commas, got '1,x'"),
        (["--cohorts", "-1"], "--cohorts takes integers >= 0"),
        (["--methods", "bogus"], "unknown method 'bogus'; valid:"),
    ],
)
def test_a_bad_argument_is_exit_2_with_one_line(capsys, monkeypatch, args, message):
    monkeypatch.setenv("BAYESADMM_COMPILE", "1")  # past the switched-off check, up to the argument's
    code = cli.main(["precompile", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_nothing_to_do_when_compiling_is_switched_off(capsys, monkeypatch):
    monkeypatch.setenv("BAYESADMM_COMPILE", "0")
    assert cli.main(["precompile"]) == 0
    assert "switched off" in capsys.readouterr().out


def test_methods_whose_scenario_runs_would_not_compile_are_skipped(monkeypatch, tmp_path):
    """precompile compiles what compile=auto would: not IVON-ADMM on the diabetes set's small MLP, nor FedAvg."""
    pytest.importorskip("sklearn")
    from bayesadmm.experiments import precompile

    monkeypatch.setenv("BAYESADMM_COMPILE", "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(precompile, "_step_optimizer", lambda module, clients: None)  # the drop-in optimizer's
    lines: list[str] = []
    assert precompile.precompile("diabetes-iid5", methods=["ivon-admm", "fedavg"], report=lines.append)
    assert "precompile: ivon-admm: skipped (compile=auto runs it eagerly)" in lines
    assert "precompile: fedavg: skipped (its solver has no compiled kernels)" in lines


@pytest.mark.slow
def test_precompile_fills_an_empty_cache_once(tmp_path, data_dir):
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "BAYESADMM_COMPILE"} | {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "bayesadmm", "precompile", "--methods", "fedavg,fedlap-cov", "--cohorts", "2"]
    command += ["--data-dir", str(data_dir), "--data-fraction", "1"]
    first = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    # neither compiles in a run (torch's Adam; the curvature's own solver): only the drop-in optim.IVON is compiled
    assert "fedavg: skipped (its solver has no compiled kernels)" in first.stdout
    assert "fedlap-cov: skipped" in first.stdout and "optim.IVON" in first.stdout
    compiled = [path for path in cache.rglob("*") if path.is_file() and "bayesadmm-precompiled" not in path.parts]
    assert compiled, "nothing was written to the cache"
    again = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr
    assert "already" in again.stdout and "optim.IVON" not in again.stdout
