"""The scripts in examples/ run at their CI settings (`main(small=True)`) and show what they say they show."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("sklearn", reason="the examples use scikit-learn's bundled datasets (the examples extra)")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(autouse=True)
def _as_a_user_runs_them(_float64_and_deterministic, monkeypatch):
    """The examples as they run from the command line: torch's default float32 (conftest makes tests float64), the
    examples folder importable (by this process and by the worker processes own_algorithm starts, which inherit
    sys.path), and one thread (the examples' models are tiny; a thread pool on a busy CI machine costs more than
    it saves). IVON's kernels run eagerly: compiling them takes longer than these short runs (the compiled and
    eager kernels are tested equal in tests/optim)."""
    torch.set_default_dtype(torch.float32)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("BAYESADMM_COMPILE", "0")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _example(name: str):
    return importlib.import_module(name)


def test_digits_cnn_compares_three_methods(tmp_path):
    out = tmp_path / "digits"
    run = _example("digits_cnn").main(small=True, out=str(out))
    results, table = run["results"], run["table"]
    assert list(results) == ["fedavg", "feddyn", "ivon-admm"]
    for name, result in results.items():
        assert result.status == "completed" and len(result.history) == 3, name
        assert result.history[-1]["test_acc"] > 0.4, name     # learning: chance is 0.1
        assert (out / name / "curves.png").exists() and (out / name / "metrics.jsonl").exists()
    assert "ens_test_acc" in results["ivon-admm"].history[-1]    # a posterior: its predictive is scored too
    for row in ("| fedavg | mean |", "| feddyn | mean |", "| ivon-admm | mean |", "| ivon-admm | predictive |"):
        assert row in table, row
    assert (out / "comparison.png").stat().st_size > 0


def test_diabetes_regression_is_exact_in_one_round(tmp_path):
    run = _example("diabetes_regression").main(small=True, out=str(tmp_path / "diabetes"))
    result = run["result"]
    assert result.status == "completed" and result.round == 1
    assert run["mean_error"] < 1e-10 and run["cov_error"] < 1e-10
    assert result.posterior.mean.dtype == torch.float64
    line = result.history[-1]
    for prefix in ("test_", "ens_test_"):
        assert 0.75 <= line[prefix + "coverage90"] <= 1.0     # 88 held-out patients: about 90 % inside
        assert line[prefix + "calibration_error"] < 0.15
        assert line[prefix + "rmse"] < 0.9                     # standardised targets: better than predicting 0


def test_ivon_optimizer_predictive_numbers(tmp_path):
    numbers = _example("ivon_optimizer").main(small=True, out=str(tmp_path / "ivon"))
    assert set(numbers) == {"adam", "ivon_mean", "ivon_predictive"}
    for name, scores in numbers.items():
        assert math.isfinite(scores["nll"]) and scores["nll"] > 0, name
        assert scores["acc"] > 0.6, name
    assert json.loads((tmp_path / "ivon" / "metrics.json").read_text()) == numbers


def test_own_algorithm_workers_give_the_numbers_of_one(tmp_path):
    module = _example("own_algorithm")
    run = module.main(small=True, out=str(tmp_path / "own"))
    one, two = run["one"], run["two"]
    assert run["same"] and one.status == two.status == "completed"
    assert torch.equal(one.posterior.mean, two.posterior.mean)
    assert module.same_numbers(one.history, two.history)
    # the user algorithm's info records are logged, and it learns
    assert {"client_loss", "client_steps", "server_clients", "server_step_norm"} <= set(one.history[-1])
    assert one.history[-1]["test_nll"] < one.history[0]["test_nll"]
    # same_numbers does look at the numbers
    changed = [dict(line) for line in two.history]
    changed[-1]["test_acc"] += 1e-9
    assert not module.same_numbers(one.history, changed)


def test_scripts_take_small_and_out(tmp_path):
    """The command-line entry (`python examples/X.py --small --out DIR`), on the quickest example."""
    out = tmp_path / "cli"
    done = subprocess.run([sys.executable, str(EXAMPLES / "diabetes_regression.py"), "--small", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "max |mean − m*|" in done.stdout
    assert json.loads((out / "status.json").read_text())["status"] == "completed"
