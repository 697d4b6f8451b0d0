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


@pytest.mark.slow
def test_precompile_fills_an_empty_cache_once(tmp_path, data_dir):
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "BAYESADMM_COMPILE"} | {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "bayesadmm", "precompile", "--methods", "fedavg,fedlap-cov", "--cohorts", "2"]
    command += ["--data-dir", str(data_dir), "--data-fraction", "1"]
    first = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    assert "fedavg, cohort=2" in first.stdout and "fedlap-cov: skipped" in first.stdout
    compiled = [path for path in cache.rglob("*") if path.is_file() and "bayesadmm-precompiled" not in path.parts]
    assert compiled, "nothing was written to the cache"
    again = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr
    assert "already" in again.stdout and "cohort=2" not in again.stdout
