"""The `compile` setting (auto / on / off): which kernels IVON's solves call, decided per run and recorded with it."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest
import torch
from torch import nn

import bayesadmm
from bayesadmm import algorithms
from bayesadmm.engine.identity import _check_same_config
from bayesadmm.engine.rundir import RunDirError
from bayesadmm.engine.settings import Settings
from bayesadmm.experiments import config as run_config
from bayesadmm.optim import compilation, kernels

# the README quickstart (README.md): 5 clients of 200 examples, a 20-32-3 MLP (771 parameters), 5 rounds
QUICKSTART = dict(lr=0.05, hess_init=0.1, epochs=2, rho=0.5, gamma=0.5, delta=1.0)


def _quickstart_data(per_client: int = 200):
    torch.manual_seed(0)
    w = torch.randn(20, 3)

    def make_data(n):
        X = torch.randn(n, 20)
        return X, (X @ w).argmax(dim=1)

    return [make_data(per_client) for _ in range(5)], make_data(1000)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3))


def _run(out, **settings):
    clients, test = _quickstart_data(40)
    return bayesadmm.run(_model(), clients, test, algorithm="ivon-admm", hparams=QUICKSTART, rounds=2, out=out,
                         progress=False, eval_samples=4, **settings)


def _numbers(result):
    timing = {"seconds", "eval_seconds"}
    return [{k: v for k, v in line.items() if k not in timing} for line in result.history]


@pytest.mark.parametrize("cohort", [1, 5])
def test_compile_off_gives_the_numbers_of_the_environments_eager_switch_bit_for_bit(tmp_path, monkeypatch, cohort):
    """compile="off" calls the eager maths that BAYESADMM_COMPILE=0 runs the compiled kernels as: the same bits,
    and nothing is compiled even where the environment allows it, one client at a time and in a cohort."""
    monkeypatch.setenv("BAYESADMM_COMPILE", "1")
    kernels.recheck_compile_enabled()

    def no_compilation(*args, **kwargs):
        raise AssertionError("compile='off' compiled a kernel")

    monkeypatch.setattr(kernels, "_compiled", no_compilation)
    off = _run(tmp_path / "off", compile="off", cohort=cohort)
    monkeypatch.setenv("BAYESADMM_COMPILE", "0")
    kernels.recheck_compile_enabled()
    overridden = _run(tmp_path / "env", compile="on", cohort=cohort)
    assert off.algorithm.local.solver.compiled is False and overridden.algorithm.local.solver.compiled is True
    assert _numbers(off) == _numbers(overridden)
    for a, b in zip(off.server.natural, overridden.server.natural, strict=True):
        assert torch.equal(a, b)
    for run in ("off", "env"):  # what ran: eager both times (the environment overrides "on")
        assert json.loads((tmp_path / run / "environment.json").read_text())[-1]["compiled_kernels"] is False


def test_the_readme_quickstart_compiles_nothing(tmp_path, monkeypatch):
    """The README's quickstart as it is (compile="auto" by default), where compiling is allowed: nothing compiles."""
    monkeypatch.setenv("BAYESADMM_COMPILE", "1")
    kernels.recheck_compile_enabled()

    def no_compilation(*args, **kwargs):
        raise AssertionError("the quickstart compiled a kernel")

    monkeypatch.setattr(kernels, "_compiled", no_compilation)
    clients, test = _quickstart_data()
    result = bayesadmm.run(_model(), clients, test, algorithm="ivon-admm", rounds=5, out=tmp_path / "quickstart",
                           hparams=QUICKSTART, progress=False)
    assert result.history[-1]["ens_test_acc"] > 0.8
    assert json.loads((tmp_path / "quickstart" / "environment.json").read_text())[-1]["compiled_kernels"] is False


def test_auto_runs_the_readme_quickstart_eagerly_and_the_papers_mlp_compiled():
    sizes = {k: 200 for k in range(5)}
    quickstart = algorithms.make("ivon-admm", dim=771, client_sizes=sizes, rounds=5, **QUICKSTART)
    assert quickstart.local.solver.compiled is False
    for mode, compiled in (("on", True), ("off", False)):
        chosen = algorithms.make("ivon-admm", dim=771, client_sizes=sizes, rounds=5, compile=mode, **QUICKSTART)
        assert chosen.local.solver.compiled is compiled
    # fmnist-heterog10 with IVON-ADMM and IVON-PVI: the papers' MLP (784-200-100-10 sigmoid, 178,110 parameters),
    # 10 % of FashionMNIST's 60,000 training images over 10 clients, 10 epochs of batches of 32, 50 rounds
    from bayesadmm.experiments.build import build

    for method in ("ivon-admm", "ivon-pvi"):
        config, _ = run_config.resolve("fmnist-heterog10", [f"method={method}"])
        built = build(config)
        assert built.federation.model.dim == 178_110
        assert built.algorithm().local.solver.compiled is True, method
        config, _ = run_config.resolve("fmnist-heterog10", [f"method={method}", "compile=off"])
        assert build(config).algorithm().local.solver.compiled is False
    pytest.importorskip("sklearn")  # the diabetes set: a small MLP, eagerly
    config, _ = run_config.resolve("diabetes-iid5", ["method=ivon-admm"])
    assert build(config).algorithm().local.solver.compiled is False


def test_worker_processes_build_the_runs_choice():
    """A worker process builds the algorithm from the factory (pickled by multiprocessing, as here), whose context
    carries the run's setting."""
    from bayesadmm.federated import algorithm_factory
    from bayesadmm.models import FlatModel

    flat = FlatModel.from_module(_model())
    for mode, compiled in (("auto", False), ("on", True), ("off", False)):
        make = algorithm_factory("ivon-admm", QUICKSTART, flat, {k: 200 for k in range(5)}, rounds=5, compile=mode)
        assert pickle.loads(pickle.dumps(make))().local.solver.compiled is compiled


def test_the_rule_is_the_measured_line_against_the_compilation():
    """steps × (STEP_SAVING_S + PARAMETER_SAVING_S × d) > COLD_COMPILE_S, computed here from the constants."""
    d = 771
    per_step = compilation.STEP_SAVING_S + compilation.PARAMETER_SAVING_S * d
    needed = compilation.COLD_COMPILE_S / per_step
    assert not compilation.compile_pays(d, 0.99 * needed) and compilation.compile_pays(d, 1.01 * needed)
    # the quickstart: 5 clients × 2 epochs × ⌈200/32⌉ = 7 batches, 5 rounds = 350 steps; with half the clients per
    # round, half the steps
    hparams = algorithms.get("ivon-admm").make_hparams(**QUICKSTART)
    context = algorithms.Context(771, client_sizes={k: 200 for k in range(5)}, rounds=5, participation=0.5)
    assert hparams.local_steps(context) == 175.0


def test_the_setting_is_checked_and_recorded_in_config_json(tmp_path):
    with pytest.raises(ValueError, match="compile must be one of auto, on, off"):
        Settings(compile="yes")
    with pytest.raises(ValueError, match="compile must be one of"):
        _run(tmp_path / "bad", compile=True)
    result = _run(tmp_path / "run")
    assert json.loads((tmp_path / "run" / "config.json").read_text())["settings"]["compile"] == "auto"
    assert json.loads((tmp_path / "run" / "environment.json").read_text())[-1]["compiled_kernels"] is False
    assert _run(tmp_path / "run", resume=True).round == result.round  # the same arguments resume
    with pytest.raises(ValueError, match=r'settings.compile "auto" → "on"'):
        _run(tmp_path / "run", resume=True, compile="on")


def test_a_configuration_written_before_the_setting_resumes_compiled(tmp_path):
    """Runs of an older version compiled their kernels: their config.json (no compile key) loads as compile=on,
    and their checkpoint's configuration matches that, not "auto"."""
    config, _ = run_config.resolve("diabetes-iid5", ["method=ivon-admm"])
    assert config.compile == "auto" and config.to_json()["compile"] == "auto"
    old = {k: v for k, v in config.to_json().items() if k != "compile"}
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert run_config.load(tmp_path).compile == "on"
    _check_same_config(tmp_path, old, dataclasses.replace(config, compile="on").to_json())
    with pytest.raises(RunDirError, match="compile"):
        _check_same_config(tmp_path, old, config.to_json())
