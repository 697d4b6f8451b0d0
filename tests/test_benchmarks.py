"""Every benchmark (benchmarks/, benchmarks/peers/) and Python script (scripts/) runs at a tiny size, each in its own
process as a user starts it, so that a change of the library that breaks one fails here. What they print (timings,
tables) is not checked: only that they run to the end. Shell scripts get a syntax check."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import needs_fmnist

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "src/bayesadmm/experiments/scenarios"
TIMEOUT = 300  # seconds a smoke may run (the slowest take about a minute on a busy 2-core machine)


@dataclass(frozen=True)
class Smoke:
    """How a file runs at its smallest: its command line after the file ("{tmp}" stands for the test's temporary
    folder), whether it takes over ~10 s (`slow`), needs the real FashionMNIST (`fmnist`) or modules of an extra;
    `also`: the command lines of its other modes, run after `args`."""

    args: str
    slow: bool = False
    fmnist: bool = False
    needs: tuple[str, ...] = ()
    also: tuple[str, ...] = ()


# The cheapest path through scripts/results_tables.py that does not rewrite docs/results: the tables and pages found.
RESULTS_TABLES = (
    "import runpy; found = runpy.run_path('scripts/results_tables.py'); "
    "assert found['tables']() and found['pages'](), 'no runs.jsonl or page in docs/results'"
)
FLOWER = ("flwr", "ray")

SMOKES: dict[str, Smoke] = {
    "benchmarks/batched_gradients.py": Smoke("--clients 2 --calls 1 --repeats 1", slow=True),
    # no CIFAR download: the benchmark trains on random tensors of CIFAR's shape
    "benchmarks/cifar_models.py": Smoke(
        "--models zenke-cnn --methods ivon-admm --clients 2 --examples 4 --test-examples 4", slow=True
    ),
    "benchmarks/cohort.py": Smoke("--clients 2 --fraction 0.002 --repeats 1 --cohort-size 2", slow=True),
    "benchmarks/cold_start.py": Smoke("--smoke --rounds 2 --epochs 1 --cohort 1", slow=True, fmnist=True),
    "benchmarks/compile_rule.py": Smoke("--dims 10 100 --calls 1", slow=True),
    "benchmarks/denormal.py": Smoke("fedavg 0 data_fraction=0.01 epochs=1", slow=True, fmnist=True),
    "benchmarks/diagonal_ggn.py": Smoke("--examples 10 --repeats 1"),
    "benchmarks/engine.py": Smoke(
        "--scenarios fmnist-heterog10 --methods ivon-admm --workers 1 --rounds 1 --set data_fraction=0.01 "
        "--set epochs=1",
        slow=True,
        fmnist=True,
    ),
    "benchmarks/fedlap_server.py": Smoke("--steps 2 --repeats 1 --memory 5"),
    "benchmarks/flower_round.py": Smoke(
        "--rounds 2 --repetitions 1 --modes simulation", slow=True, needs=("flwr", "sklearn")
    ),
    "benchmarks/flower_scale.py": Smoke("--clients 20 --participants 2", slow=True, fmnist=True, needs=FLOWER),
    "benchmarks/ivon_step.py": Smoke("--steps 2 --repeats 1 --threads 1"),
    "benchmarks/noise.py": Smoke("--calls 1 --repeats 1"),  # eager here (BAYESADMM_COMPILE=0): compiling took ~100 s
    "benchmarks/overheads.py": Smoke("--calls 1 --repeats 1 --no-aot"),
    "benchmarks/profile_round.py": Smoke("4 fedavg 1 fmnist-heterog10 data_fraction=0.01", fmnist=True),
    "benchmarks/round_cohorts.py": Smoke("--clients 20 --participants 4 --repeats 2 --sizes 1 2", fmnist=True),
    "benchmarks/runners.py": Smoke(
        "data_fraction=0.01 epochs=1 --workers 1 --cohort 1 2 --repeats 1", slow=True, fmnist=True
    ),
    "benchmarks/scale.py": Smoke(
        "--cases fmnist-xdevice:ivon-admm:2 --clients 20 --rounds 2 --out {tmp}/scale --flower-repetitions 0",
        slow=True,
        fmnist=True,
    ),
    "benchmarks/unlearning.py": Smoke(
        "--methods ivon-admm --rounds 1 --runs {tmp}/runs --out {tmp}/out --set data_fraction=0.01 epochs=1",
        slow=True,
        fmnist=True,
        also=(
            "--repair 0 1 --methods fedep:alpha=0.02 --rounds 1 --runs {tmp}/runs --out {tmp}/out "
            "--set data_fraction=0.01 epochs=1",
            "--repair 0 1 --table-only --methods fedep:alpha=0.02 --rounds 1 --out {tmp}/out "
            "--set data_fraction=0.01 epochs=1",
        ),
    ),
    "benchmarks/peers/compare.py": Smoke(
        "--method ivon-admm --repeats 1 --epochs 1 --set data_fraction=0.01",
        slow=True,
        fmnist=True,
        needs=FLOWER,
    ),
    "scripts/diabetes_baselines.py": Smoke("0", slow=True, needs=("sklearn",)),
    "scripts/fingerprint.py": Smoke("{tmp}/fingerprints.json --only fedavg --no-paper", slow=True, fmnist=True),
    "scripts/privacy_flower.py": Smoke(
        "--epsilons 1 --out {tmp}/privacy-flower --rounds 1 --set data_fraction=0.01 epochs=1",
        slow=True,
        fmnist=True,
        needs=FLOWER,
    ),
    "scripts/privacy_table.py": Smoke("{tmp}/privacy client"),
    "scripts/probe_ivon_admm.py": Smoke(
        "keep-momentum fmnist-heterog10 {tmp}/probe rounds=2 stop_at=1 epochs=1 data_fraction=0.01", fmnist=True
    ),
    "scripts/results_tables.py": Smoke("-c " + shlex.quote(RESULTS_TABLES)),
    "scripts/tune_presets.py": Smoke(  # AMA has no preset on fmnist-heterog10: one trial, written into a copy
        "fmnist-heterog10 --methods ama --trials 1 --set lr=0.001 epochs=1 batch_size=32 rho=0.01 delta=0.01 "
        "data_fraction=0.01 rounds=1 --space lr=around:0.5:2 --out {tmp}/presets --write {tmp}/fmnist-heterog10.json",
        fmnist=True,
    ),
}

# Modules that are no command of their own: the files that import them run them.
IMPORTED_BY = {
    "benchmarks/peers/common.py": "benchmarks/peers/compare.py",
    "benchmarks/peers/flower_peer.py": "benchmarks/peers/compare.py",
    "benchmarks/peers/local_update.py": "benchmarks/peers/compare.py",
    "benchmarks/peers/plain.py": "benchmarks/peers/compare.py",
}


def _files() -> list[str]:
    found = [*(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    return sorted(str(path.relative_to(ROOT)) for path in found)


def test_every_benchmark_and_script_has_a_smoke_test():
    missing = [name for name in _files() if name not in SMOKES and name not in IMPORTED_BY]
    assert not missing, f"add a smoke entry to SMOKES in tests/test_benchmarks.py for {missing}"
    gone = [name for name in [*SMOKES, *IMPORTED_BY.values()] if not (ROOT / name).is_file()]
    assert not gone, f"SMOKES names files that do not exist: {gone}"


def _privacy_runs(folder: Path, data_dir: Path) -> None:
    """Two of the privacy table's runs (one with client-level DP, one without), one round on the synthetic data."""
    from bayesadmm.experiments.build import run
    from bayesadmm.experiments.config import resolve

    torch.set_default_dtype(torch.float32)  # as the command line runs (conftest makes tests float64)
    for name, keys in (("fedavg-eps1", ["dp=client", "dp_clip=7", "dp_epsilon=1"]), ("fedavg-inf", [])):
        settings = ["method=fedavg", "rounds=1", "epochs=1", "data_fraction=1.0", f"data_dir={data_dir}", *keys]
        config, _ = resolve("fmnist-heterog10", [*settings, f"out={folder / name}"])
        assert run(config, progress=False).status == "completed", name


def _params() -> list:
    params = []
    for name, entry in SMOKES.items():
        marks = [pytest.mark.slow] if entry.slow else []
        marks += [needs_fmnist] if entry.fmnist else []
        params.append(pytest.param(name, entry, marks=marks, id=name))
    return params


@pytest.mark.parametrize(("name", "entry"), _params())
def test_runs_at_its_smallest(name, entry, tmp_path, data_dir):
    for module in entry.needs:
        pytest.importorskip(module, reason=f"{name} needs {module} (an extra)")
    if name == "scripts/privacy_table.py":
        _privacy_runs(tmp_path / "privacy", data_dir)
    if name == "scripts/tune_presets.py":
        shutil.copy(SCENARIOS / "fmnist-heterog10.json", tmp_path)
    source = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    # eager kernels: compiling them costs more than these runs (benchmarks that time compiling set it themselves)
    env = dict(os.environ, PYTHONPATH=source, BAYESADMM_COMPILE="0", BAYESADMM_WORKERS="1")
    for line in (entry.args, *entry.also):
        args = [arg.replace("{tmp}", str(tmp_path)) for arg in shlex.split(line)]
        command = [sys.executable, *args] if args[0] == "-c" else [sys.executable, name, *args]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, f"{name} {line} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
    if name == "scripts/fingerprint.py":  # a failed run is recorded in the file, not in the exit status
        runs = json.loads((tmp_path / "fingerprints.json").read_text())["runs"]
        assert runs and not any("error" in run for run in runs.values()), runs
    if name == "scripts/privacy_table.py":
        assert "| fedavg | client |" in done.stdout and "| fedavg | none |" in done.stdout, done.stdout
    if name == "scripts/tune_presets.py":  # the chosen lr, the given values, nothing of the trials' schedule
        preset = json.loads((tmp_path / "fmnist-heterog10.json").read_text())["methods"]["ama"]
        assert set(preset["preset"]) == {"lr", "epochs", "batch_size", "rho", "delta"}, preset
        assert preset["source"].startswith("tuned on the validation split: `bayesadmm tune fmnist-heterog10"), preset
        assert "ama: val_acc" in done.stdout, done.stdout
    if name == "benchmarks/unlearning.py":  # the repair table: (a), then (b) and (c) at R = 0 and 1
        assert done.stdout.count("| fedep:alpha=0.02 | (c) unlearned |") == 2, done.stdout


def test_the_membership_auc_is_the_mann_whitney_statistic():
    """benchmarks/unlearning.py's loss-threshold attack: P(member NLL < unseen NLL) + ½ P(tie), against the pairs
    counted directly."""
    import runpy

    auc = runpy.run_path(str(ROOT / "benchmarks/unlearning.py"))["membership_auc"]
    members = torch.tensor([0.1, 0.5, 0.5, 2.0])
    unseen = torch.tensor([0.5, 1.0, 3.0])
    pairs = [(m < u) + 0.5 * (m == u) for m in members.tolist() for u in unseen.tolist()]
    assert auc(members, unseen) == pytest.approx(sum(pairs) / len(pairs), abs=1e-15)
    assert auc(torch.zeros(3), torch.zeros(5)) == 0.5


def test_a_training_run_that_does_not_complete_is_recorded_for_its_seed_and_shown():
    """benchmarks/unlearning.py --repair: a seed whose original run diverges is kept in the points as "ended" (not
    tried again), and the table says so in a row of its own."""
    import argparse
    import runpy

    module = runpy.run_path(str(ROOT / "benchmarks/unlearning.py"))
    repair, Ended = module["repair"], module["Ended"]
    calls = []

    def diverged(*args):
        calls.append(args)
        raise Ended("all run diverged: round 9: IVON diverged on this client")

    repair.__globals__["train"] = diverged
    saved = []
    args = argparse.Namespace(
        scenario="fmnist-heterog10", rounds=50, set=[], runs=Path("unused"), client=3, repair=[0, 2], save=saved.append
    )
    points: dict = {}
    repair("ivon-admm:gamma=0.005", 2, args, points)
    repair("ivon-admm:gamma=0.005", 2, args, points)  # recorded: not trained again
    assert points == {"ivon-admm:gamma=0.005": {"2": {"ended": "all run diverged: round 9: IVON diverged on this client"}}}
    assert len(calls) == 1 and len(saved) == 1
    table = module["repair_table"](points, args)
    assert "| ivon-admm:gamma=0.005 | seed 2 | | | training all run diverged: round 9" in table, table


@pytest.mark.parametrize("name", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scripts").glob("*.sh")))
def test_shell_script_syntax(name):
    done = subprocess.run(["bash", "-n", name], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
